"""Counter-based attention dropout: the keep mask is a pure function of (seed, edge id, head).

Kernels regenerate the mask instead of storing it (no |E|-sized residual), and jgnn's XLA path calls
:func:`edge_dropout_keep` to get the identical mask. Only int32 ops (wrapping multiply, xor, logical
shift) are used, so the same code runs in Triton, in interpret mode and in XLA.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _i32(c: int) -> jax.Array:
    """A uint32 constant reinterpreted as int32 (two's complement), so multiplies wrap identically."""
    c &= 0xFFFFFFFF
    return jnp.int32(c - (1 << 32) if c >= 1 << 31 else c)


def _mix32(x: jax.Array) -> jax.Array:
    """Bijective 32-bit finalizer (Wellons' lowbias32), on int32 bit patterns."""
    x = x ^ lax.shift_right_logical(x, jnp.int32(16))
    x = x * _i32(0x7FEB352D)
    x = x ^ lax.shift_right_logical(x, jnp.int32(15))
    x = x * _i32(0x846CA68B)
    x = x ^ lax.shift_right_logical(x, jnp.int32(16))
    return x


def edge_dropout_bits(seed, eid, head) -> jax.Array:
    """24 uniform random bits (int32 in [0, 2**24)) per (seed, edge id, head); broadcasts its inputs."""
    seed = jnp.asarray(seed, jnp.int32)
    eid = jnp.asarray(eid, jnp.int32)
    head = jnp.asarray(head, jnp.int32)
    x = _mix32(eid * _i32(0x9E3779B1) + seed)
    x = _mix32(x ^ (head * _i32(0x85EBCA77) + _i32(0x27D4EB2F)))
    return lax.shift_right_logical(x, jnp.int32(8))


def keep_threshold(rate: float) -> int:
    """Keep iff bits >= threshold; P(keep) = 1 - rate up to 2**-24."""
    return int(round(float(rate) * (1 << 24)))


def edge_dropout_keep(seed, eid, head, rate: float) -> jax.Array:
    """bool mask (broadcast shape of eid and head): True where attention weight (eid, head) is kept.

    ``rate`` is a static Python float in [0, 1). Kept weights are scaled by ``1 / (1 - rate)`` by callers.
    """
    if rate <= 0.0:
        return jnp.ones(jnp.broadcast_shapes(jnp.shape(eid), jnp.shape(head)), bool)
    return edge_dropout_bits(seed, eid, head) >= keep_threshold(rate)
