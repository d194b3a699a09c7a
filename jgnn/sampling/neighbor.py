"""GraphSAGE neighbour sampling (Hamilton et al., 2017), as PyG's ``NeighborLoader``: padded, fixed-shape batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from jgnn.sampling.batch import Batch, pad_subgraph
from jgnn.sampling.csr import InCSR, as_csr, segment_ranges
from jgnn.sampling.prefetch import Prefetcher


class Subgraph(NamedTuple):
    """A sampled subgraph before padding: ``node_ids`` int64 (global ids; the seeds first, then each hop's new
    nodes in order of discovery), ``senders``/``receivers`` int64 local row ids into ``node_ids``, ``edge_ids``
    int64 (each edge's index in the full graph) and ``num_sampled_nodes``: the number of nodes first reached at
    each hop (hop 0: the seeds), as PyG's ``num_sampled_nodes``."""

    node_ids: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    edge_ids: np.ndarray
    num_sampled_nodes: tuple[int, ...]

    @property
    def num_seeds(self) -> int:
        return self.num_sampled_nodes[0]


def _check_fanouts(fanouts: Sequence[int]) -> list[int]:
    fanouts = [int(f) for f in fanouts]
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise ValueError(f"fanouts must be a non-empty list of positive ints (or -1 for all neighbours): {fanouts}")
    return fanouts


def _sample_in_edges(csr: InCSR, frontier: np.ndarray, fanout: int, rng: np.random.Generator) -> np.ndarray:
    """Positions in the CSR of up to ``fanout`` in-edges of each frontier node, drawn uniformly without
    replacement; a node with at most ``fanout`` in-edges (or ``fanout == -1``) keeps them all."""
    starts, degree = csr.indptr[frontier], np.diff(csr.indptr)[frontier]
    positions = segment_ranges(starts, degree)
    if fanout < 0 or not np.any(degree > fanout):
        return positions
    # a random key per edge; the `fanout` smallest keys of each node are a uniform draw without replacement
    owner = np.repeat(np.arange(frontier.shape[0]), degree)
    order = np.lexsort((rng.random(positions.shape[0]), owner))
    rank = np.arange(positions.shape[0]) - np.repeat(np.concatenate([[0], np.cumsum(degree)[:-1]]), degree)
    return positions[order[rank < fanout]]


def _first_occurrences(ids: np.ndarray) -> np.ndarray:
    """The distinct values of ``ids`` in order of first occurrence."""
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def sample_neighbors(graph, seeds, fanouts: Sequence[int], rng: np.random.Generator) -> Subgraph:
    """Sample the ``len(fanouts)``-hop in-neighbourhood of ``seeds`` (distinct global node ids).

    Hop ``k`` draws up to ``fanouts[k]`` in-edges of every node first reached at hop ``k - 1`` (the seeds at hop
    0), without replacement; ``-1`` takes all. Every node is expanded at most once, as in PyG's ``NeighborLoader``,
    so with fan-outs at least the maximum in-degree an ``L``-layer model's outputs on the seeds equal its
    full-graph outputs. ``graph`` is an `InCSR` or a ``jraph.GraphsTuple``.
    """
    csr, fanouts = as_csr(graph), _check_fanouts(fanouts)
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    if np.unique(seeds).shape[0] != seeds.shape[0]:
        raise ValueError("seeds must be distinct node ids")
    if seeds.size and (seeds.min() < 0 or seeds.max() >= csr.num_nodes):
        raise ValueError(f"seeds hold ids outside [0, {csr.num_nodes})")
    nodes, frontier, picked = [seeds], seeds, []
    seen = seeds
    for fanout in fanouts:
        positions = _sample_in_edges(csr, frontier, fanout, rng)
        picked.append(positions)
        sources = csr.senders[positions]
        new = _first_occurrences(sources)
        frontier = new[~np.isin(new, seen)]
        nodes.append(frontier)
        seen = np.concatenate([seen, frontier])
    positions = np.concatenate(picked)
    node_ids = np.concatenate(nodes)
    # receivers from the CSR row of each position (one searchsorted over indptr, whatever the fan-out)
    receivers = np.searchsorted(csr.indptr, positions, side="right") - 1
    order = np.argsort(node_ids, kind="stable")
    local = lambda ids: order[np.searchsorted(node_ids, ids, sorter=order)]
    return Subgraph(node_ids, local(csr.senders[positions]), local(receivers), csr.edge_ids[positions],
                    tuple(int(n.shape[0]) for n in nodes))


def neighbor_budgets(csr: InCSR, batch_size: int, fanouts: Sequence[int]) -> tuple[int, int]:
    """Static ``(node_budget, edge_budget)`` that hold any batch of ``batch_size`` seeds: hop ``k`` adds at most
    ``frontier * min(fanouts[k], max in-degree)`` edges and as many nodes; capped by the graph's own sizes. The
    node budget includes the padding graph's node."""
    fanouts = _check_fanouts(fanouts)
    max_degree = int(csr.in_degree().max(initial=0))
    frontier, nodes, edges = batch_size, batch_size, 0
    for fanout in fanouts:
        hop = frontier * (max_degree if fanout < 0 else min(fanout, max_degree))
        nodes, edges, frontier = nodes + hop, edges + hop, hop
    return min(nodes, csr.num_nodes) + 1, max(min(edges, csr.num_edges), 1)


class NeighborLoader:
    """Batches of ``batch_size`` seed nodes with their sampled ``len(fanouts)``-hop in-neighbourhoods, padded to
    static budgets (`neighbor_budgets`, or ``node_budget``/``edge_budget``) so a jitted step compiles once.

    ``graph``: an `InCSR` or a ``jraph.GraphsTuple`` (its CSR is built once, on the host). ``seeds``: the node
    ids to cover each epoch (e.g. the training nodes). ``features``: ``[N, F]`` numpy array or scipy sparse
    matrix, gathered per batch into ``graph.nodes`` (``None``: no node features). ``labels``: ``[N]`` ints.
    Each `Batch`'s ``mask`` marks its seed rows, which come first.

    Epoch ``e`` shuffles the seeds and samples with ``np.random.default_rng([seed, e])``, so it is the same on
    every run; iterating the loader runs epochs 0, 1, 2, ... in turn and `epoch` runs one by number.
    ``prefetch``: batches built ahead in a background thread (0: none). ``progress``: a tqdm bar per epoch.
    """

    def __init__(self, graph, seeds, fanouts: Sequence[int], *, batch_size: int, features=None, labels=None,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0, node_budget: int | None = None,
                 edge_budget: int | None = None, prefetch: int = 2, progress: bool = False, desc: str = "batches"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.csr, self.fanouts = as_csr(graph), _check_fanouts(fanouts)
        self.seeds = np.asarray(seeds, np.int64).reshape(-1)
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        self.features, self.labels = features, None if labels is None else np.asarray(labels)
        # a batch never holds more seeds than there are, so few seeds need no room for batch_size of them
        default_nodes, default_edges = neighbor_budgets(self.csr, min(batch_size, max(self.seeds.shape[0], 1)),
                                                        self.fanouts)
        self.node_budget = default_nodes if node_budget is None else int(node_budget)
        self.edge_budget = default_edges if edge_budget is None else int(edge_budget)
        self.prefetch, self.progress, self.desc = prefetch, progress, desc
        self._next_epoch = 0

    def __len__(self) -> int:
        full, rest = divmod(self.seeds.shape[0], self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _batches(self, epoch: int) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.seeds) if self.shuffle else self.seeds
        for i in range(len(self)):
            sub = sample_neighbors(self.csr, order[i * self.batch_size:(i + 1) * self.batch_size], self.fanouts, rng)
            mask = np.arange(sub.node_ids.shape[0]) < sub.num_seeds
            yield pad_subgraph(sub.node_ids, sub.senders, sub.receivers, sub.edge_ids, mask,
                               node_budget=self.node_budget, edge_budget=self.edge_budget, features=self.features,
                               labels=self.labels)

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The batches of epoch ``epoch`` (deterministic), prefetched and with a progress bar as configured."""
        return _wrap(lambda: self._batches(epoch), len(self), self.prefetch, self.progress, f"{self.desc} {epoch}")

    def __iter__(self) -> Iterator[Batch]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)


def _wrap(make, total: int, prefetch: int, progress: bool, desc: str) -> Iterator[Batch]:
    batches = iter(Prefetcher(make, prefetch)) if prefetch > 0 else make()
    if not progress:
        return batches
    from tqdm.auto import tqdm  # only where a bar is asked for

    return iter(tqdm(batches, total=total, desc=desc, leave=False))
