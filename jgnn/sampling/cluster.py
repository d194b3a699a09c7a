"""ClusterGCN batches (Chiang et al., 2019): partition the nodes into clusters once; each batch is the union of
``q`` random clusters with the edges among them, padded to static budgets."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from jgnn.sampling.batch import Batch, pad_subgraph
from jgnn.sampling.csr import InCSR, as_csr, in_csr, segment_ranges
from jgnn.sampling.neighbor import _wrap


def _bfs_order(csr: InCSR) -> np.ndarray:
    """Nodes in breadth-first order over an (undirected) CSR, each component from its smallest unvisited id."""
    visited = np.zeros(csr.num_nodes, bool)
    order, degree = [], csr.in_degree()
    for start in range(csr.num_nodes):
        if visited[start]:
            continue
        frontier = np.array([start], np.int64)
        visited[start] = True
        while frontier.size:
            order.append(frontier)
            reached = csr.senders[segment_ranges(csr.indptr[frontier], degree[frontier])]
            _, first = np.unique(reached, return_index=True)
            reached = reached[np.sort(first)]
            frontier = reached[~visited[reached]]
            visited[frontier] = True
    return np.concatenate(order) if order else np.zeros(0, np.int64)


def _bfs_partition(csr: InCSR, num_parts: int) -> np.ndarray:
    order = _bfs_order(csr)
    parts = np.empty(csr.num_nodes, np.int64)
    parts[order] = np.arange(csr.num_nodes) * num_parts // max(csr.num_nodes, 1)
    return parts


def _metis_partition(csr: InCSR, num_parts: int) -> np.ndarray | None:
    """METIS (``pymetis``) on a symmetric CSR without self-loops or duplicate edges; ``None`` without pymetis."""
    try:
        import pymetis
    except ImportError:
        return None
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025 deprecates the bare xadj/adjncy arguments
        _, membership = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(csr.indptr, csr.senders))
    else:
        _, membership = pymetis.part_graph(num_parts, xadj=csr.indptr, adjncy=csr.senders)
    return np.asarray(membership, np.int64)


def partition(graph, num_parts: int, *, method: str = "auto") -> np.ndarray:
    """Cluster id in ``[0, num_parts)`` of every node, deterministic, over the graph with its edges undirected.

    ``method``: ``"metis"`` (``pymetis``, which must be installed), ``"bfs"`` (the breadth-first order cut into
    ``num_parts`` runs of equal size: balanced, and neighbours mostly share a run) or ``"auto"`` (METIS when
    ``pymetis`` imports, else BFS). ``graph``: an `InCSR` or a ``jraph.GraphsTuple``.
    """
    if method not in ("auto", "metis", "bfs"):
        raise ValueError(f"partition method must be 'auto', 'metis' or 'bfs', got {method!r}")
    csr = as_csr(graph)
    if not 1 <= num_parts <= max(csr.num_nodes, 1):
        raise ValueError(f"num_parts must lie in [1, {csr.num_nodes}], got {num_parts}")
    receivers = np.repeat(np.arange(csr.num_nodes), csr.in_degree())
    pairs = np.unique(np.concatenate([csr.senders * csr.num_nodes + receivers,
                                      receivers * csr.num_nodes + csr.senders]))
    pairs = pairs[pairs // csr.num_nodes != pairs % csr.num_nodes]  # METIS rejects self-loops
    undirected = in_csr(pairs // csr.num_nodes, pairs % csr.num_nodes, csr.num_nodes)
    parts = _metis_partition(undirected, num_parts) if method in ("auto", "metis") else None
    if parts is None and method == "metis":
        raise ImportError("partition(method='metis') needs pymetis (pip install pymetis)")
    return _bfs_partition(undirected, num_parts) if parts is None else parts


_DENSE_BOUND_PARTS = 4096  # beyond this a P x P matrix of cross-cluster edge counts is too large to keep


def _induced_edge_bound(csr: InCSR, parts: np.ndarray, num_parts: int, q: int) -> int:
    """An upper bound on the induced edges of any ``q`` clusters: per cluster, its internal edges plus its ``q - 1``
    largest in-edge counts from other clusters; then the sum over the ``q`` largest such bounds."""
    receivers = np.repeat(np.arange(csr.num_nodes), csr.in_degree())
    if num_parts > _DENSE_BOUND_PARTS:
        per_part = np.bincount(parts[receivers], minlength=num_parts)
        return int(np.sort(per_part)[::-1][:q].sum())
    counts = np.zeros((num_parts, num_parts), np.int64)  # [receiving cluster, sending cluster]
    np.add.at(counts, (parts[receivers], parts[csr.senders]), 1)
    internal = np.diagonal(counts).copy()
    np.fill_diagonal(counts, 0)
    cross = np.sort(counts, axis=1)[:, ::-1][:, :q - 1].sum(1)
    return int(np.sort(internal + cross)[::-1][:q].sum())


class ClusterLoader:
    """ClusterGCN batches: each epoch shuffles the clusters and yields the union of every ``clusters_per_batch``
    of them with their induced edges (both ends in the batch), padded to static budgets: the nodes of the
    ``clusters_per_batch`` largest clusters (plus the padding node) and a bound on the induced edges of any
    ``clusters_per_batch`` clusters (each cluster's internal edges plus its largest in-edge counts from others).

    ``parts``: cluster id per node (`partition`). ``features``/``labels`` as for `NeighborLoader`; ``mask``
    ``[N]`` bool: the nodes that count in a batch's ``mask`` (e.g. the training nodes; ``None``: all). Epoch
    ``e`` uses ``np.random.default_rng([seed, e])``; ``prefetch`` and ``progress`` as for `NeighborLoader`.
    """

    def __init__(self, graph, parts, *, clusters_per_batch: int, features=None, labels=None, mask=None,
                 seed: int = 0, prefetch: int = 2, progress: bool = False, desc: str = "clusters"):
        self.csr = as_csr(graph)
        self.parts = np.asarray(parts, np.int64).reshape(-1)
        if self.parts.shape[0] != self.csr.num_nodes or (self.parts.size and self.parts.min() < 0):
            raise ValueError(f"parts must hold a cluster id >= 0 for each of the {self.csr.num_nodes} nodes")
        self.num_parts = int(self.parts.max(initial=-1)) + 1
        if not 1 <= clusters_per_batch <= self.num_parts:
            raise ValueError(f"clusters_per_batch must lie in [1, {self.num_parts}], got {clusters_per_batch}")
        self.q, self.seed = clusters_per_batch, seed
        self.features, self.labels = features, None if labels is None else np.asarray(labels)
        self.mask = np.ones(self.csr.num_nodes, bool) if mask is None else np.asarray(mask, bool)
        self._members = np.argsort(self.parts, kind="stable")
        self._bounds = np.concatenate([[0], np.cumsum(np.bincount(self.parts, minlength=self.num_parts))])
        sizes = np.diff(self._bounds)
        self.node_budget = int(np.sort(sizes)[::-1][:self.q].sum()) + 1
        self.edge_budget = max(_induced_edge_bound(self.csr, self.parts, self.num_parts, self.q), 1)
        self.prefetch, self.progress, self.desc = prefetch, progress, desc
        self._next_epoch = 0

    def __len__(self) -> int:
        return -(-self.num_parts // self.q)

    def subgraph(self, clusters) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(node_ids, senders, receivers, edge_ids)`` of the union of ``clusters``, local ids into node_ids."""
        clusters = np.asarray(clusters, np.int64)
        nodes = self._members[segment_ranges(self._bounds[clusters], np.diff(self._bounds)[clusters])]
        degree = self.csr.in_degree()[nodes]
        positions = segment_ranges(self.csr.indptr[nodes], degree)
        receivers = np.repeat(np.arange(nodes.shape[0]), degree)
        chosen = np.zeros(self.num_parts, bool)
        chosen[clusters] = True
        keep = chosen[self.parts[self.csr.senders[positions]]]
        order = np.argsort(nodes, kind="stable")
        senders = order[np.searchsorted(nodes, self.csr.senders[positions[keep]], sorter=order)]
        return nodes, senders, receivers[keep], self.csr.edge_ids[positions[keep]]

    def _batches(self, epoch: int) -> Iterator[Batch]:
        order = np.random.default_rng([self.seed, epoch]).permutation(self.num_parts)
        for i in range(len(self)):
            nodes, senders, receivers, edge_ids = self.subgraph(order[i * self.q:(i + 1) * self.q])
            yield pad_subgraph(nodes, senders, receivers, edge_ids, self.mask[nodes], node_budget=self.node_budget,
                               edge_budget=self.edge_budget, features=self.features, labels=self.labels)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The batches of epoch ``epoch`` (deterministic), prefetched and with a progress bar as configured."""
        return _wrap(lambda: self._batches(epoch), len(self), self.prefetch, self.progress, f"{self.desc} {epoch}")

    def __iter__(self) -> Iterator[Batch]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)
