"""Jumping Knowledge networks (Xu et al., 2018): every layer's node representation, combined per node.

The combination is a dense level of a hierarchical neighbourhood (`jgnn.neighborhood`): node ``v``'s group has
one member per layer, row ``l * N + v`` of the stacked ``[L * N, C]`` representations, and ``max`` and the
LSTM-attention are that level's ``rho`` (a reshape and a dense reduction over the ``L`` layers).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

from jgnn import mailbox, neighborhood
from jgnn.nn import _utils
from jgnn.nn.gcn import GCNConv
from jgnn.nn.sage import SAGEConv

MODES = ("cat", "max", "lstm")
CONVS = {"gcn": GCNConv, "sage": SAGEConv}


def layer_level(num_nodes: int, num_layers: int, scores=None) -> neighborhood.Neighborhood:
    """Node ``v`` groups rows ``v, N + v, ...`` of the stacked layer outputs; ``scores`` ``[N, L, 1]`` (or None)
    become the members' features."""
    members = jnp.arange(num_layers * num_nodes, dtype=jnp.int32).reshape(num_layers, num_nodes).T
    return neighborhood.Neighborhood((neighborhood.dense_level(members, features=scores),))


def _max_rho(mb, group):
    return mailbox.max(mb)


def _attention_phi(member, group, score):
    return {"h": member, "s": score}


def _attention_rho(mb, group):
    return mailbox.sum(mailbox.softmax(mb["s"]) * mb["h"])


class JumpingKnowledge(nn.Module):
    r"""Combine a list of layer outputs ``xs`` (each ``[N, C]``) per node, as PyG's ``JumpingKnowledge``.

    * ``"cat"``: ``[N, L * C]``, the concatenation;
    * ``"max"``: ``[N, C]``, the element-wise maximum over layers;
    * ``"lstm"``: ``[N, C]``, :math:`\sum_l \alpha_{v,l} x_v^{(l)}` with :math:`\alpha_{v,\cdot}` the softmax
      over layers of a linear score of a bi-directional LSTM run over node ``v``'s ``L`` representations
      (hidden size ``(L * C) // 2`` each way, PyG's ``lstm`` and ``att``).

    ``channels`` and ``num_layers`` are read from ``xs`` (PyG needs them for ``"lstm"``). The combination runs in
    ``dtype`` (None: the promoted dtype of ``xs``); the LSTM and the score layer keep their parameters in
    ``param_dtype``.
    """

    mode: str = "cat"
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, xs) -> jax.Array:
        _utils.check_choice("mode", self.mode, MODES)
        xs = list(xs)
        if not xs or any(x.shape != xs[0].shape for x in xs):
            raise ValueError(f"JumpingKnowledge needs equal-shaped [N, C] layer outputs, got {[x.shape for x in xs]}")
        xs = _utils.promote(self.dtype, *xs)
        if self.mode == "cat":
            return jnp.concatenate(xs, -1)
        n, c = xs[0].shape
        num_layers = len(xs)
        stacked = jnp.concatenate(xs, 0)  # row l * N + v
        if self.mode == "max":
            agg = neighborhood.Aggregation(rho=_max_rho)
            return neighborhood.aggregate(stacked, layer_level(n, num_layers), [agg])
        hidden = (num_layers * c) // 2
        seq = jnp.stack(xs, 1)  # [N, L, C]
        lstm = nn.Bidirectional(nn.RNN(_utils.lstm_cell(self, hidden), name="lstm_forward"),
                                nn.RNN(_utils.lstm_cell(self, hidden), name="lstm_backward"), name="lstm")
        scores = nn.Dense(1, **_utils.dtypes(self), name="att")(lstm(seq))  # [N, L, 1]
        agg = neighborhood.Aggregation(phi=_attention_phi, rho=_attention_rho)
        return neighborhood.aggregate(stacked, layer_level(n, num_layers, scores), [agg])


class JKNet(_utils.CheckedOptions, nn.Module):
    """A JK-Net, as PyG's ``BasicGNN(..., jk=mode)``: ``num_layers`` convolutions (``"gcn"`` or ``"sage"``) of
    width ``hidden``, each followed by ReLU and dropout, their outputs combined by `JumpingKnowledge`, then a
    linear map to ``out_features``. Called as ``model(graph, *, deterministic=True) -> [N, out_features]``.
    ``dtype``/``param_dtype`` pass to every submodule."""

    hidden: int
    out_features: int
    num_layers: int = 2
    conv: str = "gcn"
    mode: str = "cat"
    dropout: float = 0.5
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jax.Array:
        _utils.check_choice("conv", self.conv, CONVS)
        xs, dtypes = [], _utils.dtypes(self)
        for i in range(self.num_layers):
            conv = CONVS[self.conv](self.hidden, **dtypes, backend=self.backend, remat=self.remat, name=f"conv{i}")
            h = nn.relu(_utils.node_features(conv(graph, layout=layout)))
            h = nn.Dropout(self.dropout, deterministic=deterministic)(h)
            xs.append(h)
            graph = _utils.with_features(graph, h)
        h = JumpingKnowledge(self.mode, **dtypes, name="jk")(xs)
        return nn.Dense(self.out_features, **dtypes, name="lin")(h)
