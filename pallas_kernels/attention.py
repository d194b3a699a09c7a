"""Edge-softmax attention aggregation (GAT / Transformer-conv / HGT style) as one online-softmax walk.

For every row ``r`` of the CSR and head ``h`` (``edge_fn`` returns a score and a value vector per slot)::

    m = max_e s_e            (-inf for a row without slots)
    p_e = exp(s_e - m),  l = Σ_e p_e
    out = (Σ_e p_e · κ_e · v_e) / l,   κ_e = keep(seed, eid, h) / (1 - rate)   (1 without dropout)

:func:`attention_forward` returns ``(out, m, l)`` exactly as this two-pass formula gives them, NaN and inf
included: an empty row gives ``(0, -inf, 0)``; a row whose scores are all -inf gives NaN (the formula's
``-inf - (-inf)``); a NaN or +inf score gives NaN. ``m`` and ``l`` are returned separately (not as a
log-sum-exp, which loses ``log k`` when ``m = -1e9`` in float32).

The walk keeps one ``(m, l, acc)`` state per lane and folds slots in with the merge rule below, which defers
-inf (equal maxima get factor 1, so a chunk of -inf scores followed by finite ones gives the finite answer);
lanes, and the pieces of split rows, merge with the same rule. Dropout is the counter hash of
:mod:`pallas_kernels.dropout` (no mask is stored).

Operands are ``[*, H]`` or ``[*, H, Dk]`` (``col`` gathered at ``csr.col``, ``row`` at the row, ``edge`` at
``csr.eid``, ``shared`` ``[1, ...]``), zero-padded to powers of two; ``edge_fn`` must be zero-padding-safe
(dot products over Dk, elementwise over heads, which may be split across programs) and returns
``(scores [B, Hb], values [B, Hb, Dp])``.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _dtypes
from pallas_kernels import _reference as ref
from pallas_kernels import _walk as wk
from pallas_kernels import dropout as dr
from pallas_kernels.csr import CSR


def _nan_max(a, b):
    return jnp.where(jnp.isnan(b) | (b > a), b, a)


def _merge_factors(m1, m2):
    """Weights of two states with maxima ``m1``, ``m2`` against their joint maximum (one exp)."""
    gap = jnp.exp(jnp.where(m1 == m2, 0.0, -jnp.abs(m1 - m2)).astype(m1.dtype))
    first = m1 >= m2  # False when either is NaN: then ``gap`` is NaN and poisons the merge
    return jnp.where(first, 1.0, gap).astype(m1.dtype), jnp.where(first, gap, 1.0).astype(m1.dtype)


def _lift(values, valid):
    """One slot as a state: its own maximum, weight 1 (NaN for +inf: the formula's ``exp(inf - inf)``)."""
    s, v = values
    ok = wk.lanes_like(valid, s)
    weight = jnp.where(ok, jnp.where(s == jnp.inf, jnp.nan, 1.0), 0.0).astype(s.dtype)
    return (jnp.where(ok, s, -jnp.inf).astype(s.dtype), weight,
            jnp.where(wk.lanes_like(valid, v), v, jnp.zeros((), v.dtype)))


def _combine(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    f1, f2 = _merge_factors(m1, m2)
    return _nan_max(m1, m2), f1 * l1 + f2 * l2, f1[..., None] * o1 + f2[..., None] * o2


def _reduce(state, axis):
    m, l, o = state
    top = jnp.max(m, axis=axis)
    top = jnp.where(jnp.max(jnp.isnan(m).astype(jnp.int32), axis=axis) > 0, jnp.nan, top)
    wide = jnp.expand_dims(top, axis)
    f = jnp.where(m == wide, 1.0, jnp.exp(m - wide)).astype(m.dtype)
    return top, jnp.sum(f * l, axis=axis), jnp.sum(f[..., None] * o, axis=axis)


def _finalize(state, deg):
    m, l, o = state
    empty = wk.lanes_like(deg, m) == 0
    undefined = ~empty & (m == -jnp.inf)
    l = jnp.where(empty, 0.0, jnp.where(undefined, jnp.nan, l)).astype(l.dtype)
    out = jnp.where(empty[..., None], 0.0, o / l[..., None]).astype(o.dtype)
    return out, m, l


SOFTMAX = wk.Monoid(lift=_lift, combine=_combine, reduce=_reduce, finalize=_finalize)


def _check(rate: float, seed) -> None:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
    if rate > 0.0 and seed is None:
        raise ValueError("dropout_rate > 0 needs a dropout_seed")


def _seed_array(seed) -> jax.Array:
    return jnp.reshape(jnp.asarray(0 if seed is None else seed, jnp.int32), (1,))


def _keep_scale(seed, eid, head, rate: float, dtype):
    """``[B, Hb]`` dropout factor κ for edge ids ``eid`` ``[B, 1]`` and heads ``[Hb]``, or None without dropout."""
    if rate <= 0.0:
        return None
    keep = dr.edge_dropout_keep(seed, eid, head[None, :], rate)
    return jnp.where(keep, 1.0 / (1.0 - rate), 0.0).astype(dtype)


def _groups(col, row, edge, shared):
    return tuple(tuple(g) for g in (col, row, edge, shared))


def _slot_dtype(x, compute, exact_integers: bool):
    return jnp.int32 if exact_integers and x.dtype == jnp.int32 else compute


def _value_dim(edge_fn, groups, heads: int, compute, exact_integers: bool = False) -> int:
    """``D`` of ``edge_fn``'s values, from one unpadded slot (``edge_fn`` is elementwise over heads)."""
    tiles = tuple(tuple(jax.ShapeDtypeStruct((1, heads) + x.shape[2:], _slot_dtype(x, compute, exact_integers))
                        for x in g) for g in groups)
    scores, values = jax.eval_shape(edge_fn, *tiles)
    fits = len(scores.shape) <= 2 and all(d in (1, t) for d, t in zip(scores.shape[::-1], (heads, 1), strict=False))
    if values.ndim != 3 or values.shape[:2] != (1, heads) or not fits:
        raise ValueError(f"attention edge_fn must return (scores [B, H], values [B, H, D]) with H={heads}; got "
                         f"{scores.shape} and {values.shape} for one slot")
    return values.shape[2]


def attention_forward(edge_fn: Callable, col, row, edge, shared, csr: CSR, *, heads: int, dropout_rate: float = 0.0,
                      dropout_seed=None, interpret: bool = False, out_dtype=None, exact_integers: bool = False):
    """``(out [R, H, D], m [R, H], l [R, H])`` of the module docstring's formula (forward only).

    Args:
      edge_fn: ``(col, row, edge, shared) -> (scores [B, Hb], values [B, Hb, Dp])`` on tuples of tiles
        ``[B, Hb]`` / ``[B, Hb, Dkp]`` in the compute dtype.
      col, row, edge, shared: tuples of ``[*, H]`` / ``[*, H, Dk]`` operands (``shared`` with one row).
      heads: ``H``.
      dropout_rate: static rate in [0, 1); ``dropout_seed`` an int32 scalar (traced is fine).
      out_dtype: dtype of ``out`` (default: the operands' result dtype); ``m`` and ``l`` are in the compute
        dtype (float32, or float64 with a float64 operand).
      exact_integers: int32 operands reach ``edge_fn`` as int32 tiles (e.g. ids and seeds it hashes), not in the
        compute dtype.
    """
    _check(dropout_rate, dropout_seed)
    groups = _groups(col, row, edge, shared)
    arrays = [x for g in groups for x in g]
    compute = _dtypes.compute_dtype(arrays, integers=False, what="attention")
    dim = _value_dim(edge_fn, groups, heads, compute, exact_integers)
    plan = wk.make_plan(groups, csr, axis=heads, extra=[(heads, dim)], compute=compute,
                        exact_integers=exact_integers)
    dp = plan.tile((heads, dim))[1]
    rate = float(dropout_rate)

    def body(c, r, e, s, ctx):
        scores, values = edge_fn(c, r, e, s)
        scores = jnp.broadcast_to(jnp.asarray(scores).astype(compute), (plan.block, plan.split))
        values = jnp.broadcast_to(jnp.asarray(values).astype(compute), (plan.block, plan.split, dp))
        head = ctx.offset + jax.lax.broadcasted_iota(jnp.int32, (plan.split,), 0)
        kappa = _keep_scale(ctx.seed, ctx.eid, head, rate, compute)
        return (scores, values if kappa is None else values * kappa[..., None]), ()

    num_rows = csr.num_rows
    out_dtype = np.dtype(out_dtype or _dtypes.result_dtype(arrays))
    outs, _ = wk.walk(body, csr, groups, plan=plan, monoid=SOFTMAX, seed=_seed_array(dropout_seed),
                      row_out=(jax.ShapeDtypeStruct((num_rows, heads, dim), out_dtype),
                               jax.ShapeDtypeStruct((num_rows, heads), compute),
                               jax.ShapeDtypeStruct((num_rows, heads), compute)),
                      interpret=interpret, name="gnn_attention")
    return outs


def attention_forward_reference(edge_fn: Callable, col, row, edge, shared, csr: CSR, *, heads: int,
                                dropout_rate: float = 0.0, dropout_seed=None, out_dtype=None):
    """Pure-jnp definition of :func:`attention_forward`: the two-pass formula over per-slot scores."""
    _check(dropout_rate, dropout_seed)
    groups = _groups(col, row, edge, shared)
    arrays = [x for g in groups for x in g]
    compute = _dtypes.compute_dtype(arrays, integers=False, what="attention")
    rows, valid = ref.slot_rows(csr)
    num_rows = csr.num_rows
    scores, values = edge_fn(*ref.slot_operands(groups, csr, rows, axis=heads, compute=compute))
    scores = jnp.broadcast_to(jnp.asarray(scores).astype(compute), (rows.shape[0], heads))
    values = jnp.asarray(values).astype(compute)
    seg = lambda fn, x: fn(x, rows, num_segments=num_rows + 1)  # row R collects the slots of no row
    m = seg(jax.ops.segment_max, scores)
    p = jnp.where(ref.lanes(valid, scores), jnp.exp(scores - jax.lax.stop_gradient(m)[rows]), 0.0)
    l = seg(jax.ops.segment_sum, p)
    kappa = _keep_scale(jnp.asarray(0 if dropout_seed is None else dropout_seed, jnp.int32), csr.eid[:, None],
                        jnp.arange(heads, dtype=jnp.int32), float(dropout_rate), compute)
    weights = p if kappa is None else p * kappa
    terms = jnp.where(ref.lanes(valid, values), weights[..., None] * values, 0.0)
    total = seg(jax.ops.segment_sum, terms)[:num_rows]
    l = l[:num_rows]
    out = total / jnp.where(l == 0, 1.0, l)[..., None]  # once per row, as the kernel and jgnn's reference
    return out.astype(out_dtype or _dtypes.result_dtype(arrays)), m[:num_rows], l
