"""One process of the 2-process × 4-CPU-device check of `jgnn.distributed` (run by tests/test_distributed.py).

Usage: ``python tests/distributed_multiprocess.py PROCESS_ID NUM_PROCESSES COORDINATOR`` (e.g. 127.0.0.1:port).
Each process runs the single-device reference on its own first device and the 8-part run over the global mesh,
and prints one JSON line with the largest relative errors; exits 1 if any exceeds 1e-5.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import jax  # noqa: E402

if hasattr(jax.config, "jax_cpu_collectives_implementation"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on CPU
jax.distributed.initialize(sys.argv[3], num_processes=int(sys.argv[2]), process_id=int(sys.argv[1]),
                           initialization_timeout=60)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

import jgnn  # noqa: E402
from jgnn import distributed  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from distributed_check import R, hub_graph, rel_err  # noqa: E402


def main() -> int:
    graph = hub_graph(0)
    devices = jax.devices()
    parts = len(devices)
    results = {}
    for name, module in {"gat": jgnn.nn.GATConv(4, num_heads=2, backend="xla"),
                         "rgcn": jgnn.nn.RGCNConv(5, num_relations=R, backend="xla")}.items():
        params = module.init(jax.random.key(0), graph)["params"]

        def single_loss(params, x):
            return jnp.sum(module.apply({"params": params}, graph._replace(nodes=x)).nodes ** 2)

        local = jax.local_devices()[0]
        want, want_grads = jax.jit(jax.value_and_grad(single_loss), device=local)(params, graph.nodes)
        pg = distributed.build_parts(graph, distributed.partition(graph, parts))  # deterministic: same everywhere
        mesh = Mesh(np.array(devices), ("parts",))
        arrays = distributed.structure(pg, mesh, edges=pg.edge_values(graph.edges))
        x = distributed.put(np.asarray(pg.to_padded(graph.nodes)), mesh, PartitionSpec("parts"))
        params_global = distributed.put(jax.device_get(params), mesh, PartitionSpec())

        def per_part(local, params, owned):
            return local.owned(module.apply({"params": params}, local.graph(owned)).nodes)

        def dist_loss(params, x, arrays):  # global arrays are arguments: a closure cannot span processes
            return jnp.sum(distributed.run(per_part, pg, mesh, arrays, params, x) ** 2)

        got, got_grads = jax.jit(jax.value_and_grad(dist_loss))(params_global, x, arrays)
        got, got_grads = multihost_utils.process_allgather((got, got_grads), tiled=True)
        errors = [rel_err(got, want)] + [rel_err(a, b) for a, b in zip(
            jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True)]
        results[name] = max(errors)
    ok = all(e <= 1e-5 for e in results.values())
    print(json.dumps({"process": jax.process_index(), "devices": parts, "errors": results, "ok": ok}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
