"""``fuse``: a segment reduction and the per-edge computation feeding it become one `jgnn.ops.edge_op`.

Roots are `segment` ops that reduce edge rows to their destination or source nodes (sum, mean, max, min). From
the reduced value the *region* grows backwards through ops that are row-wise on the edge axis (elementwise ops,
unit-axis reshapes, broadcasts of shared values, reductions over feature axes) and whose results nothing outside
the region reads. Dense ``dot_general``s stay outside (UGCG's rule: a matmul is cheaper to keep than to redo in
the backward pass), usually already moved to the nodes by broadcast reordering. The region's *leaves* become the
op's operands: node rows gathered by source or destination ids, edge rows, and shared values.

A weighted sum of an edge softmax, ``segment_sum(f(α, ...))`` with ``α = segment_softmax(s)`` and ``f`` linear and
diagonal in ``α`` (``α[..., None] * v``, times masks), becomes one attention op: neither ``α`` nor the scores are
ever stored. Messages that something else also reads are stored anyway: the region making them becomes a
per-edge edge op and the reduction another over the stored rows (`Reason.MESSAGES_STORED_ANYWAY`). Everything is
recorded in the report, with the lowering each op gets.
"""

from __future__ import annotations

import dataclasses
import heapq

import jax
import numpy as np
from jax import lax

from jgnn import compat, facts, ir
from jgnn.ops import lowering
from jgnn.ops.edge_fn import RegionFn
from jgnn.ops.edge_op import EdgeSpec, Reduce, edge_op_p
from jgnn.ops.gather import gather_p
from jgnn.ops.segment import segment_p
from jgnn.ops.softmax import segment_softmax_p
from jgnn.passes.context import Builder, Context
from jgnn.report import Pass, Reason
from jgnn.roles import ENDPOINTS, Group, Index, Residency

_REDUCE = {"sum": Reduce.SUM, "mean": Reduce.MEAN, "max": Reduce.MAX, "min": Reduce.MIN}
# Ops a region may hold besides elementwise ones: they keep rows apart.
_REGION_SHAPE_OPS = frozenset(compat.primitives("broadcast_in_dim reshape squeeze expand_dims transpose "
                                               "reduce_sum reduce_max reduce_min concatenate slice"))
_UNIT_RESHAPES = frozenset(compat.primitives("reshape squeeze expand_dims"))


@dataclasses.dataclass
class Region:
    ops: list[ir.Op]  # in program order
    leaves: list[ir.Value]  # values read from outside, in first-read order
    copies: set[int] = dataclasses.field(default_factory=set)  # id(op) of free ops other readers also need


def _edge_rowwise(op: ir.Op, ctx: Context, e: int) -> bool:
    """Row-wise on the edge axis (axis 0): what a region may hold."""
    if len(op.outputs) != 1 or op.effects or facts.of(op.prim).impure or op.prim is lax.dot_general_p:
        return False
    if not (facts.is_elementwise(op.prim) or op.prim in _REGION_SHAPE_OPS or op.prim in (compat.CUSTOM_JVP,
                                                                                         compat.CUSTOM_VJP)):
        return False
    out = ctx.info(op.outputs[0])
    if op.outputs[0].shape[:1] != (e,):
        return False
    infos = [ctx.info(a) for a in op.inputs]
    if all(i.residency == Residency.SHARED for i in infos):  # shared values broadcast along the edges
        return out.expanded and (op.prim is lax.broadcast_in_dim_p or facts.is_elementwise(op.prim))
    if out.residency != Residency.EDGE or out.axis != 0:
        return False
    axes = [0 if i.residency == Residency.EDGE and not i.expanded and i.axis == 0 else None for i in infos]
    return any(a is not None for a in axes) and facts.row_axis(op, axes) == 0


def grow(root: ir.Value, made_by, users, admit, order, *, readers_allowed=frozenset(),
         ctx_shared=lambda a: False) -> Region:
    """The ops computing ``root`` that ``admit`` accepts and whose results only the region reads.

    An admitted op on shared values only (a constant broadcast along the edges) joins the region even when
    others read it too: it is free to remake, and stays in the program for them (`Region.copies`)."""
    member: dict[int, ir.Op] = {}
    inside = set(readers_allowed)
    leaves: dict[int, ir.Value] = {}
    copies: set[int] = set()
    position = lambda v: order.get(id(made_by.get(v.id)), -1)
    heap = [(-position(root), root.id, root)]
    queued = {root.id}
    while heap:  # latest-defined first: a value's readers are all decided before it
        _, _, v = heapq.heappop(heap)
        op = made_by.get(v.id)
        read_inside = v.id == root.id or all(u is not ir.OUTPUT and id(u) in inside for u in users.get(v.id, []))
        free = op is not None and all(ctx_shared(a) for a in op.inputs)
        if not ((read_inside or free) and op is not None and admit(op)):
            leaves[v.id] = v
            continue
        if not read_inside:  # a broadcast of a shared value: remade inside, kept for its other readers
            copies.add(id(op))
        member[id(op)] = op
        inside.add(id(op))
        for a in op.inputs:
            if isinstance(a, ir.Value) and a.id not in queued:
                queued.add(a.id)
                heapq.heappush(heap, (-position(a), a.id, a))
    ops = sorted(member.values(), key=lambda o: order[id(o)])
    return Region(ops, list(leaves.values()), copies)


@dataclasses.dataclass
class Operands:
    """A region's leaves sorted into an edge op's operand groups."""

    values: list[ir.Value]  # the leaf values the edge function reads, in operand order
    arrays: list[ir.Atom]  # what the edge op takes for each (node arrays for gathered rows)
    groups: list[Group]
    ids: dict[Group, ir.Atom]  # the src/dst ids of the gathers
    wrap: set[bool]


def _rows_at_zero(region: Region, leaf: ir.Value) -> bool:
    """Whether the region reads a shared ``leaf`` of ``E`` rows as one row per edge (``arange(E)[:, None]``),
    not as a vector that happens to be ``E`` long (with 4 edges, a dropout mask ``uniform(key, (4,))``
    broadcast along the features): every op it reaches keeps its axis 0 on the edge axis."""
    axes = {leaf.id: 0}
    for op in region.ops:
        ins = [axes.get(a.id) if isinstance(a, ir.Value) else None for a in op.inputs]
        if all(a is None for a in ins):
            continue
        if facts.row_axis(op, ins) != 0:
            return False
        axes.update((v.id, 0) for v in op.outputs)
    return True


def classify(region: Region, ctx: Context, made_by, e: int) -> Operands | None:
    found = Operands([], [], [], {}, set())
    order = {Group.SRC: 0, Group.DST: 1, Group.EDGE: 2, Group.SHARED: 3}
    rows = []
    for leaf in region.leaves:
        op = made_by.get(leaf.id)
        info = ctx.info(leaf)
        if op is not None and op.prim is gather_p and op.params["index"] in ENDPOINTS and \
                op.params["mode"] == "clip" and facts.endpoint_table(ctx.info(op.inputs[0])):
            group = Group.SRC if op.params["index"] == Index.SRC else Group.DST
            if found.ids.setdefault(group, op.inputs[1]) is not op.inputs[1]:
                return None  # gathers by two different id arrays of one kind
            found.wrap.add(op.params["wrap"])
            rows.append((order[group], leaf, op.inputs[0], group))
        elif info.residency == Residency.EDGE and info.axis == 0 and not info.expanded and leaf.shape[:1] == (e,):
            rows.append((order[Group.EDGE], leaf, leaf, Group.EDGE))
        elif info.residency == Residency.SHARED and not (info.expanded and leaf.shape[:1] == (e,)):
            aligned = not info.expanded and leaf.ndim > 0 and leaf.shape[0] == e and _rows_at_zero(region, leaf)
            group = Group.EDGE if aligned else Group.SHARED
            rows.append((order[group], leaf, leaf, group))
        else:
            return None
    for _, value, array, group in sorted(rows, key=lambda r: r[0]):
        found.values.append(value)
        found.arrays.append(array)
        found.groups.append(group)
    return found if len(found.wrap) <= 1 else None


def _ids(ctx: Context, found: Operands, root_ids: ir.Atom, over: Group) -> tuple[ir.Atom, ir.Atom] | None:
    """(src ids, dst ids) of the edge op: the gathers', the reduction's for its own group, else the other's."""
    ids = dict(found.ids)
    if ids.setdefault(over, root_ids) is not root_ids:
        return None
    src = ids.get(Group.SRC, ids.get(Group.DST))
    dst = ids.get(Group.DST, ids.get(Group.SRC))
    return src, dst


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by, users = ir.producers(program), ir.users(program)
    order = {id(op): i for i, op in enumerate(program.ops)}
    plans: dict[int, tuple] = {}
    fused_away: set[int] = set()
    for op in reversed(program.ops):
        if id(op) in fused_away or op.prim is not segment_p or ctx.analysis.unknown(op.outputs[0]):
            continue
        index = op.params["index"]
        msg, root_ids = op.inputs
        if index not in ENDPOINTS:  # by graph or type ids: a readout, no edge walk
            ctx.skipped(Pass.FUSE, Reason.NOT_A_GRAPH_REDUCTION, reduce=op.params["kind"], index=index.value)
            continue
        if ctx.info(msg).residency != Residency.EDGE or ctx.info(msg).axis != 0 or not isinstance(msg, ir.Value):
            ctx.skipped(Pass.FUSE, Reason.NO_EDGE_WORK, reduce=op.params["kind"])
            continue
        planned = _plan_attention(op, ctx, made_by, users, order) if op.params["kind"] == "sum" else None
        if planned is not None:
            planned = [(op, planned)]
        elif any(u is not op for u in users.get(op.inputs[0].id, [])):
            planned = _plan_stored(op, ctx, made_by, users, order, set(plans) | fused_away)
        else:
            planned = _plan_reduce(op, ctx, made_by, users, order)
            planned = [] if planned is None else [(op, planned)]
        for at, plan in planned:  # each plan's op replaces ``at``, whose outputs it makes
            plans[id(at)] = plan
            fused_away.update(id(o) for o in plan[1] if id(o) not in plan[4] and o is not at)
    b = Builder(program, ctx)
    for op in program.ops:
        if id(op) in plans:
            spec, _, operands, extra_outputs, _ = plans[id(op)]
            b.bind(edge_op_p, operands, dict(spec=spec), outputs=list(op.outputs) + extra_outputs)
            continue
        if id(op) in fused_away:
            continue
        b.emit(op)
    return b.finish()


def _layout(ctx: Context, ids: ir.Atom):
    lay = ctx.layout_for(ctx.info(ids).edges)
    return (tuple(lay.values), lay.tree) if lay is not None else ((), None)


def _spec_and_operands(ctx: Context, root: ir.Op, fn: RegionFn, found: Operands, reduce: Reduce,
                       name: str, *, wrap: bool | None = None, over: Group | None = None):
    msg, root_ids = root.inputs
    by = Group.DST if root.params["index"] == Index.DST else Group.SRC
    ids = _ids(ctx, found, root_ids, by)
    if ids is None:
        ctx.skipped(Pass.FUSE, Reason.DIFFERENT_INDICES, op=name, indices="src/dst")
        return None
    layout, tree = _layout(ctx, root_ids)
    e = msg.shape[0]
    spec = EdgeSpec(fn, tuple(found.groups), reduce, over or by, root.params["num_segments"], e,
                    empty=root.params["empty"], wrap=next(iter(found.wrap), True) if wrap is None else wrap,
                    raw_over=True, backend=ctx.backend, layout=len(layout), layout_tree=tree, name=name)
    operands = [ids[0], ids[1], *found.arrays, *layout]
    return spec, operands


def _record(ctx: Context, spec: EdgeSpec, operands, made_by) -> None:
    mine = operands[2:2 + len(spec.groups)]
    lowering.record(ctx.report, spec, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in mine],
                    varying=tuple(ctx.varies(a, made_by) for a in mine))


def _grow_messages(msg: ir.Value, ctx: Context, made_by, users, order) -> Region:
    """The row-wise edge ops computing ``msg`` (shared broadcasts remade inside)."""
    e = msg.shape[0]
    return grow(msg, made_by, users, lambda o: _edge_rowwise(o, ctx, e), order,
                ctx_shared=lambda a: ctx.info(a).residency == Residency.SHARED)


def _region_fn(region: Region, found: Operands, msg: ir.Value) -> RegionFn:
    return RegionFn(tuple(found.values), tuple(region.ops), (msg,), tuple(g == Group.SHARED for g in found.groups),
                    msg.shape[0])


def _reduction(ctx: Context, root: ir.Op, fn: RegionFn, found: Operands, made_by):
    """The reduction edge op of ``root`` over ``fn``'s messages, recorded: (spec, operands, extra outputs), or None
    (recorded as skipped)."""
    kind = root.params["kind"]
    built = _spec_and_operands(ctx, root, fn, found, _REDUCE[kind], f"gather_reduce({kind})")
    if built is None:
        return None
    spec, operands = built
    _record(ctx, spec, operands, made_by)
    return spec, operands, [ir.Value(tuple(a.shape), a.dtype) for a in _extra_avals(spec, operands)]


def _plan_reduce(root: ir.Op, ctx: Context, made_by, users, order):
    msg = root.inputs[0]
    e = msg.shape[0]
    kind = root.params["kind"]
    region = _grow_messages(msg, ctx, made_by, users, order)
    found = classify(region, ctx, made_by, e)
    if not region.ops and (found is None or found.groups[0] not in (Group.SRC, Group.DST)):
        ctx.skipped(Pass.FUSE, Reason.NO_EDGE_WORK, reduce=kind)
        return None
    if found is None:
        ctx.skipped(Pass.FUSE, Reason.NOT_A_GRAPH_REDUCTION, reduce=kind, index=root.params["index"].value)
        return None
    built = _reduction(ctx, root, _region_fn(region, found, msg), found, made_by)
    if built is None:
        return None
    spec, operands, extra = built
    ctx.applied(Pass.FUSE, Reason.FUSED_REDUCE, ops=len(region.ops), reduce=kind, edges=e, shape=list(msg.shape),
                **_group_counts(found))
    return spec, region.ops, operands, extra, region.copies


def _plan_stored(root: ir.Op, ctx: Context, made_by, users, order, taken: set[int]) -> list:
    """A reduction of messages that something else also reads (a GraphNetwork's updated edges, a callback): the
    messages are stored anyway, so the reduction alone becomes an edge op over the stored rows, and the gather→
    compute region making them becomes a per-edge op that writes them once (unless another reduction of the same
    messages planned it already). Two walks of the edges instead of one, but neither materialises more than the
    program already does."""
    msg = root.inputs[0]
    e, kind = msg.shape[0], root.params["kind"]
    out = []
    producer = made_by.get(msg.id)
    if producer is not None and id(producer) not in taken:
        region = _grow_messages(msg, ctx, made_by, users, order)
        found = classify(region, ctx, made_by, e) if region.ops else None
        if found is not None and {Group.SRC, Group.DST} & set(found.groups):
            built = _spec_and_operands(ctx, root, _region_fn(region, found, msg), found, Reduce.NONE,
                                       "gather_compute", over=Group.EDGE)
            if built is not None:
                spec, operands = built
                _record(ctx, spec, operands, made_by)
                ctx.applied(Pass.FUSE, Reason.FUSED_COMPUTE, ops=len(region.ops), edges=e, shape=list(msg.shape),
                            **_group_counts(found))
                out.append((producer, (spec, region.ops, operands, [], region.copies)))
    stored = Operands([msg], [msg], [Group.EDGE], {}, set())
    built = _reduction(ctx, root, _region_fn(Region([], [msg]), stored, msg), stored, made_by)
    if built is None:
        return out
    spec, operands, extra = built
    ctx.applied(Pass.FUSE, Reason.MESSAGES_STORED_ANYWAY, reduce=kind, edges=e, shape=list(msg.shape))
    return out + [(root, (spec, [], operands, extra, set()))]


def _group_counts(found: Operands) -> dict:
    return {f"{g.value}_operands": sum(x == g for x in found.groups) for g in Group if g != Group.ALL}


def _extra_avals(spec: EdgeSpec, operands) -> list:
    from jgnn.ops.edge_op import _abstract_eval

    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in operands]
    return _abstract_eval(*avals, spec=spec)[1:]


# ---- attention -------------------------------------------------------------------------------------------------

def _nonunit(shape) -> list[int]:
    return [i for i, d in enumerate(shape) if d != 1]


def _alpha_path(region: Region, alpha: ir.Value, msg: ir.Value) -> bool:
    """Whether ``msg`` is ``α[..., None] · V`` as the edge op computes it (α with trailing axes appended, broadcast),
    for ``V`` the path with α replaced by ones: every op from ``α`` to ``msg`` is a product with one factor on the
    path, a dtype cast, a broadcast, or a reshape that only adds or drops unit axes; and α's non-unit axes end where
    they started. Positions are tracked on the axes after the edge axis."""
    home = tuple(_nonunit(alpha.shape[1:]))
    where = {alpha.id: home}
    for op in region.ops:
        hits = [isinstance(a, ir.Value) and a.id in where for a in op.inputs]
        if not any(hits):
            continue
        if sum(hits) != 1:
            return False
        x, y = op.inputs[hits.index(True)], op.outputs[0]
        at = where[x.id]
        if op.prim is lax.broadcast_in_dim_p:
            dims = tuple(op.params["broadcast_dimensions"])
            if not dims or dims[0] != 0:
                return False
            at = tuple(dims[1 + i] - 1 for i in at)
        elif op.prim in _UNIT_RESHAPES:
            xs, ys = _nonunit(x.shape[1:]), _nonunit(y.shape[1:])
            if [x.shape[1 + i] for i in xs] != [y.shape[1 + i] for i in ys]:
                return False
            at = tuple(ys[xs.index(i)] for i in at)
        elif op.prim not in (lax.mul_p, lax.convert_element_type_p):
            return False
        where[y.id] = at
    return where.get(msg.id) == home and msg.ndim >= alpha.ndim


def _plan_attention(root: ir.Op, ctx: Context, made_by, users, order):
    shared = lambda a: ctx.info(a).residency == Residency.SHARED
    msg, root_ids = root.inputs
    e = msg.shape[0]
    if [u for u in users.get(msg.id, []) if u is not root]:
        return None  # the weighted messages are stored anyway
    admit = lambda o: _edge_rowwise(o, ctx, e)
    region = grow(msg, made_by, users, lambda o: o.prim is not segment_softmax_p and admit(o), order,
                  ctx_shared=shared)
    softmax = [made_by.get(v.id) for v in region.leaves]
    softmax = [o for o in softmax if o is not None and o.prim is segment_softmax_p]
    if len(softmax) != 1 or not region.ops:
        return None
    sm = softmax[0]
    alpha, (scores, sm_ids) = sm.outputs[0], sm.inputs
    if sm_ids is not root_ids or sm.params["num_segments"] != root.params["num_segments"] or \
            sm.params["index"] != root.params["index"] or [u for u in users.get(alpha.id, [])
                                                            if id(u) not in {id(o) for o in region.ops}]:
        return None
    if not _alpha_path(region, alpha, msg) or not isinstance(scores, ir.Value) or [
            u for u in users.get(scores.id, []) if u is not sm]:
        ctx.skipped(Pass.FUSE, Reason.SOFTMAX_NOT_FUSED)
        return None
    score_region = grow(scores, made_by, users, admit, order, readers_allowed={id(sm)}, ctx_shared=shared)
    values = Region(score_region.ops + region.ops, [])
    seen = set()
    for v in score_region.leaves + [v for v in region.leaves if v.id != alpha.id]:
        if v.id not in seen:
            seen.add(v.id)
            values.leaves.append(v)
    found = classify(values, ctx, made_by, e)
    if found is None or not isinstance(scores, ir.Value):
        return None
    ones = ir.Op(lax.broadcast_in_dim_p, (ir.Const(np.ones((), alpha.dtype)),),
                 (ir.Value(alpha.shape, alpha.dtype),), dict(shape=alpha.shape, broadcast_dimensions=(),
                                                              sharding=None))
    ops = list(score_region.ops) + [ones] + [_reading(o, alpha, ones.outputs[0]) for o in region.ops]
    whole = tuple(g == Group.SHARED for g in found.groups)
    fn = RegionFn(tuple(found.values), tuple(ops), (scores, msg), whole, e)
    built = _spec_and_operands(ctx, root, fn, found, Reduce.SOFTMAX, "attention", wrap=sm.params["wrap"])
    if built is None:
        return None
    spec, operands = built
    extra = [ir.Value(tuple(a.shape), a.dtype) for a in _extra_avals(spec, operands)]
    _record(ctx, spec, operands, made_by)
    ctx.applied(Pass.FUSE, Reason.FUSED_ATTENTION, edges=e, scores=list(scores.shape), **_group_counts(found))
    fused = score_region.ops + [sm] + region.ops
    return spec, fused, operands, extra, region.copies | score_region.copies


def _reading(op: ir.Op, old: ir.Value, new: ir.Value) -> ir.Op:
    """``op`` reading ``new`` where it read ``old`` (a copy; the program keeps the original)."""
    if not any(a is old for a in op.inputs):
        return op
    return dataclasses.replace(op, inputs=tuple(new if a is old else a for a in op.inputs))

