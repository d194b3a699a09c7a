"""Heterogeneous graphs as per-type dicts (PyG ``HeteroData`` style), and their typed ``GraphsTuple`` form.

A :class:`HeteroGraph` holds, per node type, a node count and optional features, and per edge type
``(src_type, relation, dst_type)`` an ``edge_index`` [2, E_r] of *type-local* node ids (row 0 = sources) and
optional edge features. The typed ``GraphsTuple`` that the `jgnn.nn` typed layers (``RGCNConv``, ``RGATConv``,
``HGTConv``) read puts all nodes in one id space, type by type (node type ``t`` owns the global ids
``offsets[t] .. offsets[t+1]-1``), with int32 ``nodes["type"]`` and ``edges["type"]``:

    graph, schema = to_typed_graph(hetero)               # nodes {"type", and "h" when every type has same-width x}
    x = HeteroInput(64)(hetero.node_features, schema)    # per-type projection to one width (learned)
    out = HGTConv(64, 2, schema.num_node_types, schema.num_edge_types)(graph._replace(
        nodes={**graph.nodes, "h": x}))
    per_type = schema.split_nodes(out.nodes["h"])        # {"author": [N_author, 64], ...}

:func:`from_typed_graph` goes back. Types keep the order in which they are listed (dict order), as PyG's
``HeteroData.to_homogeneous`` does, so type ids agree with PyG's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

EdgeType = tuple[str, str, str]
TYPE_KEY = "type"
FEATURE_KEY = "h"

__all__ = ["EdgeType", "HeteroGraph", "HeteroInput", "TypedSchema", "from_typed_graph", "to_typed_graph"]


def _leading(tree) -> set[int]:
    return {int(np.shape(leaf)[0]) for leaf in jax.tree_util.tree_leaves(tree)}


@dataclasses.dataclass(frozen=True, eq=False)
class HeteroGraph:
    """A heterogeneous graph as per-type dicts (host or device arrays).

    Attributes:
      num_nodes: ``{node_type: N_t}``.
      edge_index: ``{(src_type, relation, dst_type): int [2, E_r]}`` type-local ids; row 0 = sources.
      node_features: ``{node_type: array [N_t, ...] or pytree of them}``; types may be missing (featureless).
      edge_features: ``{edge_type: array [E_r, ...] or pytree}``; may be empty.

    Raises ``ValueError`` (naming the type) for an edge type whose node types are unknown, an edge index that is
    not [2, E] integers or is out of range, or features whose leading dimension does not match.
    """

    num_nodes: Mapping[str, int]
    edge_index: Mapping[EdgeType, Any]
    node_features: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    edge_features: Mapping[EdgeType, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for et, ei in self.edge_index.items():
            if not (isinstance(et, tuple) and len(et) == 3):
                raise ValueError(f"edge type {et!r} must be a (src_type, relation, dst_type) tuple")
            src, _, dst = et
            for t in (src, dst):
                if t not in self.num_nodes:
                    raise ValueError(f"edge type {et}: node type {t!r} is not in num_nodes {sorted(self.num_nodes)}")
            shape, dtype = np.shape(ei), np.asarray(ei).dtype if isinstance(ei, np.ndarray) else jnp.result_type(ei)
            if len(shape) != 2 or shape[0] != 2 or not jnp.issubdtype(dtype, jnp.integer):
                raise ValueError(f"edge_index[{et}] must be an integer [2, E] array, got {dtype} {shape}")
            if not isinstance(ei, jax.core.Tracer) and shape[1]:
                arr = np.asarray(ei)
                for row, t in ((0, src), (1, dst)):
                    lo, hi = int(arr[row].min()), int(arr[row].max())
                    if lo < 0 or hi >= self.num_nodes[t]:
                        raise ValueError(f"edge_index[{et}][{row}] holds ids in [{lo}, {hi}], outside [0, "
                                         f"{self.num_nodes[t]}) of node type {t!r}")
        for t, x in self.node_features.items():
            if t not in self.num_nodes:
                raise ValueError(f"node_features has unknown node type {t!r}")
            if _leading(x) - {self.num_nodes[t]}:
                raise ValueError(f"node_features[{t!r}] leading dims {sorted(_leading(x))}, expected "
                                 f"{self.num_nodes[t]}")
        for et, x in self.edge_features.items():
            if et not in self.edge_index:
                raise ValueError(f"edge_features has unknown edge type {et!r}")
            if _leading(x) - {int(np.shape(self.edge_index[et])[1])}:
                raise ValueError(f"edge_features[{et}] leading dims {sorted(_leading(x))}, expected "
                                 f"{np.shape(self.edge_index[et])[1]}")

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    @property
    def edge_types(self) -> tuple[EdgeType, ...]:
        return tuple(self.edge_index)


@dataclasses.dataclass(frozen=True, eq=False)
class TypedSchema:
    """How a :class:`HeteroGraph` maps onto a typed ``GraphsTuple``.

    Attributes:
      node_types: names; node type id ``t`` is ``node_types[t]``.
      edge_types: ``(src, relation, dst)`` names; edge type id ``r`` is ``edge_types[r]``.
      node_offsets: int64 [T + 1]; node type ``t`` owns global ids ``node_offsets[t] .. node_offsets[t+1]-1``.
      edge_offsets: int64 [R + 1]; edges of type ``r`` are ``edge_offsets[r] .. edge_offsets[r+1]-1``.
      relation_schema: int32 [R, 2], the (source, destination) node type ids of every edge type.
    """

    node_types: tuple[str, ...]
    edge_types: tuple[EdgeType, ...]
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    relation_schema: np.ndarray

    @property
    def num_node_types(self) -> int:
        return len(self.node_types)

    @property
    def num_edge_types(self) -> int:
        return len(self.edge_types)

    def node_slice(self, node_type: str) -> slice:
        t = self.node_types.index(node_type)
        return slice(int(self.node_offsets[t]), int(self.node_offsets[t + 1]))

    def split_nodes(self, x) -> dict[str, Any]:
        """``{node_type: x[its global ids]}`` for node-level ``x`` [N, ...] (array or pytree)."""
        take = lambda rows: jax.tree_util.tree_map(lambda a: a[rows], x)
        return {t: take(self.node_slice(t)) for t in self.node_types}

    def join_nodes(self, per_type: Mapping[str, Any]):
        """Concatenate ``{node_type: [N_t, ...]}`` in type order into [N, ...] (every type must be present)."""
        missing = [t for t in self.node_types if t not in per_type]
        if missing:
            raise ValueError(f"join_nodes: no entry for node type(s) {missing}")
        parts = [per_type[t] for t in self.node_types]
        return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a) if isinstance(a[0], jax.Array)
                                      else np.concatenate(a), *parts)


def _concat_if_uniform(per_type: Mapping, names, counts) -> np.ndarray | None:
    """The per-type arrays concatenated in ``names`` order when every type with rows has one, all of the same
    trailing shape and dtype; ``None`` otherwise (pytree-valued features are never concatenated)."""
    present = [per_type.get(n) for n in names]
    if any(a is None and c for a, c in zip(present, counts, strict=True)) or any(
            isinstance(a, Mapping) for a in present):
        return None
    arrays = [np.asarray(a) for a in present if a is not None]
    if not arrays or len({(a.shape[1:], a.dtype) for a in arrays}) != 1:
        return None
    trail, dtype = arrays[0].shape[1:], arrays[0].dtype
    return np.concatenate([np.asarray(a) if a is not None else np.zeros((0, *trail), dtype) for a in present])


def to_typed_graph(hetero: HeteroGraph, *, feature_key: str = FEATURE_KEY) -> tuple[jraph.GraphsTuple, TypedSchema]:
    """The typed single-graph ``GraphsTuple`` of ``hetero`` (host NumPy arrays) and its :class:`TypedSchema`.

    ``nodes = {"type": int32 [N]}`` plus ``nodes[feature_key]`` when every node type has a feature array of the
    same trailing shape and dtype (otherwise project them with :class:`HeteroInput`); ``edges = {"type": int32
    [E]}`` plus ``edges[feature_key]`` on the same condition. Edges are grouped by edge type, in type order.
    """
    node_types, edge_types = hetero.node_types, hetero.edge_types
    counts = np.asarray([int(hetero.num_nodes[t]) for t in node_types], np.int64)
    node_offsets = np.concatenate([[0], np.cumsum(counts)])
    sizes = np.asarray([int(np.shape(hetero.edge_index[et])[1]) for et in edge_types], np.int64)
    edge_offsets = np.concatenate([[0], np.cumsum(sizes)])
    schema = np.asarray([[node_types.index(s), node_types.index(d)] for s, _, d in edge_types], np.int32).reshape(
        -1, 2)
    senders, receivers = [], []
    for r, et in enumerate(edge_types):
        ei = np.asarray(hetero.edge_index[et], np.int64)
        senders.append(ei[0] + node_offsets[schema[r, 0]])
        receivers.append(ei[1] + node_offsets[schema[r, 1]])
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)
    nodes = {TYPE_KEY: np.repeat(np.arange(len(node_types), dtype=np.int32), counts)}
    edges = {TYPE_KEY: np.repeat(np.arange(len(edge_types), dtype=np.int32), sizes)}
    x = _concat_if_uniform(hetero.node_features, node_types, counts)
    if x is not None:
        nodes[feature_key] = x
    ex = _concat_if_uniform(hetero.edge_features, edge_types, sizes)
    if ex is not None:
        edges[feature_key] = ex
    n, e = int(node_offsets[-1]), int(edge_offsets[-1])
    graph = jraph.GraphsTuple(nodes=nodes, edges=edges, senders=cat(senders).astype(np.int32),
                              receivers=cat(receivers).astype(np.int32), n_node=np.asarray([n], np.int32),
                              n_edge=np.asarray([e], np.int32), globals=None)
    return graph, TypedSchema(node_types, edge_types, node_offsets, edge_offsets, schema)


def from_typed_graph(graph: jraph.GraphsTuple, schema: TypedSchema | None = None) -> HeteroGraph:
    """The :class:`HeteroGraph` of a typed single-graph ``GraphsTuple`` (host).

    Node type ``t``'s nodes are those with ``nodes["type"] == t``, in id order (they need not be contiguous);
    every other ``nodes`` entry becomes that type's features (a dict when there are several, the array when
    there is one). Without ``schema`` the types are named ``"0"``, ``"1"``, ... and every observed (source type,
    edge type, destination type) combination is one edge type ``("s", "r", "d")``; with ``schema`` each edge
    type must join the node types the schema names, else ``ValueError``.
    """
    graph = jax.device_get(graph)
    if not (isinstance(graph.nodes, Mapping) and TYPE_KEY in graph.nodes and isinstance(graph.edges, Mapping)
            and TYPE_KEY in graph.edges):
        raise ValueError('from_typed_graph: graph.nodes and graph.edges must be dicts with int32 "type" entries')
    node_type = np.asarray(graph.nodes[TYPE_KEY])
    edge_type = np.asarray(graph.edges[TYPE_KEY])
    senders, receivers = np.asarray(graph.senders), np.asarray(graph.receivers)
    num_types = schema.num_node_types if schema is not None else int(node_type.max(initial=-1)) + 1
    names = schema.node_types if schema is not None else tuple(str(t) for t in range(num_types))
    local = np.zeros(node_type.shape[0], np.int64)
    num_nodes = {}
    for t, name in enumerate(names):
        members = node_type == t
        local[members] = np.arange(int(members.sum()))
        num_nodes[name] = int(members.sum())
    extra = {k: v for k, v in graph.nodes.items() if k != TYPE_KEY}
    node_features = {}
    for t, name in enumerate(names):
        members = node_type == t
        picked = {k: np.asarray(v)[members] for k, v in extra.items()}
        if picked:
            node_features[name] = next(iter(picked.values())) if len(picked) == 1 else picked
    src_t, dst_t = node_type[senders], node_type[receivers]
    edge_index, edge_features = {}, {}
    edge_extra = {k: v for k, v in graph.edges.items() if k != TYPE_KEY}
    if schema is not None:
        groups = []
        for r, et in enumerate(schema.edge_types):
            members = edge_type == r
            if np.any(src_t[members] != schema.relation_schema[r, 0]) or np.any(
                    dst_t[members] != schema.relation_schema[r, 1]):
                raise ValueError(f"edges of type {r} {et} do not all join node types {et[0]!r} -> {et[2]!r}")
            groups.append((et, members))
    else:
        combos = np.unique(np.stack([src_t, edge_type, dst_t], 1), axis=0) if edge_type.size else np.zeros((0, 3))
        groups = [((names[s], str(r), names[d]), (src_t == s) & (edge_type == r) & (dst_t == d))
                  for s, r, d in combos.tolist()]
    for et, members in groups:
        edge_index[et] = np.stack([local[senders[members]], local[receivers[members]]]).astype(np.int64)
        picked = {k: np.asarray(v)[members] for k, v in edge_extra.items()}
        if picked:
            edge_features[et] = next(iter(picked.values())) if len(picked) == 1 else picked
    return HeteroGraph(num_nodes, edge_index, node_features, edge_features)


class HeteroInput(nn.Module):
    """Per-node-type input layer: one ``Dense(features)`` per type with features, a learned embedding table per
    featureless type, concatenated in schema order into [N, features] (the ``"h"`` the typed layers read).

    Called as ``HeteroInput(features)(node_features, schema)`` with ``node_features = {type: [N_t, F_t]}``
    (widths may differ; PyG's ``HGTConv`` takes a per-type ``in_channels`` dict for the same purpose).
    Parameters are created in ``param_dtype``; the output is in ``dtype`` (None: float32, or the promoted
    dtype of the parameters and the floating inputs).
    """

    features: int
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, node_features: Mapping[str, Any], schema: TypedSchema) -> jax.Array:
        parts, dtypes = [], {"dtype": self.dtype, "param_dtype": self.param_dtype}
        for t, name in enumerate(schema.node_types):
            count = int(schema.node_offsets[t + 1] - schema.node_offsets[t])
            x = node_features.get(name)
            if x is None:
                parts.append(nn.Embed(count, self.features, **dtypes, name=f"embed_{name}")(jnp.arange(count)))
            else:
                x = jnp.asarray(x)  # integer or boolean features (counts, one-hots) enter as float32
                x = x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)
                parts.append(nn.Dense(self.features, **dtypes, name=f"dense_{name}")(x))
        return jnp.concatenate(parts)
