"""Partitioned full-graph training on `jax.sharding`: partition, per-part graphs with halos, `shard_map`.

``partition`` assigns nodes to parts (`jgnn.distributed.partition`); ``build_parts`` makes the padded per-part
graphs with halo nodes (`jgnn.distributed.halo`); ``run`` runs a per-part function on a one-axis mesh
(`jgnn.distributed.shard`); ``choose`` is the per-layer cost model of how cut edges travel
(`jgnn.distributed.strategy`); ``aggregate`` sends cut edges as partial aggregates per destination for
sum/max/min/softmax-weighted sums (`jgnn.distributed.partial`).
"""

from jgnn.distributed.halo import PartitionedGraph, build_parts
from jgnn.distributed.partial import Partials, aggregate, build_partials, partial_arrays
from jgnn.distributed.partition import Partition, PartitionStats, metis_available, partition
from jgnn.distributed.shard import LocalGraph, put, run, structure
from jgnn.distributed.strategy import StrategyChoice, choose

__all__ = ["LocalGraph", "Partials", "Partition", "PartitionStats", "PartitionedGraph", "StrategyChoice", "aggregate",
           "build_partials", "build_parts", "choose", "metis_available", "partial_arrays", "partition", "put", "run",
           "structure"]
