"""Graph classification on TUDataset sets with GIN (Xu et al. 2019), 10-fold cross-validated.

    python examples/graph_classification.py --dataset MUTAG --seed 0
    python examples/graph_classification.py --dataset PROTEINS --seed 0

Model (GIN-0 of the paper): 4 `jgnn.nn.GINConv` layers (5 with the input layer, eps = 0), each MLP Dense-ReLU-Dense
with hidden width 32, then batch norm (over real nodes only: padding is masked out) and ReLU; the readout sums
each layer's node features per graph (`jgnn.nn.sum_pool`, the input layer's too) and adds up one linear
classifier per layer, with dropout 0.5 before it. Adam, lr 0.01 halved every 50 epochs, batch size 32,
cross-entropy. Node features: the one-hot node labels of the TU files (PyG's ``TUDataset``); sets without node
labels (IMDB-BINARY, REDDIT-BINARY) use one-hot degrees.

Protocol (the GIN paper's, section 7): stratified 10-fold cross-validation (seeded); in each fold train on nine
folds and measure the accuracy on the tenth after every epoch; report the epoch whose accuracy averaged over the
folds is best, as mean ± standard deviation over the folds. That selection uses the test folds, as the paper
does; the last epoch's figure is printed too (no selection).

Batches are padded to a few bucket sizes (`jgnn.batching`), so each jitted function compiles once per bucket;
the JSON line reports how many sizes were compiled.

Published (GIN paper, Table 1, GIN-0): MUTAG 89.4 ± 5.6, PROTEINS 76.2 ± 2.8.
Ends with one JSON line: ``{"dataset", "seed", "folds", "epochs", "accuracy_mean", "accuracy_std", "best_epoch",
"last_epoch_mean", "last_epoch_std", "seconds", "compiled_sizes", ...}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax
from _common import final_json
from tqdm import tqdm

import jgnn
from jgnn import batching
from jgnn import nn as jnn
from jgnn.datasets import load_tu, one_hot_degree


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 32
    layers: int = 4
    dropout: float = 0.5
    lr: float = 0.01
    decay_every: int = 50
    batch_size: int = 32
    epochs: int = 350


class GIN(nn.Module):
    """GIN-0 with a sum readout of every layer (jumping knowledge), as in the GIN paper."""

    num_classes: int
    config: Config
    backend: str = "auto"

    @nn.compact
    def __call__(self, graph: jraph.GraphsTuple, *, train: bool = False) -> jax.Array:
        c = self.config
        node_mask = jraph.get_node_padding_mask(graph)[:, None]
        x = graph.nodes
        readouts = [jnn.sum_pool(graph, x)]
        for _ in range(c.layers):
            mlp = nn.Sequential([nn.Dense(c.hidden), nn.relu, nn.Dense(c.hidden)])
            x = jnn.GINConv(mlp, backend=self.backend)(graph._replace(nodes=x, edges=None)).nodes
            x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x, mask=node_mask))
            readouts.append(jnn.sum_pool(graph, jnp.where(node_mask, x, 0.0)))
        drop = nn.Dropout(c.dropout, deterministic=not train)
        return sum(nn.Dense(self.num_classes)(drop(r)) for r in readouts)


def stratified_folds(labels: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """``k`` disjoint index arrays covering ``labels``, each with about the same class proportions (seeded)."""
    rng = np.random.default_rng(seed)
    folds: list[list[int]] = [[] for _ in range(k)]
    start = 0
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        for j, i in enumerate(members):  # deal the class round-robin, continuing where the last class stopped
            folds[(start + j) % k].append(int(i))
        start += members.shape[0]
    return [np.sort(np.asarray(f, np.int64)) for f in folds]


def node_inputs(name: str):
    ds = load_tu(name)
    if ds.graph.nodes is None:
        ds = dataclasses.replace(ds, graph=ds.graph._replace(nodes=one_hot_degree(ds)))
    return ds


def run_fold(ds, train_idx, test_idx, config: Config, epochs: int, seed: int, backend: str, buckets, jitted):
    """Train on ``train_idx`` and return the test accuracy after every epoch (list of ``epochs`` floats)."""
    model = GIN(ds.num_classes, config, backend)
    rng = np.random.default_rng(seed)
    first = next(batching.padded_batches(ds.graph, ds.labels, train_idx[: config.batch_size], config.batch_size,
                                         buckets))
    key = jax.random.key(seed)
    variables = model.init({"params": key, "dropout": key}, jax.device_put(first.graph))
    # the learning rate is an optimiser-state value (set every epoch), so one jitted step serves every fold
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=config.lr)
    state = (variables["params"], variables["batch_stats"], tx.init(variables["params"]))

    if "step" not in jitted:
        def step(state, graph, labels, mask, key):
            params, stats, opt = state

            def loss_fn(params):
                logits, updates = model.apply({"params": params, "batch_stats": stats}, graph, train=True,
                                              rngs={"dropout": key}, mutable=["batch_stats"])
                ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
                return jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.sum(mask), updates["batch_stats"]

            (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt = tx.update(grads, opt, params)
            return (optax.apply_updates(params, updates), stats, opt), loss

        def correct(state, graph, labels, mask):
            params, stats, _ = state
            logits = model.apply({"params": params, "batch_stats": stats}, graph)
            return jnp.sum(jnp.where(mask, jnp.argmax(logits, -1) == labels, False))

        # the model and optimiser are the same in every fold (only their values change), so one jit serves all
        jitted["step"], jitted["correct"] = jax.jit(step), jax.jit(correct)
    step, correct = jitted["step"], jitted["correct"]
    test_batches = [jax.device_put(b) for b in batching.padded_batches(ds.graph, ds.labels, test_idx,
                                                                       config.batch_size, buckets)]
    key = jax.random.key(seed + 1)
    accuracies = []
    for epoch in range(epochs):
        lr = config.lr * 0.5 ** (epoch // config.decay_every)
        state[2].hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
        for batch in batching.padded_batches(ds.graph, ds.labels, train_idx, config.batch_size, buckets, rng=rng):
            key, sub = jax.random.split(key)
            state, _ = step(state, jax.device_put(batch.graph), batch.labels, batch.mask, sub)
        hits = sum(int(correct(state, b.graph, b.labels, b.mask)) for b in test_batches)
        accuracies.append(hits / test_idx.shape[0])
    return accuracies


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="MUTAG", help="a TU data set name, e.g. MUTAG, PROTEINS, NCI1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--folds", type=int, default=10)
    p.add_argument("--epochs", type=int, default=None, help="epochs per fold (default 350, the paper's)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--buckets", type=int, default=3, help="padding bucket sizes (one compilation each)")
    p.add_argument("--smoke", action="store_true", help="2 folds of 2 epochs, for tests")
    p.add_argument("--backend", default="auto", choices=list(jgnn.BACKENDS))
    args = p.parse_args(argv)
    start = time.perf_counter()
    config = Config()
    config = dataclasses.replace(config, batch_size=args.batch_size or config.batch_size,
                                 hidden=args.hidden or config.hidden)
    epochs = 2 if args.smoke else (args.epochs or config.epochs)
    ds = node_inputs(args.dataset)
    folds = stratified_folds(ds.labels, args.folds, args.seed)
    buckets = batching.padding_buckets(ds.graph, config.batch_size, num_buckets=args.buckets, seed=args.seed)
    print(f"{ds.name}: {ds.num_graphs} graphs, {ds.num_features} node features, {ds.num_classes} classes; "
          f"buckets (nodes, edges, graphs): {[(b.n_node, b.n_edge, b.n_graph) for b in buckets]}", flush=True)
    run_folds = folds[:2] if args.smoke else folds
    curves, jitted = [], {}
    for i, test_idx in enumerate(tqdm(run_folds, desc=f"GIN/{ds.name} folds", file=sys.stderr)):
        train_idx = np.concatenate([f for j, f in enumerate(folds) if j != i])
        curves.append(run_fold(ds, train_idx, test_idx, config, epochs, args.seed * 100 + i, args.backend, buckets,
                               jitted))
    curves = np.asarray(curves)  # [folds, epochs]
    mean_curve = curves.mean(axis=0)
    best = int(np.argmax(mean_curve))
    at_best = 100 * curves[:, best]
    last = 100 * curves[:, -1]
    std = lambda a: statistics.stdev(a.tolist()) if a.shape[0] > 1 else 0.0
    print(f"{ds.name}: best mean epoch {best + 1}: {at_best.mean():.1f} ± {std(at_best):.1f} % "
          f"(folds: {' '.join(f'{a:.1f}' for a in at_best)}); last epoch: {last.mean():.1f} ± {std(last):.1f} %")
    final_json(example="graph_classification", dataset=ds.name, seed=args.seed, folds=len(run_folds), epochs=epochs,
               accuracy_mean=round(float(at_best.mean()), 2), accuracy_std=round(std(at_best), 2),
               best_epoch=best + 1, last_epoch_mean=round(float(last.mean()), 2), last_epoch_std=round(std(last), 2),
               fold_accuracies=[round(float(a), 2) for a in at_best], batch_size=config.batch_size,
               hidden=config.hidden, compiled_sizes={k: f._cache_size() for k, f in jitted.items()},
               buckets=len(buckets), backend=args.backend, seconds=round(time.perf_counter() - start, 1))


if __name__ == "__main__":
    main()
