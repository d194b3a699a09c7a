"""``fuse_edge_softmax``: edge softmax, and the weighted sum after it, become one attention op.

Recognises the edge softmax as the ops it expands to, in `jgnn.softmax`'s lowering and in raw jraph code
(``jraph.segment_softmax``) alike::

    m = segment_max(s, dst); x = exp(s - m[dst]); α = x / segment_sum(x, dst)[dst]

The recognised softmax counts as one Norm op. When its only use is a weighted sum
``segment_sum(α[..., None] * v, dst)`` with ``v`` the source rows (GAT) or edge rows (HGT), all of it
becomes ``attention_aggregate``. Its XLA lowering recomputes the scores under ``grad``; its Pallas lowering
is the online-softmax kernel. Used any other way, the softmax becomes an ``edge_softmax`` op. The scores
``s`` are grown into the fused op as a region of row-wise edge ops (see `regions`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jgnn import fused, ir, residency
from jgnn.passes import regions
from jgnn.passes.context import Context
from jgnn.passes.fusion import csr_source, dst_scatter, layout_inputs
from jgnn.report import KernelRecord

KIND = "fuse_edge_softmax"


@dataclasses.dataclass
class Softmax:
    scores: ir.Value
    alpha: ir.Value
    ops: list[ir.Op]
    readers_of_scores: tuple[ir.Op, ...]


@dataclasses.dataclass
class WeightedSum:
    values: ir.Atom  # node rows [N, ...] (value_index "src") or edge rows [E, ...] ("edge")
    value_index: str
    src_index: ir.Value | None
    out: ir.Op
    ops: list[ir.Op]


def _only_user(v: ir.Value, users, name: str | None = None) -> ir.Op | None:
    us = users.get(v.id, [])
    if len(us) != 1 or (name is not None and us[0].name != name):
        return None
    return us[0]


def _norm_gather(op: ir.Op | None, ctx: Context) -> bool:
    return (op is not None and op.name == "gather" and residency.row_gather_axis(op) == 0
            and ctx.info(op.inputs[1]).index == "dst")


def match_softmax(mx: ir.Op, ctx: Context, made_by, users) -> Softmax | None:
    scores, maxs = mx.inputs[2], mx.outputs[0]
    g1 = _only_user(maxs, users, "gather")
    sub = g1 and _only_user(g1.outputs[0], users, "sub")
    if not (_norm_gather(g1, ctx) and sub and sub.inputs == (scores, g1.outputs[0])):
        return None
    ex = _only_user(sub.outputs[0], users, "exp")
    readers = users.get(ex.outputs[0].id, []) if ex else []
    total = next((o for o in readers if dst_scatter(o, ctx, made_by, "scatter-add", 0.0)), None)
    div = next((o for o in readers if o.name == "div" and o.inputs[0] is ex.outputs[0]), None)
    if total is None or div is None or len(readers) != 2:
        return None
    g2 = _only_user(total.outputs[0], users, "gather")
    if not (_norm_gather(g2, ctx) and div.inputs[1] is g2.outputs[0]):
        return None
    return Softmax(scores, div.outputs[0], [mx, g1, sub, ex, total, g2, div], (mx, sub))


def _through_shape_ops(v: ir.Value, users, chain: list[ir.Op]) -> ir.Value:
    while (u := _only_user(v, users)) is not None and u.name in regions.SHAPE_ONLY and regions.is_lane_op(u):
        chain.append(u)
        v = u.outputs[0]
    return v


def match_weighted_sum(alpha: ir.Value, ctx: Context, made_by, users) -> WeightedSum | None:
    chain: list[ir.Op] = []
    a = _through_shape_ops(alpha, users, chain)
    mul = _only_user(a, users, "mul")
    if mul is None:
        return None
    other = mul.inputs[1] if mul.inputs[0] is a else mul.inputs[0]
    chain.append(mul)
    w = _through_shape_ops(mul.outputs[0], users, chain)
    out = _only_user(w, users)
    if out is None or not dst_scatter(out, ctx, made_by, "scatter-add", 0.0):
        return None
    heads = int(np.prod(alpha.shape[1:], dtype=np.int64))
    width = int(np.prod(out.outputs[0].shape[1:], dtype=np.int64))
    scales_whole_rows = heads == 1 or a.shape[-1:] == (1,)  # α as [.., H, 1] against values [.., H, D]
    if not scales_whole_rows or width % heads or not isinstance(other, ir.Value):
        return None
    producer = made_by.get(other.id)
    if producer is not None and producer.name == "gather" and residency.row_gather_axis(producer) == 0 \
            and ctx.info(producer.inputs[1]).index == "src" and len(users.get(other.id, [])) == 1:
        return WeightedSum(producer.inputs[0], "src", producer.inputs[1], out, chain + [producer])
    info = ctx.info(other)
    if info.residency == residency.EDGE and info.axis == 0 and not info.expanded:
        return WeightedSum(other, "edge", None, out, chain)
    return None


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by, users, order = regions.links(program)
    n = ctx.sizes.get("N")
    replaced: dict[int, ir.Op] = {}
    fused_away: set[int] = set()
    for op in program.ops:
        if not dst_scatter(op, ctx, made_by, "scatter-max", -np.inf) or op.inputs[2].ndim > 2:
            continue
        sm = match_softmax(op, ctx, made_by, users)
        if sm is None:
            ctx.skipped(KIND, "segment_max that does not start an edge softmax")
            continue
        grown = regions.grow(sm.scores, made_by, users, lambda o: regions.edge_rowwise(o, ctx), order,
                             allowed_readers={id(o) for o in sm.readers_of_scores})
        region = grown and regions.build(sm.scores, *grown, made_by, ctx)
        if region is None:
            ctx.skipped(KIND, "edge softmax whose scores are not a row-wise function of gathered rows")
            continue
        e = sm.scores.shape[0]
        ws = match_weighted_sum(sm.alpha, ctx, made_by, users)
        src_index = region.src_index or (ws and ws.src_index) or regions.find_index(program, ctx, "src", e, op)
        if src_index is None:
            ctx.skipped(KIND, "edge softmax on a graph whose source ids are not in the program")
            continue
        layout = layout_inputs(ctx, e)
        g = region.groups
        head = tuple(g["src"] + g["dst"] + g["edge"] + g["const"])
        sizes = (len(g["src"]), len(g["dst"]), len(g["edge"]), len(g["const"]))
        heads = regions.squeezed(sm.scores.shape[1:])
        lanes = all(regions.is_lane_op(o) or o.name == "reduce_sum" for o in region.ops) \
            and regions.zero_padding_safe(region) \
            and all(regions.squeezed(a.shape[1:])[:1] in ((), heads) for group in g.values() for a in group)
        if ws is not None:
            backend = ctx.backend if lanes else "xla"
            impl = ir.opaque(functools.partial(_run_attention, region, sizes, len(layout), num_nodes=n, backend=backend,
                                     value_index=ws.value_index, heads=sm.scores.shape[1:],
                                     out_shape=ws.out.outputs[0].shape, out_dtype=ws.out.outputs[0].dtype,
                                     layout_tree=ctx.layout_tree), "attention", "node", backend)
            inputs = head + (ws.values, src_index, ws.out.inputs[1]) + tuple(layout)
            replaced[id(ws.out)] = ir.Op("fused_attention", inputs, ws.out.outputs,
                                         {"jgnn_residency": ("node",), "jgnn_movement": "reduce"}, impl=impl,
                                         origin=KIND)
            fused_away.update(id(o) for o in sm.ops + region.ops + ws.ops)
            why = "" if backend == ctx.backend else " (the scores are not lane-wise or not safe on zero-padded " \
                                                    "lanes, which the Pallas kernel needs, so XLA runs it)"
            ctx.report.kernels.append(KernelRecord(
                "attention_aggregate", backend,
                f"{len(region.ops)} score ops, values by {ws.value_index}, heads {list(sm.scores.shape[1:])}; "
                f"{csr_source(backend, layout)}{why}"))
            ctx.applied(KIND, f"edge softmax over {e} edges + weighted sum → one attention op (scores "
                              f"{list(sm.scores.shape)} and weights are recomputed, never stored)")
        else:
            impl = ir.opaque(functools.partial(_run_softmax, region, sizes, num_nodes=n, out_dtype=sm.alpha.dtype),
                             "edge_softmax", "edge", "xla")
            inputs = head + (src_index, op.inputs[1])
            replaced[id(sm.ops[-1])] = ir.Op("fused_edge_softmax", inputs, (sm.alpha,),
                                             {"jgnn_residency": ("edge",), "jgnn_movement": "norm"}, impl=impl,
                                             origin=KIND)
            fused_away.update(id(o) for o in sm.ops[:-1] + region.ops)
            ctx.report.kernels.append(KernelRecord("edge_softmax", "xla", "weights used outside a weighted sum"))
            ctx.applied(KIND, f"edge softmax over {e} edges recognised as one Norm op")
    return regions.replace_ops(program, replaced, fused_away)


def _groups(args, sizes):
    out, k = [], 0
    for size in sizes:
        out.append(tuple(args[k:k + size]))
        k += size
    return out, args[k:]


def _run_attention(region, sizes, n_layout, *args, num_nodes, backend, value_index, heads, out_shape, out_dtype,
                   layout_tree):
    (src, dst, edge, consts), (values, senders, receivers, *layout_leaves) = _groups(args, sizes)
    layout = jax.tree_util.tree_unflatten(layout_tree, layout_leaves) if n_layout else None
    h = int(np.prod(heads, dtype=np.int64))
    values = jnp.reshape(values, (values.shape[0], h, -1))
    if backend == "xla":
        score_fn = _flat_scores(regions.evaluator(region, lanes=False, consts=consts), h)
    else:
        # The kernel takes [*, H] or [*, H, Dk] score operands: widen scalars and width-1 columns to every head.
        def per_head(x):
            rows = jnp.reshape(x, (x.shape[0], -1))
            if rows.shape[1] in (1, h):
                return jnp.broadcast_to(rows, (x.shape[0], h))
            return jnp.reshape(x, (x.shape[0], h, -1))

        score_fn = regions.evaluator(region, lanes=True)
        src, edge = tuple(map(per_head, src)), tuple(map(per_head, edge))
        dst = tuple(map(per_head, dst + tuple(regions.as_rows(c, num_nodes) for c in consts)))
    out = fused.attention_aggregate(score_fn, src, dst, edge, values, senders, receivers, num_nodes=num_nodes,
                                    value_index=value_index, backend=backend, layout=layout, out_dtype=out_dtype)
    return [out.reshape(out_shape)]


def _flat_scores(fn, heads):
    return lambda s, d, e: jnp.reshape(fn(s, d, e), (-1, heads))


def _run_softmax(region, sizes, *args, num_nodes, out_dtype):
    (src, dst, edge, consts), (senders, receivers) = _groups(args, sizes)
    score_fn = regions.evaluator(region, lanes=False, consts=consts)
    shape = region.root.shape
    alpha = fused.edge_softmax(score_fn, src, dst, edge, senders, receivers, num_nodes=num_nodes,
                               out_dtype=out_dtype)
    return [alpha.reshape(shape)]
