"""P-GNN (You et al., 2019): position-aware messages from anchor sets.

NeighborSelection is `anchor_neighborhood` (host, numpy, re-drawn per epoch as the authors' code does):
``log2(N)`` sizes ``N / 2^(i+1)`` times ``copies`` random anchor sets; for each node and anchor set, the member of
the set closest to it by shortest-path distance (``s(v, u) = 1 / (d(v, u) + 1)``, 0 beyond ``max_distance``
hops), as the authors' implementation precomputes (``dists_max``, ``dists_argmax``). The neighbourhood is one
dense level ``[N, K]`` (``K`` anchor sets per node) with member features ``{"s": s(v, u), "slot": j}``.

`PGNNConv` is a `jgnn.hierarchical` layer over it: ``m_{vj} = ReLU(W [s(v, u_j) h_{u_j} ‖ h_v] + b)``, then
the structure-aware output ``mean_j m_{vj}`` and the position-aware output ``z_v[j] = w · m_{vj}`` (a sum of each
member's score into its own slot, so both are reductions of the level).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import mailbox, neighborhood
from jgnn.nn import _utils


def hop_similarity(senders: np.ndarray, receivers: np.ndarray, num_nodes: int, max_distance: int = -1):
    """``[N, N]`` float32 ``1 / (d + 1)`` for shortest-path hop distance ``d`` (undirected), 0 when unreachable or
    beyond ``max_distance`` hops (``-1``: no limit)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import shortest_path

    adj = coo_matrix((np.ones(len(senders)), (senders, receivers)), shape=(num_nodes, num_nodes)).tocsr()
    dist = shortest_path(adj, directed=False, unweighted=True)
    near = np.isfinite(dist) & ((dist <= max_distance) if max_distance >= 0 else True)
    return np.where(near, 1.0 / (dist + 1.0), 0.0).astype(np.float32)


def anchor_neighborhood(similarity: np.ndarray, rng: np.random.Generator, *, copies: int | None = None
                        ) -> neighborhood.Neighborhood:
    """P-GNN's NeighborSelection (see module docstring) from a symmetric `hop_similarity` matrix; ``copies``
    sets of each size (None: ``log2(N)``, the authors' default ``c = 1``)."""
    n = similarity.shape[0]
    m = int(np.log2(n))
    copies = m if copies is None else copies
    members, scores = [], []
    for i in range(m):
        size = max(int(n / np.exp2(i + 1)), 1)
        for _ in range(copies):
            anchors = rng.choice(n, size, replace=False)
            sub = similarity[anchors]  # rows, not columns: the similarity is symmetric and rows are contiguous
            best = np.argmax(sub, 0)
            members.append(anchors[best])
            scores.append(sub[best, np.arange(n)])
    k = len(members)
    features = {"s": jnp.asarray(np.stack(scores, 1)[..., None]),
                "slot": jnp.asarray(np.broadcast_to(np.arange(k, dtype=np.int32), (n, k)))}
    return neighborhood.Neighborhood((neighborhood.dense_level(np.stack(members, 1), features=features),))


class PGNNConv(_utils.CheckedOptions, nn.Module):
    """One P-GNN layer (the authors' ``PGNN_layer`` without the trainable distance MLP). Called as
    ``conv(graph, neighborhood) -> (position [N, K], graph)`` with the structure-aware ``[N, features]`` rows as
    the graph's nodes. Parameters, in ``param_dtype``: ``hidden`` (a Dense ``[2F, features]``) and ``position``
    (``[features, 1]``); the computation runs in ``dtype`` (None: the promoted dtype of features and parameters).
    """

    features: int
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, nbhd: neighborhood.Neighborhood):
        x = _utils.node_features(graph)
        init, dtype = nn.initializers.glorot_uniform(), self.param_dtype
        w = self.param("hidden_kernel", init, (2 * x.shape[-1], self.features), dtype)
        b = self.param("hidden_bias", nn.initializers.zeros, (self.features,), dtype)
        w_pos = self.param("position_kernel", init, (self.features, 1), dtype)
        x, w, b, w_pos = _utils.promote(self.dtype, x, w, b, w_pos)
        num_slots = nbhd.levels[0].fanout

        def phi(member, group, f):
            msg = jax.nn.relu(jnp.concatenate([member * f["s"].astype(member.dtype), group]) @ w + b)
            return {"m": msg, "z": jax.nn.one_hot(f["slot"], num_slots, dtype=msg.dtype) * (msg @ w_pos)}

        def rho(mb, group):
            return {"structure": mailbox.mean(mb["m"]), "position": mailbox.sum(mb["z"])}

        layer = neighborhood.hierarchical([neighborhood.Aggregation(phi, rho)], backend=self.backend,
                                          remat=self.remat)
        out = layer(graph._replace(nodes=x), nbhd, (x,)).nodes
        return out["position"], _utils.with_features(graph, out["structure"])


class PGNN(_utils.CheckedOptions, nn.Module):
    """The authors' link-prediction P-GNN: a linear pre-layer to ``hidden``, ``num_layers`` `PGNNConv` (the
    structure-aware output feeds the next layer, dropout between), and the last layer's position-aware
    ``[N, K]`` output, L2-normalised per node, as the embedding. Called as ``model(graph, neighborhood, *,
    deterministic=True) -> [N, K]``; a pair's score is the dot product of its two embeddings. ``dtype``/
    ``param_dtype`` pass to every submodule."""

    hidden: int = 32
    num_layers: int = 2
    dropout: float = 0.5
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, nbhd: neighborhood.Neighborhood, *, deterministic: bool = True):
        dtypes = _utils.dtypes(self)
        h = nn.Dense(self.hidden, **dtypes, name="pre")(_utils.node_features(graph))
        position = None
        for i in range(self.num_layers):
            h = nn.Dropout(self.dropout, deterministic=deterministic)(h) if i else h
            position, g = PGNNConv(self.hidden, **dtypes, backend=self.backend, remat=self.remat, name=f"conv{i}")(
                graph._replace(nodes=h), nbhd)
            h = _utils.node_features(g)
        norm = jnp.sqrt(jnp.sum(position ** 2, -1, keepdims=True))
        return position / jnp.maximum(norm, 1e-12)
