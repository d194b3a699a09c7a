"""Gradients of compiled layers inside `jax.shard_map` with its varying-axes checks on (``check_vma=True``, the
default) on 2 devices, against the same layer with ``backend="reference"`` under the same shard_map. Run by
tests/test_shard_map_grads.py in a subprocess (the forced host device count must be set before JAX starts).

Each device holds its own graph (nodes and edges split over the mesh axis); the weights are replicated. Cases:
an RGCN-like message ``x_src @ W[type]`` summed, or scaled per edge and summed (RGCN's mean), or averaged by
`jgnn.mean`; ``grad`` of the layer (the edge ops' transposes run in their lowerings), and ``vmap`` of ``grad``
over two graphs per device (the transposes run at trace time, through the batching rule's reference).
Prints one JSON line per case with the largest relative errors of the gradients in the weights and the nodes.
"""

from __future__ import annotations

import json
import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jraph  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

import jgnn  # noqa: E402

N, E, F, O, R, B = 12, 40, 4, 3, 3, 2  # nodes, edges, in/out width, relations, graphs per device under vmap


def data(seed: int) -> dict:
    """Per device (leading axis 2), ``B`` graphs each: features, endpoints, relation types, per-edge scales."""
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(2, B, N, F)).astype(np.float32),
            "s": rng.integers(0, N, (2, B, E)).astype(np.int32), "r": rng.integers(0, N, (2, B, E)).astype(np.int32),
            "t": rng.integers(0, R, (2, B, E)).astype(np.int32),
            "inv": rng.uniform(0.1, 1.0, (2, B, E)).astype(np.float32)}


def layer(aggr: str, backend: str, w):
    def phi(src, dst, edge):
        m = src["h"] @ w[edge["t"]]
        return m * edge["inv"] if aggr == "scaled" else m

    rho = (lambda mb, node: jgnn.mean(mb)) if aggr == "mean" else (lambda mb, node: jgnn.sum(mb))
    return jgnn.message_passing(phi, rho, lambda node, agg: agg, backend=backend)


def loss(aggr, backend, w, x, s, r, t, inv):
    g = jraph.GraphsTuple(nodes={"h": x}, edges={"t": t, "inv": inv}, senders=s, receivers=r, globals=None,
                          n_node=jnp.array([N]), n_edge=jnp.array([E]))
    return jnp.sum(jnp.sin(layer(aggr, backend, w)(g).nodes))


def grads(aggr: str, backend: str, mode: str, w, d: dict):
    """(d/dw summed over the devices and graphs, d/dx) under a 2-device shard_map with the default checks."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    grad = jax.grad(lambda w, *a: loss(aggr, backend, w, *a), (0, 1))

    def body(w, x, s, r, t, inv):
        args = (x[0], s[0], r[0], t[0], inv[0])
        if mode == "grad":  # the first graph of each device
            gw, gx = grad(w, *(a[0] for a in args))
            gx = gx[None]
        else:
            gw, gx = jax.vmap(grad, (None, 0, 0, 0, 0, 0))(w, *args)
            gw = jnp.sum(gw, 0)
        return gw, gx[None]  # gw: already summed over the devices (a replicated input's cotangent)

    split, rep = PartitionSpec("d"), PartitionSpec()
    run = jax.shard_map(body, mesh=mesh, in_specs=(rep,) + (split,) * 5, out_specs=(rep, split))
    return jax.jit(run)(w, d["x"], d["s"], d["r"], d["t"], d["inv"])


def rel_err(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


CASES = [(aggr, backend, "grad") for aggr in ("sum", "scaled", "mean") for backend in ("xla", "pallas_interpret")]
CASES += [(aggr, "xla", "vmap") for aggr in ("sum", "scaled")]


def main() -> int:
    d = data(0)
    w = np.random.default_rng(1).normal(size=(R, F, O)).astype(np.float32)
    for aggr, backend, mode in CASES:
        case = {"aggr": aggr, "backend": backend, "mode": mode}
        want = grads(aggr, "reference", mode, w, d)
        try:
            got = grads(aggr, backend, mode, w, d)
        except Exception as e:  # noqa: BLE001 - reported per case, so one crash does not hide the others
            print(json.dumps({**case, "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
            continue
        print(json.dumps({**case, "grad_w": rel_err(got[0], want[0]), "grad_x": rel_err(got[1], want[1])}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
