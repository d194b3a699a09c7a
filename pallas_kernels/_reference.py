"""What the pure-jnp references share: per-slot rows and operands of a CSR, evaluated without any schedule.

The references define the kernels' semantics, so they read the CSR exactly as the kernels do: slots past
``indptr[-1]`` belong to no row, ``col`` ids are clamped into the gathered array, and every operand reaches
``edge_fn`` broadcast on its split axis and cast to the compute dtype (unpadded: ``[nnz, T, *rest]``).
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pallas_kernels.csr import CSR


def slot_rows(csr: CSR) -> tuple[jax.Array, jax.Array]:
    """(row id per slot, slot validity); invalid slots get row ``R`` (a dropped extra segment)."""
    nnz = csr.col.shape[0]
    slots = jnp.arange(nnz, dtype=jnp.int32)
    rows = jnp.searchsorted(csr.indptr, slots, side="right").astype(jnp.int32) - 1
    valid = slots < csr.indptr[-1]
    return jnp.where(valid, rows, csr.num_rows), valid


def degrees(csr: CSR) -> jax.Array:
    return csr.indptr[1:] - csr.indptr[:-1]


def slot_operands(groups: Sequence[Sequence[jax.Array]], csr: CSR, rows: jax.Array, *, axis: int,
                  compute) -> tuple[tuple[jax.Array, ...], ...]:
    """Each operand per slot: col at ``clamp(csr.col)``, row at the slot's row, edge at ``csr.eid``, shared
    broadcast; as ``[nnz, axis, *rest]`` in ``compute``."""
    nnz = csr.col.shape[0]
    col, row, edge, shared = groups

    def take(xs, idx):
        out = []
        for x in xs:
            y = x[jnp.clip(idx, 0, x.shape[0] - 1)].astype(compute)
            out.append(jnp.broadcast_to(y, (nnz, axis) + y.shape[2:]))
        return tuple(out)

    zeros = jnp.zeros((nnz,), jnp.int32)
    return take(col, csr.col), take(row, rows), take(edge, csr.eid), take(shared, zeros)


def lanes(mask: jax.Array, x: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


def segment(fn, values: jax.Array, rows: jax.Array, num_rows: int) -> jax.Array:
    """``fn`` (a ``jax.ops.segment_*``) over slots; slots of row ``R`` (invalid) are dropped."""
    return fn(values, rows, num_segments=num_rows + 1)[:num_rows]
