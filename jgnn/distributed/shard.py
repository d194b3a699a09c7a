"""Run a per-part function under `jax.shard_map` over a one-axis `jax.sharding.Mesh`.

Inside, each device sees a `LocalGraph`: its part's static structure and its owned node rows. `LocalGraph.graph`
builds the local `jraph.GraphsTuple` whose halo rows are the owners' rows (strategy "source": an ``all_gather`` of
the owned rows over the mesh axis, then a gather of the halo slots), so any compiled layer runs on it with the
normal fused ops, and its gradient flows back to the owners through the all_gather's transpose (a
reduce-scatter). The all_gather moves every owned row to every device (P·S rows each), more than the halo rows
`jgnn.distributed.choose` counts; a targeted exchange (``ppermute`` of each pair's halo rows) is not built yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jraph
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jgnn.distributed.halo import PartitionedGraph


@dataclasses.dataclass(frozen=True)
class LocalGraph:
    """One device's view of its part, inside `run`. ``senders``/``receivers`` ``[E]``, ``n_edge`` ``[]`` and
    ``halo_rows`` ``[H]`` are this part's rows of the `PartitionedGraph` arrays; ``edges`` its edge features;
    ``extra`` its rows of the ``extra`` arrays given to `structure` (e.g. `jgnn.distributed.partial_arrays`)."""

    part: PartitionedGraph
    axis: str
    senders: jax.Array
    receivers: jax.Array
    n_edge: jax.Array
    halo_rows: jax.Array
    edges: Any
    extra: Any = None

    def halo(self, owned):
        """The halo rows ``[H, ...]`` of every leaf of ``owned`` ``[S, ...]`` (owned rows of all parts are
        all-gathered, then each halo slot reads its owner's row)."""
        return jax.tree.map(lambda x: jax.lax.all_gather(x, self.axis, tiled=True)[self.halo_rows], owned)

    def nodes(self, owned):
        """Local node rows ``[S + H + 1, ...]``: owned, halo, and a zero padding row."""
        def one(x, h):
            return jnp.concatenate([x, h, jnp.zeros((1,) + x.shape[1:], x.dtype)])
        return jax.tree.map(one, owned, self.halo(owned))

    def graph(self, owned, edges: Any = None) -> jraph.GraphsTuple:
        """The local graph with node features ``owned`` ``[S, ...]`` plus their halo rows, and ``edges`` (default:
        the edge features given to `run`). Its outputs for rows ``[S, ...)`` are not this part's: take
        `LocalGraph.owned` of them."""
        pg = self.part
        real_nodes = pg.local_nodes - 1
        return jraph.GraphsTuple(
            nodes=self.nodes(owned), edges=self.edges if edges is None else edges,
            senders=self.senders, receivers=self.receivers, globals=None,
            n_node=jnp.array([real_nodes, 1], jnp.int32),
            n_edge=jnp.stack([self.n_edge, pg.edges - self.n_edge]).astype(jnp.int32))

    def owned(self, local_values):
        """The owned rows ``[S, ...]`` of local node values ``[S + H + 1, ...]``."""
        return jax.tree.map(lambda x: x[:self.part.owned], local_values)


def put(tree, mesh: Mesh, spec: PartitionSpec):
    """Global arrays of ``tree``'s host values with ``NamedSharding(mesh, spec)``, also when the mesh spans
    several processes (each process fills its own devices' shards from the same host values)."""
    sharding = NamedSharding(mesh, spec)

    def one(x):
        if isinstance(x, jax.Array) and getattr(x, "sharding", None) == sharding:
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.tree.map(one, tree)


def structure(pg: PartitionedGraph, mesh: Mesh, edges: Any = None, extra: Any = None) -> dict:
    """The per-part arrays `run` reads, placed one part per device (``edges``: per-part ``[P, E, ...]``;
    ``extra``: more per-part arrays, leading axis P, given to the function as `LocalGraph.extra`)."""
    axis = mesh.axis_names[0]
    arrays = {"senders": pg.senders, "receivers": pg.receivers, "n_edge": pg.n_edge, "halo_rows": pg.halo_rows,
              "edges": edges, "extra": extra}
    return put(arrays, mesh, PartitionSpec(axis))


def run(fn: Callable, pg: PartitionedGraph, mesh: Mesh, structure_arrays: dict, shared: Any, nodes: Any):
    """``fn(local, shared, owned) -> owned outputs`` on every part, under `jax.shard_map`.

    ``mesh``: one axis of ``pg.num_parts`` devices. ``structure_arrays``: `structure` of ``pg``. ``shared``:
    replicated values (parameters). ``nodes``: padded-global node values ``[P·S, ...]`` (`PartitionedGraph.
    to_padded`), split over the axis. Returns the padded-global outputs ``[P·S, ...]``. Differentiable in
    ``shared`` and ``nodes``; jit it around.
    """
    if len(mesh.axis_names) != 1 or mesh.devices.size != pg.num_parts:
        raise ValueError(f"run: the mesh must have one axis of {pg.num_parts} devices (one per part), got "
                         f"axes {mesh.axis_names} of {mesh.devices.size} devices")
    axis = mesh.axis_names[0]

    def body(arrays, shared, owned):
        arrays = jax.tree.map(lambda x: x[0], arrays)
        local = LocalGraph(part=pg, axis=axis, **arrays)
        return fn(local, shared, owned)

    split, rep = PartitionSpec(axis), PartitionSpec()
    # With shard_map's varying-axes checks (its default), a replicated parameter is cast to vary where it meets a
    # part's values, and the transpose of that cast sums its cotangent over the axis: the gradient wanted.
    return jax.shard_map(body, mesh=mesh, in_specs=(split, rep, split), out_specs=split)(
        structure_arrays, shared, nodes)
