"""First-order rounding-error bounds of a computation, in units of its precision's epsilon.

`bound(fn, *args)` runs ``fn`` and, beside each float output ``y``, a bound ``b`` such that ``fn`` evaluated in
any order and with any contraction of products into sums (a multiply-add) differs from ``y`` by at most about
``eps · b``. The derivative ops of a softmax recompute its scores and compare them with the max the forward
pass saved (`jgnn.ops.edge_fn.snaps_to_max`); two compilations of a score that cancels (terms near 1e20 summing
to 1e18) differ by ulps of the terms, not of the score, and only this bound says how far apart they may be.

Rules are kept in a table keyed by the primitive, each ``rule(ins, in_bounds, outs, **params) -> out_bounds``.
Inputs are exact (bound 0). A primitive without a rule gives ``None``, and so does everything computed from it:
the caller then falls back to ulps of the value itself.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from jgnn import compat

Rule = Callable[..., list]
RULES: dict[object, Rule] = {}


def _rounded(out, *terms):
    """The bounds ``terms`` carried in, plus this op's own rounding of its output (one ulp of it)."""
    return sum(terms, jnp.abs(out))


def _bind(prim, params, args) -> list:
    """``prim`` bound as ``jax.core.eval_jaxpr`` binds it, its results as a list."""
    out = compat.bind(prim, params, args)
    return list(out) if prim.multiple_results else [out]


def _structural(prim):
    """A primitive that only moves, copies or picks values: it moves the bounds the same way."""
    return lambda ins, bounds, outs, **params: _bind(prim, params, bounds)


for _p in (lax.reshape_p, lax.broadcast_in_dim_p, lax.squeeze_p, lax.transpose_p, lax.slice_p,
           lax.concatenate_p, lax.rev_p, lax.copy_p, lax.reduce_max_p, lax.reduce_min_p):
    RULES[_p] = _structural(_p)
RULES[lax.abs_p] = lambda ins, bounds, outs, **_: [bounds[0]]
RULES[lax.neg_p] = RULES[lax.abs_p]  # exact: a bound is a magnitude, so it keeps its sign
RULES[lax.sign_p] = lambda ins, bounds, outs, **_: [jnp.zeros_like(outs[0])]
RULES[lax.select_n_p] = lambda ins, bounds, outs, **_: [lax.select_n(ins[0], *bounds[1:])]
RULES[lax.add_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], *bounds)]
RULES[lax.sub_p] = RULES[lax.add_p]
RULES[lax.mul_p] = lambda ins, bounds, outs, **_: [
    _rounded(outs[0], jnp.abs(ins[1]) * bounds[0], jnp.abs(ins[0]) * bounds[1])]
RULES[lax.div_p] = lambda ins, bounds, outs, **_: [
    _rounded(outs[0], (bounds[0] + jnp.abs(outs[0]) * bounds[1]) / jnp.abs(ins[1]))]
RULES[lax.max_p] = lambda ins, bounds, outs, **_: [jnp.maximum(*bounds)]
RULES[lax.min_p] = RULES[lax.max_p]
RULES[lax.exp_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], jnp.abs(outs[0]) * bounds[0])]
RULES[lax.expm1_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], jnp.abs(outs[0] + 1) * bounds[0])]
RULES[lax.log1p_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], bounds[0] / jnp.abs(ins[0] + 1))]
RULES[lax.sqrt_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], bounds[0] / (2 * outs[0]))]
RULES[lax.tanh_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], (1 - outs[0] * outs[0]) * bounds[0])]
RULES[lax.logistic_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], outs[0] * (1 - outs[0]) * bounds[0])]
RULES[lax.log_p] = lambda ins, bounds, outs, **_: [_rounded(outs[0], bounds[0] / jnp.abs(ins[0]))]
RULES[lax.integer_pow_p] = lambda ins, bounds, outs, y, **_: [
    _rounded(outs[0], abs(y) * lax.integer_pow(jnp.abs(ins[0]), y - 1) * bounds[0])]
# from an integer or a bool (no bound of its own): one rounding of the converted value
RULES[lax.convert_element_type_p] = lambda ins, bounds, outs, **params: [
    _rounded(outs[0], *([] if bounds[0] is None else [bounds[0].astype(outs[0].dtype)]))]


def _reduce_sum(ins, bounds, outs, *, axes, **params):
    """A sum of ``n`` terms, in any order: each partial sum rounds, at most ``n`` times the terms' magnitude."""
    n = int(np.prod([np.shape(ins[0])[a] for a in axes]))
    return [_rounded(outs[0], lax.reduce_sum_p.bind(bounds[0] + n * jnp.abs(ins[0]), axes=axes, **params))]


def _dot_general(ins, bounds, outs, *, dimension_numbers, **params):
    """``Σ_k a_k b_k`` over ``n`` terms: the terms' own bounds, and ``n`` ulps of their magnitudes' sum."""
    (contract, _), _ = dimension_numbers
    n = int(np.prod([np.shape(ins[0])[a] for a in contract]))
    a, b = ins
    dot = lambda x, y: lax.dot_general_p.bind(x, y, dimension_numbers=dimension_numbers, **params)
    return [_rounded(outs[0], dot(bounds[0], jnp.abs(b)), dot(jnp.abs(a), bounds[1]), n * dot(jnp.abs(a), jnp.abs(b)))]


RULES[lax.reduce_sum_p] = _reduce_sum
RULES[lax.dot_general_p] = _dot_general


def _call(prim):
    """A call of an inner jaxpr (``jit``, ``custom_jvp_call``, ...): its rules, applied inside. The callee is found
    as jgnn's IR finds it (`jgnn.compat`), whatever this JAX version names its param."""

    def rule(ins, bounds, outs, **params):
        callee = params[compat.INLINED_CALLS[prim]] if prim in compat.INLINED_CALLS else compat.custom_body(params)
        closed = callee if isinstance(callee, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(callee, ())
        return _eval(closed.jaxpr, closed.consts, ins, bounds)[1]

    return rule


for _p in compat.CALLS:
    RULES[_p] = _call(_p)


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _eval(jaxpr, consts, args, arg_bounds):
    """``jaxpr``'s outputs and their bounds (None where a primitive without a rule contributed)."""
    env, benv = {}, {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    def read_bound(v):
        if isinstance(v, jcore.Literal):
            return jnp.zeros_like(v.val) if _is_float(v.val) else None
        return benv.get(v)

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v], benv[v] = x, jnp.zeros_like(x) if _is_float(x) else None
    for v, x, b in zip(jaxpr.invars, args, arg_bounds, strict=True):
        env[v], benv[v] = x, b
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        outs = _bind(eqn.primitive, eqn.params, ins)
        in_bounds = [read_bound(v) if _is_float(x) else None for v, x in zip(eqn.invars, ins, strict=True)]
        rule = RULES.get(eqn.primitive)
        known = all(b is not None for b, x in zip(in_bounds, ins, strict=True) if _is_float(x))
        if rule is None or not known or not any(_is_float(y) for y in outs):
            bounds = [None] * len(outs)
        else:
            bounds = rule(ins, in_bounds, outs, **eqn.params)
        for v, y, b in zip(eqn.outvars, outs, bounds, strict=True):
            env[v], benv[v] = y, b
    return [read(v) for v in jaxpr.outvars], [read_bound(v) for v in jaxpr.outvars]


def bound(fn: Callable, *args) -> tuple[list, list]:
    """``fn(*args)``'s outputs (a flat list) and, for each float output, its rounding bound in units of eps (None
    where a primitive without a rule contributed). The arguments are taken as exact."""
    closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree_util.tree_leaves(args)
    zeros = [jnp.zeros_like(x) if _is_float(x) else None for x in flat]
    return _eval(closed.jaxpr, closed.consts, flat, zeros)
