"""Relational graph attention (Busbridge et al., 2019)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.nn.gat import _attention_rho, _heads_out
from jgnn.nn.rgcn import typed_inputs


class RGATConv(nn.Module):
    r"""Relational graph attention (across-relation additive attention, as PyG's ``RGATConv`` defaults).

    With typed weights :math:`g_j^r = W_r x_j \in \mathbb{R}^{H \times C}` and :math:`g_i^r = W_r x_i`:

    .. math::
        e_{ij}^{r,h} = \mathrm{LeakyReLU}(q_r^h \cdot g_i^{r,h} + k_r^h \cdot g_j^{r,h}), \quad
        \alpha_{ij}^{r,h} = \mathrm{softmax}_{(j, r) \in \mathcal{N}(i)}(e_{ij}^{r,h}), \quad
        h_i'^h = \sum_{(j,r)} \alpha_{ij}^{r,h} g_j^{r,h}

    the softmax running over all incoming edges of ``i`` whatever their relation. Heads are concatenated
    (``num_heads * features``) or averaged (``features``), plus a bias. ``add_self_loops`` appends an
    ``i -> i`` edge per node with the dedicated relation id ``num_relations`` (so there are
    ``num_relations + 1`` weight matrices). Input/typing conventions as `RGCNConv` (float features only).
    """

    features: int
    num_relations: int
    num_heads: int = 1
    concat: bool = True
    negative_slope: float = 0.2
    attention_dropout: float = 0.0
    add_self_loops: bool = True
    use_bias: bool = True
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        x, node_type, edge_type = typed_inputs(graph, "RGATConv", num_edge_types=self.num_relations)
        h, c = self.num_heads, self.features
        r = self.num_relations + int(self.add_self_loops)
        init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2, out_axis=-1, batch_axis=(0,))
        weight = self.param("kernel", init, (r, x.shape[-1], h * c), jnp.float32)
        att_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-1, out_axis=-2,
                                                    batch_axis=(0,))
        query = self.param("att_query", att_init, (r, h, c), jnp.float32)
        key = self.param("att_key", att_init, (r, h, c), jnp.float32)
        width = h * c if self.concat else c
        bias = self.param("bias", nn.initializers.zeros, (width,), jnp.float32) if self.use_bias else None
        g = graph._replace(nodes={"h": x, "type": node_type}, edges={"type": edge_type})
        if self.add_self_loops:
            g, layout = _utils.add_self_loops(g, edge_type=self.num_relations), None
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        if drop is not None:
            g = g._replace(edges={**g.edges, **drop.edge_features(g.senders.shape[0])})
        slope, concat = self.negative_slope, self.concat

        def phi(src, dst, edge):
            rel = edge["type"]
            g_src = (src["h"] @ weight[rel]).reshape(h, c)
            g_dst = (dst["h"] @ weight[rel]).reshape(h, c)
            logit = jnp.sum(query[rel] * g_dst, -1) + jnp.sum(key[rel] * g_src, -1)
            message = {"logit": jax.nn.leaky_relu(logit, slope), "value": g_src}
            if drop is not None:
                message["mask"] = drop.scale(edge, h)
            return message

        layer = message_passing(phi, _attention_rho, lambda node, agg: {"h": _heads_out(agg, concat, bias)},
                                backend=self.backend, remat=self.remat)
        out = layer(g, layout=layout).nodes["h"]
        return _utils.with_features(graph, out)
