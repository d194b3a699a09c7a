"""Heterogeneous graph transformer (Hu et al., 2020)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.nn.rgcn import typed_inputs


def _typed_init(scale_axis_in=-2, scale_axis_out=-1):
    return nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=scale_axis_in,
                                            out_axis=scale_axis_out, batch_axis=(0,))


class HGTConv(nn.Module):
    r"""Heterogeneous graph transformer layer (Hu et al., 2020), close to PyG's ``HGTConv``.

    For an edge :math:`s \to t` of type :math:`\phi` with node types :math:`\tau(s), \tau(t)`, and heads
    ``h = 1..H`` of width :math:`d = \mathrm{features} / H`:

    .. math::
        K^h(s) = \text{K-Linear}_{\tau(s)}(x_s)^h, \quad Q^h(t) = \text{Q-Linear}_{\tau(t)}(x_t)^h, \quad
        V^h(s) = \text{V-Linear}_{\tau(s)}(x_s)^h

        \mathrm{ATT}^h(s, \phi, t) = \mathrm{softmax}_{s \in \mathcal{N}(t)}
            \Big(K^h(s)\, W^{\phi,h}_{att}\, Q^h(t)^\top \cdot \frac{\mu_{\phi,h}}{\sqrt d}\Big), \qquad
        \mathrm{MSG}^h(s, \phi) = V^h(s)\, W^{\phi,h}_{msg}

        \tilde H_t = \Big\Vert_h \sum_{s} \mathrm{ATT}^h \, \mathrm{MSG}^h, \qquad
        h_t' = \sigma(\alpha_{\tau(t)})\, \text{A-Linear}_{\tau(t)}(\mathrm{GELU}(\tilde H_t))
              + (1 - \sigma(\alpha_{\tau(t)}))\, x_t

    The skip term is used when the input width equals ``features`` (otherwise
    :math:`h_t' = \text{A-Linear}_{\tau(t)}(\mathrm{GELU}(\tilde H_t))`). The relation prior :math:`\mu` is
    per edge type and head (initialised to 1); :math:`\alpha` per node type (initialised to 1).
    Input: ``graph.nodes = {"h": float [N, F], "type": int32}``, ``graph.edges = {"type": int32}``.
    Output width: ``features`` (split across ``num_heads`` heads). Nodes without in-edges get
    ``A-Linear(GELU(0))`` mixed with their skip.
    """

    features: int
    num_heads: int
    num_node_types: int
    num_edge_types: int
    attention_dropout: float = 0.0
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        x, node_type, edge_type = typed_inputs(graph, "HGTConv", num_node_types=self.num_node_types,
                                               num_edge_types=self.num_edge_types)
        if self.features % self.num_heads:
            raise ValueError(f"HGTConv: features={self.features} is not divisible by num_heads={self.num_heads}")
        t, f, heads = self.num_node_types, self.features, self.num_heads
        d = f // heads
        f_in = x.shape[-1]
        zeros = nn.initializers.zeros
        wk = self.param("k_kernel", _typed_init(), (t, f_in, f), jnp.float32)
        wq = self.param("q_kernel", _typed_init(), (t, f_in, f), jnp.float32)
        wv = self.param("v_kernel", _typed_init(), (t, f_in, f), jnp.float32)
        bk, bq, bv = (self.param(n, zeros, (t, f), jnp.float32) for n in ("k_bias", "q_bias", "v_bias"))
        w_att = self.param("att_relation", _typed_init(), (self.num_edge_types, heads, d, d), jnp.float32)
        w_msg = self.param("msg_relation", _typed_init(), (self.num_edge_types, heads, d, d), jnp.float32)
        prior = self.param("relation_prior", nn.initializers.ones, (self.num_edge_types, heads), jnp.float32)
        wa = self.param("a_kernel", _typed_init(), (t, f, f), jnp.float32)
        ba = self.param("a_bias", zeros, (t, f), jnp.float32)
        skip = self.param("skip", nn.initializers.ones, (t,), jnp.float32) if f_in == f else None
        g = graph._replace(nodes={"h": x, "type": node_type}, edges={"type": edge_type})
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        if drop is not None:
            g = g._replace(edges={**g.edges, **drop.edge_features(g.senders.shape[0])})
        scale = 1.0 / math.sqrt(d)

        def phi(src, dst, edge):
            s, tt, rel = src["type"], dst["type"], edge["type"]
            k = (src["h"] @ wk[s] + bk[s]).reshape(heads, d)
            q = (dst["h"] @ wq[tt] + bq[tt]).reshape(heads, d)
            v = (src["h"] @ wv[s] + bv[s]).reshape(heads, d)
            k_rel = jnp.einsum("hd,hde->he", k, w_att[rel])
            message = {"logit": jnp.sum(k_rel * q, -1) * prior[rel] * scale,
                       "value": jnp.einsum("hd,hde->he", v, w_msg[rel])}
            if drop is not None:
                message["mask"] = drop.scale(edge, heads)
            return message

        def rho(mb, node):
            alpha = mailbox.softmax(mb["logit"])
            if "mask" in mb:
                alpha = alpha * mb["mask"]
            return mailbox.sum(alpha[..., None] * mb["value"]).reshape(f)

        def psi(node, agg):
            tt = node["type"]
            out = jax.nn.gelu(agg) @ wa[tt] + ba[tt]
            if skip is not None:
                gate = jax.nn.sigmoid(skip[tt])
                out = gate * out + (1.0 - gate) * node["h"]
            return {"h": out}

        layer = message_passing(phi, rho, psi, backend=self.backend, remat=self.remat)
        out = layer(g, layout=layout).nodes["h"]
        return _utils.with_features(graph, out)
