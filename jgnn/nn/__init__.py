"""Flax (linen) GNN layers written with `jgnn.message_passing`, so the compiler optimises every model.

Each layer mirrors its PyG namesake (``GCNConv`` ... ``PNAConv``) and gives PyG's output with PyG's weights
(``tests/test_pyg_parity.py``); each docstring names the PyG parameters its own correspond to. Every module is
called as ``conv(graph, *, layout=None, deterministic=True) -> graph`` and has ``dtype``/``param_dtype``
(Flax convention) and ``backend``/``remat`` fields (forwarded to `jgnn.message_passing`).

Inputs are `jraph.GraphsTuple`s. Homogeneous layers read ``graph.nodes`` (an ``[N, F]`` array, or a dict with an
``"h"`` entry) and return the graph with new node features in the same form. Several accept PyG's bipartite
``(x_src, x_dst)``: ``graph.nodes`` is then that pair (``senders`` index ``x_src``, ``receivers`` ``x_dst``)
and the output nodes are the ``[N_dst, F']`` destination rows. Edge weights (PyG's ``edge_weight``) are a 1-D
``graph.edges`` or ``graph.edges["weight"]``; edge features (``edge_attr``) an ``[E, D]`` ``graph.edges`` or
``graph.edges["h"]``. Relational layers read ``graph.edges["type"]``; ``HGTConv`` also ``graph.nodes["type"]``.

Self-loops follow PyG: ``GCNConv``/``APPNP`` *replace* existing loops, ``GATConv``/``GATv2Conv`` remove them
before adding one per node. Shapes are static under ``jit``, so existing loops stay in the edge list, masked
out (weight 0, or a ``-inf`` logit), and the new ones are appended. A ``layout`` must describe the graph the
layer runs on: build it with ``GraphLayout.from_graph(graph, self_loops=True)`` for layers that add loops
(a mismatch raises a ``ValueError`` naming the fix). Bipartite inputs take no layout.
"""

from jgnn.nn._utils import Attention, add_self_loops, in_degree, in_degree_per_type
from jgnn.nn.appnp import APPNP
from jgnn.nn.cheb import ChebConv
from jgnn.nn.gat import GATConv, GATv2Conv
from jgnn.nn.gcn import GCNConv
from jgnn.nn.gin import EdgeConv, GINConv, GINEConv
from jgnn.nn.hgt import HGTConv
from jgnn.nn.jknet import JKNet, JumpingKnowledge
from jgnn.nn.magnn import MAGNN, metapath_neighborhood
from jgnn.nn.pgnn import PGNN, PGNNConv, anchor_neighborhood, hop_similarity
from jgnn.nn.pinsage import PinSage, PinSageConv, random_walk_neighbors
from jgnn.nn.pna import PNAConv
from jgnn.nn.pool import Pooled, SAGPooling, TopKPooling
from jgnn.nn.readout import AttentionReadout, Set2Set, max_pool, mean_pool, sum_pool
from jgnn.nn.rgat import RGATConv
from jgnn.nn.rgcn import RGCNConv
from jgnn.nn.sage import GraphConv, SAGEConv
from jgnn.nn.transformer import TransformerConv

__all__ = [
    "APPNP", "Attention", "AttentionReadout", "ChebConv", "EdgeConv", "GATConv", "GATv2Conv", "GCNConv", "GINConv",
    "GINEConv", "GraphConv", "HGTConv", "JKNet", "JumpingKnowledge", "MAGNN", "PGNN", "PGNNConv", "PNAConv",
    "PinSage", "PinSageConv", "Pooled", "RGATConv", "RGCNConv", "SAGEConv", "SAGPooling", "Set2Set", "TopKPooling",
    "TransformerConv", "add_self_loops", "anchor_neighborhood", "hop_similarity", "in_degree", "in_degree_per_type",
    "max_pool", "mean_pool", "metapath_neighborhood", "random_walk_neighbors", "sum_pool",
]
