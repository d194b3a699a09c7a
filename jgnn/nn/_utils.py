"""Helpers shared by the `jgnn.nn` modules: node and edge inputs, bipartite node sets, self-loops, layouts,
degrees, dtypes and attention dropout.

Everything that touches edges goes through `jgnn.message_passing`, so the compiler sees it too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

import pallas_kernels as pk
from jgnn import graph as graph_lib
from jgnn import layout as layout_lib
from jgnn import mailbox
from jgnn import remat as remat_lib
from jgnn.compiler import resolve_backend
from jgnn.message_passing import message_passing

FEATURE_KEY = "h"
WEIGHT_KEY = "weight"

REDUCERS: dict[str, Callable] = {"sum": mailbox.sum, "add": mailbox.sum, "mean": mailbox.mean,
                                 "max": mailbox.max, "min": mailbox.min}


class CheckedOptions:
    """Mixin of the `jgnn.nn` modules (listed before ``nn.Module``): a bad ``backend`` or ``remat`` raises when the
    module is built, as `jgnn.message_passing` does, not at its first call."""

    def __post_init__(self):
        resolve_backend(self.backend)
        remat_lib.resolve(getattr(self, "remat", "auto"))
        super().__post_init__()


def check_choice(name: str, value, choices) -> None:
    """Raise a ValueError naming ``name`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(map(str, choices))}, got {value!r}")


# ---------------------------------------------------------------------------------------------------------
# node and edge inputs


def node_features(graph: jraph.GraphsTuple):
    """The node feature array: ``graph.nodes`` itself, or ``graph.nodes["h"]`` for dict-valued nodes."""
    nodes = graph.nodes
    if isinstance(nodes, Mapping):
        if FEATURE_KEY not in nodes:
            raise ValueError(f'graph.nodes is a dict without a "{FEATURE_KEY}" feature entry (keys: {sorted(nodes)})')
        return nodes[FEATURE_KEY]
    if nodes is None:
        raise ValueError("graph.nodes is None: this module needs node features")
    return nodes


def with_features(graph: jraph.GraphsTuple, x) -> jraph.GraphsTuple:
    """``graph`` with its node features replaced by ``x``, keeping the input's form (array or dict)."""
    if isinstance(graph.nodes, Mapping):
        return graph._replace(nodes={**graph.nodes, FEATURE_KEY: x})
    return graph._replace(nodes=x)


def edge_weights(graph: jraph.GraphsTuple):
    """Scalar edge weights ``[E]`` (PyG's ``edge_weight``): a 1-D ``graph.edges``, or ``graph.edges["weight"]``.

    ``None`` when the graph has none (every weight is then 1).
    """
    edges = graph.edges
    if isinstance(edges, Mapping):
        return edges.get(WEIGHT_KEY)
    if edges is not None and np.ndim(edges) == 1:
        return edges
    return None


def edge_features(graph: jraph.GraphsTuple):
    """Edge feature rows ``[E, D]`` (PyG's ``edge_attr``): ``graph.edges`` as an array (a 1-D one is one
    column), or ``graph.edges["h"]``. ``None`` when the graph has none."""
    edges = graph.edges
    if isinstance(edges, Mapping):
        edges = edges.get(FEATURE_KEY)
    if edges is None:
        return None
    return edges[:, None] if np.ndim(edges) == 1 else edges


def require_edge_features(graph: jraph.GraphsTuple, name: str, edge_dim: int | None):
    """The edge features when ``edge_dim`` is set (checked against their width), else ``None``."""
    if edge_dim is None:
        return None
    attr = edge_features(graph)
    if attr is None:
        raise ValueError(f'{name}: edge_dim={edge_dim} needs edge features (graph.edges as an [E, D] array or '
                         f'graph.edges["{FEATURE_KEY}"])')
    if attr.shape[-1] != edge_dim:
        raise ValueError(f"{name}: edge_dim={edge_dim} but the edge features have width {attr.shape[-1]}")
    return attr


# ---------------------------------------------------------------------------------------------------------
# bipartite inputs


@dataclasses.dataclass(frozen=True)
class NodeSets:
    """Where a layer's source and destination nodes live in the graph its message passing runs on.

    A layer input is either one node set (``graph.nodes`` is the features) or two, PyG's bipartite
    ``(x_src, x_dst)``: ``graph.nodes`` is a pair of ``[N_src, F_s]`` and ``[N_dst, F_d]`` arrays,
    ``senders`` index ``x_src`` and ``receivers`` index ``x_dst``. Message passing then runs on the union of
    both sets (sources first), whose node rows are ``{"src": ..., "dst": ...}`` dicts, each zero on the other
    set's rows; ``src``/``dst`` read a role's part of a row, and `output` keeps the destination rows.
    With one node set the rows are shared by both roles, so the compiler sees one array (and can share work).
    """

    num_src: int
    num_dst: int
    bipartite: bool

    def src(self, row):
        return row["src"] if self.bipartite else row

    def dst(self, row):
        return row["dst"] if self.bipartite else row

    def rows(self, src: dict, dst: dict) -> dict:
        """Node rows holding the source part ``src`` ([N_src, ...] leaves) and destination part ``dst``."""
        if not self.bipartite:
            shared = [k for k in src.keys() & dst.keys() if src[k] is not dst[k]]
            if shared:  # one node set: a key names one array for both roles
                raise ValueError(f"node row keys {sorted(shared)} hold different source and destination arrays")
            return {**src, **dst}
        pad = lambda tree, before, after: jax.tree_util.tree_map(
            lambda x: jnp.concatenate([jnp.zeros((before,) + x.shape[1:], x.dtype), x,
                                       jnp.zeros((after,) + x.shape[1:], x.dtype)]), tree)
        return {"src": pad(src, 0, self.num_dst), "dst": pad(dst, self.num_src, 0)}

    def with_dst(self, rows: dict, **arrays) -> dict:
        """``rows`` with per-node ``arrays`` (already one row per message-passing node) in the destination part."""
        if not self.bipartite:
            return {**rows, **arrays}
        return {**rows, "dst": {**rows["dst"], **arrays}}

    def graph(self, graph: jraph.GraphsTuple, nodes, edges=None) -> jraph.GraphsTuple:
        """The graph message passing runs on: ``graph``'s edges over ``nodes`` (see `rows`)."""
        if not self.bipartite:
            return graph._replace(nodes=nodes, edges=edges)
        n, e = self.num_src + self.num_dst, graph_lib.num_edges(graph)
        return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=jnp.asarray(graph.senders, jnp.int32),
                                 receivers=jnp.asarray(graph.receivers, jnp.int32) + self.num_src,
                                 n_node=jnp.asarray([n], jnp.int32), n_edge=jnp.asarray([e], jnp.int32),
                                 globals=None)

    def output(self, out):
        """The destination rows of a message-passing output."""
        return out[self.num_src:] if self.bipartite else out


def split_nodes(graph: jraph.GraphsTuple, name: str, *, bipartite_ok: bool = True):
    """``(node_sets, x_src, x_dst)`` for a layer input (see `NodeSets`); validates the graph."""
    nodes = graph.nodes
    if isinstance(nodes, tuple) and not hasattr(nodes, "_fields"):
        if not bipartite_ok:
            raise ValueError(f"{name}: bipartite (x_src, x_dst) inputs are not supported (PyG's layer has none)")
        if len(nodes) != 2:
            raise ValueError(f"{name}: bipartite graph.nodes must be a pair (x_src, x_dst), got {len(nodes)} items")
        x_src, x_dst = nodes
        sets = NodeSets(int(x_src.shape[0]), int(x_dst.shape[0]), True)
        # n_node means nothing for two node sets: check each index array against its own set
        one = jnp.asarray([graph_lib.num_edges(graph)], jnp.int32)
        for idx, count in ((graph.senders, sets.num_src), (graph.receivers, sets.num_dst)):
            graph_lib.validate(jraph.GraphsTuple(nodes=jnp.zeros((count,)), edges=graph.edges, senders=idx,
                                                 receivers=idx, n_node=jnp.asarray([count], jnp.int32),
                                                 n_edge=one, globals=None))
        return sets, x_src, x_dst
    graph_lib.validate(graph)
    x = node_features(graph)
    return NodeSets(int(x.shape[0]), int(x.shape[0]), False), x, x


def output_graph(graph: jraph.GraphsTuple, sets: NodeSets, out) -> jraph.GraphsTuple:
    """The layer's result: ``graph`` with new node features (for bipartite input: the destination rows)."""
    return graph._replace(nodes=out) if sets.bipartite else with_features(graph, out)


# ---------------------------------------------------------------------------------------------------------
# self-loops and layouts


def check_layout(name: str, layout, *, self_loops: bool, bipartite: bool = False):
    """Raise a ValueError naming the fix when ``layout`` does not describe the graph the layer runs on."""
    if layout is None:
        return None
    if bipartite:
        raise ValueError(f"{name}: a GraphLayout describes one node set; bipartite (x_src, x_dst) inputs take none")
    if not isinstance(layout, layout_lib.GraphLayout):
        raise TypeError(f"{name}: layout must be a jgnn.layout.GraphLayout, got {type(layout).__name__}")
    if layout.self_loops != self_loops:
        fix = "GraphLayout.from_graph(graph, self_loops=True)" if self_loops else \
            "GraphLayout.from_graph(graph) (self_loops=False)"
        what = "appends a self-loop per node" if self_loops else "runs on the graph as given, without added loops"
        raise ValueError(f"{name} {what}, but the layout was built with self_loops={layout.self_loops}: "
                         f"build it with {fix}")
    return layout


def reversed_layout(layout):
    """The layout of the graph with every edge reversed (its CSRs swap roles); ``None`` stays ``None``."""
    if layout is None:
        return None
    return layout.reverse()


def existing_loops(graph: jraph.GraphsTuple):
    """bool ``[E]``: the edges that are already self-loops (``senders == receivers``)."""
    return jnp.asarray(graph.senders) == jnp.asarray(graph.receivers)


def loop_graph(graph: jraph.GraphsTuple, sets: NodeSets, per_edge, per_loop) -> jraph.GraphsTuple:
    """``graph`` (already in `NodeSets.graph` form) with self-loops appended and ``edges`` extended.

    ``per_edge`` has ``[E, ...]`` leaves for the existing edges and ``per_loop`` the same structure with
    ``[L, ...]`` leaves for the loops. With one node set ``L = N`` and the loops are ordered by
    `jgnn.layout.append_self_loops` (so ``GraphLayout.from_graph(graph, self_loops=True)`` matches). With two
    (bipartite) sets, the loops join source ``i`` to destination ``i`` for ``i < min(N_src, N_dst)``, as PyG.
    """
    if not sets.bipartite:
        return layout_lib.append_loops(graph._replace(edges=per_edge), per_loop)
    k = min(sets.num_src, sets.num_dst)
    loop = jnp.arange(k, dtype=jnp.int32)
    senders = jnp.concatenate([graph.senders, loop])
    receivers = jnp.concatenate([graph.receivers, loop + sets.num_src])
    return graph._replace(senders=senders, receivers=receivers, edges=layout_lib.extend_edges(per_edge, per_loop),
                          n_edge=graph.n_edge + jnp.asarray([k], graph.n_edge.dtype))


def add_self_loops(graph: jraph.GraphsTuple, *, edge_type: int | None = None) -> jraph.GraphsTuple:
    """Append one edge ``i -> i`` per node (existing self-loops are kept, as PyG's ``add_self_loops``).

    ``n_edge`` grows by ``n_node`` graph by graph; for batches of several graphs the edges are reordered so
    each graph's edges stay contiguous (jraph's convention, which padding masks rely on): the order of
    `jgnn.layout.append_self_loops`. Edge features of the new edges are zero, except ``edges["type"]``, which
    is ``edge_type`` (required when the graph is typed).
    """
    n = graph_lib.num_nodes(graph)
    edges = graph.edges
    if edges is None and edge_type is not None:
        edges = {graph_lib.TYPE_KEY: jnp.zeros((graph_lib.num_edges(graph),), jnp.int32)}

    def fill(path, x):
        key = getattr(path[-1], "key", None) if path else None
        if key == graph_lib.TYPE_KEY and isinstance(edges, Mapping):
            if edge_type is None:
                raise ValueError("typed graph: add_self_loops needs the self-loop relation id (edge_type=)")
            return jnp.full((n,) + x.shape[1:], edge_type, x.dtype)
        return jnp.zeros((n,) + x.shape[1:], x.dtype)

    loops = jax.tree_util.tree_map_with_path(fill, edges)
    return loop_graph(graph, NodeSets(n, n, False), edges, loops)


# ---------------------------------------------------------------------------------------------------------
# per-node aggregates computed by message passing


def aggregate(graph: jraph.GraphsTuple, phi: Callable, reduce: str = "sum", *, backend: str, remat: Any,
              layout=None, self_loops: bool = False, loop_edges=None):
    """``reduce`` (a `REDUCERS` key) of ``phi(src, dst, edge)`` over each node's incoming edges.

    Returns the per-node pytree (``[N, ...]`` leaves; empty mailboxes give 0). ``graph.nodes`` must have
    node rows (they reach ``phi``); the work is done by `jgnn.message_passing`, with ``layout``, ``self_loops``
    and ``loop_edges`` as its layers take them.
    """
    reducer = REDUCERS[reduce]
    layer = message_passing(phi, lambda mb, node: reducer(mb), lambda node, agg: agg, backend=backend, remat=remat)
    return layer(graph, layout=layout, self_loops=self_loops, loop_edges=loop_edges).nodes


def degree_probe(graph: jraph.GraphsTuple, edges=None) -> jraph.GraphsTuple:
    """``graph`` with placeholder node rows and ``edges``, for `aggregate` calls that read only edges."""
    return graph._replace(nodes=jnp.zeros((graph_lib.num_nodes(graph),), jnp.float32), edges=edges)


def in_degree(graph: jraph.GraphsTuple, *, backend: str = "auto", remat: str = "auto", layout=None):
    """In-degree of every node (number of incoming edges, duplicates counted), float32 ``[N]``."""
    return aggregate(degree_probe(graph), lambda src, dst, edge: jnp.ones((), jnp.float32), backend=backend,
                     remat=remat, layout=layout)


def in_degree_per_type(graph: jraph.GraphsTuple, num_types: int, *, backend: str = "auto",
                       remat: str = "auto", layout=None):
    """``[N, num_types]`` float32: how many incoming edges of each type every node has (message passing).

    Counted as the in-degree of the (node, type) pairs, one count per edge, rather than a one-hot row per edge:
    ``E`` values instead of ``E·num_types``. Edges whose type or receiver is out of range count nowhere.
    ``layout`` describes ``graph``, not the pairs, so it is not used.
    """
    del layout
    n = graph_lib.num_nodes(graph)
    types = graph_lib.edge_types(graph)
    if n * num_types >= np.iinfo(np.int32).max:  # the pair ids would overflow: one-hot rows instead
        probe = degree_probe(graph, {graph_lib.TYPE_KEY: types})
        phi = lambda src, dst, edge: jax.nn.one_hot(edge[graph_lib.TYPE_KEY], num_types, dtype=jnp.float32)
        return aggregate(probe, phi, backend=backend, remat=remat)
    receivers, types = graph.receivers.astype(jnp.int32), types.astype(jnp.int32)
    # Edges to a receiver outside [0, N) are dropped, as message passing drops them.
    counted = (types >= 0) & (types < num_types) & (receivers >= 0) & (receivers < n)
    pairs = jnp.where(counted, receivers * num_types + types, -1)
    pair_graph = jraph.GraphsTuple(nodes=jnp.zeros((n * num_types,), jnp.float32), edges=None,
                                   senders=jnp.zeros_like(pairs), receivers=pairs, globals=None,
                                   n_node=jnp.asarray([n * num_types]), n_edge=jnp.asarray([pairs.shape[0]]))
    return in_degree(pair_graph, backend=backend, remat=remat).reshape(n, num_types)


def edge_messages(graph: jraph.GraphsTuple, phi: Callable):
    """``phi`` on every edge, as the reference program evaluates it (used for returned attention weights)."""
    take = lambda idx: jax.tree_util.tree_map(lambda x: x[idx], graph.nodes)
    return jax.vmap(phi)(take(graph.senders), take(graph.receivers), graph.edges)


def edge_softmax(logits, segments, num_segments: int):
    """Softmax of ``logits`` ``[E, ...]`` over the edges sharing a segment id (jraph's ``segment_softmax``)."""
    return jraph.segment_softmax(logits, segments, num_segments)


class Attention(NamedTuple):
    """Attention coefficients returned with ``return_attention_weights=True`` (PyG's ``(edge_index, alpha)``).

    ``senders``/``receivers`` are the edges attention ran over (self-loops included where the layer adds them,
    in `jgnn.layout.append_self_loops` order; bipartite receivers index ``x_dst``). ``weights`` is
    ``[E', heads]``; existing self-loops that a layer masks out have weight 0.
    """

    senders: jax.Array
    receivers: jax.Array
    weights: jax.Array


# ---------------------------------------------------------------------------------------------------------
# dtypes and parameters


def promote(dtype, *xs):
    """Flax's dtype convention: cast ``xs`` (arrays or pytrees; ``None`` kept) to ``dtype``, or, when it is
    ``None``, to the promoted floating dtype of all of them."""
    leaves = [leaf for x in xs for leaf in jax.tree_util.tree_leaves(x)]
    target = nn.dtypes.canonicalize_dtype(*leaves, dtype=dtype)
    cast = {}  # one array passed twice (x_src is x_dst) stays one array

    def convert(a):
        if id(a) not in cast:
            cast[id(a)] = (a, jnp.asarray(a, target))
        return cast[id(a)][1]

    return [jax.tree_util.tree_map(convert, x) for x in xs]


def dtypes(module: nn.Module) -> dict:
    """The module's ``dtype`` and ``param_dtype``, as keyword arguments for its submodules."""
    return {"dtype": module.dtype, "param_dtype": module.param_dtype}


def dense(module: nn.Module, features: int, *, use_bias: bool = True, name: str | None = None) -> nn.Dense:
    """An ``nn.Dense`` with the module's ``dtype``/``param_dtype`` and glorot weights (PyG's Linear)."""
    return nn.Dense(features, use_bias=use_bias, **dtypes(module),
                    kernel_init=nn.initializers.glorot_uniform(), name=name)


def orthogonal_init():
    """The orthogonal initializer (LSTM recurrent kernels) run in float32 and cast: its QR has no bfloat16 or
    float16 kernel on CPU, so a half-precision ``param_dtype`` would fail at ``init``."""
    orthogonal = nn.initializers.orthogonal()
    return lambda key, shape, dtype=jnp.float32: orthogonal(key, shape, jnp.promote_types(dtype, jnp.float32)
                                                            ).astype(dtype)


def lstm_cell(module: nn.Module, features: int, *, name: str | None = None) -> nn.OptimizedLSTMCell:
    """Flax's LSTM cell with the module's ``dtype``/``param_dtype`` (its recurrent kernel from `orthogonal_init`)."""
    return nn.OptimizedLSTMCell(features, **dtypes(module), recurrent_kernel_init=orthogonal_init(), name=name)


def typed_init():
    """Glorot over the last two axes of a stacked ``[T, d_in, d_out]`` weight."""
    return nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2, out_axis=-1, batch_axis=(0,))


# ---------------------------------------------------------------------------------------------------------
# attention dropout


class AttentionDropout(NamedTuple):
    """Counter-based attention dropout: the keep mask is a hash of (seed, edge id, head).

    Nothing edge-sized is drawn or stored: phi recomputes the mask from the int32 edge id, so the backward
    pass (which recomputes edge values) sees the same mask as the forward, and the Pallas kernels use the
    same hash (`pallas_kernels.edge_dropout_keep`).
    """

    seed: jax.Array
    rate: float

    def edge_features(self, num_edges: int) -> dict:
        return {"dropout_id": jnp.arange(num_edges, dtype=jnp.int32)}

    def scale(self, edge, heads: int) -> jax.Array:
        """Inverted-dropout scale ``keep / (1 - rate)`` for one edge's ``heads`` attention weights."""
        if self.rate >= 1.0:
            return jnp.zeros((heads,), jnp.float32)
        keep = pk.edge_dropout_keep(self.seed, edge["dropout_id"], jnp.arange(heads, dtype=jnp.int32), self.rate)
        return keep.astype(jnp.float32) / (1.0 - self.rate)


def attention_dropout(module, rate: float, deterministic: bool) -> AttentionDropout | None:
    """The module's attention dropout for this call, or ``None`` when it is off."""
    if deterministic or rate <= 0.0:
        return None
    seed = jax.random.randint(module.make_rng("dropout"), (), 0, jnp.iinfo(jnp.int32).max, jnp.int32)
    return AttentionDropout(seed, float(rate))


def with_dropout_ids(edges: dict, drop: AttentionDropout | None, num_edges: int) -> dict:
    """``edges`` plus the edge ids that attention dropout hashes, when dropout is on."""
    return edges if drop is None else {**edges, **drop.edge_features(num_edges)}
