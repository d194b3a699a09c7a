"""Strategy (b), FlexGraph's partial aggregates: cut edges are reduced at the SENDER's part into one partial row
per (sender part, destination), the partials travel with one ``all_to_all``, and the owner combines them with its
local edges' reduction. For ``sum``, ``max``, ``min`` and softmax-weighted sums, whose messages read the source
row and the edge only (the destination's row is not at the sender's part). A softmax partial carries its row max
and its sum of exponentials, and the owner combines them as online softmax does, so the result is exact.

Generic layers (any phi/rho) use strategy (a), `LocalGraph.graph`; this is the explicit API for (b).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn.distributed.halo import PartitionedGraph
from jgnn.distributed.partition import Partition

KINDS = ("sum", "max", "min", "softmax")


@dataclasses.dataclass(frozen=True)
class Partials:
    """Host arrays of strategy (b), leading axis the part. Sender side, per destination part ``[P, P, C]``:
    ``out_src`` the owned row of each cut edge's sender, ``out_slot`` its destination slot (``slots`` = unused),
    ``out_edge`` its original edge id (``-1`` unused). Receiver side ``[P, P, slots]``: ``in_dst`` the owned row
    of each slot's destination (``owned`` = unused: a dump row). ``local_cut`` ``[P, E]``: local edges that
    cross the cut (left out of the local reduction: their partials come instead)."""

    slots: int
    out_src: np.ndarray
    out_slot: np.ndarray
    out_edge: np.ndarray
    in_dst: np.ndarray
    local_cut: np.ndarray


def build_partials(graph: jraph.GraphsTuple, partition: Partition, pg: PartitionedGraph) -> Partials:
    """The host arrays of strategy (b) for ``graph`` split by ``partition`` into ``pg`` (`build_parts`).

    Args:
      graph: the whole graph (concrete ``senders``/``receivers`` ``[E]``).
      partition: its `Partition` (``assignment`` ``[N]``: each node's part).
      pg: the `PartitionedGraph` built from them.

    Returns:
      `Partials`: per (sender part, destination part), the cut edges grouped into one slot per destination
      (``slots`` is the largest count over the pairs; shorter lists are padded), and per part the local edges
      that cross the cut. Pass it to `partial_arrays`, then `aggregate` reads one part's rows.
    """
    senders, receivers = np.asarray(graph.senders, np.int64), np.asarray(graph.receivers, np.int64)
    a = np.asarray(partition.assignment, np.int64)
    p_count, owned = pg.num_parts, pg.owned
    local = pg.position.astype(np.int64) - a * owned
    pairs = {}
    for q in range(p_count):
        for p in range(p_count):
            ids = np.flatnonzero((a[senders] == q) & (a[receivers] == p)) if p != q else np.zeros(0, np.int64)
            dst, slot = np.unique(receivers[ids], return_inverse=True)
            pairs[q, p] = (ids, dst, slot)
    slots = max([len(d) for _, d, _ in pairs.values()] + [1])
    cut = max([len(i) for i, _, _ in pairs.values()] + [1])
    out_src = np.zeros((p_count, p_count, cut), np.int32)
    out_slot = np.full((p_count, p_count, cut), slots, np.int32)
    out_edge = np.full((p_count, p_count, cut), -1, np.int64)
    in_dst = np.full((p_count, p_count, slots), owned, np.int32)
    for (q, p), (ids, dst, slot) in pairs.items():
        out_src[q, p, :len(ids)] = local[senders[ids]]
        out_slot[q, p, :len(ids)] = slot
        out_edge[q, p, :len(ids)] = ids
        in_dst[p, q, :len(dst)] = local[dst]
    order = pg.edge_order
    local_cut = (order >= 0) & (a[senders[np.maximum(order, 0)]] != np.arange(p_count)[:, None])
    return Partials(slots, out_src, out_slot, out_edge, in_dst, local_cut)


def _reduce(kind: str, values, ids, n: int):
    return {"sum": jax.ops.segment_sum, "max": jax.ops.segment_max, "min": jax.ops.segment_min}[kind](
        values, ids, n)


def aggregate(local, arrays: dict, owned_x, message: Callable, kind: str, local_edges=None, cut_edges=None):
    """Inside `jgnn.distributed.run`: the ``kind`` reduction over each owned node's in-edges of
    ``message(src_rows, edge_values)`` (``[e, ...]``; for ``"softmax"`` it returns ``(logits [e, H], values
    [e, H, C])`` and the result is ``Σ softmax(logits) · values`` per head), with cut edges sent as partials.

    ``arrays``: this part's rows of `partial_arrays` (``out_src``, ``out_slot``, ``in_dst``, ``local_cut``);
    ``local_edges``/``cut_edges``: edge values of the local edges ``[E, ...]`` and of the outgoing cut edges
    ``[P, C, ...]`` (`Partials.out_edge` order), or ``None``. Empty rows: 0 (sum, softmax), the dtype's lowest/
    highest (max/min), as ``jax.ops.segment_*``.
    """
    if kind not in KINDS:
        raise ValueError(f"aggregate: kind must be one of {KINDS}, got {kind!r}")
    pg, axis = local.part, local.axis
    s_own, rows = pg.owned, pg.owned + 1  # one dump row for padding edges and unused slots
    keep = (jnp.arange(pg.edges) < local.n_edge) & ~arrays["local_cut"]
    src_local = jnp.where(keep, local.senders, 0)  # non-cut edges read owned rows only
    dst_local = jnp.where(keep, local.receivers, s_own)
    msg_local = message(jax.tree.map(lambda x: x[src_local], owned_x), local_edges)
    out_src, out_slot = arrays["out_src"], arrays["out_slot"]  # [P, C]
    p_count, c = out_src.shape
    msg_cut = message(jax.tree.map(lambda x: x[out_src.reshape(-1)], owned_x),
                      None if cut_edges is None else jax.tree.map(lambda e: e.reshape((-1,) + e.shape[2:]),
                                                                  cut_edges))
    slot_ids = (jnp.arange(p_count)[:, None] * (pg_slots := arrays["in_dst"].shape[1]) + jnp.minimum(
        out_slot, pg_slots)).reshape(-1)
    slot_ids = jnp.where(out_slot.reshape(-1) < pg_slots, slot_ids, p_count * pg_slots)  # unused: dump slot
    n_slots = p_count * pg_slots + 1
    in_dst = arrays["in_dst"].reshape(-1)  # [P·slots] owned rows of the slots received from each part

    def send(partial):  # [P·slots + 1, ...] per destination part → received [P·slots, ...] per source part
        x = partial[:-1].reshape((p_count, pg_slots) + partial.shape[1:])
        return jax.lax.all_to_all(x, axis, 0, 0, tiled=True).reshape((-1,) + partial.shape[1:])

    if kind != "softmax":
        remote = send(_reduce(kind, msg_cut, slot_ids, n_slots))
        both = jnp.concatenate([msg_local, remote])
        return _reduce(kind, both, jnp.concatenate([dst_local, in_dst]), rows)[:s_own]
    (logit_l, value_l), (logit_c, value_c) = msg_local, msg_cut
    m_c = jax.lax.stop_gradient(jax.ops.segment_max(logit_c, slot_ids, n_slots))  # any shift is exact
    m_c = jnp.where(jnp.isfinite(m_c), m_c, 0.0)
    e_c = jnp.exp(logit_c - m_c[slot_ids])
    s_c = jax.ops.segment_sum(e_c, slot_ids, n_slots)
    v_c = jax.ops.segment_sum(e_c[..., None] * value_c, slot_ids, n_slots)
    m_r, s_r, v_r = send(m_c), send(s_c), send(v_c)
    # The owner's max over its local logits and the received maxima of non-empty slots, then every term
    # rescaled to it: exp(m_i − M) · s_i, as online softmax combines blocks.
    m_r = jnp.where(s_r > 0, m_r, -jnp.inf)
    ids = jnp.concatenate([dst_local, in_dst])
    top = jax.lax.stop_gradient(jax.ops.segment_max(jnp.concatenate([logit_l, m_r]), ids, rows))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e_l = jnp.exp(logit_l - top[dst_local])
    scale_r = jnp.where(s_r > 0, jnp.exp(jnp.where(s_r > 0, m_r, 0.0) - top[in_dst]), 0.0)
    total = jax.ops.segment_sum(jnp.concatenate([e_l, s_r * scale_r]), ids, rows)
    weighted = jax.ops.segment_sum(jnp.concatenate([e_l[..., None] * value_l, v_r * scale_r[..., None]]), ids,
                                   rows)
    return (weighted / jnp.where(total > 0, total, 1.0)[..., None])[:s_own]


def partial_arrays(partials: Partials) -> dict:
    """The per-part arrays `aggregate` reads (place them with `jgnn.distributed.put` on the mesh axis)."""
    return {"out_src": partials.out_src, "out_slot": partials.out_slot, "in_dst": partials.in_dst,
            "local_cut": partials.local_cut}
