"""Flexible-neighbourhood models (`jgnn.neighborhood`): jgnn against hand-written XLA, and the share of selection.

    JGNN_DATA_DIR=../shared/data python -m benchmarks.flexible --out benchmarks/results/flexible-cpu

For each model (JK-Net, PinSage and P-GNN on Cora, MAGNN on hetero_dblp, the settings of
``examples/train_flexible.py``), one jitted train step (forward and backward of a softmax cross-entropy or, for
P-GNN, the mean dot product of consecutive nodes' embeddings) is timed for

* ``jgnn``: the `jgnn.nn` model with ``backend="xla"`` (each ragged level compiled as a graph level);
* ``reference``: the same model with ``backend="reference"`` (jgnn's uncompiled program: gathers and segment ops
  over whole levels, as a jraph user writes them);
* ``hand``: a hand-written jnp / ``jax.ops.segment_*`` / ``jraph.segment_softmax`` version reading the same
  parameters, checked to give jgnn's outputs (JK-Net: none, its convolutions are jgnn layers either way);

and the neighbourhood selection is timed on its own: PinSage's jitted random walks (run every step), P-GNN's host
anchor draw (every epoch), MAGNN's host metapath sampling (once; its share is over 100 epochs). Each time is the
median of ``--repeat`` runs after two warm-ups. Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax

import jgnn
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


def _same(got, want, what: str) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5, err_msg=what)


def _step(apply, loss_of):
    return jax.jit(jax.value_and_grad(lambda params, *a: loss_of(apply(params, *a))))


def _cora():
    data = load_planetoid("cora")
    x = data.graph.nodes / np.maximum(data.graph.nodes.sum(1, keepdims=True), 1e-12)
    return jax.device_put(data.graph._replace(nodes=jnp.asarray(x, jnp.float32))), jnp.asarray(data.labels), data


def _ce(labels):
    return lambda logits: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


# ---- hand-written versions ---------------------------------------------------------------------------------

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
    graph, labels, data = _cora()
    make = lambda backend: jgnn.nn.JKNet(16, data.num_classes, mode="cat", backend=backend)
    params = make("xla").init(jax.random.key(0), graph)["params"]
    row = {"model": "jknet (cat, 2 GCN layers)", "dataset": "cora"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, g, m=m: m.apply({"params": p}, g), _ce(labels))
        row["jgnn" if system == "xla" else "reference"] = _time(step, params, graph, repeat=repeat)
    row.update(hand=None, selection=0.0, selection_note="none")
    return row


def bench_pinsage(repeat):
    graph, labels, data = _cora()
    key = jax.random.key(1)
    make = lambda backend: jgnn.nn.PinSage(64, data.num_classes, backend=backend)
    params = make("xla").init(jax.random.key(0), graph, key)["params"]
    select = jax.jit(lambda g, k: jgnn.nn.random_walk_neighbors(g, k))
    nbhd = select(graph, key)
    row = {"model": "pinsage (2 layers of 64, top-10 of 10 walks x 3)", "dataset": "cora"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, g, nb, m=m: _pinsage_apply(m, p, g, nb), _ce(labels))
        row["jgnn" if system == "xla" else "reference"] = _time(step, params, graph, nbhd, repeat=repeat)
    level = nbhd.levels[0]
    ids, imp = level.graph.senders.reshape(-1, 10), level.graph.edges["importance"].reshape(-1, 10)
    _same(_pinsage_hand(params, graph.nodes, ids, imp, 2), _pinsage_apply(make("xla"), params, graph, nbhd), "pinsage")
    hand = _step(lambda p, x, i, w: _pinsage_hand(p, x, i, w, 2), _ce(labels))
    row["hand"] = _time(hand, params, graph.nodes, ids, imp, repeat=repeat)
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
    graph, _, data = _cora()
    n = graph.nodes.shape[0]
    start = time.perf_counter()
    sim = jgnn.nn.hop_similarity(np.asarray(graph.senders), np.asarray(graph.receivers), n)
    distances = time.perf_counter() - start
    rng = np.random.default_rng(0)
    nbhd = jgnn.nn.anchor_neighborhood(sim, rng)
    make = lambda backend: jgnn.nn.PGNN(32, backend=backend)
    params = make("xla").init(jax.random.key(0), graph, nbhd)["params"]
    loss = lambda z: jnp.mean(jnp.sum(z[:-1] * z[1:], -1))
    row = {"model": f"pgnn (2 layers of 32, {nbhd.levels[0].fanout} anchor sets)", "dataset": "cora"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, g, nb, m=m: m.apply({"params": p}, g, nb), loss)
        row["jgnn" if system == "xla" else "reference"] = _time(step, params, graph, nbhd, repeat=repeat)
    level = nbhd.levels[0]
    k = level.fanout
    ids, s = level.graph.senders.reshape(n, k), level.graph.edges["s"].reshape(n, k)
    _same(_pgnn_hand(params, graph.nodes, ids, s, 2), make("xla").apply({"params": params}, graph, nbhd), "pgnn")
    hand = _step(lambda p, x, i, s: _pgnn_hand(p, x, i, s, 2), loss)
    row["hand"] = _time(hand, params, graph.nodes, ids, s, repeat=repeat)
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

    data = load_hetero_dblp()
    metapaths = [("author", "paper", "author"), ("author", "paper", "term", "paper", "author"),
                 ("author", "paper", "venue", "paper", "author")]
    start = time.perf_counter()
    nbhd, info = jgnn.nn.metapath_neighborhood(data.graph, "author", metapaths, samples=8, seed=0)
    selection = time.perf_counter() - start
    types = list(data.graph.num_nodes)
    features = {t: jnp.asarray(data.graph.node_features[t]) if t in data.graph.node_features else None
                for t in types}
    make = lambda backend: jgnn.nn.MAGNN(64, data.num_classes, dict(data.graph.num_nodes), len(info["relations"]),
                                         backend=backend)
    params = make("xla").init(jax.random.key(0), features, nbhd)["params"]
    labels = jnp.asarray(data.labels)
    row = {"model": "magnn (rotation encoder, 64, 3 metapaths x 8 samples)", "dataset": "hetero_dblp"}
    for system in ("xla", "reference"):
        m = make(system)
        step = _step(lambda p, nb, m=m: m.apply({"params": p}, features, nb), _ce(labels))
        row["jgnn" if system == "xla" else "reference"] = _time(step, params, nbhd, repeat=repeat)
    l0, l1, l2 = nbhd.levels
    arrays = ((l0.graph.senders, l0.graph.receivers, l0.graph.edges["coef"]),
              (l1.graph.senders, l1.graph.receivers, l1.graph.edges["metapath"]))
    sizes = (l0.num_groups, l1.num_groups)
    hand_fn = lambda p, a: _magnn_hand(p, features, types, a, sizes, 64, l2.fanout, l2.num_groups)
    _same(hand_fn(params, arrays), make("xla").apply({"params": params}, features, nbhd), "magnn")
    hand = _step(hand_fn, _ce(labels))
    row["hand"] = _time(hand, params, arrays, repeat=repeat)
    row["selection"] = selection / 100
    row["selection_note"] = f"host metapath sampling once ({selection:.1f} s), shared over 100 epochs"
    return row


def _table(rows) -> str:
    lines = ["| model | data | jgnn (xla) ms | reference ms | hand-written ms | jgnn / hand | selection ms | "
             "selection share of a jgnn step | selection |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = lambda v: "-" if v is None else f"{1e3 * v:.1f}"
        ratio = "-" if r["hand"] is None else f"{r['jgnn'] / r['hand']:.2f}"
        share = r["selection"] / (r["selection"] + r["jgnn"])
        lines.append(f"| {r['model']} | {r['dataset']} | {ms(r['jgnn'])} | {ms(r['reference'])} | {ms(r['hand'])} | "
                     f"{ratio} | {ms(r['selection'])} | {100 * share:.0f} % | {r['selection_note']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["jknet", "pinsage", "pgnn", "magnn"])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/flexible-cpu")
    args = parser.parse_args(argv)
    benches = {"jknet": bench_jknet, "pinsage": bench_pinsage, "pgnn": bench_pgnn, "magnn": bench_magnn}
    rows = []
    for name in args.models:
        rows.append(benches[name](args.repeat))
        print(json.dumps(rows[-1]), flush=True)
    meta = {"device": str(jax.devices()[0]), "jax": jax.__version__, "repeat": args.repeat,
            "command": "python -m benchmarks.flexible " + " ".join(argv or [])}
    with open(f"{args.out}.json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(f"{args.out}.md", "w") as f:
        f.write(f"# Flexible neighbourhoods: one train step ({meta['device']}, JAX {meta['jax']})\n\n")
        f.write(_table(rows) + "\n")
    print(_table(rows))


if __name__ == "__main__":
    main()
