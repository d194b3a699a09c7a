"""Test helpers shared by the kernel test files: awkward random graphs, tolerances, assertions.

Lives in the package (not tests/) so several test modules can import it without a shared conftest.
Tolerances are relative per dtype: kernels accumulate in float32 (float64 for float64 operands) like the
references but in another order -> 1e-4 (grads 2e-4); float64 -> 1e-10; outputs rounded to bfloat16 (8
mantissa bits) -> 3e-2 (grads 5e-2), to float16 (11 bits) -> 4e-3 (grads 8e-3).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.csr import build_csr_jax, build_csr_numpy

TOL = {jnp.float32: dict(atol=1e-4, rtol=1e-4), jnp.bfloat16: dict(atol=3e-2, rtol=3e-2),
       jnp.float16: dict(atol=4e-3, rtol=4e-3), jnp.float64: dict(atol=1e-10, rtol=1e-10)}
GTOL = {jnp.float32: dict(atol=2e-4, rtol=2e-4), jnp.bfloat16: dict(atol=5e-2, rtol=5e-2),
        jnp.float16: dict(atol=8e-3, rtol=8e-3), jnp.float64: dict(atol=1e-10, rtol=1e-10)}


def make_graph(rng, num_nodes=24, num_edges=60, hub=200, dups=8, pads=10, isolated=4, builder="numpy",
               segment_slots=None):
    """(senders, receivers, valid, fwd CSR, rev CSR). Nodes >= num_nodes - isolated get no in-edges."""
    recv_hi = num_nodes - isolated
    s = rng.integers(0, num_nodes, num_edges)
    r = rng.integers(0, recv_hi, num_edges)
    hub_s = rng.integers(0, num_nodes, hub)
    s = np.concatenate([s, hub_s, s[:dups], np.zeros(pads, int)])
    r = np.concatenate([r, np.full(hub, 1), r[:dups], np.zeros(pads, int)])
    valid = np.concatenate([np.ones(num_edges + hub + dups, bool), np.zeros(pads, bool)])
    perm = rng.permutation(len(s))
    s, r, valid = s[perm], r[perm], valid[perm]
    build = build_csr_numpy if builder == "numpy" else build_csr_jax
    fwd, rev = build(s, r, num_nodes, valid, segment_slots=segment_slots)
    fwd, rev = jax.tree.map(jnp.asarray, fwd), jax.tree.map(jnp.asarray, rev)
    return s, r, valid, fwd, rev


def rand(rng, shape, dtype):
    return jnp.asarray(rng.normal(size=shape), jnp.float32).astype(dtype)


def assert_finite(*xs):
    for x in jax.tree.leaves(xs):
        assert bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))), "unwritten (NaN-poisoned) or non-finite output"


def assert_close(a, b, tol):
    """Equal within ``tol``, NaN where the other is NaN (float64 compared in float64)."""
    wide = jnp.float64 if a.dtype == jnp.float64 else jnp.float32
    np.testing.assert_allclose(np.asarray(a.astype(wide)), np.asarray(b.astype(wide)), **tol)


def grads(f, args, cot):
    return jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * cot), argnums=tuple(range(len(args))))(*args)


def f32(args):
    """The reference runs on float32 copies (float64 stays): differentiating it at bfloat16 would accumulate
    the transposed gathers (scatter-adds) in bfloat16, which is less exact than the kernels' float32."""
    return tuple(x if x.dtype == jnp.float64 else x.astype(jnp.float32) for x in args)
