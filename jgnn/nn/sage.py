"""GraphSAGE (Hamilton et al., 2017) and the weighted graph convolution of Morris et al. (2019)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn.message_passing import message_passing
from jgnn.nn import _utils

_AGGREGATORS = ("max", "mean", "min", "sum")


class SAGEConv(_utils.CheckedOptions, nn.Module):
    r"""GraphSAGE layer, as PyG's ``SAGEConv``:

    .. math::  h_i' = W_l \cdot \mathrm{aggr}_{j \in \mathcal{N}(i)} x_j + b + W_r x_i

    with ``aggr`` in ``{"mean", "max", "sum", "min"}`` (empty neighbourhoods aggregate to 0).
    ``project=True`` first maps sources through :math:`\mathrm{ReLU}(W_p x_j + b_p)`; ``root_weight=False``
    drops :math:`W_r x_i`; ``normalize=True`` L2-normalises the output rows.

    Input: ``graph.nodes`` ``[N, F]`` (or ``{"h": ...}``) or a bipartite pair ``(x_src, x_dst)``.
    Output width: ``features``. Parameters (PyG): ``kernel_neighbors``/``bias`` = ``lin_l``, ``kernel_root`` =
    ``lin_r``, ``project`` (a Dense) = ``lin``.
    """

    features: int
    aggr: str = "mean"
    root_weight: bool = True
    normalize: bool = False
    project: bool = False
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        _utils.check_choice("aggr", self.aggr, _AGGREGATORS)
        sets, x_src, x_dst = _utils.split_nodes(graph, "SAGEConv")
        layout = _utils.check_layout("SAGEConv", layout, self_loops=False, bipartite=sets.bipartite)
        init = nn.initializers.glorot_uniform()
        if self.project:
            x_src = jax.nn.relu(_utils.dense(self, x_src.shape[-1], name="project")(x_src))
        w_l = self.param("kernel_neighbors", init, (x_src.shape[-1], self.features), self.param_dtype)
        w_r = self.param("kernel_root", init, (x_dst.shape[-1], self.features), self.param_dtype) \
            if self.root_weight else None
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias \
            else None
        x_src, x_dst, w_l, w_r, bias = _utils.promote(self.dtype, x_src, x_dst, w_l, w_r, bias)
        reduce, normalize = _utils.REDUCERS[self.aggr], self.normalize

        def psi(node, agg):
            out = agg @ w_l
            if bias is not None:
                out = out + bias
            if w_r is not None:
                out = out + sets.dst(node)["root"] @ w_r
            if normalize:
                out = out / jnp.maximum(jnp.linalg.norm(out), 1e-12)
            return out

        layer = message_passing(lambda src, dst, edge: sets.src(src)["h"], lambda mb, node: reduce(mb), psi,
                                backend=self.backend, remat=self.remat)
        g = sets.graph(graph, sets.rows({"h": x_src}, {"root": x_dst}))
        return _utils.output_graph(graph, sets, sets.output(layer(g, layout=layout).nodes))


class GraphConv(_utils.CheckedOptions, nn.Module):
    r"""The graph convolution of Morris et al. (2019), as PyG's ``GraphConv``:

    .. math::  h_i' = W_1 x_i + W_2 \cdot \mathrm{aggr}_{j \in \mathcal{N}(i)} e_{ji} x_j + b

    with ``aggr`` in ``{"sum", "mean", "max", "min"}`` (PyG's ``"add"`` is accepted too) and optional edge
    weights :math:`e_{ji}` (a 1-D ``graph.edges`` or ``graph.edges["weight"]``, else 1).
    Input: ``graph.nodes`` ``[N, F]`` (or ``{"h": ...}``) or a bipartite pair ``(x_src, x_dst)``.
    Output width: ``features``. Parameters (PyG): ``kernel_rel``/``bias`` = ``lin_rel``, ``kernel_root`` =
    ``lin_root``.
    """

    features: int
    aggr: str = "sum"
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        _utils.check_choice("aggr", self.aggr, sorted(_utils.REDUCERS))
        sets, x_src, x_dst = _utils.split_nodes(graph, "GraphConv")
        layout = _utils.check_layout("GraphConv", layout, self_loops=False, bipartite=sets.bipartite)
        init = nn.initializers.glorot_uniform()
        w_rel = self.param("kernel_rel", init, (x_src.shape[-1], self.features), self.param_dtype)
        w_root = self.param("kernel_root", init, (x_dst.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias \
            else None
        weight = _utils.edge_weights(graph)
        x_src, x_dst, w_rel, w_root, bias, weight = _utils.promote(self.dtype, x_src, x_dst, w_rel, w_root, bias,
                                                                   weight)
        reduce = _utils.REDUCERS[self.aggr]

        def phi(src, dst, edge):
            x = sets.src(src)["h"]
            return x if edge is None else edge * x

        def psi(node, agg):
            out = agg @ w_rel + sets.dst(node)["root"] @ w_root
            return out if bias is None else out + bias

        layer = message_passing(phi, lambda mb, node: reduce(mb), psi, backend=self.backend, remat=self.remat)
        g = sets.graph(graph, sets.rows({"h": x_src}, {"root": x_dst}), weight)
        return _utils.output_graph(graph, sets, sets.output(layer(g, layout=layout).nodes))
