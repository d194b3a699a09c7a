"""Edge-softmax attention aggregation (GAT / Transformer-conv / HGT style) as one online-softmax walk.

For every row ``r`` of the CSR and head ``h`` (``edge_fn`` returns a score and a value vector per slot)::

    m = max_e s_e            (-inf for a row without slots)
    p_e = exp(s_e - m),  l = Σ_e p_e
    out = Σ_e (p_e / l) · κ_e · v_e,   κ_e = keep(seed, eid, h) / (1 - rate)   (1 without dropout)

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

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _dtypes, _pullback, residuals
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
    # Slots of no row divide 0 by 0; a where after the division would still pass NaN to the values' gradient.
    alpha = p / jnp.where(ref.lanes(valid, scores), l[rows], 1.0)
    kappa = _keep_scale(jnp.asarray(0 if dropout_seed is None else dropout_seed, jnp.int32), csr.eid[:, None],
                        jnp.arange(heads, dtype=jnp.int32), float(dropout_rate), compute)
    if kappa is not None:
        alpha = alpha * kappa
    terms = jnp.where(ref.lanes(valid, values), alpha[..., None] * values, 0.0)
    out = seg(jax.ops.segment_sum, terms)[:num_rows]
    return out.astype(out_dtype or _dtypes.result_dtype(arrays)), m[:num_rows], l[:num_rows]


# ---------------------------------------------------------------------------------------------------------------
# Differentiable wrapper (standalone users): score function plus values gathered by source or edge.
# ---------------------------------------------------------------------------------------------------------------

def _edge_fn(score_fn, value_index: str, n_src: int, n_edge: int):
    """The 4-argument edge function of :func:`attention_forward` for a score function and a values operand
    that rides as the last col operand (``value_index="src"``) or the last edge operand (``"edge"``)."""
    def run(c, r, e, s=()):
        values = c[n_src] if value_index == "src" else e[n_edge]
        return score_fn(c[:n_src], r, e[:n_edge]), values
    return run


def _operands(src, edge, values, value_index):
    return (src + (values,), edge) if value_index == "src" else (src, edge + (values,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _attention(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, rev_csr, seed):
    return _attention_fwd(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, rev_csr, seed)[0]


def _attention_fwd(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, rev_csr, seed):
    col, edges = _operands(src, edge, values, value_index)
    fn = _edge_fn(score_fn, value_index, len(src), len(edge))
    out, m, l = attention_forward(fn, col, dst, edges, (), csr, heads=values.shape[1], dropout_rate=rate,
                                  dropout_seed=seed[0], interpret=interpret)
    return out, (src, dst, edge, values, csr, rev_csr, seed, *residuals.name_stats(out, m, l))


def _attention_bwd(score_fn, value_index, rate, interpret, res, g):
    src, dst, edge, values, csr, rev_csr, seed, out, m, l = res
    compute = m.dtype
    g = g.astype(compute)
    delta = jnp.sum(g * out.astype(compute), axis=-1)  # [R, H]: Σ_e α_e κ_e <dO, v_e> per row and head
    col, edges = _operands(src, edge, values, value_index)
    edge_fn = _edge_fn(score_fn, value_index, len(src), len(edge))

    def fn(c, r, e):
        scores, vals = edge_fn(c, r, e)
        return jnp.broadcast_to(scores, vals.shape[:2]), vals

    def cotangent(y, node, edge_x, ctx):
        (scores, vals), (do, m_, l_, delta_) = y, node
        alpha = jnp.exp(scores - m_) / l_
        head = ctx.offset + jax.lax.broadcasted_iota(jnp.int32, (scores.shape[1],), 0)
        kappa = _keep_scale(ctx.seed, ctx.eid, head, rate, compute)
        kappa = jnp.ones_like(alpha) if kappa is None else kappa
        return alpha * (kappa * jnp.sum(do * vals, axis=-1) - delta_), (alpha * kappa)[..., None] * do

    d_col, d_dst, d_edges = _pullback.pullback(fn, col, dst, edges, csr, rev_csr, axis=values.shape[1],
                                               compute=compute, cotangent=cotangent, node_extras=(g, m, l, delta),
                                               seed=seed, interpret=interpret, name="gnn_attention")
    d_values = d_col[-1] if value_index == "src" else d_edges[-1]
    d_src = d_col[:len(src)]
    return d_src, d_dst, d_edges[:len(edge)], d_values, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention_aggregate(score_fn, src: tuple, dst: tuple, edge: tuple, values: jax.Array, csr: CSR,
                        rev_csr: CSR, *, value_index: str = "src", dropout_rate: float = 0.0,
                        dropout_seed=None, interpret: bool = False) -> jax.Array:
    """Differentiable ``[R, H, D]`` attention output with a score function and gathered values.

    Args:
      score_fn: ``(src_rows, dst_rows, edge_rows) -> [B, Hb]`` logits on zero-padded tiles.
      src, dst, edge: tuples of ``[*, H]`` / ``[*, H, Dk]`` score operands (col, row, edge roles).
      values: ``[N_src, H, D]`` (``value_index="src"``) or ``[E, H, D]`` (``"edge"``).
      csr, rev_csr: forward (rows = dst) and reverse (rows = src) CSRs.
      dropout_rate: static attention dropout rate; ``dropout_seed`` an int32 scalar (traced is fine).
    """
    if value_index not in ("src", "edge"):
        raise ValueError(f"value_index must be 'src' or 'edge', got {value_index!r}")
    _check(dropout_rate, dropout_seed)
    return _attention(score_fn, value_index, float(dropout_rate), interpret, tuple(src), tuple(dst), tuple(edge),
                      values, csr, rev_csr, _seed_array(dropout_seed))


def attention_aggregate_reference(score_fn, src: tuple, dst: tuple, edge: tuple, values: jax.Array, csr: CSR,
                                  rev_csr: CSR | None = None, *, value_index: str = "src",
                                  dropout_rate: float = 0.0, dropout_seed=None) -> jax.Array:
    """Pure-jnp reference of :func:`attention_aggregate` (materializes per-edge logits)."""
    del rev_csr
    if value_index not in ("src", "edge"):
        raise ValueError(f"value_index must be 'src' or 'edge', got {value_index!r}")
    src, edge = tuple(src), tuple(edge)
    col, edges = _operands(src, edge, values, value_index)
    return attention_forward_reference(_edge_fn(score_fn, value_index, len(src), len(edge)), col, tuple(dst),
                                       edges, (), csr, heads=values.shape[1], dropout_rate=dropout_rate,
                                       dropout_seed=dropout_seed)[0]
