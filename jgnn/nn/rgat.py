"""Relational graph attention (Busbridge et al., 2019)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.nn.gat import attention_weights
from jgnn.nn.rgcn import block_matmul, relation_types, relation_weights

_MECHANISMS = ("across-relation", "within-relation")
_MODES = ("additive-self-attention", "multiplicative-self-attention")
_MODS = (None, "additive", "scaled", "f-additive", "f-scaled")


def _within_relation_softmax(logit, onehot):
    """Softmax of ``logit`` ``[deg, K]`` over the mailbox rows of each relation (``onehot`` ``[deg, R]``).

    Every relation gets its own column; rows of other relations are masked with the dtype's lowest value
    (finite, so a relation without rows gives uniform weights instead of NaN), and each row keeps its own
    relation's weight."""
    low = jnp.finfo(logit.dtype).min
    hit = onehot[:, :, None] > 0
    per_relation = mailbox.softmax(jnp.where(hit, logit[:, None, :], low))  # [deg, R, K]
    return jnp.sum(jnp.where(hit, per_relation, 0.0), axis=1)


class RGATConv(_utils.CheckedOptions, nn.Module):
    r"""Relational graph attention, as PyG's ``RGATConv``.

    With :math:`g_j^r = W_r x_j`, :math:`g_i^r = W_r x_i \in \mathbb{R}^{H C}` (``H = num_heads``,
    ``C = features``; :math:`W_r` free, ``num_bases`` or ``num_blocks`` as `RGCNConv`), queries
    :math:`q_i = g_i^r Q` and keys :math:`k_j = g_j^r K` (``[H * dim]``) and, with ``edge_dim``, an edge term
    :math:`a_{ji} = (W_e e_{ji}) E`:

    * ``attention_mode="additive-self-attention"`` (``dim = 1``):
      :math:`e = \mathrm{LeakyReLU}(q_i + k_j [+ a_{ji}])`;
      ``"multiplicative-self-attention"``: :math:`e = q_i \odot k_j [\odot a_{ji}]`, ``[H, dim]``;
    * ``attention_mechanism="across-relation"``: softmax over all in-edges of ``i``; ``"within-relation"``:
      over the in-edges of ``i`` with the same relation;
    * ``mod`` (PyG's cardinality-preserving variants): ``"additive"`` adds :math:`w \odot g_j`,
      ``"scaled"`` multiplies by :math:`\mathrm{MLP}(\deg_i)`, ``"f-additive"`` adds 1 to positive
      weights, ``"f-scaled"`` multiplies them by :math:`\deg_i` (in-degree over all relations).

    :math:`h_i' = \sum_j \alpha_{ij} g_j`, heads concatenated (``H * dim * C``) or averaged
    (``dim * C``), plus a bias. PyG adds no self-loops; ``add_self_loops=True`` (jgnn only) appends
    ``i -> i`` edges of the extra relation ``num_relations`` (a ``layout`` must then be built with
    ``self_loops=True``). ``attention_dropout`` is PyG's ``dropout`` (``mod=None`` only).

    Input: ``graph.edges = {"type": int32 [E]}`` (plus ``"h"`` edge features with ``edge_dim``) and node
    features ``graph.nodes`` (array or ``{"h": ...}``). ``return_attention_weights=True`` returns
    ``(graph, Attention)``. Parameters (PyG): ``kernel``/``bases``+``comp``/``blocks`` (``weight``/``basis``+
    ``att``/``weight``), ``query`` (``q``), ``key`` (``k``), ``kernel_edge`` (``lin_edge.weight.T``),
    ``att_edge`` (``e``), ``w``, ``l1``, ``b1``, ``l2``, ``b2``, ``bias``.
    """

    features: int
    num_relations: int
    num_heads: int = 1
    concat: bool = True
    negative_slope: float = 0.2
    attention_dropout: float = 0.0
    add_self_loops: bool = False
    use_bias: bool = True
    num_bases: int | None = None
    num_blocks: int | None = None
    mod: str | None = None
    attention_mechanism: str = "across-relation"
    attention_mode: str = "additive-self-attention"
    dim: int = 1
    edge_dim: int | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    def _check_options(self):
        _utils.check_choice("attention_mechanism", self.attention_mechanism, _MECHANISMS)
        _utils.check_choice("attention_mode", self.attention_mode, _MODES)
        _utils.check_choice("mod", self.mod, _MODS)
        if self.attention_mode == "additive-self-attention" and self.dim != 1:
            raise ValueError("RGATConv: additive-self-attention needs dim=1; use multiplicative-self-attention")
        if self.mod is not None and self.attention_dropout > 0:
            raise ValueError("RGATConv: attention_dropout needs mod=None (as in PyG)")

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True,
                 return_attention_weights: bool = False):
        self._check_options()
        sets, x, _ = _utils.split_nodes(graph, "RGATConv", bipartite_ok=False)
        layout = _utils.check_layout("RGATConv", layout, self_loops=self.add_self_loops)
        types = relation_types(graph, "RGATConv", self.num_relations)
        attr = _utils.require_edge_features(graph, "RGATConv", self.edge_dim)
        h, c, k = self.num_heads, self.features, self.num_heads * self.dim
        r = self.num_relations + int(self.add_self_loops)
        weight, blocks = relation_weights(self, r, x.shape[-1], h * c)
        glorot = nn.initializers.glorot_uniform()
        query = self.param("query", glorot, (h * c, k), self.param_dtype)
        key = self.param("key", glorot, (h * c, k), self.param_dtype)
        edge_params = (self.param("kernel_edge", glorot, (self.edge_dim, h * c), self.param_dtype),
                       self.param("att_edge", glorot, (h * c, k), self.param_dtype)) if attr is not None else None
        mod_params = None
        if self.mod == "additive":
            mod_params = self.param("w", nn.initializers.ones, (c,), self.param_dtype)
        elif self.mod == "scaled":
            mod_params = tuple(self.param(n, init, (c,) if n != "l2" else (c, c), self.param_dtype)
                               for n, init in (("l1", nn.initializers.ones), ("b1", nn.initializers.zeros),
                                               ("l2", nn.initializers.constant(1.0 / c)),
                                               ("b2", nn.initializers.zeros)))
        width = (h if self.concat else 1) * self.dim * c
        bias = self.param("bias", nn.initializers.zeros, (width,), self.param_dtype) if self.use_bias else None
        x, weight, blocks, query, key, edge_params, mod_params, bias, attr = _utils.promote(
            self.dtype, x, weight, blocks, query, key, edge_params, mod_params, bias, attr)
        edges = {graph_lib.TYPE_KEY: types} if attr is None else {graph_lib.TYPE_KEY: types, "attr": attr}
        g = graph._replace(nodes={"h": x}, edges=edges)
        if self.add_self_loops:
            g = _utils.add_self_loops(g, edge_type=self.num_relations)
        if self.mod in ("scaled", "f-scaled"):
            deg = _utils.in_degree(g, backend=self.backend, remat=self.remat, layout=layout).astype(x.dtype)
            if self.mod == "scaled":
                l1, b1, l2, b2 = mod_params
                deg = jax.nn.relu(deg[:, None] * l1 + b1) @ l2 + b2  # [N, C]
            g = g._replace(nodes={**g.nodes, "deg": deg})
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        g = g._replace(edges=_utils.with_dropout_ids(g.edges, drop, graph_lib.num_edges(g)))
        additive, within = self.attention_mode == _MODES[0], self.attention_mechanism == _MECHANISMS[1]
        slope, mod, concat, dim = self.negative_slope, self.mod, self.concat, self.dim

        def project(row, rel):
            return row @ weight[rel] if blocks is None else block_matmul(row, blocks[rel])

        def phi(src, dst, edge):
            rel = edge[graph_lib.TYPE_KEY]
            g_src, g_dst = project(src["h"], rel), project(dst["h"], rel)
            q, kk = g_dst @ query, g_src @ key  # [H * dim]
            a_edge = None if edge_params is None else (edge["attr"] @ edge_params[0]) @ edge_params[1]
            if additive:
                logit = jax.nn.leaky_relu(q + kk if a_edge is None else q + kk + a_edge, slope)
            else:
                logit = q * kk if a_edge is None else q * kk * a_edge
            message = {"logit": logit, "value": g_src.reshape(h, c)}
            if within:
                message["onehot"] = jax.nn.one_hot(rel, r, dtype=logit.dtype)
            if drop is not None:
                message["mask"] = drop.scale(edge, k).astype(logit.dtype)
            return message

        def rho(mb, node):
            logit = mb["logit"]
            alpha = _within_relation_softmax(logit, mb["onehot"]) if within else mailbox.softmax(logit)
            if mod == "f-additive":
                alpha = jnp.where(alpha > 0, alpha + 1.0, alpha)
            elif mod == "f-scaled":
                alpha = alpha * node["deg"]
            if "mask" in mb:
                alpha = alpha * mb["mask"]
            value = mb["value"]  # [deg, H, C]
            alpha = alpha.reshape(alpha.shape[0], h, dim, 1)
            weighted = alpha * value[:, :, None, :]  # [deg, H, dim, C]
            if mod == "additive":
                weighted = weighted + mod_params * value[:, :, None, :]
            return mailbox.sum(weighted)

        def psi(node, agg):  # agg [H, dim, C]
            if mod == "scaled":
                agg = agg * node["deg"]
            out = agg.reshape(-1) if concat else jnp.mean(agg, axis=0).reshape(-1)
            return {"h": out if bias is None else out + bias}

        layer = message_passing(phi, rho, psi, backend=self.backend, remat=self.remat)
        out = _utils.output_graph(graph, sets, layer(g, layout=layout).nodes["h"])
        if return_attention_weights:
            segments, num = None, None
            if within:
                segments = g.receivers * r + g.edges[graph_lib.TYPE_KEY]
                num = graph_lib.num_nodes(g) * r
            return out, attention_weights(g, phi, sets, segments, num)
        return out
