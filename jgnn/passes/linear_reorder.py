"""``linear_reorder``: ``(x @ A) @ B → x @ (A @ B)`` when both right operands are weights (Hector), and a shared
matmul moved before the linear reduction it follows.

Three forms:

* shared weights: ``A`` and ``B`` carry no graph axis; ``A @ B`` is formed once;
* typed weights: ``A = W[t]`` and ``B = a[t]`` gathered through the same type index (``(h[src] @ W_r) · a_r``
  in relational attention); the per-type product ``W_r @ a_r`` is formed for the R types and gathered per
  row, so the ``[rows, d_mid]`` intermediate is never built;
* through a reduction: ``segment(x[ids], sum|mean) @ W → segment(x[ids] @ W, sum|mean)`` when ``W`` narrows
  the rows (``d_out < d_in``, GraphSAGE on wide features; DGL's ``SAGEConv`` does this by hand). The edges then
  carry ``d_out`` values, not ``d_in``, and `broadcast_reorder` lifts ``x[ids] @ W`` to ``(x @ W)[ids]``.
  Exact in real arithmetic (a mean is a sum times a per-row constant; an empty row is 0 both ways for finite
  ``W``); in floats the sum is reassociated, as every linear rewrite here does.

The first two are applied only when the FLOP count drops: ``rows·(d_in·d_mid + d_mid·d_out)`` against
``k·d_in·d_mid·d_out + rows·d_in·d_out`` with ``k`` = 1 (shared) or R (typed). The decision is reported.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from jgnn import ir
from jgnn.ops.edge_fn import SIXTEEN_BIT
from jgnn.ops.gather import gather_p
from jgnn.ops.segment import segment_p
from jgnn.passes.context import Builder, Context
from jgnn.passes.typed_matmul import typed_table
from jgnn.report import Pass, Reason


def _plain(op: ir.Op) -> bool:
    """``x @ A`` contracting x's last axis with A's first, no batch dims."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    return not lb and not rb and tuple(lc) == (op.inputs[0].ndim - 1,) and tuple(rc) == (0,)


def _per_row(op: ir.Op) -> bool:
    """``x[e] @ A[e]`` with the rows paired on batch dim 0, contracting x's last axis with A's axis 1."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    return tuple(lb) == (0,) and tuple(rb) == (0,) and tuple(lc) == (op.inputs[0].ndim - 1,) and tuple(rc) == (1,) \
        and op.inputs[0].ndim == 2


def _product(b: Builder, op2: ir.Op, x: ir.Atom, per_row, weights: tuple, weight_dims) -> None:
    """``x @ (A @ B)`` in ``op2``'s outputs, ``weights = (A, B)`` contracted by ``weight_dims`` (then gathered by
    ``per_row`` for typed weights).

    On bfloat16/float16 the weight product stays float32 and the whole chain rounds once. The reference rounds
    ``x @ A`` and then ``(x @ A) @ B``; a weight product rounded to 16 bits is reused by every row and carries its
    rounding into all of them (fuzz campaign 20261400: a float16 gradient 16 times further from float64 than the
    reference's)."""
    narrow = np.dtype(op2.outputs[0].dtype) in SIXTEEN_BIT
    f32 = dict(preferred_element_type=np.dtype(np.float32)) if narrow else {}
    (ab,) = b.bind(lax.dot_general_p, list(weights), dict(op2.params, dimension_numbers=weight_dims, **f32))
    if per_row is not None:  # typed weights: the per-type product read through each row's type
        (ab,) = per_row(ab)
    if not narrow:
        b.bind(lax.dot_general_p, [x, ab], op2.params, outputs=op2.outputs)
        return
    convert = lambda v, dtype, **out: b.bind(lax.convert_element_type_p, [v],  # noqa: E731
                                             dict(new_dtype=np.dtype(dtype), weak_type=False, sharding=None), **out)
    (x32,) = convert(x, np.float32)
    (y,) = b.bind(lax.dot_general_p, [x32, ab], dict(op2.params, **f32))
    convert(y, op2.outputs[0].dtype, outputs=op2.outputs)


def _flops_before_after(rows, d_in, d_mid, d_out, k):
    return rows * (d_in * d_mid + d_mid * d_out), k * d_in * d_mid * d_out + rows * d_in * d_out


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by, users = ir.producers(program), ir.users(program)
    b = Builder(program, ctx)
    for op2 in program.ops:
        if not (_reorder(op2, ctx, made_by, users, b) or _through_reduction(op2, ctx, made_by, users, b)):
            b.emit(op2)
    return b.finish()


def _reorder(op2: ir.Op, ctx: Context, made_by, users, b: Builder) -> bool:
    if op2.prim is not lax.dot_general_p or not isinstance(op2.inputs[0], ir.Value):
        return False
    op1 = made_by.get(op2.inputs[0].id)
    if op1 is None or op1.prim is not lax.dot_general_p or len(users.get(op1.outputs[0].id, [])) != 1:
        return False
    x, a = op1.inputs
    w2 = op2.inputs[1]
    if _plain(op1) and _plain(op2) and ctx.is_shared(a) and ctx.is_shared(w2) and a.ndim == 2:
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        d_in, d_mid = a.shape
        d_out = int(np.prod(w2.shape[1:], dtype=np.int64))
        before, after = _flops_before_after(rows, d_in, d_mid, d_out, 1)
        form = "(x @ A) @ B with shared weights"
        if after >= before:
            ctx.skipped(Pass.LINEAR_REORDER, Reason.REASSOCIATION_COSTS_MORE, form=form, before=before, after=after)
            return False
        _product(b, op2, x, None, (a, w2), (((1,), (0,)), ((), ())))
        ctx.applied(Pass.LINEAR_REORDER, Reason.REASSOCIATED, form=form, to="x @ (A @ B)", before=before,
                    after=after)
        return True
    ta, tb = typed_table(a, ctx, made_by), typed_table(w2, ctx, made_by)
    if not (_per_row(op1) and _per_row(op2) and ta and tb):
        return False
    if ctx.info(ta[1]).index != ctx.info(tb[1]).index or ta[1].shape[0] != tb[1].shape[0]:
        ctx.skipped(Pass.LINEAR_REORDER, Reason.DIFFERENT_TYPE_INDICES)
        return False
    table_a, column, gather_a = ta
    table_b = tb[0]
    if table_a.ndim != 3 or table_b.ndim < 2:
        return False
    rows, (groups, d_in, d_mid) = x.shape[0], table_a.shape
    d_out = int(np.prod(table_b.shape[2:], dtype=np.int64))
    before, after = _flops_before_after(rows, d_in, d_mid, d_out, groups)
    index = ctx.info(column).index.value
    form = f"(x @ W[{index}]) @ a[{index}]"
    if after >= before:
        ctx.skipped(Pass.LINEAR_REORDER, Reason.REASSOCIATION_COSTS_MORE, form=form, before=before, after=after)
        return False
    if column.ndim == 2 and column.shape[-1] != 1:
        (column,) = b.bind(lax.slice_p, [column], dict(start_indices=(0, 0), limit_indices=(column.shape[0], 1),
                                                        strides=None))

    def per_row(table):
        dn = lax.GatherDimensionNumbers(offset_dims=tuple(range(1, table.ndim)), collapsed_slice_dims=(0,),
                                        start_index_map=(0,))
        return b.bind(lax.gather_p, [table, column], dict(gather_a.params, dimension_numbers=dn,
                                                          slice_sizes=(1, *table.shape[1:])))

    _product(b, op2, x, per_row, (table_a, table_b), (((2,), (1,)), ((0,), (0,))))
    ctx.applied(Pass.LINEAR_REORDER, Reason.REASSOCIATED, form=form, to="x @ (W @ a)[type]", before=before,
                after=after)
    return True


_SHAPE_ONLY = (lax.reshape_p, lax.broadcast_in_dim_p, lax.squeeze_p, lax.convert_element_type_p)


def _gathered(x: ir.Atom, made_by) -> ir.Op | None:
    """The gather ``x`` reads node rows through, past shape-only ops (``vmap(phi)`` adds some), else None."""
    op = made_by.get(x.id) if isinstance(x, ir.Value) else None
    while op is not None and op.prim in _SHAPE_ONLY:
        op = made_by.get(op.inputs[0].id) if isinstance(op.inputs[0], ir.Value) else None
    return op if op is not None and op.prim is gather_p else None


def _through_reduction(op: ir.Op, ctx: Context, made_by, users, b: Builder) -> bool:
    """``segment(x[ids], sum|mean) @ W → segment(x[ids] @ W, sum|mean)`` (module docstring, third form). The
    old segment is left without users for `dce`."""
    if op.prim is not lax.dot_general_p or not isinstance(op.inputs[0], ir.Value) or not _plain(op):
        return False
    seg, w = made_by.get(op.inputs[0].id), op.inputs[1]
    if seg is None or seg.prim is not segment_p or seg.params["kind"] not in ("sum", "mean") \
            or len(users.get(seg.outputs[0].id, [])) != 1 or not ctx.is_shared(w) or w.ndim != 2:
        return False
    x, ids = seg.inputs
    rows = _gathered(x, made_by)
    if rows is None or not np.issubdtype(x.dtype, np.floating):
        return False
    d_in, d_out = w.shape
    form = f"segment({rows.params['index'].value}-gathered rows, {seg.params['kind']}) @ W"
    if d_out >= d_in:
        ctx.skipped(Pass.LINEAR_REORDER, Reason.MATMUL_DOES_NOT_NARROW, form=form, d_in=d_in, d_out=d_out)
        return False
    (y,) = b.bind(lax.dot_general_p, [x, w], op.params)
    b.bind(segment_p, [y, ids], seg.params, outputs=op.outputs)
    ctx.applied(Pass.LINEAR_REORDER, Reason.MATMUL_BEFORE_REDUCTION, form=form, d_in=d_in, d_out=d_out,
                edges=int(x.shape[0]))
    return True
