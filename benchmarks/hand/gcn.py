"""GCN (64 hidden, ReLU) by hand; parameters as `benchmarks.compare.models.GCN`."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks.hand.gat import Inputs  # the same inputs: features and edges with self-loops appended


def layer(p, x, senders, receivers, scale):
    """``D^-1/2 (A + I) D^-1/2 x W + b``: the transform and both scalings act on node rows."""
    h = (x @ p["kernel"]) * scale[:, None]
    return jax.ops.segment_sum(h[senders], receivers, x.shape[0]) * scale[:, None] + p["bias"]


def forward(params, inputs: Inputs):
    """Logits ``[N, C]``. The in-degree (self-loop included) is computed once for both layers."""
    n = inputs.x.shape[0]
    degree = jax.ops.segment_sum(jnp.ones_like(inputs.receivers, jnp.float32), inputs.receivers, n)
    scale = jax.lax.rsqrt(degree)  # >= 1: every node has its self-loop
    h = jax.nn.relu(layer(params["GCNConv_0"], inputs.x, inputs.senders, inputs.receivers, scale))
    return layer(params["GCNConv_1"], h, inputs.senders, inputs.receivers, scale)
