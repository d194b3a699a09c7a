"""What the kernels' custom VJPs keep for the backward pass, and how a ``jax.checkpoint`` policy sees it.

* Per-node statistics a backward reads (softmax log-sum-exp, the output, argmax ids) are computed inside a
  VJP's forward rule. Under ``jax.checkpoint`` a policy saves only what it can name; an unnamed statistic
  would be remade by running the whole forward kernel again in the backward. `name_stats` tags them
  ``STATS_NAME`` so that a policy can keep them (jgnn's policies all do).
* An edge operand the backward never reads is not kept at all (`unread_operands`, `keep`, `restore`). What
  the backward reads depends on which inputs are differentiated at all: RGCN's ``m · c`` needs ``m`` only
  for ``∂c``, and its normaliser ``c`` comes from degrees. So the forward rules use ``symbolic_zeros``
  (`split_primals`), freeze the inputs JAX does not perturb (`frozen`) and pass those flags to the backward
  inside the residual's structure (`flags`, `unflag`), which is static.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import CustomVJPPrimal

from pallas_kernels import compat

STATS_NAME = "gnn_kernel_stats"

# (shape, dtype name) of an operand that is not kept, or None for one that is.
Dropped = tuple[tuple[int, ...], str] | None


def name_stats(*xs: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(checkpoint_name(x, STATS_NAME) for x in xs)


def split_primals(args):
    """(values, perturbed flags) of a ``symbolic_zeros`` forward rule's arguments."""
    is_primal = lambda x: isinstance(x, CustomVJPPrimal)
    return (jax.tree_util.tree_map(lambda p: p.value, args, is_leaf=is_primal),
            jax.tree_util.tree_map(lambda p: p.perturbed, args, is_leaf=is_primal))


def frozen(fn: Callable, perturbed) -> Callable:
    """``fn`` with every argument leaf JAX does not perturb behind ``stop_gradient``: its cotangent is zero, so
    a pullback reads nothing that only that cotangent would have needed."""
    def run(*args):
        return fn(*jax.tree_util.tree_map(lambda x, p: x if p else jax.lax.stop_gradient(x), args, perturbed))

    return run


def flags(perturbed) -> tuple:
    """Perturbed flags as residual *structure* (``()`` or ``None`` per leaf): static in the backward."""
    return tuple(() if p else None for p in jax.tree_util.tree_leaves(perturbed))


def unflag(encoded: tuple, like) -> object:
    """The flags `flags` encoded, in the structure of ``like``."""
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), [x is not None for x in encoded])


def unread_operands(fn: Callable, examples: tuple, group: int, operands: tuple) -> tuple[Dropped, ...]:
    """For each array of ``operands`` (the full-size ``examples[group]``): None if the pullback of
    ``fn(*examples)`` reads it, else its (shape, dtype). ``examples`` are block-sized stand-ins."""
    out = jax.eval_shape(fn, *examples)
    read = compat.pullback_reads(fn, examples, jnp.zeros(out.shape, out.dtype))
    start = sum(len(jax.tree_util.tree_leaves(x)) for x in examples[:group])
    return tuple(None if read[start + k] else (tuple(x.shape), jnp.dtype(x.dtype).name)
                 for k, x in enumerate(operands))


def keep(operands: tuple, dropped: tuple[Dropped, ...]) -> tuple:
    """The residual: each kept operand, and for each dropped one ``{"dropped": m}`` where ``m`` has shape
    ``(0, *x.shape)``: the operand's shape and dtype with no data. (A slice of ``x`` would make the residual
    depend on ``x``; the dict marks the operand as dropped in the residual's structure.)"""
    return tuple(x if d is None else {"dropped": jnp.zeros((0,) + x.shape, x.dtype)}
                 for x, d in zip(operands, dropped, strict=True))


def is_dropped(kept) -> bool:
    return isinstance(kept, dict)


def zeros_for(kept, rows: int | None = None) -> jax.Array:
    """Zeros standing in for the operand a `keep` marker replaced (``rows`` rows, default all of them)."""
    m = kept["dropped"]
    shape = m.shape[1:]
    return jnp.zeros(shape if rows is None else (rows,) + shape[1:], m.dtype)


def restore(kept: tuple) -> tuple:
    """Full-size operands for the backward: the kept ones, and zeros for the dropped ones."""
    return tuple(zeros_for(x) if is_dropped(x) else x for x in kept)
