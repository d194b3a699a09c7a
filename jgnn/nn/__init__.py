"""Flax (linen) GNN layers written with `jgnn.message_passing`, so the compiler optimises every model.

Every module is called as ``conv(graph, *, layout=None, deterministic=True) -> graph`` and has ``backend`` and
``remat`` fields forwarded to `jgnn.message_passing`. Homogeneous modules read ``graph.nodes`` (an ``[N, F]``
array, or a dict with an ``"h"`` entry) and return the graph with new node features in the same form. Typed
modules read ``graph.nodes = {"h": x, "type": int32}`` and ``graph.edges = {"type": int32}``.
"""

from jgnn.nn._utils import add_self_loops, in_degree, in_degree_per_type
from jgnn.nn.gat import GATConv, GATv2Conv
from jgnn.nn.gcn import GCNConv

__all__ = ["GATConv", "GATv2Conv", "GCNConv", "add_self_loops", "in_degree", "in_degree_per_type"]
