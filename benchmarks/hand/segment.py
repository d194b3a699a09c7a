"""The segment softmax-aggregate every hand-written attention layer shares."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attend(logit, value, receivers, num_nodes: int):
    """``sum_j softmax_j(logit) * value_j`` per receiving node.

    Args:
      logit: ``[E, H]`` edge scores.
      value: ``[E, H, C]`` edge values.
      receivers: int ``[E]``.
      num_nodes: ``N``.

    Returns ``[N, H, C]``; a node without in-edges gets 0. The maximum is a constant for the gradient (the
    softmax does not depend on it) and the normalisation divides node rows, not edge rows.
    """
    top = jax.lax.stop_gradient(jax.ops.segment_max(logit, receivers, num_nodes))
    weight = jnp.exp(logit - top[receivers])
    total = jax.ops.segment_sum(weight, receivers, num_nodes)
    summed = jax.ops.segment_sum(weight[..., None] * value, receivers, num_nodes)
    return summed / jnp.where(total > 0, total, 1.0)[..., None]
