"""``linear_split``: split a linear op over operands that live in different places.

* ``concat([a, b]) @ W`` → ``a @ W[:da] + b @ W[da:]`` (the naive GAT attention ``concat(z_i, z_j) @ a``);
* ``(a ± b) @ W`` → ``a @ W ± b @ W`` (UGCG's propagation-postponed reorganisation).

Legal when ``W`` is shared and the split dimension is contracted. Done only when the pieces come through
different indices (or live at different residencies): then broadcast reordering can lift each piece to the
nodes, and CSE merges ``(h[src] @ W)`` with ``(h[dst] @ W)``.
"""

from __future__ import annotations

import jax
import numpy as np

from jgnn import ir
from jgnn.passes.context import Context, is_shared

KIND = "linear_split"


def _where(ctx: Context, atom: ir.Atom, made_by: dict[int, ir.Op]) -> tuple:
    """Provenance of a value: the index it was gathered through, else its residency."""
    if isinstance(atom, ir.Const):
        return ("const",)
    op = made_by.get(atom.id)
    if op is not None and op.name == "gather":
        idx = ctx.info(op.inputs[1])
        if idx.index:
            return ("gather", idx.index, op.inputs[1].shape[0])
    if op is not None and op.name in ("reshape", "broadcast_in_dim", "convert_element_type", "dot_general"):
        return _where(ctx, op.inputs[0], made_by)
    info = ctx.info(atom)
    return (info.residency, info.index)


def _split_concat(op, cat, ctx, made_by):
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
        sl = ir.new_op(jax.lax.slice_p, [w], dict(start_indices=tuple(lo), limit_indices=tuple(hi), strides=None),
                       origin=KIND)
        new_ops.append(sl)
        ctx.analysis.info[sl.outputs[0].id] = ctx.info(w)  # a slice of a weight is a weight: pieces may split again
        pieces.append((piece, sl.outputs[0]))
        start += width
    return pieces, new_ops


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    ops: list[ir.Op] = []

    def emit(op: ir.Op) -> None:
        new = _split(op, ctx, made_by)
        if new is None:
            ops.append(op)
            return
        for o in new:  # a piece may split again: concat(x_i, x_j - x_i) @ W needs both rules (EdgeConv)
            made_by.update((v.id, o) for v in o.outputs)
            emit(o)

    for op in program.ops:
        emit(op)
    return ir.Program(program.inputs, program.outputs, ops)


def _split(op: ir.Op, ctx: Context, made_by) -> list[ir.Op] | None:
    """The ops replacing ``op``, or None to keep it."""
    lhs_op = made_by.get(op.inputs[0].id) if op.name == "dot_general" and isinstance(
        op.inputs[0], ir.Value) else None
    if lhs_op is None or not is_shared(ctx, op.inputs[1]) or lhs_op.name not in ("concatenate", "add", "sub"):
        return None
    wheres = {_where(ctx, a, made_by) for a in lhs_op.inputs}
    if len(wheres) < 2:
        ctx.skipped(KIND, f"{lhs_op.name} feeding dot_general: operands come through the same index, "
                          "nothing to split")
        return None
    if lhs_op.name == "concatenate":
        split = _split_concat(op, lhs_op, ctx, made_by)
        if split is None:
            ctx.skipped(KIND, "concatenate feeding dot_general along a dimension that is not contracted")
            return None
        pieces, new_ops = split
        combine = [jax.lax.add_p] * (len(pieces) - 1)
    else:
        pieces, new_ops = [(a, op.inputs[1]) for a in lhs_op.inputs], []
        combine = [jax.lax.add_p if lhs_op.name == "add" else jax.lax.sub_p]
    partial = [ir.new_op(jax.lax.dot_general_p, [a, w], op.params, origin=KIND) for a, w in pieces]
    new_ops += partial
    acc = partial[0].outputs[0]
    for prim, nxt in zip(combine, partial[1:], strict=True):
        last = nxt is partial[-1]
        add = ir.new_op(prim, [acc, nxt.outputs[0]], {}, origin=KIND, outputs=op.outputs if last else None)
        new_ops.append(add)
        acc = add.outputs[0]
    saving = f"{len(pieces)} matmuls of widths {[int(np.prod(a.shape[1:])) for a, _ in pieces]}"
    ctx.applied(KIND, f"{lhs_op.name}({', '.join('/'.join(map(str, w)) for w in sorted(wheres, key=str))}) @ W "
                      f"split into {saving}, so each can move to the nodes")
    return new_ops
