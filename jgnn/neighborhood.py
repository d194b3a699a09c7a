"""Flexible neighbourhoods and hierarchical aggregation: NeighborSelection → Aggregation → Update (FlexGraph's NAU).

A *selection* is any pure function that returns a `Neighborhood`: a bottom-up tuple of `Level`\\ s, each grouping
the rows of the level below (level 0: the graph's nodes) into the level's groups. The top level's groups are
the nodes being updated. A level is

* **dense** (`dense_level`): ``members [G, k]``, a fixed fan-out ``k`` per group (PinSage's top-k, MAGNN's
  metapath instances of fixed length, its ``P`` metapaths per node), padding masked; or
* **ragged** (`ragged_level`): ``members [M]`` and ``groups [M]``, each member's group id, padded to a static
  ``M`` with a mask (MAGNN's varying number of instances per node and metapath).

Internally each level is a bipartite `jraph.GraphsTuple`: ``senders`` are the member rows of the level below,
``receivers`` the groups (masked members point one past the last group, so segment reductions drop them) and
``edges`` the members' features. `hierarchical` builds a layer whose reference program aggregates level by level
with jgnn's graph primitives, as `jgnn.message_passing` does for one level: a ragged level is a gather by the
senders, the per-member ``phi``, and ``rho``'s mailbox reductions as segment ops over the receivers, so the
compiler sees every ragged level as a graph level (residency, broadcast reordering, fusion into one ``edge_op``);
a dense level is the same gather and ``phi`` followed by a reshape to ``[G, k, ...]`` and masked dense reductions
along ``k``, with no segment op (FlexGraph's hybrid execution). ``explain`` records the choice made at each level.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import ir, mailbox
from jgnn.compiler import Compiled
from jgnn.ops.gather import gather
from jgnn.report import Pass, Reason, Report
from jgnn.roles import Index

# ---- the neighbourhood ------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Level:
    """One level of a hierarchical neighbourhood; make one with `dense_level` or `ragged_level`.

    Attributes:
      graph: the level as a bipartite graph: ``senders [M]`` the member rows of the level below, ``receivers
        [M]`` each member's group (``num_groups`` for a masked member), ``edges`` the members' features (a pytree
        of ``[M, ...]`` leaves, or None), ``n_node = [G]``, ``n_edge = [M]``; ``nodes`` is None.
      mask: bool ``[M]``, False on padding.
      num_groups: static number of groups ``G``.
      fanout: static ``k`` of a dense level (members of group ``g`` are rows ``g*k ... g*k+k-1``), None when
        ragged.
    """

    graph: jraph.GraphsTuple
    mask: jax.Array
    num_groups: int = dataclasses.field(metadata=dict(static=True))
    fanout: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @property
    def dense(self) -> bool:
        return self.fanout is not None

    @property
    def num_members(self) -> int:
        return int(np.shape(self.graph.senders)[0])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Neighborhood:
    """A hierarchical neighbourhood: ``levels`` bottom-up; level 0's members are node ids of the graph, level
    ``i > 0``'s members are group ids of level ``i - 1``; the top level's groups are the updated nodes."""

    levels: tuple[Level, ...]

    def __post_init__(self):
        if not isinstance(self.levels, tuple) or not self.levels:
            raise ValueError("Neighborhood needs a non-empty tuple of Levels")


def _int_ids(name: str, ids, ndim: int):
    ids = jnp.asarray(ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer) or ids.ndim != ndim:
        raise ValueError(f"{name} must be an integer array of rank {ndim}, got {ids.dtype} {ids.shape}")
    return ids.astype(jnp.int32)


def _check_features(features, rows: tuple[int, ...], what: str):
    for leaf in jax.tree_util.tree_leaves(features):
        if tuple(np.shape(leaf)[:len(rows)]) != rows:
            raise ValueError(f"{what}: member features must have leading shape {rows}, got {np.shape(leaf)}")


def _bipartite(senders, receivers, features, num_groups: int) -> jraph.GraphsTuple:
    m = senders.shape[0]
    return jraph.GraphsTuple(nodes=None, edges=features, senders=senders, receivers=receivers,
                             n_node=jnp.full((1,), num_groups, jnp.int32), n_edge=jnp.full((1,), m, jnp.int32),
                             globals=None)


def dense_level(members, *, mask=None, features=None) -> Level:
    """A level with a fixed fan-out: ``members`` int ``[G, k]`` rows of the level below; ``mask`` bool ``[G, k]``
    (None: all valid); ``features``: a pytree of ``[G, k, ...]`` leaves each member's ``phi`` receives."""
    members = _int_ids("dense_level members", members, 2)
    g, k = members.shape
    mask = jnp.ones((g, k), bool) if mask is None else jnp.asarray(mask, bool)
    if mask.shape != (g, k):
        raise ValueError(f"dense_level mask must be [{g}, {k}], got {mask.shape}")
    _check_features(features, (g, k), "dense_level")
    flat = jax.tree_util.tree_map(lambda f: jnp.reshape(f, (g * k,) + jnp.shape(f)[2:]), features)
    receivers = jnp.repeat(jnp.arange(g, dtype=jnp.int32), k)
    return Level(_bipartite(members.reshape(-1), receivers, flat, g), mask.reshape(-1), g, k)


def ragged_level(members, groups, num_groups: int, *, mask=None, features=None) -> Level:
    """A level of varying group sizes: member ``i`` (row ``members[i]`` of the level below) belongs to group
    ``groups[i]`` in ``[0, num_groups)``; ``mask`` bool ``[M]`` (None: all valid) marks padding; ``features``: a
    pytree of ``[M, ...]`` leaves. Groups without members aggregate to 0, as empty mailboxes do."""
    members = _int_ids("ragged_level members", members, 1)
    groups = _int_ids("ragged_level groups", groups, 1)
    if groups.shape != members.shape:
        raise ValueError(f"ragged_level groups must be {members.shape} like members, got {groups.shape}")
    mask = jnp.ones(members.shape, bool) if mask is None else jnp.asarray(mask, bool)
    if mask.shape != members.shape:
        raise ValueError(f"ragged_level mask must be {members.shape}, got {mask.shape}")
    _check_features(features, members.shape, "ragged_level")
    receivers = jnp.where(mask, groups, num_groups).astype(jnp.int32)  # out of range: dropped by segment ops
    return Level(_bipartite(members, receivers, features, int(num_groups)), mask, int(num_groups), None)


# ---- aggregation ------------------------------------------------------------------------------------------


def default_phi(member, group, features):
    return member


def default_rho(mailbox_, group):
    return mailbox.sum(mailbox_)


@dataclasses.dataclass(frozen=True)
class Aggregation:
    """How one level combines its members, written for one member and one group.

    * ``phi(member, group, features) -> message``: ``member`` the member's row of the level below, ``group``
      the group's row of the table given for this level (None without one), ``features`` the member's
      features (None without). Default: the member's row.
    * ``rho(mailbox, group) -> value``: as in `jgnn.message_passing`, with `jgnn.sum`/`mean`/`max`/`min`/
      `softmax` across the group's members (padding excluded; an empty group reduces to 0). Default: the sum.
    """

    phi: Callable | None = None
    rho: Callable | None = None


def _rows(table, ids, index: Index):
    return None if table is None else jax.tree_util.tree_map(lambda t: gather(t, ids, index=index), table)


def _messages(agg: Aggregation, rows, table, level: Level):
    g = level.graph
    phi = agg.phi or default_phi
    return jax.vmap(phi)(_rows(rows, g.senders, Index.SRC), _rows(table, g.receivers, Index.DST), g.edges)


def _aggregate_ragged(agg: Aggregation, rows, table, level: Level):
    msgs = _messages(agg, rows, table, level)
    return mailbox.lower_rho(agg.rho or default_rho, msgs, table, level.graph.receivers, level.num_groups)


def _aggregate_dense(agg: Aggregation, rows, table, level: Level):
    g, k = level.num_groups, level.fanout
    msgs = jax.tree_util.tree_map(lambda m: m.reshape((g, k) + m.shape[1:]), _messages(agg, rows, table, level))
    rho = agg.rho or default_rho
    return jax.vmap(_dense_rho(rho, msgs, table))(msgs, table, level.mask.reshape(g, k))


def _masked(kind: str, x, mask):
    """One group's mailbox reduction over its ``k`` rows, padding excluded (the ragged form's conventions)."""
    m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    count = jnp.sum(m, 0)
    if kind == "sum":
        return jnp.sum(jnp.where(m, x, 0), 0).astype(x.dtype)
    if kind == "mean":
        return (jnp.sum(jnp.where(m, x, 0), 0) / jnp.maximum(count, 1)).astype(x.dtype)
    if kind in ("max", "min"):
        fill = -jnp.inf if kind == "max" else jnp.inf
        red = jnp.max if kind == "max" else jnp.min
        return jnp.where(count > 0, red(jnp.where(m, x, fill), 0), 0).astype(x.dtype)
    top = jnp.max(jnp.where(m, x, -jnp.inf), 0, keepdims=True)
    e = jnp.where(m, jnp.exp(x - jnp.where(jnp.isfinite(top), top, 0)), 0)
    return e / jnp.where(count > 0, jnp.sum(e, 0, keepdims=True), 1)


def _dense_rho(rho: Callable, msgs, table) -> Callable:
    """rho for one group of a dense level: its trace, with each mailbox reduction a masked reduction over k."""
    one = lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
    closed = jax.make_jaxpr(rho)(jax.tree_util.tree_map(one, msgs), jax.tree_util.tree_map(one, table))
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(rho, jax.tree_util.tree_map(one, msgs),
                                                           jax.tree_util.tree_map(one, table)))
    traced = ir.from_closed_jaxpr(closed)
    program = traced.program

    def run(mb, group, mask):
        env = dict(zip((v.id for v in program.inputs),
                       jax.tree_util.tree_leaves(mb) + jax.tree_util.tree_leaves(group) + list(traced.consts),
                       strict=True))
        read = lambda a: a.value if isinstance(a, ir.Const) else env[a.id]
        for op in program.ops:
            vals = [read(a) for a in op.inputs]
            if op.prim is mailbox.mailbox_reduce_p:
                outs = [_masked(op.params["kind"], vals[0], mask)]
            else:
                outs = op.run(*vals)
            env.update((v.id, x) for v, x in zip(op.outputs, outs, strict=True))
        return jax.tree_util.tree_unflatten(out_tree, [read(a) for a in program.outputs])

    return run


def aggregate(x, neighborhood: Neighborhood, aggregations: Sequence[Aggregation], tables=None):
    """The bottom-up Aggregation stage: rows of each level's groups from the rows below, level 0 reading ``x``
    (a pytree of ``[N, ...]`` leaves). ``tables``: per level, a pytree of ``[G, ...]`` group rows that ``phi`` and
    ``rho`` see as ``group`` (or None). Returns the top level's ``[G, ...]`` rows."""
    levels = neighborhood.levels
    if len(aggregations) != len(levels):
        raise ValueError(f"{len(levels)} levels but {len(aggregations)} aggregations")
    tables = (None,) * len(levels) if tables is None else tuple(tables)
    if len(tables) != len(levels):
        raise ValueError(f"{len(levels)} levels but {len(tables)} group tables")
    rows = x
    for level, agg, table in zip(levels, aggregations, tables, strict=True):
        for leaf in jax.tree_util.tree_leaves(table):
            if jnp.shape(leaf)[0] != level.num_groups:
                raise ValueError(f"a group table has {jnp.shape(leaf)[0]} rows for {level.num_groups} groups")
        step = _aggregate_dense if level.dense else _aggregate_ragged
        rows = step(agg, rows, table, level)
    return rows


# ---- the layer --------------------------------------------------------------------------------------------


def level_decisions(neighborhood: Neighborhood, report: Report) -> list:
    """Per level: dense or segment lowering, and for a ragged level whether a fused op reduces its members
    (matched by its member count among the fusion decisions)."""
    fused = {d.get("edges") for d in report.decisions
             if d.by == Pass.FUSE and d.code in (Reason.FUSED_REDUCE, Reason.FUSED_ATTENTION)}
    out = []
    for i, level in enumerate(neighborhood.levels):
        base = dict(level=i, groups=level.num_groups, members=level.num_members)
        if level.dense:
            out.append((Pass.LOWERING, Reason.LEVEL_DENSE, True, dict(base, fanout=level.fanout)))
            continue
        out.append((Pass.LOWERING, Reason.LEVEL_SEGMENT, True, base))
        if report.backend != "reference":
            hit = level.num_members in fused
            out.append((Pass.FUSE, Reason.LEVEL_FUSED if hit else Reason.LEVEL_NOT_FUSED, hit, base))
    return out


class LevelsCompiled(Compiled):
    """`Compiled`, whose ``explain`` adds one decision per level of the neighbourhood argument."""

    def explain(self, graph, neighborhood, *args, **kwargs) -> Report:
        report = copy.copy(super().explain(graph, neighborhood, *args, **kwargs))
        report.decisions = list(report.decisions)
        for by, code, applied, params in level_decisions(neighborhood, report):
            report.add(by, code, applied=applied, **params)
        return report


@dataclasses.dataclass(frozen=True)
class Hierarchical:
    """A layer ``(graph, neighborhood, tables=None) -> graph``; make one with `jgnn.hierarchical`."""

    aggregations: tuple[Aggregation, ...]
    psi: Callable | None = None
    backend: str = "auto"
    remat: Any = "auto"

    def __post_init__(self):
        from jgnn import remat as remat_lib
        from jgnn.compiler import resolve_backend

        resolve_backend(self.backend)
        remat_lib.resolve(self.remat)
        for agg in self.aggregations:
            if not isinstance(agg, Aggregation):
                raise TypeError(f"hierarchical: aggregations must be jgnn.Aggregation, got {type(agg).__name__}")

    def reference(self, graph: jraph.GraphsTuple, neighborhood: Neighborhood, tables=None) -> jraph.GraphsTuple:
        """The uncompiled program: aggregate bottom-up, then ``vmap(psi)`` over the nodes."""
        if not isinstance(neighborhood, Neighborhood):
            raise TypeError(f"expected a jgnn.Neighborhood, got {type(neighborhood).__name__}")
        out = aggregate(graph.nodes, neighborhood, self.aggregations, tables)
        top = neighborhood.levels[-1].num_groups
        if self.psi is None:
            return graph._replace(nodes=out)
        if any(jnp.shape(leaf)[0] != top for leaf in jax.tree_util.tree_leaves(graph.nodes)):
            raise ValueError(f"psi updates the nodes: the top level must have one group per node, got {top}")
        return graph._replace(nodes=jax.vmap(self.psi)(graph.nodes, out))

    @property
    def compiled(self) -> LevelsCompiled:
        cache = self.__dict__.get("_compiled")
        if cache is None:
            cache = LevelsCompiled(self.reference, backend=self.backend, remat=self.remat)
            object.__setattr__(self, "_compiled", cache)
        return cache

    def __call__(self, graph: jraph.GraphsTuple, neighborhood: Neighborhood, tables=None) -> jraph.GraphsTuple:
        if self.compiled.backend == "reference":
            return self.reference(graph, neighborhood, tables)
        return self.compiled(graph, neighborhood, tables)


def hierarchical(aggregations: Sequence[Aggregation], psi: Callable | None = None, *, backend: str = "auto",
                 remat: Any = "auto") -> Hierarchical:
    """A layer that aggregates a hierarchical neighbourhood bottom-up and updates the nodes (NAU's Aggregation and
    Update stages; the selection is the function that made the `Neighborhood`).

    Args:
      aggregations: one `Aggregation` per level, bottom-up.
      psi: ``psi(node, aggregate) -> new_node`` for one node (the top level must have one group per node), or
        None: the layer returns the top level's rows as ``nodes``.
      backend, remat: as in `jgnn.compile`.

    Returns:
      A `Hierarchical` layer called as ``layer(graph, neighborhood, tables=None) -> graph``; ``tables`` gives, per
      level, the group rows ``phi``/``rho`` see (or None). ``jgnn.explain(layer, graph, neighborhood)`` adds one
      ``LEVEL_DENSE`` or ``LEVEL_SEGMENT`` decision per level, and ``LEVEL_FUSED``/``LEVEL_NOT_FUSED`` per ragged
      level.
    """
    return Hierarchical(tuple(aggregations), psi, backend=backend, remat=remat)
