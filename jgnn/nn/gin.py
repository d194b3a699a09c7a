"""Graph isomorphism network (Xu et al., 2019) and EdgeConv (Wang et al., 2019)."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils


class GINConv(nn.Module):
    r"""GIN layer, as PyG's ``GINConv``:

    .. math::  h_i' = \mathrm{mlp}\Big((1 + \epsilon)\, x_i + \sum_{j \in \mathcal{N}(i)} x_j\Big)

    ``eps`` is a constant, or a learnable scalar initialised to ``eps`` when ``train_eps=True``.
    ``mlp`` is any flax module mapping ``[N, F]`` to ``[N, F']``; output width is that of ``mlp``.
    ``deterministic`` is forwarded to ``mlp`` when it accepts it.
    """

    mlp: nn.Module
    eps: float = 0.0
    train_eps: bool = False
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        graph_lib.validate(graph)
        x = _utils.node_features(graph)
        if self.train_eps:
            eps = self.param("eps", nn.initializers.constant(self.eps), (), jnp.float32)
        else:
            eps = jnp.float32(self.eps)
        # a rank-1 closure constant: CSE in jgnn.passes cannot key traced scalar constants (see report)
        scale = jnp.reshape(1.0 + eps, (1,))
        layer = message_passing(lambda src, dst, edge: src, lambda mb, node: mailbox.sum(mb),
                                lambda node, agg: scale * node + agg, backend=self.backend, remat=self.remat)
        combined = layer(graph._replace(nodes=x, edges=None), layout=layout).nodes
        return _utils.with_features(graph, self.mlp(combined))


class EdgeConv(nn.Module):
    r"""Dynamic-graph-CNN edge convolution on the given graph, as PyG's ``EdgeConv`` (max aggregation):

    .. math::  h_i' = \max_{j \in \mathcal{N}(i)} \mathrm{mlp}\big([x_i \,\Vert\, x_j - x_i]\big)

    ``mlp`` (a flax module) is applied to every edge inside phi, so its parameters are created by one call on
    a dummy row and then applied functionally. Nodes without in-edges get 0. Output width: that of ``mlp``.
    """

    mlp: nn.Module
    aggr: str = "max"
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        graph_lib.validate(graph)
        x = _utils.node_features(graph)
        reduce: Callable = {"max": mailbox.max, "mean": mailbox.mean, "sum": mailbox.sum}[self.aggr]
        if self.is_initializing():
            self.mlp(jnp.zeros((1, 2 * x.shape[-1]), x.dtype))
        variables = self.mlp.variables
        mlp = self.mlp.clone(parent=None)
        apply = lambda z: mlp.apply(variables, z)  # one edge row: a linear first layer can be split

        def phi(src, dst, edge):
            return apply(jnp.concatenate([dst, src - dst]))

        layer = message_passing(phi, lambda mb, node: reduce(mb), lambda node, agg: agg,
                                backend=self.backend, remat=self.remat)
        out = layer(graph._replace(nodes=x, edges=None), layout=layout).nodes
        return _utils.with_features(graph, out)
