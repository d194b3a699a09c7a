"""Fused gather -> edge_fn -> reduce (SpMM-like): ``out[r] = ⊕_{slots s of row r} edge_fn(...)[s]``.

Semantics (the kernel, interpret mode and :func:`gather_reduce_forward_reference` agree):

* operands and ``edge_fn`` follow :mod:`pallas_kernels._lanewise` (``col``/``row``/``edge``/``shared`` groups);
* ``reduce``: ``"sum"``, ``"mean"`` (sum / max(degree, 1)), ``"max"``, ``"min"``; max/min propagate NaN (a row
  holding a NaN value gives NaN, as ``jax.ops.segment_max`` on CPU);
* a row with no slots gives 0 (``empty="zero"``) or the reduction's identity (``empty="identity"``: -inf / +inf
  for float max / min, the integer extremes for int, as ``jax.ops.segment_max``);
* integer operands: sum/max/min are exact in int32 (int64 under x64); mean raises ``TypeError``.

The walk is :mod:`pallas_kernels._walk` (segments, per-lane accumulators, deterministic combine of split rows).
Derivatives are jgnn's edge ops on this same kernel (a max/min splits a tie's gradient as jgnn's reference does).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import _lanewise as lw
from pallas_kernels import _reference as ref
from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR

EMPTY = ("zero", "identity")


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def _pick(better):
    """Pairwise extremum that keeps NaN (Triton's max/min drop it)."""
    def run(a, b):
        if not _is_float(a):
            return jnp.where(better(b, a), b, a)
        return jnp.where(jnp.isnan(b) | better(b, a), b, a)
    return run


def _fold(fold):
    """Extremum over an axis that keeps NaN."""
    def run(x, axis):
        y = fold(x, axis=axis)
        if not _is_float(x):
            return y
        return jnp.where(jnp.max(jnp.isnan(x).astype(jnp.int32), axis=axis) > 0, jnp.nan, y)
    return run


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(dtype):
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


class Reduction(NamedTuple):
    identity: Callable  # dtype -> scalar
    pair: Callable  # elementwise fold of two states
    fold: Callable  # (x, axis) -> fold over an axis
    integers: bool  # exact on integer operands
    divide: bool  # mean: divide by max(degree, 1)
    segment: Callable  # the jax.ops segment reduction the reference uses


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction(lambda d: 0, jnp.add, jnp.sum, True, False, jax.ops.segment_sum),
    "mean": Reduction(lambda d: 0, jnp.add, jnp.sum, False, True, jax.ops.segment_sum),
    "max": Reduction(_lowest, _pick(jnp.greater), _fold(jnp.max), True, False, jax.ops.segment_max),
    "min": Reduction(_highest, _pick(jnp.less), _fold(jnp.min), True, False, jax.ops.segment_min),
}


def _check(reduce: str, empty: str) -> Reduction:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {sorted(REDUCTIONS)}, got {reduce!r}")
    if empty not in EMPTY:
        raise ValueError(f"empty must be one of {EMPTY}, got {empty!r}")
    return REDUCTIONS[reduce]


def _empty_value(red: Reduction, empty: str, dtype):
    return red.identity(dtype) if empty == "identity" else 0


def monoid(reduce: str, empty: str, dtype) -> wk.Monoid:
    """The walk's fold for ``reduce`` in compute ``dtype`` (one state component)."""
    red = _check(reduce, empty)
    # Scalars are made where they are used: a kernel may not capture array constants.
    ident = lambda: jnp.asarray(red.identity(dtype), dtype)

    def finalize(state, deg):
        (x,) = state
        deg = wk.lanes_like(deg, x)
        if red.divide:
            return (x / jnp.maximum(deg, 1).astype(x.dtype),)
        return (jnp.where(deg > 0, x, jnp.asarray(_empty_value(red, empty, dtype), dtype)),)

    return wk.Monoid(
        lift=lambda v, valid: (jnp.where(wk.lanes_like(valid, v[0]), v[0], ident()),),
        combine=lambda a, b: (red.pair(a[0], b[0]),),
        reduce=lambda s, axis: (red.fold(s[0], axis),),
        finalize=finalize,
    )


def gather_reduce_forward(edge_fn: lw.EdgeFn, col, row, edge, shared, csr: CSR, *, reduce: str, empty: str = "zero",
                          interpret: bool = False, out_dtype=None) -> jax.Array:
    """``[R, F]``: per row of ``csr``, the ``reduce`` of ``edge_fn`` over the row's slots (forward only).

    Args:
      edge_fn: lane-wise ``(col, row, edge, shared) -> [B, Fb]`` on tuples of ``[B, Fb]`` tiles.
      col, row, edge, shared: tuples of 2-D operands ``[N_col, w]``, ``[R, w]``, ``[E, w]``, ``[1, w]``
        with ``w ∈ {1, F}``.
      csr: rows are the output rows (destinations, or sources for a reverse CSR).
      reduce: "sum" | "mean" | "max" | "min"; empty: "zero" | "identity" (rows without slots).
      out_dtype: the output dtype (default: the operands' result dtype).
    """
    red = _check(reduce, empty)
    call = lw.prepare(edge_fn, col, row, edge, shared, csr, integers=red.integers,
                      what=f"gather_reduce({reduce})", out_dtype=out_dtype)
    plan = call.plan

    def body(c, r, e, s, ctx):
        return (lw.values(edge_fn, plan, c, r, e, s),), ()

    (out,), _ = wk.walk(body, csr, call.groups, plan=plan, monoid=monoid(reduce, empty, plan.compute),
                        row_out=(jax.ShapeDtypeStruct((csr.num_rows, call.width), call.out_dtype),),
                        interpret=interpret, name=f"gnn_gather_reduce_{reduce}")
    return out


def gather_reduce_forward_reference(edge_fn: lw.EdgeFn, col, row, edge, shared, csr: CSR, *, reduce: str,
                                    empty: str = "zero", out_dtype=None) -> jax.Array:
    """Pure-jnp definition of :func:`gather_reduce_forward` (``jax.ops`` segment reductions over slots)."""
    red = _check(reduce, empty)
    call = lw.prepare(edge_fn, col, row, edge, shared, csr, integers=red.integers,
                      what=f"gather_reduce({reduce})", out_dtype=out_dtype)
    vals, rows, valid = lw.reference_values(edge_fn, call, csr)
    num_rows = csr.num_rows
    deg = ref.lanes(ref.degrees(csr), vals)
    if red.divide or red.segment is jax.ops.segment_sum:
        out = ref.segment(jax.ops.segment_sum, jnp.where(ref.lanes(valid, vals), vals, 0), rows, num_rows)
        out = out / jnp.maximum(deg, 1).astype(out.dtype) if red.divide else out
    else:
        out = ref.segment(red.segment, vals, rows, num_rows)
        out = jnp.where(deg > 0, out, jnp.asarray(_empty_value(red, empty, out.dtype), out.dtype))
    return out.astype(call.out_dtype)
