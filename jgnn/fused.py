"""Fused ops that the fusion pass forms, one function per kind, each with an XLA and a Pallas lowering.

* ``xla``: the region's own ops (gather, edge compute, segment sum) under ``jax.checkpoint`` with nothing
  saveable, so the backward recomputes the edge values from node-level inputs instead of storing them.
* ``pallas`` / ``pallas_interpret``: the `pallas_kernels` kernel walking a destination-sorted CSR, with the
  region evaluated inside the kernel body and a custom VJP on the reverse CSR.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from jgnn import layout as layout_lib


def _as_2d(x):
    return x.reshape(x.shape[0], -1)


def _broadcast(blocks, width):
    return tuple(jnp.broadcast_to(b, (b.shape[0], width)) for b in blocks)


def gather_reduce(edge_fn: Callable, src, dst, edge, senders, receivers, *, num_nodes: int, width: int,
                  backend: str, layout: layout_lib.GraphLayout | None, out_dtype):
    """``out[v] = Σ_{e: receivers[e]=v} edge_fn(src[senders[e]], dst[v], edge[e])`` as ``[num_nodes, width]``.

    ``src``/``dst``/``edge`` are tuples of ``[*, w]`` arrays with ``w ∈ {1, width}``; ``edge_fn`` is lane-wise
    and receives them broadcast to ``[B, width]``.
    """
    src, dst, edge = (tuple(_as_2d(x) for x in group) for group in (src, dst, edge))
    senders, receivers = senders.reshape(-1), receivers.reshape(-1)
    if backend == "xla":
        @jax.checkpoint
        def run(src, dst, edge):
            rows = edge_fn(_broadcast(tuple(x[senders] for x in src), width),
                           _broadcast(tuple(x[receivers] for x in dst), width), _broadcast(edge, width))
            return jax.ops.segment_sum(rows, receivers, num_nodes)

        return run(src, dst, edge).astype(out_dtype)
    lay = layout or layout_lib.in_program(senders, receivers, num_nodes)
    out = pk.gather_reduce(edge_fn, src, dst, edge, lay.csr, lay.rev_csr, reduce="sum",
                           interpret=backend == "pallas_interpret")
    return out[:, :width].astype(out_dtype)
