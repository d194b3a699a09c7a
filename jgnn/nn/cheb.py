"""Chebyshev spectral graph convolution (Defferrard et al., 2016)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils

_NORMALIZATIONS = (None, "sym", "rw")


def _safe_inverse(x, power: float):
    """``x ** -power`` with 0 where ``x == 0`` (PyG masks the inf), safe to differentiate."""
    zero = x == 0
    return jnp.where(zero, 0.0, jnp.where(zero, 1.0, x) ** -power)


def scaled_laplacian(graph: jraph.GraphsTuple, weight, normalization, lambda_max, *, backend, remat, layout):
    r"""Node rows and edge weights for :math:`\hat L = 2 L / \lambda_{max} - I`, PyG's ``ChebConv.__norm__``.

    :math:`L` is PyG's ``get_laplacian`` on the graph without its self-loops: ``D - A`` (``None``),
    ``I - D^{-1/2} A D^{-1/2}`` (``"sym"``) or ``I - D^{-1} A`` (``"rw"``), where ``D`` holds *out*-degrees
    (weighted by ``weight`` ``[E]``, or 1). The off-diagonal part runs over the edges, existing loops masked to
    0; the diagonal is a per-node term (no loop edges are appended). ``lambda_max`` is a number, a ``[G]``
    array (one per graph), or ``None``: twice the largest entry of :math:`L`, over the whole batch, as PyG.

    Returns ``(nodes, edges)``: ``nodes = {"a", "b", "s", "diag"}`` ``[N]`` and ``edges = {"w"}`` ``[E]`` such
    that the off-diagonal entry for edge ``j -> i`` is ``-a_j w b_i s_j`` and the diagonal one ``diag_i``.
    """
    n, e = graph_lib.num_nodes(graph), graph_lib.num_edges(graph)
    loop = _utils.existing_loops(graph)
    w = jnp.where(loop, 0.0, jnp.ones((e,), jnp.float32) if weight is None else weight)
    reverse = graph._replace(senders=graph.receivers, receivers=graph.senders,
                             nodes=jnp.zeros((n,), jnp.float32), edges={"w": w})
    deg = _utils.aggregate(reverse, lambda src, dst, edge: edge["w"], backend=backend, remat=remat,
                           layout=_utils.reversed_layout(layout))
    ones = jnp.ones_like(deg)
    a, b, diag = {None: (ones, ones, deg), "sym": (_safe_inverse(deg, 0.5), _safe_inverse(deg, 0.5), ones),
                  "rw": (_safe_inverse(deg, 1.0), ones, ones)}[normalization]
    nodes, edges = {"a": a, "b": b}, {"w": w}
    if lambda_max is None:
        off = _utils.aggregate(graph._replace(nodes=nodes, edges={"w": w, "loop": loop}),
                               lambda src, dst, edge: jnp.where(edge["loop"], jnp.finfo(jnp.float32).min,
                                                                 -src["a"] * edge["w"] * dst["b"]),
                               "max", backend=backend, remat=remat, layout=layout)
        lambda_max = 2.0 * jnp.maximum(jnp.max(diag), jnp.max(off))
    lam = jnp.asarray(lambda_max, jnp.float32)
    lam = jnp.repeat(lam, graph.n_node, total_repeat_length=n) if lam.ndim else jnp.broadcast_to(lam, (n,))
    scale = _safe_inverse(lam, 1.0) * 2.0
    return {**nodes, "s": scale, "diag": diag * scale - 1.0}, edges


class ChebConv(_utils.CheckedOptions, nn.Module):
    r"""Chebyshev spectral graph convolution, as PyG's ``ChebConv``:

    .. math::
        h' = \sum_{k=0}^{K-1} T_k W_k + b, \quad T_0 = x, \quad T_1 = \hat L x, \quad
        T_k = 2 \hat L T_{k-1} - T_{k-2}

    with :math:`\hat L = 2 L / \lambda_{max} - I` (see `scaled_laplacian`; ``normalization`` in
    ``{None, "sym", "rw"}``). Optional edge weights as a 1-D ``graph.edges`` or ``graph.edges["weight"]``;
    ``lambda_max`` (call argument: a number or one per graph) defaults to PyG's. The default assumes
    non-negative weights (an empty neighbourhood counts as 0 in the maximum). ``layout`` describes the graph
    as given. Parameters: ``kernel`` ``[K, F, features]`` (PyG ``lins[k].weight.T``), ``bias``.
    """

    features: int
    K: int
    normalization: str | None = "sym"
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, lambda_max=None,
                 deterministic: bool = True) -> jraph.GraphsTuple:
        _utils.check_choice("normalization", self.normalization, _NORMALIZATIONS)
        if self.K < 1:
            raise ValueError(f"ChebConv: K must be >= 1, got {self.K}")
        sets, x, _ = _utils.split_nodes(graph, "ChebConv", bipartite_ok=False)
        layout = _utils.check_layout("ChebConv", layout, self_loops=False)
        kernel = self.param("kernel", _utils.typed_init(), (self.K, x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias \
            else None
        x, kernel, bias = _utils.promote(self.dtype, x, kernel, bias)
        out = x @ kernel[0]
        if self.K > 1:
            nodes, edges = scaled_laplacian(graph, _utils.edge_weights(graph), self.normalization, lambda_max,
                                            backend=self.backend, remat=self.remat, layout=layout)
            nodes = {k: v.astype(x.dtype) for k, v in nodes.items()}
            phi = lambda src, dst, edge: (-src["a"] * edge["w"].astype(x.dtype) * dst["b"] * src["s"]) * src["h"]
            psi = lambda node, agg: agg + node["diag"] * node["h"]  # the diagonal of L-hat, per node
            layer = message_passing(phi, lambda mb, node: mailbox.sum(mb), psi, backend=self.backend,
                                    remat=self.remat)
            propagate = lambda h: layer(graph._replace(nodes={**nodes, "h": h}, edges=edges), layout=layout).nodes
            t_prev, t_cur = x, propagate(x)
            out = out + t_cur @ kernel[1]
            for k in range(2, self.K):
                t_prev, t_cur = t_cur, 2.0 * propagate(t_cur) - t_prev
                out = out + t_cur @ kernel[k]
        if bias is not None:
            out = out + bias
        return _utils.output_graph(graph, sets, out)
