"""Non-interpreted (Triton) runs of every kernel on a power-law graph with a ~23k in-degree hub; skipped
without a GPU. Forward entry points against their references (host and traced CSRs, so split rows and the
combine kernel run), and jgnn's gradients on those kernels against the reference program's."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest

import jgnn
import pallas_kernels as pk

pytestmark = pytest.mark.gpu

N, E = 5000, 60000
TOL = dict(atol=2e-3, rtol=2e-3)  # float32 sums of up to ~23k terms in another order


def _graph(seed, builder=pk.build_csr_jax):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, N, E)
    r = np.minimum(rng.zipf(1.5, E), N - 10) - 1  # power-law in-degree: real hubs
    valid = rng.random(E) > 0.02
    return rng, builder(s, r, N, valid)


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **TOL)


def _rand(rng, shape, scale=1.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def _edge_fn(C, R, E_, S):
    return jnp.tanh(C[0] * R[0]) + E_[0] * C[1] + S[0]


@pytest.mark.parametrize("builder", [pk.build_csr_jax, pk.build_csr_numpy])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width", [7, 64, 602])
def test_gather_reduce_forward_gpu(reduce, width, builder):
    rng, (fwd, _) = _graph(width, builder)
    ops = ((_rand(rng, (N, width)), _rand(rng, (N, 1))), (_rand(rng, (N, width)),), (_rand(rng, (E, width)),),
           (_rand(rng, (1, width)),))
    out = jax.jit(lambda *o: pk.gather_reduce_forward(_edge_fn, *o, fwd, reduce=reduce))(*ops)
    _close(out, pk.gather_reduce_forward_reference(_edge_fn, *ops, fwd, reduce=reduce))


def test_gather_compute_forward_gpu():
    rng, (fwd, _) = _graph(1)
    ops = ((_rand(rng, (N, 41)), _rand(rng, (N, 1))), (_rand(rng, (N, 41)),), (_rand(rng, (E, 41)),), ())
    fn = lambda C, R, E_, S: jnp.tanh(C[0] * R[0]) + E_[0] * C[1]
    out = jax.jit(lambda *o: pk.gather_compute_forward(fn, *o, fwd, num_edges=E))(*ops)
    _close(out, pk.gather_compute_forward_reference(fn, *ops, fwd, num_edges=E))


@pytest.mark.parametrize("heads,dim,rate", [(4, 32, 0.0), (8, 8, 0.2), (8, 602, 0.0)])
def test_attention_forward_gpu(heads, dim, rate):
    rng, (fwd, _) = _graph(heads)
    ops = ((_rand(rng, (N, heads, 16), 0.3), _rand(rng, (N, heads, dim))), (_rand(rng, (N, heads, 16), 0.3),),
           (_rand(rng, (E, heads)),), ())
    fn = lambda C, R, E_, S: (jnp.sum(C[0] * R[0], axis=-1) + E_[0], C[1])
    kw = dict(heads=heads, dropout_rate=rate, dropout_seed=11 if rate else None)
    got = jax.jit(lambda *o: pk.attention_forward(fn, *o, fwd, **kw))(*ops)
    for a, b in zip(got, pk.attention_forward_reference(fn, *ops, fwd, **kw), strict=True):
        _close(a, b)


def _check_grads(kern, ref, args):
    out = jax.jit(kern)(*args)
    _close(out, ref(*args))
    cot = jnp.ones(out.shape, jnp.float32) * 0.01
    gk = jax.jit(jax.grad(lambda *a: jnp.sum(kern(*a) * cot), argnums=tuple(range(len(args)))))(*args)
    gr = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=tuple(range(len(args))))(*args)
    for p, q in zip(gk, gr, strict=True):
        _close(p, q)


BACKEND = "pallas"  # the jgnn backend whose gradients are checked (tests set "pallas_interpret" to try this file)


def _jraph_graph(seed, nodes: dict, edges: dict):
    """The power-law graph of `_graph` as a GraphsTuple, its 2% invalid edges pointing at a padding node."""
    rng = np.random.default_rng(seed)
    s, r = rng.integers(0, N, E), np.minimum(rng.zipf(1.5, E), N - 10) - 1
    r = np.where(rng.random(E) > 0.02, r, N - 1)
    return rng, jraph.GraphsTuple(nodes=nodes(rng), edges=edges(rng), senders=jnp.asarray(s, jnp.int32),
                                  receivers=jnp.asarray(r, jnp.int32), n_node=jnp.array([N]), n_edge=jnp.array([E]),
                                  globals=None)


def _check_layer_grads(phi, rho, graph):
    """jgnn's gradient on ``BACKEND`` (its edge ops' transposes on the kernels) against the reference program's."""
    def loss(backend, nodes, edges):
        out = jgnn.message_passing(phi, rho, None, backend=backend)(graph._replace(nodes=nodes, edges=edges))
        return jnp.sum(jax.tree.leaves(out.nodes)[0] * 0.01)

    got = jax.jit(jax.grad(functools.partial(loss, BACKEND), argnums=(0, 1)))(graph.nodes, graph.edges)
    want = jax.grad(functools.partial(loss, "reference"), argnums=(0, 1))(graph.nodes, graph.edges)
    for p, q in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _close(p, q)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_reduction_gradient_gpu(reduce):
    _, graph = _jraph_graph(2, lambda rng: {"h": _rand(rng, (N, 64)), "a": _rand(rng, (N, 1))},
                            lambda rng: {"w": _rand(rng, (E, 64))})
    phi = lambda src, dst, edge: {"m": jnp.tanh(src["h"] * dst["h"]) + edge["w"] * src["a"]}
    _check_layer_grads(phi, lambda mb, node: {"agg": getattr(jgnn, reduce)(mb["m"])}, graph)


@pytest.mark.parametrize("value_at", ["src", "edge"])
def test_attention_gradient_gpu(value_at):
    heads, dk, dim = 4, 16, 16
    _, graph = _jraph_graph(4, lambda rng: {"k": _rand(rng, (N, heads, dk), 0.3), "v": _rand(rng, (N, heads, dim))},
                            lambda rng: {"b": _rand(rng, (E, heads)), "v": _rand(rng, (E, heads, dim))})
    phi = lambda src, dst, edge: {"s": jnp.sum(src["k"] * dst["k"], -1) + edge["b"],
                                  "v": src["v"] if value_at == "src" else edge["v"]}
    rho = lambda mb, node: {"out": jgnn.sum(jgnn.softmax(mb["s"])[..., None] * mb["v"])}
    _check_layer_grads(phi, rho, graph)


def test_typed_matmul_gpu():
    rng = np.random.default_rng(5)
    x = _rand(rng, (4000, 64))
    w = _rand(rng, (5, 64, 48), 0.1)
    sizes = jnp.asarray([1000, 0, 1500, 700, 600], jnp.int32)
    gidx = jnp.asarray(rng.integers(0, 4000, 3900), jnp.int32)
    _check_grads(lambda x, w: pk.typed_matmul(x, w, sizes, gather_idx=gidx, impl="pallas"),
                 lambda x, w: pk.typed_matmul_reference(x, w, sizes, gather_idx=gidx), (x, w))
