"""Mini-batch training for graphs larger than a device: host-side samplers that yield padded, fixed-shape batches.

* `InCSR` / `in_csr`: the in-edges of every node as a host (numpy) CSR, built once.
* `NeighborLoader`: GraphSAGE neighbour sampling (fan-outs such as ``[15, 10]``) around batches of seed nodes.
* `ClusterLoader` and `partition`: ClusterGCN batches, unions of ``q`` random clusters with their induced edges.
* `Batch`: what both yield: a ``jraph.GraphsTuple`` padded to static node and edge budgets, so a jitted step
  compiles once, with the global ids of its rows and a mask of the rows to train or evaluate on.
* `Prefetcher`: runs any batch iterator in a background thread behind a bounded queue.
"""

from jgnn.sampling.batch import Batch, pad_subgraph
from jgnn.sampling.cluster import ClusterLoader, partition
from jgnn.sampling.csr import InCSR, in_csr
from jgnn.sampling.neighbor import NeighborLoader, Subgraph, neighbor_budgets, sample_neighbors
from jgnn.sampling.prefetch import Prefetcher

__all__ = [
    "Batch", "ClusterLoader", "InCSR", "NeighborLoader", "Prefetcher", "Subgraph", "in_csr", "neighbor_budgets",
    "pad_subgraph", "partition", "sample_neighbors",
]
