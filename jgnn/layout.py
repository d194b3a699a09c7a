"""`GraphLayout`: the sorted edge structures the fused kernels walk, built once on the host.

Holds the destination-sorted CSR (row pointers, source ids, edge ids, degree ordering) and the source-sorted
reverse CSR the backward passes use. For a typed graph it also holds the unique (source, edge type) pairs
(`TypedPairs`), over which Hector's compact materialisation computes typed messages once per pair.
Padding edges of ``jraph.pad_with_graphs`` are excluded from the CSRs so they never form a fake hub. Pass a
layout to a layer (``layer(graph, layout=layout)``) or a compiled function; without it the fused ops sort
the edges inside the program on every call, which `explain` reports.
"""

from __future__ import annotations

from typing import NamedTuple

import jraph
import numpy as np

import pallas_kernels as pk
from jgnn import graph as graph_lib


class TypedPairs(NamedTuple):
    """The unique (source node, edge type) pairs of a typed graph: ``edge_pair[e]`` indexes them."""

    pair_src: np.ndarray  # int32 [U]
    pair_type: np.ndarray  # int32 [U]
    edge_pair: np.ndarray  # int32 [E]

    @classmethod
    def from_edges(cls, senders, types) -> TypedPairs:
        senders, types = np.asarray(senders, np.int64), np.asarray(types, np.int64)
        keys = types * (int(senders.max(initial=0)) + 1) + senders  # sorted by type, then source
        unique, edge_pair = np.unique(keys, return_inverse=True)
        base = int(senders.max(initial=0)) + 1
        return cls((unique % base).astype(np.int32), (unique // base).astype(np.int32),
                   edge_pair.astype(np.int32).reshape(-1))


class GraphLayout(NamedTuple):
    csr: pk.CSR
    rev_csr: pk.CSR
    pairs: TypedPairs | None = None

    @classmethod
    def from_graph(cls, graph: jraph.GraphsTuple, *, padded: bool = False) -> GraphLayout:
        """Build on the host with numpy; ``padded=True`` drops the padding graph's edges (jraph convention)."""
        n = graph_lib.num_nodes(graph)
        valid = np.asarray(jraph.get_edge_padding_mask(graph)) if padded else None
        csr, rev = pk.build_csr_numpy(np.asarray(graph.senders), np.asarray(graph.receivers), n, valid)
        types = graph_lib.edge_types(graph)
        pairs = None if types is None else TypedPairs.from_edges(graph.senders, types)
        return cls(csr, rev, pairs)


def in_program(senders, receivers, num_nodes: int) -> GraphLayout:
    """The same layout built with traced sorts (used when no layout was passed)."""
    csr, rev = pk.build_csr_jax(senders, receivers, num_nodes)
    return GraphLayout(csr, rev)
