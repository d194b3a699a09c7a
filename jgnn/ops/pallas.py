"""The Pallas lowering of edge ops: `pallas_kernels` walking a CSR, the edge function evaluated on lane tiles.

The kernels take 2-D operands ``[rows, w]`` with ``w`` 1 or the message width ``F`` (attention: ``[*, H]`` or
``[*, H, Dk]``), pad lanes with zeros to a power of two and hand the edge function float tiles (`EdgeFn`'s
``lanes=True`` contract). `eligible` says whether an op fits that contract, and if not, why (its `Reason` and
parameters), in which case `jgnn.ops.lowering` runs it on XLA. One kernel walk per op, forward only: the
derivatives of an edge op are edge ops (`jgnn.ops.edge_op`), lowered here again.

Groups map to the kernels' operands by the walk: over destinations (the forward CSR) source operands are the
gathered ``col`` rows and destination operands the ``row``; over sources (the reverse CSR) the roles swap.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jgnn import facts
from jgnn.ops import edge_fn as ef
from jgnn.ops import edge_op as eo
from jgnn.ops.gather import normalize
from jgnn.report import Reason
from jgnn.roles import Group

_FLOATS = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


def _base_region(fn: ef.EdgeFn) -> ef.RegionFn | None:
    """The region a (possibly derived) edge function is built on, or None for other bases."""
    while not isinstance(fn, ef.RegionFn):
        fn = getattr(fn, "base", None)
        if fn is None:
            return None
    return fn


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _lane_op(op, region: ef.RegionFn, softmax: bool) -> bool:
    if facts.is_elementwise(op.prim):
        return True
    if op.prim in facts.SHAPE_ONLY:
        x = op.inputs[0]
        return x.ndim == 0 or _squeezed(x.shape[1:]) in ((), _squeezed(op.outputs[0].shape[1:])) or (
            any(x is v for v, w in zip(region.inputs, region.whole, strict=True) if w))
    return softmax and op.prim.name == "reduce_sum"


def eligible(spec: eo.EdgeSpec, operand_avals) -> tuple[Reason, dict] | None:
    """None when the kernels can run ``spec``; else (reason, report parameters)."""
    region = _base_region(spec.fn)
    if region is None or isinstance(spec.fn, ef.Batched):
        return Reason.NOT_LANEWISE, {"prim": "derived edge function"}
    if spec.over == Group.ALL or spec.hits:
        return Reason.NOT_LANEWISE, {"prim": "shared cotangent" if spec.over == Group.ALL else "extremum mask"}
    softmax = spec.reduce == eo.Reduce.SOFTMAX
    for o in region.ops:
        if not _lane_op(o, region, softmax) or o.prim.multiple_results:
            return Reason.NOT_LANEWISE, {"prim": o.name}
    for a in operand_avals:
        if jnp.dtype(a.dtype) not in [jnp.dtype(t) for t in _FLOATS]:
            return Reason.UNSUPPORTED_DTYPE, {"dtype": str(jnp.dtype(a.dtype))}
    msgs = eo.message_avals(spec, operand_avals)
    for m in msgs:
        if jnp.dtype(m.dtype) not in [jnp.dtype(t) for t in _FLOATS]:
            return Reason.UNSUPPORTED_DTYPE, {"dtype": str(jnp.dtype(m.dtype))}
    if softmax:
        heads = msgs[0].shape[1:]
        if len(heads) != 1 or msgs[1].shape[1:2] != heads:
            return Reason.NOT_LANEWISE, {"prim": "scores not [E, H]"}
        return None
    width = int(np.prod(msgs[0].shape[1:], dtype=np.int64))
    for a, g in zip(operand_avals, spec.groups, strict=True):
        w = int(np.prod(a.shape if g == Group.SHARED else a.shape[1:], dtype=np.int64))
        if w not in (1, width):
            return Reason.NOT_LANEWISE, {"prim": f"operand width {w} against messages of width {width}"}
    if len(msgs) != 1 + (spec.reduce == eo.Reduce.MEAN):
        return Reason.NOT_LANEWISE, {"prim": "several messages"}
    return None


def _csrs(spec: eo.EdgeSpec, src_ids, dst_ids, layout, operand_rows):
    """(walk CSR, the walk's row count) for the op's ``over`` group: from the layout, or sorted here."""
    from jgnn.layout import in_program

    if spec.layout:
        lay = jax.tree_util.tree_unflatten(spec.layout_tree, layout)
        return (lay.rev_csr if spec.over == Group.SRC else lay.csr), spec.num_segments
    n = spec.num_segments
    over_ids = src_ids if spec.over == Group.SRC else dst_ids
    other = dst_ids if spec.over == Group.SRC else src_ids
    other_rows = operand_rows.get(Group.DST if spec.over == Group.SRC else Group.SRC, n)
    col = normalize(other, other_rows, wrap=spec.wrap)
    if spec.raw_over:
        valid = (over_ids >= 0) & (over_ids < n)
        rows = jnp.where(valid, over_ids, 0)
    else:
        rows, valid = normalize(over_ids, n, wrap=spec.wrap), jnp.ones(over_ids.shape, bool)
    fwd, _ = in_program(col, rows, n, valid)  # rows by `rows`, col the other endpoint
    return fwd, n


def _as_2d(x, group: Group):
    return jnp.reshape(x, (1, -1)) if group == Group.SHARED else jnp.reshape(x, (x.shape[0], -1))


def run(*args, spec: eo.EdgeSpec) -> list:
    import pallas_kernels as pk

    src_ids, dst_ids, operands, layout = eo.split_args(args, spec)
    interpret = spec.backend == "pallas_interpret"
    rows_of = {g: x.shape[0] for x, g in zip(operands, spec.groups, strict=True) if g in (Group.SRC, Group.DST)}
    over = Group.DST if spec.reduce == eo.Reduce.NONE else spec.over
    csr, n = _csrs(spec.replace(over=over) if spec.reduce == eo.Reduce.NONE else spec, src_ids, dst_ids, layout,
                   rows_of)
    col_group, row_group = (Group.DST, Group.SRC) if over == Group.SRC else (Group.SRC, Group.DST)
    slots = {g: [k for k, gg in enumerate(spec.groups) if gg == g]
             for g in (col_group, row_group, Group.EDGE, Group.SHARED)}
    softmax = spec.reduce == eo.Reduce.SOFTMAX
    shape_of = [x.shape[1:] if g != Group.SHARED else x.shape for x, g in zip(operands, spec.groups, strict=True)]

    def edge_fn(col, row, edge, shared):
        tiles = [None] * len(spec.groups)
        for group, vals in ((col_group, col), (row_group, row), (Group.EDGE, edge), (Group.SHARED, shared)):
            for k, t in zip(slots[group], vals, strict=True):
                tiles[k] = t
        if softmax:  # the region was traced with [B, H(, Dk)] rows: hand it rows of that shape
            tiles = [jnp.reshape(t, (t.shape[0],) + tuple(_padded(shape_of[k], t))) for k, t in enumerate(tiles)]
        outs = spec.fn.apply(tiles, lanes=not softmax)
        return tuple(outs) if softmax else outs[0]

    def pick(group):
        return tuple(_as_2d(operands[k], group) if not softmax else operands[k] for k in slots[group])

    col, row, edge, shared = pick(col_group), pick(row_group), pick(Group.EDGE), pick(Group.SHARED)
    msgs = eo.message_avals(spec, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands])
    if softmax:
        out, m, l = pk.attention_forward(edge_fn, col, row, edge, shared, csr, heads=msgs[0].shape[1],
                                         interpret=interpret)
        stat = eo.accumulation_dtype(msgs[0].dtype)
        dtype = jnp.result_type(msgs[0].dtype, msgs[1].dtype)
        return [out.reshape((n,) + msgs[1].shape[1:]).astype(dtype), m.astype(stat), l.astype(stat)]
    (msg,) = msgs[:1]
    if spec.reduce == eo.Reduce.NONE:
        out = pk.gather_compute_forward(edge_fn, col, row, edge, shared, csr, num_edges=spec.num_edges,
                                        interpret=interpret)
        return [out[:, :math.prod(msg.shape[1:])].reshape(msg.shape).astype(msg.dtype)]
    kind = {eo.Reduce.SUM: "sum", eo.Reduce.MEAN: "mean", eo.Reduce.MAX: "max", eo.Reduce.MIN: "min"}[spec.reduce]
    out = pk.gather_reduce_forward(edge_fn, col, row, edge, shared, csr, reduce=kind, empty=spec.empty,
                                   interpret=interpret)
    width = math.prod(msg.shape[1:])
    dtype = eo.mean_dtype(msg.dtype) if kind == "mean" else msg.dtype
    result = [out[:, :width].reshape((n,) + msg.shape[1:]).astype(dtype)]
    if kind == "mean":
        degree = (csr.indptr[1:] - csr.indptr[:-1]).astype(eo._count_dtype(msg.dtype))
        result.append(degree)
    return result


def _padded(shape, tile):
    """The trailing shape a kernel tile of ``tile`` has for an operand of trailing ``shape``."""
    return tile.shape[1:] if len(tile.shape) - 1 == len(shape) else shape
