"""Cotangents of an edge function's operands, in two walks and without atomics (the wrappers' custom VJPs).

Every slot ``e`` (row ``v``, col ``u``) evaluates ``y_e = fn(col[u], row[v], edge[e])`` and a cotangent
``c_e = cotangent(y_e, node_extras[v], edge_extras[e], ctx)`` (a constant of the pullback); then

* the forward CSR walk sums ``vjp(fn)(c_e)``'s row part per row and writes its edge part per edge (one walk
  for both);
* the reverse CSR walk (rows = col ids) sums the col part per col id.

``fn`` is lane-wise along the split axis (as the forward kernels require), so both walks split that axis over
programs like the forward walks do, and a slot's tiles stay within the register budget at any width (8 heads
of 602 features would otherwise keep 8 × 1024 elements per operand and slot live). A size-1 (broadcast)
operand's cotangent is summed over the real lanes of each program's block, written as one column per block,
and the columns are summed afterwards. Cotangents are masked after the pullback (slot and lane validity), so a
non-finite partial derivative at a padding lane or slot cannot reach a real cotangent.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR


def _fold(g: jax.Array, trailing: Sequence[int], ctx: wk.Ctx, plan: wk.Plan) -> jax.Array:
    ok = wk.lanes_like(ctx.valid, g) & wk.extent_mask(plan, trailing, ctx.offset)
    g = jnp.where(ok, g.astype(plan.compute), jnp.zeros((), plan.compute))
    return jnp.sum(g, axis=1, keepdims=True) if trailing[0] == 1 else g


def _masked(ct, valid):
    return jax.tree.map(lambda x: jnp.where(wk.lanes_like(valid, x), x, jnp.zeros((), x.dtype)), ct)


def _folded(x, plan: wk.Plan) -> bool:
    """Whether ``x``'s cotangent is written as per-block partial columns (a broadcast operand, split walk)."""
    return x.shape[1] == 1 and plan.num_blocks > 1


def _out(xs, rows: int, plan: wk.Plan) -> tuple:
    return tuple(jax.ShapeDtypeStruct((rows, plan.num_blocks) + x.shape[2:], plan.compute) if _folded(x, plan)
                 else jax.ShapeDtypeStruct((rows,) + x.shape[1:], x.dtype) for x in xs)


def _unfold(outs, xs, plan: wk.Plan) -> tuple:
    return tuple(jnp.sum(o, axis=1, keepdims=True).astype(x.dtype) if _folded(x, plan) else o
                 for o, x in zip(outs, xs, strict=True))


def pullback(fn: Callable, col: tuple, row: tuple, edge: tuple, csr: CSR, rev_csr: CSR, *, axis: int, compute,
             cotangent: Callable, node_extras: tuple = (), edge_extras: tuple = (), need=(True, True, True),
             seed=None, interpret: bool, name: str) -> tuple[tuple, tuple, tuple]:
    """``(d_col, d_row, d_edge)`` in the operands' dtypes; a group not in ``need`` gets zeros.

    Args:
      fn: ``(col, row, edge) -> y`` on tiles (``[B, T, ...]`` in ``compute``), ``y`` a pytree of tiles.
      cotangent: ``(y, node_tiles, edge_tiles, ctx) -> ct`` shaped like ``y``.
      axis: size ``T`` of the operands' split axis.
      need: which of (col, row, edge) cotangents to compute.
    """
    nr, ne = len(row), len(edge)
    zeros = lambda xs: tuple(jnp.zeros(x.shape, x.dtype) for x in xs)
    d_col, d_row, d_edge = zeros(col), zeros(row), zeros(edge)
    if (need[1] and row) or (need[2] and edge):
        groups = (col, row + tuple(node_extras), edge + tuple(edge_extras), ())
        plan = wk.make_plan(groups, csr, axis=axis, compute=compute)

        def body_fwd(c, r, e, s, ctx):
            y, pull = jax.vjp(fn, c, r[:nr], e[:ne])
            _, gr, ge = pull(_masked(cotangent(y, r[nr:], e[ne:], ctx), ctx.valid))
            return (tuple(_fold(g, x.shape[1:], ctx, plan) for g, x in zip(gr, row, strict=True)),
                    tuple(_fold(g, x.shape[1:], ctx, plan) for g, x in zip(ge, edge, strict=True)))

        d_row, d_edge = wk.walk(body_fwd, csr, groups, plan=plan, monoid=wk.SUM,
                                row_out=_out(row, csr.num_rows, plan),
                                slot_out=_out(edge, edge[0].shape[0] if edge else 0, plan), seed=seed,
                                interpret=interpret, name=f"{name}_bwd_rows")
        d_row, d_edge = _unfold(d_row, row, plan), _unfold(d_edge, edge, plan)
    if need[0] and col:
        if rev_csr.num_rows != col[0].shape[0]:
            raise ValueError(f"{name}: the reverse CSR has {rev_csr.num_rows} rows but col operands have "
                             f"{col[0].shape[0]}")
        groups = (row + tuple(node_extras), col, edge + tuple(edge_extras), ())
        plan = wk.make_plan(groups, rev_csr, axis=axis, compute=compute)

        def body_rev(c, r, e, s, ctx):
            y, pull = jax.vjp(fn, r, c[:nr], e[:ne])
            gc, _, _ = pull(_masked(cotangent(y, c[nr:], e[ne:], ctx), ctx.valid))
            return tuple(_fold(g, x.shape[1:], ctx, plan) for g, x in zip(gc, col, strict=True)), ()

        d_col, _ = wk.walk(body_rev, rev_csr, groups, plan=plan, monoid=wk.SUM,
                           row_out=_out(col, col[0].shape[0], plan), seed=seed, interpret=interpret,
                           name=f"{name}_bwd_cols")
        d_col = _unfold(d_col, col, plan)
    return tuple(d_col), tuple(d_row), tuple(d_edge)
