"""Principal neighbourhood aggregation (Corso et al., 2020)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils


def _var(mb):
    mean = mailbox.mean(mb)
    return mailbox.mean(mb * mb) - mean * mean


def _std(mb):
    out = jnp.sqrt(jnp.maximum(_var(mb), 1e-5))  # PyG's StdAggregation: no gradient blow-up at 0
    return jnp.where(out <= math.sqrt(1e-5), 0.0, out)


AGGREGATORS: dict[str, Callable] = {"mean": mailbox.mean, "sum": mailbox.sum, "max": mailbox.max,
                                    "min": mailbox.min, "var": _var, "std": _std}

# scaler(out, degree, avg_lin, avg_log): PyG's DegreeScalerAggregation
SCALERS: dict[str, Callable] = {
    "identity": lambda out, d, lin, log: out,
    "amplification": lambda out, d, lin, log: out * (jnp.log(d + 1.0) / log),
    "attenuation": lambda out, d, lin, log: out * (log / jnp.log(jnp.maximum(d, 1.0) + 1.0)),
    "linear": lambda out, d, lin, log: out * (d / lin),
    "inverse_linear": lambda out, d, lin, log: out * (lin / jnp.maximum(d, 1.0)),
}


def degree_averages(histogram: Sequence[int]) -> tuple[float, float]:
    """``(avg_deg_lin, avg_deg_log)`` of an in-degree histogram (``histogram[d]`` nodes of degree ``d``)."""
    hist = np.asarray(histogram, np.float64)
    if hist.ndim != 1 or hist.sum() <= 0:
        raise ValueError("PNAConv: deg must be a non-empty 1-D degree histogram with at least one node")
    bins = np.arange(hist.shape[0])
    return float((bins * hist).sum() / hist.sum()), float((np.log(bins + 1) * hist).sum() / hist.sum())


class _TowerMLP(nn.Module):
    """``towers`` independent MLPs applied to ``[..., towers, d_in]``: Dense, then (act, Dense) ``layers - 1``
    times (PyG's per-tower ``Sequential``). Parameters ``kernel_l`` ``[towers, d_in, d_out]``, ``bias_l``."""

    towers: int
    width: int
    layers: int
    act: Callable
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h):
        for layer in range(self.layers):
            if layer:
                h = self.act(h)
            kernel = self.param(f"kernel_{layer}", _utils.typed_init(), (self.towers, h.shape[-1], self.width),
                                self.param_dtype)
            bias = self.param(f"bias_{layer}", nn.initializers.zeros, (self.towers, self.width), self.param_dtype)
            h, kernel, bias = _utils.promote(self.dtype, h, kernel, bias)
            h = jnp.einsum("...ti,tio->...to", h, kernel) + bias
        return h


class PNAConv(_utils.CheckedOptions, nn.Module):
    r"""Principal neighbourhood aggregation, as PyG's ``PNAConv``.

    Per tower ``t`` (``towers`` of them): messages :math:`m_{ji} = \mathrm{pre}_t([x_i \Vert x_j \Vert
    W_e e_{ji}])` (the edge term when ``edge_dim`` is set); each ``aggregators`` entry (``mean``, ``sum``,
    ``max``, ``min``, ``var``, ``std``) reduces them and each ``scalers`` entry (``identity``,
    ``amplification``, ``attenuation``, ``linear``, ``inverse_linear``) rescales by the in-degree against the
    averages of the degree histogram ``deg`` (PyG's ``deg``; learnable with ``train_norm``); then
    :math:`h_i' = W \big\Vert_t \mathrm{post}_t([x_i \Vert \text{scaled aggregates}]) + b`.
    ``divide_input`` splits the input features over the towers (else every tower sees all of them).
    Input ``[N, F]`` (or ``{"h": ...}``); output width ``features`` (divisible by ``towers``).
    Parameters (PyG): ``edge_encoder`` (Dense), ``pre``/``post`` (`_TowerMLP`: PyG's ``pre_nns``/``post_nns``
    stacked over towers), ``lin`` (Dense), ``avg_deg_lin``/``avg_deg_log`` with ``train_norm``.
    """

    features: int
    aggregators: Sequence[str]
    scalers: Sequence[str]
    deg: Sequence[int]
    edge_dim: int | None = None
    towers: int = 1
    pre_layers: int = 1
    post_layers: int = 1
    divide_input: bool = False
    act: Callable = jax.nn.relu
    train_norm: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        for a in self.aggregators:
            _utils.check_choice("aggregators entry", a, sorted(AGGREGATORS))
        for s in self.scalers:
            _utils.check_choice("scalers entry", s, sorted(SCALERS))
        sets, x, _ = _utils.split_nodes(graph, "PNAConv", bipartite_ok=False)
        layout = _utils.check_layout("PNAConv", layout, self_loops=False)
        t, f = self.towers, x.shape[-1]
        if self.features % t or (self.divide_input and f % t):
            raise ValueError(f"PNAConv: features={self.features} (and the input width {f} with divide_input) "
                             f"must be divisible by towers={t}")
        f_in = f // t if self.divide_input else f
        avg_lin, avg_log = degree_averages(self.deg)
        if self.train_norm:
            avg_lin = self.param("avg_deg_lin", nn.initializers.constant(avg_lin), (), self.param_dtype)
            avg_log = self.param("avg_deg_log", nn.initializers.constant(avg_log), (), self.param_dtype)
        attr = _utils.require_edge_features(graph, "PNAConv", self.edge_dim)
        (x,) = _utils.promote(self.dtype, x)
        towers_x = x.reshape(-1, t, f_in) if self.divide_input else jnp.broadcast_to(x[:, None], (x.shape[0], t, f))
        mlp = lambda name, width, layers: _TowerMLP(t, width, layers, self.act, self.dtype, self.param_dtype,
                                                   name=name)
        pre = mlp("pre", f_in, self.pre_layers)
        post = mlp("post", self.features // t, self.post_layers)
        encoder = _utils.dense(self, f_in, name="edge_encoder") if attr is not None else None
        if self.is_initializing():  # create pre's parameters (it runs per edge, functionally)
            pre(jnp.zeros((1, t, (3 if attr is not None else 2) * f_in), x.dtype))
            if encoder is not None:
                encoder(jnp.zeros((1, self.edge_dim), x.dtype))
        pre_vars, pre_fn = pre.variables, pre.clone(parent=None)
        enc_fn = None
        if encoder is not None:
            enc_vars, enc_mod = encoder.variables, encoder.clone(parent=None)
            enc_fn = lambda e: enc_mod.apply(enc_vars, e)
        degree = _utils.in_degree(graph, backend=self.backend, remat=self.remat, layout=layout).astype(x.dtype)
        aggregators, scalers = [AGGREGATORS[a] for a in self.aggregators], [SCALERS[s] for s in self.scalers]

        def phi(src, dst, edge):
            parts = [dst["x"], src["x"]]
            if enc_fn is not None:
                parts.append(jnp.broadcast_to(enc_fn(edge), (t, f_in)))
            return pre_fn.apply(pre_vars, jnp.concatenate(parts, -1))  # [t, f_in]

        def rho(mb, node):
            return jnp.concatenate([a(mb) for a in aggregators], -1)  # [t, A * f_in]

        def psi(node, agg):
            scaled = [s(agg, node["deg"], avg_lin, avg_log) for s in scalers]
            return jnp.concatenate([node["x"]] + scaled, -1)

        layer = message_passing(phi, rho, psi, backend=self.backend, remat=self.remat)
        g = graph._replace(nodes={"x": towers_x, "deg": degree}, edges=attr)
        combined = layer(g, layout=layout).nodes  # [N, t, (S*A + 1) * f_in]
        out = post(combined).reshape(x.shape[0], -1)
        return _utils.output_graph(graph, sets, _utils.dense(self, self.features, name="lin")(out))
