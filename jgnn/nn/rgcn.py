"""Relational graph convolution (Schlichtkrull et al., 2018)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils


def typed_inputs(graph: jraph.GraphsTuple, name: str, *, num_node_types: int | None = None,
                 num_edge_types: int | None = None):
    """Validate a typed graph for module ``name``; return (features, node types, edge types)."""
    try:
        graph_lib.validate(graph, typed=True, num_node_types=num_node_types, num_edge_types=num_edge_types)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    return _utils.node_features(graph), graph.nodes[graph_lib.TYPE_KEY], graph.edges[graph_lib.TYPE_KEY]


class RGCNConv(nn.Module):
    r"""Relational GCN layer with basis decomposition, as in the R-GCN paper (and PyG's ``RGCNConv``):

    .. math::
        h_i' = W_0 x_i + b + \sum_{r} \sum_{j \in \mathcal{N}_r(i)} \frac{1}{c_{i,r}} W_r x_j, \qquad
        W_r = \sum_{b=1}^{B} a_{rb} V_b

    where :math:`\mathcal{N}_r(i)` are the in-neighbours of ``i`` through edges of type ``r`` and
    :math:`c_{i,r} = |\mathcal{N}_r(i)|` (mean per relation; duplicate edges count twice). Without
    ``num_bases`` every :math:`W_r` (and :math:`W_0`) is a free matrix; with bases, the root weight
    :math:`W_0` is decomposed over the same bases (the self-connection is one more relation, as in the authors'
    code). ``self_loop`` adds the root term :math:`W_0 x_i`.

    Input: ``graph.nodes = {"h": x, "type": int32}`` and ``graph.edges = {"type": int32}`` in
    ``[0, num_relations)``. ``x`` is float ``[N, F]``, or int ``[N]`` node ids standing for one-hot rows of
    width ``input_dim`` (R-GCN's featureless input: :math:`W_r x_j` is then row ``x_j`` of :math:`W_r`).
    Output width: ``features``; the dict form (and ``"type"``) is kept.
    """

    features: int
    num_relations: int
    num_bases: int | None = None
    self_loop: bool = True
    use_bias: bool = True
    input_dim: int | None = None
    backend: str = "auto"
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        x, node_type, edge_type = typed_inputs(graph, "RGCNConv", num_edge_types=self.num_relations)
        ids = jnp.issubdtype(x.dtype, jnp.integer)
        if ids and (x.ndim != 1 or self.input_dim is None):
            raise ValueError("RGCNConv: integer node features are one-hot ids: they must be 1-D and need input_dim")
        d_in = self.input_dim if ids else x.shape[-1]
        shape, r = (d_in, self.features), self.num_relations
        init = nn.initializers.glorot_uniform()
        if self.num_bases:
            bases = self.param("bases", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2,
                                                                       out_axis=-1, batch_axis=(0,)),
                               (self.num_bases, *shape), jnp.float32)
            # the root weight is one more combination of the bases (as in the authors' R-GCN code)
            comp = self.param("comp", init, (r + int(self.self_loop), self.num_bases), jnp.float32)
            weight = jnp.einsum("rb,bio->rio", comp, bases)
            root = weight[r] if self.self_loop else None
        else:
            weight = self.param("kernel", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2,
                                                                          out_axis=-1, batch_axis=(0,)),
                                (r, *shape), jnp.float32)
            root = self.param("root", init, shape, jnp.float32) if self.self_loop else None
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32) if self.use_bias else None
        counts = _utils.in_degree_per_type(graph, r, backend=self.backend, remat=self.remat)
        inv_count = jnp.where(counts > 0, 1.0 / jnp.maximum(counts, 1.0), 0.0)  # [N, R]

        def phi(src, dst, edge):
            rel = edge["type"]
            # one-hot ids pick one row of W_r (index both at once: never gather a whole W_r per edge)
            message = weight[rel, src["h"]] if ids else src["h"] @ weight[rel]
            return message * dst["inv_count"][rel]

        def psi(node, agg):
            out = agg
            if root is not None:
                out = out + (root[node["h"]] if ids else node["h"] @ root)
            return {"h": out if bias is None else out + bias}

        layer = message_passing(phi, lambda mb, node: mailbox.sum(mb), psi, backend=self.backend, remat=self.remat)
        g = graph._replace(nodes={"h": x, "type": node_type, "inv_count": inv_count}, edges={"type": edge_type})
        out = layer(g, layout=layout).nodes["h"]
        return _utils.with_features(graph, out)
