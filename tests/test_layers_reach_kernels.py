"""Layers that reach the Pallas kernels (issue 14): interpret-mode forward, gradient and JVP vs the reference
backend, and the kernel records that say so."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import x64
from graph_cases import random_graph

import jgnn
from jgnn import Reason, mailbox
from jgnn.layout import GraphLayout
from jgnn.ops import lowering

SEED = 20261124
TOL = {jnp.float32: dict(rtol=2e-5, atol=2e-5), jnp.float64: dict(rtol=1e-12, atol=1e-12)}


def lowered_choices(monkeypatch, fn, *args) -> list[tuple[str, bool, str, Reason]]:
    """(reduction, hits, impl, reason) of every edge op that lowering ``jax.jit(fn)`` decides, derived ops (JVPs,
    transposes) included: `explain` reports the forward program's ops only."""
    seen = []

    def record(spec, avals, decide=lowering.decide):
        choice = decide(spec, avals)
        seen.append((spec.reduce.value, spec.hits, choice.impl, choice.code))
        return choice

    monkeypatch.setattr(lowering, "decide", record)
    jax.jit(fn).lower(*args)
    return seen


def _extremum_layer(kind: str, w, backend: str):
    """An EdgeConv-like layer: per-edge message from both endpoints, max or min over the mailbox."""

    def phi(src, dst, edge):
        return {"m": jnp.tanh(src["h"] - dst["h"]) * w + src["h"]}

    def rho(mb, node):
        return {"m": getattr(mailbox, kind)(mb["m"])}

    return jgnn.message_passing(phi, rho, lambda node, agg: {"h": agg["m"]}, backend=backend)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_on_kernel_match_reference_with_ties(kind, dtype, monkeypatch):
    """Duplicate edges give exact ties (the reference splits their gradient evenly); isolated nodes give empty
    rows (0); a NaN feature propagates to its rows in the forward and the gradient."""
    with x64() if dtype == jnp.float64 else contextlib.nullcontext():
        rng = np.random.default_rng(SEED)
        graph = random_graph(rng, 12, 40, 5, isolated=2, hub=9, duplicates=6, dtype=dtype)
        h = graph.nodes["h"].at[3, 1].set(jnp.nan)
        w = jnp.asarray(rng.normal(size=(5,)), dtype)
        kernel, reference = (_extremum_layer(kind, w, b) for b in ("pallas_interpret", "reference"))
        layout = GraphLayout.from_graph(graph)
        records = jgnn.explain(kernel, graph, layout=layout).kernels
        assert [(k.lowering, k.code) for k in records] == [("kernel", Reason.LOWER_KERNEL)]

        def run(layer, x):
            return layer(graph._replace(nodes={"h": x}), layout=layout).nodes["h"]

        tol = TOL[dtype]
        np.testing.assert_allclose(run(kernel, h), run(reference, h), **tol)
        np.testing.assert_array_equal(np.isnan(run(kernel, h)), np.isnan(run(reference, h)))
        loss = lambda x, layer: jnp.sum(jnp.sin(run(layer, x)) * jnp.arange(5, dtype=dtype))
        np.testing.assert_allclose(jax.grad(loss)(h, kernel), jax.grad(loss)(h, reference), **tol)
        finite = graph.nodes["h"]
        np.testing.assert_allclose(jax.grad(loss)(finite, kernel), jax.grad(loss)(finite, reference), **tol)
        t = jnp.asarray(rng.normal(size=finite.shape), dtype)
        (_, jk), (_, jr) = (jax.jvp(lambda x, f=f: run(f, x), (finite,), (t,)) for f in (kernel, reference))
        np.testing.assert_allclose(jk, jr, **tol)
        # the training step's ops, the max/min with its tie mask and the transpose, all on kernels
        choices = lowered_choices(monkeypatch, lambda x: jax.grad(loss)(x, kernel), finite)
        assert (kind, True, "kernel", Reason.LOWER_KERNEL) in choices
        assert {(impl, code) for *_, impl, code in choices} == {("kernel", Reason.LOWER_KERNEL)}
