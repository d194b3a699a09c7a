"""``attention_tangent``: the tangent of a softmax edge op's output, one linear primitive with its own transpose.

The softmax edge op (`jgnn.ops.edge_op`, ``Reduce.SOFTMAX``) computes ``out_v = Σ_e α_e V_e`` with ``α`` the
softmax of the scores ``s`` over each row's edges. Its tangent is::

    d_out_v = Σ_e (α_e (ds_e − c_v) − α_e T_v) V_e + α_e dV_e,      T_v = Σ_e α_e (ds_e − c_v)

with ``c_v`` the row max's tangent (`jgnn.ops.tangent_shift`). Forward mode computes it as four edge ops: the
tied edges' tangent sum and count (SUM) and their largest tangent (per edge, then a segment max on XLA, as the
transpose takes its pivot), both `edge_fn.MaxTangent`, from which `tangent_shift` takes ``c_v``; then ``T``
and the tangent itself (SUM: `WeightTangent`, `SoftmaxTangent`).
Transposed one op at a time, as JAX would transpose them, the cotangent of each score splits in two:
``α_e g_v·V_e`` from the last op, and ``−α_e Σ α g_v·V`` through ``T``. Each half is summed over a row by its own
op, and the two sums are added only afterwards. For an operand read at the row's own node, both sums have size
``|g| |V|`` and cancel, leaving an error of ``ε |g| |V|``. The fuzzer found 1e31 where jraph gives 1e23 (float32
scores near 1e19 with tied duplicate edges).

jraph's backward forms each edge's score cotangent ``α_e (g_v·V_e − R_v)`` first, with ``R_v = Σ_e α_e
g_v·V_e``, and passes the row sum of those cotangents (zero in exact arithmetic) back through its
``segment_max`` to the edges attaining the max. This primitive's transpose does the same
(`edge_fn.SoftmaxRowDot`, `edge_fn.SoftmaxVjp`):

0. the pivot ``P_v``: the largest ``p_e = g_v·V_e`` among the edges attaining the row's max (a per-edge op, then
   a segment max; 0 where it is not finite). Centring every ``p_e`` on it changes nothing in exact arithmetic, but
   duplicate edges tied at the max, with equal ``p``, then get an exact 0 score cotangent: ``p_e − R_v`` alone
   leaves an ulp of ``|p|`` there, which the pullback multiplies by the features (float32 features near 1e19:
   gradients 1e25 where the reference's are 1e20; fuzz class g);
1. ``R_v = Σ_e α_e (p_e − P_v)``, in one edge op over the rows;
2. ``C_v = Σ_e α_e (p_e − P_v − R_v)`` and the ties ``k_v``, in another: the reverse of the shift ``c``;
3. per operand group, the base function's pullback of ``(α_e (p_e − P_v − R_v) − [e attains the max] C_v / k_v,
   α_e g_v)``, summed over the group's rows.

So a GAT layer's backward is five edge ops. Batching runs the four forward-mode ops under ``vmap``, and so does
the JVP (second order): those ops have their own rules.
"""

from __future__ import annotations

import functools

import jax
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts
from jgnn.ops import edge_fn as ef
from jgnn.ops import edge_op as eo
from jgnn.ops.segment import accumulation_dtype
from jgnn.ops.tangent_shift import tangent_shift
from jgnn.report import Reason
from jgnn.roles import Group

attention_tangent_p = jcore.Primitive("jgnn_attention_tangent")


def attention_tangent(src_ids, dst_ids, operands, tangents, m, l, layout=(), *, spec: eo.EdgeSpec,
                      slots: tuple[int, ...]):
    """``d_out`` of the softmax edge op ``spec`` for the tangents of its operands at ``slots``, given the row
    statistics ``m`` (held fixed) and ``l`` that the forward op returned."""
    return attention_tangent_p.bind(*compat.match_vma((src_ids, dst_ids, *operands, *tangents, m, l, *layout)),
                                    spec=spec, slots=slots)


def _split(args, spec: eo.EdgeSpec, slots):
    k, t = len(spec.groups), len(slots)
    operands, rest = list(args[2:2 + k]), list(args[2 + k:])
    tangents, (m, l), layout = rest[:t], rest[t:t + 2], rest[t + 2:]
    return args[0], args[1], operands, tangents, m, l, layout


def _forward_mode(*args, spec: eo.EdgeSpec, slots):
    """The tangent as four edge ops (see module docstring): what every rule but the transpose runs."""
    src_ids, dst_ids, operands, tangents, m, l, layout = _split(args, spec, slots)
    row = eo.row_group(spec)
    moving = tuple(spec.groups[k] for k in slots)

    def bind(fn, extra_groups, extra):
        new = eo.derived(spec, fn, moving + tuple(extra_groups), reduce=eo.Reduce.SUM)
        return eo.bind_pruned(new, src_ids, dst_ids, [*operands, *tangents, *extra], layout)

    scores = ef.Pick(spec.fn, (0,))  # the scores, without the values
    hit_sum, hit_count = bind(ef.MaxTangent(scores, slots), (row,), (m,))
    # The ties' largest tangent: a per-edge op (the per-head kernels take no MAX), then a segment max on XLA,
    # as the transpose takes its pivot.
    tops = eo.derived(spec, ef.MaxTangent(scores, slots, top=True), moving + (row,), over=Group.EDGE,
                      reduce=eo.Reduce.NONE, raw_over=False)
    (top,) = eo.bind_pruned(tops, src_ids, dst_ids, [*operands, *tangents, m], layout)
    top = jax.ops.segment_max(top, eo.reduce_rows(spec, src_ids, dst_ids), spec.num_segments)
    shift = tangent_shift(hit_sum, hit_count, top)
    total = bind(ef.WeightTangent(scores, slots, normalized=True), (row,) * 3, (m, l, shift))[0]
    return bind(ef.SoftmaxTangent(spec.fn, slots), (row,) * 4, (m, l, total, shift))[0]


def _abstract_eval(*args, spec: eo.EdgeSpec, slots):
    _, _, operands, _, _, _, _ = _split(args, spec, slots)
    _, v = eo.message_avals(spec, operands)
    return compat.shaped_like((spec.num_segments,) + tuple(v.shape[1:]), v.dtype, args)


def _jvp(primals, tangents, *, spec: eo.EdgeSpec, slots):
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(functools.partial(_forward_mode, spec=spec, slots=slots), tuple(primals), tuple(tangents))


def _transpose(ct, *args, spec: eo.EdgeSpec, slots):
    src_ids, dst_ids, operands, tangents, m, l, layout = _split(args, spec, slots)
    assert not any(ad.is_undefined_primal(x) for x in (src_ids, dst_ids, *operands, m, l, *layout))
    undefined = [i for i, t in enumerate(tangents) if ad.is_undefined_primal(t)]
    result: list = [None] * len(args)
    if type(ct) is ad.Zero:
        for i in undefined:
            result[2 + len(operands) + i] = ad.Zero(tangents[i].aval)
        return result
    keep = []
    if _masked(spec):
        ids = src_ids if spec.over == Group.SRC else dst_ids
        keep = [(ids >= 0) & (ids < spec.num_segments)]
    rows = {i: tangents[i].aval.shape[0] if spec.groups[slots[i]] in (Group.SRC, Group.DST) else 0
            for i in undefined}
    planned, owners = _plan(spec, slots, undefined, rows, m, l, ct)
    backend = spec.backend if spec.backend == "xla" or _alike(_kernels(planned, operands, keep)) else "xla"

    def bind(new, extra):
        return eo.bind_pruned(new.replace(backend=backend), src_ids, dst_ids, [*operands, *extra, *keep], layout)

    (top,) = bind(planned[0][0], (m, l, ct))
    top = jax.ops.segment_max(top, eo.reduce_rows(spec, src_ids, dst_ids), spec.num_segments)
    pivot = jax.numpy.where(jax.numpy.isfinite(top), top, jax.numpy.zeros((), top.dtype))
    (r,) = bind(planned[1][0], (m, l, ct, pivot))
    c, k = bind(planned[2][0], (m, l, ct, pivot, r))
    extra = (m, l, ct, pivot, r, c, k)
    for (new, _), mine in zip(planned[3:], owners, strict=True):
        outs = bind(new, extra)
        for i, o in zip(mine, outs, strict=True):
            result[2 + len(operands) + i] = o.astype(tangents[i].aval.dtype)
    return result


def _masked(spec: eo.EdgeSpec) -> bool:
    """Whether the forward dropped edges by their row id: the backward then takes a per-edge keep mask."""
    return spec.raw_over and spec.over in (Group.DST, Group.SRC)


def _plan(spec: eo.EdgeSpec, slots, undefined, rows: dict, m, l, ct):
    """The backward's edge ops, each with the row statistics it reads after the forward's operands: the pivot
    ``P``, the row sums ``R``, then ``C`` and ``k``, then one pullback per operand group; and the tangent indices
    each pullback gives. ``rows``: the row count of each tangent; ``m``, ``l``, ``ct`` may be arrays or stand-ins."""
    row, masked = eo.row_group(spec), _masked(spec)
    # Every sum runs over the rows the edges' ids gather, dropped edges included (with zero g), as the
    # reference's gathers transpose.
    groups = lambda extra: (row,) * len(extra) + (Group.EDGE,) * masked  # noqa: E731

    def sums_spec(extra, **kind):
        fn = ef.SoftmaxRowDot(spec.fn, masked=masked, **kind)
        return eo.derived(spec, fn, groups(extra), reduce=eo.Reduce.SUM, raw_over=False)

    stats = jax.ShapeDtypeStruct(m.shape, m.dtype)  # stand-ins for P, R, C and k: a row statistic's shape
    tops, row_sums, centred = (m, l, ct), (m, l, ct, stats), (m, l, ct, stats, stats)
    pulled = (m, l, ct, stats, stats, stats, stats)
    # The ties' largest p: a per-edge op (the per-head kernels take no MAX), then a segment max on XLA.
    tops_spec = eo.derived(spec, ef.SoftmaxRowDot(spec.fn, masked=masked, top=True), groups(tops), over=Group.EDGE,
                           reduce=eo.Reduce.NONE, raw_over=False)
    planned = [(tops_spec, tops), (sums_spec(row_sums), row_sums), (sums_spec(centred, centred=True), centred)]
    base = ef.SoftmaxVjp(spec.fn, slots, masked)
    owners = []
    for group in dict.fromkeys(spec.groups[slots[i]] for i in undefined):
        mine = [i for i in undefined if spec.groups[slots[i]] == group]
        over = {Group.SRC: Group.SRC, Group.DST: Group.DST, Group.EDGE: Group.EDGE, Group.SHARED: Group.ALL}[group]
        n = rows[mine[0]] if over in (Group.SRC, Group.DST) else spec.num_segments
        planned.append((eo.derived(spec, ef.Pick(base, tuple(mine)), groups(pulled), over=over, num_segments=n,
                                   reduce=eo.Reduce.NONE if over == Group.EDGE else eo.Reduce.SUM, raw_over=False),
                        pulled))
        owners.append(mine)
    return planned, owners


def _kernels(planned, operands, keep) -> list[bool]:
    """Whether each planned op would run as a Pallas kernel on its backend."""
    from jgnn.ops import lowering

    kernels = []
    for new, extra in planned:
        pruned, kept = eo.pruned(new, [*operands, *extra, *keep])
        avals = [jax.ShapeDtypeStruct(jax.numpy.shape(x), x.dtype) for x in kept]
        kernels.append(lowering.decide(pruned, avals).impl == "kernel")
    return kernels


def _alike(kernels: list[bool]) -> bool:
    """Every op of one softmax backward runs on one lowering: its own, unless some of its ops would run as Pallas
    kernels and others on XLA. Each recomputes the values ``V_e``, and the score cotangent ``α_e (g·V_e − R_v)``
    cancels one op's ``V_e`` against another's ``R_v``: a kernel tile and an XLA fusion round them differently, and
    at large magnitudes what is left is far from 0 (fuzz campaign 20261128: ``jraph.GAT`` at 1e19 gave gradients
    1e11 times too large). Then all of them run on XLA."""
    return len(set(kernels)) <= 1


def backward_record(spec: eo.EdgeSpec, operand_avals, varying=None) -> dict:
    """How the backward of the softmax op ``spec`` runs, as parameters of its `explain` record: ``backward``
    (``kernel`` or ``xla``), ``backward_code`` (a `Reason`), ``backward_ops`` and ``backward_kernel_ops`` (how
    many of them a kernel could run), with the float operands that ``varying`` marks differentiated (None: all
    of them; what ``grad`` of a layer in its parameters and features differentiates)."""
    varying = varying or (True,) * len(operand_avals)
    slots = tuple(k for k, (a, v) in enumerate(zip(operand_avals, varying, strict=True))
                  if v and jax.numpy.issubdtype(a.dtype, jax.numpy.inexact))
    if not slots:  # nothing to differentiate: no backward ops
        return {"backward": "xla", "backward_code": Reason.BACKWARD_ON_XLA, "backward_ops": 0,
                "backward_kernel_ops": 0}
    s, v = eo.message_avals(spec, operand_avals)
    n = spec.num_segments
    out = jax.ShapeDtypeStruct((n,) + v.shape[1:], jax.numpy.result_type(s.dtype, v.dtype))
    m = jax.ShapeDtypeStruct((n,) + s.shape[1:], accumulation_dtype(s.dtype))
    keep = [jax.ShapeDtypeStruct((spec.num_edges,), jax.numpy.bool_)] if _masked(spec) else []
    rows = {i: operand_avals[k].shape[0] if spec.groups[k] in (Group.SRC, Group.DST) else 0
            for i, k in enumerate(slots)}
    planned, _ = _plan(spec, slots, list(range(len(slots))), rows, m, m, out)
    kernels = _kernels(planned, operand_avals, keep)
    if spec.backend == "xla" or not any(kernels):
        impl, code = "xla", Reason.BACKWARD_ON_XLA
    elif all(kernels):
        impl, code = "kernel", Reason.BACKWARD_ON_KERNELS
    else:
        impl, code = "xla", Reason.BACKWARD_MIXED_LOWERINGS
    return {"backward": impl, "backward_code": code, "backward_ops": len(kernels),
            "backward_kernel_ops": sum(kernels)}


def _batch(args, dims, *, spec: eo.EdgeSpec, slots):
    axes = [None if d is compat.not_mapped else d for d in dims]
    fn = functools.partial(_forward_mode, spec=spec, slots=slots)
    return jax.vmap(fn, in_axes=axes)(*args), 0


attention_tangent_p.def_abstract_eval(_abstract_eval)
attention_tangent_p.def_impl(functools.partial(compat.apply_primitive, attention_tangent_p))
mlir.register_lowering(attention_tangent_p, mlir.lower_fun(_forward_mode, multiple_results=False))
ad.primitive_jvps[attention_tangent_p] = _jvp
ad.primitive_transposes[attention_tangent_p] = _transpose
batching.primitive_batchers[attention_tangent_p] = _batch
facts.register(attention_tangent_p, facts.Facts(residency=eo.residency))
