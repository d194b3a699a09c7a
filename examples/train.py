"""Full-batch node classification on Planetoid (Cora, CiteSeer, PubMed) with `jgnn.nn` layers.

    python examples/train.py --model gat --dataset cora --seed 0

Published settings (the paper's, not PyG's examples):

* GCN (Kipf & Welling 2017): 2 layers, 16 hidden, ReLU, dropout 0.5, Adam lr 0.01, 200 epochs,
  L2 5e-4 on the first layer's weights.
* GAT (Veličković et al. 2018): 8 heads x 8 hidden, ELU, output layer with 1 head (8 averaged heads
  on PubMed), dropout 0.6 on every layer's input and on the attention coefficients, Adam lr 0.005,
  L2 5e-4 on all weights (not biases), patience 100 (PubMed: lr 0.01, L2 1e-3).
* GATv2: as GAT. SAGE (mean) and GIN: 16 hidden, dropout 0.5, lr 0.01, L2 5e-4 on all weights.

Weight decay is L2 as in the papers: ``wd * sum(||W||^2) / 2`` (TensorFlow's ``l2_loss``) is added to the
loss, and plain Adam minimises it (not ``optax.add_decayed_weights``, which would decay Adam's update
instead of adding the gradient before Adam's normalisation). Features are row-normalised (each row sums to 1)
as in both papers. The reported test accuracy is at the epoch of best validation accuracy (ties: lower
validation loss); training stops once neither improved for ``patience`` epochs.

Prints a tqdm bar (stderr), the compile report of the first layer, the XLA temp memory of one train step for
``--backend`` vs the reference program, writes ``<out-dir>/<model>_<dataset>_seed<S>.png`` and ends with one
JSON line: ``{"model", "dataset", "seed", "test_accuracy", "val_accuracy", "epochs", "seconds", ...}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import Timer, default_out_dir, final_json, memory_comparison, memory_line, save_curves
from tqdm import tqdm

import jgnn
from jgnn import nn as jnn
from jgnn.datasets import load_planetoid


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 16
    heads: int = 8
    out_heads: int = 1
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    decay_first_layer_only: bool = False
    epochs: int = 200
    patience: int = 200


def config_for(model: str, dataset: str) -> Config:
    if model == "gcn":
        return Config(decay_first_layer_only=True)
    if model in ("gat", "gatv2"):
        if dataset == "pubmed":
            return Config(hidden=8, heads=8, out_heads=8, dropout=0.6, lr=0.01, weight_decay=1e-3,
                          epochs=1000, patience=100)
        return Config(hidden=8, heads=8, out_heads=1, dropout=0.6, lr=0.005, weight_decay=5e-4,
                      epochs=1000, patience=100)
    return Config()  # sage, gin


def first_layer(model: str, c: Config, b: str, **kw) -> nn.Module:
    if model == "gcn":
        return jnn.GCNConv(c.hidden, backend=b, **kw)
    if model == "gat":
        return jnn.GATConv(c.hidden, c.heads, dropout=c.dropout, attention_dropout=c.dropout, backend=b, **kw)
    if model == "gatv2":
        return jnn.GATv2Conv(c.hidden, c.heads, dropout=c.dropout, attention_dropout=c.dropout, backend=b, **kw)
    if model == "sage":
        return jnn.SAGEConv(c.hidden, backend=b, **kw)
    if model == "gin":
        return jnn.GINConv(nn.Sequential([nn.Dense(c.hidden), nn.relu, nn.Dense(c.hidden)]), backend=b, **kw)
    raise ValueError(f"unknown model {model!r}")


class NodeClassifier(nn.Module):
    model: str
    num_classes: int
    config: Config
    backend: str = "auto"

    @nn.compact
    def __call__(self, graph, *, deterministic: bool = True):
        c, b, k = self.config, self.backend, self.num_classes
        if self.model in ("gat", "gatv2"):
            conv = jnn.GATConv if self.model == "gat" else jnn.GATv2Conv
            graph = first_layer(self.model, c, b, name="conv1")(graph, deterministic=deterministic)
            graph = graph._replace(nodes=nn.elu(graph.nodes))
            out = conv(k, c.out_heads, concat=False, dropout=c.dropout, attention_dropout=c.dropout, backend=b,
                       name="conv2")
            return out(graph, deterministic=deterministic).nodes
        drop = nn.Dropout(c.dropout)
        graph = graph._replace(nodes=drop(graph.nodes, deterministic=deterministic))
        graph = first_layer(self.model, c, b, name="conv1")(graph, deterministic=deterministic)
        graph = graph._replace(nodes=drop(nn.relu(graph.nodes), deterministic=deterministic))
        if self.model == "gcn":
            last = jnn.GCNConv(k, backend=b, name="conv2")
        elif self.model == "sage":
            last = jnn.SAGEConv(k, backend=b, name="conv2")
        else:
            last = jnn.GINConv(nn.Sequential([nn.Dense(c.hidden), nn.relu, nn.Dense(k)]), backend=b, name="conv2")
        return last(graph, deterministic=deterministic).nodes


def l2_penalty(params, config: Config):
    """``sum ||W||^2 / 2`` over weights (arrays of rank >= 2 and GIN's eps excluded; biases excluded)."""
    tree = {"conv1": params["conv1"]} if config.decay_first_layer_only else params
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if x.ndim >= 2]
    return sum(jnp.sum(x * x) for x in leaves) / 2.0


def row_normalize(x: np.ndarray) -> np.ndarray:
    s = x.sum(1, keepdims=True)
    return (x / np.where(s == 0, 1.0, s)).astype(np.float32)


def load(name: str, features: str, seed: int):
    ds = load_planetoid(name)
    x = ds.graph.nodes
    if x is None:
        if features != "random":
            sys.exit(f"error: the {name} data here has no node features (see jgnn.datasets.load_planetoid); "
                     f"pass --features random to train on random features (accuracy is then meaningless)")
        print(f"warning: {name} has no features; using random features: the accuracy is meaningless", flush=True)
        x = np.random.default_rng(seed).random((ds.num_nodes, 500)).astype(np.float32)
    graph = ds.graph._replace(nodes=jnp.asarray(row_normalize(np.asarray(x))))
    return ds, jax.device_put(graph)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gat", choices=["gcn", "gat", "gatv2", "sage", "gin"])
    p.add_argument("--dataset", default="cora", choices=["cora", "citeseer", "pubmed"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None, help="maximum epochs (default: the paper's)")
    p.add_argument("--patience", type=int, default=None)
    p.add_argument("--smoke", action="store_true", help="3 epochs, for tests")
    p.add_argument("--backend", default="auto", choices=list(jgnn.BACKENDS))
    p.add_argument("--features", default="dataset", choices=["dataset", "random"])
    p.add_argument("--out-dir", default=default_out_dir())
    p.add_argument("--no-memory", action="store_true", help="skip the memory comparison with the reference")
    args = p.parse_args(argv)
    start = time.perf_counter()

    config = config_for(args.model, args.dataset)
    epochs = 3 if args.smoke else (args.epochs or config.epochs)
    patience = args.patience or config.patience
    ds, graph = load(args.dataset, args.features, args.seed)
    labels = jnp.asarray(np.maximum(ds.labels, 0))
    masks = {k: jnp.asarray(getattr(ds, f"{k}_mask")) for k in ("train", "val", "test")}

    def build(backend):
        return NodeClassifier(args.model, ds.num_classes, config, backend)

    model = build(args.backend)
    key = jax.random.PRNGKey(args.seed)
    init_key, key = jax.random.split(key)
    params = model.init({"params": init_key, "dropout": init_key}, graph)["params"]
    tx = optax.adam(config.lr)
    opt_state = tx.init(params)

    # The data travels as jit arguments, never as closure constants: XLA would constant-fold the feature
    # gathers and scatters at compile time (minutes on CPU).
    data = (graph, labels, masks)

    def loss_fn(params, rng, data, model=model):
        graph, labels, masks = data
        logits = model.apply({"params": params}, graph, deterministic=False, rngs={"dropout": rng})
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        loss = jnp.sum(jnp.where(masks["train"], ce, 0.0)) / jnp.sum(masks["train"])
        return loss + config.weight_decay * l2_penalty(params, config), logits

    def make_step(model):
        def step(params, opt_state, rng, data):
            _, labels, masks = data
            (loss, logits), grads = jax.value_and_grad(lambda p: loss_fn(p, rng, data, model), has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            acc = jnp.sum(jnp.where(masks["train"], jnp.argmax(logits, -1) == labels, 0)) / jnp.sum(masks["train"])
            return optax.apply_updates(params, updates), opt_state, loss, acc
        return step

    @jax.jit
    def evaluate(params, data):
        graph, labels, masks = data
        logits = model.apply({"params": params}, graph)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        correct = jnp.argmax(logits, -1) == labels
        out = {}
        for k, m in masks.items():
            out[f"{k}_acc"] = jnp.sum(jnp.where(m, correct, 0)) / jnp.sum(m)
            out[f"{k}_loss"] = jnp.sum(jnp.where(m, ce, 0.0)) / jnp.sum(m)
        return out

    step = jax.jit(make_step(model))
    history = {"loss": [], "train_acc": [], "val_acc": [], "test_acc": []}
    best = {"val_acc": -1.0, "val_loss": np.inf, "test_acc": 0.0, "epoch": 0}
    best_loss, since_best, epoch = np.inf, 0, 0
    with Timer() as train_timer:
        bar = tqdm(range(1, epochs + 1), desc=f"{args.model}/{args.dataset}", file=sys.stderr, mininterval=0.5)
        for epoch in bar:
            key, sub = jax.random.split(key)
            params, opt_state, loss, acc = step(params, opt_state, sub, data)
            m = jax.device_get(evaluate(params, data))
            history["loss"].append(float(loss))
            history["train_acc"].append(float(acc))
            history["val_acc"].append(float(m["val_acc"]))
            history["test_acc"].append(float(m["test_acc"]))
            improved = False
            if m["val_acc"] > best["val_acc"] or (m["val_acc"] == best["val_acc"] and m["val_loss"] < best["val_loss"]):
                best = {"val_acc": float(m["val_acc"]), "val_loss": float(m["val_loss"]),
                        "test_acc": float(m["test_acc"]), "epoch": epoch}
                improved = True
            if m["val_loss"] < best_loss:
                best_loss, improved = float(m["val_loss"]), True
            since_best = 0 if improved else since_best + 1
            bar.set_postfix(loss=f"{float(loss):.3f}", train=f"{float(acc):.3f}", val=f"{float(m['val_acc']):.3f}",
                            best_test=f"{best['test_acc']:.3f}")
            if since_best >= patience:
                break
        bar.close()

    conv1 = first_layer(args.model, config, args.backend)
    layer_params = conv1.init(jax.random.PRNGKey(0), graph)["params"]
    if jax.tree_util.tree_structure(params.get("conv1")) == jax.tree_util.tree_structure(layer_params):
        layer_params = params["conv1"]  # the trained weights (GIN's MLP lives outside conv1: fresh ones)
    report = jgnn.explain(lambda g: conv1.apply({"params": layer_params}, g), graph)
    print(f"compile report (first layer): {report.summary()}")
    memory = None
    if not args.no_memory:
        memory = memory_comparison(lambda b: make_step(build(b)), args.backend, params, opt_state, key, data)
        print(memory_line(memory, args.backend))
    stem = f"{args.model}_{args.dataset}_seed{args.seed}"
    png = save_curves(history, args.out_dir, stem, f"{args.model} on {args.dataset} (seed {args.seed})")
    print(f"training curves: {png}")
    print(f"best validation accuracy {best['val_acc']:.4f} at epoch {best['epoch']}; "
          f"test accuracy there {best['test_acc']:.4f}")
    final_json(model=args.model, dataset=args.dataset, seed=args.seed, test_accuracy=round(best["test_acc"], 4),
               val_accuracy=round(best["val_acc"], 4), best_epoch=best["epoch"], epochs=epoch,
               seconds=round(time.perf_counter() - start, 2), train_seconds=round(train_timer.seconds, 2),
               backend=args.backend, features=args.features, memory=memory)


if __name__ == "__main__":
    main()
