"""Graph attention: GAT (Veličković et al., 2018) and GATv2 (Brody et al., 2022)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils


def _attention_rho(mb, node):
    """Softmax over the incoming edges per head, optional dropout mask, weighted sum of the values."""
    alpha = mailbox.softmax(mb["logit"])  # [deg, H]
    if "mask" in mb:
        alpha = alpha * mb["mask"]
    return mailbox.sum(alpha[..., None] * mb["value"])  # [H, C]


def _heads_out(agg, concat: bool, bias):
    out = agg.reshape(-1) if concat else jnp.mean(agg, axis=0)
    return out if bias is None else out + bias


class _HeadAttention(nn.Module):
    """What GAT and GATv2 share: options, self-loops, dropout, per-head softmax, head concat/mean and bias.

    Subclasses define `edge_scores`, which makes their parameters and returns ``score(src, dst) ->
    (logit [H], value [H, C])`` for one edge.
    """

    features: int
    num_heads: int = 1
    concat: bool = True
    negative_slope: float = 0.2
    dropout: float = 0.0
    attention_dropout: float = 0.0
    add_self_loops: bool = True
    use_bias: bool = True
    backend: str = "auto"
    remat: str = "auto"

    def edge_scores(self, d_in: int, heads: int, width: int):
        raise NotImplementedError

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        graph_lib.validate(graph)
        x = _utils.node_features(graph)
        h, c = self.num_heads, self.features
        score = self.edge_scores(x.shape[-1], h, c)
        width = h * c if self.concat else c
        bias = self.param("bias", nn.initializers.zeros, (width,), jnp.float32) if self.use_bias else None
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        g = _utils.add_self_loops(graph) if self.add_self_loops else graph
        if self.add_self_loops:
            layout = None  # the layout describes the graph without the self-loops
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        concat = self.concat

        def phi(src, dst, edge):
            logit, value = score(src, dst)
            message = {"logit": logit, "value": value}
            if drop is not None:
                message["mask"] = drop.scale(edge, h)
            return message

        layer = message_passing(phi, _attention_rho, lambda node, agg: _heads_out(agg, concat, bias),
                                backend=self.backend, remat=self.remat)
        edges = None if drop is None else drop.edge_features(graph_lib.num_edges(g))
        out = layer(g._replace(nodes=x, edges=edges), layout=layout).nodes
        return _utils.with_features(graph, out)


class GATConv(_HeadAttention):
    r"""Graph attention layer, as PyG's ``GATConv``.

    With :math:`z_j = W x_j \in \mathbb{R}^{H \times C}` (``H = num_heads``, ``C = features``):

    .. math::
        e_{ij}^h = \mathrm{LeakyReLU}(a_s^h \cdot z_j^h + a_d^h \cdot z_i^h), \quad
        \alpha_{ij}^h = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}^h), \quad
        h_i'^h = \sum_j \alpha_{ij}^h z_j^h

    and the heads are concatenated (width ``H*C``) or averaged (``concat=False``, width ``C``), plus a bias.
    ``dropout`` drops input features; ``attention_dropout`` drops normalised coefficients
    :math:`\alpha` (rng collection ``"dropout"``; both only when ``deterministic=False``).
    ``add_self_loops`` appends an ``i -> i`` edge per node. Nodes without in-edges get the bias.
    """

    def edge_scores(self, d_in: int, heads: int, width: int):
        kernel = self.param("kernel", nn.initializers.glorot_uniform(), (d_in, heads * width), jnp.float32)
        att_src = self.param("att_src", nn.initializers.glorot_uniform(), (heads, width), jnp.float32)
        att_dst = self.param("att_dst", nn.initializers.glorot_uniform(), (heads, width), jnp.float32)
        slope = self.negative_slope

        def score(src, dst):
            z_src = (src @ kernel).reshape(heads, width)
            z_dst = (dst @ kernel).reshape(heads, width)
            logit = jnp.sum(z_src * att_src, -1) + jnp.sum(z_dst * att_dst, -1)
            return jax.nn.leaky_relu(logit, slope), z_src

        return score


class GATv2Conv(_HeadAttention):
    r"""GATv2 (Brody et al., 2022), as PyG's ``GATv2Conv`` (``share_weights=False``).

    With :math:`l_j = W_l x_j`, :math:`r_i = W_r x_i` (each ``H x C``):

    .. math::
        e_{ij}^h = a^h \cdot \mathrm{LeakyReLU}(l_j^h + r_i^h), \quad
        \alpha_{ij}^h = \mathrm{softmax}_{j}(e_{ij}^h), \quad h_i'^h = \sum_j \alpha_{ij}^h l_j^h

    Heads concatenated (``H*C``) or averaged (``C``), plus a bias; dropout options as `GATConv`.
    """

    def edge_scores(self, d_in: int, heads: int, width: int):
        w_l = self.param("kernel_src", nn.initializers.glorot_uniform(), (d_in, heads * width), jnp.float32)
        w_r = self.param("kernel_dst", nn.initializers.glorot_uniform(), (d_in, heads * width), jnp.float32)
        att = self.param("att", nn.initializers.glorot_uniform(), (heads, width), jnp.float32)
        slope = self.negative_slope

        def score(src, dst):
            l_src = (src @ w_l).reshape(heads, width)
            r_dst = (dst @ w_r).reshape(heads, width)
            return jnp.sum(jax.nn.leaky_relu(l_src + r_dst, slope) * att, -1), l_src

        return score
