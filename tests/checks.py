"""Comparisons against the reference: relative tolerances per dtype, NaN/inf positions exact, forward, reverse
(``grad``) and forward mode (``jvp``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Relative tolerance per dtype, and the absolute floor near zero (sums of many terms lose relative accuracy).
TOLERANCE = {
    np.dtype(np.float64): (1e-10, 1e-12),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(jnp.bfloat16): (2e-2, 2e-2),
    np.dtype(np.float16): (5e-3, 5e-3),
    np.dtype(np.complex64): (1e-5, 1e-6),
}


def x64():
    """A context with float64 enabled (``jax.enable_x64(True)``; ``jax.experimental.enable_x64()`` before)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    return jax.experimental.enable_x64()  # pragma: no cover - older JAX


def assert_close(got, want, *, dtype=None, what: str = "", terms: int = 1) -> None:
    """Equal NaN and ±inf positions, and finite values within the dtype's relative tolerance.

    ``terms``: how many unit-scale products each value sums; the absolute floor grows with it, as rounding error
    does (a sum that cancels to near zero keeps the error of its terms)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if np.issubdtype(want.dtype, np.integer) or want.dtype == bool:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    rtol, atol = TOLERANCE[np.dtype(dtype or want.dtype)]
    atol *= terms
    g, w = got.astype(np.complex128 if np.iscomplexobj(want) else np.float64), want.astype(
        np.complex128 if np.iscomplexobj(want) else np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: NaN positions differ")
    for sign in (1, -1):
        np.testing.assert_array_equal(np.isinf(g) & (np.real(g) * sign > 0), np.isinf(w) & (np.real(w) * sign > 0),
                                      err_msg=f"{what}: inf positions differ")
    finite = np.isfinite(w)
    np.testing.assert_allclose(g[finite], w[finite], rtol=rtol, atol=atol, err_msg=what)


def tree_close(got, want, *, dtype=None, what: str = "", terms: int = 1) -> None:
    leaves_g, leaves_w = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    keep = lambda xs: [x for x in xs if np.asarray(x).dtype != jax.dtypes.float0]  # integer inputs' "gradients"
    leaves_g, leaves_w = keep(leaves_g), keep(leaves_w)
    assert len(leaves_g) == len(leaves_w), f"{what}: {len(leaves_g)} leaves != {len(leaves_w)}"
    for i, (g, w) in enumerate(zip(leaves_g, leaves_w, strict=True)):
        assert_close(g, w, dtype=dtype, what=f"{what}[{i}]", terms=terms)


def check_against_reference(compiled, reference, *args, seed: int = 0, dtype=None, jit: bool = True,
                            grad: bool = True, jvp: bool = True, terms: int = 1) -> None:
    """``compiled(*args)`` against ``reference(*args)``: values, ``grad`` of a random projection of the outputs
    w.r.t. every floating argument, and ``jvp`` along random tangents."""
    run = jax.jit(compiled) if jit else compiled
    want = reference(*args)
    tree_close(run(*args), want, dtype=dtype, what="forward", terms=terms)
    floats = [i for i, a in enumerate(args) if any(
        jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact) for x in jax.tree_util.tree_leaves(a))]
    if not floats:
        return
    rng = np.random.default_rng(seed)
    cot = jax.tree_util.tree_map(
        lambda x: jnp.asarray(rng.normal(size=np.shape(x)), x.dtype) if jnp.issubdtype(x.dtype, jnp.inexact)
        else None, want)

    def projected(fn):
        def loss(*xs):
            out = fn(*xs)
            parts = [jnp.sum((o * c).astype(jnp.float32 if o.dtype != jnp.float64 else jnp.float64))
                     for o, c in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(cot), strict=True)
                     if c is not None]
            return sum(parts)
        return loss

    if grad:
        g_run = jax.grad(projected(compiled), argnums=floats, allow_int=True)
        g_run = jax.jit(g_run) if jit else g_run
        g_ref = jax.grad(projected(reference), argnums=floats, allow_int=True)
        tree_close(g_run(*args), g_ref(*args), dtype=dtype, what="grad", terms=terms)
    if jvp:
        tangents = [jax.tree_util.tree_map(
            lambda x: jnp.asarray(rng.normal(size=np.shape(x)), x.dtype) if jnp.issubdtype(x.dtype, jnp.inexact)
            else np.zeros(np.shape(x), jax.dtypes.float0), a) for a in args]
        j_run = (lambda *a: jax.jvp(compiled, a, tuple(tangents))[1])
        j_run = jax.jit(j_run) if jit else j_run
        tree_close(j_run(*args), jax.jvp(reference, tuple(args), tuple(tangents))[1], dtype=dtype, what="jvp",
                   terms=terms)
