"""The models of the comparison, as Flax modules over `jgnn.nn` (the ``jgnn`` system) and over jraph's own
layers (the ``jraph`` system). Their parameter trees are the canonical initial weights every other system
converts from (`benchmarks.compare.weights`).

Architectures (the usual ones for each data set):

* GAT: ``GATConv(8, heads=8)`` → ELU → ``GATConv(C, heads=1, concat=False)`` (Veličković et al. on Cora);
* GCN: ``GCNConv(64)`` → ReLU → ``GCNConv(C)``;
* RGCN: ``RGCNConv(16)`` on node ids (featureless) → ReLU → ``RGCNConv(C)``, mean aggregation, root weight,
  no bases (Schlichtkrull et al. on AIFB);
* HGT: ``HGTConv(64, heads=4)`` → ``HGTConv(64, heads=4)`` → ``Dense(C)`` (PyG's HGT example without its input
  projection, since the features are already 64 wide).
"""
from __future__ import annotations

import flax.linen as nn
import jax

import jgnn.nn as jnn
from benchmarks.systems import JraphGAT, JraphGCN

GAT_HEADS, GAT_HIDDEN, GCN_HIDDEN, RGCN_HIDDEN, HGT_HIDDEN, HGT_HEADS = 8, 8, 64, 16, 64, 4


class GAT(nn.Module):
    classes: int
    backend: str = "xla"

    @nn.compact
    def __call__(self, graph, layout=None):
        h = jnn.GATConv(GAT_HIDDEN, num_heads=GAT_HEADS, backend=self.backend)(graph, layout=layout)
        h = h._replace(nodes=jax.nn.elu(h.nodes))
        return jnn.GATConv(self.classes, num_heads=1, concat=False, backend=self.backend)(h, layout=layout).nodes


class GCN(nn.Module):
    classes: int
    backend: str = "xla"

    @nn.compact
    def __call__(self, graph, layout=None):
        h = jnn.GCNConv(GCN_HIDDEN, backend=self.backend)(graph, layout=layout)
        h = h._replace(nodes=jax.nn.relu(h.nodes))
        return jnn.GCNConv(self.classes, backend=self.backend)(h, layout=layout).nodes


class RGCN(nn.Module):
    """``graph.nodes`` are int32 node ids ``[N]`` (featureless input of width ``num_nodes``)."""

    classes: int
    num_relations: int
    num_nodes: int
    backend: str = "xla"

    @nn.compact
    def __call__(self, graph, layout=None):
        conv = lambda f, **kw: jnn.RGCNConv(f, num_relations=self.num_relations, backend=self.backend, **kw)
        h = conv(RGCN_HIDDEN, input_dim=self.num_nodes)(graph, layout=layout)
        h = h._replace(nodes=jax.nn.relu(h.nodes))
        return conv(self.classes)(h, layout=layout).nodes


class HGT(nn.Module):
    """``graph.nodes = {"h": [N, F], "type": [N]}``, ``graph.edges = {"type": [E]}``."""

    classes: int
    num_node_types: int
    num_relations: int
    backend: str = "xla"

    @nn.compact
    def __call__(self, graph, layout=None):
        for _ in range(2):
            graph = jnn.HGTConv(HGT_HIDDEN, num_heads=HGT_HEADS, num_node_types=self.num_node_types,
                                num_edge_types=self.num_relations, backend=self.backend)(graph, layout=layout)
        return nn.Dense(self.classes)(graph.nodes["h"])


class JraphGATModel(nn.Module):
    """`GAT` from `jraph.GAT` layers (self-loops, additive attention, bias after aggregation)."""

    classes: int

    @nn.compact
    def __call__(self, graph, layout=None):
        h = JraphGAT(GAT_HIDDEN, GAT_HEADS)(graph)
        h = h._replace(nodes=jax.nn.elu(h.nodes))
        return JraphGAT(self.classes, 1)(h).nodes


class JraphGCNModel(nn.Module):
    """`GCN` from `jraph.GraphConvolution` layers (self-loops, symmetric normalisation)."""

    classes: int

    @nn.compact
    def __call__(self, graph, layout=None):
        h = JraphGCN(GCN_HIDDEN)(graph)
        h = h._replace(nodes=jax.nn.relu(h.nodes))
        return JraphGCN(self.classes)(h).nodes
