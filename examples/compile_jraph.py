"""Compile unmodified jraph models with `jgnn.compile` and check they compute the same thing.

    python examples/compile_jraph.py [--backend auto]

Builds ``jraph.GraphConvolution`` (with self-edges and symmetric normalisation) and ``jraph.GAT`` on Cora
with plain-JAX weights, compiles each with `jgnn.compile`, checks the outputs (and the weight gradients of a
scalar loss) equal the originals, and prints `jgnn.explain`'s report. Last stdout line: a JSON object.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import jraph
import numpy as np
from _common import final_json

import jgnn
from jgnn.datasets import load_planetoid


def gcn_model(w):
    return jraph.GraphConvolution(update_node_fn=lambda x: x @ w, add_self_edges=True,
                                  symmetric_normalization=True)


def gat_model(w, a_src, a_dst, heads: int, width: int):
    def query(x):
        return (x @ w).reshape(x.shape[0], heads, width)

    def logit(sent, received, edges):
        return jax.nn.leaky_relu(jnp.sum(sent * a_src, -1) + jnp.sum(received * a_dst, -1), 0.2)[..., None]

    return jraph.GAT(attention_query_fn=query, attention_logit_fn=logit,
                     node_update_fn=lambda x: jax.nn.elu(x.reshape(x.shape[0], -1)))


def check(name: str, make, params, graph, backend: str) -> dict:
    original = lambda p, g: make(*p)(g).nodes
    compiled_layer = jgnn.compile(lambda p, g: make(*p)(g), backend=backend)
    compiled = lambda p, g: compiled_layer(p, g).nodes
    want, got = original(params, graph), compiled(params, graph)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    loss = lambda f: (lambda p: jnp.sum(jnp.tanh(f(p, graph))))
    g_want, g_got = jax.grad(loss(original))(params), jax.grad(loss(compiled))(params)
    for a, b in zip(g_got, g_want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    report = jgnn.explain(compiled_layer, params, graph)
    print(f"== {name}: compiled output and gradients equal jraph's ({tuple(got.shape)})")
    print(report)
    print()
    return {"max_abs_diff": float(jnp.max(jnp.abs(got - want))), "summary": report.summary()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="auto", choices=list(jgnn.BACKENDS))
    p.add_argument("--smoke", action="store_true", help="accepted for symmetry with the other examples")
    args = p.parse_args(argv)
    start = time.perf_counter()
    ds = load_planetoid("cora")
    graph = jax.device_put(ds.graph)
    f = ds.num_features
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    heads, width = 8, 8
    gcn_params = (jax.random.normal(keys[0], (f, 16)) / np.sqrt(f),)
    gat_params = (jax.random.normal(keys[1], (f, heads * width)) / np.sqrt(f),
                  jax.random.normal(keys[2], (heads, width)) / np.sqrt(width),
                  jax.random.normal(keys[3], (heads, width)) / np.sqrt(width))
    results = {
        "gcn": check("jraph.GraphConvolution", gcn_model, gcn_params, graph, args.backend),
        "gat": check("jraph.GAT", lambda *p: gat_model(*p, heads, width), gat_params, graph, args.backend),
    }
    final_json(example="compile_jraph", backend=args.backend, equal=True,
               max_abs_diff={k: v["max_abs_diff"] for k, v in results.items()},
               seconds=round(time.perf_counter() - start, 2))


if __name__ == "__main__":
    main()
