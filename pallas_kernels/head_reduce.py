"""Per-head edge functions summed per row, or written per edge: attention's backward walks.

The cotangents of an attention layer are per head: an edge's ``[H]`` score cotangent needs a dot product over
each head's ``D`` lanes (``Σ_d g·v``), which the lane-wise gather kernels cannot express. Here operands are
``[*, H]`` or ``[*, H, Dk]`` as in :func:`pallas_kernels.attention_forward`, the whole head axis is in one
program (the edge function may reduce across a head's lanes but never across heads), and ``edge_fn(col, row,
edge, shared)`` returns a tuple of ``[B, H, D_i]`` values. The caller guarantees that padding cannot change
them (e.g. every size a power of two: no padding lanes at all); masked slots never reach the result.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _dtypes
from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR


def _sum_monoid(dtype) -> wk.Monoid:
    """Sums of several state components (one per output) in compute ``dtype``; a row without slots gives 0."""
    zero = lambda: jnp.zeros((), dtype)  # scalars are made where they are used (no captured constants)
    return wk.Monoid(
        lift=lambda vs, valid: tuple(jnp.where(wk.lanes_like(valid, v), v, zero()) for v in vs),
        combine=lambda a, b: tuple(x + y for x, y in zip(a, b, strict=True)),
        reduce=lambda s, axis: tuple(jnp.sum(x, axis=axis) for x in s),
        finalize=lambda s, deg: tuple(jnp.where(wk.lanes_like(deg, x) > 0, x, zero()) for x in s),
    )


def _prepare(edge_fn: Callable, col, row, edge, shared, csr: CSR, heads: int, what: str, out_dtype):
    groups = tuple(tuple(g) for g in (col, row, edge, shared))
    arrays = [x for g in groups for x in g]
    compute = _dtypes.compute_dtype(arrays, integers=False, what=what)
    # int32 operands (ids, seeds an edge function hashes) arrive exactly, as int32 tiles
    one = tuple(tuple(jax.ShapeDtypeStruct((1, heads) + x.shape[2:], jnp.int32 if x.dtype == jnp.int32 else compute)
                      for x in g) for g in groups)
    outs = jax.eval_shape(edge_fn, *one)
    if not isinstance(outs, tuple) or any(v.ndim != 3 or v.shape[:2] != (1, heads) for v in outs):
        raise ValueError(f"{what}: edge_fn must return a tuple of [B, H, D] values with H={heads}; got "
                         f"{jax.tree.map(lambda v: v.shape, outs)}")
    dims = tuple(v.shape[2] for v in outs)
    plan = wk.make_plan(groups, csr, axis=heads, extra=[(heads, d) for d in dims], split=False, compute=compute,
                        exact_integers=True)

    def body_values(c, r, e, s):
        return tuple(jnp.broadcast_to(jnp.asarray(v).astype(compute), (plan.block,) + plan.tile((heads, d)))
                     for v, d in zip(edge_fn(c, r, e, s), dims, strict=True))

    return groups, plan, dims, body_values, np.dtype(out_dtype or _dtypes.result_dtype(arrays))


def head_reduce_forward(edge_fn: Callable, col, row, edge, shared, csr: CSR, *, heads: int,
                        interpret: bool = False, out_dtype=None) -> tuple[jax.Array, ...]:
    """``[R, H, D_i]`` for each value: per row of ``csr``, the sum of ``edge_fn``'s values over the row's slots
    (0 for no slot).

    Args:
      edge_fn: ``(col, row, edge, shared) -> ([B, H, D_1], ...)`` on tuples of ``[B, H]`` / ``[B, H, Dk]``
        tiles in the compute dtype.
      col, row, edge, shared: tuples of ``[*, H]`` / ``[*, H, Dk]`` operands (``shared`` with one row).
      heads: ``H``; out_dtype: the outputs' dtype (default: the operands' result dtype). int32 operands
        reach ``edge_fn`` as int32 tiles.
    """
    groups, plan, dims, body_values, out_dtype = _prepare(edge_fn, col, row, edge, shared, csr, heads,
                                                          "head_reduce", out_dtype)

    def body(c, r, e, s, ctx):
        return body_values(c, r, e, s), ()

    outs, _ = wk.walk(body, csr, groups, plan=plan, monoid=_sum_monoid(plan.compute),
                      row_out=tuple(jax.ShapeDtypeStruct((csr.num_rows, heads, d), out_dtype) for d in dims),
                      interpret=interpret, name="gnn_head_reduce_sum")
    return tuple(outs)


def head_compute_forward(edge_fn: Callable, col, row, edge, shared, csr: CSR, *, heads: int, num_edges: int,
                         interpret: bool = False, out_dtype=None) -> tuple[jax.Array, ...]:
    """``[num_edges, H, D_i]`` for each value: ``edge_fn`` at every slot of ``csr``, written at the slot's edge
    id (edges no slot reaches are 0). Arguments as :func:`head_reduce_forward`."""
    groups, plan, dims, body_values, out_dtype = _prepare(edge_fn, col, row, edge, shared, csr, heads,
                                                          "head_compute", out_dtype)

    def body(c, r, e, s, ctx):
        return (), tuple(v.astype(out_dtype) for v in body_values(c, r, e, s))

    _, outs = wk.walk(body, csr, groups, plan=plan, monoid=None,
                      slot_out=tuple(jax.ShapeDtypeStruct((num_edges, heads, d), out_dtype) for d in dims),
                      interpret=interpret, name="gnn_head_compute")
    return tuple(outs)
