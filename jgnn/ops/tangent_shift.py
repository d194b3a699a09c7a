"""``tangent_shift``: a shift that a JVP rule subtracts from tangents where it cancels, transposing to zero.

A softmax's tangent ``dα_e = α_e (ds_e − Σ α ds)`` is unchanged by shifting every ``ds_e`` of a row by the same
``c_v``: the shifts cancel because ``Σ_e α_e = 1``. The shift still matters in floating point. jraph's
``segment_softmax`` subtracts the row max, so its tangent subtracts the max's tangent ``dm_v``, and the edge
that attains the max contributes an exact zero. Without the shift, ``α ds − α Σ α ds`` cancels two values of
size ``|ds|`` and leaves an error of ``ε |ds|``, which grows to ``ε |ds| |V|`` in ``Σ dα V``: ``1e32`` instead
of ``−5e19`` for float32 features near ``1e19`` (found by the fuzzer).

The JVP rules of `jgnn.ops.softmax` and of the softmax edge op compute ``c_v`` from the tangents (the max's
tangent as JAX's ``segment_max`` rule gives it: the tangents summed over the edges attaining the max, divided by
their number) with this primitive. As a map from the tangents the composite does not depend on ``c``, so the
transpose is zero: ``grad`` never computes ``c``, nor pays for it. A zero transpose is wrong for the division
in isolation; it is right only inside those rules.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts

tangent_shift_p = jcore.Primitive("jgnn_tangent_shift")


def tangent_shift(total, count, top=None):
    """``total / max(count, 1)``: a mean tangent per row, whose transpose is zero (see module docstring).

    With ``top`` (the largest of the tangents summed into ``total``), ``top`` itself wherever it and the mean are
    finite and ``count > 0``: it is one of the row's tangents bit for bit, so ties whose tangents are equal
    (duplicate edges) centre to exactly 0, where the rounded mean leaves an ulp of ``|ds|`` that ``Σ dα V``
    multiplies by ``|V|`` (float32 features near 1e19: 3e25 where the true tangent is 4e18). Where the mean is not
    finite (an infinite or NaN tangent at the max, or a sum that overflows) it stays the shift, as the reference's;
    so it does where ``top`` is −inf though ``count > 0`` (seen on ``pallas_interpret``: the two ops recompute the
    scores, and apparently only the counting one saw a tie at the max)."""
    args = (total, count) if top is None else (total, count, top)
    return tangent_shift_p.bind(*compat.match_vma(args))


def _impl(total, count, top=None):
    mean = total / jnp.maximum(count, 1).astype(total.dtype)
    if top is None:
        return mean
    return jnp.where(jnp.isfinite(mean) & (count > 0) & jnp.isfinite(top), top, mean)


def _jvp(primals, tangents):
    total, count, *top = primals  # the count of ties is piecewise constant
    d_total, _, *d_top = tangents
    out = tangent_shift(*primals)
    if type(d_total) is ad.Zero:
        return out, compat.zero_tangent(out)
    return out, tangent_shift(d_total, count, *(ad.instantiate_zeros(d) for d in d_top))


def _transpose(ct, *args):
    return [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None for x in args]


def _batch(args, dims):
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not compat.not_mapped)
    return tangent_shift(*(batching.bdim_at_front(x, d, size) for x, d in zip(args, dims, strict=True))), 0


tangent_shift_p.def_impl(_impl)
tangent_shift_p.def_abstract_eval(lambda total, *rest: compat.shaped_like(total.shape, total.dtype, [total, *rest]))
mlir.register_lowering(tangent_shift_p, mlir.lower_fun(_impl, multiple_results=False))
ad.primitive_jvps[tangent_shift_p] = _jvp
ad.primitive_transposes[tangent_shift_p] = _transpose
batching.primitive_batchers[tangent_shift_p] = _batch
facts.register(tangent_shift_p, facts.of(lax.div_p))  # row-wise and elementwise, like a division
