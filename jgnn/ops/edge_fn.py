"""Per-edge functions: what a fused edge op computes for each edge, and their derivatives.

An `EdgeFn` maps the rows of its operands for a block of ``B`` edges (``[B, *trailing]`` arrays; operands of
the ``shared`` group arrive whole) to message rows ``[B, *trailing]``. The block size is free: the same
function runs over all edges at once, over edge blocks, or inside a Pallas kernel over a chunk of a CSR row.

* `RegionFn` is a region of the traced program (the ops between the gathers and the reduction), re-run on any
  number of rows by adjusting the params that hold the row count (`jgnn.facts` ``resize`` rules).
* `Jvp`, `Vjp` and the tangent functions of the max/min and softmax reductions are *derived* from another
  `EdgeFn` by ``jax.jvp``/``jax.vjp`` of its ``apply``, so they work in every mode the base works in: the
  derivative rules of `jgnn.ops.edge_op` build them, and one definition of each semantics serves every backend.

``lanes=True`` is the Pallas kernels' contract: each operand is a float ``[B, W]`` tile (zero-padded lanes,
width-1 operands already broadcast), and ops that only move unit axes are identities.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jgnn import compat, facts, ir
from jgnn.ops import rounding


class EdgeFn:
    """Base class (see module docstring). Subclasses are frozen dataclasses compared by identity."""

    n_in: int

    def apply(self, rows: Sequence[Any], *, lanes: bool = False) -> list[Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclasses.dataclass(frozen=True, eq=False)
class RegionFn(EdgeFn):
    """``ops`` of a traced program computing ``outputs`` from ``inputs`` (one per operand, in operand order).

    ``whole``: per input, whether it arrives without a row axis (a shared operand). ``rows`` is the number of
    rows the region was traced with: params holding that length are resized to the block's.
    """

    inputs: tuple[ir.Value, ...]
    ops: tuple[ir.Op, ...]
    outputs: tuple[ir.Atom, ...]
    whole: tuple[bool, ...]
    rows: int

    @property
    def n_in(self) -> int:
        return len(self.inputs)

    def apply(self, rows, *, lanes=False):
        program = ir.Program(list(self.inputs), list(self.outputs), list(self.ops))
        if lanes:
            return _evaluate_lanes(program, rows, next((np.shape(x) for x in rows if np.ndim(x) == 2), None))
        block = next((np.shape(x)[0] for x, w in zip(rows, self.whole, strict=True) if not w), self.rows)
        run = (facts.run_resized(self.rows, block, self._row_values) if block != self.rows
               else (lambda op, xs: op.run(*xs)))
        return ir.evaluate(program, rows, run=sixteen_bit_in_f32(run))

    @functools.cached_property
    def _row_values(self) -> frozenset[int]:
        program = ir.Program(list(self.inputs), list(self.outputs), list(self.ops))
        return facts.row_values(program, [not w for w in self.whole], self.rows)

    def describe(self) -> str:
        return f"{len(self.ops)} ops"


# The 16-bit floats: computed in float32 and rounded once, here and in the linear rewrites (`jgnn.passes`).
SIXTEEN_BIT = frozenset({np.dtype(jnp.float16), np.dtype(jnp.bfloat16)})
# Ops that never round: their 16-bit results need no settling (`_settled`).
_EXACT = frozenset(compat.primitives("""
abs and bitcast_convert_type ceil clamp clz complex conj copy eq floor ge gt imag is_finite le
lt max min ne neg not or population_count real reduce_precision round select_n shift_left shift_right_arithmetic
shift_right_logical sign stop_gradient xor reduce_max reduce_min argmax argmin
""")) | facts.SHAPE_ONLY
# Elementwise ops that round their result. Pallas' Triton lowering has no float16/bfloat16 kernel for division and
# most transcendental functions: on an H100, tanh(f16) failed to compile, and a deviceless probe of every unary
# and binary lax op (benchmarks/results/gpu-h100-2026-11-26.md) also rejected div, pow, atan2, log1p, expm1 and
# the trigonometric and hyperbolic families. So on 16-bit floats each of these runs in float32 and rounds once.
# That is exactly IEEE 16-bit arithmetic for + − × ÷ and √, because float32 carries more than twice their
# precision plus two bits. It is also what XLA's float normalization does for the others.
_ROUNDING = frozenset(facts.ELEMENTWISE) - _EXACT - frozenset(compat.primitives("convert_element_type"))
# Inside a Triton kernel (`rounding_by_convert`) a 16-bit result is a plain convert: Triton keeps every convert,
# and its lowering has no reduce_precision.
_BY_CONVERT = contextvars.ContextVar("jgnn_rounding_by_convert", default=False)


@contextlib.contextmanager
def rounding_by_convert():
    """Settle 16-bit results with plain converts while tracing a Pallas kernel for Triton."""
    token = _BY_CONVERT.set(True)
    try:
        yield
    finally:
        _BY_CONVERT.reset(token)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _settle(y, dtype):
    """``y`` rounded to the 16-bit ``dtype`` as a value XLA cannot widen again.

    XLA may drop a float32 → 16-bit → float32 round trip (``xla_allow_excess_precision``, on by default), in one
    fusion and not in another. A score recomputed by two edge ops then differs by a 16-bit ulp, which at 1e19 is
    1e17: the softmax weight of the edge attaining the max became exp(-1e17) = 0 in a tangent (fuzz campaign
    20261300: bfloat16 attention tangents half the reference's). ``reduce_precision`` is a rounding XLA keeps;
    it flushes float16's subnormals, which are rounded here on their fixed grid instead."""
    info = jnp.finfo(dtype)
    r = jax.lax.reduce_precision(y, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    if info.nexp < 8:
        grid = float(info.smallest_subnormal)
        r = jnp.where(jnp.abs(y) < float(info.tiny),
                      jax.lax.round(y / grid, jax.lax.RoundingMethod.TO_NEAREST_EVEN) * grid, r)
    return r.astype(dtype)


@_settle.defjvp
def _settle_jvp(dtype, primals, tangents):
    # A plain convert: linear, so that the tangent transposes. A tangent is not compared against a max.
    return _settle(primals[0], dtype), tangents[0].astype(dtype)


def _settled(y, dtype):
    """A rounding op's result ``y`` in its 16-bit ``dtype``: `_settle` on XLA, a convert in a Triton kernel."""
    if _BY_CONVERT.get():
        return y.astype(dtype)
    return _settle(y.astype(jnp.float32), np.dtype(dtype))


def sixteen_bit_in_f32(run):
    """``run`` with each rounding op on float16/bfloat16 inputs done in float32, and each 16-bit result of a
    rounding op settled in its dtype (`_settled`)."""
    def wrapped(op, xs):
        dtypes = [np.dtype(jnp.result_type(x)) for x in xs]
        if op.prim in _ROUNDING and any(d in SIXTEEN_BIT for d in dtypes):
            xs = [x.astype(jnp.float32) if d in SIXTEEN_BIT else x for x, d in zip(xs, dtypes, strict=True)]
        ys = run(op, xs)
        if op.prim in _EXACT:
            return ys
        return [_settled(y, v.dtype) if np.dtype(v.dtype) in SIXTEEN_BIT else y
                for y, v in zip(ys, op.outputs, strict=True)]
    return wrapped


def _evaluate_lanes(program: ir.Program, args, tile) -> list:
    """Run ``program`` on the Pallas kernels' ``[B, W]`` tiles (``tile``): a unit-axis reshape is the identity, the
    kernel already broadcast shared rows, and a scalar the program itself made (a literal) becomes a tile. A
    custom_jvp call (`jax.nn.relu`) runs with its callee and JVP traced again on tiles, its rule kept."""
    def retile(closed):  # each input with an axis becomes one tile
        return ir.retrace(closed, [jax.ShapeDtypeStruct(tile if a.ndim else (), a.dtype) for a in closed.in_avals],
                          lambda _: run)

    def lanes(op, xs):
        if op.prim in facts.SHAPE_ONLY:
            return [jnp.broadcast_to(xs[0], tile) if np.ndim(xs[0]) == 0 else xs[0]]
        params = compat.resize_custom_call(op.params, retile) if op.prim in compat.CUSTOM_CALLS else op.params
        out = compat.bind(op.prim, params, xs)
        return list(out) if op.prim.multiple_results else [out]

    run = sixteen_bit_in_f32(lanes)
    return ir.evaluate(program, args, run=run)


def fixed_rows(fn: EdgeFn) -> str | None:
    """The name of an op in ``fn`` (or in the functions it derives from) that runs only at its traced row count
    (`jgnn.facts` ``fixed_rows``): such a function cannot run on edge blocks or kernel tiles."""
    if isinstance(fn, RegionFn):
        return facts.fixed_rows(fn.ops)
    inner = (getattr(fn, f.name) for f in dataclasses.fields(fn)) if dataclasses.is_dataclass(fn) else ()
    return next((name for x in inner if isinstance(x, EdgeFn) and (name := fixed_rows(x)) is not None), None)


def _zeros_like_rows(x):
    return jnp.zeros(np.shape(x), x.dtype)


def _tangent_zero(x):
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(np.shape(x), compat.float0)
    return jnp.zeros(np.shape(x), dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Jvp(EdgeFn):
    """Tangent rows of ``base``: operands are ``base``'s, then one tangent per position in ``slots``."""

    base: EdgeFn
    slots: tuple[int, ...]

    @property
    def n_in(self) -> int:
        return self.base.n_in + len(self.slots)

    def apply(self, rows, *, lanes=False):
        _, out = _jvp(self.base, rows[:self.base.n_in], self.slots, rows[self.base.n_in:], lanes)
        return list(out)


@dataclasses.dataclass(frozen=True, eq=False)
class Vjp(EdgeFn):
    """Cotangent rows for the operands ``wrt`` of ``base`` (linear in them), given ``base``'s other operands and
    one cotangent row per output (last). The ``wrt`` operands are not passed: a linear function's pullback does
    not depend on where it is taken, so zeros stand in for them.
    """

    base: EdgeFn
    wrt: tuple[int, ...]
    shapes: tuple[jax.ShapeDtypeStruct, ...]  # per base operand: its trailing shape/dtype (no row axis if any)
    whole: tuple[bool, ...]  # per base operand, then per cotangent: arrives without a row axis
    n_out: int

    @property
    def n_in(self) -> int:
        return self.base.n_in - len(self.wrt) + self.n_out

    def apply(self, rows, *, lanes=False):
        known = list(rows[:len(rows) - self.n_out])
        cts = list(rows[len(rows) - self.n_out:])
        kept = [k for k in range(self.base.n_in) if k not in self.wrt]
        with_rows = [x for x, w in zip(known + cts, [self.whole[k] for k in kept] + list(self.whole[self.base.n_in:]),
                                       strict=True) if not w]
        block = np.shape(with_rows[0])[0]
        # On kernel tiles every operand has the tile's shape (lanes=True); otherwise its own trailing shape.
        shape = lambda k: (np.shape(with_rows[0]) if lanes else (block,) + tuple(self.shapes[k].shape))
        zeros = [jnp.zeros(self.shapes[k].shape if self.whole[k] and not lanes else shape(k), self.shapes[k].dtype)
                 for k in self.wrt]
        zeros = compat.vary_like(zeros, rows)  # else the pullback psums the cotangents over a shard_map axis
        it = iter(known)
        args = [None] * self.base.n_in
        for k in range(self.base.n_in):
            args[k] = zeros[self.wrt.index(k)] if k in self.wrt else next(it)

        # Transposed, not differentiated at zeros: the JVP of a custom_vjp function (a `custom_lin`) has a
        # transpose rule (its backward) but no derivative.
        fn = _moving(self.base, args, self.wrt, lanes)
        outs = jax.eval_shape(fn, *zeros)
        cts = [jnp.broadcast_to(c, o.shape).astype(o.dtype) for c, o in zip(cts, outs, strict=True)]
        return list(jax.linear_transpose(fn, *zeros)(cts))


@dataclasses.dataclass(frozen=True, eq=False)
class Scaled(EdgeFn):
    """``base``'s rows times a per-row factor (the last operand, e.g. ``1 / max(count, 1)`` for a mean)."""

    base: EdgeFn

    @property
    def n_in(self) -> int:
        return self.base.n_in + 1

    def apply(self, rows, *, lanes=False):
        scale = rows[-1]
        return [y * _trail(scale, y).astype(y.dtype) for y in self.base.apply(rows[:-1], lanes=lanes)]


def _trail(x, like):
    """``x`` with trailing unit axes so it broadcasts against ``like`` row by row."""
    return jnp.reshape(x, np.shape(x) + (1,) * (np.ndim(like) - np.ndim(x)))


@dataclasses.dataclass(frozen=True, eq=False)
class ExtremumTangent(EdgeFn):
    """The tangent of a segment max/min, as JAX's scatter-max rule defines it: each edge attaining its row's
    extremum passes its tangent times ``1 / (ties + retained)``; the others pass 0.

    Operands: ``base``'s, tangents for ``slots``, then whether the edge attains the extremum (saved by the forward
    op: comparing recomputed values with the saved extremum is not bit-exact across separately compiled
    computations), and the row's ``ties + retained``.
    """

    base: EdgeFn
    slots: tuple[int, ...]

    @property
    def n_in(self) -> int:
        return self.base.n_in + len(self.slots) + 2

    def apply(self, rows, *, lanes=False):
        n = self.base.n_in
        hit, denom = rows[-2], rows[-1]
        _, (dy,) = _jvp(self.base, rows[:n], self.slots, rows[n:-2], lanes)
        hit = hit if hit.dtype == jnp.bool_ else hit != 0
        share = jnp.where(hit, 1.0 / jnp.where(hit, denom, 1.0), 0.0)
        return [(dy * share.astype(dy.dtype)).astype(dy.dtype)]


@dataclasses.dataclass(frozen=True, eq=False)
class SoftmaxTangent(EdgeFn):
    """The tangent of ``out_v = Σ_e softmax_v(s)_e · V_e`` (``base`` gives ``(s [B, H], V [B, H, ...])``), term by
    term as the reference's: ``Σ_e dα_e V_e + α_e dV_e`` with ``dα_e = α_e (ds_e − c_v) − α_e T_v``, ``α_e =
    exp(s_e − m_v) / l_v``, ``c_v`` the row max's tangent (`MaxTangent`) and ``T_v = Σ_e α_e (ds_e − c_v)`` (a
    `WeightTangent` sum). The shift by ``c_v`` cancels in exact arithmetic and keeps the cancellation exact at the
    edge attaining the max, as the reference's does (`jgnn.ops.tangent_shift`). Reassociating (``α (ds (V − out)
    + dV)`` saves the ``T`` pass) overflows and makes NaN where the reference does not.

    Operands: ``base``'s, tangents for ``slots``, then the row's ``m``, ``l``, ``T`` and ``c``.
    """

    base: EdgeFn
    slots: tuple[int, ...]

    @property
    def n_in(self) -> int:
        return self.base.n_in + len(self.slots) + 4

    def apply(self, rows, *, lanes=False):
        n = self.base.n_in
        primals, tangents, (m, l, total, shift) = rows[:n], rows[n:-4], rows[-4:]
        (s, v), (ds, dv) = _jvp(self.base, primals, self.slots, tangents, lanes)
        alpha = softmax_weight(s, m, l, _score_bound(self.base, primals, lanes))
        d_alpha = alpha * (ds - shift) - alpha * total
        return [(_trail(d_alpha, v) * v + _trail(alpha, v) * dv).astype(v.dtype)]


@dataclasses.dataclass(frozen=True, eq=False)
class WeightTangent(EdgeFn):
    """Per edge, the scores' tangent weighted for a softmax with the max ``m`` held fixed (the softmax does not
    depend on it): ``α_e (ds_e − c_v) = exp(s_e − m_v) / l_v · (ds_e − c_v)`` (``normalized``; summed, the ``T``
    of `SoftmaxTangent`), or ``exp(s_e − m_v) · ds_e`` (summed, the normaliser's tangent ``dl_v``).

    Operands: ``base``'s (``base`` gives the scores), tangents for ``slots``, then ``m`` (and ``l`` and the shift
    ``c`` if normalized).
    """

    base: EdgeFn
    slots: tuple[int, ...]
    normalized: bool

    @property
    def n_in(self) -> int:
        return self.base.n_in + len(self.slots) + 1 + 2 * self.normalized

    def apply(self, rows, *, lanes=False):
        n = self.base.n_in
        stats = rows[n + len(self.slots):]
        primals, tangents = rows[:n], rows[n:n + len(self.slots)]
        (s,), (ds,) = _jvp(self.base, primals, self.slots, tangents, lanes)
        bound = _score_bound(self.base, primals, lanes)
        if not self.normalized:
            return [softmax_weight(s, stats[0], 1, bound) * ds]
        m, l, shift = stats
        return [softmax_weight(s, m, l, bound) * (ds - shift)]


@dataclasses.dataclass(frozen=True, eq=False)
class MaxTangent(EdgeFn):
    """Summed per row, the tangent of the max of the scores as JAX's ``segment_max`` rule gives it, before the
    tie share: ``(ds_e, 1)`` on edges whose score equals the row's max ``m_v``, ``(0, 0)`` elsewhere; with ``top``,
    ``ds_e`` there and −inf elsewhere, per edge, whose segment max is the ties' largest tangent (`tangent_shift`).
    It is only the shift of `SoftmaxTangent`, so a recomputed score that misses the saved max costs precision, not
    correctness.

    Operands: ``base``'s (``base`` gives the scores), tangents for ``slots``, then ``m``.
    """

    base: EdgeFn
    slots: tuple[int, ...]
    top: bool = False  # instead ``ds_e`` on those edges, −inf elsewhere (their segment max: `tangent_shift`)

    @property
    def n_in(self) -> int:
        return self.base.n_in + len(self.slots) + 1

    def apply(self, rows, *, lanes=False):
        n = self.base.n_in
        (s,), (ds,) = _jvp(self.base, rows[:n], self.slots, rows[n:-1], lanes)
        hit = attains_max(s, rows[-1])
        if self.top:
            return [jnp.where(hit, ds, jnp.full((), -jnp.inf, ds.dtype))]
        return [jnp.where(hit, ds, jnp.zeros((), ds.dtype)), hit.astype(ds.dtype)]


@dataclasses.dataclass(frozen=True, eq=False)
class SoftmaxRowDot(EdgeFn):
    """The row sums that `jgnn.ops.attention_tangent`'s transpose needs before it forms any edge's cotangent.
    With ``p_e = g_v·V_e`` (``base`` gives ``(s, V)``, ``g_v`` is the cotangent of the row's output, and the dot
    product runs over the axes ``V`` has beyond ``s``), per edge:

    * if ``top``, ``p_e`` on the edges attaining the max and −inf elsewhere, per edge (its row max is the ties'
      largest ``p``, whose finite values are the pivot ``P_v``); operands ``base``'s, then the row's ``m``, ``l``
      and ``g``;
    * ``α_e (p_e − P_v)`` (summed: ``R_v``); operands as above, then ``P``;
    * if ``centred``, ``(α_e (p_e − P_v − R_v), [e attains the max])`` (summed: the score cotangents' row sum
      ``C_v``, zero in exact arithmetic, and the ties ``k_v``); operands as above, then ``R``.

    Centring ``p`` on the pivot changes nothing in exact arithmetic (``Σ α = 1``); in floating point, edges tied at
    the max with equal ``p`` (duplicate edges) get an exact 0, where ``p_e − Σ α p`` leaves an ulp of ``|p|`` that
    the pullback multiplies by the features (float32 features near 1e19: gradients 1e25 off).

    If ``masked``, the last operand says whether the forward reduction kept the edge. As in the reference, a
    dropped edge still reads the statistics of the row its id gathers (its weight), but its ``g`` and ``R`` are
    zero (its output and the normaliser never saw it) and it attains no max.
    """

    base: EdgeFn
    centred: bool = False
    masked: bool = False
    top: bool = False

    @property
    def n_in(self) -> int:
        return self.base.n_in + 3 + (not self.top) + self.centred + self.masked

    def apply(self, rows, *, lanes=False):
        n = self.base.n_in
        m, l, g = rows[n:n + 3]
        # the scores and their rounding bound in one trace (`rounding.bound` runs ``base`` as it bounds it)
        (s, v), (bound, _) = rounding.bound(lambda *r: self.base.apply(list(r), lanes=lanes), *rows[:n])
        keep = rows[-1] if self.masked else None
        alpha, p, hit = _attention_terms(s, v, m, l, g, keep, bound)
        if self.top:
            return [jnp.where(hit, p, jnp.full((), -jnp.inf, p.dtype))]
        p = _centre(p, _kept(rows[n + 3], keep))
        if not self.centred:
            return [alpha * p]
        return [alpha * (p - _kept(rows[n + 4], keep)), hit.astype(alpha.dtype)]


@dataclasses.dataclass(frozen=True, eq=False)
class SoftmaxVjp(EdgeFn):
    """Per edge, the cotangents of ``base``'s operands at ``slots`` for the attention output's cotangent ``g_v``:
    ``base``'s pullback of ``(d_s, α_e g_v)`` with the score cotangent ``d_s = α_e (p_e − P_v − R_v) − [e attains
    the max] C_v / k_v`` formed before any sum (`SoftmaxRowDot` gives ``p``, ``P``, ``R``, ``C`` and ``k``).

    Subtracting ``C`` is the reverse of the tangent shift ``c`` (`jgnn.ops.tangent_shift`): jraph's backward
    passes the same row sum through its ``segment_max`` to the edges attaining the max, so the score
    cotangents of a row sum to zero up to rounding of their own size, not of ``|g| |V|``.

    Operands: ``base``'s, then the row's ``m``, ``l``, ``g``, ``P``, ``R``, ``C`` and ``k`` (and, if ``masked``, whether
    the forward reduction kept the edge, as for `SoftmaxRowDot`).
    """

    base: EdgeFn
    slots: tuple[int, ...]
    masked: bool = False

    @property
    def n_in(self) -> int:
        return self.base.n_in + 7 + self.masked

    def apply(self, rows, *, lanes=False):
        n = self.base.n_in
        m, l, g, pivot, r, c, k = rows[n:n + 7]
        (s, v), pull = jax.vjp(_moving(self.base, rows[:n], self.slots, lanes), *(rows[i] for i in self.slots))
        keep = rows[-1] if self.masked else None
        alpha, p, hit = _attention_terms(s, v, m, l, g, keep, _score_bound(self.base, rows[:n], lanes))
        share = jnp.where(hit, c / jnp.maximum(k, 1), jnp.zeros((), alpha.dtype))
        d_s = alpha * (_centre(p, _kept(pivot, keep)) - _kept(r, keep)) - share
        g = _kept(g, keep)
        return list(pull([d_s.astype(s.dtype), (_trail(alpha, v) * g).astype(v.dtype)]))


def _centre(p, pivot):
    """``p − P``, exactly 0 where ``p`` equals the pivot: a kernel may fuse the product ``p = g·V`` into the
    subtraction (a multiply-add, which skips rounding ``p``), and at ``|p|`` near 1e19 the edge that set the pivot
    got the product's rounding error, 1.2e11, as its score cotangent where the reference's is 0 (fuzz campaign
    20261400, float32 on ``pallas_interpret``). The exact 0 is ``z − stop_gradient(z)``, not a constant, as in
    `softmax_weight`: zero in value, it keeps the derivative that forward-over-reverse reads (a constant dropped the
    Hessian-vector product of tied duplicate edges carrying zero messages, jraph padding: campaign 20261700)."""
    z = p - pivot
    zero = jnp.where(jnp.isfinite(z), z - jax.lax.stop_gradient(z), jnp.zeros((), z.dtype))
    return jnp.where(p == pivot, zero, z)


def _kept(x, keep):
    """``x`` where the edge was kept, zero where it was dropped (``keep`` None: every edge was kept)."""
    if keep is None:
        return x
    keep = keep if keep.dtype == jnp.bool_ else keep != 0
    return jnp.where(_trail(keep, x), x, jnp.zeros((), x.dtype))


def _attention_terms(s, v, m, l, g, keep, bound):
    """``(α_e, p_e = g_v·V_e, e attains the max)``, with ``g`` zero and no max on edges ``keep`` drops; ``bound``
    is the scores' rounding bound (`snaps_to_max`)."""
    alpha = softmax_weight(s, m, l, bound)
    hit = attains_max(s, m)
    g, hit = _kept(g, keep), _kept(hit, keep)
    return alpha, _sum_to(g * v, np.shape(s), alpha.dtype), hit


def _sum_to(x, shape, dtype):
    """``x`` summed in ``dtype`` down to ``shape`` (axes beyond it, and axes where it has 1): an unbroadcast."""
    x = jnp.sum(x.astype(dtype), axis=tuple(range(len(shape), np.ndim(x))))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, np.shape(x), strict=True)) if a == 1 and b != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


@dataclasses.dataclass(frozen=True, eq=False)
class Pick(EdgeFn):
    """The outputs ``keep`` of ``base``."""

    base: EdgeFn
    keep: tuple[int, ...]

    @property
    def n_in(self) -> int:
        return self.base.n_in

    def apply(self, rows, *, lanes=False):
        outs = self.base.apply(rows, lanes=lanes)
        return [outs[i] for i in self.keep]


def _moving(base: EdgeFn, args, slots, lanes):
    """``base.apply`` as a function of the operands at ``slots`` (the others held at ``args``)."""

    def at(*moving):
        full = list(args)
        for k, x in zip(slots, moving, strict=True):
            full[k] = x
        return base.apply(full, lanes=lanes)

    return at


def _score_bound(base: EdgeFn, rows, lanes):
    """The rounding bound of ``base``'s first output, the scores (`jgnn.ops.rounding`; None if a primitive has no
    rule): a recomputed score is compared with the forward's max within it (`snaps_to_max`)."""
    return rounding.bound(lambda *r: base.apply(list(r), lanes=lanes)[0], *rows)[1][0]


def _jvp(base: EdgeFn, primals, slots, tangents, lanes):
    """``jax.jvp`` of ``base.apply`` in the operands at ``slots`` (the others held at ``primals``)."""
    return jax.jvp(_moving(base, primals, slots, lanes), tuple(primals[k] for k in slots), tuple(tangents))


@dataclasses.dataclass(frozen=True, eq=False)
class Zeroed(EdgeFn):
    """``base`` with the rows of some operands replaced by zeros on edges that a forward reduction dropped (ids
    out of range): the cotangent those edges got. The mask is the last operand (one bool per edge)."""

    base: EdgeFn
    positions: tuple[int, ...]

    @property
    def n_in(self) -> int:
        return self.base.n_in + 1

    def apply(self, rows, *, lanes=False):
        keep = rows[-1] if rows[-1].dtype == jnp.bool_ else rows[-1] != 0
        args = list(rows[:-1])
        for k in self.positions:
            args[k] = jnp.where(_trail(keep, args[k]), args[k], jnp.zeros((), args[k].dtype))
        return self.base.apply(args, lanes=lanes)


def softmax_weight(s, m, l, bound=None):
    """``exp(s − m) / l``: one edge's softmax weight from its row's max and normaliser (both saved per node, not
    a log-sum-exp: ``m + log l`` loses ``log l`` when ``m`` is large, e.g. −1e9 masks in float32).

    ``s`` is recomputed here, and a differently compiled recomputation misses the forward's max by a few ulps
    (the Pallas forward kernel sums tiles, XLA sums the array; either may fuse multiply-adds). At scores near 1e20
    an ulp is 1e13, and ``exp(±1e13)`` would turn the edge attaining the max into weight 0 or inf (the fuzzer
    found both). So where those ulps are wide in the exponent (`snaps_to_max`), a score within `MAX_ULPS` ulps
    of the max counts as attaining it: weight ``1 / l``. Where they are narrow, ``exp(s − m)`` is kept: a
    recomputation off by ``δ`` moves the weight by a factor ``exp(δ)`` only, and a distinct score a few ulps
    below the max keeps its own weight (snapping it gave bfloat16 scores 1–3 ulps apart near 10 equal weights: a
    gradient 16% off). The snapped exponent is ``z − stop_gradient(z)``, not a constant 0: zero in value, it keeps
    the derivative in ``s`` that second-order derivatives read. NaN passes.
    """
    return shifted_exp(s, m, bound) / l


def shifted_exp(s, m, bound=None):
    """``exp(s − m)``, with a score that `snaps_to_max` taken as attaining it (`softmax_weight`). The forward pass
    uses it too: XLA recomputes a score inside ``s − m`` with its last product fused (a multiply-add), and at
    scores near 1e19 the ulp that costs turned every edge of a row, the max's included, into ``exp(−1e12) = 0``:
    ``0 / 0``, and the row's output 0 where the reference's is −3.3e19 (campaign 20261205)."""
    z = s - m
    # only a finite exponent snaps: a score read against another row's max (a wrapped negative id) is infinitely
    # above an empty row's −inf, and exp(+inf) = inf, where z − z would make NaN (campaign 20261205)
    return jnp.exp(jnp.where(snaps_to_max(s, m, bound) & jnp.isfinite(z), z - jax.lax.stop_gradient(z), z))


# `attains_max` counts ulps of the dtype: a kernel's recomputed bfloat16 score misses the max by an ulp, and a tie
# it misses leaves the tangent shift uncentred (bfloat16 GAT tangents 8% off on pallas_interpret with float32 ulps,
# campaign 20261128); a false tie costs precision only. `snaps_to_max` changes a weight, so it counts ulps of the
# precision scores are computed in (float32 for bfloat16 and float16): a window of whole bfloat16 ulps snapped a
# score 2 ulps below a max near 2e19 (weight exp(−3e17) = 0) to weight 1, tangents 1e38 where the reference's
# are 2e19 (campaign 20261201).
MAX_ULPS = 4  # the fuzzer's GAT case with float32 scores near 1e20 misses by 3 ulps
# The widest window, in the exponent, within which a recomputed weight is left unsnapped: ``exp(±0.5)``.
SNAP_WIDTH = 0.5


def _window(s, m, *, computed: bool = False, bound=None):
    """``(m, MAX_ULPS ulps of m)``: ulps of ``s``'s dtype, or with ``computed`` of the precision it is computed in
    (float32, or float64 for float64). With the score's rounding ``bound`` (`jgnn.ops.rounding`), at least twice
    that: the forward's score and the recomputed one each round by up to it."""
    m = m.astype(s.dtype)
    eps = float(jnp.finfo(s.dtype).eps)
    if computed:
        eps = min(eps, float(jnp.finfo(jnp.float32).eps))
    width = MAX_ULPS * jnp.abs(m)
    if bound is not None:  # an overflowed bound (terms past the range) says nothing: the ulps of m stand
        bound = bound.astype(s.dtype)
        width = jnp.where(jnp.isfinite(bound), jnp.maximum(width, 2 * bound), width)
    return m, jnp.asarray(eps, s.dtype) * width


def attains_max(s, m):
    """Whether a recomputed score attains its row's saved max: within `MAX_ULPS` ulps of it, or above. It decides
    the ties that share the max's tangent (precision only: that shift cancels in exact arithmetic)."""
    m, width = _window(s, m)
    return s >= m - width


def snaps_to_max(s, m, bound=None):
    """Whether a recomputed score's softmax weight is taken as ``exp(0)`` (`softmax_weight`): it attains the max
    within `MAX_ULPS` ulps of float32 (of float64 for float64), or within twice its rounding ``bound`` where that
    is wider (a score whose terms cancel), and that window is wider than `SNAP_WIDTH` in the exponent (float32,
    bfloat16 and float16 beyond about 1e6, float64 beyond about 5e14, without a bound; always for an infinite
    max)."""
    m, width = _window(s, m, computed=True, bound=bound)
    return (s >= m - width) & (width > SNAP_WIDTH)


def out_avals(fn: EdgeFn, operand_avals: Sequence[jax.ShapeDtypeStruct], whole: Sequence[bool],
              rows: int) -> list[jax.ShapeDtypeStruct]:
    """Trailing shapes and dtypes of ``fn``'s outputs: ``[rows, ...]`` per output."""
    specs = [a if w else jax.ShapeDtypeStruct((rows,) + tuple(a.shape), a.dtype)
             for a, w in zip(operand_avals, whole, strict=True)]
    return list(jax.eval_shape(lambda *r: fn.apply(r), *specs))


@dataclasses.dataclass(frozen=True, eq=False)
class Batched(EdgeFn):
    """``base`` under ``vmap``: operand ``k`` carries a batch axis at ``axes[k]`` (1 for rows, 0 for a shared
    operand; None: not batched). Outputs carry it at ``out_axis`` (1 for rows, 0 for outputs without a row axis).
    """

    base: EdgeFn
    axes: tuple[int | None, ...]
    out_axis: int

    @property
    def n_in(self) -> int:
        return self.base.n_in

    def apply(self, rows, *, lanes=False):
        return list(jax.vmap(lambda *r: self.base.apply(r, lanes=lanes), in_axes=list(self.axes),
                             out_axes=self.out_axis)(*rows))


@dataclasses.dataclass(frozen=True, eq=False)
class Pruned(EdgeFn):
    """``base`` without the operands it never reads (``keep[k]`` False): zeros stand in for them, so an op that
    does not need an edge array does not take it, and a gradient does not keep it."""

    base: EdgeFn
    keep: tuple[bool, ...]
    shapes: tuple[jax.ShapeDtypeStruct, ...]  # trailing shape/dtype of every base operand
    whole: tuple[bool, ...]

    @property
    def n_in(self) -> int:
        return sum(self.keep)

    def apply(self, rows, *, lanes=False):
        it = iter(rows)
        with_rows = [x for x, k, w in zip(rows, [k for k in self.keep if k], [w for w, k in zip(
            self.whole, self.keep, strict=True) if k], strict=True) if not w]
        block = np.shape(with_rows[0])[0] if with_rows else None
        args = []
        for k, s, w in zip(self.keep, self.shapes, self.whole, strict=True):
            if k:
                args.append(next(it))
            elif lanes and with_rows:  # kernel tiles: every operand has the tile's shape
                args.append(jnp.zeros(np.shape(with_rows[0]), s.dtype))
            else:
                args.append(jnp.zeros(s.shape if w or block is None else (block,) + tuple(s.shape), s.dtype))
        return self.base.apply(compat.vary_like(args, rows), lanes=lanes)


def reads(fn: EdgeFn, shapes, whole, rows: int) -> list[bool]:
    """For each operand of ``fn``: whether its outputs depend on it (JAX's dead-code elimination of a trace)."""
    specs = [s if w else jax.ShapeDtypeStruct((rows,) + tuple(s.shape), s.dtype)
             for s, w in zip(shapes, whole, strict=True)]
    closed = jax.make_jaxpr(lambda *r: fn.apply(r))(*specs)
    used = compat.dce_reads(closed, len(specs))
    return [True] * len(specs) if used is None else used


@dataclasses.dataclass(frozen=True, eq=False)
class PyFn(EdgeFn):
    """A Python function of row blocks (``f(*rows) -> list``), row-polymorphic by construction."""

    f: Any
    arity: int

    @property
    def n_in(self) -> int:
        return self.arity

    def apply(self, rows, *, lanes=False):
        return list(self.f(*rows))
