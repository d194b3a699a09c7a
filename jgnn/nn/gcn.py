"""Graph convolution (Kipf & Welling, 2017) and its symmetric normalisation, shared with `APPNP`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import layout as layout_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils


class Normalized(NamedTuple):
    """A graph ready for normalised propagation: ``h_i' = sum_j coefficient(src_j, dst_i, edge) * h_j``.

    ``graph`` is the graph to propagate on, before its self-loops, with ``edges`` holding what ``coefficient``
    reads; with ``self_loops`` one loop per node follows, with ``loop_edges`` as its edge features (pass both to
    the `jgnn.message_passing` layer, which appends them inside the compiled program; `looped` appends them
    here). ``nodes`` holds the per-node arrays ``coefficient`` reads (merge them into the node rows).
    """

    graph: jraph.GraphsTuple
    nodes: dict
    coefficient: Callable | None  # None: every coefficient is 1
    self_loops: bool = False
    loop_edges: Any = None

    def looped(self) -> jraph.GraphsTuple:
        """The graph with its self-loops appended."""
        return layout_lib.append_loops(self.graph, self.loop_edges) if self.self_loops else self.graph


def _inv_sqrt(deg):
    """``deg ** -0.5`` with 0 for degree 0 (PyG masks the inf), safe to differentiate."""
    zero = deg == 0
    return jnp.where(zero, 0.0, jnp.where(zero, 1.0, deg) ** -0.5)


def _loop_stats(graph: jraph.GraphsTuple, per_loop, weighted: bool, *, backend, remat, layout):
    """Per node: the weight of its non-loop in-edges, whether it had a self-loop, and that loop's weight, over
    ``graph`` (its ``edges`` the per-edge arrays) and one appended loop per node (``per_loop``).

    PyG's ``add_remaining_self_loops`` keeps an existing loop's weight (the last loop, with duplicates)."""
    zeros = jnp.zeros((graph_lib.num_nodes(graph),), jnp.float32)
    run = lambda phi, reduce="sum", nodes=zeros: _utils.aggregate(
        graph._replace(nodes=nodes), phi, reduce, backend=backend, remat=remat, layout=layout, self_loops=True,
        loop_edges=per_loop)
    if weighted:
        last = run(lambda src, dst, edge: edge["lp"], "max")
        stats = run(lambda src, dst, edge: {"deg": edge["w"], "has": edge["loop"],
                                            "lw": jnp.where(edge["lp"] == dst, edge["lw"], 0.0)}, nodes=last)
        return stats["deg"], stats["has"], stats["lw"]
    stats = run(lambda src, dst, edge: {"deg": edge["w"], "has": edge["loop"]})
    return stats["deg"], stats["has"], None


def gcn_norm(graph: jraph.GraphsTuple, weight=None, *, add_self_loops: bool = True, fill_value: float = 1.0,
             backend: str = "auto", remat: Any = "auto", layout=None) -> Normalized:
    r"""PyG's ``gcn_norm``: coefficients :math:`\hat d_j^{-1/2} e_{ji} \hat d_i^{-1/2}` for propagation.

    Args:
      graph: the graph (its node features are not read).
      weight: float ``[E]`` edge weights, or ``None`` for all ones.
      add_self_loops: *replace* existing self-loops by one loop per node, as PyG's
        ``add_remaining_self_loops``: an existing loop keeps its weight (the last one when duplicated), a node
        without one gets ``fill_value``. Existing loops stay in the edge list with coefficient 0 (shapes are
        static under ``jit``) and the new loops are appended (`jgnn.layout.append_self_loops` order).
      layout: a `jgnn.layout.GraphLayout` of the graph propagated on (``self_loops=add_self_loops``).

    :math:`\hat d_i` is the weighted in-degree on that graph; nodes of degree 0 get coefficient 0. A layout
    whose graph has no self-loop of its own (`GraphLayout.own_loops` False; jraph-padded batches have loops on
    the padding node) lets an unweighted normalisation skip the loop replacement: ``d_j^-1/2 d_i^-1/2``.
    Unlike PyG 2.8, ``fill_value`` (2 for ``improved=True``) applies without edge weights too: they are 1.
    """
    e = graph_lib.num_edges(graph)
    nothing_to_replace = weight is None and fill_value == 1.0 and layout is not None and layout.own_loops is False
    if not add_self_loops or nothing_to_replace:
        # The graph as it is, or with a loop per node added where the layout knows there is none to replace: the
        # coefficients need no per-edge loop flags or selects (as a hand-written GCN's).
        # (loops are only added without weights here: `nothing_to_replace`)
        edges = None if weight is None else {"w": weight}
        phi = (lambda src, dst, edge: edge["w"]) if weight is not None else \
            (lambda src, dst, edge: jnp.ones((), jnp.float32))
        deg = _utils.aggregate(_utils.degree_probe(graph, edges), phi, backend=backend, remat=remat, layout=layout,
                               self_loops=add_self_loops)
        if weight is None:
            return Normalized(graph._replace(edges=None), {"dinv": _inv_sqrt(deg)},
                              lambda src, dst, edge: src["dinv"] * dst["dinv"], self_loops=add_self_loops)
        return Normalized(graph._replace(edges=edges), {"dinv": _inv_sqrt(deg)},
                          lambda src, dst, edge: src["dinv"] * edge["w"] * dst["dinv"])
    n = graph_lib.num_nodes(graph)
    loop = _utils.existing_loops(graph)
    w = jnp.ones((e,), jnp.float32) if weight is None else weight
    per_edge = {"w": jnp.where(loop, 0.0, w), "loop": loop.astype(w.dtype), "new": jnp.zeros((e,), bool)}
    per_loop = {"w": jnp.zeros((n,), w.dtype), "loop": jnp.zeros((n,), w.dtype), "new": jnp.ones((n,), bool)}
    if weight is not None:
        position = jnp.arange(e, dtype=jnp.float32)  # exact below 2**24 edges
        per_edge |= {"lw": jnp.where(loop, w, 0.0), "lp": jnp.where(loop, position, -1.0)}
        per_loop |= {"lw": jnp.zeros((n,), w.dtype), "lp": jnp.full((n,), -1.0, jnp.float32)}
    deg, has_loop, loop_weight = _loop_stats(graph._replace(edges=per_edge), per_loop, weight is not None,
                                             backend=backend, remat=remat, layout=layout)
    kept = jnp.ones_like(deg) if loop_weight is None else loop_weight
    loop_weight = jnp.where(has_loop > 0, kept, fill_value)
    nodes = {"dinv": _inv_sqrt(deg + loop_weight), "loop_w": loop_weight}
    keys = ("w", "new")
    return Normalized(graph._replace(edges={k: per_edge[k] for k in keys}), nodes,
                      lambda src, dst, edge: src["dinv"] * dst["dinv"] * jnp.where(edge["new"], dst["loop_w"],
                                                                                   edge["w"]),
                      self_loops=True, loop_edges={k: per_loop[k] for k in keys})


def plain_weights(graph: jraph.GraphsTuple, weight) -> Normalized:
    """No normalisation: coefficients are the edge weights (or 1)."""
    if weight is None:
        return Normalized(graph._replace(edges=None), {}, None)
    return Normalized(graph._replace(edges={"w": weight}), {}, lambda src, dst, edge: edge["w"])


class GCNConv(_utils.CheckedOptions, nn.Module):
    r"""Graph convolution with symmetric normalisation, as PyG's ``GCNConv``.

    .. math::  h_i' = \sum_{j \in \mathcal{N}(i) \cup \{i\}} \frac{e_{ji}}{\sqrt{\hat d_j \hat d_i}}\, W x_j + b,
        \qquad \hat d_i = \sum_{j \in \mathcal{N}(i) \cup \{i\}} e_{ji}

    Input: ``graph.nodes`` float ``[N, F]`` (or ``{"h": ...}``); optional edge weights :math:`e_{ji}`
    (PyG's ``edge_weight``) as a 1-D ``graph.edges`` ``[E]`` or ``graph.edges["weight"]``, else 1.
    Output: ``[N, features]`` in the input's form.

    Options (PyG names): ``add_self_loops`` (default: ``normalize``) *replaces* existing self-loops by one per
    node (see `gcn_norm`); ``improved`` gives new loops weight 2; ``normalize=False`` propagates
    :math:`\sum_j e_{ji} W x_j` (PyG then forbids self-loops). A ``layout`` must be built with
    ``self_loops=add_self_loops``. Nodes of degree 0 get :math:`b`. PyG's ``cached`` is not needed under
    ``jit``. Parameters: ``kernel`` ``[F, features]`` (PyG ``lin.weight.T``), ``bias``.
    """

    features: int
    add_self_loops: bool | None = None
    normalize: bool = True
    improved: bool = False
    use_bias: bool = True
    kernel_init: nn.initializers.Initializer = nn.initializers.glorot_uniform()
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        loops = self.normalize if self.add_self_loops is None else self.add_self_loops
        if loops and not self.normalize:
            raise ValueError("GCNConv: add_self_loops=True needs normalize=True (as in PyG)")
        sets, x, _ = _utils.split_nodes(graph, "GCNConv", bipartite_ok=False)
        layout = _utils.check_layout("GCNConv", layout, self_loops=loops)
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias \
            else None
        x, kernel, bias = _utils.promote(self.dtype, x, kernel, bias)
        weight = _utils.edge_weights(graph)
        if self.normalize:
            norm = gcn_norm(graph, weight, add_self_loops=loops, fill_value=2.0 if self.improved else 1.0,
                            backend=self.backend, remat=self.remat, layout=layout)
        else:
            norm = plain_weights(graph, weight)
        coefficient = norm.coefficient

        def phi(src, dst, edge):
            message = src["h"] @ kernel
            return message if coefficient is None else message * coefficient(src, dst, edge).astype(message.dtype)

        def psi(node, agg):
            return agg if bias is None else agg + bias

        layer = message_passing(phi, lambda mb, node: mailbox.sum(mb), psi, backend=self.backend, remat=self.remat)
        out = layer(norm.graph._replace(nodes={"h": x, **norm.nodes}), layout=layout, self_loops=norm.self_loops,
                    loop_edges=norm.loop_edges).nodes
        return _utils.output_graph(graph, sets, out)
