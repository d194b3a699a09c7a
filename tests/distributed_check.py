"""Multi-device equality check for `jgnn.distributed`, run by tests/test_distributed.py in a subprocess (the
forced host device count must be set before JAX starts). Usage: ``python tests/distributed_check.py P [P ...]``
(env: ``JGNN_CHECK_MODELS`` gat,rgcn; ``JGNN_CHECK_BACKEND`` xla; ``JGNN_CHECK_METHOD`` auto|metis|ldg).
Prints one JSON line per (model, P) with the largest relative errors; exits 1 if any exceeds the tolerance."""

from __future__ import annotations

import json
import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jraph  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import jgnn  # noqa: E402
from jgnn import distributed  # noqa: E402

TOL = 1e-5
BACKEND = os.environ.get("JGNN_CHECK_BACKEND", "xla")
N, E, F, R = 120, 700, 6, 3


def hub_graph(seed: int) -> jraph.GraphsTuple:
    """Random edges, two hubs (many in- and out-edges), ten isolated nodes, a few self-loops and duplicates."""
    rng = np.random.default_rng(seed)
    live = N - 10
    s = rng.integers(0, live, E)
    r = rng.integers(0, live, E)
    s[:150], r[150:300] = 3, 7  # hubs: node 3 sends 150 edges, node 7 receives 150
    s[300:305] = r[300:305]
    s[305:310], r[305:310] = s[310:315], r[310:315]
    return jraph.GraphsTuple(nodes=rng.normal(size=(N, F)).astype(np.float32),
                             edges={"type": rng.integers(0, R, E).astype(np.int32)},
                             senders=s.astype(np.int32), receivers=r.astype(np.int32),
                             n_node=np.array([N]), n_edge=np.array([E]), globals=None)


def rel_err(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def check(name: str, module, graph: jraph.GraphsTuple, parts: int) -> dict:
    params = module.init(jax.random.key(0), graph)["params"]
    weights = jnp.asarray(np.random.default_rng(1).normal(size=(N, module.features * getattr(module, "num_heads", 1)))
                          .astype(np.float32))

    def single_loss(params, x):
        out = module.apply({"params": params}, graph._replace(nodes=x)).nodes
        return jnp.sum(out * weights), out

    (_, want), want_grads = jax.jit(jax.value_and_grad(single_loss, (0, 1), has_aux=True))(params, graph.nodes)

    part = distributed.partition(graph, parts, method=os.environ.get("JGNN_CHECK_METHOD", "auto"))
    pg = distributed.build_parts(graph, part)
    mesh = Mesh(np.array(jax.devices()[:parts]), ("parts",))
    arrays = distributed.structure(pg, mesh, edges=pg.edge_values(graph.edges))

    def per_part(local, params, owned):
        out = module.apply({"params": params}, local.graph(owned)).nodes
        return local.owned(out)

    def dist_loss(params, x):
        out = pg.from_padded(distributed.run(per_part, pg, mesh, arrays, params, pg.to_padded(x)))
        return jnp.sum(out * weights), out

    (_, got), got_grads = jax.jit(jax.value_and_grad(dist_loss, (0, 1), has_aux=True))(params, graph.nodes)
    errors = {"out": rel_err(got, want)}
    errors["grad_x"] = rel_err(got_grads[1], want_grads[1])
    flat_got, flat_want = jax.tree.leaves(got_grads[0]), jax.tree.leaves(want_grads[0])
    errors["grad_params"] = max(rel_err(a, b) for a, b in zip(flat_got, flat_want, strict=True))
    return {"model": name, "parts": parts, "method": part.stats.method, "edge_cut": part.stats.edge_cut,
            "errors": errors, "ok": all(e <= TOL for e in errors.values())}


def main(parts_list: list[int]) -> int:
    graph = hub_graph(0)
    models = {"gat": jgnn.nn.GATConv(4, num_heads=2, backend=BACKEND),
              "rgcn": jgnn.nn.RGCNConv(5, num_relations=R, backend=BACKEND)}
    ok = True
    for parts in parts_list:
        for name, module in models.items():
            if name not in os.environ.get("JGNN_CHECK_MODELS", "gat,rgcn"):
                continue
            result = check(name, module, graph, parts)
            print(json.dumps(result), flush=True)
            ok &= result["ok"]
        if "partial" in os.environ.get("JGNN_CHECK_MODELS", "gat,rgcn,partial"):
            for result in check_partials(parts):
                print(json.dumps(result), flush=True)
                ok &= result["ok"]
    return 0 if ok else 1



def check_partials(parts: int) -> list[dict]:
    """Strategy (b): `distributed.aggregate` of sum/max/min/softmax vs `jax.ops.segment_*` on one device."""
    graph = hub_graph(0)
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(size=(F, 6)).astype(np.float32))
    e_feat = jnp.asarray(rng.normal(size=(E, 6)).astype(np.float32))
    x = jnp.asarray(graph.nodes)
    s, r = jnp.asarray(graph.senders), jnp.asarray(graph.receivers)

    def message(kind, w_):
        def fn(src, edge):
            z = src @ w_ + edge
            return (z[:, :2], z.reshape(-1, 2, 3)) if kind == "softmax" else z
        return fn

    def single(kind, w_, x_):
        z = x_[s] @ w_ + e_feat
        if kind != "softmax":
            return {"sum": jax.ops.segment_sum, "max": jax.ops.segment_max, "min": jax.ops.segment_min}[kind](
                z, r, N)
        alpha = jraph.segment_softmax(z[:, :2], r, N)
        return jax.ops.segment_sum(alpha[..., None] * z.reshape(-1, 2, 3), r, N)

    part = distributed.partition(graph, parts, method=os.environ.get("JGNN_CHECK_METHOD", "auto"))
    pg = distributed.build_parts(graph, part)
    partials = distributed.build_partials(graph, part, pg)
    mesh = Mesh(np.array(jax.devices()[:parts]), ("parts",))
    cut_e = np.where((partials.out_edge >= 0)[..., None], np.asarray(e_feat)[np.maximum(partials.out_edge, 0)], 0)
    arrays = distributed.structure(pg, mesh, edges=pg.edge_values(e_feat),
                                   extra={**distributed.partial_arrays(partials), "cut": cut_e})
    has_in = np.bincount(graph.receivers, minlength=N) > 0
    out = []
    for kind in ("sum", "max", "min", "softmax"):
        def per_part(local, w_, owned, kind=kind):
            return distributed.aggregate(local, local.extra, owned, message(kind, w_), kind, local.edges,
                                         local.extra["cut"])

        def dist(w_, x_, kind=kind, per_part=per_part):
            return pg.from_padded(distributed.run(per_part, pg, mesh, arrays, w_, pg.to_padded(x_)))

        weights = jnp.asarray(rng.normal(size=single(kind, w, x).shape).astype(np.float32))
        loss = lambda f: lambda w_, x_: jnp.sum(jnp.where(has_in.reshape((-1,) + (1,) * (weights.ndim - 1)),
                                                          f(w_, x_) * weights, 0.0))
        want, want_g = jax.jit(jax.value_and_grad(loss(lambda w_, x_: single(kind, w_, x_)), (0, 1)))(w, x)
        got, got_g = jax.jit(jax.value_and_grad(loss(dist), (0, 1)))(w, x)
        ys = [np.where(has_in[:, None], np.asarray(a).reshape(N, -1), 0) for a in (dist(w, x), single(kind, w, x))]
        errors = {"out": rel_err(*ys), "loss": rel_err(got, want), "grad_w": rel_err(got_g[0], want_g[0]),
                  "grad_x": rel_err(got_g[1], want_g[1])}
        out.append({"model": f"partial_{kind}", "parts": parts, "errors": errors,
                    "ok": all(v <= TOL for v in errors.values())})
    return out


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [2, 4, 8]))
