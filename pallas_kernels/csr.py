"""Compressed sparse row layouts of an edge list (host and traceable builders), each with its work list.

Two CSRs describe one graph:

* the *forward* CSR, rows = destination nodes (receivers); ``col`` = source node of each slot;
* the *reverse* CSR, rows = source nodes (senders); ``col`` = destination node of each slot.

Both carry ``eid`` (the original edge id of each slot), so per-edge arrays are gathered without being
permuted, and the :mod:`pallas_kernels.schedule` work list the kernels walk. Within a row, slots are in
ascending edge-id order (stable sort).

Which edges exist follows the segment-op convention for the row side and the gather convention for the
other side: an edge marked invalid, or whose receiver is outside ``[0, num_nodes)`` (negative included), is in
neither CSR (``jax.ops.segment_sum`` drops it too); a sender outside that range is *clamped* (``x[senders]``
under ``jit`` clamps), so the reverse CSR files the edge under the clamped sender, and the kernels clamp the
forward CSR's ``col`` ids when they gather.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _config, schedule


class CSR(NamedTuple):
    """A CSR over ``R`` rows with ``nnz`` slots, and its work list (a JAX pytree of int32 arrays).

    Attributes:
      indptr: int32[R+1]; row ``r`` owns slots ``indptr[r]:indptr[r+1]``. Slots past ``indptr[-1]`` (traced
        builds keep all E) belong to no row.
      col: int32[nnz]; per slot, the id on the other side to gather from (not range-checked: kernels clamp).
      eid: int32[nnz]; per slot, the original edge id.
      segments, combine: the work list (:mod:`pallas_kernels.schedule`).
    """

    indptr: jax.Array
    col: jax.Array
    eid: jax.Array
    segments: schedule.Segments
    combine: schedule.Combine

    @property
    def num_rows(self) -> int:
        return self.indptr.shape[0] - 1


def _valid_edges(xp, receivers, num_nodes: int, valid):
    ok = (receivers >= 0) & (receivers < num_nodes)
    return ok if valid is None else ok & xp.asarray(valid).astype(bool)


def _slots(num_rows: int, nnz: int, segment_slots: int | None) -> int:
    slots = _config.segment_slots(num_rows, nnz) if segment_slots is None else int(segment_slots)
    if slots < 1:
        raise ValueError(f"segment_slots must be >= 1, got {segment_slots}")
    return slots


def _build_numpy(rows: np.ndarray, cols: np.ndarray, num_rows: int, valid: np.ndarray, slots: int) -> CSR:
    eids = np.nonzero(valid)[0].astype(np.int32)
    eids = eids[np.argsort(rows[eids], kind="stable")]
    counts = np.bincount(rows[eids], minlength=num_rows)
    indptr = np.zeros(num_rows + 1, np.int32)
    np.cumsum(counts, out=indptr[1:])
    return CSR(indptr, cols[eids].astype(np.int32), eids, *schedule.build_numpy(indptr, num_rows, slots))


def build_csr_numpy(senders, receivers, num_nodes: int, valid=None, *,
                    segment_slots: int | None = None) -> tuple[CSR, CSR]:
    """Host build of ``(forward CSR by receiver, reverse CSR by sender)`` as numpy int32 arrays.

    Args:
      senders, receivers: int[E] node ids (see the module docstring for ids outside ``[0, num_nodes)``).
      num_nodes: number of rows of both CSRs.
      valid: optional bool[E]; False edges are dropped entirely (``nnz`` = number of kept edges).
      segment_slots: most slots of one work-list segment (default :func:`pallas_kernels._config.segment_slots`);
        longer rows are split across programs.
    """
    senders = np.asarray(senders).astype(np.int64).reshape(-1)
    receivers = np.asarray(receivers).astype(np.int64).reshape(-1)
    keep = _valid_edges(np, receivers, num_nodes, valid)
    clamped = np.clip(senders, 0, max(num_nodes - 1, 0))
    slots = _slots(num_nodes, int(keep.sum()), segment_slots)
    return (_build_numpy(receivers, senders, num_nodes, keep, slots),
            _build_numpy(clamped, receivers, num_nodes, keep, slots))


def _build_jax(rows: jax.Array, cols: jax.Array, num_rows: int, valid: jax.Array, slots: int) -> CSR:
    # Dropped edges get key num_rows so they sort past every real row: indptr[-1] == number of kept edges.
    key = jnp.where(valid, rows, num_rows)
    eids = jnp.argsort(key, stable=True).astype(jnp.int32)
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), key, num_segments=num_rows)
    indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
    return CSR(indptr, cols[eids], eids, *schedule.build_jax(indptr, num_rows, rows.shape[0], slots))


def build_csr_jax(senders, receivers, num_nodes: int, valid=None, *,
                  segment_slots: int | None = None) -> tuple[CSR, CSR]:
    """Traceable :func:`build_csr_numpy` with static sizes: ``nnz == E`` always.

    Dropped edges are sorted past ``indptr[-1]`` (slots ``indptr[-1]:E``) so no row ever reaches them.
    """
    senders = jnp.asarray(senders, jnp.int32).reshape(-1)
    receivers = jnp.asarray(receivers, jnp.int32).reshape(-1)
    keep = _valid_edges(jnp, receivers, num_nodes, valid)
    clamped = jnp.clip(senders, 0, max(num_nodes - 1, 0))
    slots = _slots(num_nodes, senders.shape[0], segment_slots)
    return (_build_jax(receivers, senders, num_nodes, keep, slots),
            _build_jax(clamped, receivers, num_nodes, keep, slots))

