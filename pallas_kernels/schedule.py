"""The work list of a CSR walk: rows cut into segments, segments packed into programs, pieces combined.

Seastar walks one destination row per program, so a hub with 20k in-edges is one serial chain of ~700 chunks
while most programs hold a few edges in a chunk of 32 lanes. Here (UGCG / merge-path style, without atomics):

* every row becomes one or more **segments** of at most ``segment_slots`` consecutive CSR slots; a row that
  needs several is *split*, and each of its pieces writes a partial result;
* segments are sorted by length (longest first) and taken ``block / lanes`` at a time: a program walks that
  many segments side by side, ``lanes`` slots of each per chunk, so short rows share a chunk and long rows walk
  at most ``MAX_SEGMENT_CHUNKS`` chunks;
* a **combine** pass merges the partials of each split row in a fixed order (deterministic).

The same arrays come from numpy (a host CSR: exact sizes) or from jnp inside a traced program (static upper
bounds: ``R + nnz // S`` segments, ``min(R, nnz // (S + 1))`` split rows and ``2 nnz // S`` pieces, where
``S = segment_slots``; unused entries are padding that no program writes). Row ``R`` marks padding.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Segments(NamedTuple):
    """Segments sorted by length, longest first (a program's first segment sets its trip count); padding
    entries have ``row == R`` and no slots."""

    row: jax.Array  # int32[S_n]: output row
    start: jax.Array  # int32[S_n]: first CSR slot
    end: jax.Array  # int32[S_n]: one past the last slot
    part: jax.Array  # int32[S_n]: partial index for a piece of a split row, -1 for a whole row


class Combine(NamedTuple):
    """Split rows, most pieces first; row ``r`` merges partials ``first[q] : first[q] + count[q]``."""

    row: jax.Array  # int32[Q] (R for padding)
    first: jax.Array  # int32[Q]
    count: jax.Array  # int32[Q]
    part_row: jax.Array  # int32[P]: the row of each partial (R for padding); its length sizes the partials


def _np_sort(key):
    return np.argsort(key, kind="stable")


def _jnp_sort(key):
    return jnp.argsort(key, stable=True)


def _build(xp, sort, indptr, num_rows: int, slots: int, sizes: tuple[int, int, int] | None):
    """Shared numpy/jnp body; ``sizes`` = (segments, split rows, partials), or None for exact (numpy) sizes."""
    i32 = lambda x: xp.asarray(x).astype(xp.int32)
    deg = indptr[1:] - indptr[:-1]
    nseg = xp.maximum(1, (deg + slots - 1) // slots)
    pieces = xp.where(nseg > 1, nseg, 0)
    if sizes is None:
        sizes = (int(nseg.sum()), int((nseg > 1).sum()), int(pieces.sum()))
    n_seg, n_split, n_part = sizes
    cum = xp.cumsum(nseg)
    j = xp.arange(n_seg)
    row = xp.searchsorted(cum, j, side="right")
    pad = row >= num_rows
    r = xp.minimum(row, num_rows - 1)
    piece = j - (cum - nseg)[r]
    start = xp.where(pad, 0, indptr[r] + piece * slots)
    end = xp.where(pad, 0, xp.minimum(start + slots, indptr[r + 1]))
    pfirst = xp.cumsum(pieces) - pieces
    part = xp.where(~pad & (nseg[r] > 1), pfirst[r] + piece, -1)
    # Longest first; padding after the empty rows (which still write their empty value).
    order = sort(xp.where(pad, 1, -(end - start)))
    segments = Segments(*(i32(x[order]) for x in (xp.where(pad, num_rows, row), start, end, part)))
    heavy = sort(-pieces)[:n_split]
    split_row = xp.where(pieces[heavy] > 0, heavy, num_rows)
    part_row = xp.searchsorted(xp.cumsum(pieces), xp.arange(n_part), side="right")
    combine = Combine(i32(split_row), i32(pfirst[heavy]), i32(pieces[heavy]), i32(xp.minimum(part_row, num_rows)))
    return segments, combine


def bounds(num_rows: int, nnz: int, slots: int) -> tuple[int, int, int]:
    """Static (segments, split rows, partials) upper bounds of a traced schedule with ``slots`` per segment."""
    n_seg = num_rows + nnz // slots
    n_split = min(num_rows, nnz // (slots + 1))
    return n_seg, n_split, (min(n_seg, 2 * nnz // slots) if n_split else 0)


def build_numpy(indptr: np.ndarray, num_rows: int, slots: int) -> tuple[Segments, Combine]:
    """Exact work list of a host CSR (numpy int32 arrays) with at most ``slots`` slots per segment."""
    return _build(np, _np_sort, np.asarray(indptr, np.int64), num_rows, slots, None)


def build_jax(indptr: jax.Array, num_rows: int, nnz: int, slots: int) -> tuple[Segments, Combine]:
    """Work list of a traced CSR with ``nnz`` slots, padded to :func:`bounds`."""
    return _build(jnp, _jnp_sort, jnp.asarray(indptr, jnp.int32), num_rows, slots, bounds(num_rows, nnz, slots))
