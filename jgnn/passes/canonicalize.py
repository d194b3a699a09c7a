"""``canonicalize``: raw jraph/XLA idioms become jgnn's graph primitives, so jraph code and `message_passing`
code take one path through the compiler.

* ``x[senders]``, ``jnp.take(x, receivers, axis=0)``, ``globals[graph_of_node]``: a lax ``gather`` of whole rows
  by an index the analysis traced to the graph (with JAX's wrap-negative-ids ops before it) → `gather`;
* ``jax.ops.segment_sum/max/min(x, receivers, N)``: a ``scatter-add/max/min`` of rows into a broadcast
  0/−inf/+inf by such an index → `segment`;
* ``jraph.segment_mean``: ``segment_sum(x) / max(segment_sum(ones_like(x)), 1)`` → a ``mean`` `segment`;
* ``jraph.segment_softmax``: ``e = exp(s − segment_max(s)[ids]); e / segment_sum(e)[ids]`` → `segment_softmax`.

Each raised idiom is recorded in the report. Everything else is left as it is.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from jgnn import facts, ir
from jgnn.ops.gather import gather_p
from jgnn.ops.segment import segment_p
from jgnn.ops.softmax import segment_softmax_p
from jgnn.passes import cleanup
from jgnn.passes.context import Builder, Context
from jgnn.report import Pass, Reason
from jgnn.roles import ENDPOINTS, MEMBERSHIP, Residency

_SCATTER_KIND = {p: k for p, k in ((lax.scatter_add_p, "sum"), (lax.scatter_max_p, "max"),
                                   (lax.scatter_min_p, "min"))}
_INIT = {"sum": 0.0, "max": -np.inf, "min": np.inf}
_RAISED_INDEX = ENDPOINTS | frozenset(MEMBERSHIP)
_GATHER_MODES = {"GatherScatterMode.CLIP": "clip", "GatherScatterMode.PROMISE_IN_BOUNDS": "clip",
                 "GatherScatterMode.FILL_OR_DROP": "fill", "GatherScatterMode.ONE_HOT": None}


def _column_of(atom: ir.Atom, made_by) -> ir.Atom | None:
    """The 1-D ids behind an ``[K, 1]`` index column (``broadcast_in_dim`` of ``[K]``)."""
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    if op is None or op.prim is not lax.broadcast_in_dim_p or atom.ndim != 2 or atom.shape[1] != 1:
        return None
    (x,) = op.inputs
    return x if x.ndim == 1 and tuple(op.params["broadcast_dimensions"]) == (0,) else None


def unwrapped(ids: ir.Atom, n: int, made_by) -> tuple[ir.Atom, bool]:
    """(raw ids, True) when ``ids`` is JAX's ``where(i < 0, i + n, i)``; else (ids, False)."""
    op = made_by.get(ids.id) if isinstance(ids, ir.Value) else None
    if op is None or op.prim is not lax.select_n_p or len(op.inputs) != 3:
        return ids, False
    pred, keep, shifted = op.inputs
    lt = made_by.get(pred.id) if isinstance(pred, ir.Value) else None
    add = made_by.get(shifted.id) if isinstance(shifted, ir.Value) else None
    if lt is None or add is None or lt.prim is not lax.lt_p or add.prim is not lax.add_p:
        return ids, False
    if lt.inputs[0] is not keep or not _literal(lt.inputs[1], 0) or add.inputs[0] is not keep or not _literal(
            add.inputs[1], n):
        return ids, False
    return keep, True


def _narrowed(ids: ir.Atom, made_by) -> ir.Atom | None:
    """The 64-bit ids behind jnp's (and `jax.ops.segment_sum`'s) narrowing of them to int32 (x64 graphs), or None.
    The raised ops read those ids, the same value every gather and reduction of the graph reads, and narrow them
    as jnp does (`gather.narrow`)."""
    op = made_by.get(ids.id) if isinstance(ids, ir.Value) else None
    if op is None or op.prim is not lax.convert_element_type_p or np.dtype(ids.dtype) != np.int32:
        return None
    (x,) = op.inputs
    return x if np.issubdtype(x.dtype, np.signedinteger) and np.dtype(x.dtype).itemsize > 4 else None


def _unwrapped_index(ids: ir.Atom, n: int, made_by) -> tuple[ir.Atom, bool]:
    """`unwrapped`, also when jnp narrowed the wrapped 64-bit ids to int32 (wrap, then narrow: `gather.normalize`)."""
    wide = _narrowed(ids, made_by)
    if wide is not None:
        raw, wrap = unwrapped(wide, n, made_by)
        if wrap:
            return raw, True
    return unwrapped(ids, n, made_by)


def _literal(atom: ir.Atom, value) -> bool:
    # complex literals compare as complex numbers: float() of one raises
    return isinstance(atom, ir.Const) and np.ndim(atom.value) == 0 and np.asarray(atom.value).item() == value


def _expanded_literal(atom: ir.Atom, made_by, value) -> bool:
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    return op is not None and op.prim is lax.broadcast_in_dim_p and _literal(op.inputs[0], value)


def _gather(op: ir.Op, ctx: Context, made_by, b: Builder) -> bool:
    fill = op.params.get("fill_value")
    if facts.row_gather_axis(op) != 0 or (fill is not None and not np.isnan(fill)):
        return False
    x, column = op.inputs
    ids = _column_of(column, made_by)
    mode = _GATHER_MODES.get(str(op.params.get("mode")))
    if ids is None or mode is None or not isinstance(x, ir.Value):
        return False
    raw, wrap = _unwrapped_index(ids, x.shape[0], made_by)
    index = ctx.info(raw).index
    if index not in _RAISED_INDEX or ctx.info(raw).residency == Residency.UNKNOWN:
        return False
    if index in ENDPOINTS and not facts.endpoint_table(ctx.info(x)):
        return False
    (out,) = b.bind(gather_p, [x, raw], dict(index=index, mode=mode, wrap=wrap), outputs=op.outputs)
    b.ctx.report.add(Pass.CANONICALIZE, Reason.RAISED_GATHER, count=1, index=index.value)
    return True


def _segment(op: ir.Op, ctx: Context, made_by, b: Builder) -> bool:
    kind = _SCATTER_KIND.get(op.prim)
    if kind is None or not facts.is_row_scatter(op) or not isinstance(op.inputs[2], ir.Value):
        return False
    operand, column, updates = op.inputs
    ids = _column_of(column, made_by)
    if ids is None or not _expanded_literal(operand, made_by, _INIT[kind]):
        return False
    ids = _narrowed(ids, made_by) or ids
    index = ctx.info(ids).index
    if index not in _RAISED_INDEX or ctx.info(updates).residency == Residency.UNKNOWN:
        return False
    if updates.shape[0] != ids.shape[0]:
        return False
    b.bind(segment_p, [updates, ids], dict(kind=kind, num_segments=operand.shape[0], index=index,
                                          empty="identity"), outputs=op.outputs)
    b.ctx.report.add(Pass.CANONICALIZE, Reason.RAISED_SEGMENT, count=1, kind=kind, index=index.value)
    return True


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    b = Builder(program, ctx)
    for op in program.ops:
        if ctx.analysis.unknown(op.outputs[0]) if op.outputs else False:
            b.emit(op)
            continue
        if op.prim is lax.gather_p and _gather(op, ctx, made_by, b):
            continue
        if op.prim in _SCATTER_KIND and _segment(op, ctx, made_by, b):
            continue
        b.emit(op)
    # jraph's helpers convert their inputs again: merge the copies so the idioms read one value.
    program = cleanup.cse(b.finish(), ctx)
    return _composites(program, ctx)


# ---- composite idioms over the raised primitives ------------------------------------------------------------

def _only(v: ir.Atom, users, prim=None) -> ir.Op | None:
    us = users.get(v.id, []) if isinstance(v, ir.Value) else []
    if len(us) != 1 or us[0] is ir.OUTPUT or (prim is not None and us[0].prim is not prim):
        return None
    return us[0]


def _softmax(div: ir.Op, made_by) -> tuple[list[ir.Op], ir.Atom, ir.Atom, dict] | None:
    """The ops of ``e / segment_sum(e)[ids]`` with ``e = exp(s − segment_max(s)[ids])``, and (s, ids, params).

    Replacing the division is correct whatever else reads the intermediate values (they stay until unused)."""
    e, z = div.inputs
    g2 = made_by.get(z.id) if isinstance(z, ir.Value) else None
    ex = made_by.get(e.id) if isinstance(e, ir.Value) else None
    if g2 is None or ex is None or g2.prim is not gather_p or ex.prim is not lax.exp_p:
        return None
    total = made_by.get(g2.inputs[0].id) if isinstance(g2.inputs[0], ir.Value) else None
    sub = made_by.get(ex.inputs[0].id)
    if total is None or sub is None or total.prim is not segment_p or sub.prim is not lax.sub_p:
        return None
    s, g1_out = sub.inputs
    g1 = made_by.get(g1_out.id) if isinstance(g1_out, ir.Value) else None
    if g1 is None or g1.prim is not gather_p:
        return None
    mx = made_by.get(g1.inputs[0].id) if isinstance(g1.inputs[0], ir.Value) else None
    if mx is None or mx.prim is not segment_p or mx.params["kind"] != "max" or total.params["kind"] != "sum":
        return None
    ids = mx.inputs[1]
    same = (total.inputs[0] is e and mx.inputs[0] is s and total.inputs[1] is ids and g1.inputs[1] is ids
            and g2.inputs[1] is ids and g1.params == g2.params and g1.params["mode"] == "clip"
            and mx.params["num_segments"] == total.params["num_segments"])
    if not same:
        return None
    return [mx, g1, sub, ex, total, g2], s, ids, dict(num_segments=mx.params["num_segments"], index=mx.params["index"],
                             wrap=g1.params["wrap"])


def _mean(div: ir.Op, made_by) -> tuple[ir.Atom, ir.Atom, dict] | None:
    """``segment_sum(x) / max(segment_sum(ones_like(x)), 1)``: (x, ids, params)."""
    h, m = div.inputs
    total = made_by.get(h.id) if isinstance(h, ir.Value) else None
    mx = made_by.get(m.id) if isinstance(m, ir.Value) else None
    if total is None or mx is None or total.prim is not segment_p or mx.prim is not lax.max_p:
        return None
    count_v, one = mx.inputs
    count = made_by.get(count_v.id) if isinstance(count_v, ir.Value) else None
    if count is None or count.prim is not segment_p or not _literal(one, 1):
        return None
    x, ids = total.inputs
    ones = count.inputs[0]
    if (total.params["kind"], count.params["kind"]) != ("sum", "sum") or count.inputs[1] is not ids \
            or not _expanded_literal(ones, made_by, 1) or ones.shape != x.shape \
            or not np.issubdtype(np.dtype(x.dtype), np.inexact):
        return None
    return x, ids, dict(kind="mean", num_segments=total.params["num_segments"], index=total.params["index"],
                        empty="identity")


def _composites(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    b = Builder(program, ctx)
    for op in program.ops:
        if op.prim is lax.div_p and len(op.outputs) == 1:
            softmax = _softmax(op, made_by)
            if softmax is not None:
                _, s, ids, params = softmax
                b.bind(segment_softmax_p, [s, ids], params, outputs=op.outputs)
                ctx.report.add(Pass.CANONICALIZE, Reason.RAISED_SOFTMAX, index=params["index"].value)
                continue
            mean = _mean(op, made_by)
            if mean is not None and np.dtype(op.outputs[0].dtype) == np.dtype(mean[0].dtype):
                x, ids, params = mean
                b.bind(segment_p, [x, ids], params, outputs=op.outputs)
                ctx.report.add(Pass.CANONICALIZE, Reason.RAISED_MEAN)
                continue
        b.emit(op)
    return b.finish()

