"""Graph transformer convolution (Shi et al., 2021, "Masked label prediction")."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.nn.gat import _attention_rho, _heads_out, attention_weights


class TransformerConv(_utils.CheckedOptions, nn.Module):
    r"""Multi-head scaled dot-product attention over in-edges, as PyG's ``TransformerConv``.

    With :math:`q_i = W_q x_i + b_q`, :math:`k_j = W_k x_j + b_k`, :math:`v_j = W_v x_j + b_v` (each
    ``H x C``) and :math:`z_{ji} = W_e e_{ji}` when ``edge_dim`` is set (else 0):

    .. math::
        \alpha_{ij}^h = \mathrm{softmax}_{j}\Big(\frac{q_i^h \cdot (k_j^h + z_{ji}^h)}{\sqrt C}\Big), \qquad
        h_i' = \big\Vert_h \sum_j \alpha_{ij}^h (v_j^h + z_{ji}^h)

    Heads are concatenated (``H*C``) or averaged (``concat=False``, ``C``). ``root_weight`` adds
    :math:`r_i = W_s x_i + b_s`; with ``beta`` the two are mixed by
    :math:`\beta_i = \sigma(w_\beta \cdot [h_i' \Vert r_i \Vert h_i' - r_i])`:
    :math:`\beta_i r_i + (1 - \beta_i) h_i'`. ``use_bias`` switches :math:`b_q, b_k, b_v, b_s` (PyG's ``bias``).
    ``attention_dropout`` is PyG's ``dropout`` (rng ``"dropout"``, only when ``deterministic=False``).

    Input: ``graph.nodes`` ``[N, F]`` (or ``{"h": ...}``) or a bipartite pair ``(x_src, x_dst)``; edge
    features as ``graph.edges`` ``[E, edge_dim]`` or ``graph.edges["h"]``. No self-loops are added.
    ``return_attention_weights=True`` returns ``(graph, Attention)``. Parameters (PyG): ``query``, ``key``,
    ``value``, ``skip`` (Dense: ``lin_query``, ``lin_key``, ``lin_value``, ``lin_skip``), ``kernel_edge`` =
    ``lin_edge.weight.T``, ``beta`` = ``lin_beta.weight[0]``.
    """

    features: int
    num_heads: int = 1
    concat: bool = True
    beta: bool = False
    attention_dropout: float = 0.0
    edge_dim: int | None = None
    use_bias: bool = True
    root_weight: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True,
                 return_attention_weights: bool = False):
        sets, x_src, x_dst = _utils.split_nodes(graph, "TransformerConv")
        layout = _utils.check_layout("TransformerConv", layout, self_loops=False, bipartite=sets.bipartite)
        attr = _utils.require_edge_features(graph, "TransformerConv", self.edge_dim)
        h, c = self.num_heads, self.features
        width = h * c if self.concat else c
        lin = lambda name, x, out: _utils.dense(self, out, use_bias=self.use_bias, name=name)(x)
        # node-level projections (PyG applies them before propagating); phi reads them per edge
        q = lin("query", x_dst, h * c)
        k, v = lin("key", x_src, h * c), lin("value", x_src, h * c)
        skip = lin("skip", x_dst, width) if self.root_weight else None
        init = nn.initializers.glorot_uniform()
        w_edge = self.param("kernel_edge", init, (self.edge_dim, h * c), self.param_dtype) \
            if self.edge_dim is not None else None
        w_beta = self.param("beta", nn.initializers.lecun_normal(), (3 * width, 1), self.param_dtype)[:, 0] \
            if self.beta and self.root_weight else None
        q, k, v, skip, w_edge, w_beta, attr = _utils.promote(self.dtype, q, k, v, skip, w_edge, w_beta, attr)
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        edges = {} if attr is None else {"attr": attr}
        edges = _utils.with_dropout_ids(edges, drop, graph_lib.num_edges(graph)) or None
        scale, concat = 1.0 / math.sqrt(c), self.concat

        def phi(src, dst, edge):
            key, value = sets.src(src)["k"].reshape(h, c), sets.src(src)["v"].reshape(h, c)
            if w_edge is not None:
                z = (edge["attr"] @ w_edge).reshape(h, c)
                key, value = key + z, value + z
            message = {"logit": jnp.sum(sets.dst(dst)["q"].reshape(h, c) * key, -1) * scale, "value": value}
            if drop is not None:
                message["mask"] = drop.scale(edge, h).astype(value.dtype)
            return message

        def psi(node, agg):
            out = _heads_out(agg, concat, None)
            if skip is None:
                return out
            root = sets.dst(node)["skip"]
            if w_beta is None:
                return out + root
            gate = jax.nn.sigmoid(jnp.concatenate([out, root, out - root]) @ w_beta)
            return gate * root + (1.0 - gate) * out

        dst_rows = {"q": q} if skip is None else {"q": q, "skip": skip}
        g = sets.graph(graph, sets.rows({"k": k, "v": v}, dst_rows), edges)
        layer = message_passing(phi, _attention_rho, psi, backend=self.backend, remat=self.remat)
        out = _utils.output_graph(graph, sets, sets.output(layer(g, layout=layout).nodes))
        if return_attention_weights:
            return out, attention_weights(g, phi, sets)
        return out
