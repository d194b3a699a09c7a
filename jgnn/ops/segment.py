"""``segment``: reduce rows by a graph index (edges to their destination or source node, nodes to their graph).

``segment(x, ids, kind=..., num_segments=n, index=..., empty=...)`` is ``out[v] = ⊕_{i: ids[i] = v} x[i]`` for
``kind`` ∈ ``sum``/``mean``/``max``/``min``, with ``jax.ops.segment_*`` semantics: ids outside ``[0, n)`` are
dropped. Segments without rows give 0 for sum and mean, and for max/min the reduction's identity
(``empty="identity"``: −inf/+inf, the smallest/largest integer) or 0 (``empty="zero"``: `jgnn.max` in rho, as
PyG and DGL). ``mean`` is ``sum / max(count, 1)``. NaN propagates through max/min as XLA's scatter-max does.
Floating sums accumulate in at least float32 (bf16/f16 inputs are summed in float32 and rounded once); integer
sums accumulate in their own dtype, exactly.

Rules side by side: abstract eval, the reference implementation (which is also the XLA lowering), JVP (sum and
mean are linear; max/min follow JAX's scatter-max rule: tied rows share the tangent equally, and so does the
identity when every row equals it), transpose (a masked `gather`), batching, and the residency facts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts
from jgnn.facts import Info
from jgnn.report import Reason
from jgnn.roles import ENDPOINTS, MEMBERSHIP, TYPE_INDEX, Index, Movement, Residency

KINDS = ("sum", "mean", "max", "min")
EMPTY = ("identity", "zero")

segment_p = jcore.Primitive("jgnn_segment")


def _bind(*args, **params):
    return segment_p.bind(*compat.match_vma(args), **params)


def segment(x, ids, *, kind: str, num_segments: int, index: Index, empty: str = "identity"):
    """``[num_segments, *x.shape[1:]]``: the ``kind`` of ``x``'s rows grouped by ``ids`` (see module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"segment kind must be one of {KINDS}, got {kind!r}")
    if empty not in EMPTY:
        raise ValueError(f"empty must be one of {EMPTY}, got {empty!r}")
    return _bind(x, ids, kind=kind, num_segments=int(num_segments), index=Index(index), empty=empty)


def accumulation_dtype(dtype) -> np.dtype:
    """Floating sums run in at least float32; integers and complex in their own dtype."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return dtype


def count_dtype(dtype) -> np.dtype:
    """The dtype rows are counted in: the values' accumulation dtype when floating (float64 for float64), else
    float32."""
    acc = accumulation_dtype(dtype)
    return acc if jnp.issubdtype(acc, jnp.floating) else jnp.dtype(jnp.float32)


def identity(kind: str, dtype):
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return info.min if kind == "max" else info.max
    if dtype == jnp.bool_:
        return kind == "min"
    return -jnp.inf if kind == "max" else jnp.inf


def counts(ids, num_segments: int, dtype=jnp.float32):
    """How many rows each segment receives (ids outside ``[0, n)`` dropped)."""
    return jax.ops.segment_sum(jnp.ones(ids.shape[:1], dtype), ids, num_segments)


def _trail(x, ndim: int):
    return jnp.reshape(x, x.shape + (1,) * (ndim - x.ndim))


def reference(x, ids, *, kind, num_segments, empty, **_):
    """The semantics: ``jax.ops.segment_*`` plus the conventions above."""
    n = num_segments
    if kind in ("sum", "mean"):
        acc = accumulation_dtype(x.dtype)
        total = jax.ops.segment_sum(x.astype(acc), ids, n)
        if kind == "sum":
            return total.astype(x.dtype)
        count = _trail(counts(ids, n, acc if jnp.issubdtype(acc, jnp.inexact) else jnp.float32), x.ndim)
        return (total / jnp.maximum(count, 1)).astype(mean_dtype(x.dtype))
    op = jax.ops.segment_max if kind == "max" else jax.ops.segment_min
    out = op(x, ids, n)
    if empty == "zero":
        out = jnp.where(_trail(counts(ids, n), x.ndim) > 0, out, jnp.zeros((), x.dtype))
    return out


def materialize(x):
    """``x``, as one buffer that every reader shares.

    A max's derivative compares each row with the maximum. XLA may recompute a cheap ``x`` separately in the
    fusion that reduces it and in the one that compares (e.g. once with a fused multiply-add and once without),
    and the maximum is then missed by an ulp. Its fusion passes remove ``optimization_barrier``s on CPU; a
    scatter of every row to its own place is a real buffer they keep.
    """
    rows = jnp.arange(x.shape[0], dtype=jnp.int32)
    return jnp.zeros_like(x).at[rows].set(x, unique_indices=True, indices_are_sorted=True)


def mean_dtype(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.result_type(dtype, float)


def _abstract_eval(x, ids, *, kind, num_segments, index, empty):
    if ids.ndim != 1 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"segment ids must be [{x.shape[0]}], got {ids.shape}")
    dtype = mean_dtype(x.dtype) if kind == "mean" else x.dtype
    return compat.shaped_like((num_segments,) + x.shape[1:], dtype, [x, ids])


def _jvp(primals, tangents, *, kind, num_segments, index, empty):
    x, ids = primals
    dx, _ = tangents
    params = dict(kind=kind, num_segments=num_segments, index=index, empty=empty)
    if kind in ("max", "min") and type(dx) is not ad.Zero:
        x = materialize(x)
    out = _bind(x, ids, **params)
    if type(dx) is ad.Zero:
        return out, compat.zero_tangent(out)
    if kind in ("sum", "mean"):
        return out, _bind(dx, ids, **params)
    # JAX's scatter-max rule: rows equal to the result share its tangent, the identity counts as one more row.
    from jgnn.ops.gather import gather  # the two primitives transpose into each other

    n = num_segments
    at_row = gather(out, ids, index=index, mode="clip", wrap=False)
    valid = (ids >= 0) & (ids < n)
    hit = (x == at_row) & _trail(valid, x.ndim)
    # Counted in the values' precision (float64 for float64), as JAX's scatter-max rule counts.
    ties = jax.ops.segment_sum(hit.astype(count_dtype(x.dtype)), ids, n)
    retained = (out == identity(kind, x.dtype)).astype(ties.dtype)
    share = jnp.where(hit, 1.0 / gather(ties + retained, ids, index=index, mode="clip", wrap=False), 0.0)
    return out, _bind((dx * share.astype(dx.dtype)).astype(dx.dtype), ids, kind="sum", num_segments=n,
                               index=index, empty="identity")


def _transpose(ct, x, ids, *, kind, num_segments, index, empty):
    # A max/min of tangents is not linear; it stands in a linear program only where `tangent_shift`, whose
    # transpose is zero, reads it (the softmax JVP's largest tied tangent): a zero cotangent, transposed to zero.
    if type(ct) is ad.Zero:
        return (ad.Zero(x.aval) if ad.is_undefined_primal(x) else None), None
    assert kind in ("sum", "mean") and ad.is_undefined_primal(x) and not ad.is_undefined_primal(ids)
    from jgnn.ops.gather import gather

    if kind == "mean":
        count = counts(ids, num_segments, accumulation_dtype(ct.dtype))
        ct = ct / _trail(jnp.maximum(count, 1), ct.ndim).astype(ct.dtype)
    valid = _trail((ids >= 0) & (ids < num_segments), ct.ndim)  # dropped rows got no cotangent
    rows = gather(ct, ids, index=index, mode="clip", wrap=False)
    return jnp.where(valid, rows, jnp.zeros((), rows.dtype)).astype(x.aval.dtype), None


def _batch(args, dims, *, kind, num_segments, index, empty):
    x, ids = args
    dx, di = dims
    params = dict(kind=kind, num_segments=num_segments, index=index, empty=empty)
    if di is not compat.not_mapped:  # a batch of graphs with different ids: no structure to keep
        size = x.shape[dx] if dx is not compat.not_mapped else ids.shape[di]
        x = batching.bdim_at_front(x, dx, size)
        ids = batching.bdim_at_front(ids, di, size)
        return jax.vmap(functools.partial(reference, **params))(x, ids), 0
    x = jnp.moveaxis(x, dx, 1)
    return _bind(x, ids, **params), 1


def _residency(op, infos, ctx):
    _, ids = infos
    index = op.params["index"]
    if index in ENDPOINTS:
        return [Info(Residency.NODE, graph=ids.graph, reduced_by=index)], Movement.REDUCE
    if index in MEMBERSHIP:
        return [Info(Residency.GRAPH, graph=ids.graph)], Movement.REDUCE
    if index in TYPE_INDEX:
        return [Info(TYPE_INDEX[index])], Movement.REDUCE
    raise facts.Unknown(Reason.NOT_A_GRAPH_REDUCTION, reduce=op.params["kind"], index=index.value)


segment_p.def_abstract_eval(_abstract_eval)
segment_p.def_impl(functools.partial(jax.jit, static_argnames=("kind", "num_segments", "index", "empty"))(reference))
mlir.register_lowering(segment_p, mlir.lower_fun(reference, multiple_results=False))
ad.primitive_jvps[segment_p] = _jvp
ad.primitive_transposes[segment_p] = _transpose
batching.primitive_batchers[segment_p] = _batch
facts.register(segment_p, facts.Facts(residency=_residency))
