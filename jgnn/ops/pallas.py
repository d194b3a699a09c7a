"""The Pallas lowering of edge ops: `pallas_kernels` walking a CSR, the edge function evaluated on kernel tiles.

`eligible` says whether an op fits the kernels' contracts, and if not, why (a `Reason` and parameters), in which
case `jgnn.ops.lowering` runs it on XLA:

* gather kernels (sum, mean, max, min over destinations or sources; one value per edge): operands are flattened to
  2-D ``[rows, w]`` with ``w`` 1 or the message width, and the edge function must be *lane-wise* on those
  flattened rows (elementwise ops, and shape ops that only move unit axes, run as the identity:
  ``EdgeFn.apply(lanes=True)``);
* the attention kernel (softmax-weighted sums): operands are ``[*, H]`` or ``[*, H, Dk]`` tiles zero-padded to
  powers of two; the scores are elementwise ops plus sums over the last axis that zero padding cannot change, and
  the values are one ``[*, H, D]`` operand (or a flat ``[*, H·D]`` one the region reshapes, `split_heads`) times
  per-head factors (``α[..., None] * v``, dropout masks hashed from int32 ids, which load exactly);
* the per-head kernels (sums and per-edge ops that are not lane-wise: attention's backward, `SoftmaxRowDot` and
  `SoftmaxVjp`): the same tiles with the whole head axis in one program, and every size a power of two, so the
  edge function runs on exactly the shapes it was traced with.

Groups map to the kernels' operands by the walk: over destinations (the forward CSR) source operands are the
``col`` rows and destination operands the ``row``; over sources (the reverse CSR) the roles swap.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgnn import compat, facts, ir
from jgnn.ops import edge_fn as ef
from jgnn.ops import edge_op as eo
from jgnn.ops.gather import narrow, normalize
from jgnn.report import Reason
from jgnn.roles import Group

_KERNEL_DTYPES = frozenset(map(np.dtype, (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64, jnp.int32,
                                          jnp.bool_)))
_FLOAT = frozenset(map(np.dtype, (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)))
_UNIT_SHAPE = frozenset({lax.broadcast_in_dim_p, lax.reshape_p, lax.squeeze_p, lax.convert_element_type_p})


def _base_region(fn: ef.EdgeFn) -> ef.RegionFn | None:
    """The region a (possibly derived) edge function is built on, or None for other bases."""
    while not isinstance(fn, ef.RegionFn):
        fn = getattr(fn, "base", None)
        if fn is None:
            return None
    return fn


def _squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _lane_op(op, region: ef.RegionFn) -> bool:
    """Lane-wise on flattened rows: elementwise, or a shape op that only moves unit axes (or broadcasts a
    per-row scalar or a shared value, which the kernel has broadcast already)."""
    if facts.is_elementwise(op.prim):
        return True
    if op.prim in facts.SHAPE_ONLY:
        x = op.inputs[0]
        shared = any(x is v for v, w in zip(region.inputs, region.whole, strict=True) if w)
        return shared or x.ndim <= 1 or _squeezed(x.shape[1:]) in ((), _squeezed(op.outputs[0].shape[1:]))
    return False


def _zero_safe(ops, zero: set[int]) -> bool:
    """Whether zero-padded lanes leave every ``reduce_sum`` over feature axes unchanged: track the values that
    are zero there (operands are; products with such a factor; sums and differences of them; their shape moves)."""
    is_zero = lambda a: isinstance(a, ir.Value) and a.id in zero
    for op in ops:
        a = op.inputs
        if op.prim is lax.reduce_sum_p:
            if not is_zero(a[0]):
                return False
            ok = True
        elif op.prim in (lax.reduce_max_p, lax.reduce_min_p, lax.argmax_p, lax.argmin_p):
            return False
        elif op.prim is lax.mul_p:
            ok = any(map(is_zero, a))
        elif op.prim in (lax.add_p, lax.sub_p):
            ok = all(map(is_zero, a))
        elif op.prim is lax.div_p:
            ok = is_zero(a[0]) and isinstance(a[1], ir.Const) and np.all(np.asarray(a[1].value) != 0)
        else:
            ok = (op.prim in _UNIT_SHAPE or op.prim is lax.neg_p) and is_zero(a[0])
        if ok:
            zero.add(op.outputs[0].id)
    return True


def _cone(region: ef.RegionFn, out: ir.Atom) -> list:
    """The region's ops ``out`` depends on, in order."""
    need = {out.id} if isinstance(out, ir.Value) else set()
    ops = []
    for op in reversed(region.ops):
        if any(v.id in need for v in op.outputs):
            ops.append(op)
            need.update(a.id for a in op.inputs if isinstance(a, ir.Value))
    return ops[::-1]


def _kernel_trailing(trailing: tuple[int, ...], heads: int) -> tuple[int, ...] | None:
    """An attention operand's trailing shape (unit axes squeezed) as the kernel takes it: ``(H,)`` for per-row
    scalars and per-head factors, ``(H, Dk)`` for vectors per head (with one head the head axis may be absent);
    None when it is neither."""
    if not trailing:
        return (heads,)
    if heads == 1:
        return (1,) + trailing if len(trailing) == 1 else None
    return trailing if trailing[0] == heads and len(trailing) <= 2 else None


def _heads(score_aval) -> int | None:
    """The number of heads of ``[E, H]`` scores (unit axes aside; one head for ``[E]`` or ``[E, 1]``)."""
    squeezed = _squeezed(score_aval.shape[1:])
    return squeezed[0] if len(squeezed) == 1 else 1 if not squeezed else None


def split_heads(region: ef.RegionFn, heads: int) -> dict[int, tuple[int, int]]:
    """Row inputs ``[*, H·Dk]`` that the region only reshapes to ``[*, H, Dk]`` (unit axes aside; RGAT's values
    per relation): input position -> ``(H, Dk)``. The attention kernel takes them as ``[*, H, Dk]`` operands and
    the reshape as given."""
    found = {}
    for k, (v, whole) in enumerate(zip(region.inputs, region.whole, strict=True)):
        uses = [op for op in region.ops if any(a is v for a in op.inputs)]
        trailing = _squeezed(v.shape[1:]) if not whole else None
        if whole or len(trailing) != 1 or not uses or any(op.prim is not lax.reshape_p for op in uses):
            continue
        outs = {_squeezed(op.outputs[0].shape[1:]) for op in uses}
        if len(outs) == 1:
            (out,) = outs
            if len(out) == 2 and out[0] == heads and out[0] * out[1] == trailing[0]:
                found[k] = out
    return found


def attention_fits(region: ef.RegionFn, heads: int) -> tuple[Reason, dict] | None:
    """None when the attention kernel can evaluate ``region`` on its padded tiles: scores from elementwise ops and
    sums over the last axis that zero padding cannot change, values a product of one ``[*, H, D]`` operand with
    per-head factors and broadcasts (unit axes aside)."""
    scores, msg = region.outputs
    score_ops = _cone(region, scores)
    inputs = {v.id for v in region.inputs}
    split = {region.inputs[k].id: t for k, t in split_heads(region, heads).items()}
    made_by = {v.id: op for op in region.ops for v in op.outputs}
    values = []

    def walk(a) -> bool:
        if isinstance(a, ir.Const):
            return True
        if a.id in inputs:
            kernel = split.get(a.id) or _kernel_trailing(_squeezed(a.shape[1:]) if a.ndim else (), heads)
            if kernel is not None and len(kernel) == 2:
                values.append(a)
            return kernel is not None
        op = made_by[a.id]
        if op.prim is lax.mul_p:
            return all(walk(x) for x in op.inputs)
        if factor(a):
            return True
        if op.prim is lax.broadcast_in_dim_p and isinstance(op.inputs[0], ir.Const):
            return True
        if op.prim in _UNIT_SHAPE:
            return walk(op.inputs[0])
        return False

    def factor(a) -> bool:
        """A per-head factor computed by elementwise ops from per-row and per-head inputs (attention dropout's
        hash of the edge id, the seed and the head): any value over heads, whatever it computes."""
        if isinstance(a, ir.Const):
            return True
        if a.id in inputs:
            kernel = _kernel_trailing(_squeezed(a.shape[1:]) if a.ndim else (), heads)
            return kernel is not None and len(kernel) == 1
        op = made_by[a.id]
        if not (facts.is_elementwise(op.prim) or op.prim in _UNIT_SHAPE) or op.prim.multiple_results:
            return False
        per_head = _kernel_trailing(_squeezed(a.shape[1:]), heads)
        return per_head is not None and len(per_head) == 1 and all(factor(x) for x in op.inputs)

    kernel = _kernel_trailing(_squeezed(msg.shape[1:]), heads)
    if not walk(msg) or len(values) != 1 or kernel is None or len(kernel) != 2:
        return Reason.NOT_LANEWISE, {"prim": "values that are not one [E, H, D] operand times per-head factors"}
    for op in score_ops:
        if not (facts.is_elementwise(op.prim) or op.prim in _UNIT_SHAPE or op.prim is lax.reduce_sum_p):
            return Reason.NOT_LANEWISE, {"prim": op.name}
    if not _zero_safe(score_ops, inputs):
        return Reason.NOT_ZERO_PADDING_SAFE, {}
    return None


def eligible(spec: eo.EdgeSpec, operand_avals) -> tuple[Reason, dict] | None:
    """None when the kernels can run ``spec``; else (reason, report parameters)."""
    if spec.num_edges == 0:  # its edge function is traced at 0 rows (a custom_jvp body is fixed there)
        return Reason.NO_EDGES, {"edges": 0}
    region = _base_region(spec.fn)
    if region is None or isinstance(spec.fn, ef.Batched | ef.PyFn):
        return Reason.NOT_LANEWISE, {"prim": "a derived or batched edge function"}
    if spec.over == Group.ALL:
        return Reason.NOT_LANEWISE, {"prim": "shared cotangent"}
    for a in operand_avals:
        if np.dtype(a.dtype) not in _KERNEL_DTYPES:
            return Reason.UNSUPPORTED_DTYPE, {"dtype": str(np.dtype(a.dtype))}
    msgs = eo.message_avals(spec, operand_avals)
    if spec.reduce == eo.Reduce.SOFTMAX:
        if spec.fn is not region:
            return Reason.NOT_LANEWISE, {"prim": "a derived attention function"}
        heads = _heads(msgs[0])
        if heads is None:
            return Reason.NOT_LANEWISE, {"prim": f"scores of shape {msgs[0].shape[1:]}"}
        why = attention_fits(region, heads)
        if why is not None:
            return why
        split = split_heads(region, heads)
        for k, (a, g) in enumerate(zip(operand_avals, spec.groups, strict=True)):
            trailing = _squeezed(a.shape if g == Group.SHARED else a.shape[1:])
            if k not in split and _kernel_trailing(trailing, heads) is None:
                return Reason.NOT_LANEWISE, {"prim": f"attention operand of trailing shape {trailing}"}
        if any(np.dtype(m.dtype) not in _FLOAT for m in msgs):
            return Reason.UNSUPPORTED_DTYPE, {"dtype": str(np.dtype(msgs[0].dtype))}
        return None
    lanes = _lanewise(spec, region, operand_avals, msgs)
    if lanes is None:
        return None
    heads = _head_tiles(spec, operand_avals, msgs)
    if heads is None:
        return _not_in_triton(spec, region, operand_avals)
    # a per-head function (attention's backward) says why the per-head kernels do not take it
    return lanes if heads[0] == Reason.NOT_LANEWISE else heads


def _lanewise(spec: eo.EdgeSpec, region: ef.RegionFn, operand_avals, msgs) -> tuple[Reason, dict] | None:
    """None when the lane-wise gather kernels can run ``spec`` (a reduction or per-edge op, not softmax)."""
    for op in region.ops:
        if op.prim is compat.CUSTOM_JVP and op.body is not None:  # jax.nn.relu: elementwise callees run on tiles
            if not all(facts.is_elementwise(inner.prim) for inner in op.body.ops):
                return Reason.NOT_LANEWISE, {"prim": op.name}
        elif not _lane_op(op, region) or op.prim.multiple_results or op.prim in compat.CUSTOM_CALLS:
            return Reason.NOT_LANEWISE, {"prim": op.name}
    out_dtypes = {np.dtype(m.dtype) for m in msgs}
    if not out_dtypes <= (_FLOAT | {np.dtype(np.int32)}):
        return Reason.UNSUPPORTED_DTYPE, {"dtype": ",".join(sorted(map(str, out_dtypes)))}
    if spec.reduce == eo.Reduce.MEAN and out_dtypes - _FLOAT:
        return Reason.UNSUPPORTED_DTYPE, {"dtype": "int32 mean"}
    width = int(np.prod(msgs[0].shape[1:], dtype=np.int64))
    widths = [int(np.prod(a.shape if g == Group.SHARED else a.shape[1:], dtype=np.int64))
              for a, g in zip(operand_avals, spec.groups, strict=True)]
    if any(w not in (1, width) for w in widths) or (width > 1 and width not in widths):
        return Reason.NOT_LANEWISE, {"prim": f"operand widths {sorted(set(widths))} for messages of width {width}"}
    if len(msgs) != 1:
        return Reason.NOT_LANEWISE, {"prim": "several messages"}
    return None


# Rows of the block the Triton check traces an edge function at: a power of two, as every kernel block is, and
# not 1, whose unit axis a shape rule could treat apart.
_PROBE_ROWS = 2


def _not_in_triton(spec: eo.EdgeSpec, region: ef.RegionFn, operand_avals) -> tuple[Reason, dict] | None:
    """None when Pallas' Triton lowering takes every op of ``spec``'s edge function (derivatives included) as the
    per-head kernels run it: on a block of `_PROBE_ROWS` rows, its dead ops dropped. The interpreter would run
    any op, but a GPU would not compile a ``slice``, a wide ``concatenate`` or a value of three lanes, so such an
    op stays on XLA."""
    rows = tuple(a if g == Group.SHARED else jax.ShapeDtypeStruct((_PROBE_ROWS,) + tuple(a.shape[1:]), a.dtype)
                 for a, g in zip(operand_avals, spec.groups, strict=True))
    prim = _triton_gap(spec, tuple((r.shape, np.dtype(r.dtype)) for r in rows))
    return None if prim is None else (Reason.NOT_IN_TRITON, {"prim": prim})


@functools.lru_cache(maxsize=256)
def _triton_gap(spec: eo.EdgeSpec, rows: tuple) -> str | None:
    """`pallas_kernels.compat.triton_gap` of ``spec.fn`` traced at ``rows`` ((shape, dtype) per operand), once per
    op: `decide` runs for each lowering and each report of the same op."""
    import pallas_kernels.compat as pk_compat

    avals = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in rows]
    with ef.rounding_by_convert():
        return pk_compat.triton_gap(jax.make_jaxpr(lambda *xs: spec.fn.apply(list(xs)))(*avals))


def _is_pow2(d: int) -> bool:
    return d > 0 and d & (d - 1) == 0


def _head_tiles(spec: eo.EdgeSpec, operand_avals, msgs) -> tuple[Reason, dict] | None:
    """None when the per-head kernels (`pallas_kernels.head_reduce`) can run ``spec``: a sum or per-edge op whose
    one message is ``[E, H]`` or ``[E, H, D]`` and whose operands are per row, per head or ``[*, H, Dk]`` (unit
    axes aside), with every size a power of two, so that the kernel's tiles have no padding lanes and the edge
    function runs on exactly the shapes it was traced with (attention's backward: `SoftmaxRowDot`,
    `SoftmaxVjp`)."""
    if spec.reduce not in (eo.Reduce.SUM, eo.Reduce.NONE):
        return Reason.NOT_LANEWISE, {"prim": f"a per-head {spec.reduce.value}"}
    heads = _messages_heads(msgs)
    if heads is None:
        return Reason.NOT_LANEWISE, {"prim": f"per-head messages of shapes {[m.shape[1:] for m in msgs]}"}
    sizes = [d for m in msgs for d in _squeezed(m.shape[1:])]
    split = _split_operands(spec, heads)
    for k, (a, g) in enumerate(zip(operand_avals, spec.groups, strict=True)):
        if np.dtype(a.dtype) not in _KERNEL_DTYPES:
            return Reason.UNSUPPORTED_DTYPE, {"dtype": f"{np.dtype(a.dtype)} in a per-head function"}
        trailing = _squeezed(a.shape if g == Group.SHARED else a.shape[1:])
        kernel = split.get(k) or _kernel_trailing(trailing, heads)
        if kernel is None:
            return Reason.NOT_LANEWISE, {"prim": f"per-head operand of trailing shape {trailing}"}
        sizes.extend(kernel)
    if any(np.dtype(m.dtype) not in _FLOAT for m in msgs) or len({np.dtype(m.dtype) for m in msgs}) != 1:
        return Reason.UNSUPPORTED_DTYPE, {"dtype": ",".join(sorted({str(np.dtype(m.dtype)) for m in msgs}))}
    if not all(map(_is_pow2, sizes)):
        return Reason.NOT_ZERO_PADDING_SAFE, {"sizes": tuple(sorted(set(sizes)))}
    return None


def _split_operands(spec: eo.EdgeSpec, heads: int) -> dict[int, tuple[int, int]]:
    """`split_heads` of the base region, as operand positions of a derived function (whose first operands are
    its base's)."""
    region = _base_region(spec.fn)
    return {} if region is None else split_heads(region, heads)


def _message_heads(msg) -> int | None:
    """``H`` of ``[E, H]`` or ``[E, H, D]`` messages (unit axes aside; one head for a scalar per edge)."""
    squeezed = _squeezed(msg.shape[1:])
    return 1 if not squeezed else squeezed[0] if len(squeezed) <= 2 else None


def _messages_heads(msgs) -> int | None:
    """The head count of several per-head messages: the smallest leading size, which every message's size must be
    a multiple of (a flat ``[E, H·D]`` cotangent of RGAT's values goes to the kernel as ``[E, H, D]``)."""
    firsts = [_message_heads(m) for m in msgs]
    if None in firsts:
        return None
    heads = min(firsts)
    return heads if all(math.prod(m.shape[1:]) % heads == 0 for m in msgs) else None


def kernel_params(spec: eo.EdgeSpec, operand_avals) -> tuple:
    """The report parameters of an eligible op: which kernel family runs it."""
    if spec.reduce == eo.Reduce.SOFTMAX:
        return (("kernel", "attention"),)
    region = _base_region(spec.fn)
    msgs = eo.message_avals(spec, operand_avals)
    return (("kernel", "lanes" if _lanewise(spec, region, operand_avals, msgs) is None else "heads"),)


# ---- run --------------------------------------------------------------------------------------------------

def _csr(spec: eo.EdgeSpec, over: Group, src_ids, dst_ids, layout, rows_of):
    """The CSR of the walk over ``over``'s rows: from the layout, or sorted here (dropped edges excluded)."""
    import pallas_kernels as pk

    if spec.layout:
        lay = jax.tree_util.tree_unflatten(spec.layout_tree, layout)
        return lay.rev_csr if over == Group.SRC else lay.csr
    n = spec.num_segments
    over_ids, other = (src_ids, dst_ids) if over == Group.SRC else (dst_ids, src_ids)
    other_group = Group.DST if over == Group.SRC else Group.SRC
    col = normalize(other, rows_of.get(other_group, n), wrap=spec.wrap)
    if spec.raw_over and spec.reduce != eo.Reduce.NONE:
        rows = narrow(over_ids)  # out-of-range rows are dropped by the builder, as segment ops drop them
    else:
        rows = normalize(over_ids, n, wrap=spec.wrap)
    csr, _ = pk.build_csr_jax(col, rows, n)
    return csr


def _tile(x, dtype):
    """A kernel tile back in the operand's own dtype (the kernels hand the edge function compute-dtype tiles)."""
    if np.dtype(dtype) == np.bool_:
        return x != 0
    return x.astype(dtype)


def run(*args, spec: eo.EdgeSpec) -> list:
    if eo.INTERPRET[spec.backend]:
        return _run(*args, spec=spec, interpret=True)
    with ef.rounding_by_convert():  # traced for Triton
        return _run(*args, spec=spec, interpret=False)


def _run(*args, spec: eo.EdgeSpec, interpret: bool) -> list:
    import pallas_kernels as pk

    src_ids, dst_ids, operands, layout = eo.split_args(args, spec)
    rows_of = {g: x.shape[0] for x, g in zip(operands, spec.groups, strict=True) if g in (Group.SRC, Group.DST)}
    over = Group.DST if spec.reduce == eo.Reduce.NONE else spec.over
    csr = _csr(spec, over, src_ids, dst_ids, layout, rows_of)
    col_group, row_group = (Group.DST, Group.SRC) if over == Group.SRC else (Group.SRC, Group.DST)
    slots = {g: [k for k, gg in enumerate(spec.groups) if gg == g] for g in (col_group, row_group, Group.EDGE,
                                                                             Group.SHARED)}
    n = spec.num_segments if spec.reduce != eo.Reduce.NONE else rows_of.get(Group.DST, spec.num_segments)
    msgs = eo.message_avals(spec, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands])

    def place(col, row, edge, shared):
        tiles = [None] * len(spec.groups)
        for group, vals in ((col_group, col), (row_group, row), (Group.EDGE, edge), (Group.SHARED, shared)):
            for k, t in zip(slots[group], vals, strict=True):
                tiles[k] = _tile(t, operands[k].dtype)
        return tiles

    if spec.reduce == eo.Reduce.SOFTMAX:
        return _attention(spec, operands, place, slots, col_group, row_group, csr, n, msgs, interpret)
    if _lanewise(spec, _base_region(spec.fn), [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands],
                 msgs) is not None:
        return _per_head_op(spec, operands, place, slots, col_group, row_group, csr, n, msgs, interpret)

    def edge_fn(col, row, edge, shared):
        (y,) = spec.fn.apply(place(col, row, edge, shared), lanes=True)
        return y

    # Explicit widths: a -1 is ambiguous on zero rows (a graph with no edges).
    flat = lambda k: jnp.reshape(operands[k], (1, operands[k].size) if spec.groups[k] == Group.SHARED else
                                 (operands[k].shape[0], math.prod(operands[k].shape[1:])))
    pick = lambda g: tuple(flat(k).astype(jnp.int32) if operands[k].dtype == jnp.bool_ else flat(k)
                           for k in slots[g])
    col, row, edge, shared = pick(col_group), pick(row_group), pick(Group.EDGE), pick(Group.SHARED)
    (msg,) = msgs[:1]
    width = math.prod(msg.shape[1:])
    if spec.reduce == eo.Reduce.NONE:
        out = pk.gather_compute_forward(edge_fn, col, row, edge, shared, csr, num_edges=spec.num_edges,
                                        interpret=interpret, out_dtype=msg.dtype)
        return [jnp.broadcast_to(out, (spec.num_edges, width)).reshape(msg.shape)]
    kind = {eo.Reduce.SUM: "sum", eo.Reduce.MEAN: "mean", eo.Reduce.MAX: "max", eo.Reduce.MIN: "min"}[spec.reduce]
    dtype = eo.mean_dtype(msg.dtype) if kind == "mean" else msg.dtype
    out = pk.gather_reduce_forward(edge_fn, col, row, edge, shared, csr, reduce=kind, empty=spec.empty,
                                   interpret=interpret, out_dtype=dtype)
    result = [jnp.broadcast_to(out, (n, width)).reshape((n,) + msg.shape[1:])]
    if kind == "mean":
        result.append((csr.indptr[1:] - csr.indptr[:-1]).astype(eo.count_dtype(msg.dtype)))
    if spec.hits:
        hits = _hits(spec, place, col, row, edge, shared, csr, out, interpret)
        result.append(jnp.broadcast_to(hits != 0, (spec.num_edges, width))
                      .reshape((spec.num_edges,) + msg.shape[1:]))
    return result


def _hits(spec, place, col, row, edge, shared, csr, best, interpret):
    """Per edge, whether its message attains its row's max/min (``best``, the gather kernel's ``[n, w]``): a
    compute kernel over the same CSR that re-evaluates the edge function, with ``best`` as one more row operand,
    and compares as the reference does (a NaN row has no hits; dropped edges have none)."""
    import pallas_kernels as pk

    def hit_fn(c, r, e, s):
        (y,) = spec.fn.apply(place(c, r[:-1], e, s), lanes=True)
        return jnp.where(y == r[-1].astype(y.dtype), 1, 0).astype(jnp.int32)

    return pk.gather_compute_forward(hit_fn, col, row + (best,), edge, shared, csr, num_edges=spec.num_edges,
                                     interpret=interpret, out_dtype=jnp.int32)


def _attention(spec, operands, place, slots, col_group, row_group, csr, n, msgs, interpret):
    import pallas_kernels as pk

    region = spec.fn
    heads = _heads(msgs[0])
    # A shared operand traced with a leading unit axis (vmap's broadcast of an unbatched value) takes its tile's
    # row axis there, as a row operand does; not when that axis is the head axis of one head.
    traced = [tuple(v.shape) if w and (not v.ndim or v.shape[0] != 1 or not _leading_axis_is_rows(region, v))
              else tuple(v.shape[1:]) for v, w in zip(region.inputs, region.whole, strict=True)]

    split = split_heads(region, heads)
    for k, t in split.items():
        traced[k] = t  # the tile is [B, H, Dk]; the region's reshape of it is taken as given, below
    split_ids = {region.inputs[k].id for k in split}

    def per_head(k):
        if k in split:
            return jnp.reshape(operands[k], (operands[k].shape[0],) + split[k])
        return _per_head(operands[k], spec.groups[k] == Group.SHARED, heads)

    as_traced = lambda tile, shape: _as_traced(tile, shape, heads)

    def edge_fn(col, row, edge, shared):
        tiles = [as_traced(t, shape) for t, shape in zip(place(col, row, edge, shared), traced, strict=True)]
        block = tiles[0].shape[0]
        env = {v.id: t for v, t in zip(region.inputs, tiles, strict=True)}
        read = lambda a: a.value if isinstance(a, ir.Const) else env[a.id]
        run = ef.sixteen_bit_in_f32(lambda op, xs: [_tile_op(op, xs, block)])
        for op in region.ops:
            if op.prim is lax.reshape_p and isinstance(op.inputs[0], ir.Value) and op.inputs[0].id in split_ids:
                env[op.outputs[0].id] = as_traced(read(op.inputs[0]), op.outputs[0].shape[1:])
                continue
            (env[op.outputs[0].id],) = run(op, [read(a) for a in op.inputs])
        scores, values = (read(a) for a in region.outputs)
        scores = jnp.reshape(scores, (block, -1))
        values = jnp.reshape(values, (block, scores.shape[1], -1))
        return scores, values

    pick = lambda g: tuple(per_head(k) for k in slots[g])
    out, m, l = pk.attention_forward(edge_fn, pick(col_group), pick(row_group), pick(Group.EDGE),
                                     pick(Group.SHARED), csr, heads=heads, interpret=interpret,
                                     out_dtype=jnp.result_type(msgs[0].dtype, msgs[1].dtype), exact_integers=True)
    stat = eo.accumulation_dtype(msgs[0].dtype)
    return [out.reshape((n,) + msgs[1].shape[1:]), m.reshape((n,) + msgs[0].shape[1:]).astype(stat),
            l.reshape((n,) + msgs[0].shape[1:]).astype(stat)]


def _leading_axis_is_rows(region, v) -> bool:
    """Whether a shared operand's leading unit axis lines up with the rows where the region uses it: it does,
    unless every use broadcasts that axis to a later one (a ``[1]`` vector of one head's values, say)."""
    uses = [op for op in region.ops if any(isinstance(a, ir.Value) and a.id == v.id for a in op.inputs)]
    return not uses or any(op.prim is not lax.broadcast_in_dim_p or op.params["broadcast_dimensions"][0] == 0
                           for op in uses)


def _per_head_op(spec, operands, place, slots, col_group, row_group, csr, n, msgs, interpret):
    """A sum or per-edge op on the per-head kernels (`_head_tiles` holds): the edge function runs on tiles
    shaped back to its operands' own shapes."""
    import pallas_kernels as pk

    heads = _messages_heads(msgs)
    split = _split_operands(spec, heads)

    def operand(tile, k):
        x = operands[k]
        if k in split:  # [B, H, Dk] back to the flat rows the region reshapes
            return jnp.reshape(tile, (tile.shape[0],) + x.shape[1:])
        if spec.groups[k] == Group.SHARED:
            return jnp.reshape(_first_row(_as_traced(tile, x.shape, heads)), x.shape)
        return _as_traced(tile, x.shape[1:], heads)

    def edge_fn(col, row, edge, shared):
        ys = spec.fn.apply([operand(t, k) for k, t in enumerate(place(col, row, edge, shared))])
        return tuple(jnp.reshape(y, (y.shape[0], heads, -1)) for y in ys)

    per_head = lambda k: jnp.reshape(operands[k], (operands[k].shape[0],) + split[k]) if k in split else \
        _per_head(operands[k], spec.groups[k] == Group.SHARED, heads)
    pick = lambda g: tuple(per_head(k) for k in slots[g])
    args = (edge_fn, pick(col_group), pick(row_group), pick(Group.EDGE), pick(Group.SHARED), csr)
    if spec.reduce == eo.Reduce.NONE:
        outs, rows = pk.head_compute_forward(*args, heads=heads, num_edges=spec.num_edges, interpret=interpret,
                                             out_dtype=msgs[0].dtype), spec.num_edges
    else:
        outs, rows = pk.head_reduce_forward(*args, heads=heads, interpret=interpret, out_dtype=msgs[0].dtype), n
    return [out.reshape((rows,) + m.shape[1:]) for out, m in zip(outs, msgs, strict=True)]


def _per_head(x, shared: bool, heads: int):
    """An operand as the per-head kernels take it: ``[rows, H]`` or ``[rows, H, Dk]`` (a scalar per row
    broadcast)."""
    rows = 1 if shared else x.shape[0]
    trailing = _squeezed(x.shape if shared else x.shape[1:])
    x = jnp.reshape(x, (rows,) + trailing)
    return jnp.broadcast_to(x[:, None], (rows, heads)) if not trailing else \
        jnp.reshape(x, (rows,) + _kernel_trailing(trailing, heads))


def _as_traced(tile, shape, heads: int):
    """A kernel tile with the rank the region was traced with (unit axes put back; a per-row scalar is its
    first column; with one head the head axis goes)."""
    core = _first_column(tile) if heads == 1 or not _squeezed(shape) else tile
    dims = iter(core.shape[1:])
    return jnp.reshape(core, (core.shape[0],) + tuple(1 if d == 1 else next(dims) for d in shape))


def _first_row(tile):
    """The one value of a shared operand's tile, which the kernel broadcast along the slots: a max over them
    (equal values; Triton has no static slice)."""
    if tile.dtype == jnp.bool_:
        return jnp.max(jnp.where(tile, 1, 0), axis=0) > 0
    return jnp.max(tile, axis=0)


def _first_column(tile):
    """``tile[:, 0]`` of a ``[B, H, ...]`` tile as a masked reduction over the head axis: Pallas' Triton lowering
    has no static ``slice``. Exact: the other lanes add the reduction's identity (-0.0 for floats, which keeps
    a -0.0 and passes inf and NaN through; False for bool, through int32)."""
    lane = lax.broadcasted_iota(jnp.int32, tile.shape, 1) == 0
    if tile.dtype == jnp.bool_:  # no reduce_or in Triton either
        return jnp.max(jnp.where(lane & tile, 1, 0), axis=1) > 0
    fill = jnp.array(-0.0 if jnp.issubdtype(tile.dtype, jnp.floating) else 0, tile.dtype)
    return jnp.sum(jnp.where(lane, tile, fill), axis=1)


def _tile_op(op, ins, block: int):
    """One region op on padded tiles that keep the traced rank: elementwise ops as they are; a shape op keeps the
    tile's sizes on its non-unit axes (a broadcast along a padded axis is left to the next elementwise op, which
    broadcasts the unit axis)."""
    if op.prim in (lax.broadcast_in_dim_p, lax.reshape_p, lax.squeeze_p):
        x = jnp.asarray(ins[0])
        traced_in, traced_out = op.inputs[0].shape, op.outputs[0].shape
        if op.prim is lax.broadcast_in_dim_p:
            dims = tuple(op.params["broadcast_dimensions"])
            if x.ndim == len(traced_in) + 1:
                dims = (0,) + dims  # a shared operand's tile keeps a leading row axis of its own
            target = [1] * len(traced_out)
            for j, d in enumerate(dims):
                target[d] = x.shape[j] if x.ndim else 1
            if traced_out and 0 not in dims:
                target[0] = 1  # a shared value along the rows: broadcast by the next op
            return jnp.reshape(x, tuple(target)) if x.ndim else jnp.broadcast_to(x, tuple(target))
        sizes = iter([s for s, t in zip(x.shape, traced_in, strict=True) if t != 1 or s != 1])
        target = [next(sizes) if t != 1 else 1 for t in traced_out]
        return jnp.reshape(x, tuple(target))
    if op.prim is lax.reduce_sum_p:
        return jnp.sum(ins[0], axis=tuple(op.params["axes"]))
    if op.prim is lax.convert_element_type_p:
        return jnp.asarray(ins[0]).astype(op.params["new_dtype"])
    if len(ins) > 1 and facts.is_elementwise(op.prim):
        # Unit axes left by the shape ops above broadcast here (lax ops such as select_n do not broadcast).
        shape = jnp.broadcast_shapes(*(np.shape(x) for x in ins))
        ins = [x if np.ndim(x) == 0 else jnp.broadcast_to(x, shape) for x in ins]
    return op.run(*ins)[0]
