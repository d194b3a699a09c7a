"""PinSage (Ying et al., 2018): importance neighbourhoods from random walks, importance-weighted aggregation.

NeighborSelection is `random_walk_neighbors`: from every node, ``num_walks`` random walks of ``walk_length``
steps; the ``top_k`` nodes visited most often (the start node excluded) are its neighbours, their visit counts
normalised over the chosen ones their importance. It is a pure, jittable function of the graph and a
``jax.random`` key, with static shapes: a dense level ``[N, top_k]``, masked where fewer nodes were visited.
Aggregation and Update are `PinSageConv`, a `jgnn.hierarchical` layer over that level.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox, neighborhood
from jgnn.nn import _utils


def _csr(graph: jraph.GraphsTuple, n: int):
    """Out-neighbour lists: ``(starts [N + 1], targets [E])`` with targets of node ``v`` in
    ``targets[starts[v]:starts[v + 1]]``."""
    order = jnp.argsort(graph.senders, stable=True)
    starts = jnp.searchsorted(graph.senders[order], jnp.arange(n + 1, dtype=graph.senders.dtype))
    return starts.astype(jnp.int32), graph.receivers[order]


def random_walks(graph: jraph.GraphsTuple, key: jax.Array, *, num_walks: int = 10, walk_length: int = 3):
    """``[N, num_walks, walk_length]`` node ids: the nodes each walk from each node visits after its start (a
    walk at a node without out-edges stays there)."""
    n = graph_lib.num_nodes(graph)
    starts, targets = _csr(graph, n)
    here = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[:, None], (n, num_walks))

    def step(here, u):
        lo, deg = starts[here], starts[here + 1] - starts[here]
        pick = lo + jnp.minimum(jnp.floor(u * deg).astype(jnp.int32), jnp.maximum(deg - 1, 0))
        nxt = jnp.where(deg > 0, targets[jnp.clip(pick, 0, max(targets.shape[0] - 1, 0))], here)
        return nxt, nxt

    u = jax.random.uniform(key, (walk_length, n, num_walks))
    _, path = jax.lax.scan(step, here, u)
    return jnp.moveaxis(path, 0, -1)


def top_visited(visits, k: int):
    """Per node (row of ``visits [N, V]``, its own id excluded): the ``k`` most visited ids ``[N, k]``, their
    counts ``[N, k]`` (0 where fewer than ``k`` distinct nodes were visited). Ties go to the earlier visit."""
    n, v = visits.shape
    same = visits[:, :, None] == visits[:, None, :]  # [N, V, V]
    count = jnp.sum(same, -1)
    seen_before = jnp.any(jnp.tril(same, -1), -1)
    own = visits == jnp.arange(n, dtype=visits.dtype)[:, None]
    score = jnp.where(seen_before | own, 0, count)
    top, pos = jax.lax.top_k(score, min(k, v))
    ids = jnp.take_along_axis(visits, pos, 1)
    if k > v:
        pad = k - v
        top, ids = jnp.pad(top, ((0, 0), (0, pad))), jnp.pad(ids, ((0, 0), (0, pad)))
    return ids, top


def random_walk_neighbors(graph: jraph.GraphsTuple, key: jax.Array, *, num_walks: int = 10, walk_length: int = 3,
                          top_k: int = 10) -> neighborhood.Neighborhood:
    """PinSage's NeighborSelection (see module docstring): a one-level `jgnn.Neighborhood`, dense ``[N, top_k]``,
    with member features ``{"importance": [N, top_k, 1]}`` (visit counts over their sum; 0 on padding)."""
    ids, counts = top_visited(random_walks(graph, key, num_walks=num_walks, walk_length=walk_length)
                              .reshape(graph_lib.num_nodes(graph), -1), top_k)
    counts = counts.astype(jnp.float32)
    importance = counts / jnp.maximum(jnp.sum(counts, -1, keepdims=True), 1.0)
    level = neighborhood.dense_level(ids, mask=counts > 0, features={"importance": importance[..., None]})
    return neighborhood.Neighborhood((level,))


class PinSageConv(_utils.CheckedOptions, nn.Module):
    r"""PinSage's convolution (Algorithm 1 of the paper, as DGL's PinSAGE example's ``WeightedSAGEConv``):

    .. math::  n_v = \sum_{u \in N(v)} \alpha_{vu}\, \mathrm{ReLU}(Q h_u + q), \qquad
               z_v = \mathrm{ReLU}(W [h_v \,\|\, n_v] + w), \qquad h_v' = z_v / \lVert z_v \rVert_2

    with :math:`N(v)` and the importances :math:`\alpha_{vu}` (summing to 1) from `random_walk_neighbors`.
    ``normalize=False`` skips the L2 normalisation. Called as ``conv(graph, neighborhood) -> graph``; input
    ``graph.nodes`` ``[N, F]``, output ``[N, features]``. Parameters: ``Q_kernel`` ``[F, hidden]`` (default
    ``hidden = features``), ``Q_bias``, ``W_kernel`` ``[F + hidden, features]``, ``W_bias``, in ``param_dtype``;
    the computation runs in ``dtype`` (None: the promoted dtype of the features and parameters).
    """

    features: int
    hidden: int | None = None
    normalize: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, nbhd: neighborhood.Neighborhood) -> jraph.GraphsTuple:
        x = _utils.node_features(graph)
        width = self.hidden or self.features
        init, zeros, dtype = nn.initializers.glorot_uniform(), nn.initializers.zeros, self.param_dtype
        q_kernel = self.param("Q_kernel", init, (x.shape[-1], width), dtype)
        q_bias = self.param("Q_bias", zeros, (width,), dtype)
        w_kernel = self.param("W_kernel", init, (x.shape[-1] + width, self.features), dtype)
        w_bias = self.param("W_bias", zeros, (self.features,), dtype)
        x, q_kernel, q_bias, w_kernel, w_bias = _utils.promote(self.dtype, x, q_kernel, q_bias, w_kernel, w_bias)
        normalize = self.normalize

        def phi(member, group, features):
            return jax.nn.relu(member @ q_kernel + q_bias) * features["importance"].astype(member.dtype)

        def psi(node, agg):
            z = jax.nn.relu(jnp.concatenate([node, agg]) @ w_kernel + w_bias)
            if not normalize:
                return z
            norm = jnp.sqrt(jnp.sum(z * z))
            return z / jnp.where(norm > 0, norm, 1.0)

        agg = neighborhood.Aggregation(phi=phi, rho=lambda mb, g: mailbox.sum(mb))
        layer = neighborhood.hierarchical([agg], psi, backend=self.backend, remat=self.remat)
        return _utils.with_features(graph, _utils.node_features(layer(graph._replace(nodes=x), nbhd)))


class PinSage(_utils.CheckedOptions, nn.Module):
    """``num_layers`` `PinSageConv` of width ``hidden`` over one random-walk neighbourhood (selected with
    ``key`` per call, as PinSage re-samples), dropout before each, then a linear map to ``out_features``.
    Called as ``model(graph, key, *, deterministic=True) -> [N, out_features]``. ``dtype``/``param_dtype`` pass to
    every submodule."""

    hidden: int
    out_features: int
    num_layers: int = 2
    num_walks: int = 10
    walk_length: int = 3
    top_k: int = 10
    dropout: float = 0.5
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, key: jax.Array, *, deterministic: bool = True) -> jax.Array:
        nbhd = random_walk_neighbors(graph, key, num_walks=self.num_walks, walk_length=self.walk_length,
                                     top_k=self.top_k)
        h, dtypes = _utils.node_features(graph), _utils.dtypes(self)
        for i in range(self.num_layers):
            h = nn.Dropout(self.dropout, deterministic=deterministic)(h)
            conv = PinSageConv(self.hidden, **dtypes, backend=self.backend, remat=self.remat, name=f"conv{i}")
            h = _utils.node_features(conv(graph._replace(nodes=h), nbhd))
        return nn.Dense(self.out_features, **dtypes, name="lin")(h)
