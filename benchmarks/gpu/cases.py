"""Every kernel configuration the check compiles, each as jgnn runs it.

A reduction or attention case is ``value_and_grad`` of a `jgnn.message_passing` layer on ``backend="pallas"``:
its forward kernel and the kernels of its derivative, which jgnn's edge-op transposes run on the same forward
kernels (`pallas_kernels` has no backward of its own). ``gather_compute`` is its forward kernel alone (the
reductions' backward runs it too), and ``typed_matmul`` the kernel's ``value_and_grad``. Each configuration is a
`Case` whose ``build()`` returns the `Step` to compile; building makes the graph constants eagerly, so it must run
outside the abstract mesh that lowering uses.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import jraph
import numpy as np

import jgnn
import pallas_kernels as pk
from benchmarks.gpu.deviceless import Step
from jgnn.nn._utils import AttentionDropout

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
def _ids() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    senders, receivers = rng.integers(0, N, E), rng.integers(0, N - 2, E)  # two nodes without in-edges
    receivers[E - PADDING:] = N - 1  # jraph-style padding edges into the last node
    return senders.astype(np.int32), receivers.astype(np.int32)


def _graph(nodes: dict, edges: dict) -> jraph.GraphsTuple:
    senders, receivers = _ids()
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=jnp.asarray(senders), receivers=jnp.asarray(receivers),
                             n_node=jnp.array([N]), n_edge=jnp.array([E]), globals=None)


def _spec(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _grad_step(loss: Callable, *args) -> Step:
    """``value_and_grad`` of ``loss`` in every argument: the forward kernels and the derivative's."""
    return Step(jax.value_and_grad(loss, argnums=tuple(range(len(args)))), args)


def _gather_reduce(reduce: str, width: int, dtype: str) -> Step:
    def phi(src, dst, edge):
        return {"m": jnp.tanh(src["h"] * dst["h"]) + edge["w"] * src["a"]}

    layer = jgnn.message_passing(phi, lambda mb, node: {"agg": getattr(jgnn, reduce)(mb["m"])}, None,
                                 backend="pallas")

    def loss(h, a, w):
        out = layer(_graph({"h": h, "a": a}, {"w": w})).nodes["agg"]
        return jnp.sum(out.astype(jnp.float32))

    return _grad_step(loss, _spec((N, width), dtype), _spec((N, 1), dtype), _spec((E, width), dtype))


def _gather_compute(width: int, dtype: str) -> Step:
    fwd, _ = pk.build_csr_numpy(*_ids(), N)

    def compute(x, a, w):
        return pk.gather_compute_forward(lambda c, r, e, s: jnp.tanh(c[0] * r[0]) + e[0] * c[1], (x, a), (x,), (w,),
                                         (), fwd, num_edges=E)

    return Step(compute, (_spec((N, width), dtype), _spec((N, 1), dtype), _spec((E, width), dtype)))


def _attention(heads: int, width: int, dtype: str, dropout: float) -> Step:
    drop = AttentionDropout(jnp.int32(3), dropout) if dropout else None

    def phi(src, dst, edge):
        message = {"logit": jnp.sum(src["k"] * dst["k"], -1) + jax.nn.leaky_relu(edge["b"], 0.2), "value": src["v"]}
        if drop is not None:
            message["mask"] = drop.scale(edge, heads).astype(src["v"].dtype)
        return message

    def rho(mb, node):
        alpha = jgnn.softmax(mb["logit"])
        alpha = alpha * mb["mask"] if "mask" in mb else alpha
        return {"out": jgnn.sum(alpha[..., None] * mb["value"])}

    layer = jgnn.message_passing(phi, rho, None, backend="pallas")

    def loss(k, b, v):
        edges = {"b": b} if drop is None else {"b": b, **drop.edge_features(E)}
        return jnp.sum(layer(_graph({"k": k, "v": v}, edges)).nodes["out"].astype(jnp.float32) ** 2)

    node = _spec((N, heads, width), dtype)
    return _grad_step(loss, node, _spec((E, heads), dtype), node)


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
