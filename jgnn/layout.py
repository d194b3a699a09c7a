"""`GraphLayout`: the sorted edge structures the fused kernels walk, built once on the host.

Holds the destination-sorted CSR (row pointers, source ids, edge ids, degree ordering) and the source-sorted
reverse CSR the backward passes use. Padding edges of ``jraph.pad_with_graphs`` are excluded so they never
form a fake hub. Pass it to a layer (``layer(graph, layout=layout)``) or a compiled function; without it the
fused ops sort the edges inside the program on every call, which `explain` reports.
"""

from __future__ import annotations

from typing import NamedTuple

import jraph
import numpy as np

import pallas_kernels as pk
from jgnn import graph as graph_lib


class GraphLayout(NamedTuple):
    csr: pk.CSR
    rev_csr: pk.CSR

    @classmethod
    def from_graph(cls, graph: jraph.GraphsTuple, *, padded: bool = False) -> GraphLayout:
        """Build on the host with numpy; ``padded=True`` drops the padding graph's edges (jraph convention)."""
        n = graph_lib.num_nodes(graph)
        valid = np.asarray(jraph.get_edge_padding_mask(graph)) if padded else None
        csr, rev = pk.build_csr_numpy(np.asarray(graph.senders), np.asarray(graph.receivers), n, valid)
        return cls(csr, rev)


def in_program(senders, receivers, num_nodes: int) -> GraphLayout:
    """The same layout built with traced sorts (used when no layout was passed)."""
    csr, rev = pk.build_csr_jax(senders, receivers, num_nodes)
    return GraphLayout(csr, rev)
