"""Flax (linen) GNN layers written with `jgnn.message_passing`, so the compiler optimises every model.

Every module is called as ``conv(graph, *, layout=None, deterministic=True) -> graph`` and has ``backend`` and
``remat`` fields forwarded to `jgnn.message_passing`. Homogeneous modules read ``graph.nodes`` (an ``[N, F]``
array, or a dict with an ``"h"`` entry) and return the graph with new node features in the same form. Typed
modules (`RGCNConv`, `RGATConv`, `HGTConv`) read ``graph.nodes = {"h": x, "type": int32}`` and
``graph.edges = {"type": int32}`` and keep that dict form.

Modules that append self-loops (``add_self_loops=True``) ignore ``layout``: it describes the graph without them.
Typed modules start with ``jgnn.validate(graph, typed=True)`` and reject graphs without ``"type"`` entries.
"""

from jgnn.nn._utils import add_self_loops, in_degree, in_degree_per_type
from jgnn.nn.appnp import APPNP
from jgnn.nn.cheb import ChebConv
from jgnn.nn.gat import GATConv, GATv2Conv
from jgnn.nn.gcn import GCNConv
from jgnn.nn.gin import EdgeConv, GINConv, GINEConv
from jgnn.nn.hgt import HGTConv
from jgnn.nn.pna import PNAConv
from jgnn.nn.rgat import RGATConv
from jgnn.nn.rgcn import RGCNConv
from jgnn.nn.sage import GraphConv, SAGEConv
from jgnn.nn.transformer import TransformerConv

__all__ = [
    "APPNP", "ChebConv", "EdgeConv", "GATConv", "GATv2Conv", "GCNConv", "GINConv", "GINEConv", "GraphConv", "HGTConv", "PNAConv", "RGATConv",
    "RGCNConv", "SAGEConv", "TransformerConv",
    "add_self_loops", "in_degree", "in_degree_per_type",
]
