"""GAT (8 heads × 8, ELU, then 1 head) by hand; parameters as `benchmarks.compare.models.GAT`."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from benchmarks.hand.segment import attend


class Inputs(NamedTuple):
    """``x`` float ``[N, F]``; ``senders``/``receivers`` int32 ``[E + N]``: the graph's edges and then one
    self-loop per node (appended once on the host)."""

    x: jax.Array
    senders: jax.Array
    receivers: jax.Array


def layer(p, x, senders, receivers, heads: int, concat: bool, slope: float = 0.2):
    """One GAT layer: ``[N, F] -> [N, heads * C]`` (``concat``) or ``[N, C]`` (mean over heads)."""
    n = x.shape[0]
    z = (x @ p["kernel"]).reshape(n, heads, -1)
    score_src = jnp.einsum("nhc,hc->nh", z, p["att_src"])
    score_dst = jnp.einsum("nhc,hc->nh", z, p["att_dst"])
    logit = jax.nn.leaky_relu(score_src[senders] + score_dst[receivers], slope)
    out = attend(logit, z[senders], receivers, n)
    out = out.reshape(n, -1) if concat else out.mean(1)
    return out + p["bias"]


def forward(params, inputs: Inputs, heads: int):
    """Logits ``[N, C]``."""
    h = layer(params["GATConv_0"], inputs.x, inputs.senders, inputs.receivers, heads, True)
    return layer(params["GATConv_1"], jax.nn.elu(h), inputs.senders, inputs.receivers, 1, False)
