"""``edge_op``: one fused gather → per-edge compute → reduce, as a JAX primitive described by an `EdgeSpec`.

``edge_op(src_ids, dst_ids, *operands, *layout, spec=...)`` computes, for every edge ``e``::

    rows_e = (x[src_e] for x in the src operands, x[dst_e] for dst operands, x[e] for edge operands, shared ones)
    y_e    = spec.fn(rows_e)                                   (`jgnn.ops.edge_fn`)

and reduces the ``y_e`` over ``spec.over``:

* ``Reduce.NONE``: one row per edge (``over=EDGE``, an SDDMM);
* ``SUM``/``MEAN``/``MAX``/``MIN``: into the rows of each edge's destination (``over=DST``) or source
  (``over=SRC``), as `jgnn.ops.segment` does (MEAN also returns the count per row; MAX/MIN with ``hits``
  also return, per edge, whether it attains its row's extremum: what their derivative reads);
* ``SUM`` over ``ALL``: one value summed over every edge (the cotangent of a shared operand);
* ``SOFTMAX``: ``fn`` gives ``(s, V)``; ``out_v = Σ_e softmax_v(s)_e · V_e`` (attention), also returning the
  per-row max ``m`` and normaliser ``l = Σ_e exp(s_e − m_v)``.

Gathers follow jnp indexing (negative ids wrapped when ``spec.wrap``, then clamped). A forward reduction drops
edges whose raw ``over`` id is out of range (``spec.raw_over``), as ``jax.ops.segment_sum`` does; the
reductions that transposition makes reduce by the rows the gathers read (clamped), as a gather's transpose does.

The semantics is `reference`, term by term the program the op replaces; every lowering (`jgnn.ops.lowering`)
agrees with it. Derivatives are rules on the primitive: the JVP of every reduction is a ``SUM`` edge op (for
max/min, the tangent functions of `jgnn.ops.edge_fn` with per-row statistics as operands; for softmax, the
linear primitive `jgnn.ops.attention_tangent`, whose transpose forms each edge's score cotangent before any
sum), and the transpose of a ``SUM``/``NONE`` op is one edge op per operand group, reducing over that group's
rows. So
``grad``, ``jvp``, ``linearize``, ``vmap`` and ``checkpoint`` all work, no edge-sized value is ever kept for the
backward pass, and one definition of each reduction serves the XLA and Pallas backends alike.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import weakref
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts
from jgnn.facts import Info
from jgnn.ops import edge_fn as ef
from jgnn.ops.gather import narrow, normalize
from jgnn.ops.segment import accumulation_dtype, count_dtype, counts, identity, materialize, mean_dtype
from jgnn.roles import Group, Movement, Residency

# Names a training step's recomputation policy sees (`jgnn.remat`): per-row statistics of a reduction (softmax
# max and normaliser, output, counts) and the per-edge masks of the edges attaining a max/min.
STATS_NAME = "jgnn_stats"
EDGE_MASK_NAME = "jgnn_edge_mask"
# Whether each Pallas backend runs its kernels in the Pallas interpreter. Read at lowering time, so the GPU test
# tier (tests/conftest.py, JGNN_TEST_INTERPRET_ON_GPU=1) can run every "pallas_interpret" test on the real kernels.
INTERPRET = {"pallas": False, "pallas_interpret": True}


class Reduce(enum.StrEnum):
    NONE = "none"
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    SOFTMAX = "softmax"


ROWWISE = (Group.SRC, Group.DST, Group.EDGE)


@dataclasses.dataclass(frozen=True, eq=False)
class EdgeSpec:
    """Everything an edge op is, besides its operands (see module docstring).

    ``num_segments``: rows of the reduced outputs. ``num_edges``: E. ``empty``: max/min of a row without edges,
    ``"zero"`` or ``"identity"``. ``backend``: ``xla``, ``pallas`` or ``pallas_interpret`` (`jgnn.ops.lowering`
    decides how, per op). ``layout``: how many trailing operands are `GraphLayout` leaves.
    ``name`` says what the op came from, for reports.
    """

    fn: ef.EdgeFn
    groups: tuple[Group, ...]
    reduce: Reduce
    over: Group
    num_segments: int
    num_edges: int
    empty: str = "zero"
    wrap: bool = True
    raw_over: bool = True
    backend: str = "xla"
    hits: bool = False
    layout: int = 0
    layout_tree: object = None
    name: str = "edge_op"

    def replace(self, **changes) -> EdgeSpec:
        return dataclasses.replace(self, **changes)


edge_op_p = jcore.Primitive("jgnn_edge_op")
edge_op_p.multiple_results = True


def _bind(*args, **params):
    return edge_op_p.bind(*compat.match_vma(args), **params)


def edge_op(src_ids, dst_ids, operands: Sequence, layout: Sequence = (), *, spec: EdgeSpec) -> list:
    return _bind(src_ids, dst_ids, *operands, *layout, spec=spec)


def split_args(args, spec: EdgeSpec):
    """(src ids, dst ids, operands, layout leaves) of an edge op's flat arguments."""
    k = len(spec.groups)
    return args[0], args[1], list(args[2:2 + k]), list(args[2 + k:])


# ---- shapes -----------------------------------------------------------------------------------------------

def _trailing(aval, group: Group):
    return aval if group == Group.SHARED else jax.ShapeDtypeStruct(tuple(aval.shape[1:]), aval.dtype)


# Per spec, by operand avals: tracing ``spec.fn`` for its output shapes is a large part of a compile's trace time,
# and planning, reporting and lowering ask for the same op's shapes (a GAT training step: 23 asks, 11 distinct).
_MESSAGE_AVALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def message_avals(spec: EdgeSpec, operand_avals) -> list[jax.ShapeDtypeStruct]:
    """``[E, ...]`` per output of ``spec.fn`` (the shapes ``over=ALL`` outputs have, without a row axis)."""
    key = tuple((tuple(a.shape), np.dtype(a.dtype), getattr(a, "weak_type", False), getattr(a, "vma", None))
                for a in operand_avals)
    known = _MESSAGE_AVALS.setdefault(spec, {})
    if key not in known:
        trailing = [_trailing(a, g) for a, g in zip(operand_avals, spec.groups, strict=True)]
        whole = [g == Group.SHARED for g in spec.groups]
        known[key] = ef.out_avals(spec.fn, trailing, whole, spec.num_edges)
    return list(known[key])


def _abstract_eval(*args, spec: EdgeSpec):
    _, _, operands, _ = split_args(args, spec)
    msgs = message_avals(spec, operands)
    out = functools.partial(compat.shaped_like, avals=args)
    n = spec.num_segments
    if spec.reduce == Reduce.NONE:
        return [out(m.shape, m.dtype) for m in msgs]
    if spec.over == Group.ALL:
        return [out(m.shape, m.dtype) for m in msgs]
    if spec.reduce == Reduce.SOFTMAX:
        s, v = msgs
        dtype = jnp.result_type(s.dtype, v.dtype)
        stat = accumulation_dtype(s.dtype)
        return [out((n,) + v.shape[1:], dtype), out((n,) + s.shape[1:], stat), out((n,) + s.shape[1:], stat)]
    rows = [out((n,) + m.shape[1:], mean_dtype(m.dtype) if spec.reduce == Reduce.MEAN else m.dtype)
            for m in msgs]
    if spec.reduce == Reduce.MEAN:
        rows.append(out((n,), count_dtype(msgs[0].dtype)))
    if spec.hits:
        rows += [out(m.shape, jnp.bool_) for m in msgs]
    return rows


# ---- the reference: the semantics of every edge op ------------------------------------------------------------

def endpoint_rows(spec: EdgeSpec, src_ids, dst_ids, operands) -> list:
    """Each operand's rows per edge: src/dst operands gathered with jnp indexing semantics."""
    rows = []
    for x, g in zip(operands, spec.groups, strict=True):
        if g in (Group.SRC, Group.DST):
            ids = src_ids if g == Group.SRC else dst_ids
            rows.append(jnp.take(x, normalize(ids, x.shape[0], wrap=spec.wrap), axis=0, mode="clip"))
        else:
            rows.append(x)
    return rows


def reduce_rows(spec: EdgeSpec, src_ids, dst_ids):
    """The output row of each edge; ``num_segments`` (out of range, dropped) for edges a forward reduction
    drops."""
    ids = src_ids if spec.over == Group.SRC else dst_ids
    n = spec.num_segments
    if spec.raw_over:
        ids = narrow(ids)  # as jax.ops.segment_sum narrows 64-bit ids before it drops out-of-range ones
        return jnp.where((ids >= 0) & (ids < n), ids, n)
    return normalize(ids, n, wrap=spec.wrap)


def _segment_sum(y, rows, n):
    acc = accumulation_dtype(y.dtype)
    return jax.ops.segment_sum(y.astype(acc), rows, n).astype(y.dtype)


def _trail(x, ndim):
    return jnp.reshape(x, x.shape + (1,) * (ndim - x.ndim))


def reduce_messages(spec: EdgeSpec, ys: list, rows, n: int) -> list:
    """Reduce per-edge messages ``ys`` into ``n`` rows by ``rows`` (``n`` means dropped)."""
    if spec.reduce == Reduce.SUM:
        return [_segment_sum(y, rows, n) for y in ys]
    if spec.reduce == Reduce.MEAN:
        count = counts(rows, n, count_dtype(ys[0].dtype))
        return [(_segment_sum(y.astype(accumulation_dtype(y.dtype)), rows, n)
                 / _trail(jnp.maximum(count, 1), y.ndim)).astype(mean_dtype(y.dtype)) for y in ys] + [count]
    segment = jax.ops.segment_max if spec.reduce == Reduce.MAX else jax.ops.segment_min
    outs, hits = [], []
    for y in ys:
        if spec.hits:
            y = materialize(y)  # one buffer reduced and compared: ties exact to the bit
        best = segment(y, rows, n + 1)
        hits.append((y == jnp.take(best, rows, axis=0)) & _trail(rows < n, y.ndim))
        out = best[:n]
        if spec.empty == "zero":
            out = jnp.where(_trail(counts(rows, n, jnp.int32), y.ndim) > 0, out, jnp.zeros((), y.dtype))
        outs.append(out)
    return outs + (hits if spec.hits else [])


def softmax_reference(s, v, rows, n: int, *, gather_rows):
    """jraph's edge softmax and the weighted sum after it: (out, m, l).

    Each row divides once, ``out = Σ e·V / Σ e``, not each edge by its row's ``Σ e`` as jraph does: the same value
    up to rounding, with one edge-sized gather and division fewer. ``e`` and ``Σ e`` come from the same ``exp``, so
    whatever XLA fuses into ``s − m`` scales numerator and denominator alike."""
    m = jax.ops.segment_max(s, rows, n)
    m_rows = jnp.take(m, gather_rows, axis=0, mode="clip")
    e = ef.shifted_exp(s, m_rows)
    stat = accumulation_dtype(s.dtype)
    out_dtype = jnp.result_type(s.dtype, v.dtype)
    acc = accumulation_dtype(out_dtype)
    l = jax.ops.segment_sum(e.astype(stat), rows, n)
    total = jax.ops.segment_sum(_trail(e, v.ndim).astype(acc) * v.astype(acc), rows, n)
    return [divide_rows(total, l).astype(out_dtype), m.astype(stat), saved_normaliser(s, m_rows, rows, n)]


def divide_rows(total, l):
    """``total / l`` per row, in ``total``'s dtype; a row whose ``l`` is 0 (no edges, so ``total`` is 0) gives 0."""
    safe_l = jnp.where(l == 0, jnp.ones((), l.dtype), l)
    return total / _trail(safe_l, total.ndim).astype(total.dtype)


def saved_normaliser(s, m_rows, rows, n: int):
    """Per row, the normaliser saved for the derivative rules: each edge counted as the rules recompute its weight
    (`edge_fn.softmax_weight`: an edge that snaps to its row's max counts exactly 1), not as the forward's
    ``e = exp(s − m)``. XLA fuses the score's last product into ``s − m`` (a fused multiply-add), so the max
    edge's ``e`` is ``exp(δ)`` of the product's rounding error: 5.6e-4 for scores near 1e9 in float32, which made a
    recomputed weight 1/5.6e-4 = 1,787 instead of 1 (fuzz class c). Its own segment sum, so that a forward pass
    without derivatives never computes it."""
    stat = accumulation_dtype(s.dtype)
    # in the statistics' dtype, as the rules recompute it: a bfloat16 ``e`` made the saved weights of a row sum to
    # 1 ± 4e-3, so tied messages' score cotangents ``α (p − R)`` were 1e-3 instead of 0 (fuzz, class g)
    exact = jnp.exp(s.astype(stat) - m_rows.astype(stat))
    counted = jnp.where(ef.snaps_to_max(s, m_rows), jnp.ones((), stat), exact)
    return jax.ops.segment_sum(counted, rows, n)


def reference(*args, spec: EdgeSpec) -> list:
    """The semantics of an edge op: all edges at once, with XLA's gather and segment ops."""
    src_ids, dst_ids, operands, _ = split_args(args, spec)
    ys = spec.fn.apply(endpoint_rows(spec, src_ids, dst_ids, operands))
    if spec.reduce == Reduce.NONE or spec.over == Group.ALL:
        return list(ys)
    n = spec.num_segments
    rows = reduce_rows(spec, src_ids, dst_ids)
    if spec.reduce == Reduce.SOFTMAX:
        ids = src_ids if spec.over == Group.SRC else dst_ids
        return softmax_reference(*ys, rows, n, gather_rows=normalize(ids, n, wrap=spec.wrap))
    return reduce_messages(spec, list(ys), rows, n)


# ---- derivatives --------------------------------------------------------------------------------------------

def _instantiate(t, aval):
    return jnp.zeros(aval.shape, aval.dtype) if type(t) is ad.Zero else t


def derived(spec: EdgeSpec, fn: ef.EdgeFn, extra: Sequence[Group], **changes) -> EdgeSpec:
    return spec.replace(fn=fn, groups=spec.groups + tuple(extra), hits=False, **changes)


def _segment_hits(spec: EdgeSpec, hit, src_ids, dst_ids, dtype):
    """How many edges of each row attain its extremum (dropped edges never do), in ``dtype``: the tie share
    ``1 / count`` is exact to the values' precision, as JAX's scatter-max rule computes it (float64 for float64)."""
    rows = reduce_rows(spec, src_ids, dst_ids)
    return jax.ops.segment_sum(hit.astype(dtype), rows, spec.num_segments)


def pruned(spec: EdgeSpec, operands) -> tuple[EdgeSpec, list]:
    """A derived edge op without the operands its edge function never reads: (its spec, the operands it keeps).
    ``operands`` may be arrays or shape/dtype stand-ins."""
    shapes = tuple(_trailing(jax.ShapeDtypeStruct(np.shape(x), x.dtype) if not hasattr(x, "aval") else
                             x.aval, g) for x, g in zip(operands, spec.groups, strict=True))
    whole = tuple(g == Group.SHARED for g in spec.groups)
    used = ef.reads(spec.fn, shapes, whole, spec.num_edges)
    rowwise = [k for k, w in enumerate(whole) if not w]
    if rowwise and not any(used[k] for k in rowwise):
        used[rowwise[0]] = True  # one operand with rows tells the edge function how many edges a block has
    if all(used) or not any(used):
        return spec, list(operands)
    fn = ef.Pruned(spec.fn, tuple(used), shapes, whole)
    kept = [x for x, u in zip(operands, used, strict=True) if u]
    groups = tuple(g for g, u in zip(spec.groups, used, strict=True) if u)
    return spec.replace(fn=fn, groups=groups), kept


def bind_pruned(spec: EdgeSpec, src_ids, dst_ids, operands, layout) -> list:
    """Bind a derived edge op, dropping the operands its edge function never reads."""
    spec, kept = pruned(spec, operands)
    return _bind(src_ids, dst_ids, *kept, *layout, spec=spec)


def row_group(spec: EdgeSpec) -> Group:
    """The group that reads a per-row statistic of the output back at each edge."""
    return {Group.DST: Group.DST, Group.SRC: Group.SRC, Group.ALL: Group.SHARED}[spec.over]


def _jvp(primals, tangents, *, spec: EdgeSpec):
    src_ids, dst_ids, operands, layout = split_args(primals, spec)
    _, _, d_operands, _ = split_args(tangents, spec)
    outs = _bind(*primals, spec=spec)
    slots = tuple(k for k, t in enumerate(d_operands) if type(t) is not ad.Zero)
    zeros = [compat.zero_tangent(o) for o in outs]
    if not slots:
        return outs, zeros
    tans = [d_operands[k] for k in slots]
    moving = tuple(spec.groups[k] for k in slots)

    def bind(fn, extra_groups, extra, **changes):
        new = derived(spec, fn, moving + tuple(extra_groups), **changes)
        return bind_pruned(new, src_ids, dst_ids, [*operands, *tans, *extra], layout)

    kind = spec.reduce
    if kind in (Reduce.NONE, Reduce.SUM):
        return outs, bind(ef.Jvp(spec.fn, slots), (), ())
    row = row_group(spec)  # the reductions' tangents read per-row statistics back at each edge
    if kind == Reduce.MEAN:
        *means, count = outs
        inv = 1.0 / jnp.maximum(checkpoint_name(count, STATS_NAME), 1)
        t = bind(ef.Scaled(ef.Jvp(spec.fn, slots)), (row,), (inv,), reduce=Reduce.SUM)
        return outs, list(t) + [zeros[-1]]
    if kind in (Reduce.MAX, Reduce.MIN):
        with_hits = _bind(*primals, spec=spec.replace(hits=True))
        k = len(with_hits) // 2
        best, hits = with_hits[:k], [checkpoint_name(h, EDGE_MASK_NAME) for h in with_hits[k:]]
        tangents_out = []
        for i, (b, h) in enumerate(zip(best, hits, strict=True)):
            ties = _segment_hits(spec, h, src_ids, dst_ids, count_dtype(b.dtype))
            denom = checkpoint_name(ties + _trail(b == identity(kind.value, b.dtype), ties.ndim).astype(ties.dtype),
                                    STATS_NAME)
            fn = ef.ExtremumTangent(ef.Pick(spec.fn, (i,)), slots)
            tangents_out.append(bind(fn, (Group.EDGE, row), (h, denom), reduce=Reduce.SUM)[0])
        if spec.hits:  # the masks are piecewise constant: no tangent
            return with_hits, tangents_out + [compat.zero_tangent(h) for h in with_hits[k:]]
        return best, tangents_out
    from jgnn.ops.attention_tangent import attention_tangent  # it builds on this module: imported late

    out, m, l = outs  # SOFTMAX: m is a shift the weights do not depend on, so it is held fixed
    m_saved, l_saved = (checkpoint_name(x, STATS_NAME) for x in (jax.lax.stop_gradient(m), l))
    d_out = attention_tangent(src_ids, dst_ids, operands, tans, m_saved, l_saved, layout, spec=spec, slots=slots)
    # On XLA, where a softmax backward runs unless every one of its ops is a kernel (`attention_tangent._alike`):
    # only forward-over-reverse reads ``dl``, and there it cancels against the backward's recomputed score tangent,
    # which a Pallas kernel rounds differently (a row with one edge, scores near 1e19: a Hessian-vector product 1e31
    # off, campaign 20261700). A backward all on kernels still rounds apart from it; no case of that is known.
    d_l = bind(ef.WeightTangent(ef.Pick(spec.fn, (0,)), slots, normalized=False), (row,), (m_saved,),
               reduce=Reduce.SUM, backend="xla")[0]
    return outs, [d_out, zeros[1], d_l.astype(l.dtype)]


def _transpose(cts, *args, spec: EdgeSpec):
    if spec.reduce not in (Reduce.NONE, Reduce.SUM):
        raise NotImplementedError(f"an edge op reducing by {spec.reduce.value} is not linear")
    src_ids, dst_ids, operands, layout = split_args(args, spec)
    assert not ad.is_undefined_primal(src_ids) and not ad.is_undefined_primal(dst_ids)
    undefined = tuple(k for k, x in enumerate(operands) if ad.is_undefined_primal(x))
    if all(type(ct) is ad.Zero for ct in cts):  # e.g. a softmax's tangent shift, whose transpose is zero
        return [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None for x in args]
    known = [k for k in range(len(operands)) if k not in undefined]
    out_avals = _abstract_eval(*[a.aval if ad.is_undefined_primal(a) else a for a in args], spec=spec)
    cts = [_instantiate(ct, a) for ct, a in zip(cts, out_avals, strict=True)]
    ct_group = {Group.DST: Group.DST, Group.SRC: Group.SRC, Group.EDGE: Group.EDGE,
                Group.ALL: Group.SHARED}[spec.over]
    shapes = tuple(_trailing(x.aval if ad.is_undefined_primal(x) else jax.ShapeDtypeStruct(x.shape, x.dtype), g)
                   for x, g in zip(operands, spec.groups, strict=True))
    whole = tuple(g == Group.SHARED for g in spec.groups) + (ct_group == Group.SHARED,) * len(cts)
    base = ef.Vjp(spec.fn, undefined, shapes, whole, len(cts))
    extra, extra_groups = list(cts), [ct_group] * len(cts)
    if spec.raw_over and spec.reduce == Reduce.SUM and spec.over in (Group.DST, Group.SRC):
        # Edges the forward reduction dropped (ids out of range) got a zero cotangent, not the clamped row's.
        ids = src_ids if spec.over == Group.SRC else dst_ids
        keep = (ids >= 0) & (ids < spec.num_segments)
        positions = tuple(range(len(known), len(known) + len(cts)))
        base = ef.Zeroed(base, positions)
        extra.append(keep)
        extra_groups.append(Group.EDGE)
    result: list = [None] * len(args)
    for group in dict.fromkeys(spec.groups[k] for k in undefined):
        mine = tuple(i for i, k in enumerate(undefined) if spec.groups[k] == group)
        fn = ef.Pick(base, mine)
        rows = {Group.SRC: Group.SRC, Group.DST: Group.DST, Group.EDGE: Group.EDGE, Group.SHARED: Group.ALL}[group]
        n = operands[undefined[mine[0]]].aval.shape[0] if rows in (Group.SRC, Group.DST) else spec.num_segments
        new = spec.replace(fn=fn, groups=tuple(spec.groups[k] for k in known) + tuple(extra_groups),
                           reduce=Reduce.NONE if rows == Group.EDGE else Reduce.SUM, over=rows, num_segments=n,
                           raw_over=False)
        outs = bind_pruned(new, src_ids, dst_ids, [*[operands[k] for k in known], *extra], layout)
        for i, o in zip(mine, outs, strict=True):
            k = undefined[i]
            result[2 + k] = o.astype(operands[k].aval.dtype)
    return result


def _batch(args, dims, *, spec: EdgeSpec):
    src_ids, dst_ids, operands, layout = split_args(args, spec)
    d_src, d_dst, d_ops, d_layout = split_args(dims, spec)
    mapped = lambda d: d is not compat.not_mapped
    size = next(np.shape(x)[d] for x, d in zip(args, dims, strict=True) if mapped(d))
    if mapped(d_src) or mapped(d_dst) or any(map(mapped, d_layout)):
        # A batch of different graphs: run the reference under vmap (no shared structure to keep).
        moved = [batching.bdim_at_front(x, d, size) if mapped(d) else x for x, d in zip(args, dims, strict=True)]
        in_axes = [0 if mapped(d) else None for d in dims]
        outs = jax.vmap(functools.partial(reference, spec=spec), in_axes=in_axes)(*moved)
        return outs, [0] * len(outs)  # (not _abstract_eval of the batched args: their shapes carry the batch)
    axes = tuple((1 if g in ROWWISE else 0) if mapped(d) else None for g, d in zip(spec.groups, d_ops, strict=True))
    moved = [jnp.moveaxis(x, d, a) if a is not None else x for x, d, a in zip(operands, d_ops, axes, strict=True)]
    whole_out = spec.over == Group.ALL and spec.reduce != Reduce.NONE
    fn = ef.Batched(spec.fn, axes, 0 if whole_out else 1)
    new = spec.replace(fn=fn)
    outs = _bind(src_ids, dst_ids, *moved, *layout, spec=new)
    out_dims = [0 if whole_out else 1 for _ in outs]
    if spec.reduce == Reduce.MEAN:
        out_dims[-1] = compat.not_mapped
    return outs, out_dims


# ---- residency facts ------------------------------------------------------------------------------------------

def residency(op, infos, ctx):
    spec = op.params["spec"]
    ids = infos[1] if spec.over != Group.SRC else infos[0]
    where = {Group.DST: Residency.NODE, Group.SRC: Residency.NODE, Group.EDGE: Residency.EDGE,
             Group.ALL: Residency.SHARED}[spec.over]
    if spec.reduce == Reduce.NONE:
        where = Residency.EDGE
    edges = ids.edges if where == Residency.EDGE else None
    graph = ids.graph if facts.graph_resident(ids) else 0
    return [Info(where, graph=graph, edges=edges)] * len(op.outputs), Movement.FUSED


def _lowering(ctx, *args, spec: EdgeSpec):
    from jgnn.ops import lowering

    return compat.local_lowering(lowering.run, multiple_results=True)(ctx, *args, spec=spec)


def _impl(*args, spec: EdgeSpec):
    return compat.apply_primitive(edge_op_p, *args, spec=spec)


edge_op_p.def_abstract_eval(_abstract_eval)
edge_op_p.def_impl(_impl)
mlir.register_lowering(edge_op_p, _lowering)
ad.primitive_jvps[edge_op_p] = _jvp
ad.primitive_transposes[edge_op_p] = _transpose
batching.primitive_batchers[edge_op_p] = _batch
facts.register(edge_op_p, facts.Facts(residency=residency))
