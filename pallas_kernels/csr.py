"""Compressed sparse row layouts of an edge list (host and traceable builders).

Two CSRs describe one graph:

* the *forward* CSR, rows = destination nodes (receivers); ``col`` = source node of each slot;
* the *reverse* CSR, rows = source nodes (senders); ``col`` = destination node of each slot.

Both carry ``eid`` (the original edge id of each slot) so per-edge arrays are gathered without being
permuted, and ``row_order`` (rows by in-degree, descending: Seastar's degree ordering, so the heaviest rows
are scheduled first). Within a row, slots are in ascending edge-id order (stable sort); the max/min kernels
rely on this for their tie-breaking rule (smallest edge id wins).

Edges marked invalid (jraph padding, ``valid == False``) are excluded: they never appear in a row.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class CSR(NamedTuple):
    """A CSR over ``R`` rows with ``nnz`` slots (a JAX pytree).

    Attributes:
      indptr: int32[R+1]; row ``r`` owns slots ``indptr[r]:indptr[r+1]``.
      col: int32[nnz]; per slot, the row id on the other side to gather from.
      eid: int32[nnz]; per slot, the original edge id.
      row_order: int32[R]; rows sorted by degree, descending (ties by row id).
    """

    indptr: jax.Array
    col: jax.Array
    eid: jax.Array
    row_order: jax.Array

    @property
    def num_rows(self) -> int:
        return self.indptr.shape[0] - 1


def _build_numpy(rows: np.ndarray, cols: np.ndarray, num_rows: int, valid: np.ndarray) -> CSR:
    eids = np.nonzero(valid)[0].astype(np.int32)
    order = np.argsort(rows[eids], kind="stable")
    eids = eids[order]
    counts = np.bincount(rows[eids], minlength=num_rows).astype(np.int32)
    indptr = np.zeros(num_rows + 1, np.int32)
    np.cumsum(counts, out=indptr[1:])
    row_order = np.argsort(-counts, kind="stable").astype(np.int32)
    return CSR(indptr, cols[eids].astype(np.int32), eids, row_order)


def build_csr_numpy(senders, receivers, num_nodes: int, valid=None) -> tuple[CSR, CSR]:
    """Host build of ``(forward CSR by receiver, reverse CSR by sender)`` as numpy int32 arrays.

    Args:
      senders, receivers: int[E] node ids in ``[0, num_nodes)`` (invalid edges may hold anything in range).
      num_nodes: number of rows of both CSRs.
      valid: optional bool[E]; False edges are dropped entirely (``nnz = valid.sum()``).
    """
    senders = np.asarray(senders).astype(np.int64)
    receivers = np.asarray(receivers).astype(np.int64)
    valid = np.ones(senders.shape, bool) if valid is None else np.asarray(valid, bool)
    fwd = _build_numpy(receivers, senders, num_nodes, valid)
    rev = _build_numpy(senders, receivers, num_nodes, valid)
    return fwd, rev


def _build_jax(rows: jax.Array, cols: jax.Array, num_rows: int, valid: jax.Array) -> CSR:
    num_edges = rows.shape[0]
    # Invalid edges get key num_rows so they sort past every real row: indptr[-1] == number of valid edges.
    key = jnp.where(valid, rows, num_rows).astype(jnp.int32)
    eids = jnp.argsort(key, stable=True).astype(jnp.int32)
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), jnp.where(valid, rows, 0), num_segments=num_rows)
    indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
    row_order = jnp.argsort(-counts, stable=True).astype(jnp.int32)
    del num_edges
    return CSR(indptr, cols[eids].astype(jnp.int32), eids, row_order)


def build_csr_jax(senders, receivers, num_nodes: int, valid=None) -> tuple[CSR, CSR]:
    """Traceable :func:`build_csr_numpy` with static sizes: ``nnz == E`` always.

    Invalid edges are sorted past ``indptr[-1]`` (slots ``indptr[-1]:E``) so no row ever reaches them.
    """
    senders = jnp.asarray(senders, jnp.int32)
    receivers = jnp.asarray(receivers, jnp.int32)
    valid = jnp.ones(senders.shape, bool) if valid is None else jnp.asarray(valid, bool)
    return _build_jax(receivers, senders, num_nodes, valid), _build_jax(senders, receivers, num_nodes, valid)


def degrees(csr: CSR) -> jax.Array:
    """int32[R] slots per row."""
    return csr.indptr[1:] - csr.indptr[:-1]
