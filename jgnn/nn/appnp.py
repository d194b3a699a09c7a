"""Approximate personalized propagation of neural predictions (Gasteiger et al., 2019)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.nn.gcn import gcn_norm, plain_weights


class APPNP(_utils.CheckedOptions, nn.Module):
    r"""APPNP propagation, as PyG's ``APPNP`` (no parameters):

    .. math::  h^{(0)} = x, \quad h^{(k)} = (1 - \alpha)\, \hat A h^{(k-1)} + \alpha\, x, \quad h' = h^{(K)}

    :math:`\hat A` is GCN's normalised adjacency (`jgnn.nn.gcn.gcn_norm`: ``add_self_loops`` *replaces*
    existing self-loops; a ``layout`` must be built with ``self_loops=add_self_loops and normalize``), or the
    raw edge weights with ``normalize=False``. Edge weights: a 1-D ``graph.edges`` or ``graph.edges["weight"]``.
    ``dropout`` drops entries of :math:`\hat A` in every step (rng ``"dropout"``, only when
    ``deterministic=False``). Input ``[N, F]`` (or ``{"h": ...}``); output ``[N, F]``.
    """

    K: int
    alpha: float
    dropout: float = 0.0
    add_self_loops: bool = True
    normalize: bool = True
    dtype: Any = None
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        sets, x, _ = _utils.split_nodes(graph, "APPNP", bipartite_ok=False)
        loops = self.add_self_loops and self.normalize
        layout = _utils.check_layout("APPNP", layout, self_loops=loops)
        (x,) = _utils.promote(self.dtype, x)
        weight = _utils.edge_weights(graph)
        norm = gcn_norm(graph, weight, add_self_loops=loops, backend=self.backend, remat=self.remat,
                        layout=layout) if self.normalize else plain_weights(graph, weight)
        coefficient, alpha = norm.coefficient, self.alpha
        drop = not deterministic and self.dropout > 0.0
        keep_rate = 1.0 - self.dropout

        def phi(src, dst, edge):
            c = jnp.ones((), x.dtype) if coefficient is None else coefficient(src, dst, edge).astype(x.dtype)
            if drop:
                c = c * edge["keep"] / keep_rate
            return c * src["h"]

        layer = message_passing(phi, lambda mb, node: mailbox.sum(mb),
                                lambda node, agg: (1.0 - alpha) * agg + alpha * node["h0"],
                                backend=self.backend, remat=self.remat)
        g, h = norm.looped(), x  # edge dropout draws a mask over the loops too
        for _ in range(self.K):
            edges = g.edges
            if drop:
                keep = jax.random.bernoulli(self.make_rng("dropout"), keep_rate, g.senders.shape).astype(x.dtype)
                edges = {**(edges or {}), "keep": keep}
            h = layer(g._replace(nodes={**norm.nodes, "h": h, "h0": x}, edges=edges), layout=layout).nodes
        return _utils.output_graph(graph, sets, h)
