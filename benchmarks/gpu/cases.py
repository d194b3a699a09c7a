"""Every kernel configuration the check compiles: each kernel's ``value_and_grad``, so its backward kernels too.

Built from the public functions of `pallas_kernels` only. Each configuration is a `Case` whose ``build()``
returns the `Step` to compile; building makes the CSR constants eagerly, so it must run outside the abstract
mesh that lowering uses.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels as pk
from benchmarks.gpu.deviceless import Step

WIDTHS = (1, 7, 41, 64, 602)
DTYPES = ("float32", "bfloat16", "float16")
HEADS = (1, 4, 8)
REDUCTIONS = ("sum", "mean", "max", "min")
DROPOUT = (0.0, 0.2)
TYPES = 3  # typed matmul: relation count, one of them empty

N, E, PADDING = 64, 256, 8  # nodes, edges, trailing invalid (padding) edges


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    params: dict = field(compare=False)
    build: Callable[[], Step] = field(compare=False, repr=False)
    kind: str = "kernel"


@functools.cache
def _csr() -> tuple[pk.CSR, pk.CSR]:
    rng = np.random.default_rng(0)
    senders, receivers = rng.integers(0, N, E), rng.integers(0, N - 2, E)  # two nodes without in-edges
    return pk.build_csr_jax(senders, receivers, N, np.arange(E) < E - PADDING)


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _edge_fn(S, D, E_):
    return jnp.tanh(S[0] * D[0]) + E_[0] * S[1]


def _score_fn(S, D, E_):
    return jnp.sum(S[0] * D[0], axis=-1) + jax.nn.leaky_relu(E_[0], 0.2)


def _grad_step(loss: Callable, *args) -> Step:
    """``value_and_grad`` of ``loss`` in every argument: the forward kernel and each backward walk."""
    return Step(jax.value_and_grad(loss, argnums=tuple(range(len(args)))), args)


def _gather_reduce(reduce: str, width: int, dtype: str) -> Step:
    fwd, rev = _csr()

    def loss(x, a, w):
        return jnp.sum(pk.gather_reduce(_edge_fn, (x, a), (x,), (w,), fwd, rev, reduce=reduce).astype(jnp.float32))

    return _grad_step(loss, _spec((N, width), dtype), _spec((N, 1), dtype), _spec((E, width), dtype))


def _gather_compute(width: int, dtype: str) -> Step:
    fwd, rev = _csr()

    def loss(x, a, w):
        return jnp.sum(pk.gather_compute(_edge_fn, (x, a), (x,), (w,), fwd, rev).astype(jnp.float32) ** 2)

    return _grad_step(loss, _spec((N, width), dtype), _spec((N, 1), dtype), _spec((E, width), dtype))


def _attention(heads: int, width: int, dtype: str, dropout: float) -> Step:
    fwd, rev = _csr()
    seed = jnp.int32(3) if dropout else None

    def loss(k, q, logits, values):
        out = pk.attention_aggregate(_score_fn, (k,), (q,), (logits,), values, fwd, rev, value_index="src",
                                     dropout_rate=dropout, dropout_seed=seed)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    node = _spec((N, heads, width), dtype)
    return _grad_step(loss, node, node, _spec((E, heads), dtype), node)


def _typed_matmul(width: int, dtype: str, gather: bool) -> Step:
    sizes = jnp.array([20, 0, 36], jnp.int32)  # 56 of the rows typed; the rest stay 0
    gather_idx = (jnp.arange(60, dtype=jnp.int32) * 7) % N if gather else None

    def loss(x, w):
        return jnp.sum(pk.typed_matmul(x, w, sizes, gather_idx=gather_idx, impl="pallas").astype(jnp.float32) ** 2)

    return _grad_step(loss, _spec((N, width), dtype), _spec((TYPES, width, width), dtype))


def _short(dtype: str) -> str:
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]


def kernel_cases() -> list[Case]:
    """Every kernel configuration, in a stable order."""
    widths, heads = WIDTHS, HEADS
    cases = []
    for reduce, w, dt in itertools.product(REDUCTIONS, widths, DTYPES):
        cases.append(Case(f"gather_reduce/{reduce}/w{w}/{_short(dt)}", "gather_reduce",
                          dict(reduce=reduce, width=w, dtype=dt), functools.partial(_gather_reduce, reduce, w, dt)))
    for w, dt in itertools.product(widths, DTYPES):
        cases.append(Case(f"gather_compute/w{w}/{_short(dt)}", "gather_compute", dict(width=w, dtype=dt),
                          functools.partial(_gather_compute, w, dt)))
    for h, w, dt, p in itertools.product(heads, widths, DTYPES, DROPOUT):
        cases.append(Case(f"attention/h{h}/w{w}/{_short(dt)}/drop{p:g}", "attention",
                          dict(heads=h, width=w, dtype=dt, dropout=p), functools.partial(_attention, h, w, dt, p)))
    for w, dt, g in itertools.product(widths, DTYPES, (False, True)):
        cases.append(Case(f"typed_matmul/w{w}/{_short(dt)}/{'gather' if g else 'rows'}", "typed_matmul",
                          dict(width=w, dtype=dt, gather=g), functools.partial(_typed_matmul, w, dt, g)))
    return cases
