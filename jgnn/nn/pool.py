"""Top-k graph pooling with static shapes: TopKPooling (Gao & Ji 2019) and SAGPooling (Lee et al. 2019).

PyG's pooling shrinks the arrays; under ``jit`` shapes must stay fixed, so here the pooled graph keeps the
input's array sizes and moves what is dropped into jraph's padding graph. The input must be padded as
:func:`jraph.pad_with_graphs` (and :func:`jgnn.batching.padded_batches`) pad: one padding graph with at least
one node, then only empty graphs. In the output:

* graph ``g`` keeps its ``k_g = ceil(ratio * n_g)`` best-scoring nodes, in descending score order, at the
  front (PyG's ``perm`` order); ``n_node[g] = k_g``;
* every dropped node (and every node of the padding graph) sits after them, with zero features, in the
  padding graph, whose ``n_node`` takes the rest;
* an edge is kept when both its ends are; kept edges keep their order (so stay grouped by graph) and the
  others point at the last node (a padding node) and belong to the padding graph.

So the result on real graphs equals PyG's ``TopKPooling``/``SAGPooling`` output, and
``jraph.get_node_padding_mask`` of the pooled graph marks exactly the kept nodes.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn.nn import _utils
from jgnn.nn.readout import graph_ids, node_features
from jgnn.nn.sage import GraphConv


class Pooled(NamedTuple):
    """``graph``: the pooled graph (same array sizes as the input). ``perm``: int32 [N], the input index of
    each output node (PyG's ``perm`` on the kept prefix). ``score``: [N] the score of each output node
    (0 for dropped ones)."""

    graph: jraph.GraphsTuple
    perm: jax.Array
    score: jax.Array


def topk_select(graph: jraph.GraphsTuple, score: jax.Array, ratio: float, x: jax.Array) -> Pooled:
    """Keep the ``ceil(ratio * n_g)`` highest-``score`` nodes of every real graph; scale their features by score.

    Args:
      graph: a batch padded as jraph pads (see the module doc); ``n_node`` [G], ``senders``/``receivers`` [E].
      score: [N] node scores (already passed through the nonlinearity).
      ratio: fraction of nodes kept per graph, in (0, 1].
      x: [N, F] node features; the output features are ``x[perm] * score[perm]`` on kept nodes, 0 elsewhere.

    Returns:
      :class:`Pooled`; ``graph.nodes`` is ``x'`` (or the input's dict with ``"h"`` replaced and every other
      node entry permuted alike); ``graph.edges`` is permuted with the edges.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    n, e, g = x.shape[0], graph.senders.shape[0], graph.n_node.shape[0]
    ids = graph_ids(graph, n)
    starts = jnp.cumsum(graph.n_node) - graph.n_node
    # jraph's padding graph: the first of the trailing graphs (it holds the padding nodes, the rest are empty)
    graph_index = jnp.arange(g)
    pad_graph = g - jraph.get_number_of_padding_with_graphs_graphs(graph)
    keep_count = jnp.ceil(ratio * graph.n_node.astype(jnp.float32)).astype(jnp.int32)
    keep_count = jnp.where(graph_index >= pad_graph, 0, keep_count)  # padding graphs keep nothing
    # rank of every node inside its graph by descending score (ties: lower index first, as a stable sort)
    order = jnp.lexsort((-score, ids))
    rank = jnp.zeros(n, jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32) - starts[ids[order]])
    keep = rank < keep_count[ids]
    num_kept = jnp.sum(keep_count)
    new_starts = jnp.cumsum(keep_count) - keep_count
    dropped_rank = jnp.cumsum(~keep) - 1
    new_pos = jnp.where(keep, new_starts[ids] + rank, num_kept + dropped_rank).astype(jnp.int32)
    perm = jnp.zeros(n, jnp.int32).at[new_pos].set(jnp.arange(n, dtype=jnp.int32))
    kept_score = jnp.where(keep[perm], score[perm], 0.0)
    x_new = x[perm] * kept_score[:, None].astype(x.dtype)

    edge_keep = keep[graph.senders] & keep[graph.receivers]
    edge_order = jnp.argsort(~edge_keep, stable=True)
    last = jnp.int32(n - 1)
    senders = jnp.where(edge_keep, new_pos[graph.senders], last)[edge_order]
    receivers = jnp.where(edge_keep, new_pos[graph.receivers], last)[edge_order]
    kept_edges = jax.ops.segment_sum(edge_keep.astype(jnp.int32), ids[graph.senders], g)
    n_edge = jnp.where(graph_index == pad_graph, e - jnp.sum(kept_edges), kept_edges)
    n_node = jnp.where(graph_index == pad_graph, n - num_kept, keep_count)

    if isinstance(graph.nodes, Mapping):
        nodes = {k: (x_new if k == "h" else v[perm]) for k, v in graph.nodes.items()}
        nodes.setdefault("h", x_new)
    else:
        nodes = x_new
    edges = jax.tree_util.tree_map(lambda a: a[edge_order], graph.edges)
    pooled = graph._replace(nodes=nodes, edges=edges, senders=senders, receivers=receivers,
                            n_node=n_node.astype(graph.n_node.dtype), n_edge=n_edge.astype(graph.n_edge.dtype))
    return Pooled(pooled, perm, kept_score)


class TopKPooling(nn.Module):
    r"""Top-k pooling (Gao & Ji 2019, PyG's ``TopKPooling`` with ``min_score=None``):

    .. math:: s = \tanh\big(x\, p / \lVert p \rVert\big), \qquad
        x' = (x \odot s)_{\mathrm{top}_k(s)}, \quad k_g = \lceil \mathrm{ratio} \cdot n_g \rceil

    with a learned projection ``p`` [F] (in ``param_dtype``). Called as ``pool(graph, x=None) -> Pooled``; see
    the module doc for the static-shape layout of the result. ``multiplier`` scales the kept features. The
    score and the output features are computed in ``dtype`` (None: the promoted dtype of ``x`` and ``p``).
    """

    ratio: float = 0.5
    nonlinearity: Callable = jnp.tanh
    multiplier: float = 1.0
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, x=None) -> Pooled:
        x = node_features(graph, x)
        bound = 1.0 / float(x.shape[-1]) ** 0.5  # PyG's uniform(size, weight): U(-1/sqrt(F), 1/sqrt(F))
        init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)
        p = self.param("projection", init, (x.shape[-1],), self.param_dtype)
        x, p = _utils.promote(self.dtype, x, p)
        score = self.nonlinearity((x @ p) / jnp.linalg.norm(p))
        pooled = topk_select(graph, score, self.ratio, x)
        return _scaled(pooled, self.multiplier)


class SAGPooling(nn.Module):
    r"""Self-attention graph pooling (Lee et al. 2019, PyG's ``SAGPooling`` with ``min_score=None``): the score
    is a GNN's one-channel output, :math:`s = \tanh(\mathrm{gnn}(G, x))`, then as :class:`TopKPooling`.

    ``gnn`` is a `jgnn.nn` layer with one output channel, called on the graph with ``nodes = x``; the default
    is PyG's, ``jgnn.nn.GraphConv(1)`` in ``dtype``/``param_dtype`` (a layer passed in keeps its own dtypes).
    PyG then scores with ``SelectTopK(1)``, whose one weight ``w`` only contributes ``sign(w)``: to load PyG
    weights, multiply the GNN's output layer by that sign.
    The score and the output features are computed in ``dtype`` (None: the promoted dtype of ``x`` and the score).
    """

    gnn: nn.Module | None = None
    ratio: float = 0.5
    nonlinearity: Callable = jnp.tanh
    multiplier: float = 1.0
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, x=None) -> Pooled:
        x = node_features(graph, x)
        gnn = self.gnn if self.gnn is not None else GraphConv(1, **_utils.dtypes(self), name="gnn")
        out = gnn(graph._replace(nodes=x)).nodes
        x, score = _utils.promote(self.dtype, x, node_features(graph._replace(nodes=out)).reshape(x.shape[0]))
        score = self.nonlinearity(score)
        return _scaled(topk_select(graph, score, self.ratio, x), self.multiplier)


def _scaled(pooled: Pooled, multiplier: float) -> Pooled:
    if multiplier == 1.0:
        return pooled
    nodes = pooled.graph.nodes
    if isinstance(nodes, Mapping):
        nodes = {**nodes, "h": nodes["h"] * multiplier}
    else:
        nodes = nodes * multiplier
    return pooled._replace(graph=pooled.graph._replace(nodes=nodes))
