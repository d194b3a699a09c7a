"""R-GCN (featureless input, 16 hidden, mean per relation, root weight) by hand; parameters as
`benchmarks.compare.models.RGCN`."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Inputs(NamedTuple):
    """``senders``, ``receivers``, ``edge_type``: int32 ``[E]``."""

    senders: jax.Array
    receivers: jax.Array
    edge_type: jax.Array


def mean_scale(inputs: Inputs, num_nodes: int, num_relations: int):
    """``[E]``: 1 / (number of edges of the edge's relation into its receiver), PyG's per-relation mean."""
    key = inputs.receivers * num_relations + inputs.edge_type
    count = jax.ops.segment_sum(jnp.ones_like(key, jnp.float32), key, num_nodes * num_relations)
    return 1.0 / count[key]


def embed_layer(p, inputs: Inputs, scale, num_nodes: int):
    """First layer on one-hot node ids: ``W_r x_j`` is row ``j`` of ``W_r``, and ``W_0 x_i`` is row ``i`` of
    the root weight."""
    message = p["kernel"][inputs.edge_type, inputs.senders] * scale[:, None]
    return jax.ops.segment_sum(message, inputs.receivers, num_nodes) + p["root"] + p["bias"]


def dense_layer(p, x, inputs: Inputs, scale):
    """Later layers: every relation's transform on node rows (``[N, R, C]``, one GEMM), gathered per edge."""
    per_relation = jnp.einsum("ni,rio->nro", x, p["kernel"])
    message = per_relation[inputs.senders, inputs.edge_type] * scale[:, None]
    return jax.ops.segment_sum(message, inputs.receivers, x.shape[0]) + x @ p["root"] + p["bias"]


def forward(params, inputs: Inputs, num_nodes: int, num_relations: int):
    """Logits ``[N, C]``; the per-relation mean scale is computed once for both layers."""
    scale = mean_scale(inputs, num_nodes, num_relations)
    h = jax.nn.relu(embed_layer(params["RGCNConv_0"], inputs, scale, num_nodes))
    return dense_layer(params["RGCNConv_1"], h, inputs, scale)
