"""Training-step memory and time: jgnn's recomputation against the reference program (issue: training memory).

For a 2-layer GAT (8 heads × 8), a 2-layer HGT and a 2-layer RGCN (64 wide, then a linear classifier) on a
Pubmed-sized graph (19,717 nodes, 88,648 edges, 500 input features), this prints, for the jitted
``value_and_grad`` of a cross-entropy loss:

* XLA's temp memory (``.lower(...).compile().memory_analysis().temp_size_in_bytes``) for jgnn (``xla``
  backend, ``remat="auto"``) and for the reference program, and their ratio;
* the number of floating-point residuals with a leading dimension of ``n_edge`` (JAX's ``saved_residuals``),
  and the bytes of all floating-point residuals;
* the median step time of each, jgnn's time against the reference, and what recomputation itself costs
  (jgnn with ``remat="auto"`` against jgnn with ``remat="none"``).

The typed models get the graph's `jgnn.layout.GraphLayout`, as a user of typed graphs passes it (DGL builds
the same structures with a heterograph), so HGT's relation matmuls are made once per unique (source, edge
type) pair. They are also measured without it (``jgnn_without_layout``), where ``auto`` saves those matmuls
per edge.

Run: ``python -m benchmarks.training_memory [--quick] [--out FILE.json]``. Nothing here is asserted; the
ratios are what the issue asks to report.
"""

from __future__ import annotations

import argparse
import json
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax._src.ad_checkpoint import saved_residuals

from benchmarks.run import git_commit
from jgnn.datasets import power_law_graph, typed_graph
from jgnn.layout import GraphLayout
from jgnn.nn import GATConv, HGTConv, RGCNConv

PUBMED = dict(num_nodes=19_717, num_edges=88_648, features=500, classes=3)


class GAT2(nn.Module):
    classes: int
    backend: str
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph, layout=None):  # GATConv adds self-loops, which the layout does not describe
        h = GATConv(8, num_heads=8, backend=self.backend, remat=self.remat)(graph)
        h = h._replace(nodes=jax.nn.elu(h.nodes))
        return GATConv(self.classes, num_heads=1, concat=False, backend=self.backend, remat=self.remat)(h).nodes


class Typed2(nn.Module):
    classes: int
    backend: str
    kind: str
    num_node_types: int
    num_edge_types: int
    remat: str = "auto"

    @nn.compact
    def __call__(self, graph, layout=None):
        def conv(width):
            if self.kind == "hgt":
                return HGTConv(width, num_heads=2, num_node_types=self.num_node_types,
                               num_edge_types=self.num_edge_types, backend=self.backend, remat=self.remat)
            return RGCNConv(width, num_relations=self.num_edge_types, backend=self.backend, remat=self.remat)

        h = conv(64)(graph, layout=layout)
        h = h._replace(nodes={**h.nodes, "h": jax.nn.relu(h.nodes["h"])})
        return nn.Dense(self.classes)(conv(64)(h, layout=layout).nodes["h"])


def _graphs(scale: float, seed: int = 0):
    n, e = int(PUBMED["num_nodes"] * scale), int(PUBMED["num_edges"] * scale)
    homo = power_law_graph(n, e, PUBMED["features"], PUBMED["classes"], seed=seed)
    typed = typed_graph(n, e, 3, 5, feature_dim=PUBMED["features"], seed=seed)
    g = typed.graph
    g = g._replace(nodes={"h": jnp.asarray(g.nodes["h"]), "type": jnp.asarray(g.nodes["type"])},
                   edges={"type": jnp.asarray(g.edges["type"])})
    homo_graph = homo.graph._replace(nodes=jnp.asarray(homo.graph.nodes))
    labels = jnp.asarray(np.random.default_rng(seed).integers(0, PUBMED["classes"], n), jnp.int32)
    layout = jax.device_put(GraphLayout.from_graph(g))
    return homo_graph, g, labels, typed, layout


def _step(model, graph, labels):
    params = model.init(jax.random.key(0), graph)

    def loss(p, graph, labels, layout):  # graph and layout are arguments: closed over, they would be folded
        logits = model.apply(p, graph, layout)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    return loss, params


TIMING_LIMIT_BYTES = 3 << 30  # this machine has 24 GiB and XLA CPU can exceed its own temp estimate


# (system, backend, remat, with the layout): jgnn as configured, jgnn storing everything, the reference program
SYSTEMS = (("jgnn", "xla", "auto", True), ("jgnn_no_remat", "xla", "none", True),
           ("reference", "reference", "auto", False))
WITHOUT_LAYOUT = ("jgnn_without_layout", "xla", "auto", False)


def measure(name, make, graph, labels, repeats: int, layout=None):
    row = {"model": name}
    # Layers may add a self-loop per node: residuals over either edge set count.
    n_nodes = int(jax.tree_util.tree_leaves(graph.nodes)[0].shape[0])
    edge_rows = {int(graph.senders.shape[0]), int(graph.senders.shape[0]) + n_nodes}
    for system, backend, remat, with_layout in SYSTEMS + ((WITHOUT_LAYOUT,) if layout is not None else ()):
        loss, params = _step(make(backend, remat), graph, labels)
        lay = layout if with_layout else None
        step = jax.jit(jax.value_and_grad(loss))
        compiled = step.lower(params, graph, labels, lay).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        res = [a for a, _ in saved_residuals(lambda p: loss(p, graph, labels, lay), params)
               if a.ndim and jnp.issubdtype(a.dtype, jnp.floating)]
        edge_res = [a for a in res if a.shape[0] in edge_rows]
        times = []
        if temp < TIMING_LIMIT_BYTES:
            jax.block_until_ready(step(params, graph, labels, lay))
            for _ in range(repeats):
                t = time.perf_counter()
                jax.block_until_ready(step(params, graph, labels, lay))
                times.append(time.perf_counter() - t)
        row[system] = {"temp_bytes": int(temp), "edge_float_residuals": len(edge_res),
                       "float_residual_bytes": int(sum(a.size * a.dtype.itemsize for a in res)),
                       "largest_float_residuals": [str(a) for a in sorted(res, key=lambda a: a.size)[-3:]],
                       "step_ms": 1e3 * float(np.median(times)) if times else None}
    row["temp_ratio_reference_over_jgnn"] = row["reference"]["temp_bytes"] / max(row["jgnn"]["temp_bytes"], 1)
    timed = row["jgnn"]["step_ms"] and row["reference"]["step_ms"]
    row["step_time_overhead"] = row["jgnn"]["step_ms"] / row["reference"]["step_ms"] - 1 if timed else None
    # What recomputation itself costs: jgnn with the policy against jgnn storing everything.
    row["remat_time_overhead"] = row["jgnn"]["step_ms"] / row["jgnn_no_remat"]["step_ms"] - 1 \
        if row["jgnn"]["step_ms"] and row["jgnn_no_remat"]["step_ms"] else None
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 5%% scale graph")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument("--models", default="gat,hgt,rgcn", help="comma-separated subset of gat,hgt,rgcn")
    args = parser.parse_args(argv)
    scale = 0.05 if args.quick else 1.0
    homo, typed_g, labels, typed, layout = _graphs(scale)
    cases = [
        ("gat-2x(8x8)", lambda b, r: GAT2(PUBMED["classes"], b, r), homo, None),
        ("hgt-2x64", lambda b, r: Typed2(PUBMED["classes"], b, "hgt", typed.num_node_types, typed.num_edge_types, r),
         typed_g, layout),
        ("rgcn-2x64", lambda b, r: Typed2(PUBMED["classes"], b, "rgcn", typed.num_node_types, typed.num_edge_types,
                                          r), typed_g, layout),
    ]
    rows = []
    wanted = set(args.models.split(","))
    meta = {"device": str(jax.devices()[0]), "jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(
        jax.lib, "__version__") else jax.__version__, "scale": scale, "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "machine": "2-core CPU, 24 GiB (the project's CI-sized machine)"}
    fmt = lambda ms: "   (not run)" if ms is None else f"{ms:12.1f}"
    for name, make, graph, lay in cases:
        if name.split("-")[0] not in wanted:
            continue
        row = measure(name, make, graph, labels, args.repeats, lay)
        rows.append(row)
        over = row["step_time_overhead"]
        print(f"{name:14s} temp ref {row['reference']['temp_bytes'] / 2**20:8.1f} MiB  jgnn "
              f"{row['jgnn']['temp_bytes'] / 2**20:8.1f} MiB  ratio {row['temp_ratio_reference_over_jgnn']:5.2f}x  "
              f"E-residuals ref {row['reference']['edge_float_residuals']:2d} jgnn "
              f"{row['jgnn']['edge_float_residuals']:2d}  step ms ref {fmt(row['reference']['step_ms'])} jgnn "
              f"{fmt(row['jgnn']['step_ms'])}" + ("" if over is None else f" ({100 * over:+.0f}%)")
              + ("" if row["remat_time_overhead"] is None else
                 f"  remat cost {100 * row['remat_time_overhead']:+.0f}% vs jgnn without remat "
                 f"(temp {row['jgnn_no_remat']['temp_bytes'] / 2**20:.1f} MiB)"), flush=True)
        for system in ("jgnn", "jgnn_without_layout"):
            if system in row:
                r = row[system]
                print(f"{'':14s} {system}: float residuals {r['float_residual_bytes'] / 2**20:.1f} MiB, largest "
                      f"{', '.join(r['largest_float_residuals'])}; E-residuals {r['edge_float_residuals']}, temp "
                      f"{r['temp_bytes'] / 2**20:.1f} MiB, step ms {fmt(r['step_ms'])}", flush=True)
        if args.out:  # after every model, so a run killed for memory keeps what it measured
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
