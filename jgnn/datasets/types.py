"""Dataset containers returned by the loaders in :mod:`jgnn.datasets`.

All containers are frozen dataclasses holding host (NumPy) arrays; the graph is a
``jraph.GraphsTuple`` with a single graph in it (``n_node = [N]``, ``n_edge = [E]``,
``globals = None``). Use ``jax.device_put(ds.graph)`` to move it to an accelerator.

Conventions shared by every loader:

* edges are directed ``senders[i] -> receivers[i]``; ``senders``/``receivers`` are int32 [E];
* ``n_node``/``n_edge`` are int32 [1];
* node features are float32 [N, F] (or ``None`` when the data set has none);
* typed graphs (the jgnn convention) store ``nodes = {"type": int32 [N], ...}`` and
  ``edges = {"type": int32 [E]}``.
"""
from __future__ import annotations

import dataclasses

import jraph
import numpy as np


class _GraphSizes:
    """``num_nodes``/``num_edges`` of a container's single-graph ``graph`` field."""

    graph: jraph.GraphsTuple

    @property
    def num_nodes(self) -> int:
        return int(self.graph.n_node[0])

    @property
    def num_edges(self) -> int:
        return int(self.graph.n_edge[0])


@dataclasses.dataclass(frozen=True, eq=False)
class NodeClassificationDataset(_GraphSizes):
    """A single-graph transductive node classification data set.

    Attributes:
      graph: ``nodes`` = float32 [N, F] features or ``None``; ``edges = None``; int32 senders and
        receivers [E]; ``n_node = [N]``, ``n_edge = [E]``; ``globals = None``.
      labels: int32 [N] class ids in ``[0, num_classes)``; ``-1`` marks an unlabelled node.
      train_mask, val_mask, test_mask: bool [N].
      num_classes: number of classes ``C``.
      name: data set name (lower case).
    """

    graph: jraph.GraphsTuple
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    name: str

    @property
    def num_features(self) -> int | None:
        """Feature width ``F``, or ``None`` when the graph has no node features."""
        return None if self.graph.nodes is None else int(self.graph.nodes.shape[1])


@dataclasses.dataclass(frozen=True, eq=False)
class EntityClassificationDataset(_GraphSizes):
    """An R-GCN style entity classification data set on a typed (relational) graph.

    Attributes:
      graph: ``nodes = {"type": int32 [N]}``, ``edges = {"type": int32 [E]}`` with edge types in
        ``[0, num_relations)``; int32 senders/receivers; ``n_node = [N]``, ``n_edge = [E]``.
      num_relations: number of edge types in ``graph`` (after adding inverse edges/self-loops).
      num_base_relations: number ``R`` of relations in the raw RDF graph (before augmentation).
      num_node_types: number of node types (values of ``graph.nodes["type"]`` lie in ``[0, T)``).
      train_idx, test_idx: int32 node ids of the labelled training / test entities.
      train_labels, test_labels: int32 class ids aligned with ``train_idx`` / ``test_idx``.
      num_classes: number of classes.
      name: data set name.
    """

    graph: jraph.GraphsTuple
    num_relations: int
    num_base_relations: int
    num_node_types: int
    train_idx: np.ndarray
    test_idx: np.ndarray
    train_labels: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    name: str


@dataclasses.dataclass(frozen=True, eq=False)
class LinkPredictionDataset:
    """A knowledge-graph link prediction data set.

    Attributes:
      graph: the message-passing graph built from the training triples: ``senders = head``,
        ``receivers = tail``, ``edges = {"type": relation}`` (int32 [E]); ``nodes = {"type": int32 [N]}``,
        all zeros (a knowledge graph has one node type), so it is a typed graph for `jgnn.nn` and
        `jgnn.validate(graph, typed=True)`; add the entity features or ids as ``nodes["h"]``;
        ``n_node = [num_nodes]``.
      train_triples, valid_triples, test_triples: int32 [*, 3] rows ``(head, relation, tail)``.
      num_nodes: number of entities (ids cover every split).
      num_relations: number of edge types in ``graph`` (``2R`` when inverse edges were added).
      name: data set name.
    """

    graph: jraph.GraphsTuple
    train_triples: np.ndarray
    valid_triples: np.ndarray
    test_triples: np.ndarray
    num_nodes: int
    num_relations: int
    name: str

    @property
    def num_edges(self) -> int:
        return int(self.graph.n_edge[0])


@dataclasses.dataclass(frozen=True, eq=False)
class TypedGraph(_GraphSizes):
    """A synthetic heterogeneous graph whose edge types respect a fixed relation schema.

    Attributes:
      graph: ``nodes = {"type": int32 [N]}`` (plus ``"h": float32 [N, D]`` when requested),
        ``edges = {"type": int32 [E]}``; int32 senders/receivers.
      relation_schema: int32 [R, 2]; row ``r`` is ``(src_node_type, dst_node_type)`` of relation
        ``r``: every edge of type ``r`` goes from a node of type ``relation_schema[r, 0]`` to a node
        of type ``relation_schema[r, 1]``.
      num_node_types, num_edge_types: type counts.
      name: descriptive name.
    """

    graph: jraph.GraphsTuple
    relation_schema: np.ndarray
    num_node_types: int
    num_edge_types: int
    name: str


def make_graph(
    senders: np.ndarray,
    receivers: np.ndarray,
    num_nodes: int,
    *,
    nodes=None,
    edges=None,
) -> jraph.GraphsTuple:
    """Assemble a single-graph ``GraphsTuple`` (int32 indices, ``globals = None``).

    ``senders``/``receivers`` must already be validated index arrays of equal length.
    """
    senders = np.ascontiguousarray(senders, dtype=np.int32)
    receivers = np.ascontiguousarray(receivers, dtype=np.int32)
    return jraph.GraphsTuple(
        nodes=nodes,
        edges=edges,
        senders=senders,
        receivers=receivers,
        n_node=np.asarray([num_nodes], dtype=np.int32),
        n_edge=np.asarray([senders.shape[0]], dtype=np.int32),
        globals=None,
    )


def make_batched_graph(
    senders: np.ndarray,
    receivers: np.ndarray,
    n_node: np.ndarray,
    n_edge: np.ndarray,
    *,
    nodes=None,
    edges=None,
) -> jraph.GraphsTuple:
    """Assemble a ``GraphsTuple`` holding ``G`` graphs (int32 indices and counts, ``globals = None``).

    ``n_node``/``n_edge`` [G] count each graph's nodes and edges; graph ``g``'s nodes and edges are contiguous
    and in graph order (jraph's batching convention); ``senders``/``receivers`` use global node ids.
    """
    return jraph.GraphsTuple(
        nodes=nodes,
        edges=edges,
        senders=np.ascontiguousarray(senders, dtype=np.int32),
        receivers=np.ascontiguousarray(receivers, dtype=np.int32),
        n_node=np.asarray(n_node, dtype=np.int32),
        n_edge=np.asarray(n_edge, dtype=np.int32),
        globals=None,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class GraphClassificationDataset:
    """Many small graphs with one class label each (TUDataset style).

    Attributes:
      graph: all ``G`` graphs in one ``GraphsTuple`` (disjoint union, global 0-based node ids, graph ``g``'s
        nodes and edges contiguous): ``n_node``/``n_edge`` int32 [G]; ``nodes`` float32 [N, F] or ``None``;
        ``edges`` float32 [E, L] (one-hot edge labels) or ``None``; ``globals = None``. Use
        :func:`jgnn.batching.select_graphs` and :func:`jgnn.batching.padded_batches` to cut it into batches.
      labels: int32 [G] class ids in ``[0, num_classes)``.
      num_classes: number of classes ``C``.
      node_labels: int32 [N] discrete node labels (0-based), or ``None``.
      node_attributes: float32 [N, d] continuous node attributes, or ``None``.
      edge_labels: int32 [E] discrete edge labels, or ``None``.
      name: data set name (TU spelling, e.g. ``"IMDB-BINARY"``).
    """

    graph: jraph.GraphsTuple
    labels: np.ndarray
    num_classes: int
    node_labels: np.ndarray | None
    node_attributes: np.ndarray | None
    edge_labels: np.ndarray | None
    name: str

    @property
    def num_graphs(self) -> int:
        return int(self.graph.n_node.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(np.sum(self.graph.n_node))

    @property
    def num_edges(self) -> int:
        return int(self.graph.senders.shape[0])

    @property
    def num_features(self) -> int | None:
        """Node feature width ``F``, or ``None`` when the graphs have no node features."""
        return None if self.graph.nodes is None else int(self.graph.nodes.shape[1])
