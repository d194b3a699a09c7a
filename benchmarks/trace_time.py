"""``python -m benchmarks.trace_time [--repeats N]``: how long jgnn takes to trace, rewrite and lower one layer's
training step (issue: trace plus rewrite ≤ 0.5 s per layer), without XLA's compile.

Per layer: ``jax.jit(jax.value_and_grad(loss)).lower(params, graph)`` on a Cora-sized random graph (2,708 nodes,
10,556 edges, 64 features), with jgnn's plan cache cleared before each run so that every run plans afresh; the
median of ``--repeats`` runs after one warm-up (JAX's own first-trace costs). The reference backend, which traces
the user's program unchanged, is measured beside it.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import compiler
from jgnn import nn as jnn

LAYERS = {
    "GCNConv": lambda backend: jnn.GCNConv(64, backend=backend),
    "GATConv(8 heads)": lambda backend: jnn.GATConv(8, num_heads=8, backend=backend),
}


def _graph(n: int = 2708, e: int = 10556, d: int = 64) -> jraph.GraphsTuple:
    rng = np.random.default_rng(0)
    return jraph.GraphsTuple(nodes=jnp.asarray(rng.normal(size=(n, d)), jnp.float32), edges=None,
                             senders=jnp.asarray(rng.integers(0, n, e), jnp.int32),
                             receivers=jnp.asarray(rng.integers(0, n, e), jnp.int32),
                             n_node=jnp.array([n]), n_edge=jnp.array([e]), globals=None)


def lower_seconds(layer, graph, repeats: int) -> list[float]:
    params = layer.init(jax.random.PRNGKey(0), graph)
    times = []
    for _ in range(repeats + 1):
        compiler.PLANS.clear()
        loss = lambda p, g: jnp.sum(layer.apply(p, g).nodes ** 2)  # a new function: no jit cache hit
        t = time.perf_counter()
        jax.jit(jax.value_and_grad(loss)).lower(params, graph)
        times.append(time.perf_counter() - t)
    return times[1:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args(argv)
    graph = _graph()
    print("| layer | backend | trace + rewrite + lower, median s | min | max |\n|---|---|---|---|---|")
    for name, make in LAYERS.items():
        for backend in ("xla", "reference"):
            ts = lower_seconds(make(backend), graph, args.repeats)
            print(f"| {name} | {backend} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
