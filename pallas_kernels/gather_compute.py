"""Fused gather -> edge_fn with an edge-sized output (SDDMM-like): ``out[eid(s)] = edge_fn(...)[s]`` per CSR slot.

Same operand and ``edge_fn`` contract as :mod:`pallas_kernels.gather_reduce` (:mod:`pallas_kernels._lanewise`).
The walk is the same schedule with no reduction: every slot writes its edge's output row, so a split row
needs no combine. Edges no slot reaches (dropped from the CSR) give 0. Integer operands are exact.

:func:`gather_compute` is the differentiable wrapper for standalone use (3-argument ``edge_fn``): its
backward writes edge cotangents while walking the forward CSR (accumulating row cotangents in the same walk)
and accumulates col cotangents walking the reverse CSR. No atomics, so gradients are deterministic.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import _lanewise as lw
from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR


def gather_compute_forward(edge_fn: lw.EdgeFn, col, row, edge, shared, csr: CSR, *, num_edges: int,
                           interpret: bool = False, out_dtype=None) -> jax.Array:
    """``[num_edges, F]``: ``edge_fn`` at every CSR slot, written at the slot's edge id (forward only).

    Args:
      edge_fn, col, row, edge, shared: as :func:`pallas_kernels.gather_reduce_forward`.
      csr: the CSR whose slots are computed (rows supply the ``row`` operands).
      num_edges: rows of the output (edge ids in ``csr.eid`` are below it).
      out_dtype: the output dtype (default: the operands' result dtype).
    """
    call = lw.prepare(edge_fn, col, row, edge, shared, csr, integers=True, what="gather_compute",
                      out_dtype=out_dtype)
    plan = call.plan

    def body(c, r, e, s, ctx):
        return (), (lw.values(edge_fn, plan, c, r, e, s),)

    _, (out,) = wk.walk(body, csr, call.groups, plan=plan, monoid=None,
                        slot_out=(jax.ShapeDtypeStruct((num_edges, call.width), call.out_dtype),),
                        interpret=interpret, name="gnn_gather_compute")
    return out


def gather_compute_forward_reference(edge_fn: lw.EdgeFn, col, row, edge, shared, csr: CSR, *, num_edges: int,
                                     out_dtype=None) -> jax.Array:
    """Pure-jnp definition of :func:`gather_compute_forward`."""
    call = lw.prepare(edge_fn, col, row, edge, shared, csr, integers=True, what="gather_compute",
                      out_dtype=out_dtype)
    vals, _, valid = lw.reference_values(edge_fn, call, csr)
    target = jnp.where(valid, csr.eid, num_edges)  # slots of no row are dropped
    out = jnp.zeros((num_edges, call.width), vals.dtype).at[target].set(vals, mode="drop")
    return out.astype(call.out_dtype)
