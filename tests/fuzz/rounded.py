"""The *rounded* oracle: the reference program with every operation computed in float64 and its result rounded
once to the dtype the program gave it.

The float64 oracle (`checker.Oracle`) never rounds, so it cannot say what a low-precision program overflows to. A
float16 ``segment_sum(m) / count`` of a hub's huge features is 6,804 in float64, but its sum, 7.1e6, is past
float16's range: the reference's float16 partial sums overflow both ways (NaN), and jgnn, which accumulates in
float32 and rounds the sum once, gives +inf. Run op by op (`jax.disable_jit`), the reference gives NaN again:
XLA's float16 reduction is not one rounding. Here each primitive is one rounding, so the sum is +inf and the
mean +inf: the answer of the program in its own dtype with each operation correctly rounded. The checker asks it
only where the reference overflowed to NaN and a backend has ±inf (`checker.compare_leaf`).

A primitive whose float64 evaluation the bind rejects (control flow over low-precision carries, bit casts) runs
on its operands as they are, in the program's dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.extend import core as jcore

# Floating dtypes computed in the wide dtype, and what that is.
WIDE = {np.dtype(np.float16): np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16): np.dtype(np.float64),
        np.dtype(np.float32): np.dtype(np.float64), np.dtype(np.complex64): np.dtype(np.complex128)}
# Call-like primitives, by name, and the parameter holding the program they call on all their operands: this
# interpreter evaluates it, one primitive at a time (a loop or a reduction's body is not such a call).
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
         "remat": "jaxpr", "checkpoint": "jaxpr"}


def _wide_dtype(value):
    try:
        return WIDE.get(np.dtype(value), value)
    except TypeError:
        return value


def _wide_combiner(jaxpr: jcore.Jaxpr) -> jcore.Jaxpr:
    """A scatter's scalar combiner (``update_jaxpr``: ``add`` for ``scatter-add``), retraced on wide scalars."""
    avals = [jax.ShapeDtypeStruct(v.aval.shape, _wide_dtype(v.aval.dtype)) for v in jaxpr.invars]
    return jax.make_jaxpr(jcore.jaxpr_as_fun(jcore.ClosedJaxpr(jaxpr, [])))(*avals).jaxpr


def _wide_param(name: str, value):
    """A dtype parameter (``convert_element_type``'s ``new_dtype``, ``dot_general``'s ``preferred_element_type``)
    or a scatter's combiner, widened as the operands are; the result is rounded to the output's dtype after."""
    if name == "update_jaxpr" and isinstance(value, jcore.Jaxpr):
        return _wide_combiner(value)
    return _wide_dtype(value) if isinstance(value, np.dtype | type) else value


def _sub_program(eqn):
    sub = eqn.params.get(CALLS.get(eqn.primitive.name, ""))
    if isinstance(sub, jcore.ClosedJaxpr):
        return sub.jaxpr, sub.consts
    if isinstance(sub, jcore.Jaxpr):
        return sub, ()
    return None


def _bind_wide(eqn, args):
    wide = [x.astype(WIDE[x.dtype]) if x.dtype in WIDE else x for x in map(jnp.asarray, args)]
    try:
        out = eqn.primitive.bind(*wide, **{k: _wide_param(k, v) for k, v in eqn.params.items()})
    except Exception:  # noqa: BLE001 - the primitive does not take wide operands: as the program wrote it
        out = eqn.primitive.bind(*args, **eqn.params)
    return out if eqn.primitive.multiple_results else [out]


def eval_jaxpr(jaxpr: jcore.Jaxpr, consts, *args, observe=None) -> list:
    """``jaxpr``'s outputs, each primitive computed wide and rounded to its output's dtype (module docstring).
    ``observe``, if given, sees each primitive's result before it is rounded."""
    env = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for eqn in jaxpr.eqns:
        args_in = [read(v) for v in eqn.invars]
        sub = _sub_program(eqn)
        outs = eval_jaxpr(sub[0], sub[1], *args_in, observe=observe) if sub is not None else _bind_wide(eqn, args_in)
        for v, o in zip(eqn.outvars, outs, strict=True):
            o = jnp.asarray(o)
            if observe is not None and sub is None:
                observe(o)
            env[v] = o.astype(v.aval.dtype) if o.dtype in WIDE.values() and o.dtype != v.aval.dtype else o
    return [read(v) for v in jaxpr.outvars]


def _run(fn, args, observe=None):
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    with jax.enable_x64(True), jax.disable_jit():
        outs = eval_jaxpr(closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args), observe=observe)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)


def evaluate(fn, *args):
    """``fn(*args)``, every operation rounded once (module docstring); ``fn`` is traced with ``args``."""
    return _run(fn, args)


def largest(fn, *args) -> float:
    """The largest finite magnitude that any operation of ``fn(*args)`` computes, each computed wide before it is
    rounded (so a float32 value past float32's range counts as its float64 size, not as inf)."""
    most = [0.0]

    def observe(o):
        if jnp.issubdtype(o.dtype, jnp.inexact):
            a = np.abs(np.asarray(o))
            most[0] = max(most[0], float(a[np.isfinite(a)].max(initial=0)))

    _run(fn, args, observe)
    return most[0]
