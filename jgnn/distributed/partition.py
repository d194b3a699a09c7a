"""Partition a graph's nodes into P parts: METIS (``pymetis``) when installed, else linear deterministic greedy.

The partition is an assignment ``part[v] in [0, P)`` of every node; edges follow their receiver (see
`jgnn.distributed.halo`), so an edge is *cut* when its sender lives in another part than its receiver.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import jraph
import numpy as np

METHODS = ("auto", "metis", "ldg")


@dataclasses.dataclass(frozen=True)
class PartitionStats:
    """How good a partition is, as numbers.

    ``method``: the partitioner that ran (``"metis"`` or ``"ldg"``). ``num_parts``: P. ``sizes``: nodes per part.
    ``edges``: edges per part (each edge belongs to its receiver's part). ``edge_cut``: edges whose sender is in
    another part; ``cut_fraction``: that over all edges. ``node_imbalance``/``edge_imbalance``: the largest part
    over the mean part (1.0 is perfect balance). ``halo``: remote senders each part reads (its ghost nodes).
    """

    method: str
    num_parts: int
    sizes: tuple[int, ...]
    edges: tuple[int, ...]
    edge_cut: int
    cut_fraction: float
    node_imbalance: float
    edge_imbalance: float
    halo: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Partition:
    """``assignment`` int32 ``[N]``: the part of each node; ``stats``: its `PartitionStats`."""

    assignment: np.ndarray
    stats: PartitionStats


def _undirected_csr(senders: np.ndarray, receivers: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric adjacency without self-loops or duplicates, as (offsets [n+1], neighbours)."""
    keep = senders != receivers
    a = np.concatenate([senders[keep], receivers[keep]]).astype(np.int64)
    b = np.concatenate([receivers[keep], senders[keep]]).astype(np.int64)
    key = np.unique(a * n + b)
    a, b = key // n, key % n
    offsets = np.zeros(n + 1, np.int64)
    np.add.at(offsets, a + 1, 1)
    return np.cumsum(offsets), b


def linear_deterministic_greedy(senders: np.ndarray, receivers: np.ndarray, n: int, parts: int,
                                slack: float = 0.05) -> np.ndarray:
    """Streaming partition (Stanton & Kliot, KDD 2012, "LDG"): visit nodes in id order and put each in the part
    holding most of its already placed neighbours, weighted by ``1 - size/capacity`` with capacity
    ``ceil(n/P)·(1+slack)``; ties go to the smallest part, then the lowest id. Deterministic, O(N + E)."""
    offsets, nbrs = _undirected_csr(senders, receivers, n)
    capacity = max(1.0, np.ceil(n / parts) * (1.0 + slack))
    assignment = np.full(n, -1, np.int64)
    sizes = np.zeros(parts, np.int64)
    for v in range(n):
        placed = assignment[nbrs[offsets[v]:offsets[v + 1]]]
        counts = np.bincount(placed[placed >= 0], minlength=parts).astype(np.float64)
        score = counts * (1.0 - sizes / capacity)
        score[sizes >= capacity] = -np.inf
        best = np.flatnonzero(score == score.max())
        p = best[np.argmin(sizes[best])]
        assignment[v] = p
        sizes[p] += 1
    return assignment.astype(np.int32)


def _metis(senders: np.ndarray, receivers: np.ndarray, n: int, parts: int) -> np.ndarray:
    import pymetis

    offsets, nbrs = _undirected_csr(senders, receivers, n)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis 2025+: xadj/adjncy keywords are deprecated
        _, membership = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(offsets, nbrs))
    else:  # pragma: no cover - older pymetis
        _, membership = pymetis.part_graph(parts, xadj=offsets, adjncy=nbrs)
    return np.asarray(membership, np.int32)


def metis_available() -> bool:
    """Whether METIS can partition here: the ``pymetis`` binding (the ``distributed`` extra) is importable.
    Without it ``partition(..., method="auto")`` uses linear deterministic greedy streaming (``"ldg"``)."""
    return importlib.util.find_spec("pymetis") is not None


def partition_stats(method: str, assignment: np.ndarray, senders: np.ndarray, receivers: np.ndarray,
                    parts: int) -> PartitionStats:
    sizes = np.bincount(assignment, minlength=parts)
    owner = assignment[receivers]
    edges = np.bincount(owner, minlength=parts)
    cut = assignment[senders] != owner
    halo = tuple(len(np.unique(senders[cut & (owner == p)])) for p in range(parts))
    mean = lambda a: max(float(np.mean(a)), 1e-30)
    return PartitionStats(method=method, num_parts=parts, sizes=tuple(int(s) for s in sizes),
                          edges=tuple(int(e) for e in edges), edge_cut=int(cut.sum()),
                          cut_fraction=float(cut.mean()) if len(cut) else 0.0,
                          node_imbalance=float(sizes.max() / mean(sizes)),
                          edge_imbalance=float(edges.max() / mean(edges)) if len(cut) else 1.0, halo=halo)


def partition(graph: jraph.GraphsTuple, num_parts: int, method: str = "auto") -> Partition:
    """Partition ``graph``'s nodes into ``num_parts`` parts.

    ``method``: ``"metis"`` (``pymetis``, the ``distributed`` extra), ``"ldg"`` (`linear_deterministic_greedy`)
    or ``"auto"`` (METIS when installed, else LDG). Edge direction is ignored for the partition; cut and balance
    are measured with edges assigned to their receiver's part.
    """
    if method not in METHODS:
        raise ValueError(f"partition: method must be one of {METHODS}, got {method!r}")
    if not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"partition: num_parts must be a positive int, got {num_parts!r}")
    senders, receivers = np.asarray(graph.senders), np.asarray(graph.receivers)
    n = int(np.sum(np.asarray(graph.n_node)))
    if method == "metis" and not metis_available():
        raise ValueError("partition: method='metis' needs pymetis (pip install 'jgnn[distributed]')")
    if method == "auto":
        method = "metis" if metis_available() else "ldg"
    if num_parts == 1:
        assignment = np.zeros(n, np.int32)
    elif method == "metis":
        assignment = _metis(senders, receivers, n, num_parts)
    else:
        assignment = linear_deterministic_greedy(senders, receivers, n, num_parts)
    return Partition(assignment, partition_stats(method, assignment, senders, receivers, num_parts))
