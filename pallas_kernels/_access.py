"""The only memory-access patterns the kernels use, each with an interpret branch and a Triton branch.

A port to another Pallas backend (Mosaic GPU) replaces these helpers one by one; nothing else in the package
touches a ref. All indexing is "pointer style": every dimension is indexed by an int32 array (an ``iota`` for
the trailing dimensions), the arrays broadcast together, and a boolean mask guards out-of-range lanes. Mixing
an index *vector* with a *slice* is avoided on purpose: the interpret-mode discharge of a masked load/store
rejects it (``NotImplementedError`` in ``jax._src.pallas.primitives``).

* Loads clamp every index into the ref's bounds on both paths, so an out-of-range id (a sender id past the
  node count) reads the nearest row, as ``x[ids]`` does under ``jit``, and never an illegal address.
  ``plgpu.load`` with ``mask``/``other`` never touches memory for masked lanes.
* Stores: on Triton masked lanes never touch memory. In interpret mode masked lanes are redirected to an
  out-of-bounds index, which the discharged scatter drops (the stock discharge of a masked store re-writes the
  old value for masked lanes, which races with a real write when a masked lane aliases a live index).
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pallas_kernels import compat


def _broadcast_index(index: Sequence[jax.Array], mask: jax.Array | None) -> tuple[tuple[jax.Array, ...], tuple]:
    shapes = [jnp.shape(i) for i in index] + ([jnp.shape(mask)] if mask is not None else [])
    shape = jnp.broadcast_shapes(*shapes)
    return tuple(jnp.broadcast_to(jnp.asarray(i, jnp.int32), shape) for i in index), shape


def masked_load(ref, index: Sequence[jax.Array], mask: jax.Array | None, other=0, *, interpret: bool):
    """``where(mask, ref[clamp(index)], other)`` with ``index`` a tuple of broadcastable int32 arrays."""
    index, shape = _broadcast_index(index, mask)
    index = tuple(jnp.clip(i, 0, max(d - 1, 0)) for i, d in zip(index, ref.shape, strict=True))
    if mask is not None:
        mask = jnp.broadcast_to(mask, shape)
    if not interpret:
        return compat.triton_load(ref, index, mask, other if mask is not None else None)
    value = ref[index]
    return value if mask is None else jnp.where(mask, value, jnp.asarray(other, value.dtype))


def masked_store(ref, index: Sequence[jax.Array], value: jax.Array, mask: jax.Array | None, *, interpret: bool):
    """``ref[index] = value`` on lanes where ``mask``; unmasked lanes must not alias each other."""
    index, shape = _broadcast_index(index, mask)
    value = jnp.broadcast_to(value.astype(ref.dtype), shape)
    if not interpret:
        compat.triton_store(ref, index, value, None if mask is None else jnp.broadcast_to(mask, shape))
        return
    if mask is not None:
        mask = jnp.broadcast_to(mask, shape)
        # An index equal to the dimension size is out of bounds; the discharged scatter drops it.
        index = (jnp.where(mask, index[0], ref.shape[0]),) + index[1:]
    ref[index] = value


def load_scalar(ref, i, *, interpret: bool) -> jax.Array:
    """``ref[i]`` for a 1-D ref and an in-range scalar index."""
    del interpret  # scalar loads index the same way in both paths
    return ref[i]


def load_vector(ref, idx: jax.Array, mask: jax.Array, other=0, *, interpret: bool) -> jax.Array:
    """``where(mask, ref[idx], other)`` for a 1-D ref and an int32 index vector."""
    return masked_load(ref, (idx,), mask, other, interpret=interpret)


def _tile_index(ref_trailing: Sequence[int], tile: Sequence[int], offset, rows: jax.Array, row_mask: jax.Array):
    """Index arrays and mask of ``ref[rows, offset + iota(tile[0]), iota(tile[1]), ...]``.

    The first trailing axis is the one split across programs: ``offset`` applies to it unless the ref has
    size 1 there (a broadcast operand, read at 0).
    """
    nd = len(tile)
    index = [rows.reshape((rows.shape[0],) + (1,) * nd)]  # a no-op for a [B, 1] column and a 2-D tile
    mask = row_mask.reshape((row_mask.shape[0],) + (1,) * nd)
    for k, (w, p) in enumerate(zip(ref_trailing, tile, strict=True)):
        shape = [1] * (1 + nd)
        shape[k + 1] = p
        lane = jax.lax.broadcasted_iota(jnp.int32, tuple(shape), k + 1)
        if k == 0 and w > 1:
            lane = lane + offset
        index.append(lane)
        if k == 0 and w > 1 or w != p:
            mask = mask & (lane < w)
    return tuple(index), mask


def gather_tile(ref, rows: jax.Array, row_mask: jax.Array, tile: Sequence[int], offset=0, *, interpret: bool,
                other=0) -> jax.Array:
    """``[n, *tile]``: rows ``ref[rows[b]]`` cut to ``tile`` (padding and masked rows read as ``other``).

    ``rows`` and ``row_mask`` are ``[n]`` or ``[n, 1]``.

    ``ref`` is ``[N, w0, w1, ...]``; ``tile[0]`` lanes of axis ``w0`` start at ``offset`` (or ``tile[0] == 1``
    when ``w0 == 1``); the other axes are zero-padded to ``tile[k] >= w_k``.
    """
    index, mask = _tile_index(ref.shape[1:], tile, offset, rows, row_mask)
    return masked_load(ref, index, mask, other, interpret=interpret)


def scatter_tile(ref, rows: jax.Array, row_mask: jax.Array, value: jax.Array, offset=0, *, interpret: bool) -> None:
    """``ref[rows[b], offset + ...] = value[b]`` on real lanes of rows with ``row_mask`` (inverse of
    :func:`gather_tile`)."""
    index, mask = _tile_index(ref.shape[1:], value.shape[1:], offset, rows, row_mask)
    masked_store(ref, index, value, mask, interpret=interpret)
