"""Graph isomorphism networks (Xu et al., 2019; GINE: Hu et al., 2020) and EdgeConv (Wang et al., 2019)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn.message_passing import message_passing
from jgnn.nn import _utils


def _eps(module) -> jax.Array:
    """GIN's epsilon: a learnable scalar (``train_eps``) initialised to ``eps``, or the constant."""
    if module.train_eps:
        return module.param("eps", nn.initializers.constant(module.eps), (), module.param_dtype)
    return jnp.asarray(module.eps, module.param_dtype)


def _gin(module, graph, layout, name: str, message, edge_params=None) -> jraph.GraphsTuple:
    """``mlp((1 + eps) x_i + sum_j message(x_j, e_ji))``, the shared body of GIN and GINE."""
    sets, x_src, x_dst = _utils.split_nodes(graph, name)
    layout = _utils.check_layout(name, layout, self_loops=False, bipartite=sets.bipartite)
    attr = _utils.edge_features(graph) if edge_params is not None else None
    # a rank-1 closure constant: CSE in jgnn.passes cannot key traced scalar constants (see report)
    scale = jnp.reshape(1.0 + _eps(module), (1,))
    x_src, x_dst, scale, attr, edge_params = _utils.promote(module.dtype, x_src, x_dst, scale, attr, edge_params)
    layer = message_passing(lambda src, dst, edge: message(sets.src(src)["h"], edge, edge_params),
                            lambda mb, node: _utils.REDUCERS["sum"](mb),
                            lambda node, agg: scale * sets.dst(node)["h"] + agg,
                            backend=module.backend, remat=module.remat)
    g = sets.graph(graph, sets.rows({"h": x_src}, {"h": x_dst}), attr)
    combined = sets.output(layer(g, layout=layout).nodes)
    return _utils.output_graph(graph, sets, module.mlp(combined))


class GINConv(_utils.CheckedOptions, nn.Module):
    r"""GIN layer, as PyG's ``GINConv``:

    .. math::  h_i' = \mathrm{mlp}\Big((1 + \epsilon)\, x_i + \sum_{j \in \mathcal{N}(i)} x_j\Big)

    ``eps`` is a constant, or a learnable scalar initialised to ``eps`` when ``train_eps=True``.
    ``mlp`` is any flax module mapping ``[N, F]`` to ``[N, F']``; output width is that of ``mlp``.
    Input: ``graph.nodes`` ``[N, F]`` (or ``{"h": ...}``) or a bipartite pair ``(x_src, x_dst)`` of equal
    widths.
    """

    mlp: nn.Module
    eps: float = 0.0
    train_eps: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        return _gin(self, graph, layout, "GINConv", lambda x, edge, params: x)


def _gine_message(x, attr, params):
    if params is not None:
        kernel, bias = params
        attr = attr @ kernel + bias
    return jax.nn.relu(x + attr)


class GINEConv(_utils.CheckedOptions, nn.Module):
    r"""GIN with edge features (Hu et al., 2020), as PyG's ``GINEConv``:

    .. math::  h_i' = \mathrm{mlp}\Big((1 + \epsilon)\, x_i + \sum_{j} \mathrm{ReLU}(x_j + \Theta e_{ji})\Big)

    Edge features ``graph.edges`` ``[E, D]`` (or ``graph.edges["h"]``) are required. With ``edge_dim`` set,
    :math:`\Theta e = W_e e + b_e` maps them to the node width (PyG's ``lin``: ``edge_kernel``/``edge_bias``);
    without it :math:`\Theta` is the identity and ``D`` must equal the node width. ``eps``/``train_eps``,
    ``mlp`` and inputs as `GINConv`.
    """

    mlp: nn.Module
    eps: float = 0.0
    train_eps: bool = False
    edge_dim: int | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        attr = _utils.edge_features(graph)
        if attr is None:
            raise ValueError('GINEConv needs edge features (graph.edges as an [E, D] array or graph.edges["h"])')
        _, x_src, _ = _utils.split_nodes(graph, "GINEConv")
        width = x_src.shape[-1]
        if self.edge_dim is None:
            if attr.shape[-1] != width:
                raise ValueError(f"GINEConv: edge features have width {attr.shape[-1]} but node features "
                                 f"{width}: set edge_dim to map them (PyG's edge_dim)")
            params = ()
        else:
            _utils.require_edge_features(graph, "GINEConv", self.edge_dim)
            params = (self.param("edge_kernel", nn.initializers.lecun_normal(), (self.edge_dim, width),
                                 self.param_dtype),
                      self.param("edge_bias", nn.initializers.zeros, (width,), self.param_dtype))
        return _gin(self, graph, layout, "GINEConv", lambda x, edge, p: _gine_message(x, edge, p or None), params)


class EdgeConv(_utils.CheckedOptions, nn.Module):
    r"""Dynamic-graph-CNN edge convolution on the given graph, as PyG's ``EdgeConv``:

    .. math::  h_i' = \mathrm{aggr}_{j \in \mathcal{N}(i)} \mathrm{mlp}\big([x_i \,\Vert\, x_j - x_i]\big)

    ``aggr`` in ``{"max", "mean", "sum"}`` (PyG's ``"add"`` too); nodes without in-edges get 0. ``mlp`` (a flax
    module) is applied to every edge inside phi: its parameters are created by one call on a dummy row and
    then applied functionally. Input: ``graph.nodes`` ``[N, F]`` (or ``{"h": ...}``) or a bipartite pair
    ``(x_src, x_dst)`` of equal widths. Output width: that of ``mlp``.
    """

    mlp: nn.Module
    aggr: str = "max"
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        _utils.check_choice("aggr", self.aggr, ("add", "max", "mean", "sum"))
        sets, x_src, x_dst = _utils.split_nodes(graph, "EdgeConv")
        layout = _utils.check_layout("EdgeConv", layout, self_loops=False, bipartite=sets.bipartite)
        x_src, x_dst = _utils.promote(self.dtype, x_src, x_dst)
        reduce = _utils.REDUCERS[self.aggr]
        if self.is_initializing():
            self.mlp(jnp.zeros((1, 2 * x_dst.shape[-1]), x_dst.dtype))
        variables = self.mlp.variables
        mlp = self.mlp.clone(parent=None)
        apply = lambda z: mlp.apply(variables, z)  # one edge row: a linear first layer can be split

        def phi(src, dst, edge):
            x_i, x_j = sets.dst(dst)["h"], sets.src(src)["h"]
            return apply(jnp.concatenate([x_i, x_j - x_i]))

        layer = message_passing(phi, lambda mb, node: reduce(mb), lambda node, agg: agg,
                                backend=self.backend, remat=self.remat)
        g = sets.graph(graph, sets.rows({"h": x_src}, {"h": x_dst}))
        return _utils.output_graph(graph, sets, sets.output(layer(g, layout=layout).nodes))
