"""Graph readouts: one vector per graph of a batched ``GraphsTuple`` (sum, mean, max, attention, Set2Set).

A batch holds ``G`` graphs (``n_node`` [G]); node ``i`` belongs to graph ``graph_ids(graph)[i]``. Every readout
takes the graph and, optionally, the node features ``x`` [N, F] (default: ``graph.nodes``, or
``graph.nodes["h"]`` for dict-valued nodes) and returns [G, F'] — one row per graph, padding graphs included
(mask them with ``jraph.get_graph_padding_mask``). A graph without nodes reads out zeros for every readout, as
in PyG. These are per-graph segment reductions over nodes, not message passing: there is nothing for the jgnn
compiler to rewrite, so they are plain JAX.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn.nn import _utils

FEATURE_KEY = "h"


def graph_ids(graph: jraph.GraphsTuple, num_nodes: int | None = None) -> jax.Array:
    """int32 [N]: the graph each node belongs to (``n_node`` repeated; static ``N`` from the features)."""
    n = num_nodes if num_nodes is not None else _node_count(graph)
    g = graph.n_node.shape[0]
    return jnp.repeat(jnp.arange(g, dtype=jnp.int32), graph.n_node, total_repeat_length=n)


def _node_count(graph: jraph.GraphsTuple) -> int:
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(graph.nodes) if jnp.ndim(leaf) > 0]
    if leaves:
        return int(leaves[0].shape[0])
    raise ValueError("graph.nodes holds no array: pass the node features as x=")


def node_features(graph: jraph.GraphsTuple, x=None) -> jax.Array:
    """``x`` if given, else ``graph.nodes`` (or its ``"h"`` entry when it is a dict)."""
    if x is not None:
        return x
    nodes = graph.nodes
    if isinstance(nodes, Mapping):
        if FEATURE_KEY not in nodes:
            raise ValueError(f'graph.nodes is a dict without a "{FEATURE_KEY}" entry (keys: {sorted(nodes)}); '
                             "pass the node features as x=")
        return nodes[FEATURE_KEY]
    if nodes is None:
        raise ValueError("graph.nodes is None: pass the node features as x=")
    return nodes


def _segments(graph, x):
    x = node_features(graph, x)
    return x, graph_ids(graph, x.shape[0]), graph.n_node.shape[0]


def sum_pool(graph: jraph.GraphsTuple, x=None) -> jax.Array:
    """[G, F]: the sum of each graph's node features (GIN's readout)."""
    x, ids, g = _segments(graph, x)
    return jax.ops.segment_sum(x, ids, g, indices_are_sorted=True)


def mean_pool(graph: jraph.GraphsTuple, x=None) -> jax.Array:
    """[G, F]: the mean of each graph's node features (0 for a graph without nodes)."""
    x, ids, g = _segments(graph, x)
    total = jax.ops.segment_sum(x, ids, g, indices_are_sorted=True)
    count = jnp.maximum(graph.n_node, 1).astype(x.dtype)
    return total / count.reshape((g,) + (1,) * (x.ndim - 1))


def max_pool(graph: jraph.GraphsTuple, x=None) -> jax.Array:
    """[G, F]: the element-wise maximum over each graph's nodes (0 for a graph without nodes)."""
    x, ids, g = _segments(graph, x)
    top = jax.ops.segment_max(x, ids, g, indices_are_sorted=True)
    empty = (graph.n_node == 0).reshape((g,) + (1,) * (x.ndim - 1))
    return jnp.where(empty, jnp.zeros_like(top), top)


def _softmax_pool(graph, x, logits):
    """Per-graph softmax of ``logits`` [N] or [N, H] over nodes, then the weighted sum of ``x`` [N, F]."""
    ids, g = graph_ids(graph, x.shape[0]), graph.n_node.shape[0]
    alpha = jraph.segment_softmax(logits, ids, g, indices_are_sorted=True)
    alpha = alpha.reshape(alpha.shape + (1,) * (x.ndim - alpha.ndim))
    return jax.ops.segment_sum(alpha * x, ids, g, indices_are_sorted=True)


class AttentionReadout(nn.Module):
    r"""Gated global attention (Li et al. 2016; PyG's ``AttentionalAggregation``):

    .. math:: r_g = \sum_{i \in g} \mathrm{softmax}_{i \in g}\big(\mathrm{gate}(x_i)\big)\, \mathrm{value}(x_i)

    ``gate`` maps [N, F] to [N, 1] scores (default: one ``Dense(1)`` in ``dtype``/``param_dtype``); ``value``
    maps [N, F] to [N, F'] (default: identity). Modules passed in keep their own dtypes; the softmax and the
    sum run in ``dtype`` (None: the promoted dtype of the scores and values). Returns [G, F'].
    """

    gate: nn.Module | None = None
    value: nn.Module | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, x=None) -> jax.Array:
        x = node_features(graph, x)
        gate = self.gate if self.gate is not None else nn.Dense(1, **_utils.dtypes(self), name="gate_dense")
        logits = gate(x)[..., 0]
        values = self.value(x) if self.value is not None else x
        values, logits = _utils.promote(self.dtype, values, logits)
        return _softmax_pool(graph, values, logits)


class Set2Set(nn.Module):
    r"""Set2Set readout (Vinyals et al. 2016; PyG's ``Set2Set``): ``processing_steps`` rounds of an LSTM query
    attending over each graph's nodes.

    .. math::
        q_t = \mathrm{LSTM}(q^*_{t-1}), \quad a_i = \mathrm{softmax}_{i \in g}(x_i \cdot q_t), \quad
        r_t = \sum_{i \in g} a_i x_i, \quad q^*_t = [q_t \,\Vert\, r_t]

    starting from :math:`q^*_0 = 0`. Input ``x`` [N, F]; returns :math:`q^*_T` [G, 2F], computed in ``dtype``
    (None: the promoted dtype of ``x`` and the LSTM's ``param_dtype`` parameters).
    """

    processing_steps: int
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, x=None) -> jax.Array:
        (x,) = _utils.promote(self.dtype, node_features(graph, x))
        g, f = graph.n_node.shape[0], x.shape[-1]
        ids = graph_ids(graph, x.shape[0])
        cell = _utils.lstm_cell(self, f, name="lstm")
        carry = cell.initialize_carry(jax.random.key(0), (g, 2 * f))  # zeros: the key is unused
        q_star = jnp.zeros((g, 2 * f), x.dtype)
        for _ in range(self.processing_steps):
            carry, q = cell(carry, q_star)
            logits = jnp.sum(x * q[ids], axis=-1)
            q_star = jnp.concatenate([q, _softmax_pool(graph, x, logits)], axis=-1)
        return q_star
