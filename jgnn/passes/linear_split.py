"""``linear_split``: split a linear op over operands that live in different places.

* ``concat([a, b]) @ W`` → ``a @ W[:da] + b @ W[da:]`` (the naive GAT attention ``concat(z_i, z_j) @ a``);
* ``(a ± b) @ W`` → ``a @ W ± b @ W`` (UGCG's propagation-postponed reorganisation), except the difference of one
  array read at two ends, ``(x[dst] − x[src]) @ W`` (EdgeConv's ``x_j − x_i``): neighbours' features are close
  (a kNN graph's points), the difference is exact where they are, and split it would cancel two large products,
  keeping their rounding (fuzz campaign 20261205: near-tied features, outputs 30% off; `CANCELLING_DIFFERENCE`).

Legal when ``W`` is shared and the split dimension is contracted. Done only when the pieces come through
different indices (or live at different residencies): then broadcast reordering can lift each piece to its own
rows, and CSE merges ``(h[src] @ W)`` with ``(h[dst] @ W)``. A piece that is a constant (``x[s] + 1.0``) is
split off only when it has the rank of the other operand, so no rank-0 matmul is ever made.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from jgnn import ir
from jgnn.ops.edge_fn import SIXTEEN_BIT
from jgnn.ops.gather import gather_p
from jgnn.passes.context import Builder, Context
from jgnn.report import Pass, Reason

_SHAPE_ONLY = (lax.reshape_p, lax.broadcast_in_dim_p, lax.convert_element_type_p)
_THROUGH = _SHAPE_ONLY + (lax.dot_general_p,)


def _where(ctx: Context, atom: ir.Atom, made_by: dict[int, ir.Op]) -> tuple:
    """Provenance of a value: the index it was gathered through, else its residency."""
    if isinstance(atom, ir.Const):
        return ("const",)
    op = made_by.get(atom.id)
    if op is not None and op.prim is gather_p:
        return ("gather", op.params["index"].value, op.inputs[1].id)
    if op is not None and op.prim in _THROUGH:
        return _where(ctx, op.inputs[0], made_by)
    info = ctx.info(atom)
    return (info.residency.value, info.index, info.graph)


def _gathered_array(atom: ir.Atom, made_by: dict[int, ir.Op]) -> tuple[int, str] | None:
    """(id of the array, index role) of a value gathered from an array, through shape-only ops (not a matmul:
    ``(x @ W)[src]`` is another array), else None."""
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    if op is not None and op.prim in _SHAPE_ONLY:
        return _gathered_array(op.inputs[0], made_by)
    if op is None or op.prim is not gather_p or not isinstance(op.inputs[0], ir.Value):
        return None
    return op.inputs[0].id, op.params["index"].value


def _one_array_at_two_ends(sub: ir.Op, made_by: dict[int, ir.Op]) -> tuple[str, str] | None:
    """The two index roles of ``x[i] − x[j]``, one array gathered through both, else None."""
    a, b = (_gathered_array(x, made_by) for x in sub.inputs)
    return (a[1], b[1]) if a is not None and b is not None and a[0] == b[0] else None


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    b = Builder(program, ctx)

    def emit(op: ir.Op) -> None:
        new = _split(op, ctx, made_by, b)
        if new is None:
            b.emit(op)
            return
        for o in new:  # a piece may split again: concat(x_i, x_j - x_i) @ W needs both rules (EdgeConv)
            made_by.update((v.id, o) for v in o.outputs)
            emit(o)

    for op in program.ops:
        emit(op)
    return b.finish()


def _split_concat(op: ir.Op, cat: ir.Op, ctx: Context):
    """Pieces of ``concat`` along a contracted lhs dim, with the matching slices of the shared rhs."""
    (lc, rc), _ = op.params["dimension_numbers"]
    dim = cat.params["dimension"]
    if dim not in lc:
        return None
    rdim = rc[list(lc).index(dim)]
    w = op.inputs[1]
    pieces, start, new_ops = [], 0, []
    for piece in cat.inputs:
        width = piece.shape[dim]
        lo, hi = [0] * w.ndim, list(w.shape)
        lo[rdim], hi[rdim] = start, start + width
        sl = ir.new_op(lax.slice_p, [w], dict(start_indices=tuple(lo), limit_indices=tuple(hi), strides=None))
        ctx.analysis.info[sl.outputs[0].id] = ctx.info(w)  # a slice of a weight is a weight
        new_ops.append(sl)
        pieces.append((piece, sl.outputs[0]))
        start += width
    return pieces, new_ops


def _split(op: ir.Op, ctx: Context, made_by, b: Builder) -> list[ir.Op] | None:
    """The ops replacing ``op``, or None to keep it."""
    if op.prim is not lax.dot_general_p or not isinstance(op.inputs[0], ir.Value):
        return None
    lhs_op = made_by.get(b.read(op.inputs[0]).id)
    if lhs_op is None or not ctx.is_shared(op.inputs[1]) or lhs_op.prim not in (
            lax.concatenate_p, lax.add_p, lax.sub_p):
        return None
    if any(a.ndim != op.inputs[0].ndim for a in lhs_op.inputs):
        return None  # a broadcast scalar (x[s] + 1.0): a rank-0 piece cannot be a matmul operand
    if lhs_op.prim is not lax.concatenate_p and any(a.shape != op.inputs[0].shape for a in lhs_op.inputs):
        # a piece broadcast along a unit axis (x[e] − h[src] with h one feature wide): it does not fit W
        # (fuzz campaign 20261500: 123 float64 cases per backend and mode crashed in the split matmul)
        ctx.skipped(Pass.LINEAR_SPLIT, Reason.BROADCAST_PIECE, op=lhs_op.name)
        return None
    wheres = {_where(ctx, a, made_by) for a in lhs_op.inputs}
    if len(wheres) < 2:
        ctx.skipped(Pass.LINEAR_SPLIT, Reason.SAME_PROVENANCE, op=lhs_op.name)
        return None
    if lhs_op.prim is lax.sub_p and (same := _one_array_at_two_ends(lhs_op, made_by)):
        ctx.skipped(Pass.LINEAR_SPLIT, Reason.CANCELLING_DIFFERENCE, a=same[0], b=same[1])
        return None
    if lhs_op.prim is lax.concatenate_p:
        split = _split_concat(op, lhs_op, ctx)
        if split is None:
            ctx.skipped(Pass.LINEAR_SPLIT, Reason.SPLIT_DIM_NOT_CONTRACTED)
            return None
        pieces, new_ops = split
        combine = [lax.add_p] * (len(pieces) - 1)
    else:
        pieces, new_ops = [(a, op.inputs[1]) for a in lhs_op.inputs], []
        combine = [lax.add_p if lhs_op.prim is lax.add_p else lax.sub_p]
    # A bfloat16/float16 matmul accumulates in float32 and rounds once; so do its pieces and their sum, or each
    # piece's rounding would stay in a result that cancels (fuzz campaign 20261127: 13x the reference's error).
    narrow = np.dtype(op.outputs[0].dtype) in SIXTEEN_BIT
    params = dict(op.params, preferred_element_type=np.dtype(np.float32)) if narrow else op.params
    partial = [ir.new_op(lax.dot_general_p, [a, w], params) for a, w in pieces]
    new_ops += partial
    acc = partial[0].outputs[0]
    for prim, nxt in zip(combine, partial[1:], strict=True):
        last = nxt is partial[-1] and not narrow
        add = ir.new_op(prim, [acc, nxt.outputs[0]], {}, outputs=op.outputs if last else None)
        new_ops.append(add)
        acc = add.outputs[0]
    if narrow:
        new_ops.append(ir.new_op(lax.convert_element_type_p, [acc],
                                 dict(new_dtype=np.dtype(op.outputs[0].dtype), weak_type=False, sharding=None),
                                 outputs=op.outputs))
    code = Reason.SPLIT_CONCAT if lhs_op.prim is lax.concatenate_p else Reason.SPLIT_SUM
    widths = [int(a.shape[-1]) if a.ndim else 1 for a, _ in pieces]
    ctx.applied(Pass.LINEAR_SPLIT, code, pieces=", ".join("/".join(map(str, w)) for w in sorted(wheres, key=str)),
                n=len(pieces), widths=widths)
    return new_ops
