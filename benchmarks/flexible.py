"""Flexible-neighbourhood models (`jgnn.neighborhood`): jgnn against hand-written XLA and PyG, and the share of
selection.

    JGNN_DATA_DIR=../shared/data python -m benchmarks.flexible --repeat 5 --out benchmarks/results/flexible-cpu

For each model (JK-Net, PinSage and P-GNN on Cora, MAGNN on hetero_dblp, the settings of
``examples/train_flexible.py``), one jitted train step (forward and backward of a softmax cross-entropy or, for
P-GNN, the mean dot product of consecutive nodes' embeddings) is timed for

* ``jgnn``: the `jgnn.nn` model with ``backend="xla"`` (each ragged level compiled as a graph level);
* ``reference``: the same model with ``backend="reference"`` (jgnn's uncompiled program: gathers and segment ops
  over whole levels, as a jraph user writes them);
* ``hand``: a hand-written jnp / ``jax.ops.segment_*`` / ``jraph.segment_softmax`` version reading the same
  parameters (JK-Net: two plain GCN layers, ``segment_sum`` with the symmetric normalisation, concatenated);
* ``torch``: the same model in PyTorch as a PyG user writes it (`benchmarks.flexible_torch`), loading the same
  parameter values and reading the same inputs and neighbourhood arrays, with ``THREADS`` intra-op threads;

and the neighbourhood selection is timed on its own: PinSage's jitted random walks (run every step), P-GNN's host
anchor draw (every epoch), MAGNN's host metapath sampling (once; its share is over 100 epochs). The hand and torch
outputs are checked equal to jgnn's (`_same`) before anything of theirs is timed: a disagreement raises. Each
time is the median of ``--repeat`` runs after two warm-ups (no optimizer in any step). Memory: for the JAX
systems XLA's buffer assignment of the compiled step (`benchmarks.measure.xla_memory`: arguments + outputs +
temp; nothing donated), for torch the tensors alive at the step's start plus the step's profiled peak
(`benchmarks.compare.pyg`'s definition). Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax

import jgnn
from benchmarks.compare.cli import cpu_model, library_versions, machine_uptime
from benchmarks.measure import xla_memory
from jgnn.datasets import load_planetoid


def _time(fn, *args, repeat: int) -> float:
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _run(step, *args, repeat: int) -> tuple[float, int]:
    """``(seconds, bytes)``: the median time of the compiled ``step`` and XLA's memory of it (arguments +
    outputs + temp)."""
    compiled = step.lower(*args).compile()
    return _time(compiled, *args, repeat=repeat), xla_memory(compiled)["xla_bytes"]


def _same(got, want, what: str) -> float:
    """Raise unless ``got`` is ``want`` within f32 tolerance; the largest absolute difference."""
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5, err_msg=what)
    return float(np.max(np.abs(got - want)))


def _flexible_torch():
    from benchmarks import flexible_torch  # torch and torch_geometric: imported only when a row runs

    return flexible_torch


def _put(row, system: str, result: tuple[float, int]) -> None:
    row[system], row[f"{system}_bytes"] = result


def _put_torch(row, result: dict) -> None:
    row["torch"], row["torch_bytes"], row["torch_max_abs_diff"] = (result["seconds"], result["memory_bytes"],
                                                                   result["max_abs_diff"])


def _step(apply, loss_of):
    return jax.jit(jax.value_and_grad(lambda params, *a: loss_of(apply(params, *a))))


def _cora():
    data = load_planetoid("cora")
    x = data.graph.nodes / np.maximum(data.graph.nodes.sum(1, keepdims=True), 1e-12)
    return jax.device_put(data.graph._replace(nodes=jnp.asarray(x, jnp.float32))), jnp.asarray(data.labels), data


def _ce(labels):
    return lambda logits: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


# ---- hand-written versions ---------------------------------------------------------------------------------

def _jknet_hand(params, x, senders, receivers, num_layers):
    """GCN layers (a self-loop per node, ``d_j^-1/2 d_i^-1/2`` coefficients), ReLU, concatenation, a Dense."""
    n = x.shape[0]
    loops = jnp.arange(n, dtype=senders.dtype)
    s, r = jnp.concatenate([senders, loops]), jnp.concatenate([receivers, loops])
    deg = jax.ops.segment_sum(jnp.ones(s.shape, jnp.float32), r, n)
    dinv = jnp.where(deg > 0, jax.lax.rsqrt(jnp.maximum(deg, 1.0)), 0.0)
    coef = (dinv[s] * dinv[r])[:, None]
    h, xs = x, []
    for i in range(num_layers):
        p = params[f"conv{i}"]
        hw = h @ p["kernel"]
        h = jax.nn.relu(jax.ops.segment_sum(hw[s] * coef, r, n) + p["bias"])
        xs.append(h)
    return jnp.concatenate(xs, -1) @ params["lin"]["kernel"] + params["lin"]["bias"]


def _pinsage_hand(params, x, ids, importance, num_layers):
    h = x
    for i in range(num_layers):
        p = params[f"conv{i}"]
        msg = jax.nn.relu(h @ p["Q_kernel"] + p["Q_bias"])  # per node, then gathered: [N, k, H]
        agg = jnp.sum(jnp.take(msg, ids, axis=0) * importance[..., None], 1)
        z = jax.nn.relu(jnp.concatenate([h, agg], -1) @ p["W_kernel"] + p["W_bias"])
        norm = jnp.linalg.norm(z, axis=-1, keepdims=True)
        h = z / jnp.where(norm > 0, norm, 1.0)
    return h @ params["lin"]["kernel"] + params["lin"]["bias"]


def _pgnn_hand(params, x, ids, s, num_layers):
    h = x @ params["pre"]["kernel"] + params["pre"]["bias"]
    position = None
    for i in range(num_layers):
        p = params[f"conv{i}"]
        near = jnp.take(h, ids, axis=0) * s[..., None]  # [N, K, F]
        own = jnp.broadcast_to(h[:, None], near.shape)
        msg = jax.nn.relu(jnp.concatenate([near, own], -1) @ p["hidden_kernel"] + p["hidden_bias"])
        position, h = (msg @ p["position_kernel"])[..., 0], jnp.mean(msg, 1)
    return position / jnp.maximum(jnp.linalg.norm(position, axis=-1, keepdims=True), 1e-12)


def _magnn_hand(params, features, types, arrays, sizes, hidden, num_p, num_targets):
    x = jnp.concatenate([features[t] @ params[f"project_{t}"]["kernel"] + params[f"project_{t}"]["bias"]
                         if features.get(t) is not None else params[f"embed_{t}"] for t in types])
    (m0, g0, coef), (m1, g1, onehot) = arrays
    n_inst, n_groups = sizes
    half = hidden // 2
    angle = coef @ params["relation_angles"]
    re, im = jnp.take(x, m0, axis=0)[:, :half], jnp.take(x, m0, axis=0)[:, half:]
    rotated = jnp.concatenate([re * jnp.cos(angle) - im * jnp.sin(angle), re * jnp.sin(angle) + im * jnp.cos(angle)],
                              -1)
    count = jax.ops.segment_sum(jnp.ones_like(g0, jnp.float32), g0, n_inst)
    inst = jax.ops.segment_sum(rotated, g0, n_inst) / jnp.maximum(count, 1)[:, None]
    a = onehot @ params["intra_attention"]
    target_rows = jnp.take(jnp.tile(x[:num_targets], (num_p, 1)), jnp.minimum(g1, n_groups - 1), axis=0)
    score = jax.nn.leaky_relu(jnp.sum(a[:, :hidden] * target_rows, -1) + jnp.sum(a[:, hidden:] * inst[m1], -1), 0.2)
    alpha = jraph.segment_softmax(score, g1, n_groups)
    per_metapath = jax.nn.elu(jax.ops.segment_sum(alpha[:, None] * inst[m1], g1, n_groups))
    proj = jnp.tanh(per_metapath @ params["inter_M"]["kernel"] + params["inter_M"]["bias"])
    beta = jax.nn.softmax(jnp.mean((proj @ params["inter_q"]).reshape(num_p, num_targets), 1))
    h = jnp.einsum("p,pnd->nd", beta, per_metapath.reshape(num_p, num_targets, -1))
    return h @ params["classifier"]["kernel"] + params["classifier"]["bias"]


# ---- one row per model -------------------------------------------------------------------------------------

def bench_jknet(repeat):
    ft = _flexible_torch()
    graph, labels, data = _cora()
    make = lambda backend: jgnn.nn.JKNet(16, data.num_classes, mode="cat", backend=backend)
    params = make("xla").init(jax.random.key(0), graph)["params"]
    want = make("xla").apply({"params": params}, graph)
    row = {"model": "jknet (cat, 2 GCN layers of 16)", "dataset": "cora"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, g, m=m: m.apply({"params": p}, g), _ce(labels))
        _put(row, "jgnn" if system == "xla" else "reference", _run(step, params, graph, repeat=repeat))
    hand_fn = lambda p, x, s, r: _jknet_hand(p, x, s, r, 2)
    row["hand_max_abs_diff"] = _same(hand_fn(params, graph.nodes, graph.senders, graph.receivers), want, "jknet hand")
    _put(row, "hand", _run(_step(hand_fn, _ce(labels)), params, graph.nodes, graph.senders, graph.receivers,
                           repeat=repeat))
    model = ft.jknet(params, graph.nodes.shape[1], 16, data.num_classes)
    edge_index = ft.tensor(np.stack([np.asarray(graph.senders), np.asarray(graph.receivers)]))
    torch_labels = ft.tensor(labels)
    _put_torch(row, ft.measure(model, (ft.tensor(graph.nodes), edge_index), ft.cross_entropy(torch_labels),
                               check=lambda got: _same(got, want, "jknet torch"), repeat=repeat,
                               extra=(torch_labels,)))
    row.update(selection=0.0, selection_note="none")
    return row


def bench_pinsage(repeat):
    ft = _flexible_torch()
    graph, labels, data = _cora()
    key = jax.random.key(1)
    make = lambda backend: jgnn.nn.PinSage(64, data.num_classes, backend=backend)
    params = make("xla").init(jax.random.key(0), graph, key)["params"]
    select = jax.jit(lambda g, k: jgnn.nn.random_walk_neighbors(g, k))
    nbhd = select(graph, key)
    want = _pinsage_apply(make("xla"), params, graph, nbhd)
    row = {"model": "pinsage (2 layers of 64, top-10 of 10 walks x 3)", "dataset": "cora"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, g, nb, m=m: _pinsage_apply(m, p, g, nb), _ce(labels))
        _put(row, "jgnn" if system == "xla" else "reference", _run(step, params, graph, nbhd, repeat=repeat))
    level = nbhd.levels[0]
    ids, imp = level.graph.senders.reshape(-1, 10), level.graph.edges["importance"].reshape(-1, 10)
    row["hand_max_abs_diff"] = _same(_pinsage_hand(params, graph.nodes, ids, imp, 2), want, "pinsage hand")
    hand = _step(lambda p, x, i, w: _pinsage_hand(p, x, i, w, 2), _ce(labels))
    _put(row, "hand", _run(hand, params, graph.nodes, ids, imp, repeat=repeat))
    model = ft.pinsage(params, graph.nodes.shape[1], 64, data.num_classes)
    inputs = (ft.tensor(graph.nodes), ft.tensor(level.graph.senders), ft.tensor(level.graph.receivers),
              ft.tensor(level.graph.edges["importance"]))
    torch_labels = ft.tensor(labels)
    _put_torch(row, ft.measure(model, inputs, ft.cross_entropy(torch_labels),
                               check=lambda got: _same(got, want, "pinsage torch"), repeat=repeat,
                               extra=(torch_labels,)))
    row["selection"] = _time(select, graph, key, repeat=repeat)
    row["selection_note"] = "jitted random walks + top-k, every step"
    return row


def _pinsage_apply(model, params, graph, nbhd):
    """PinSage's layers and classifier on a given neighbourhood (the model's own call selects one per key)."""
    h = graph.nodes
    for i in range(model.num_layers):
        conv = jgnn.nn.PinSageConv(model.hidden, backend=model.backend)
        h = conv.apply({"params": params[f"conv{i}"]}, graph._replace(nodes=h), nbhd).nodes
    return h @ params["lin"]["kernel"] + params["lin"]["bias"]


def bench_pgnn(repeat):
    ft = _flexible_torch()
    graph, _, data = _cora()
    n = graph.nodes.shape[0]
    start = time.perf_counter()
    sim = jgnn.nn.hop_similarity(np.asarray(graph.senders), np.asarray(graph.receivers), n)
    distances = time.perf_counter() - start
    rng = np.random.default_rng(0)
    nbhd = jgnn.nn.anchor_neighborhood(sim, rng)
    make = lambda backend: jgnn.nn.PGNN(32, backend=backend)
    params = make("xla").init(jax.random.key(0), graph, nbhd)["params"]
    want = make("xla").apply({"params": params}, graph, nbhd)
    loss = lambda z: jnp.mean(jnp.sum(z[:-1] * z[1:], -1))
    row = {"model": f"pgnn (2 layers of 32, {nbhd.levels[0].fanout} anchor sets)", "dataset": "cora"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, g, nb, m=m: m.apply({"params": p}, g, nb), loss)
        _put(row, "jgnn" if system == "xla" else "reference", _run(step, params, graph, nbhd, repeat=repeat))
    level = nbhd.levels[0]
    k = level.fanout
    ids, s = level.graph.senders.reshape(n, k), level.graph.edges["s"].reshape(n, k)
    row["hand_max_abs_diff"] = _same(_pgnn_hand(params, graph.nodes, ids, s, 2), want, "pgnn hand")
    hand = _step(lambda p, x, i, s: _pgnn_hand(p, x, i, s, 2), loss)
    _put(row, "hand", _run(hand, params, graph.nodes, ids, s, repeat=repeat))
    model = ft.pgnn(params, graph.nodes.shape[1], 32)
    torch_loss = lambda z: (z[:-1] * z[1:]).sum(-1).mean()
    _put_torch(row, ft.measure(model, (ft.tensor(graph.nodes), ft.tensor(ids), ft.tensor(s)), torch_loss,
                               check=lambda got: _same(got, want, "pgnn torch"), repeat=repeat))
    draws = []
    for _ in range(repeat):
        start = time.perf_counter()
        jgnn.nn.anchor_neighborhood(sim, rng)
        draws.append(time.perf_counter() - start)
    row["selection"] = statistics.median(draws)
    row["selection_note"] = f"host anchor draw, every epoch (hop distances once: {distances:.1f} s)"
    return row


def bench_magnn(repeat):
    from jgnn.datasets.hetero import load_hetero_dblp

    ft = _flexible_torch()
    data = load_hetero_dblp()
    metapaths = [("author", "paper", "author"), ("author", "paper", "term", "paper", "author"),
                 ("author", "paper", "venue", "paper", "author")]
    start = time.perf_counter()
    nbhd, info = jgnn.nn.metapath_neighborhood(data.graph, "author", metapaths, samples=8, seed=0)
    selection = time.perf_counter() - start
    types = list(data.graph.num_nodes)
    features = {t: jnp.asarray(data.graph.node_features[t]) if t in data.graph.node_features else None
                for t in types}
    num_nodes = dict(data.graph.num_nodes)
    make = lambda backend: jgnn.nn.MAGNN(64, data.num_classes, num_nodes, len(info["relations"]), backend=backend)
    params = make("xla").init(jax.random.key(0), features, nbhd)["params"]
    want = make("xla").apply({"params": params}, features, nbhd)
    labels = jnp.asarray(data.labels)
    row = {"model": "magnn (rotation encoder, 64, 3 metapaths x 8 samples)", "dataset": "hetero_dblp"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, f, nb, m=m: m.apply({"params": p}, f, nb), _ce(labels))  # features: an argument
        _put(row, "jgnn" if system == "xla" else "reference", _run(step, params, features, nbhd, repeat=repeat))
    l0, l1, l2 = nbhd.levels
    arrays = ((l0.graph.senders, l0.graph.receivers, l0.graph.edges["coef"]),
              (l1.graph.senders, l1.graph.receivers, l1.graph.edges["metapath"]))
    sizes = (l0.num_groups, l1.num_groups)
    hand_fn = lambda p, f, a: _magnn_hand(p, f, types, a, sizes, 64, l2.fanout, l2.num_groups)
    row["hand_max_abs_diff"] = _same(hand_fn(params, features, arrays), want, "magnn hand")
    hand = _step(hand_fn, _ce(labels))
    _put(row, "hand", _run(hand, params, features, arrays, repeat=repeat))
    if not (bool(np.all(np.asarray(l0.mask))) and bool(np.all(np.asarray(l1.mask)))):
        raise ValueError("magnn torch: the edge lists below assume no masked (padding) members")
    model = ft.magnn(params, features, num_nodes, 64, data.num_classes, len(info["relations"]), l2.fanout,
                     l0.num_groups)
    torch_features = {t: None if f is None else ft.tensor(f) for t, f in features.items()}
    inputs = (torch_features, ft.tensor(l0.graph.senders), ft.tensor(l0.graph.receivers),
              ft.tensor(l0.graph.edges["coef"]), ft.tensor(l1.graph.senders), ft.tensor(l1.graph.receivers),
              ft.tensor(np.argmax(np.asarray(l1.graph.edges["metapath"]), -1)))
    torch_labels = ft.tensor(labels)
    _put_torch(row, ft.measure(model, inputs, ft.cross_entropy(torch_labels),
                               check=lambda got: _same(got, want, "magnn torch"), repeat=repeat,
                               extra=(torch_labels,)))
    row["selection"] = selection / 100
    row["selection_note"] = f"host metapath sampling once ({selection:.1f} s), shared over 100 epochs"
    return row


def _table(rows) -> str:
    lines = ["| model | data | jgnn (xla) ms | reference ms | hand ms | torch/PyG ms | jgnn / hand | jgnn / PyG | "
             "MiB jgnn / reference / hand / PyG | selection ms | selection share of a jgnn step | selection |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ms = lambda v: "-" if v is None else f"{1e3 * v:.1f}"
    mib = lambda v: "-" if v is None else f"{v / 2**20:.1f}"
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"
    for r in rows:
        share = r["selection"] / (r["selection"] + r["jgnn"])
        memory = " / ".join(mib(r.get(f"{s}_bytes")) for s in ("jgnn", "reference", "hand", "torch"))
        lines.append(f"| {r['model']} | {r['dataset']} | {ms(r['jgnn'])} | {ms(r['reference'])} | "
                     f"{ms(r.get('hand'))} | {ms(r.get('torch'))} | {ratio(r['jgnn'], r.get('hand'))} | "
                     f"{ratio(r['jgnn'], r.get('torch'))} | {memory} | {ms(r['selection'])} | {100 * share:.0f} % | "
                     f"{r['selection_note']} |")
    return "\n".join(lines)


def _agreement(rows) -> str:
    diff = lambda v: "-" if v is None else f"{v:.1e}"
    return "; ".join(f"{r['model'].split()[0]} {diff(r.get('hand_max_abs_diff'))} / "
                     f"{diff(r.get('torch_max_abs_diff'))}" for r in rows)


NOTES = """\
One train step = forward + loss + backward, no optimizer (softmax cross-entropy over all nodes; P-GNN: the mean
dot product of consecutive nodes' embeddings), median of {repeat} steps after two warm-ups. The hand-written and
torch versions read the same parameter values, inputs and neighbourhood arrays, and their forward outputs are
checked equal to jgnn's (rtol 2e-4, atol 2e-5, f32) before they are timed; max abs difference to jgnn, hand /
torch: {agreement}.

* jgnn / reference / hand: jitted `jax.value_and_grad` steps; "reference" is jgnn's `backend="reference"` (gathers
  and segment ops over whole levels, as a jraph user writes them). Hand-written JK-Net: plain jnp GCN layers
  (`jax.ops.segment_sum`, a self-loop per node, symmetric normalisation computed in the step) concatenated.
* torch/PyG ({threads} intra-op threads, `torch.set_num_threads`): JK-Net is PyG's own
  `torch_geometric.nn.models.GCN(..., jk="cat")` (`GCNConv` + `JumpingKnowledge`); PinSage, P-GNN and MAGNN have
  no PyG layer and are written with `index_select` / `torch_geometric.utils.scatter` / `softmax`
  (`benchmarks/flexible_torch.py`; P-GNN as the authors' dense `[N, K]` layer).
* Memory (MiB): JAX systems, XLA's buffer assignment of the compiled step (`benchmarks.measure.xla_memory`:
  arguments + outputs + temp, nothing donated; every input is an argument, except the labels, a compiled-in
  constant of a few KiB); torch, the bytes of the tensors alive when a step starts (parameters, inputs, labels;
  int64 indices, as PyG's) plus the peak the step allocates (gradients included) from the PyTorch profiler's
  memory events, as `benchmarks.compare.pyg`.
* "selection share" = selection / (selection + jgnn step). JK-Net selects nothing: its "neighbourhood" is the
  fixed set of layer outputs.
* Not measured: GPU.

Machine: {cpu}, {num_cpus} cores; JAX {jax} (jaxlib {jaxlib}), torch {torch}, torch_geometric {torch_geometric},
Python {python}. {quiet}
`uptime` before: {uptime_before}; after: {uptime_after}.
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["jknet", "pinsage", "pgnn", "magnn"])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/flexible-cpu")
    parser.add_argument("--note", default="This project's shared 2-core CPU, other jobs running: not a quiet machine.",
                        help="a line on the machine's state for the .md")
    args_list = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(args_list)
    uptime = machine_uptime()
    benches = {"jknet": bench_jknet, "pinsage": bench_pinsage, "pgnn": bench_pgnn, "magnn": bench_magnn}
    rows = []
    for name in args.models:
        rows.append(benches[name](args.repeat))
        print(json.dumps(rows[-1]), flush=True)
    env = f"JGNN_DATA_DIR={os.environ['JGNN_DATA_DIR']} " if "JGNN_DATA_DIR" in os.environ else ""
    meta = {"device": str(jax.devices()[0]), **library_versions(), "cpu": cpu_model(), "num_cpus": os.cpu_count(),
            "uptime_before": uptime, "uptime_after": machine_uptime(), "torch_threads": _flexible_torch().THREADS,
            "repeat": args.repeat,
            "command": env + shlex.join(["python", "-m", "benchmarks.flexible", *args_list]), "note": args.note}
    with open(f"{args.out}.json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(f"{args.out}.md", "w") as f:
        f.write(f"# Flexible neighbourhoods: one train step ({meta['device']}, JAX {meta['jax']}, "
                f"torch {meta['torch']})\n\n")
        f.write(_table(rows) + "\n\n")
        f.write(f"Command: `{meta['command']}`\n\n")
        f.write(NOTES.format(agreement=_agreement(rows), threads=meta["torch_threads"],
                             quiet=args.note, **meta))
    print(_table(rows))


if __name__ == "__main__":
    main()
