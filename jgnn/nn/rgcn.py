"""Relational graph convolution (Schlichtkrull et al., 2018)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing
from jgnn.nn import _utils
from jgnn.ops.gather import normalize

_AGGREGATORS = ("add", "max", "mean", "min", "sum")


def relation_types(graph: jraph.GraphsTuple, name: str, num_relations: int):
    """The int edge types ``[E]`` of a relational graph (``graph.edges["type"]``), range-checked when concrete."""
    types = graph_lib.edge_types(graph)
    if types is None:
        raise ValueError(f'{name}: graph.edges needs an int "{graph_lib.TYPE_KEY}" entry (the relation of each '
                         f"edge, in [0, {num_relations}))")
    if not jnp.issubdtype(jnp.result_type(types), jnp.integer):
        raise TypeError(f'{name}: graph.edges["{graph_lib.TYPE_KEY}"] must be integer, got {jnp.result_type(types)}')
    if not isinstance(types, jax.core.Tracer) and np.size(types):
        lo, hi = int(np.min(types)), int(np.max(types))
        if lo < 0 or hi >= num_relations:
            raise ValueError(f'{name}: graph.edges["{graph_lib.TYPE_KEY}"] holds {lo}..{hi}, outside '
                             f"[0, {num_relations}) (num_relations={num_relations})")
    return types


def per_edge_entry(table, receivers, types):
    """``table[receivers[e], types[e]]`` for a ``[N, R]`` table, with jnp indexing semantics on both axes."""
    n, r = table.shape
    return table.reshape(-1)[normalize(receivers, n, wrap=True) * r + normalize(types, r, wrap=True)]


def typed_inputs(graph: jraph.GraphsTuple, name: str, *, num_node_types: int | None = None,
                 num_edge_types: int | None = None):
    """Validate a typed graph (node and edge ``"type"``) for module ``name``; return (features, node types,
    edge types)."""
    try:
        graph_lib.validate(graph, typed=True, num_node_types=num_node_types, num_edge_types=num_edge_types)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    return _utils.node_features(graph), graph.nodes[graph_lib.TYPE_KEY], graph.edges[graph_lib.TYPE_KEY]


def relation_weights(module: nn.Module, num_relations: int, d_in: int, d_out: int):
    """PyG's relation weights ``[R, d_in, d_out]``: free (``kernel``), a basis decomposition ``comp @ bases``
    (``num_bases``), or ``None`` for block-diagonal ones (``blocks`` ``[R, B, d_in/B, d_out/B]``, returned
    second). Returns ``(weights or None, blocks or None)``."""
    if module.num_bases is not None and module.num_blocks is not None:
        raise ValueError(f"{type(module).__name__}: num_bases and num_blocks are exclusive (as in PyG)")
    init = _utils.typed_init()
    if module.num_bases is not None:
        bases = module.param("bases", init, (module.num_bases, d_in, d_out), module.param_dtype)
        comp = module.param("comp", nn.initializers.glorot_uniform(), (num_relations, module.num_bases),
                            module.param_dtype)
        return jnp.einsum("rb,bio->rio", comp, bases), None
    if module.num_blocks is not None:
        b = module.num_blocks
        if d_in % b or d_out % b:
            raise ValueError(f"{type(module).__name__}: input width {d_in} and output width {d_out} must be "
                             f"divisible by num_blocks={b}")
        blocks = module.param("blocks", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2,
                                                                         out_axis=-1, batch_axis=(0, 1)),
                              (num_relations, b, d_in // b, d_out // b), module.param_dtype)
        return None, blocks
    return module.param("kernel", init, (num_relations, d_in, d_out), module.param_dtype), None


def block_matmul(x, blocks):
    """``x`` ``[..., B * i]`` times a block-diagonal ``blocks`` ``[B, i, o]``: ``[..., B * o]``."""
    b, i, _ = blocks.shape
    return jnp.einsum("...bi,bio->...bo", x.reshape(x.shape[:-1] + (b, i)), blocks).reshape(x.shape[:-1] + (-1,))


class RGCNConv(_utils.CheckedOptions, nn.Module):
    r"""Relational GCN layer, as PyG's ``RGCNConv``:

    .. math::
        h_i' = W_0 x_i + b + \sum_{r} W_r \cdot \mathrm{aggr}_{j \in \mathcal{N}_r(i)} x_j

    where :math:`\mathcal{N}_r(i)` are the in-neighbours of ``i`` through edges of relation ``r`` and ``aggr``
    is ``"mean"`` (PyG's default; duplicate edges count twice), ``"sum"``/``"add"``, ``"max"`` or ``"min"``
    (empty: 0). :math:`W_r` is free, a basis combination :math:`\sum_b a_{rb} V_b` (``num_bases``) or
    block-diagonal (``num_blocks``); the root weight :math:`W_0` (``root_weight``) is always free, as in PyG.

    Input: ``graph.edges = {"type": int32 [E]}`` in ``[0, num_relations)``; node features ``graph.nodes``
    (an array or ``{"h": ...}``; node types are not needed) or a bipartite pair ``(x_src, x_dst)``. Features
    are float ``[N, F]``, or int ``[N]`` node ids standing for one-hot rows of width ``input_dim`` (PyG's
    featureless ``x=None``: :math:`W_r x_j` is row ``x_j`` of :math:`W_r`). Output width ``features``, in the
    input's form. Parameters (PyG): ``kernel`` ``[R, F, features]`` (``weight``), or ``bases``
    (``weight``) and ``comp``, or ``blocks`` (``weight``); ``root``; ``bias``.
    """

    features: int
    num_relations: int
    num_bases: int | None = None
    num_blocks: int | None = None
    aggr: str = "mean"
    root_weight: bool = True
    use_bias: bool = True
    input_dim: int | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, deterministic: bool = True) -> jraph.GraphsTuple:
        _utils.check_choice("aggr", self.aggr, _AGGREGATORS)
        sets, x_src, x_dst = _utils.split_nodes(graph, "RGCNConv")
        layout = _utils.check_layout("RGCNConv", layout, self_loops=False, bipartite=sets.bipartite)
        types = relation_types(graph, "RGCNConv", self.num_relations)
        ids = jnp.issubdtype(x_src.dtype, jnp.integer)
        if ids and (x_src.ndim != 1 or self.input_dim is None):
            raise ValueError("RGCNConv: integer node features are one-hot ids: they must be 1-D and need input_dim")
        if ids and self.num_blocks is not None:
            raise ValueError("RGCNConv: num_blocks does not support integer node ids (as in PyG)")
        d_in = self.input_dim if ids else x_src.shape[-1]
        r = self.num_relations
        weight, blocks = relation_weights(self, r, d_in, self.features)
        d_root = self.input_dim if ids else x_dst.shape[-1]
        root = self.param("root", nn.initializers.glorot_uniform(), (d_root, self.features), self.param_dtype) \
            if self.root_weight else None
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias \
            else None
        weight, blocks, root, bias = _utils.promote(self.dtype, weight, blocks, root, bias)
        if not ids:
            x_src, x_dst = _utils.promote(weight.dtype if weight is not None else blocks.dtype, x_src, x_dst)
        g = sets.graph(graph, sets.rows({"h": x_src}, {"root": x_dst}), {graph_lib.TYPE_KEY: types})
        counts = _utils.in_degree_per_type(g, r, backend=self.backend, remat=self.remat, layout=layout)
        per_relation_matmul = self.aggr in ("mean", "sum", "add")

        def transform(x, rel):
            """``W_rel x`` for one row (``rel`` an int, or all relations when ``None``)."""
            if ids:
                return weight[rel, x] if rel is not None else weight[:, x]
            if blocks is not None:
                return block_matmul(x, blocks[rel]) if rel is not None else jax.vmap(block_matmul, (0, 0))(x, blocks)
            return x @ weight[rel] if rel is not None else jnp.einsum("ri,rio->ro", x, weight)

        if per_relation_matmul:  # linear: transform per edge, then sum (or mean) over each relation
            scale = jnp.where(counts > 0, 1.0 / jnp.maximum(counts, 1.0), 0.0) if self.aggr == "mean" else None

            def phi(src, dst, edge):
                message = transform(sets.src(src)["h"], edge[graph_lib.TYPE_KEY])
                return message if scale is None else message * edge["inv"].astype(message.dtype)

            reduce, finish = mailbox.sum, lambda node, agg: agg
            if scale is not None:  # one scale per edge, not a gathered [R] row per edge indexed by its relation
                g = g._replace(edges={**g.edges, "inv": per_edge_entry(scale, g.receivers, types)})
        else:  # max/min come before W_r (PyG): reduce raw rows per relation, masked by a one-hot
            never_wins = jnp.finfo(jnp.float32).max * (1.0 if self.aggr == "min" else -1.0)

            def phi(src, dst, edge):
                rel = edge[graph_lib.TYPE_KEY]
                x = sets.src(src)["h"]
                row = weight[:, x] if ids else jnp.broadcast_to(x, (r,) + x.shape)  # [R, d]
                hit = jax.nn.one_hot(rel, r, dtype=bool)[:, None]
                return jnp.where(hit, row, jnp.asarray(never_wins, row.dtype))

            reduce = mailbox.max if self.aggr == "max" else mailbox.min

            def finish(node, agg):
                agg = jnp.where(sets.dst(node)["count"][:, None] > 0, agg, 0.0)
                return jnp.sum(agg, 0) if ids else jnp.sum(transform(agg, None), 0)

            g = g._replace(nodes=sets.with_dst(g.nodes, count=counts))

        def psi(node, agg):
            out = finish(node, agg)
            if root is not None:
                x = sets.dst(node)["root"]
                out = out + (root[x] if ids else x @ root)
            return out if bias is None else out + bias

        layer = message_passing(phi, lambda mb, node: reduce(mb), psi, backend=self.backend, remat=self.remat)
        out = sets.output(layer(g, layout=layout).nodes)
        return _utils.output_graph(graph, sets, out)
