"""`GraphLayout`: the sorted edge structures the fused kernels walk, built once on the host.

Holds the destination-sorted CSR (row pointers, source ids, edge ids, degree ordering) and the source-sorted
reverse CSR the backward passes use. For a typed graph it also holds the unique (source, edge type) pairs
(`TypedPairs`), over which Hector's compact materialisation computes typed messages once per pair.
Padding edges of ``jraph.pad_with_graphs`` are excluded from the CSRs so they never form a fake hub.

A layout describes one edge list: the graph's own edges, or (``self_loops=True``) the graph's edges followed
by one ``i -> i`` edge per node, in the order `append_self_loops` fixes (the one place: `jgnn.nn` layers that add
loops use it too). It records a fingerprint of the graph; a compiled function checks it against the graph it is
used with whenever the graph's arrays are concrete, and raises `LayoutMismatchError` naming the difference. Under
``jit`` the graph is traced: the program compares a checksum of the graph's edges with the layout's
(`GraphLayout.matches`), and its float outputs and their gradients are NaN if they differ.
Pass a layout to a layer (``layer(graph, layout=layout)``) or a compiled function; without it the Pallas kernels
sort the edges inside the program on every call, which `explain` reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jraph
import numpy as np

import pallas_kernels as pk
from jgnn import graph as graph_lib


class LayoutMismatchError(ValueError):
    """A `GraphLayout` was used with a graph whose edges it does not describe."""


class TypedPairs(NamedTuple):
    """The unique (source node, edge type) pairs of a typed graph: ``edge_pair[e]`` indexes them."""

    pair_src: Any  # int32 [U]
    pair_type: Any  # int32 [U]
    edge_pair: Any  # int32 [E]

    @classmethod
    def from_edges(cls, senders, types) -> TypedPairs:
        senders, types = np.asarray(senders, np.int64), np.asarray(types, np.int64)
        base = int(senders.max(initial=0)) + 1
        unique, edge_pair = np.unique(types * base + senders, return_inverse=True)  # sorted by type, then source
        return cls((unique % base).astype(np.int32), (unique // base).astype(np.int32),
                   edge_pair.astype(np.int32).reshape(-1))


def append_self_loops(senders, receivers, n_node, n_edge, num_nodes: int, xp=jnp):
    """The edge list with one ``i -> i`` edge per node appended after the existing edges.

    Args:
      senders, receivers: int ``[E]``.
      n_node, n_edge: int ``[G]`` per-graph counts (unused: kept for the callers' symmetry with jraph batching).
      num_nodes: ``N``, the static number of nodes.

    Returns ``(senders', receivers', None)``: int32 ``[E + N]``, and no reordering. The loops follow every edge
    of the batch rather than each graph's own edges: message passing does not depend on the order of edges, and a
    permutation computed in the program would be data the compiler cannot see through. (A padding graph's loops
    join its own padding nodes, so padding still never reaches a real node.)
    """
    del n_node, n_edge
    loop = xp.arange(num_nodes, dtype=np.int32)
    return (xp.concatenate([xp.asarray(senders, np.int32), loop]),
            xp.concatenate([xp.asarray(receivers, np.int32), loop]), None)


def with_self_loops(graph: jraph.GraphsTuple) -> jraph.GraphsTuple:
    """``graph``'s edge structure with `append_self_loops` applied (``n_edge`` grows by ``n_node``); ``edges`` is
    dropped (`append_loops` extends them)."""
    return append_loops(graph._replace(edges=None), None)


def append_loops(graph: jraph.GraphsTuple, loop_edges) -> jraph.GraphsTuple:
    """``graph`` with `append_self_loops` applied and its ``edges`` extended by ``loop_edges`` (the same pytree
    structure, ``[N, ...]`` leaves: the loops' features; None when ``graph.edges`` is None)."""
    n = graph_lib.num_nodes(graph)
    senders, receivers, _ = append_self_loops(graph.senders, graph.receivers, graph.n_node, graph.n_edge, n)
    if (graph.edges is None) != (loop_edges is None):
        raise ValueError("append_loops: give loop_edges exactly when the graph has edge features "
                         f"(edges: {type(graph.edges).__name__}, loop_edges: {type(loop_edges).__name__})")
    return graph._replace(senders=senders, receivers=receivers, edges=extend_edges(graph.edges, loop_edges),
                          n_edge=graph.n_edge + jnp.asarray(graph.n_node, jnp.result_type(graph.n_edge)))


def extend_edges(edges, loop_edges):
    """Each leaf of ``edges`` followed by its loops' rows from ``loop_edges`` (same structure; None stays None)."""
    return None if edges is None else jax.tree_util.tree_map(
        lambda e, l: jnp.concatenate([e, jnp.asarray(l).astype(e.dtype)]), edges, loop_edges)


def _every_node(ids: np.ndarray, n: int) -> bool:
    """Whether every id in [0, n) occurs in ``ids`` (ids outside that range read no row of their own)."""
    inside = ids[(ids >= 0) & (ids < n)]
    return n > 0 and bool(np.all(np.bincount(inside, minlength=n) > 0))


def fingerprint(senders, receivers, types=None) -> str:
    """A digest of an edge list (and its edge types): what a layout checks a graph against."""
    h = hashlib.blake2b(digest_size=12)
    for arr in (senders, receivers) + (() if types is None else (types,)):
        a = np.ascontiguousarray(np.asarray(arr, np.int64))
        h.update(np.asarray(a.shape, np.int64).tobytes())
        h.update(a.tobytes())
    return h.hexdigest()


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class GraphLayout:
    """The CSRs (and typed pairs) of one edge list; ``self_loops``, ``num_nodes``, ``digest``, ``reversed`` and
    ``pair_groups`` are static (they live in the pytree structure, so they stay Python values under ``jit``).

    ``pair_groups``: ``(edge type, first pair, end pair)`` per edge type, in pair order (the pairs are sorted by
    type): a typed matmul over the pairs is one GEMM per type on static slices, with no sort in the program.
    ``node_groups``: the same runs of the node types, when the graph's nodes are sorted by type (HGT's K, Q and V
    are then one GEMM per node type); ``node_digest`` is what `check` compares the node types with.
    """

    csr: pk.CSR
    rev_csr: pk.CSR
    pairs: TypedPairs | None = None
    self_loops: bool = False
    num_nodes: int = 0
    digest: str = ""
    reversed: bool = False  # describes the graph with every edge turned around (see `reverse`)
    pair_groups: tuple[tuple[int, int, int], ...] = ()
    node_groups: tuple[tuple[int, int, int], ...] = ()
    node_digest: str = ""
    looped_digest: str = ""  # self_loops: the fingerprint of the edges with the loops, which a layer's inner call sees
    num_edges: int = 0  # edges of the list it describes, the loops included (E, or E + N with self_loops)
    # Whether every node id in [0, N) occurs among the senders (receivers) of that list: a node op lifted out of
    # the edges then has no unread row to mask (`jgnn.passes.broadcast_reorder`).
    every_node_sends: bool = False
    every_node_receives: bool = False
    # Whether the graph's own edges (padding included, appended loops not) hold a self-loop; None: not known.
    # `jgnn.nn.gcn_norm` replaces existing loops (PyG's add_remaining_self_loops): known absent, it skips that.
    own_loops: bool | None = None
    # `edge_checksum` of the edges with their types (None: untyped), of the edges alone, and of the looped edges
    # (None: no loops): what `matches` compares in the program, as `check` compares the digests.
    checksums: tuple[int | None, int | None, int | None] = (None, None, None)
    plain_digest: str = ""  # the fingerprint of the edges without their types

    def tree_flatten(self):
        return (self.csr, self.rev_csr, self.pairs), (self.self_loops, self.num_nodes, self.digest, self.reversed,
                                                      self.pair_groups, self.node_groups, self.node_digest,
                                                      self.looped_digest, self.num_edges, self.every_node_sends,
                                                      self.every_node_receives, self.own_loops, self.checksums,
                                                      self.plain_digest)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    @classmethod
    def from_graph(cls, graph: jraph.GraphsTuple, *, padded: bool = False, self_loops: bool = False) -> GraphLayout:
        """Build on the host with numpy. ``padded=True`` drops the padding graph's edges (jraph convention);
        ``self_loops=True`` describes the graph's edges plus one self-loop per node (`with_self_loops`)."""
        graph_lib.validate(graph)
        n = graph_lib.num_nodes(graph)
        senders, receivers = np.asarray(graph.senders), np.asarray(graph.receivers)
        valid = np.asarray(jraph.get_edge_padding_mask(graph)) if padded else np.ones(senders.shape, bool)
        types = graph_lib.edge_types(graph)
        types = None if types is None else np.asarray(types)
        digest, plain_digest = fingerprint(senders, receivers, types), fingerprint(senders, receivers)
        looped_digest = ""
        typed = None if types is None else int(edge_checksum(senders, receivers, types, np))
        checksums = (typed, int(edge_checksum(senders, receivers, None, np)), None)
        own_loops = bool(np.any(senders == receivers))
        if self_loops:
            senders, receivers, _ = append_self_loops(senders, receivers, graph.n_node, graph.n_edge, n, np)
            looped_digest = fingerprint(senders, receivers)
            checksums = checksums[:2] + (int(edge_checksum(senders, receivers, None, np)),)
            loops_valid = np.asarray(jraph.get_node_padding_mask(graph)) if padded else np.ones(n, bool)
            valid = np.concatenate([valid, loops_valid])  # a padding node's loop is padding
            types = None  # the self-loop relation is the layer's choice: typed pairs describe the graph's own edges
        csr, rev = pk.build_csr_numpy(senders, receivers, n, valid)
        pairs = None if types is None else TypedPairs.from_edges(senders, types)
        node_types = graph_lib.node_types(graph)
        node_groups = _node_runs(node_types)
        return cls(csr, rev, pairs, self_loops, n, digest, pair_groups=_groups(pairs), node_groups=node_groups,
                   node_digest=_node_digest(node_types) if node_groups else "", looped_digest=looped_digest,
                   num_edges=int(senders.shape[0]), every_node_sends=_every_node(senders, n),
                   every_node_receives=_every_node(receivers, n), own_loops=own_loops, checksums=checksums,
                   plain_digest=plain_digest)

    def reverse(self) -> GraphLayout:
        """The layout of the graph with every edge turned around: its two CSRs swap roles."""
        return dataclasses.replace(self, csr=self.rev_csr, rev_csr=self.csr, pairs=None, reversed=not self.reversed,
                                   pair_groups=(), every_node_sends=self.every_node_receives,
                                   every_node_receives=self.every_node_sends)

    def edges_name(self, graph: int) -> str:
        """The edge list the compiler matches this layout to (`jgnn.facts.Info.edges`)."""
        return f"g{graph}+loops" if self.self_loops else f"g{graph}"

    def looped_input(self, graph: jraph.GraphsTuple) -> bool:
        """Whether ``graph``'s own edges are this layout's looped list: a layer appends the loops itself and passes
        the result with the layout to its inner call (the edge count tells it from the graph without loops)."""
        return self.self_loops and graph.senders is not None and np.shape(graph.senders)[0] == self.num_edges

    def check(self, graph: jraph.GraphsTuple) -> None:
        """Raise `LayoutMismatchError` if the graph's (concrete) edges are not the ones this layout was built for.
        Traced edges are checked in the program instead (`matches`)."""
        arrays = (graph.senders, graph.receivers, graph_lib.edge_types(graph))
        if any(a is not None and isinstance(a, jax.core.Tracer) for a in arrays):
            return  # traced: cannot be inspected here (see module docstring)
        n = graph_lib.num_nodes(graph)
        if self.num_nodes and n != self.num_nodes:
            raise LayoutMismatchError(f"the GraphLayout was built for a graph of {self.num_nodes} nodes; this graph "
                                      f"has {n}")
        types = None if arrays[2] is None else np.asarray(arrays[2])
        senders, receivers = (graph.receivers, graph.senders) if self.reversed else (graph.senders, graph.receivers)
        # Its own edges (with their types, where both have types), or those edges with the loops appended.
        plain, plain_own = fingerprint(senders, receivers), self.plain_digest or self.digest
        own = plain == plain_own
        if own and types is not None and not self.reversed and self.digest != plain_own:  # a typed layout
            own = fingerprint(senders, receivers, types) == self.digest
        if self.digest and not (own or plain == self.looped_digest):
            raise LayoutMismatchError("the GraphLayout was built for another graph: this graph's senders, receivers "
                                      "or edge types differ (build it with GraphLayout.from_graph(graph))")
        node_types = graph_lib.node_types(graph)
        if self.node_digest and node_types is not None and not isinstance(node_types, jax.core.Tracer) \
                and _node_digest(node_types) != self.node_digest:
            raise LayoutMismatchError("the GraphLayout was built for a graph whose nodes are sorted by type; this "
                                      "graph's node types differ (build it with GraphLayout.from_graph(graph))")

    def matches(self, graph: jraph.GraphsTuple) -> jax.Array:
        """In the program, whether the graph's edges (and edge and node types) are the ones this layout describes,
        as `check` decides it on the host, by `edge_checksum` instead of the fingerprint: a scalar bool. `check`
        cannot read traced arrays; a compiled function uses this instead and makes its float outputs (and so
        their gradients) NaN where it is false (`jgnn.compiler`), so a layout built for another graph of the same
        sizes never gives a silently wrong answer under ``jit``. One pass over the edges, no gathers."""
        senders, receivers = (graph.receivers, graph.senders) if self.reversed else (graph.senders, graph.receivers)
        if senders is None or receivers is None or self.checksums[1] is None:
            return jnp.asarray(True)
        n = graph_lib.num_nodes(graph)
        if self.num_nodes and n != self.num_nodes:
            return jnp.asarray(False)
        types = None if self.reversed else graph_lib.edge_types(graph)
        typed, own, looped = (None if c is None else jnp.asarray(c, jnp.uint32) for c in self.checksums)
        plain = edge_checksum(senders, receivers)
        ok = plain == own  # as `check`: its own edges (with their types where both have types), or the looped list
        if types is not None and typed is not None:
            ok &= edge_checksum(senders, receivers, types) == typed
        if looped is not None:
            ok |= plain == looped
        node_types = graph_lib.node_types(graph)
        if self.node_groups and node_types is not None:
            want = np.concatenate([np.full(hi - lo, t, np.int32) for t, lo, hi in self.node_groups])
            ok &= jnp.array_equal(node_types, want)
        return ok


def edge_checksum(senders, receivers, types=None, xp=jnp):
    """A uint32 checksum of an edge list (and its edge types), the same in numpy (``xp=np``) and in a program:
    each edge's ids and position mixed (multiplications and shifts that wrap in uint32), then summed. Not a
    cryptographic hash: it tells another graph from this one, as `fingerprint` does, but in one pass over the
    edges inside a program."""
    u = lambda x: xp.asarray(x, xp.uint32) if isinstance(x, int) else xp.asarray(x).astype(xp.uint32)  # noqa: E731
    position = xp.arange(xp.shape(senders)[0], dtype=xp.uint32)
    x = u(senders) * u(0x9E3779B1) ^ (u(receivers) * u(0x85EBCA77) + position * u(0xC2B2AE3D))
    if types is not None:
        x = x ^ u(types) * u(0x27D4EB2F)
    x = (x ^ (x >> u(15))) * u(0x2C1B3C6D)
    x = x ^ (x >> u(12))
    return xp.sum(x, dtype=xp.uint32)


def _groups(pairs: TypedPairs | None) -> tuple[tuple[int, int, int], ...]:
    return () if pairs is None else _runs(np.asarray(pairs.pair_type))


def _runs(types: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """``(type, first, end)`` per type of a non-empty array sorted by type (each type is one run)."""
    values, starts = np.unique(types, return_index=True)
    ends = np.append(starts[1:], types.shape[0])
    return tuple((int(t), int(lo), int(hi)) for t, lo, hi in zip(values, starts, ends, strict=True))


def _node_runs(types) -> tuple[tuple[int, int, int], ...]:
    """The runs of concrete node types sorted by type; () when they are not sorted (a padded graph's padding
    nodes, say), absent or empty."""
    if types is None or isinstance(types, jax.core.Tracer) or np.ndim(types) != 1 or not np.size(types):
        return ()
    types = np.asarray(types)
    return () if np.any(np.diff(types) < 0) else _runs(types)


def _node_digest(types) -> str:
    return hashlib.blake2b(np.ascontiguousarray(np.asarray(types, np.int64)).tobytes(), digest_size=12).hexdigest()


def in_program(senders, receivers, num_nodes: int, valid=None) -> tuple[pk.CSR, pk.CSR]:
    """The CSRs built with traced sorts (used when no layout was passed)."""
    return pk.build_csr_jax(senders, receivers, num_nodes, valid)
