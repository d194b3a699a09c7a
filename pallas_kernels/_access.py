"""The only memory-access patterns the kernels use, each with an interpret branch and a Triton branch.

All indexing is "pointer style": every dimension is indexed by an int32 array (an ``iota`` for the
feature dimensions), the arrays broadcast together, and a boolean mask guards out-of-range lanes.
Mixing an index *vector* with a *slice* is avoided on purpose: the interpret-mode discharge of a masked
load/store rejects it (``NotImplementedError`` in ``jax._src.pallas.primitives``).

* Triton branch: ``plgpu.load/store`` with ``mask``/``other``: masked lanes never touch memory, so
  out-of-range indices under a False mask are harmless.
* Interpret branch: indices are clamped into range for loads (then ``where``), and for stores masked
  lanes are redirected to an out-of-bounds index, which the discharged scatter drops. (The stock
  discharge of a masked store re-writes the old value for masked lanes, which races with a real write
  when a masked lane aliases a live index.)
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
    """``where(mask, ref[index], other)`` with ``index`` a tuple of broadcastable int32 arrays.

    Returns an array of the broadcast index shape in ``ref``'s dtype. Lanes with ``mask == False`` may
    hold any (even out-of-range) index.
    """
    if not interpret:
        index = tuple(jnp.asarray(i, jnp.int32) for i in index)
        if mask is not None:
            index, shape = _broadcast_index(index, mask)
            mask = jnp.broadcast_to(mask, shape)
        return compat.triton_load(ref, tuple(index), mask, other if mask is not None else None)
    index, shape = _broadcast_index(index, mask)
    clamped = tuple(jnp.clip(i, 0, d - 1) for i, d in zip(index, ref.shape, strict=True))
    value = ref[clamped]
    if mask is None:
        return value
    return jnp.where(jnp.broadcast_to(mask, shape), value, jnp.asarray(other, value.dtype))


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


def gather_block(ref, rows: jax.Array, row_mask: jax.Array, padded: Sequence[int], *, interpret: bool,
                 other=0) -> jax.Array:
    """Rows ``ref[rows[b], :w1, :w2, ...]`` zero-padded to ``[B, *padded]``.

    ``ref`` is ``[N, w1, ...]`` with ``w_k <= padded[k]`` (each ``padded[k]`` a power of two); ``rows`` is
    int32[B]; rows with ``row_mask == False`` and padding lanes read as ``other``.
    """
    trailing = ref.shape[1:]
    nd = len(trailing)
    full_rank = 1 + nd
    index = [rows.reshape((-1,) + (1,) * nd)]
    mask = row_mask.reshape((-1,) + (1,) * nd)
    for k, (w, p) in enumerate(zip(trailing, padded, strict=True)):
        shape = [1] * full_rank
        shape[k + 1] = p
        lane = jax.lax.broadcasted_iota(jnp.int32, tuple(shape), k + 1)
        index.append(lane)
        if w != p:
            mask = mask & (lane < w)
    return masked_load(ref, tuple(index), mask, other, interpret=interpret)


def scatter_block(ref, rows: jax.Array, row_mask: jax.Array, value: jax.Array, *, interpret: bool) -> None:
    """``ref[rows[b], :w1, ...] = value[b, :w1, ...]`` for rows with ``row_mask``; ``value`` is padded."""
    trailing = ref.shape[1:]
    nd = len(trailing)
    padded = value.shape[1:]
    index = [rows.reshape((-1,) + (1,) * nd)]
    mask = row_mask.reshape((-1,) + (1,) * nd)
    for k, (w, p) in enumerate(zip(trailing, padded, strict=True)):
        shape = [1] * (1 + nd)
        shape[k + 1] = p
        lane = jax.lax.broadcasted_iota(jnp.int32, tuple(shape), k + 1)
        index.append(lane)
        if w != p:
            mask = mask & (lane < w)
    masked_store(ref, tuple(index), value, mask, interpret=interpret)


def load_vector(ref, idx: jax.Array, mask: jax.Array, other=0, *, interpret: bool) -> jax.Array:
    """``where(mask, ref[idx], other)`` for a 1-D ref and int32 index vector."""
    return masked_load(ref, (idx,), mask, other, interpret=interpret)
