"""Heterogeneous graph transformer (Hu et al., 2020)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.nn.rgcn import typed_inputs


class HGTConv(_utils.CheckedOptions, nn.Module):
    r"""Heterogeneous graph transformer layer (Hu et al., 2020), as PyG's ``HGTConv``.

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

    with the exact (erf) GELU. The skip term is used for node types whose input width equals ``features``
    (otherwise :math:`h_t' = \text{A-Linear}_{\tau(t)}(\mathrm{GELU}(\tilde H_t))`). The relation prior
    :math:`\mu` is per edge type and head (initialised to 1); :math:`\alpha` per node type (initialised to 1).

    Input: ``graph.nodes = {"h": float [N, F], "type": int32}``, ``graph.edges = {"type": int32}``.
    ``in_features`` (PyG's per-type ``in_channels`` dict, ``{node type: width}``) gives each node type its own
    width: the features of a type-``t`` node are the first ``in_features[t]`` columns of ``"h"`` (the rest is
    ignored). Output width: ``features`` (split across ``num_heads`` heads). Nodes without in-edges get
    ``A-Linear(GELU(0))`` mixed with their skip (PyG returns only node types that receive edges).
    Parameters (PyG): ``k_kernel``/``q_kernel``/``v_kernel`` ``[T, F, features]`` and biases (``kqv_lin``
    split in three; with ``in_features``: ``{k,q,v}_kernel_{t}`` ``[in_features[t], features]``),
    ``att_relation``/``msg_relation`` ``[E_t, H, d, d]`` (``k_rel``/``v_rel`` weight ``[h * E_t + e]``),
    ``relation_prior`` (``p_rel``), ``a_kernel``/``a_bias`` (``out_lin``), ``skip``.
    """

    features: int
    num_heads: int
    num_node_types: int
    num_edge_types: int
    attention_dropout: float = 0.0
    in_features: Mapping[int, int] | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    def _typed_kernels(self, name: str, f_in: int):
        """``[T, f_in, features]``: one stacked weight, or per-type ones (``in_features``) padded with zero rows
        past each type's width, so that a node's extra columns never count."""
        t, f = self.num_node_types, self.features
        if self.in_features is None:
            return self.param(name, _utils.typed_init(), (t, f_in, f), self.param_dtype)
        glorot = nn.initializers.glorot_uniform()
        per_type = [self.param(f"{name}_{i}", glorot, (self.in_features[i], f), self.param_dtype) for i in range(t)]
        return jnp.stack([jnp.pad(w, ((0, f_in - w.shape[0]), (0, 0))) for w in per_type])

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        x, node_type, edge_type = typed_inputs(graph, "HGTConv", num_node_types=self.num_node_types,
                                               num_edge_types=self.num_edge_types)
        layout = _utils.check_layout("HGTConv", layout, self_loops=False)
        if self.features % self.num_heads:
            raise ValueError(f"HGTConv: features={self.features} is not divisible by num_heads={self.num_heads}")
        t, f, heads = self.num_node_types, self.features, self.num_heads
        d, f_in = f // heads, x.shape[-1]
        widths = [f_in] * t if self.in_features is None else [self.in_features.get(i) for i in range(t)]
        if None in widths or max(widths) > f_in:
            raise ValueError(f"HGTConv: in_features must give a width <= {f_in} (the width of \"h\") for each of "
                             f"the {t} node types, got {dict(self.in_features)}")
        zeros = nn.initializers.zeros
        wk, wq, wv = (self._typed_kernels(n, f_in) for n in ("k_kernel", "q_kernel", "v_kernel"))
        bk, bq, bv = (self.param(n, zeros, (t, f), self.param_dtype) for n in ("k_bias", "q_bias", "v_bias"))
        w_att = self.param("att_relation", _utils.typed_init(), (self.num_edge_types, heads, d, d), self.param_dtype)
        w_msg = self.param("msg_relation", _utils.typed_init(), (self.num_edge_types, heads, d, d), self.param_dtype)
        prior = self.param("relation_prior", nn.initializers.ones, (self.num_edge_types, heads), self.param_dtype)
        wa = self.param("a_kernel", _utils.typed_init(), (t, f, f), self.param_dtype)
        ba = self.param("a_bias", zeros, (t, f), self.param_dtype)
        has_skip = [w == f for w in widths]
        skip = self.param("skip", nn.initializers.ones, (t,), self.param_dtype) if any(has_skip) else None
        x, wk, wq, wv, bk, bq, bv, w_att, w_msg, prior, wa, ba, skip = _utils.promote(
            self.dtype, x, wk, wq, wv, bk, bq, bv, w_att, w_msg, prior, wa, ba, skip)
        skip_mask = jnp.asarray(has_skip)
        g = graph._replace(nodes={"h": x, "type": node_type}, edges={"type": edge_type})
        drop = _utils.attention_dropout(self, self.attention_dropout, deterministic)
        g = g._replace(edges=_utils.with_dropout_ids(g.edges, drop, graph_lib.num_edges(g)))
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
                message["mask"] = drop.scale(edge, heads).astype(k.dtype)
            return message

        def rho(mb, node):
            alpha = mailbox.softmax(mb["logit"])
            if "mask" in mb:
                alpha = alpha * mb["mask"]
            return mailbox.sum(alpha[..., None] * mb["value"]).reshape(f)

        def psi(node, agg):
            tt = node["type"]
            out = jax.nn.gelu(agg, approximate=False) @ wa[tt] + ba[tt]
            if skip is not None:
                gate = jax.nn.sigmoid(skip[tt])
                mixed = gate * out + (1.0 - gate) * node["h"][:f]
                out = jnp.where(skip_mask[tt], mixed, out)
            return {"h": out}

        layer = message_passing(phi, rho, psi, backend=self.backend, remat=self.remat)
        out = layer(g, layout=layout).nodes["h"]
        return _utils.with_features(graph, out)
