"""`GraphLayout`: the sorted edge structures the fused kernels walk, built once on the host.

Holds the destination-sorted CSR (row pointers, source ids, edge ids, degree ordering) and the source-sorted
reverse CSR the backward passes use. For a typed graph it also holds the unique (source, edge type) pairs
(`TypedPairs`), over which Hector's compact materialisation computes typed messages once per pair.
Padding edges of ``jraph.pad_with_graphs`` are excluded from the CSRs so they never form a fake hub.

A layout describes one edge list: the graph's own edges, or (``self_loops=True``) the graph's edges followed
by one ``i -> i`` edge per node, in the order `jgnn.nn` layers append them (`with_self_loops`). It records a
fingerprint of that edge list; a compiled function checks it against the graph it is used with whenever the
graph's arrays are concrete, and raises `LayoutMismatchError` naming the difference. Pass a layout to a layer
(``layer(graph, layout=layout)``) or a compiled function; without it the Pallas kernels sort the edges inside
the program on every call, which `explain` reports.
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


def with_self_loops(senders, receivers, num_nodes: int, xp=jnp):
    """The edge list of a graph plus one ``i -> i`` edge per node, appended (what layers aggregate over)."""
    loop = xp.arange(num_nodes, dtype=np.int32)
    return xp.concatenate([xp.asarray(senders, np.int32), loop]), xp.concatenate([xp.asarray(receivers, np.int32),
                                                                                   loop])


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
    """The CSRs (and typed pairs) of one edge list; ``self_loops``, ``num_nodes`` and ``digest`` are static."""

    csr: pk.CSR
    rev_csr: pk.CSR
    pairs: TypedPairs | None = None
    self_loops: bool = False
    num_nodes: int = 0
    digest: str = ""

    def tree_flatten(self):
        return (self.csr, self.rev_csr, self.pairs), (self.self_loops, self.num_nodes, self.digest)

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
        digest = fingerprint(senders, receivers, types)
        if self_loops:
            senders, receivers = with_self_loops(senders, receivers, n, np)
            valid = np.concatenate([valid, np.ones(n, bool)])
            types = None  # the self-loop relation is the layer's choice: typed pairs describe the graph's own edges
        csr, rev = pk.build_csr_numpy(senders, receivers, n, valid)
        pairs = None if types is None else TypedPairs.from_edges(senders, types)
        return cls(csr, rev, pairs, self_loops, n, digest)

    def edges_name(self, graph: int) -> str:
        """The edge list the compiler matches this layout to (`jgnn.facts.Info.edges`)."""
        return f"g{graph}+loops" if self.self_loops else f"g{graph}"

    def check(self, graph: jraph.GraphsTuple) -> None:
        """Raise `LayoutMismatchError` if the graph's (concrete) edges are not the ones this layout was built for."""
        arrays = (graph.senders, graph.receivers, graph_lib.edge_types(graph))
        if any(a is not None and isinstance(a, jax.core.Tracer) for a in arrays):
            return  # traced: cannot be inspected here (see module docstring)
        n = graph_lib.num_nodes(graph)
        if self.num_nodes and n != self.num_nodes:
            raise LayoutMismatchError(f"the GraphLayout was built for a graph of {self.num_nodes} nodes; this graph "
                                      f"has {n}")
        types = None if arrays[2] is None else np.asarray(arrays[2])
        if self.digest and fingerprint(graph.senders, graph.receivers, types) != self.digest:
            raise LayoutMismatchError("the GraphLayout was built for another graph: this graph's senders, receivers "
                                      "or edge types differ (build it with GraphLayout.from_graph(graph))")


def in_program(senders, receivers, num_nodes: int, valid=None) -> tuple[pk.CSR, pk.CSR]:
    """The CSRs built with traced sorts (used when no layout was passed)."""
    return pk.build_csr_jax(senders, receivers, num_nodes, valid)
