"""Every derivative of a fused op reaches the kernels when lowered for CUDA (no GPU needed).

``pallas_kernels`` has forward kernels only; a gradient is jgnn's transpose rule, whose edge ops jgnn lowers to
those same kernels. Each check exports ``jax.value_and_grad`` of a `jgnn.message_passing` layer on the
``pallas`` backend with ``platforms=["cuda"]`` (``compat.export_cuda_mlir``: the Triton lowering, not PTX
compilation) and names the kernels its module must call. The kernels' own forward lowering is
``tests/test_kernels_numerics_lowering.py``; every `jgnn.nn` layer's training step is ``tests/test_gpu_check.py``.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest

import jgnn
import pallas_kernels as pk
from pallas_kernels import compat

N, E = 16, 40


def _graph(nodes: dict, edges: dict) -> jraph.GraphsTuple:
    rng = np.random.default_rng(0)
    senders, receivers = rng.integers(0, N, E), rng.integers(0, N - 2, E)  # two nodes without in-edges
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=jnp.asarray(senders, jnp.int32),
                             receivers=jnp.asarray(receivers, jnp.int32), n_node=jnp.array([N]),
                             n_edge=jnp.array([E]), globals=None)


def _kernels(loss, *args) -> set[str]:
    """The kernel names (``gnn_*``) that the CUDA module of ``value_and_grad(loss)`` calls."""
    text = compat.export_cuda_mlir(jax.value_and_grad(loss, argnums=tuple(range(len(args)))), *args)
    assert compat.TRITON_CUSTOM_CALL in text
    return set(re.findall(r"gnn_[a-z_]+", text))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width,dtype", [(1, jnp.float32), (7, jnp.bfloat16), (41, jnp.float16),
                                         (602, jnp.float32)])
def test_reduction_gradients_lower_to_kernels(reduce, width, dtype):
    def phi(src, dst, edge):
        return {"m": jnp.tanh(src["h"] * dst["a"]) + edge["w"] * src["a"]}

    def rho(mb, node):
        return {"agg": getattr(jgnn, reduce)(mb["m"])}

    layer = jgnn.message_passing(phi, rho, None, backend="pallas")
    g = _graph({"h": jnp.ones((N, width), dtype), "a": jnp.ones((N, 1), dtype)}, {"w": jnp.ones((E, width), dtype)})

    def loss(h, a, w):
        out = layer(g._replace(nodes={"h": h, "a": a}, edges={"w": w})).nodes["agg"]
        return jnp.sum(out.astype(jnp.float32) ** 2)

    # the forward reduction, and the backward's per-edge cotangents (max/min: of the tied edges) on a kernel
    assert {f"gnn_gather_reduce_{reduce}", "gnn_gather_compute"} <= _kernels(loss, g.nodes["h"], g.nodes["a"],
                                                                              g.edges["w"])


@pytest.mark.parametrize("heads,width,dtype", [(1, 8, jnp.float32), (8, 64, jnp.bfloat16)])
def test_attention_gradients_lower_to_kernels(heads, width, dtype):
    def phi(src, dst, edge):
        return {"s": jnp.sum(src["k"] * dst["k"], -1) + edge["b"], "v": src["v"]}

    def rho(mb, node):
        return {"out": jgnn.sum(jgnn.softmax(mb["s"])[..., None] * mb["v"])}

    layer = jgnn.message_passing(phi, rho, None, backend="pallas")
    node = jnp.ones((N, heads, width), dtype)
    g = _graph({"k": node, "v": node}, {"b": jnp.ones((E, heads), dtype)})

    def loss(k, v, b):
        out = layer(g._replace(nodes={"k": k, "v": v}, edges={"b": b})).nodes["out"]
        return jnp.sum(out.astype(jnp.float32) ** 2)

    # the online-softmax forward, then the backward's per-head row sums and edge pullbacks
    assert {"gnn_attention", "gnn_head_reduce_sum", "gnn_head_compute"} <= _kernels(loss, node, node,
                                                                                     g.edges["b"])


@pytest.mark.parametrize("din,dout,dtype", [(7, 41, jnp.float32), (64, 1, jnp.bfloat16), (602, 16, jnp.float32)])
@pytest.mark.parametrize("gather", [False, True])
def test_typed_matmul_pallas_lowers(din, dout, dtype, gather):
    x, w = jnp.ones((N, din), dtype), jnp.ones((3, din, dout), dtype)
    sizes = jnp.array([5, 0, 9], jnp.int32)
    gidx = jnp.arange(14, dtype=jnp.int32) % N if gather else None

    def f(x, w):
        out = pk.typed_matmul(x, w, sizes, gather_idx=gidx, impl="pallas")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    text = compat.export_cuda_mlir(jax.value_and_grad(f, argnums=(0, 1)), x, w)
    assert text.count(compat.TRITON_CUSTOM_CALL) == 3  # forward, dx, dW
