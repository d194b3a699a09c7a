"""What the kernels' custom VJPs keep for the backward pass, and how a ``jax.checkpoint`` policy sees it.

* Per-node statistics a backward reads (softmax log-sum-exp, the output, argmax ids) are computed inside a
  VJP's forward rule. Under ``jax.checkpoint`` a policy saves only what it can name; an unnamed statistic
  would be remade by running the whole forward kernel again in the backward. `name_stats` tags them
  ``STATS_NAME`` so that a policy can keep them (jgnn's policies all do).
* An edge operand the backward never reads (a message linear in it, summed) is not kept at all
  (`unread_operands`); the backward gets zeros of its shape in its place.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from pallas_kernels import compat

STATS_NAME = "gnn_kernel_stats"

# (shape, dtype name) of an operand that is not kept, or None for one that is.
Dropped = tuple[tuple[int, ...], str] | None


def name_stats(*xs: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(checkpoint_name(x, STATS_NAME) for x in xs)


def unread_operands(fn: Callable, examples: tuple, group: int, operands: tuple) -> tuple[Dropped, ...]:
    """For each array of ``operands`` (the full-size ``examples[group]``): None if the pullback of
    ``fn(*examples)`` reads it, else its (shape, dtype). ``examples`` are block-sized stand-ins."""
    out = jax.eval_shape(fn, *examples)
    read = compat.pullback_reads(fn, examples, jnp.zeros(out.shape, out.dtype))
    start = sum(len(jax.tree_util.tree_leaves(x)) for x in examples[:group])
    return tuple(None if read[start + k] else (tuple(x.shape), jnp.dtype(x.dtype).name)
                 for k, x in enumerate(operands))


def keep(operands: tuple, dropped: tuple[Dropped, ...]) -> tuple:
    """The residual: each operand, or None where it is not kept."""
    return tuple(x if d is None else None for x, d in zip(operands, dropped, strict=True))


def restore(kept: tuple, dropped: tuple[Dropped, ...]) -> tuple:
    """Full-size operands for the backward: the kept ones, zeros for the others."""
    return tuple(jnp.zeros(*d) if x is None else x for x, d in zip(kept, dropped, strict=True))
