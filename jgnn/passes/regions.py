"""Edge regions: the per-edge computation between gathers and a reduction, as the fusion passes see it.

A region is grown backwards from a root edge value through ops that ``admit`` accepts and whose results only
the region reads. Its *leaves* become the fused op's operands, classified as node rows gathered by ``src``
or ``dst`` ids, edge rows, or a constant row (an expanded shared value, fed as one row per destination).

A region runs in one of two modes:

* ``exact``: every op is bound as traced, on operands with their traced shapes (the XLA lowerings);
* ``lanes``: operands arrive already broadcast to ``[B, W]`` blocks and ops that only insert, remove or
  broadcast unit axes are identities, which is what the Pallas kernels' lane-wise contract needs.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable

import numpy as np

from jgnn import ir, residency
from jgnn.passes.context import Context
from jgnn.rowwise import ELEMENTWISE, ROW_LENGTH_PARAMS, out_axis
from pallas_kernels.compat import bind_primitive

SHAPE_ONLY = frozenset({"broadcast_in_dim", "reshape", "squeeze"})


@dataclasses.dataclass
class Region:
    ops: list[ir.Op]  # in program order
    root: ir.Value
    groups: dict[str, list[ir.Atom]]  # "src" / "dst" / "edge" / "const" operands of the fused op
    slots: dict[int, tuple[str, int]]  # leaf value id -> (group, position)
    src_index: ir.Value | None  # a [E, 1] src-id column used by the region's gathers
    dst_index: ir.Value | None
    expand: dict[int, ir.Op] = dataclasses.field(default_factory=dict)  # const leaf id -> its broadcast op


def squeezed(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def is_lane_op(op: ir.Op) -> bool:
    """Elementwise, or a shape op that only moves unit axes (an identity on ``[B, W]`` blocks)."""
    if op.name in ELEMENTWISE:
        return True
    if op.name in SHAPE_ONLY:
        x = op.inputs[0]
        return x.ndim >= 1 and squeezed(x.shape[1:]) in ((), squeezed(op.outputs[0].shape[1:]))
    return False


def zero_padding_safe(region: Region) -> bool:
    """Whether the region gives the same result when the kernel pads every operand's lanes with zeros.

    Padded lanes only matter where a reduction sums over them, so track which values are zero there:
    operands are; a product with such a factor is; sums and differences of such values are; a division
    of one by a nonzero constant is. A ``reduce_sum`` is safe on such a value only (a dot product), and no
    other reduction is allowed. Everything else may hold garbage in padded lanes, which the kernel masks.
    """
    zero = set(region.slots)

    def is_zero(a):
        return isinstance(a, ir.Value) and a.id in zero

    for op in region.ops:
        a = op.inputs
        if op.name == "reduce_sum":
            if not is_zero(a[0]):
                return False
            ok = True
        elif op.name.startswith("reduce_") or op.name in ("argmax", "argmin"):
            return False
        elif op.name == "mul":
            ok = any(map(is_zero, a))
        elif op.name in ("add", "sub"):
            ok = all(map(is_zero, a))
        elif op.name == "div":
            ok = is_zero(a[0]) and isinstance(a[1], ir.Const) and np.all(np.asarray(a[1].value) != 0)
        else:
            ok = (op.name in SHAPE_ONLY or op.name in ("neg", "convert_element_type")) and is_zero(a[0])
        if ok:
            zero.add(op.outputs[0].id)
    return True


def edge_rowwise(op: ir.Op, ctx: Context) -> bool:
    """Row-wise on the edge axis (axis 0) and not a matmul against a weight matrix.

    Matmuls stay with XLA/cuBLAS (UGCG's rule); a per-row dot product of two edge rows (rows paired on batch
    dim 0) is a row reduction and may join.
    """
    if len(op.outputs) != 1:
        return False
    axes = [0 if isinstance(a, ir.Value) and ctx.info(a).residency == residency.EDGE and not ctx.info(a).expanded
            and ctx.info(a).axis == 0 else None for a in op.inputs]
    if op.name == "dot_general" and not all(a == 0 for a in axes):
        return False
    return any(a is not None for a in axes) and out_axis(op, axes) == 0


def links(program: ir.Program) -> tuple[dict[int, ir.Op], dict[int, list[ir.Op]], dict[int, int]]:
    """(producer of each value, readers of each value, position of each op): what region growth reads."""
    return ir.producers(program), ir.users(program), {id(op): i for i, op in enumerate(program.ops)}


def grow(root: ir.Value, made_by, users, admit: Callable[[ir.Op], bool], order: dict[int, int], *,
         allowed_readers=frozenset()):
    """(ops, leaves) of the tree computing ``root``; None when a non-scalar literal is inside.

    ``allowed_readers`` are ops outside the region that may also read region values (e.g. the softmax ops
    that read the scores).
    """
    region: dict[int, ir.Op] = {}
    member_ops: set[int] = set(allowed_readers)
    leaves: dict[int, ir.Value] = {}
    # Latest-defined value first: all readers of a value come after it, so they are decided before it is.
    position = lambda v: order.get(id(made_by.get(v.id)), -1)
    heap = [(-position(root), root.id, root)]
    queued = {root.id}
    while heap:
        _, _, v = heapq.heappop(heap)
        op = made_by.get(v.id)
        readers = users.get(v.id, [])
        read_inside = v.id == root.id or all(id(u) in member_ops for u in readers)
        if not (read_inside and op is not None and len(op.outputs) == 1 and admit(op)):
            leaves[v.id] = v
            continue
        region[v.id] = op
        member_ops.add(id(op))
        for a in op.inputs:
            if isinstance(a, ir.Value) and a.id not in queued:
                queued.add(a.id)
                heapq.heappush(heap, (-position(a), a.id, a))
            elif isinstance(a, ir.Const) and np.ndim(a.value) != 0:
                return None
    ops = sorted(region.values(), key=lambda o: order[id(o)])
    return ops, leaves


def classify(leaf: ir.Value, made_by, ctx: Context):
    """('src'|'dst'|'edge'|'const', operand, index value) for one leaf, or None."""
    op = made_by.get(leaf.id)
    if op is not None and op.name == "gather" and residency.row_gather_axis(op) == 0:
        idx = ctx.info(op.inputs[1])
        if idx.index in ("src", "dst") and isinstance(op.inputs[0], ir.Value):
            return idx.index, op.inputs[0], op.inputs[1]
    info = ctx.info(leaf)
    if info.residency == residency.SHARED and not info.expanded and leaf.ndim == 0:
        return "const", leaf, None  # a traced scalar (a weight, a converted literal)
    if info.expanded and op is not None and op.name == "broadcast_in_dim":
        src, dims = op.inputs[0], tuple(op.params["broadcast_dimensions"])
        if src.ndim == 0 or dims == tuple(range(leaf.ndim - src.ndim, leaf.ndim)):
            return "const", src, None
        return None
    if info.residency == residency.EDGE and info.axis == 0:
        return "edge", leaf, None
    return None


def build(root: ir.Value, ops: list[ir.Op], leaves: dict[int, ir.Value], made_by, ctx: Context) -> Region | None:
    groups: dict[str, list[ir.Atom]] = {"src": [], "dst": [], "edge": [], "const": []}
    slots: dict[int, tuple[str, int]] = {}
    index = {"src": None, "dst": None}
    expand = {}
    for vid, leaf in leaves.items():
        kind = classify(leaf, made_by, ctx)
        if kind is None:
            return None
        group, operand, idx = kind
        if group == "const" and operand is not leaf:
            expand[vid] = made_by[vid]
        elif idx is not None:
            index[group] = idx
        slots[vid] = (group, len(groups[group]))
        groups[group].append(operand)
    return Region(ops, root, groups, slots, index["src"], index["dst"], expand)


def evaluator(region: Region, *, lanes: bool, consts=()) -> Callable:
    """``fn(src_rows, dst_rows, edge_rows) -> root value`` (see module docstring for the two modes).

    In ``lanes`` mode constant leaves arrive as the last dst rows; in ``exact`` mode pass their values as
    ``consts`` and they are re-broadcast by the op that expanded them.
    """
    n_const = len(region.groups["const"])

    edges = region.root.shape[0]

    def fn(src_rows, dst_rows, edge_rows):
        if lanes:
            const_vals = dst_rows[len(dst_rows) - n_const:]
        else:
            const_vals = consts
        groups = {"src": src_rows, "dst": dst_rows, "edge": edge_rows, "const": const_vals}
        rows = next(x.shape[0] for g in (src_rows, dst_rows, edge_rows) for x in g)
        env = {vid: groups[g][i] for vid, (g, i) in region.slots.items()}
        if not lanes:
            env.update((vid, run_on_rows(op, [env[vid]], edges, rows)) for vid, op in region.expand.items())
        for op in region.ops:
            args = [a.value if isinstance(a, ir.Const) else env[a.id] for a in op.inputs]
            env[op.outputs[0].id] = args[0] if lanes and op.name in SHAPE_ONLY else run_on_rows(op, args, edges, rows)
        return env[region.root.id]

    return fn


def run_on_rows(op: ir.Op, args, traced_rows: int, rows: int):
    """Run a region op on ``rows`` edges (a block) although it was traced on ``traced_rows``."""
    key = ROW_LENGTH_PARAMS.get(op.name)
    if rows == traced_rows or key is None or op.params.get(key) is None or op.params[key][0] != traced_rows:
        return op.run(*args)[0]
    sizes = (rows,) + tuple(op.params[key][1:])
    return bind_primitive(op.prim, dict(op.params, **{key: sizes}), args)


def as_rows(x, rows: int):
    """A fused op's operand as ``[rows, ...]``: node/edge arrays as they are, a constant repeated per row."""
    import jax.numpy as jnp

    if np.ndim(x) and np.shape(x)[0] == rows:
        return x
    flat = jnp.reshape(x, (1, -1))
    return jnp.broadcast_to(flat, (rows, flat.shape[1]))


_INDEX_INPUT = {"src": "senders", "dst": "receivers"}


def find_index(program: ir.Program, ctx: Context, kind: str, e: int, before: ir.Op) -> ir.Value | None:
    """An id array of ``kind`` ("src"/"dst") for ``e`` edges, defined before ``before``: the index of a gather
    of that kind, else the graph's ``senders``/``receivers``."""
    for op in program.ops:
        if op is before:
            break
        if op.name == "gather" and ctx.info(op.inputs[1]).index == kind and op.inputs[1].shape[:1] == (e,):
            return op.inputs[1]
    for v, tag in zip(program.inputs, ctx.tags, strict=False):
        if tag.role == _INDEX_INPUT[kind] and v.shape[:1] == (e,):
            return v
    return None


def replace_ops(program: ir.Program, replaced: dict[int, ir.Op], removed: set[int]) -> ir.Program:
    """The program with ops swapped for their fused replacements (keyed by ``id(op)``) and ``removed`` dropped."""
    ops = [replaced.get(id(op), op) for op in program.ops if id(op) in replaced or id(op) not in removed]
    return ir.Program(program.inputs, program.outputs, ops)
