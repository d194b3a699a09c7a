"""GraphSAGE (Hamilton et al., 2017)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils

_AGGREGATORS = {"mean": mailbox.mean, "max": mailbox.max, "sum": mailbox.sum, "min": mailbox.min}


class SAGEConv(nn.Module):
    r"""GraphSAGE layer, as PyG's ``SAGEConv``:

    .. math::  h_i' = W_l \cdot \mathrm{aggr}_{j \in \mathcal{N}(i)} x_j + b + W_r x_i

    with ``aggr`` in ``{"mean", "max", "sum", "min"}`` (empty neighbourhoods aggregate to 0).
    ``normalize=True`` L2-normalises the output rows. Output width: ``features``.
    """

    features: int
    aggr: str = "mean"
    root_weight: bool = True
    normalize: bool = False
    use_bias: bool = True
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        if self.aggr not in _AGGREGATORS:
            raise ValueError(f"aggr must be one of {sorted(_AGGREGATORS)}, got {self.aggr!r}")
        graph_lib.validate(graph)
        x = _utils.node_features(graph)
        init = nn.initializers.glorot_uniform()
        w_l = self.param("kernel_neighbors", init, (x.shape[-1], self.features), jnp.float32)
        w_r = self.param("kernel_root", init, (x.shape[-1], self.features), jnp.float32) if self.root_weight else None
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32) if self.use_bias else None
        reduce, normalize = _AGGREGATORS[self.aggr], self.normalize

        def psi(node, agg):
            out = agg @ w_l
            if bias is not None:
                out = out + bias
            if w_r is not None:
                out = out + node @ w_r
            if normalize:
                out = out / jnp.maximum(jnp.linalg.norm(out), 1e-12)
            return out

        layer = message_passing(lambda src, dst, edge: src, lambda mb, node: reduce(mb), psi,
                                backend=self.backend, remat=self.remat)
        out = layer(graph._replace(nodes=x, edges=None), layout=layout).nodes
        return _utils.with_features(graph, out)
