"""``segment_softmax``: normalise scores over each segment (an edge softmax over a node's incoming edges).

``segment_softmax(s, ids, num_segments=n, index=..., wrap=True)`` is jraph's ``segment_softmax``, term by term:
``m = segment_max(s)``; ``e = exp(s − m[ids])``; ``α = e / segment_sum(e)[ids]``. The gathers back to the rows
use jnp indexing (negative ids wrapped when ``wrap``, then clamped); the segment ops drop ids outside
``[0, n)``. So a segment whose scores are all −inf gives NaN (−inf − (−inf)), and NaN or +inf scores give NaN,
exactly as the formula does. Sums accumulate as `jgnn.ops.segment` sums do.

Rules side by side: abstract eval, reference (also the XLA lowering), JVP ``α (ds − Σ α ds)`` with ``ds`` centred
on the max's tangent as the reference's is, taking the ties' largest as the fused softmax does (built from
`segment` and `gather`, which transpose), batching and residency facts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts
from jgnn.facts import Info
from jgnn.ops.edge_fn import shifted_exp
from jgnn.ops.gather import gather, normalize
from jgnn.ops.segment import segment
from jgnn.ops.tangent_shift import tangent_shift
from jgnn.roles import Index, Movement, Residency

segment_softmax_p = jcore.Primitive("jgnn_segment_softmax")


def _bind(*args, **params):
    return segment_softmax_p.bind(*compat.match_vma(args), **params)


def segment_softmax(s, ids, *, num_segments: int, index: Index = Index.DST, wrap: bool = True):
    """``[E, ...]`` softmax weights of the scores ``s`` within each segment (see module docstring)."""
    return _bind(s, ids, num_segments=int(num_segments), index=Index(index), wrap=bool(wrap))


def reference(s, ids, *, num_segments, wrap, **_):
    n = num_segments
    rows = normalize(ids, n, wrap=wrap)
    m = jax.ops.segment_max(s, ids, n)
    e = shifted_exp(s, jnp.take(m, rows, axis=0, mode="clip"))
    total = jax.ops.segment_sum(e.astype(_acc(e.dtype)), ids, n).astype(e.dtype)
    return e / jnp.take(total, rows, axis=0, mode="clip")


def _acc(dtype):
    from jgnn.ops.segment import accumulation_dtype

    return accumulation_dtype(dtype)


def _abstract_eval(s, ids, **params):
    if ids.ndim != 1 or ids.shape[0] != s.shape[0]:
        raise ValueError(f"segment_softmax ids must be [{s.shape[0]}], got {ids.shape}")
    return compat.shaped_like(s.shape, s.dtype, [s, ids])


def _jvp(primals, tangents, *, num_segments, index, wrap):
    s, ids = primals
    ds, _ = tangents
    alpha = _bind(s, ids, num_segments=num_segments, index=index, wrap=wrap)
    if type(ds) is ad.Zero:
        return alpha, compat.zero_tangent(alpha)
    # Centre the tangents on the row max's, as the reference's ``s − m[ids]`` does (`jgnn.ops.tangent_shift`).
    m = segment(s, ids, kind="max", num_segments=num_segments, index=index)
    hit = s == gather(m, ids, index=index, mode="clip", wrap=wrap)
    count = segment(hit.astype(s.dtype), ids, kind="sum", num_segments=num_segments, index=index)
    at_max = segment(jnp.where(hit, ds, jnp.zeros((), ds.dtype)), ids, kind="sum", num_segments=num_segments,
                     index=index)
    # The ties' largest tangent, as the fused softmax's rule takes it (`attention_tangent`): one semantics.
    top = segment(jnp.where(hit, ds, jnp.array(-jnp.inf, ds.dtype)), ids, kind="max", num_segments=num_segments,
                  index=index)
    centred = ds - gather(tangent_shift(at_max, count, top), ids, index=index, mode="clip", wrap=wrap)
    weighted = alpha * centred
    total = segment(weighted, ids, kind="sum", num_segments=num_segments, index=index)
    return alpha, weighted - alpha * gather(total, ids, index=index, mode="clip", wrap=wrap)


def _batch(args, dims, **params):
    s, ids = args
    ds, di = dims
    if di is not compat.not_mapped:
        size = s.shape[ds] if ds is not compat.not_mapped else ids.shape[di]
        s, ids = batching.bdim_at_front(s, ds, size), batching.bdim_at_front(ids, di, size)
        return jax.vmap(functools.partial(reference, **params))(s, ids), 0
    return _bind(jnp.moveaxis(s, ds, 1), ids, **params), 1


def _residency(op, infos, ctx):
    s, ids = infos
    if s.residency not in (Residency.EDGE, Residency.SHARED):
        return facts.dense(op, infos, ctx)
    return [Info(Residency.EDGE, graph=ids.graph, edges=ids.edges)], Movement.NORM


segment_softmax_p.def_abstract_eval(_abstract_eval)
segment_softmax_p.def_impl(jax.jit(reference, static_argnames=("num_segments", "index", "wrap")))
mlir.register_lowering(segment_softmax_p, mlir.lower_fun(reference, multiple_results=False))
ad.primitive_jvps[segment_softmax_p] = _jvp
batching.primitive_batchers[segment_softmax_p] = _batch
facts.register(segment_softmax_p, facts.Facts(residency=_residency))
