"""Fused gather -> edge_fn with an edge-sized output (SDDMM-like): ``out[e] = edge_fn(src[s(e)], dst[d(e)], edge[e])``.

Used when the compiled program needs a per-edge tensor (e.g. attention logits kept for later use).
Same operand / ``edge_fn`` contract as :mod:`pallas_kernels.gather_reduce`. Work is split by destination
row (the forward CSR): each program loads its row's ``dst`` operands once and writes one output row per
in-edge, addressed by edge id. Edges excluded from the CSR (``valid == False``) get 0.

Backward: edge cotangents are written per edge while walking the forward CSR (also accumulating the
``dst`` cotangents per row); ``src`` cotangents are accumulated per source node walking the reverse CSR.
No atomics anywhere, so gradients are deterministic.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import _access as acc
from pallas_kernels import _edgewalk as ew
from pallas_kernels import compat
from pallas_kernels.csr import CSR


def _fwd_kernel(indptr_ref, col_ref, eid_ref, order_ref, *refs, edge_fn, lay, interpret):
    s_refs, d_refs, e_refs, rest = ew.split(refs, lay)
    out_ref = rest[-1]  # rest[0] is the aliased zero-filled input of the same buffer
    block = lay.cfg.block_edges
    r, start, end = ew.row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = ew.own_row(r)
    d_rows = ew.load_group(d_refs, own, one, lay, interpret=interpret)

    def body(c, carry):
        m, col, eid = ew.chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        s_rows = ew.load_group(s_refs, col, m, lay, interpret=interpret)
        e_rows = ew.load_group(e_refs, eid, m, lay, interpret=interpret)
        vals = ew.call_edge_fn(edge_fn, s_rows, d_rows, e_rows, lay)
        acc.scatter_block(out_ref, eid, m, vals, interpret=interpret)
        return carry

    compat.fori_loop(0, ew.num_chunks(start, end, block), body, jnp.int32(0))


def _forward(edge_fn, interpret, src, dst, edge, csr: CSR):
    lay = ew.make_layout(src, dst, edge)
    num_edges = csr.eid.shape[0] if not edge else edge[0].shape[0]
    dtype = ew.result_dtype(src, dst, edge)
    zeros = jnp.zeros((num_edges, lay.width), dtype)
    n_in = 4 + len(src) + len(dst) + len(edge)
    kern = ew._kernel_partial(_fwd_kernel, edge_fn=edge_fn, lay=lay, interpret=interpret)
    return compat.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct((num_edges, lay.width), dtype), grid=(csr.num_rows,),
        interpret=interpret, num_warps=lay.cfg.num_warps, num_stages=lay.cfg.num_stages,
        input_output_aliases={n_in: 0}, name="gnn_gather_compute",
    )(*csr, *src, *dst, *edge, zeros)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gather_compute(edge_fn, interpret, num_edges, src, dst, edge, csr, rev_csr):
    del num_edges, rev_csr
    return _forward(edge_fn, interpret, src, dst, edge, csr)


def _gather_compute_fwd(edge_fn, interpret, num_edges, src, dst, edge, csr, rev_csr):
    return _gather_compute(edge_fn, interpret, num_edges, src, dst, edge, csr, rev_csr), (src, dst, edge, csr,
                                                                                          rev_csr)


def _gather_compute_bwd(edge_fn, interpret, num_edges, res, g):
    src, dst, edge, csr, rev_csr = res
    dummy = jnp.zeros((1,), jnp.float32)
    d_src, d_dst, d_edge = ew.backward(edge_fn, "edge", src, dst, edge, csr, rev_csr, g, dummy,
                                       interpret=interpret)
    return d_src, d_dst, d_edge, None, None


_gather_compute.defvjp(_gather_compute_fwd, _gather_compute_bwd)


def gather_compute(edge_fn: ew.EdgeFn, src: tuple, dst: tuple, edge: tuple, csr: CSR, rev_csr: CSR, *,
                   interpret: bool = False) -> jax.Array:
    """``[E, F]``: ``edge_fn`` evaluated on every edge (row = edge id); edges not in ``csr`` give 0.

    ``E`` is the leading size of the edge operands, or ``csr.eid.shape[0]`` when there are none (use
    :func:`pallas_kernels.csr.build_csr_jax`, whose CSRs keep all E slots, in that case).
    """
    src, dst, edge = tuple(src), tuple(dst), tuple(edge)
    num_edges = csr.eid.shape[0] if not edge else edge[0].shape[0]
    return _gather_compute(edge_fn, interpret, num_edges, src, dst, edge, csr, rev_csr)


def gather_compute_reference(edge_fn: ew.EdgeFn, src: tuple, dst: tuple, edge: tuple, csr: CSR,
                             rev_csr: CSR | None = None) -> jax.Array:
    """Pure-jnp reference of :func:`gather_compute`."""
    del rev_csr
    src, dst, edge = tuple(src), tuple(dst), tuple(edge)
    num_edges = csr.eid.shape[0] if not edge else edge[0].shape[0]
    vals, _, valid = ew.reference_slot_values(edge_fn, src, dst, edge, csr)
    vals = jnp.where(valid[:, None], vals, 0.0)
    # Invalid slots scatter to an out-of-range row, which is dropped.
    target = jnp.where(valid, csr.eid, num_edges)
    out = jnp.zeros((num_edges, vals.shape[1]), jnp.float32).at[target].set(vals, mode="drop")
    return out.astype(ew.result_dtype(src, dst, edge))
