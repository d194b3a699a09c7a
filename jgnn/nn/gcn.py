"""Graph convolution (Kipf & Welling, 2017)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils


class GCNConv(nn.Module):
    r"""Graph convolution with symmetric normalisation, as PyG's ``GCNConv``.

    .. math::  h_i' = \sum_{j \in \mathcal{N}(i) \cup \{i\}} \frac{1}{\sqrt{\hat d_i \hat d_j}}\, W x_j + b

    where :math:`\hat d` is the in-degree counted on the graph with self-loops (``D^{-1/2} (A+I) D^{-1/2}``).
    ``add_self_loops`` appends one ``i -> i`` edge per node; ``normalize=False`` uses the plain sum
    :math:`\sum_j W x_j`. Nodes of degree 0 get :math:`b`. Degrees are computed by message passing too.
    Output width: ``features``.
    """

    features: int
    add_self_loops: bool = True
    normalize: bool = True
    use_bias: bool = True
    kernel_init: nn.initializers.Initializer = nn.initializers.glorot_uniform()
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        graph_lib.validate(graph)
        x = _utils.node_features(graph)
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32) if self.use_bias else None
        g = _utils.add_self_loops(graph) if self.add_self_loops else graph
        if self.add_self_loops:
            layout = None  # the layout describes the graph without the self-loops
        nodes = {"h": x}
        if self.normalize:
            deg = _utils.in_degree(g, backend=self.backend, remat=self.remat)
            nodes["norm"] = jnp.where(deg > 0, jax.lax.rsqrt(jnp.maximum(deg, 1.0)), 0.0)
        normalize = self.normalize

        def phi(src, dst, edge):
            message = src["h"] @ kernel
            if normalize:
                message = message * (src["norm"] * dst["norm"])
            return message

        def psi(node, agg):
            return agg if bias is None else agg + bias

        layer = message_passing(phi, lambda mb, node: mailbox.sum(mb), psi, backend=self.backend, remat=self.remat)
        out = layer(g._replace(nodes=nodes, edges=None), layout=layout).nodes
        return _utils.with_features(graph, out)
