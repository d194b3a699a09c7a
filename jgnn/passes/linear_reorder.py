"""``linear_reorder``: ``(x @ A) @ B → x @ (A @ B)`` when both right operands are weights (Hector).

Two forms:

* shared weights: ``A`` and ``B`` carry no graph axis; ``A @ B`` is formed once;
* typed weights: ``A = W[t]`` and ``B = a[t]`` gathered through the same type index (``(h[src] @ W_r) · a_r``
  in relational attention); the per-type product ``W_r @ a_r`` is formed for the R types and gathered per
  row, so the ``[rows, d_mid]`` intermediate is never built.

Applied only when the FLOP count drops: ``rows·(d_in·d_mid + d_mid·d_out)`` against
``k·d_in·d_mid·d_out + rows·d_in·d_out`` with ``k`` = 1 (shared) or R (typed). The decision is reported.
"""

from __future__ import annotations

import jax
import numpy as np

from jgnn import ir
from jgnn.passes.context import Context, is_shared
from jgnn.passes.typed_matmul import typed_table

KIND = "linear_reorder"


def _plain(op: ir.Op) -> bool:
    """``x @ A`` contracting x's last axis with A's first, no batch dims."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    return not lb and not rb and tuple(lc) == (op.inputs[0].ndim - 1,) and tuple(rc) == (0,)


def _per_row(op: ir.Op) -> bool:
    """``x[e] @ A[e]`` with the rows paired on batch dim 0, contracting x's last axis with A's axis 1."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    return tuple(lb) == (0,) and tuple(rb) == (0,) and tuple(lc) == (op.inputs[0].ndim - 1,) and tuple(rc) == (1,) \
        and op.inputs[0].ndim == 2


def _row_gather(table: ir.Value, idx: ir.Value, template: ir.Op) -> list[ir.Op]:
    """``table[idx[:, 0]]`` as a plain row gather (column 0 of a batched dynamic slice's index names the row)."""
    ops = []
    if idx.shape[-1] != 1:
        col = ir.new_op(jax.lax.slice_p, [idx], dict(start_indices=(0, 0), limit_indices=(idx.shape[0], 1),
                                                        strides=None), origin=KIND)
        ops.append(col)
        idx = col.outputs[0]
    dn = jax.lax.GatherDimensionNumbers(offset_dims=tuple(range(1, table.ndim)), collapsed_slice_dims=(0,),
                                        start_index_map=(0,))
    params = dict(template.params, dimension_numbers=dn, slice_sizes=(1, *table.shape[1:]))
    ops.append(ir.new_op(template.prim, [table, idx], params, origin=KIND))
    return ops


def _flops_before_after(rows, d_in, d_mid, d_out, k):
    return rows * (d_in * d_mid + d_mid * d_out), k * d_in * d_mid * d_out + rows * d_in * d_out


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by, users = ir.producers(program), ir.users(program)
    dropped: set[int] = set()
    new_ops: dict[int, list[ir.Op]] = {}
    for op2 in program.ops:
        if op2.name != "dot_general" or not isinstance(op2.inputs[0], ir.Value):
            continue
        op1 = made_by.get(op2.inputs[0].id)
        if op1 is None or op1.name != "dot_general" or len(users.get(op1.outputs[0].id, [])) != 1:
            continue
        x, a = op1.inputs
        b = op2.inputs[1]
        if _plain(op1) and _plain(op2) and is_shared(ctx, a) and is_shared(ctx, b) and a.ndim == 2:
            rows = int(np.prod(x.shape[:-1], dtype=np.int64))
            d_in, d_mid = a.shape
            d_out = int(np.prod(b.shape[1:], dtype=np.int64))
            before, after = _flops_before_after(rows, d_in, d_mid, d_out, 1)
            if after >= before:
                ctx.skipped(KIND, f"(x @ A) @ B with shared weights: reassociating costs more ({before:.3g} vs "
                                  f"{after:.3g} FLOPs)")
                continue
            ab = ir.new_op(jax.lax.dot_general_p, [a, b], dict(op2.params, dimension_numbers=(((1,), (0,)), ((), ()))),
                           origin=KIND)
            out = ir.new_op(jax.lax.dot_general_p, [x, ab.outputs[0]], op2.params, origin=KIND, outputs=op2.outputs)
            new_ops[id(op2)] = [ab, out]
            dropped.add(id(op1))
            ctx.applied(KIND, f"(x @ A) @ B → x @ (A @ B): {before:.3g} → {after:.3g} FLOPs")
            continue
        ta, tb = typed_table(a, ctx, made_by), typed_table(b, ctx, made_by)
        if not (_per_row(op1) and _per_row(op2) and ta and tb):
            continue
        if ctx.info(ta[1]).index != ctx.info(tb[1]).index or ta[1].shape[0] != tb[1].shape[0]:
            ctx.skipped(KIND, "(x @ W[t]) @ a[s] through different type indices: no per-type product exists")
            continue
        table_a, idx, gather_a, _ = ta
        table_b = tb[0]
        if table_a.ndim != 3 or table_b.ndim < 2:
            continue
        rows, (groups, d_in, d_mid) = x.shape[0], table_a.shape
        d_out = int(np.prod(table_b.shape[2:], dtype=np.int64))
        before, after = _flops_before_after(rows, d_in, d_mid, d_out, groups)
        if after >= before:
            ctx.skipped(KIND, f"(x @ W[t]) @ a[t]: the per-type product costs more ({before:.3g} vs {after:.3g})")
            continue
        per_type = ir.new_op(jax.lax.dot_general_p, [table_a, table_b],
                             dict(op2.params, dimension_numbers=(((2,), (1,)), ((0,), (0,)))), origin=KIND)
        gather_ops = _row_gather(per_type.outputs[0], idx, gather_a)
        out = ir.new_op(jax.lax.dot_general_p, [x, gather_ops[-1].outputs[0]], op2.params, origin=KIND,
                        outputs=op2.outputs)
        new_ops[id(op2)] = [per_type, *gather_ops, out]
        dropped.add(id(op1))
        ctx.applied(KIND, f"(x @ W[{ctx.info(idx).index}]) @ a[{ctx.info(idx).index}] → x @ (W @ a)[type]: "
                          f"{before:.3g} → {after:.3g} FLOPs; the [{rows}, {d_mid}] intermediate is never built")
    ops = []
    for op in program.ops:
        if id(op) in dropped:
            continue
        ops.extend(new_ops.get(id(op), [op]))
    return ir.Program(program.inputs, program.outputs, ops)
