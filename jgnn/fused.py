"""Fused ops that the fusion pass forms, one function per kind, each with an XLA and a Pallas lowering.

* ``xla``: `jgnn.edge_blocks`: the region's own ops over blocks of edges, with custom VJPs whose residuals
  are node-level, so neither the forward nor the backward holds more than one block of edge values.
* ``pallas`` / ``pallas_interpret``: the `pallas_kernels` kernel walking a destination-sorted CSR, with the
  region evaluated inside the kernel body and a custom VJP on the reverse CSR.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from jgnn import edge_blocks, mailbox
from jgnn import layout as layout_lib


def _as_2d(x):
    return x.reshape(x.shape[0], -1)


def _broadcast(blocks, width):
    return tuple(jnp.broadcast_to(b, (b.shape[0], width)) for b in blocks)


def gather_reduce(edge_fn: Callable, src, dst, edge, senders, receivers, *, num_nodes: int, width: int,
                  reduce: str = "sum", backend: str, layout: layout_lib.GraphLayout | None, out_dtype):
    """``out[v] = ⊕_{e: receivers[e]=v} edge_fn(src[senders[e]], dst[v], edge[e])`` as ``[num_nodes, width]``.

    ``⊕`` is ``reduce``: "sum", or "max"/"min" (``∓inf`` for empty rows, as ``jax.ops.segment_max``; the
    XLA lowering only). ``src``/``dst``/``edge`` are tuples of ``[*, w]`` arrays with ``w ∈ {1, width}``;
    ``edge_fn`` is lane-wise and receives them broadcast to ``[B, width]``.
    """
    src, dst, edge = (tuple(_as_2d(x) for x in group) for group in (src, dst, edge))
    senders, receivers = senders.reshape(-1), receivers.reshape(-1)
    if backend == "xla":
        lanes = lambda s, d, e: edge_fn(_broadcast(s, width), _broadcast(d, width), _broadcast(e, width))
        size = edge_blocks.block_size(senders.shape[0], 4 * width * (1 + len(src) + len(dst) + len(edge)))
        if reduce == "sum":
            out = edge_blocks.gather_reduce_sum(lanes, num_nodes, size, src, dst, edge, senders, receivers)
        else:
            out = edge_blocks.gather_reduce_extremum(lanes, reduce, num_nodes, size, src, dst, edge, senders,
                                                     receivers)
        return out.astype(out_dtype)
    if reduce != "sum":
        raise ValueError(f"the Pallas gather_reduce is used for sums only, got {reduce!r}")
    lay = layout or layout_lib.in_program(senders, receivers, num_nodes)
    out = pk.gather_reduce(edge_fn, src, dst, edge, lay.csr, lay.rev_csr, reduce="sum",
                           interpret=backend == "pallas_interpret")
    return out[:, :width].astype(out_dtype)


def attention_aggregate(score_fn: Callable, src, dst, edge, values, senders, receivers, *, num_nodes: int,
                        value_index: str, backend: str, layout: layout_lib.GraphLayout | None, out_dtype):
    """``out[v] = Σ_{e→v} softmax_v(score_fn(src[s(e)], dst[v], edge[e]))[e] · values[idx(e)]``, ``[N, H, D]``.

    ``values`` is ``[N, H, D]`` gathered by source (``value_index="src"``) or ``[E, H, D]`` per edge.
    Empty neighbourhoods give 0.
    """
    senders, receivers = senders.reshape(-1), receivers.reshape(-1)
    if backend == "xla":
        size = edge_blocks.block_size(senders.shape[0], 4 * (3 * values[0].size + sum(
            int(x[0].size) for x in (*src, *dst, *edge))))
        return edge_blocks.attention(score_fn, num_nodes, size, value_index, tuple(src), tuple(dst), tuple(edge),
                                     values, senders, receivers).astype(out_dtype)
    lay = layout or layout_lib.in_program(senders, receivers, num_nodes)
    out = pk.attention_aggregate(score_fn, tuple(src), tuple(dst), tuple(edge), values, lay.csr, lay.rev_csr,
                                 value_index=value_index, interpret=backend == "pallas_interpret")
    return out.astype(out_dtype)


def edge_softmax(score_fn: Callable, src, dst, edge, senders, receivers, *, num_nodes: int, out_dtype):
    """Per-destination softmax of the edge scores, ``[E, H]``; recomputed (not stored) under ``grad``."""
    senders, receivers = senders.reshape(-1), receivers.reshape(-1)

    @jax.checkpoint
    def run(src, dst, edge):
        logits = score_fn(tuple(x[senders] for x in src), tuple(x[receivers] for x in dst), tuple(edge))
        return mailbox.segment_softmax(logits, receivers, num_nodes)

    return run(tuple(src), tuple(dst), tuple(edge)).astype(out_dtype)


def gather_compute(edge_fn: Callable, src, dst, edge, senders, receivers, *, num_nodes: int, width: int,
                   backend: str, layout: layout_lib.GraphLayout | None, out_dtype):
    """``out[e] = edge_fn(src[senders[e]], dst[receivers[e]], edge[e])`` as ``[E, width]`` (SDDMM-like)."""
    src, dst, edge = (tuple(_as_2d(x) for x in group) for group in (src, dst, edge))
    senders, receivers = senders.reshape(-1), receivers.reshape(-1)
    lay = layout or layout_lib.in_program(senders, receivers, num_nodes)
    out = pk.gather_compute(edge_fn, src, dst, edge, lay.csr, lay.rev_csr, interpret=backend == "pallas_interpret")
    return out[:, :width].astype(out_dtype)
