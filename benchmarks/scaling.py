"""Scaling study of `jgnn.distributed` on forced host devices: one GATConv layer's training step (forward and
backward, 16 features, 1 head) over 1/2/4/8 devices on a 1M-edge R-MAT graph and on amazon_computers.

    JGNN_DATA_DIR=../shared/data python -m benchmarks.scaling            # writes benchmarks/results/scaling-*

Each device count runs in its own process (the forced device count is fixed when JAX starts). Reports the median
step time of 3 steps after compilation, the bytes the step's collectives move (from their shapes: the halo
all_gather forward and its reduce-scatter backward), the ideal halo-row bytes the cost model counts, the edge cut
and the edge imbalance; and, for 64 parts, the partition's measured cut and imbalance with the cost model's bytes
(no step time is projected: forced devices share this machine's cores).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
DEVICES = (1, 2, 4, 8)
WIDTH = 16


def load(name: str):
    import jraph
    import numpy as np

    if name == "rmat":
        from jgnn.datasets.synthetic import rmat_edges

        rng = np.random.default_rng(0)
        n, e = 65_536, 1_048_576
        s, r = rmat_edges(n, e, rng)
        x = rng.normal(size=(n, 32)).astype(np.float32)
    else:
        d = np.load(pathlib.Path(os.environ.get("JGNN_DATA_DIR", ROOT.parent / "shared" / "data")) / f"{name}.npz")
        s, r, x = d["senders"], d["receivers"], d["x"]
        n, e = x.shape[0], len(s)
    return jraph.GraphsTuple(nodes=x, edges=None, senders=s, receivers=r, n_node=np.array([n]),
                             n_edge=np.array([e]), globals=None)


def worker(name: str, parts: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    import jgnn
    from jgnn import distributed

    graph = load(name)
    part = distributed.partition(graph, parts)
    pg = distributed.build_parts(graph, part)
    mesh = Mesh(np.array(jax.devices()[:parts]), ("parts",))
    arrays = distributed.structure(pg, mesh)
    layer = jgnn.nn.GATConv(WIDTH, num_heads=1)
    params = layer.init(jax.random.key(0), graph._replace(nodes=graph.nodes[:2], senders=graph.senders[:1] * 0,
                                                          receivers=graph.receivers[:1] * 0, n_node=np.array([2]),
                                                          n_edge=np.array([1])))["params"]
    x = distributed.put(np.asarray(pg.to_padded(graph.nodes)), mesh, jax.sharding.PartitionSpec("parts"))

    def per_part(local, params, owned):
        return local.owned(layer.apply({"params": params}, local.graph(owned)).nodes)

    step = jax.jit(jax.grad(lambda p, x, a: jnp.sum(distributed.run(per_part, pg, mesh, a, p, x) ** 2)))
    jax.block_until_ready(step(params, x, arrays))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(step(params, x, arrays))
        times.append(time.perf_counter() - t)
    f = graph.nodes.shape[1]
    gathered = 2 * (parts - 1) * pg.owned * f * 4 * parts if parts > 1 else 0  # forward all_gather + backward
    st = part.stats
    return {"graph": name, "devices": parts, "step_s": float(np.median(times)), "collective_bytes": gathered,
            "halo_bytes": 2 * sum(st.halo) * f * 4, "edge_cut": st.edge_cut, "cut_fraction": st.cut_fraction,
            "edge_imbalance": st.edge_imbalance, "node_imbalance": st.node_imbalance, "method": st.method,
            "nodes": int(graph.n_node[0]), "edges": int(graph.n_edge[0]), "width": f}


def projection(name: str, parts: int = 64) -> dict:
    from jgnn import distributed

    graph = load(name)
    st = distributed.partition(graph, parts).stats
    f = graph.nodes.shape[1]
    return {"graph": name, "devices": parts, "halo_bytes": 2 * sum(st.halo) * f * 4, "edge_cut": st.edge_cut,
            "cut_fraction": st.cut_fraction, "edge_imbalance": st.edge_imbalance, "method": st.method}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], int(sys.argv[3]))), flush=True)
        return
    rows, projections = [], []
    for name in ("rmat", "amazon_computers"):
        for parts in DEVICES:
            env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={parts}", JAX_PLATFORMS="cpu",
                       PYTHONPATH=str(ROOT))
            proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--worker", name, str(parts)],
                                  env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
        projections.append(projection(name))
    OUT.mkdir(parents=True, exist_ok=True)
    lines = ["# jgnn.distributed scaling (forced host devices)", "",
             f"One GATConv({WIDTH}, 1 head) training step (forward + backward), METIS parts. **Forced host devices "
             f"share this machine's {os.cpu_count()} CPU cores** (with other processes running): step times show "
             "overhead and noise, not speed-up. Collective bytes: the halo all_gather (every owned row to every "
             "device) and its backward; halo-row bytes: what a targeted exchange would move.",
             "Reproduce: `JGNN_DATA_DIR=../shared/data python -m benchmarks.scaling`.", "",
             "| graph | nodes | edges | devices | step (s) | collective bytes/step | halo-row bytes/step | edge cut "
             "| cut % | edge imbalance |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['nodes']:,} | {r['edges']:,} | {r['devices']} | {r['step_s']:.3f} | "
                     f"{r['collective_bytes']:,} | {r['halo_bytes']:,} | {r['edge_cut']:,} | "
                     f"{100 * r['cut_fraction']:.1f} | {r['edge_imbalance']:.3f} |")
    lines += ["", "64 parts (partition measured; bytes from the cost model: halo rows × width × 4 B, forward and "
              "backward; no step time projected):", "",
              "| graph | parts | halo-row bytes/step | edge cut | cut % | edge imbalance |",
              "|---|---|---|---|---|---|"]
    for p in projections:
        lines.append(f"| {p['graph']} | {p['devices']} | {p['halo_bytes']:,} | {p['edge_cut']:,} | "
                     f"{100 * p['cut_fraction']:.1f} | {p['edge_imbalance']:.3f} |")
    (OUT / "scaling-table.md").write_text("\n".join(lines) + "\n")
    (OUT / "scaling-raw.json").write_text(json.dumps({"rows": rows, "projection_64": projections}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in ("rmat", "amazon_computers"):
        rs = [r for r in rows if r["graph"] == name]
        axes[0].plot([r["devices"] for r in rs], [r["step_s"] for r in rs], "o-", label=name)
        axes[1].plot([r["devices"] for r in rs], [100 * r["cut_fraction"] for r in rs], "o-", label=name)
    axes[0].set(xlabel="forced host devices (shared cores)", ylabel="step time (s)", xscale="log", xticks=DEVICES)
    axes[1].set(xlabel="parts", ylabel="edge cut (%)", xscale="log", xticks=DEVICES)
    for ax in axes:
        ax.set_xticklabels([str(d) for d in DEVICES])
        ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "scaling-plot.png", dpi=100)


if __name__ == "__main__":
    main()
