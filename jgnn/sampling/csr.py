"""The in-edges of every node as a host-side CSR, the structure every sampler walks."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class InCSR(NamedTuple):
    """In-edges grouped by receiver: node ``v``'s in-edges are ``indptr[v]:indptr[v + 1]``, with source nodes
    ``senders[...]`` and original edge ids ``edge_ids[...]`` (int64 numpy arrays; stable order within a node)."""

    indptr: np.ndarray
    senders: np.ndarray
    edge_ids: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.senders.shape[0])

    def in_degree(self) -> np.ndarray:
        return np.diff(self.indptr)


def in_csr(senders, receivers, num_nodes: int) -> InCSR:
    """Build the in-edge CSR of a graph with edges ``senders[e] -> receivers[e]`` over ``num_nodes`` nodes.

    Raises ``ValueError`` when the edge arrays differ in shape or an endpoint lies outside ``[0, num_nodes)``.
    """
    senders, receivers = np.asarray(senders, np.int64).reshape(-1), np.asarray(receivers, np.int64).reshape(-1)
    if senders.shape != receivers.shape:
        raise ValueError(f"senders {senders.shape} and receivers {receivers.shape} differ in shape")
    for name, ids in (("senders", senders), ("receivers", receivers)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
            raise ValueError(f"{name} hold ids outside [0, {num_nodes})")
    order = np.argsort(receivers, kind="stable")
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(receivers, minlength=num_nodes), out=indptr[1:])
    return InCSR(indptr, senders[order], order.astype(np.int64))


def segment_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every (s, l) pair, vectorised."""
    lengths = np.asarray(lengths, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.arange(offsets[-1], dtype=np.int64) + np.repeat(np.asarray(starts, np.int64) - offsets[:-1], lengths)


def as_csr(graph) -> InCSR:
    """An `InCSR` as is, or the in-edge CSR of a ``jraph.GraphsTuple`` (all its graphs as one node set)."""
    if isinstance(graph, InCSR):
        return graph
    num_nodes = int(np.sum(np.asarray(graph.n_node)))
    return in_csr(np.asarray(graph.senders), np.asarray(graph.receivers), num_nodes)
