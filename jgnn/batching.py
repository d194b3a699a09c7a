"""Batching many small graphs into padded ``GraphsTuple``s of a few fixed sizes, so ``jit`` compiles once per size.

A data set of ``G`` graphs is one ``GraphsTuple`` holding all of them (jraph's batching convention: graph
``g``'s nodes and edges are contiguous and in graph order, ``n_node``/``n_edge`` [G]). A batch is a subset of
graphs (:func:`select_graphs`) padded with :func:`jraph.pad_with_graphs`: one padding graph takes the spare
nodes and edges, then empty graphs fill the graph axis, so padding never changes the result on real graphs
and ``jraph.get_graph_padding_mask`` / ``get_node_padding_mask`` find it.

Every batch is padded to the smallest of a few :class:`Bucket` sizes (:func:`padding_buckets`) that holds it,
so a jitted step compiles once per bucket, not once per batch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import jraph
import numpy as np

__all__ = ["Batch", "Bucket", "padded_batches", "padding_buckets", "pad_to_bucket", "select_graphs"]


@dataclasses.dataclass(frozen=True, order=True)
class Bucket:
    """A padded batch size: ``n_node`` nodes, ``n_edge`` edges, ``n_graph`` graphs (padding included)."""

    n_node: int
    n_edge: int
    n_graph: int

    def fits(self, n_node: int, n_edge: int, n_graph: int) -> bool:
        """Whether a batch of these real sizes pads into this bucket (the padding graph needs one node)."""
        return n_node + 1 <= self.n_node and n_edge <= self.n_edge and n_graph + 1 <= self.n_graph


class Batch(NamedTuple):
    """A padded batch: ``graph`` (bucket-sized), ``labels`` [n_graph] (0 on padding graphs), ``mask`` bool
    [n_graph] (True on real graphs), ``index`` int32 [n_graph] (data set index of each graph, -1 on padding)."""

    graph: jraph.GraphsTuple
    labels: np.ndarray
    mask: np.ndarray
    index: np.ndarray


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every (s, l) pair, vectorised."""
    total = int(lengths.sum())
    shift = np.repeat(starts - _offsets(lengths)[:-1], lengths)
    return (np.arange(total, dtype=np.int64) + shift).astype(np.int64)


def select_graphs(graph: jraph.GraphsTuple, indices: Sequence[int] | np.ndarray) -> jraph.GraphsTuple:
    """The graphs ``indices`` of a multi-graph ``GraphsTuple``, in that order, as one ``GraphsTuple`` (host).

    Node ids are renumbered to the new union; ``nodes``, ``edges`` and ``globals`` (any pytrees) follow their
    graphs. Indices may repeat. Raises ``IndexError`` for an index outside ``[0, G)``.
    """
    graph = jax.device_get(graph)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    num_graphs = int(np.shape(graph.n_node)[0])
    if idx.size and (idx.min() < 0 or idx.max() >= num_graphs):
        raise IndexError(f"graph index out of range [0, {num_graphs}): {idx[(idx < 0) | (idx >= num_graphs)][:5]}")
    n_node, n_edge = np.asarray(graph.n_node, np.int64), np.asarray(graph.n_edge, np.int64)
    node_off, edge_off = _offsets(n_node), _offsets(n_edge)
    node_idx = _ranges(node_off[idx], n_node[idx])
    edge_idx = _ranges(edge_off[idx], n_edge[idx])
    # an edge's new endpoint id: old id - old first node of its graph + new first node of its graph
    shift = np.repeat(_offsets(n_node[idx])[:-1] - node_off[idx], n_edge[idx])
    take = lambda tree, rows: jax.tree_util.tree_map(lambda a: np.asarray(a)[rows], tree)
    return jraph.GraphsTuple(
        nodes=take(graph.nodes, node_idx),
        edges=take(graph.edges, edge_idx),
        senders=(np.asarray(graph.senders)[edge_idx] + shift).astype(np.int32),
        receivers=(np.asarray(graph.receivers)[edge_idx] + shift).astype(np.int32),
        n_node=n_node[idx].astype(np.int32),
        n_edge=n_edge[idx].astype(np.int32),
        globals=take(graph.globals, idx),
    )


def _round_up(x: int, multiple: int) -> int:
    return int(-(-x // multiple) * multiple)


def padding_buckets(graph: jraph.GraphsTuple, batch_size: int, *, num_buckets: int = 3, seed: int = 0,
                    samples: int = 512, multiple: int = 64) -> tuple[Bucket, ...]:
    """A few bucket sizes that hold every batch of ``batch_size`` graphs of ``graph``'s data set.

    The last bucket holds the worst case (the ``batch_size`` largest graphs by nodes, and by edges); the others
    sit at the ``k / num_buckets`` quantiles of the node and edge totals of ``samples`` random batches (drawn
    with ``numpy.random.default_rng(seed)``), so most batches pad into a bucket close to their size. Sizes are
    rounded up to ``multiple``; every bucket has ``batch_size + 1`` graph slots (one for the padding graph).
    Duplicate buckets are merged; the result is sorted by size.
    """
    if batch_size < 1 or num_buckets < 1:
        raise ValueError(f"batch_size and num_buckets must be >= 1, got {batch_size}, {num_buckets}")
    n_node, n_edge = np.asarray(graph.n_node, np.int64), np.asarray(graph.n_edge, np.int64)
    b = min(batch_size, n_node.shape[0])
    worst = (int(np.sort(n_node)[::-1][:b].sum()) + 1, int(np.sort(n_edge)[::-1][:b].sum()))
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.choice(n_node.shape[0], b, replace=False) for _ in range(samples)])
    totals = np.stack([n_node[picks].sum(1) + 1, n_edge[picks].sum(1)], axis=1)
    sizes = [tuple(np.quantile(totals, k / num_buckets, axis=0, method="higher")) for k in range(1, num_buckets)]
    buckets = {Bucket(_round_up(max(int(n), 1), multiple), _round_up(int(e), multiple), batch_size + 1)
               for n, e in [*sizes, worst]}
    return tuple(sorted(buckets))


def pad_to_bucket(graph: jraph.GraphsTuple, buckets: Sequence[Bucket]) -> jraph.GraphsTuple:
    """Pad ``graph`` (``jraph.pad_with_graphs``) to the smallest bucket that holds it.

    Raises ``ValueError`` naming the batch's sizes when no bucket holds it.
    """
    n, e, g = int(np.sum(graph.n_node)), int(np.sum(graph.n_edge)), int(np.shape(graph.n_node)[0])
    for bucket in sorted(buckets):
        if bucket.fits(n, e, g):
            return jraph.pad_with_graphs(graph, bucket.n_node, bucket.n_edge, bucket.n_graph)
    raise ValueError(f"no bucket holds a batch of {g} graphs, {n} nodes and {e} edges (+1 padding node and graph); "
                     f"buckets: {list(buckets)}")


def padded_batches(graph: jraph.GraphsTuple, labels: np.ndarray, indices: Sequence[int] | np.ndarray,
                   batch_size: int, buckets: Sequence[Bucket], *,
                   rng: np.random.Generator | None = None) -> Iterator[Batch]:
    """Batches of ``batch_size`` graphs (the last one may be smaller) from ``indices``, each padded to a bucket.

    Args:
      graph: all graphs of the data set in one ``GraphsTuple`` (``n_node``/``n_edge`` [G]).
      labels: [G] per-graph targets (any dtype; padding graphs get 0).
      indices: the data set indices to batch (e.g. one cross-validation fold).
      batch_size: real graphs per batch (at most ``bucket.n_graph - 1``).
      buckets: from :func:`padding_buckets`.
      rng: shuffles ``indices`` when given (seeded ``numpy.random.Generator``); otherwise their order is kept.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if rng is not None:
        idx = rng.permutation(idx)
    labels = np.asarray(labels)
    for start in range(0, idx.shape[0], batch_size):
        chunk = idx[start:start + batch_size]
        padded = pad_to_bucket(select_graphs(graph, chunk), buckets)
        n_graph = int(padded.n_node.shape[0])
        batch_labels = np.zeros((n_graph, *labels.shape[1:]), labels.dtype)
        batch_labels[:chunk.shape[0]] = labels[chunk]
        mask = np.arange(n_graph) < chunk.shape[0]
        index = np.full(n_graph, -1, np.int32)
        index[:chunk.shape[0]] = chunk
        yield Batch(padded, batch_labels, mask, index)
