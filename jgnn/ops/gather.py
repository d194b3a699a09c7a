"""``gather``: broadcast rows along a graph index (node rows to each edge's source or destination, graph rows to
their nodes, type-table rows to each typed item).

``gather(x, ids, index=..., mode=..., wrap=...)`` is ``x[ids]`` along axis 0 with jnp indexing semantics:
``wrap=True`` maps negative ids ``i`` to ``i + n`` first (``x[-1]`` is the last row), then ``mode="clip"`` clamps
ids into ``[0, n)`` (what ``x[ids]`` does under ``jit``) and ``mode="fill"`` gives NaN rows (the integer minimum
for integers) for ids out of range (``jnp.take``'s default).

Rules side by side: abstract eval, the reference implementation (also the XLA lowering), JVP (linear),
transpose (a `segment` sum over the same ids, clamped as the gather clamped them), batching and residency facts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts
from jgnn.facts import Info
from jgnn.report import Reason
from jgnn.roles import BROADCAST_OF_INDEX, ENDPOINTS, MEMBERSHIP, TYPE_INDEX, Index, Movement, Residency

MODES = ("clip", "fill")

gather_p = jcore.Primitive("jgnn_gather")


def _bind(*args, **params):
    return gather_p.bind(*compat.match_vma(args), **params)


def gather(x, ids, *, index: Index, mode: str = "clip", wrap: bool = True):
    """``x[ids]`` along axis 0 (see module docstring); ``ids`` is ``[K]``, the result ``[K, *x.shape[1:]]``."""
    if mode not in MODES:
        raise ValueError(f"gather mode must be one of {MODES}, got {mode!r}")
    return _bind(x, ids, index=Index(index), mode=mode, wrap=bool(wrap))


def normalize(ids, n: int, *, wrap: bool, clip: bool = True):
    """The row each id reads: negatives wrapped (jnp indexing) and, for ``clip``, clamped into ``[0, n)``.
    Wrapped 64-bit ids are then narrowed to int32 (`narrow`), as jnp indexing narrows them."""
    if wrap:
        ids = narrow(jnp.where(ids < 0, ids + n, ids))
    return jnp.clip(ids, 0, max(n - 1, 0)) if clip else ids


def narrow(ids):
    """64-bit ids as int32, as jnp indexing and `jax.ops.segment_sum` pass them to XLA (x64 graphs): an id beyond
    int32 names the row its low 32 bits name, there as here."""
    return ids.astype(jnp.int32) if jnp.dtype(ids.dtype).itemsize > 4 else ids


def reference(x, ids, *, mode, wrap, **_):
    n = x.shape[0]
    if mode == "clip":
        return jnp.take(x, normalize(ids, n, wrap=wrap), axis=0, mode="clip")
    return jnp.take(x, normalize(ids, n, wrap=wrap, clip=False), axis=0, mode="fill")


def _abstract_eval(x, ids, *, index, mode, wrap):
    if ids.ndim != 1:
        raise ValueError(f"gather ids must be 1-D, got shape {ids.shape}")
    return compat.shaped_like((ids.shape[0],) + x.shape[1:], x.dtype, [x, ids])


def _jvp(primals, tangents, **params):
    x, ids = primals
    dx, _ = tangents
    out = _bind(x, ids, **params)
    if type(dx) is ad.Zero:
        return out, compat.zero_tangent(out)
    return out, _bind(dx, ids, **params)


def _transpose(ct, x, ids, *, index, mode, wrap):
    from jgnn.ops.segment import segment  # the two primitives transpose into each other

    assert ad.is_undefined_primal(x) and not ad.is_undefined_primal(ids)
    if type(ct) is ad.Zero:
        return ad.Zero(x.aval), None
    n = x.aval.shape[0]
    # A clamped gather read row clip(i): its cotangent lands there; a filled row read nothing.
    rows = normalize(ids, n, wrap=wrap, clip=mode == "clip")
    return segment(ct, rows, kind="sum", num_segments=n, index=index), None


def _batch(args, dims, **params):
    x, ids = args
    dx, di = dims
    if di is not compat.not_mapped:
        size = x.shape[dx] if dx is not compat.not_mapped else ids.shape[di]
        x = batching.bdim_at_front(x, dx, size)
        ids = batching.bdim_at_front(ids, di, size)
        return jax.vmap(functools.partial(reference, **params))(x, ids), 0
    return _bind(jnp.moveaxis(x, dx, 1), ids, **params), 1


def _residency(op, infos, ctx):
    x, ids = infos
    index = op.params["index"]
    graph = ids.graph if facts.graph_resident(ids) else x.graph
    if index in ENDPOINTS:
        if not facts.endpoint_table(x):
            raise facts.Unknown(Reason.MIXED_RESIDENCIES, residencies=f"{x.residency.value} and {index.value} ids")
        movement = Movement.NORM if x.reduced_by == index else BROADCAST_OF_INDEX[index]
        keep = x.index if x.index in TYPE_INDEX else None  # the type of each edge's source stays a type id
        return [Info(Residency.EDGE, index=keep, graph=graph, edges=ids.edges)], movement
    if index in MEMBERSHIP:
        return [Info(MEMBERSHIP[index], graph=graph, edges=ids.edges)], Movement.BROADCAST_GRAPH
    if index in TYPE_INDEX:
        return [Info(ids.residency, graph=graph, edges=ids.edges)], Movement.BROADCAST_TYPE
    if index == Index.PAIR:  # a per-pair table back to the edges
        return [Info(Residency.EDGE, graph=graph, edges=ids.edges)], Movement.BROADCAST_PAIR
    if index == Index.PAIR_SRC:  # node rows to the pairs
        return [Info(Residency.PAIR, graph=graph)], Movement.BROADCAST_SRC
    return facts.dense(op, infos, ctx)


gather_p.def_abstract_eval(_abstract_eval)
gather_p.def_impl(jax.jit(reference, static_argnames=("index", "mode", "wrap")))
mlir.register_lowering(gather_p, mlir.lower_fun(reference, multiple_results=False))
ad.primitive_jvps[gather_p] = _jvp
ad.primitive_transposes[gather_p] = _transpose
batching.primitive_batchers[gather_p] = _batch
facts.register(gather_p, facts.Facts(residency=_residency, linear=(0,)))
