"""Graph attention: GAT (Veličković et al., 2018) and GATv2 (Brody et al., 2022)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import layout as layout_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils

# PyG's fill_value reductions for the edge features of added self-loops, over each node's other in-edges
_FILL_REDUCE = {"mean": "sum", "add": "sum", "sum": "sum", "max": "max", "min": "min"}


def _attention_rho(mb, node):
    """Softmax over the incoming edges per head, optional dropout mask, weighted sum of the values."""
    alpha = mailbox.softmax(mb["logit"])  # [deg, H]
    if "mask" in mb:
        alpha = alpha * mb["mask"]
    return mailbox.sum(alpha[..., None] * mb["value"])  # [H, C]


def _heads_out(agg, concat: bool, bias):
    out = agg.reshape(-1) if concat else jnp.mean(agg, axis=0)
    return out if bias is None else out + bias


def attention_weights(graph: jraph.GraphsTuple, phi, sets: _utils.NodeSets, segments=None,
                      num_segments: int | None = None) -> _utils.Attention:
    """The normalised attention of every edge of ``graph`` (the graph message passing ran on).

    Evaluates ``phi`` (which returns ``"logit"`` and optionally a dropout ``"mask"``) per edge as the reference
    program does, and normalises over ``segments`` (default: the receivers; ``num_segments`` with them)."""
    messages = _utils.edge_messages(graph, phi)
    if segments is None:
        segments, num_segments = graph.receivers, graph_lib.num_nodes(graph)
    alpha = _utils.edge_softmax(messages["logit"], segments, num_segments)
    if "mask" in messages:
        alpha = alpha * messages["mask"]
    receivers = graph.receivers - sets.num_src if sets.bipartite else graph.receivers
    return _utils.Attention(graph.senders, receivers, alpha)


def loop_fill(looped: jraph.GraphsTuple, attr_width: int, fill_value, *, backend, remat, layout):
    """Edge features for the self-loops a layer appends (PyG's ``fill_value``), per destination node.

    ``looped`` carries ``edges = {"attr", "keep", "new"}``: the loops were appended with zero features, and the
    reductions run over each node's other in-edges (not existing loops, not the new ones), as PyG does after
    ``remove_self_loops``. Nodes without such edges get 0. Returns ``[N, D]``.
    """
    n = graph_lib.num_nodes(looped)
    if not isinstance(fill_value, str):
        return jnp.broadcast_to(jnp.asarray(fill_value, jnp.float32), (n, attr_width))
    _utils.check_choice("fill_value", fill_value, sorted(_FILL_REDUCE))
    reduce = _FILL_REDUCE[fill_value]
    probe = looped._replace(nodes=jnp.zeros((n,), jnp.float32))
    run = lambda phi, how="sum": _utils.aggregate(probe, phi, how, backend=backend, remat=remat, layout=layout)
    real = lambda edge: edge["keep"] & ~edge["new"]
    count = lambda edge: real(edge).astype(jnp.float32)
    if reduce == "sum":
        stats = run(lambda src, dst, edge: {"v": jnp.where(real(edge), edge["attr"], 0.0), "n": count(edge)})
        total, n_real = stats["v"], stats["n"][:, None]
        return total / jnp.maximum(n_real, 1.0) if fill_value == "mean" else total
    never_wins = jnp.finfo(jnp.float32).max * (1.0 if reduce == "min" else -1.0)
    extreme = run(lambda src, dst, edge: jnp.where(real(edge), edge["attr"], never_wins), reduce)
    return jnp.where(run(lambda src, dst, edge: count(edge))[:, None] > 0, extreme, 0.0)


class _HeadAttention(_utils.CheckedOptions, nn.Module):
    """What GAT and GATv2 share: options, self-loops, edge features, dropout, per-head softmax, head
    concat/mean, residual and bias.

    Subclasses define `edge_scores`, which makes their parameters and returns ``score(src, dst, attr) ->
    (logit [H], value [H, C])`` for one edge (``attr`` is its edge feature row, or ``None``).
    """

    features: int
    num_heads: int = 1
    concat: bool = True
    negative_slope: float = 0.2
    dropout: float = 0.0
    attention_dropout: float = 0.0
    add_self_loops: bool = True
    edge_dim: int | None = None
    fill_value: Any = "mean"
    use_bias: bool = True
    residual: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    def edge_scores(self, sets: _utils.NodeSets, d_src: int, d_dst: int):
        raise NotImplementedError

    def _params(self, name, shape):
        return self.param(name, nn.initializers.glorot_uniform(), shape, self.param_dtype)

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True,
                 return_attention_weights: bool = False):
        name = type(self).__name__
        sets, x_src, x_dst = _utils.split_nodes(graph, name)
        layout = _utils.check_layout(name, layout, self_loops=self.add_self_loops, bipartite=sets.bipartite)
        attr = _utils.require_edge_features(graph, name, self.edge_dim)
        h, c = self.num_heads, self.features
        score = self.edge_scores(sets, x_src.shape[-1], x_dst.shape[-1])
        width = h * c if self.concat else c
        bias = self.param("bias", nn.initializers.zeros, (width,), self.param_dtype) if self.use_bias else None
        res = self._params("residual", (x_dst.shape[-1], width)) if self.residual else None
        x_src, x_dst, bias, res = _utils.promote(self.dtype, x_src, x_dst, bias, res)
        drop_in = nn.Dropout(self.dropout)
        x_src = drop_in(x_src, deterministic=deterministic)
        x_dst = x_src if not sets.bipartite else drop_in(x_dst, deterministic=deterministic)
        rows = sets.rows({"h": x_src}, {"h": x_dst})
        g = sets.graph(graph, rows)
        loop_edges = None
        inner_loops = False
        if self.add_self_loops:
            e, n_loops = graph_lib.num_edges(graph), min(sets.num_src, sets.num_dst)
            # Existing loops are masked out, unless the layout knows there are none (`GraphLayout.own_loops`;
            # jraph-padded batches have loops on the padding node): then no per-edge flag or select, as by hand.
            per_edge, per_loop = {}, {}
            if not (layout is not None and layout.own_loops is False):
                per_edge, per_loop = {"keep": ~_utils.existing_loops(graph)}, {"keep": jnp.ones((n_loops,), bool)}
            if attr is not None:
                per_edge |= {"attr": attr, "new": jnp.zeros((e,), bool)}
                per_loop |= {"attr": jnp.zeros((n_loops, attr.shape[-1]), attr.dtype),
                             "new": jnp.ones((n_loops,), bool)}
            looped = lambda: _utils.loop_graph(g._replace(edges=None), sets, per_edge, per_loop)  # of g as it is then
            if attr is not None:
                fill = loop_fill(looped(), attr.shape[-1], self.fill_value, backend=self.backend, remat=self.remat,
                                 layout=layout)
                g = g._replace(nodes=sets.with_dst(g.nodes, fill=fill))
            if sets.bipartite:  # the loops join source i to destination i: appended here
                g = looped()
            else:  # appended inside the compiled layer, which then sees that every node sends and receives one
                g, loop_edges, inner_loops = g._replace(edges=per_edge or None), per_loop or None, True
        elif attr is not None:
            g = g._replace(edges={"attr": attr})
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        e = graph_lib.num_edges(g)
        g = g._replace(edges=_utils.with_dropout_ids(g.edges or {}, drop, e) or None)
        if inner_loops and drop is not None:  # the loops' ids follow the edges', as appended
            loop_edges = {**(loop_edges or {}), **{k: v + e for k, v in drop.edge_features(n_loops).items()}}
        concat = self.concat

        def phi(src, dst, edge):
            edge_attr = None
            if edge is not None and "attr" in edge:
                edge_attr = edge["attr"]
                if "new" in edge:  # an appended self-loop takes its node's fill value
                    edge_attr = jnp.where(edge["new"], sets.dst(dst)["fill"], edge_attr)
            logit, value = score(sets.src(src), sets.dst(dst), edge_attr)
            if edge is not None and "keep" in edge:  # existing self-loops are replaced: mask them out
                logit = jnp.where(edge["keep"], logit, -jnp.inf)
            message = {"logit": logit, "value": value}
            if drop is not None:
                message["mask"] = drop.scale(edge, h).astype(value.dtype)
            return message

        def psi(node, agg):
            out = _heads_out(agg, concat, None)
            if res is not None:
                out = out + sets.dst(node)["h"] @ res
            return out if bias is None else out + bias

        layer = message_passing(phi, _attention_rho, psi, backend=self.backend, remat=self.remat)
        out = _utils.output_graph(graph, sets, sets.output(
            layer(g, layout=layout, self_loops=inner_loops, loop_edges=loop_edges).nodes))
        if return_attention_weights:
            return out, attention_weights(layout_lib.append_loops(g, loop_edges) if inner_loops else g, phi, sets)
        return out


class GATConv(_HeadAttention):
    r"""Graph attention layer, as PyG's ``GATConv``.

    With :math:`z_j = W_s x_j`, :math:`z_i = W_d x_i \in \mathbb{R}^{H \times C}` (``H = num_heads``,
    ``C = features``; one shared :math:`W` unless the input is bipartite) and edge features
    :math:`z_{ji} = W_e e_{ji}` when ``edge_dim`` is set:

    .. math::
        e_{ij}^h = \mathrm{LeakyReLU}(a_s^h \cdot z_j^h + a_d^h \cdot z_i^h + a_e^h \cdot z_{ji}^h), \quad
        \alpha_{ij}^h = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}^h), \quad
        h_i'^h = \sum_j \alpha_{ij}^h z_j^h

    The heads are concatenated (width ``H*C``) or averaged (``concat=False``, width ``C``), then
    ``residual`` adds :math:`W_r x_i` and a bias is added.

    Input: ``graph.nodes`` ``[N, F]`` (or ``{"h": ...}``), or a bipartite pair ``(x_src [N_s, F_s],
    x_dst [N_d, F_d])``; edge features (with ``edge_dim``) as ``graph.edges`` ``[E, edge_dim]`` or
    ``graph.edges["h"]``. ``add_self_loops`` removes existing self-loops and adds one per node (PyG semantics;
    under ``jit`` the existing ones are masked with a ``-inf`` logit); their edge features come from
    ``fill_value`` (a number, a ``[edge_dim]`` array, or ``"mean"``/``"add"``/``"max"``/``"min"`` over the
    node's other in-edges). A ``layout`` must be built with ``self_loops=add_self_loops``.
    ``return_attention_weights=True`` returns ``(graph, Attention)``.

    ``attention_dropout`` drops normalised coefficients (PyG's ``dropout``); ``dropout`` drops input
    features (jgnn only); both use rng ``"dropout"`` when ``deterministic=False``.
    Parameters (PyG): ``kernel`` = ``lin.weight.T`` (bipartite: ``kernel_src``/``kernel_dst``), ``att_src``,
    ``att_dst``, ``att_edge`` ``[H, C]``, ``kernel_edge`` = ``lin_edge.weight.T``, ``residual`` =
    ``res.weight.T``, ``bias``.
    """

    def edge_scores(self, sets: _utils.NodeSets, d_src: int, d_dst: int):
        heads, width = self.num_heads, self.features
        if sets.bipartite:
            w_src = self._params("kernel_src", (d_src, heads * width))
            w_dst = self._params("kernel_dst", (d_dst, heads * width))
        else:
            w_src = w_dst = self._params("kernel", (d_src, heads * width))
        att_src = self._params("att_src", (heads, width))
        att_dst = self._params("att_dst", (heads, width))
        edge_params = (self._params("kernel_edge", (self.edge_dim, heads * width)),
                       self._params("att_edge", (heads, width))) if self.edge_dim is not None else None
        w_src, w_dst, att_src, att_dst, edge_params = _utils.promote(self.dtype, w_src, w_dst, att_src, att_dst,
                                                                     edge_params)
        slope = self.negative_slope

        def score(src, dst, attr):
            z_src = (src["h"] @ w_src).reshape(heads, width)
            z_dst = (dst["h"] @ w_dst).reshape(heads, width)
            logit = jnp.sum(z_src * att_src, -1) + jnp.sum(z_dst * att_dst, -1)
            if edge_params is not None:
                w_edge, att_edge = edge_params
                logit = logit + jnp.sum((attr.astype(w_edge.dtype) @ w_edge).reshape(heads, width) * att_edge, -1)
            return jax.nn.leaky_relu(logit, slope), z_src

        return score


class GATv2Conv(_HeadAttention):
    r"""GATv2 (Brody et al., 2022), as PyG's ``GATv2Conv``.

    With :math:`l_j = W_l x_j + b_l`, :math:`r_i = W_r x_i + b_r` (each ``H x C``; ``share_weights`` uses
    :math:`W_l, b_l` for both) and :math:`z_{ji} = W_e e_{ji}` when ``edge_dim`` is set:

    .. math::
        e_{ij}^h = a^h \cdot \mathrm{LeakyReLU}(l_j^h + r_i^h + z_{ji}^h), \quad
        \alpha_{ij}^h = \mathrm{softmax}_{j}(e_{ij}^h), \quad h_i'^h = \sum_j \alpha_{ij}^h l_j^h

    Heads concatenated (``H*C``) or averaged (``C``), then ``residual`` and the bias; inputs, self-loops,
    ``fill_value``, dropout and ``return_attention_weights`` as `GATConv`. ``use_bias`` also switches the
    biases of :math:`W_l, W_r` (as PyG's ``bias``). Parameters (PyG): ``kernel_src``/``bias_src`` = ``lin_l``,
    ``kernel_dst``/``bias_dst`` = ``lin_r``, ``att`` ``[H, C]``, ``kernel_edge``, ``residual``, ``bias``.
    """

    share_weights: bool = False

    def edge_scores(self, sets: _utils.NodeSets, d_src: int, d_dst: int):
        heads, width = self.num_heads, self.features
        lin_bias = lambda name: self.param(name, nn.initializers.zeros, (heads * width,), self.param_dtype) \
            if self.use_bias else None
        w_l, b_l = self._params("kernel_src", (d_src, heads * width)), lin_bias("bias_src")
        if self.share_weights:
            w_r, b_r = w_l, b_l
        else:
            w_r, b_r = self._params("kernel_dst", (d_dst, heads * width)), lin_bias("bias_dst")
        att = self._params("att", (heads, width))
        w_edge = self._params("kernel_edge", (self.edge_dim, heads * width)) if self.edge_dim is not None else None
        w_l, b_l, w_r, b_r, att, w_edge = _utils.promote(self.dtype, w_l, b_l, w_r, b_r, att, w_edge)
        slope = self.negative_slope
        linear = lambda x, w, b: x @ w if b is None else x @ w + b

        def score(src, dst, attr):
            l_src = linear(src["h"], w_l, b_l).reshape(heads, width)
            r_dst = linear(dst["h"], w_r, b_r).reshape(heads, width)
            z = l_src + r_dst
            if w_edge is not None:
                z = z + (attr.astype(w_edge.dtype) @ w_edge).reshape(heads, width)
            return jnp.sum(jax.nn.leaky_relu(z, slope) * att, -1), l_src

        return score
