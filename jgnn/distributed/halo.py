"""Per-part graphs with halo (ghost) nodes, padded to one static shape so one program runs on every device.

Part ``p`` owns the nodes assigned to it, relabelled to the contiguous rows ``[p·S, p·S + size_p)`` of a
*padded global* node array of ``P·S`` rows (``S`` = the largest part); that array is what `jax.sharding` splits
over the mesh axis. Each edge belongs to its receiver's part. A part's *local graph* has ``L = S + H + 1`` nodes:
its ``S`` owned rows, ``H`` halo rows (remote senders of its edges, padded to the largest halo) and one padding
node; its ``E`` edges (padded to the part with most edges) point from local senders to owned receivers, and the
padding edges point from the padding node to itself (jraph's convention), so they change no real row.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn.distributed.partition import Partition, PartitionStats


@dataclasses.dataclass(frozen=True)
class PartitionedGraph:
    """P local graphs stacked on a leading part axis, and the maps between the original and padded node order.

    Static sizes: ``num_parts`` P, ``owned`` S, ``halo`` H, ``edges`` E. Arrays (numpy; the leading axis is the
    part): ``senders``/``receivers`` ``[P, E]`` local ids, ``n_edge`` ``[P]`` real edges, ``halo_rows``
    ``[P, H]`` the padded-global row of each halo slot (0 for unused slots, which no edge reads),
    ``edge_order`` ``[P, E]`` the original edge id of each local edge (``-1`` for padding), ``position``
    ``[N]`` the padded-global row of each original node, ``remote_destinations`` per part the distinct (sender
    part, receiver) pairs of its cut edges (the rows partial aggregates would send), ``stats`` the partition's
    `PartitionStats`.
    """

    num_parts: int
    owned: int
    halo: int
    edges: int
    senders: np.ndarray
    receivers: np.ndarray
    n_edge: np.ndarray
    halo_rows: np.ndarray
    edge_order: np.ndarray
    position: np.ndarray
    remote_destinations: tuple[int, ...]
    stats: PartitionStats

    @property
    def local_nodes(self) -> int:
        return self.owned + self.halo + 1

    @property
    def padding_node(self) -> int:
        return self.owned + self.halo

    def to_padded(self, node_values):
        """Original node order ``[N, ...]`` → padded global ``[P·S, ...]`` (zeros in unused rows), per leaf."""
        def one(x):
            x = jnp.asarray(x)
            return jnp.zeros((self.num_parts * self.owned,) + x.shape[1:], x.dtype).at[self.position].set(x)
        return jax.tree.map(one, node_values)

    def from_padded(self, padded):
        """Padded global ``[P·S, ...]`` → original node order ``[N, ...]``, per leaf."""
        return jax.tree.map(lambda x: x[self.position], padded)

    def edge_values(self, edge_values):
        """Original edges ``[E_all, ...]`` → per part ``[P, E, ...]`` (zeros on padding edges), per leaf."""
        order = np.maximum(self.edge_order, 0)
        real = self.edge_order >= 0

        def one(x):
            x = jnp.asarray(x)[order]
            return jnp.where(real.reshape(real.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype))
        return jax.tree.map(one, edge_values)


def build_parts(graph: jraph.GraphsTuple, partition: Partition) -> PartitionedGraph:
    """The per-part local graphs of ``graph`` under ``partition`` (see the module docstring for the layout)."""
    senders, receivers = np.asarray(graph.senders, np.int64), np.asarray(graph.receivers, np.int64)
    assignment = np.asarray(partition.assignment, np.int64)
    n, p_count = len(assignment), partition.stats.num_parts
    if int(np.sum(np.asarray(graph.n_node))) != n:
        raise ValueError(f"build_parts: the partition has {n} nodes, the graph {int(np.sum(graph.n_node))}")
    sizes = np.bincount(assignment, minlength=p_count)
    owned = max(int(sizes.max()), 1)
    order = np.argsort(assignment, kind="stable")
    local = np.empty(n, np.int64)
    local[order] = np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    position = assignment * owned + local
    owner = assignment[receivers]
    per_part = []
    for p in range(p_count):
        ids = np.flatnonzero(owner == p)
        s = senders[ids]
        remote = assignment[s] != p
        halo_nodes, halo_slot = np.unique(s[remote], return_inverse=True)
        per_part.append((ids, s, remote, halo_nodes, halo_slot))
    halo = max([len(h) for *_, h, _ in per_part] + [1])
    edges = max([len(ids) for ids, *_ in per_part] + [1])
    pad = owned + halo
    snd = np.full((p_count, edges), pad, np.int32)
    rcv = np.full((p_count, edges), pad, np.int32)
    halo_rows = np.zeros((p_count, halo), np.int32)
    edge_order = np.full((p_count, edges), -1, np.int64)
    for p, (ids, s, remote, halo_nodes, halo_slot) in enumerate(per_part):
        k = len(ids)
        snd[p, :k] = np.where(remote, owned + np.zeros_like(s), local[s])
        snd[p, :k][remote] = owned + halo_slot
        rcv[p, :k] = local[receivers[ids]]
        halo_rows[p, :len(halo_nodes)] = position[halo_nodes]
        edge_order[p, :k] = ids
    remote_destinations = tuple(
        len(np.unique(assignment[s[remote]] * n + receivers[ids][remote])) for ids, s, remote, *_ in per_part)
    n_edge = np.array([len(ids) for ids, *_ in per_part], np.int32)
    return PartitionedGraph(num_parts=p_count, owned=owned, halo=halo, edges=edges, senders=snd, receivers=rcv,
                            n_edge=n_edge, halo_rows=halo_rows, edge_order=edge_order,
                            position=position.astype(np.int32),
                            remote_destinations=remote_destinations, stats=partition.stats)
