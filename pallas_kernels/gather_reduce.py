"""Fused gather -> edge_fn -> reduce (SpMM-like, node-parallel): ``out[v] = ⊕_{e: dst(e)=v} edge_fn(...)``.

Semantics (both the Pallas kernel and :func:`gather_reduce_reference`):

* ``src[i]``: ``[N_src, w]`` gathered at the slot's source node (``csr.col``); ``dst[i]``: ``[R, w]`` read
  at the row; ``edge[i]``: ``[E, w]`` gathered at the slot's edge id (``csr.eid``); ``w ∈ {1, F}``.
* ``edge_fn(src_rows, dst_rows, edge_rows) -> [B, F']`` is lane-wise; rows arrive as float32 ``[B, Fp]``
  with width-1 operands already broadcast.
* ``reduce ∈ {"sum", "mean", "max", "min"}``; rows with no (valid) in-edges give **0** for every
  reduction (PyG / DGL convention), not ±inf.
* max/min ties are broken by the smallest edge id (CSR slots are in edge-id order within a row); the
  gradient flows to that edge only. The index is saved per (node, feature) as int32 -- the only residual
  besides the inputs.
* Rows are processed in parallel (one program per row, ``row_order``), edges of a row in chunks;
  no atomics, so results are deterministic. Accumulation is float32; the output has the inputs'
  result dtype.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from pallas_kernels import _access as acc
from pallas_kernels import _edgewalk as ew
from pallas_kernels import compat, residuals
from pallas_kernels.csr import CSR


class Reduction(NamedTuple):
    identity: float
    chunk: callable  # reduce a [block, fp] tile over axis 0 (keepdims)
    combine: callable  # running value x chunk value
    better: callable | None  # strict improvement test, for argmax/argmin tracking
    finalize: callable  # (acc [1, fp], degree scalar) -> result


def _empty_to_zero(a, deg):
    return jnp.where(deg > 0, a, 0.0)


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction(0.0, lambda x: jnp.sum(x, 0, keepdims=True), jnp.add, None, lambda a, d: a),
    "mean": Reduction(0.0, lambda x: jnp.sum(x, 0, keepdims=True), jnp.add, None,
                      lambda a, d: a / jnp.maximum(d, 1).astype(jnp.float32)),
    "max": Reduction(-jnp.inf, lambda x: jnp.max(x, 0, keepdims=True), jnp.maximum, jnp.greater,
                     _empty_to_zero),
    "min": Reduction(jnp.inf, lambda x: jnp.min(x, 0, keepdims=True), jnp.minimum, jnp.less, _empty_to_zero),
}


def _fwd_kernel(indptr_ref, col_ref, eid_ref, order_ref, *refs, edge_fn, reduce, lay, interpret):
    s_refs, d_refs, e_refs, outs = ew.split(refs, lay)
    red = REDUCTIONS[reduce]
    tracks_arg = red.better is not None
    block, fp = lay.cfg.block_edges, lay.fp
    r, start, end = ew.row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = ew.own_row(r)
    d_rows = ew.load_group(d_refs, own, one, lay, interpret=interpret)

    def body(c, carry):
        run, arg = carry
        m, col, eid = ew.chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        s_rows = ew.load_group(s_refs, col, m, lay, interpret=interpret)
        e_rows = ew.load_group(e_refs, eid, m, lay, interpret=interpret)
        vals = ew.call_edge_fn(edge_fn, s_rows, d_rows, e_rows, lay)
        vals = jnp.where(m[:, None], vals, red.identity)
        chunk = red.chunk(vals)
        if tracks_arg:
            # First (smallest edge id) slot of this chunk reaching the chunk extremum, per lane; a later
            # chunk replaces the running index only on strict improvement, so ties keep the earliest edge.
            cand = jnp.where(m[:, None] & (vals == chunk), eid[:, None], ew.INT_MAX)
            carg = jnp.min(cand, axis=0, keepdims=True)
            arg = jnp.where(red.better(chunk, run), carg, arg)
        return red.combine(run, chunk), arg

    init = (jnp.full((1, fp), red.identity, jnp.float32), jnp.full((1, fp), -1, jnp.int32))
    run, arg = compat.fori_loop(0, ew.num_chunks(start, end, block), body, init)
    acc.scatter_block(outs[0], own, one, red.finalize(run, end - start), interpret=interpret)
    if tracks_arg:
        acc.scatter_block(outs[1], own, one, arg, interpret=interpret)


def _forward(edge_fn, reduce, interpret, src, dst, edge, csr, rev_csr):
    del rev_csr
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {sorted(REDUCTIONS)}, got {reduce!r}")
    lay = ew.make_layout(src, dst, edge)
    num_rows = csr.num_rows
    out_shape = [jax.ShapeDtypeStruct((num_rows, lay.width), ew.result_dtype(src, dst, edge))]
    if REDUCTIONS[reduce].better is not None:
        out_shape.append(jax.ShapeDtypeStruct((num_rows, lay.width), jnp.int32))
    kern = ew._kernel_partial(_fwd_kernel, edge_fn=edge_fn, reduce=reduce, lay=lay, interpret=interpret)
    outs = compat.pallas_call(
        kern, out_shape=tuple(out_shape), grid=(num_rows,), interpret=interpret,
        num_warps=lay.cfg.num_warps, num_stages=lay.cfg.num_stages, name=f"gnn_gather_reduce_{reduce}",
    )(*csr, *src, *dst, *edge)
    return outs[0], (outs[1] if len(outs) > 1 else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gather_reduce(edge_fn, reduce, interpret, src, dst, edge, csr, rev_csr):
    return _forward(edge_fn, reduce, interpret, src, dst, edge, csr, rev_csr)[0]


def _unread_by_backward(edge_fn, reduce: str, src, dst, edge) -> tuple:
    """Edge operands the backward does not read (see `residuals.unread_operands`). Only sum and mean drop
    any: max/min recompute the values to find the chosen edge."""
    if reduce not in ("sum", "mean") or not edge:
        return (None,) * len(edge)
    lay = ew.make_layout(src, dst, edge)
    tiles = tuple(tuple(jnp.zeros((8, lay.fp), jnp.float32) for _ in g) for g in (src, dst, edge))
    return residuals.unread_operands(edge_fn, tiles, 2, edge)


def _gather_reduce_fwd(edge_fn, reduce, interpret, *primals):
    (src, dst, edge, csr, rev_csr), perturbed = residuals.split_primals(primals)
    out, arg = _forward(edge_fn, reduce, interpret, src, dst, edge, csr, rev_csr)
    arg = None if arg is None else residuals.name_stats(arg)[0]
    dropped = _unread_by_backward(residuals.frozen(edge_fn, perturbed[:3]), reduce, src, dst, edge)
    return out, (src, dst, residuals.keep(edge, dropped), csr, rev_csr, arg, residuals.flags(perturbed[:3]))


def _aux(reduce: str, csr: CSR, arg):
    """Node-level auxiliary input of the backward (see ``_edgewalk.slot_cotangent``)."""
    if reduce == "mean":
        deg = (csr.indptr[1:] - csr.indptr[:-1]).astype(jnp.float32)
        return 1.0 / jnp.maximum(deg, 1.0)
    if arg is not None:
        return arg
    return jnp.zeros((1,), jnp.float32)  # unused by "sum"


def _gather_reduce_bwd(edge_fn, reduce, interpret, res, g):
    src, dst, kept, csr, rev_csr, arg, encoded = res
    edge_fn = residuals.frozen(edge_fn, residuals.unflag(encoded, (src, dst, (0,) * len(kept))))
    g = jnp.zeros(g.aval.shape, g.aval.dtype) if isinstance(g, SymbolicZero) else g
    edge = residuals.restore(kept)
    d_src, d_dst, d_edge = ew.backward(edge_fn, reduce, src, dst, edge, csr, rev_csr, g,
                                       _aux(reduce, csr, arg), interpret=interpret)
    return d_src, d_dst, d_edge, None, None


_gather_reduce.defvjp(_gather_reduce_fwd, _gather_reduce_bwd, symbolic_zeros=True)


def gather_reduce(edge_fn: ew.EdgeFn, src: tuple, dst: tuple, edge: tuple, csr: CSR, rev_csr: CSR, *,
                  reduce: str, interpret: bool = False) -> jax.Array:
    """``[R, F]`` array: per row of ``csr``, the ``reduce`` of ``edge_fn`` over the row's slots.

    Args:
      edge_fn: lane-wise ``(src_rows, dst_rows, edge_rows) -> [B, F]`` (tuples of float32 ``[B, Fp]``).
      src, dst, edge: tuples of 2-D operands (widths 1 or F), see the module docstring.
      csr: forward CSR (rows = destination nodes); rev_csr: reverse CSR (rows = source nodes), used by
        the backward for source cotangents without atomics.
      reduce: "sum" | "mean" | "max" | "min"; empty rows give 0.
      interpret: run the Pallas interpreter (CPU) instead of the Triton kernel.
    """
    src, dst, edge = tuple(src), tuple(dst), tuple(edge)
    return _gather_reduce(edge_fn, reduce, interpret, src, dst, edge, csr, rev_csr)


def gather_reduce_reference(edge_fn: ew.EdgeFn, src: tuple, dst: tuple, edge: tuple, csr: CSR,
                            rev_csr: CSR | None = None, *, reduce: str) -> jax.Array:
    """Pure-jnp reference of :func:`gather_reduce` (same semantics, tie-breaking and gradients)."""
    del rev_csr
    src, dst, edge = tuple(src), tuple(dst), tuple(edge)
    vals, rows, valid = ew.reference_slot_values(edge_fn, src, dst, edge, csr)
    num_rows = csr.num_rows
    seg = jnp.where(valid, rows, num_rows)  # invalid slots land in a dropped extra segment
    dtype = ew.result_dtype(src, dst, edge)
    deg = jax.ops.segment_sum(valid.astype(jnp.float32), seg, num_segments=num_rows + 1)[:num_rows, None]
    if reduce in ("sum", "mean"):
        out = jax.ops.segment_sum(vals, seg, num_segments=num_rows + 1)[:num_rows]
        if reduce == "mean":
            out = out / jnp.maximum(deg, 1.0)
        return out.astype(dtype)
    seg_fn = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
    ext = jax.lax.stop_gradient(seg_fn(vals, seg, num_segments=num_rows + 1))
    eid = csr.eid[:, None]
    cand = jnp.where(valid[:, None] & (vals == ext[seg]), eid, ew.INT_MAX)
    arg = jax.ops.segment_min(jax.lax.stop_gradient(cand), seg, num_segments=num_rows + 1)
    chosen = valid[:, None] & (eid == arg[seg])
    out = jax.ops.segment_sum(jnp.where(chosen, vals, 0.0), seg, num_segments=num_rows + 1)[:num_rows]
    return out.astype(dtype)
