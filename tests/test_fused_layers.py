"""Layers on the kernel backends: interpret-mode numerics vs the reference and CUDA lowering without a GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from graph_cases import random_graph
from models import make_gcn

import jgnn
from jgnn.layout import GraphLayout

TOL = dict(rtol=1e-5, atol=1e-5)


def _gcn_graph(rng, n=14, e=50, d=7):
    g = random_graph(rng, n, e, d, isolated=2, hub=12)
    return g._replace(nodes={**g.nodes, "c": jnp.asarray(rng.uniform(0.2, 1, n), jnp.float32)})


@pytest.mark.parametrize("with_layout", [False, True])
def test_pallas_interpret_layer_uses_kernel_and_matches_reference(with_layout):
    rng = np.random.default_rng()
    graph = _gcn_graph(rng)
    phi, rho, psi = make_gcn(rng, 7)
    layer = jgnn.message_passing(phi, rho, psi, backend="pallas_interpret")
    reference = jgnn.message_passing(phi, rho, psi, backend="reference")
    layout = GraphLayout.from_graph(graph) if with_layout else None
    report = jgnn.explain(layer, graph, layout=layout)
    assert [k.backend for k in report.kernels] == ["pallas_interpret"]
    np.testing.assert_allclose(layer(graph, layout=layout).nodes["h"], reference(graph).nodes["h"], **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer), jax.grad(loss)(graph.nodes["h"], reference),
                               **TOL)


def test_compiled_jraph_gcn_on_kernel_matches():
    rng = np.random.default_rng()
    graph = random_graph(rng, 12, 40, 7)
    graph = graph._replace(nodes=graph.nodes["h"])
    model = jraph.GraphConvolution(lambda x: x * 2.0)
    compiled = jgnn.compile(model, backend="pallas_interpret")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    assert jgnn.explain(compiled, graph).kernels


def test_pallas_backend_lowers_for_cuda_without_a_gpu():
    rng = np.random.default_rng()
    graph = _gcn_graph(rng, d=41)
    phi, rho, psi = make_gcn(rng, 41, d_out=41)
    layer = jgnn.message_passing(phi, rho, psi, backend="pallas")

    def step(h):
        return jax.value_and_grad(lambda x: jnp.sum(layer(graph._replace(nodes={**graph.nodes, "h": x})).nodes["h"]))(h)

    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    exported = jax.export.export(jax.jit(step), platforms=["cuda"], disabled_checks=checks)(graph.nodes["h"])
    # the forward walk plus at least the reverse-CSR walk for the source gradient
    assert exported.mlir_module().count("__gpu$xla.gpu.triton") >= 2
