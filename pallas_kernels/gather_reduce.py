"""Fused gather -> edge_fn -> reduce (SpMM-like): ``out[r] = ⊕_{slots s of row r} edge_fn(...)[s]``.

Semantics (the kernel, interpret mode and :func:`gather_reduce_forward_reference` agree):

* operands and ``edge_fn`` follow :mod:`pallas_kernels._lanewise` (``col``/``row``/``edge``/``shared`` groups);
* ``reduce``: ``"sum"``, ``"mean"`` (sum / max(degree, 1)), ``"max"``, ``"min"``; max/min propagate NaN (a row
  holding a NaN value gives NaN, as ``jax.ops.segment_max`` on CPU);
* a row with no slots gives 0 (``empty="zero"``) or the reduction's identity (``empty="identity"``: -inf / +inf
  for float max / min, the integer extremes for int, as ``jax.ops.segment_max``);
* integer operands: sum/max/min are exact in int32 (int64 under x64); mean raises ``TypeError``.

The walk is :mod:`pallas_kernels._walk` (segments, per-lane accumulators, deterministic combine of split rows).
:func:`gather_reduce` is the differentiable wrapper for standalone use (3-argument ``edge_fn``, custom VJP
whose max/min gradient splits ties equally, like JAX's).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from pallas_kernels import _dtypes, _pullback, residuals
from pallas_kernels import _lanewise as lw
from pallas_kernels import _reference as ref
from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR
from pallas_kernels.gather_compute import gather_compute_forward

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


# ---------------------------------------------------------------------------------------------------------------
# Differentiable wrapper (standalone users): 3-argument edge_fn, forward and reverse CSRs.
# ---------------------------------------------------------------------------------------------------------------

def _four(edge_fn):
    return lambda c, r, e, s: edge_fn(c, r, e)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gather_reduce(edge_fn, reduce, interpret, src, dst, edge, csr, rev_csr):
    del rev_csr
    return gather_reduce_forward(_four(edge_fn), src, dst, edge, (), csr, reduce=reduce, interpret=interpret)


def _unread_by_backward(edge_fn, reduce: str, src, dst, edge) -> tuple:
    """Edge operands the backward does not read (see `residuals.unread_operands`). Only sum and mean drop
    any: max/min recompute the values to find the tied edges."""
    if reduce not in ("sum", "mean") or not edge:
        return (None,) * len(edge)
    width = max(x.shape[1] for x in (*src, *dst, *edge))
    tiles = tuple(tuple(jnp.zeros((8, width), jnp.float32) for _ in g) for g in (src, dst, edge))
    return residuals.unread_operands(edge_fn, tiles, 2, edge)


def _gather_reduce_fwd(edge_fn, reduce, interpret, *primals):
    (src, dst, edge, csr, rev_csr), perturbed = residuals.split_primals(primals)
    out = gather_reduce_forward(_four(edge_fn), src, dst, edge, (), csr, reduce=reduce, interpret=interpret)
    dropped = _unread_by_backward(residuals.frozen(edge_fn, perturbed[:3]), reduce, src, dst, edge)
    return out, (src, dst, residuals.keep(edge, dropped), csr, rev_csr, residuals.flags(perturbed[:3]))


def _ties(edge_fn, reduce, src, dst, edge, csr, g, compute, interpret):
    """Node and edge extras of the max/min cotangent: ``g / ties`` and the extremum per row, and the values.

    Which slots tie is decided among numbers of one evaluation: the values are computed once here (an
    ``[E, F]`` temporary) and the extremum and tie count are taken over those stored numbers. Comparing against
    the forward's extremum instead would trust two kernels to round ``edge_fn`` identically, which XLA and
    Triton do not promise (multiply-add contraction, vectorized transcendentals): a 1-ulp difference would
    drop the gradient.
    """
    num_edges = csr.eid.shape[0] if not edge else edge[0].shape[0]
    values = gather_compute_forward(_four(edge_fn), src, dst, edge, (), csr, num_edges=num_edges,
                                    interpret=interpret, out_dtype=compute)
    ext = gather_reduce_forward(lambda c, r, e, s: e[0], (), (), (values,), (), csr, reduce=reduce,
                                interpret=interpret)
    count = gather_reduce_forward(lambda c, r, e, s: e[0] == r[0], (), (ext,), (values,), (), csr, reduce="sum",
                                  interpret=interpret, out_dtype=compute)
    return (g / jnp.maximum(count, 1), ext), (values,)


def _gather_reduce_bwd(edge_fn, reduce, interpret, res, g):
    src, dst, kept, csr, rev_csr, encoded = res
    flags = residuals.unflag(encoded, (src, dst, (0,) * len(kept)))
    edge_fn = residuals.frozen(edge_fn, flags)
    edge = residuals.restore(kept)
    g = jnp.zeros(g.aval.shape, g.aval.dtype) if isinstance(g, SymbolicZero) else g
    width = max(x.shape[1] for x in (*src, *dst, *edge))
    compute = _dtypes.compute_dtype((g,), integers=False, what=f"gather_reduce({reduce}) gradient")
    g = g.astype(compute)
    if reduce == "mean":
        deg = (csr.indptr[1:] - csr.indptr[:-1])[:, None]
        g = g / jnp.maximum(deg, 1).astype(compute)
    node, edge_x = (g,), ()
    cotangent = lambda y, node, edge_x, ctx: node[0]
    if reduce in ("max", "min"):
        node, edge_x = _ties(edge_fn, reduce, src, dst, edge, csr, g, compute, interpret)
        cotangent = lambda y, node, edge_x, ctx: jnp.where(edge_x[0] == node[1], node[0], 0)
    need = tuple(any(jax.tree.leaves(f)) for f in flags)
    fn = lambda c, r, e: jnp.broadcast_to(edge_fn(c, r, e), (*c, *r, *e)[0].shape)
    d_src, d_dst, d_edge = _pullback.pullback(fn, src, dst, edge, csr, rev_csr, axis=width, compute=compute,
                                              cotangent=cotangent, node_extras=node, edge_extras=edge_x,
                                              need=need, interpret=interpret, name=f"gnn_gather_reduce_{reduce}")
    return d_src, d_dst, d_edge, None, None


_gather_reduce.defvjp(_gather_reduce_fwd, _gather_reduce_bwd, symbolic_zeros=True)


def gather_reduce(edge_fn: Callable, src: tuple, dst: tuple, edge: tuple, csr: CSR, rev_csr: CSR, *,
                  reduce: str, interpret: bool = False) -> jax.Array:
    """Differentiable :func:`gather_reduce_forward` with ``empty="zero"`` and a 3-argument edge function.

    Args:
      edge_fn: lane-wise ``(src_rows, dst_rows, edge_rows) -> [B, F]`` (tuples of ``[B, Fb]`` tiles).
      src, dst, edge: the col, row and edge operands (tuples of 2-D arrays, widths 1 or F).
      csr: forward CSR (rows = destination nodes); rev_csr: reverse CSR (rows = source nodes), which the
        backward walks for source cotangents without atomics.
      reduce: "sum" | "mean" | "max" | "min" (max/min split a tie's gradient equally among the tied edges).
    """
    return _gather_reduce(edge_fn, reduce, interpret, tuple(src), tuple(dst), tuple(edge), csr, rev_csr)


def gather_reduce_reference(edge_fn: Callable, src: tuple, dst: tuple, edge: tuple, csr: CSR,
                            rev_csr: CSR | None = None, *, reduce: str) -> jax.Array:
    """Pure-jnp reference of :func:`gather_reduce` (differentiate it with JAX for the reference gradients)."""
    del rev_csr
    return gather_reduce_forward_reference(_four(edge_fn), tuple(src), tuple(dst), tuple(edge), (), csr,
                                           reduce=reduce)
