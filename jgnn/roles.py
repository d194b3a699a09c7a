"""The vocabulary the compiler reasons in: where a value lives, what an index enumerates, how an op moves data.

* `Residency`: which axis of the graph a value's rows run along (Graphiler's data residency). ``SHARED``
  values have no graph axis (weights, constants); ``GRAPH``/``NODE``/``EDGE`` values have one row per graph,
  node or edge; ``NODE_TYPE``/``EDGE_TYPE`` one row per type (a typed weight table); ``PAIR`` one row per
  unique (source, edge type) pair of a `jgnn.layout.GraphLayout` (Hector's compact materialisation).
  ``UNKNOWN`` marks values in a fallback region.
* `Index`: what an integer array enumerates. ``SRC``/``DST`` are the node ids of each edge's endpoints; a gather
  by them broadcasts node rows to edges and a segment reduction by them reduces edges to nodes.
* `Group`: the role of a fused edge op's operand, and of its output rows (see `jgnn.ops.edge_op`).
* `Movement`: what an op does to rows (Graphiler's Table 1), as `explain` reports it.
"""

from __future__ import annotations

import enum


class Residency(enum.StrEnum):
    SHARED = "shared"
    GRAPH = "graph"
    NODE_TYPE = "node_type"
    EDGE_TYPE = "edge_type"
    NODE = "node"
    EDGE = "edge"
    PAIR = "pair"
    UNKNOWN = "unknown"


# Residencies whose rows follow the graph's size (everything a graph's shape changes).
GRAPH_AXES = frozenset({Residency.GRAPH, Residency.NODE, Residency.EDGE})
TABLES = frozenset({Residency.NODE_TYPE, Residency.EDGE_TYPE, Residency.PAIR})


class Index(enum.StrEnum):
    SRC = "src"  # a node id per edge: the sender
    DST = "dst"  # a node id per edge: the receiver
    NODE_ID = "node_id"  # arange(N): every node once (the self-loop half of an edge list)
    NODE_TYPE = "node_type"
    EDGE_TYPE = "edge_type"
    N_NODE = "n_node"  # node counts per graph
    N_EDGE = "n_edge"
    NODE_POS = "node_pos"  # cumulative node counts: where each graph's nodes start (graph rows)
    EDGE_POS = "edge_pos"
    NODE_MARK = "node_mark"  # per node: 1 where a graph starts (node rows), cumsum gives the graph id
    EDGE_MARK = "edge_mark"
    NODE_GRAPH = "node_graph"  # per node: the id of its graph
    EDGE_GRAPH = "edge_graph"  # per edge: the id of its graph
    PAIR = "pair"  # per edge: its (source, edge type) pair in a GraphLayout
    PAIR_SRC = "pair_src"  # per pair: its source node
    PAIR_TYPE = "pair_type"  # per pair: its edge type


# Index kinds that name node rows of each edge: gathering by them moves node rows to the edges.
ENDPOINTS = frozenset({Index.SRC, Index.DST})
TYPE_INDEX = {Index.NODE_TYPE: Residency.NODE_TYPE, Index.EDGE_TYPE: Residency.EDGE_TYPE}
# What a gather by each graph-membership index reads (graph rows) and where its rows land.
MEMBERSHIP = {Index.NODE_GRAPH: Residency.NODE, Index.EDGE_GRAPH: Residency.EDGE}


class Group(enum.StrEnum):
    """A fused edge op's operand role (gathered by src or dst ids, one row per edge, or shared), and where its
    output rows live (``ALL``: one row summed over every edge)."""

    SRC = "src"
    DST = "dst"
    EDGE = "edge"
    SHARED = "shared"
    ALL = "all"


GROUP_OF_INDEX = {Index.SRC: Group.SRC, Index.DST: Group.DST}
INDEX_OF_GROUP = {Group.SRC: Index.SRC, Group.DST: Index.DST}


class Movement(enum.StrEnum):
    BROADCAST_SRC = "broadcast_src"
    BROADCAST_DST = "broadcast_dst"
    BROADCAST_TYPE = "broadcast_type"
    BROADCAST_GRAPH = "broadcast_graph"
    BROADCAST_PAIR = "broadcast_pair"
    REDUCE = "reduce"
    NORM = "norm"
    FUSED = "fused"
    DENSE = "dense"


BROADCAST_OF_INDEX = {Index.SRC: Movement.BROADCAST_SRC, Index.DST: Movement.BROADCAST_DST,
                      Index.NODE_TYPE: Movement.BROADCAST_TYPE, Index.EDGE_TYPE: Movement.BROADCAST_TYPE,
                      Index.NODE_GRAPH: Movement.BROADCAST_GRAPH, Index.EDGE_GRAPH: Movement.BROADCAST_GRAPH}
