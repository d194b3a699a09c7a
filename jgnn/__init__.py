"""jgnn: a JAX compiler for graph neural networks.

Write a layer as per-edge and per-node functions with `message_passing` (or bring plain jraph code to
`compile`): jgnn infers where every value lives on the graph, rewrites the program (broadcast reordering,
linear splitting, fusion of gather→compute→reduce chains into one op, lowered to XLA or Pallas kernels,
recomputation under ``grad``) and tells you what it did, and why, with `explain`.

Graphs are `jraph.GraphsTuple`s: ``nodes`` leaves ``[N, ...]``, ``edges`` leaves ``[E, ...]``, int32
``senders``/``receivers`` ``[E]``, ``n_node``/``n_edge`` ``[G]``; typed graphs add int32 ``nodes["type"]``
``[N]`` and ``edges["type"]`` ``[E]``.

* `message_passing(phi, rho, psi, backend=, remat=)`: a layer ``graph -> graph`` from per-edge ``phi``,
  per-node ``rho`` (mailbox reductions `sum`, `mean`, `max`, `min`, `softmax`) and ``psi``.
* `compile(fn, backend=, remat=, buckets=)`: any function of GraphsTuples, compiled; `BACKENDS` lists the
  backends.
* `explain(fn, *args)`: a `Report` of residencies, rewrites (`Pass`, `Reason` codes), kernels and fallbacks.
* `hierarchical(aggregations, psi)`: a layer over a `Neighborhood` of `dense_level`/`ragged_level`s (FlexGraph's
  NeighborSelection → Aggregation per level → Update), each ragged level compiled as a graph level.
* `validate(graph)`: check a graph's indices, dtypes and shapes, with errors naming the field.
* `GraphLayout.from_graph(graph)`: sorted CSRs built once on the host, passed as ``layer(graph, layout=...)``.
* `nn`: Flax layers (``GCNConv``, ``GATConv``, ... ``HGTConv``, readouts, pooling) mirroring PyG's.
* `distributed`: partition a graph over devices (METIS or greedy), halo exchange, training under ``shard_map``.
* `sampling`: mini-batch loaders (neighbour sampling, ClusterGCN) yielding padded, fixed-shape batches.
* `datasets`: loaders (Planetoid, TU, RDF entities, knowledge graphs, OGB), generators and converters.
"""

from jgnn import datasets, distributed, linkpred, nn, ops, sampling
from jgnn.compiler import BACKENDS, Compiled, PlanCache, compile, explain
from jgnn.graph import validate
from jgnn.layout import GraphLayout, LayoutMismatchError
from jgnn.mailbox import UnsupportedMailboxOp, max, mean, min, softmax, sum
from jgnn.message_passing import MessagePassing, message_passing
from jgnn.neighborhood import (
    Aggregation,
    Hierarchical,
    Level,
    Neighborhood,
    aggregate,
    dense_level,
    hierarchical,
    ragged_level,
)
from jgnn.report import Pass, Reason, Report

__all__ = [
    "Aggregation", "BACKENDS", "Compiled", "GraphLayout", "Hierarchical", "LayoutMismatchError", "Level",
    "MessagePassing", "Neighborhood", "Pass", "PlanCache", "Reason", "Report", "UnsupportedMailboxOp", "aggregate",
    "compile", "datasets", "dense_level", "distributed", "explain", "hierarchical", "linkpred", "max", "mean",
    "message_passing", "min", "nn", "ops", "ragged_level", "sampling", "softmax", "sum", "validate",
]
__version__ = "0.1.0"  # pyproject.toml
