"""Padding a sampled subgraph to static node and edge budgets, following jraph's padding conventions."""

from __future__ import annotations

from typing import NamedTuple

import jraph
import numpy as np


class Batch(NamedTuple):
    """A padded, fixed-shape mini-batch (host numpy arrays; ``jax.device_put`` it or pass it to a jitted step).

    ``graph``: a ``jraph.GraphsTuple`` of two graphs, the sampled subgraph and one padding graph that holds every
    padding node and edge (padding edges run from and to the first padding node, as ``jraph.pad_with_graphs``
    does), so ``n_node``/``n_edge`` are ``[real, padding]``; ``nodes`` are the features of each row (0 on
    padding) and ``edges`` is ``None``.
    ``node_ids`` int64 [node budget]: each row's global node id (-1 on padding). ``edge_ids`` int64
    [edge budget]: each edge's index in the full graph (-1 on padding). ``labels`` int32 [node budget]: each
    row's label (0 on padding and when the loader has no labels). ``mask`` bool [node budget]: the rows to
    train or evaluate on (a neighbour sampler's seeds, which come first; a cluster batch's target nodes).
    """

    graph: jraph.GraphsTuple
    node_ids: np.ndarray
    edge_ids: np.ndarray
    labels: np.ndarray
    mask: np.ndarray


def gather_rows(features, ids: np.ndarray) -> np.ndarray:
    """``features[ids]`` as a dense float array; ``features`` is a numpy array or a scipy sparse matrix (CSR)."""
    rows = features[ids]
    return np.asarray(rows.toarray() if hasattr(rows, "toarray") else rows)


def pad_subgraph(node_ids: np.ndarray, senders: np.ndarray, receivers: np.ndarray, edge_ids: np.ndarray,
                 mask: np.ndarray, *, node_budget: int, edge_budget: int, features=None,
                 labels: np.ndarray | None = None) -> Batch:
    """Pad a subgraph (local ``senders``/``receivers`` into ``node_ids``) to ``node_budget`` rows and
    ``edge_budget`` edges.

    ``node_budget`` counts the padding graph's node, so it must exceed the number of real nodes. ``mask`` [real
    nodes] marks the target rows. Raises ``ValueError`` when the subgraph does not fit the budgets.
    """
    n, e = int(node_ids.shape[0]), int(senders.shape[0])
    if n + 1 > node_budget or e > edge_budget:
        raise ValueError(f"a subgraph of {n} nodes and {e} edges does not fit the budget of {node_budget} nodes "
                         f"(one is the padding node) and {edge_budget} edges")
    pad_node, pad_edge = node_budget - n, edge_budget - e
    ids = np.concatenate([node_ids, np.full(pad_node, -1, np.int64)])
    x = None
    if features is not None:
        real = gather_rows(features, node_ids)
        x = np.zeros((node_budget, *real.shape[1:]), real.dtype)
        x[:n] = real
    y = np.zeros(node_budget, np.int32)
    if labels is not None:
        y[:n] = labels[node_ids]
    graph = jraph.GraphsTuple(
        nodes=x, edges=None,
        senders=np.concatenate([senders, np.full(pad_edge, n, np.int64)]).astype(np.int32),
        receivers=np.concatenate([receivers, np.full(pad_edge, n, np.int64)]).astype(np.int32),
        n_node=np.array([n, pad_node], np.int32), n_edge=np.array([e, pad_edge], np.int32), globals=None)
    return Batch(graph, ids, np.concatenate([edge_ids, np.full(pad_edge, -1, np.int64)]), y,
                 np.concatenate([np.asarray(mask, bool), np.zeros(pad_node, bool)]))
