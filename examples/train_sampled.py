"""Mini-batch GraphSAGE on graphs too large for one device: neighbour sampling or ClusterGCN batches.

    python examples/train_sampled.py --dataset amazon_computers --loader neighbor --seed 0
    python examples/train_sampled.py --dataset coauthor_physics --loader cluster --seed 0

Data and split as Shchur et al. (2018), "Pitfalls of Graph Neural Network Evaluation": the graph's largest
connected component, edges made undirected, a random split seeded by ``--seed`` with 20 training and 30
validation nodes per class and every other node in the test set. Features are binary bag-of-words (every non-zero
set to 1, as theirs and PyG's; Coauthor stores keyword counts), row-normalised (each row sums to 1) only with
``--row-normalize`` (off, as theirs); Coauthor's sparse features stay a host CSR and only a batch's rows are made
dense.

Model and training: Shchur et al.'s GraphSAGE-mean with their tuned settings (``gnn-benchmark``'s
``config/optimized/graphsage_mean.conf.yaml`` and ``train.conf.yaml``): two ``jgnn.nn.SAGEConv`` layers (mean
aggregation, root weight), each output row divided by ``max(||row||_2, 1)`` (GraphSAGE's normalisation, clipped
as theirs), ``--hidden`` units (32), ReLU, dropout ``--dropout`` (0.4) before each layer, Adam ``--lr`` (0.001),
L2 regularisation ``--weight-decay`` (0.1, i.e. ``0.05 * ||W||^2`` in the loss) on the first layer's kernels
only. Early stopping as theirs: the validation loss (whole graph) after every epoch, stop after ``--patience``
(50) epochs without a new minimum (at most ``--epochs``), and evaluate the test set with the parameters of the
minimum.

``--loader neighbor``: `jgnn.sampling.NeighborLoader` with fan-outs ``--fanouts`` (default 15 10, as PyG's
GraphSAGE examples) around batches of training nodes. ``--loader cluster``: `jgnn.sampling.ClusterLoader` over
``--clusters`` METIS clusters (``pymetis``; BFS runs without it), ``--clusters-per-batch`` at a time, with the
loss on the batch's training nodes. Every batch is padded to one static shape, so the train step compiles once.
``--eval full`` (default) evaluates on the whole graph with every neighbour, as PyG's GraphSAGE and ClusterGCN
examples do; ``--eval sampled`` on batches of the training loader's kind around the validation/test nodes.

Prints a tqdm bar (stderr) and ends with one JSON line: ``{"dataset", "loader", "seed", "test_accuracy",
"val_accuracy", "epochs", "best_epoch", "compiles", "seconds", ...}``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import final_json
from tqdm import tqdm

import jgnn
from jgnn.sampling import Batch, ClusterLoader, InCSR, NeighborLoader, in_csr, pad_subgraph, partition
from jgnn.sampling.csr import segment_ranges

DATASETS = ("amazon_computers", "amazon_photo", "coauthor_cs", "coauthor_physics")


class CSRFeatures:
    """Binary sparse features (row-normalised or not) kept as a CSR; ``features[ids]`` is the dense
    ``[len(ids), F]`` rows."""

    def __init__(self, indptr, indices, data, shape, row_normalize: bool):
        self.indptr, self.indices, self.shape = np.asarray(indptr, np.int64), np.asarray(indices), tuple(shape)
        data = (np.asarray(data) != 0).astype(np.float64)  # binary bag-of-words (Coauthor stores counts)
        if row_normalize:
            row = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
            data = data / np.maximum(np.bincount(row, weights=data, minlength=self.shape[0]), 1e-12)[row]
        self.data = data.astype(np.float32)

    def __getitem__(self, ids):
        ids = np.asarray(ids, np.int64)
        lengths = np.diff(self.indptr)[ids]
        at = segment_ranges(self.indptr[ids], lengths)
        out = np.zeros((ids.shape[0], self.shape[1]), np.float32)
        out[np.repeat(np.arange(ids.shape[0]), lengths), self.indices[at]] = self.data[at]
        return out

    def take(self, keep: np.ndarray) -> CSRFeatures:
        lengths = np.diff(self.indptr)[keep]
        at = segment_ranges(self.indptr[keep], lengths)
        new = object.__new__(CSRFeatures)
        new.indptr = np.concatenate([[0], np.cumsum(lengths)])
        new.indices, new.data, new.shape = self.indices[at], self.data[at], (keep.shape[0], self.shape[1])
        return new


def load(name: str, row_normalize: bool = False):
    """``(csr, features, labels, num_classes)`` of the largest connected component, edges undirected."""
    root = pathlib.Path(os.environ.get("JGNN_DATA_DIR", "../shared/data"))
    d = np.load(root / f"{name}.npz")
    n = int(d["num_nodes"])
    if "x" in d.files:
        x = (d["x"] != 0).astype(np.float32)
        if row_normalize:
            x = x / np.maximum(x.sum(1, keepdims=True), 1e-12)
    else:
        x = CSRFeatures(d["x_indptr"], d["x_indices"], d["x_data"], d["x_shape"], row_normalize)
    keep = np.flatnonzero(d["lcc_mask"])
    new_id = np.full(n, -1, np.int64)
    new_id[keep] = np.arange(keep.shape[0])
    s, r = new_id[d["senders"]], new_id[d["receivers"]]
    inside = (s >= 0) & (r >= 0) & (s != r)
    pairs = np.unique(np.concatenate([s[inside] * n + r[inside], r[inside] * n + s[inside]]))
    csr = in_csr(pairs // n, pairs % n, keep.shape[0])
    x = x.take(keep) if isinstance(x, CSRFeatures) else x[keep]
    return csr, x, d["y"][keep].astype(np.int32), int(d["num_classes"])


def split(labels: np.ndarray, num_classes: int, seed: int, train_per_class: int = 20, val_per_class: int = 30):
    """Shchur et al.'s random split: per class ``train_per_class`` training and ``val_per_class`` validation
    nodes; the rest is the test set. Returns ``(train, val, test)`` node id arrays."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for c in range(num_classes):
        nodes = rng.permutation(np.flatnonzero(labels == c))
        train.append(nodes[:train_per_class])
        val.append(nodes[train_per_class:train_per_class + val_per_class])
    train, val = np.sort(np.concatenate(train)), np.sort(np.concatenate(val))
    test = np.setdiff1d(np.arange(labels.shape[0]), np.concatenate([train, val]))
    return train, val, test


def clip_norm(h):
    """Each row divided by ``max(||row||_2, 1)``: GraphSAGE's output normalisation as Shchur et al. clip it (PyG's
    ``SAGEConv(normalize=True)`` divides by the norm itself). The clip comes before the square root, so that a zero
    row (padding) has a finite gradient."""
    return h / jnp.sqrt(jnp.maximum(jnp.sum(h * h, axis=-1, keepdims=True), 1.0))


class SAGE(nn.Module):
    hidden: int
    classes: int
    dropout: float

    @nn.compact
    def __call__(self, graph, *, train: bool = False):
        h = nn.Dropout(self.dropout, deterministic=not train)(graph.nodes)
        h = jax.nn.relu(clip_norm(jgnn.nn.SAGEConv(self.hidden)(graph._replace(nodes=h)).nodes))
        h = nn.Dropout(self.dropout, deterministic=not train)(h)
        return clip_norm(jgnn.nn.SAGEConv(self.classes)(graph._replace(nodes=h)).nodes)


def first_layer_kernels(params):
    """The mask of the parameters that Shchur et al. regularise: the first layer's two kernels (not its bias, not
    the output layer)."""
    return {layer: {name: layer == "SAGEConv_0" and name.startswith("kernel") for name in leaves}
            for layer, leaves in params.items()}


def loaders(args, csr: InCSR, x, labels, train, val, test):
    """A function ``role -> loader`` for "train", "val" and "test"."""
    common = dict(features=x, labels=labels, seed=args.seed, prefetch=args.prefetch)
    if args.loader == "neighbor":
        def make(role):
            seeds = {"train": train, "val": val, "test": test}[role]
            batch = args.batch_size if role == "train" else args.eval_batch_size
            return NeighborLoader(csr, seeds, args.fanouts, batch_size=batch, shuffle=role == "train",
                                  desc=role, **common)
        return make
    parts = partition(csr, args.clusters)

    def make(role):
        mask = np.zeros(csr.num_nodes, bool)
        mask[{"train": train, "val": val, "test": test}[role]] = True
        return ClusterLoader(csr, parts, clusters_per_batch=args.clusters_per_batch, mask=mask, desc=role,
                             **common)
    return make


def full_graph(csr: InCSR, x, labels, targets) -> Batch:
    """The whole graph as one batch (every neighbour, no sampling) with ``targets`` as its mask, as PyG's
    GraphSAGE and ClusterGCN examples evaluate."""
    n = csr.num_nodes
    receivers = np.repeat(np.arange(n), csr.in_degree())
    mask = np.zeros(n, bool)
    mask[targets] = True
    return pad_subgraph(np.arange(n), csr.senders, receivers, csr.edge_ids, mask, node_budget=n + 1,
                        edge_budget=csr.num_edges, features=x, labels=labels)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="amazon_computers", choices=DATASETS)
    p.add_argument("--loader", default="neighbor", choices=["neighbor", "cluster"])
    p.add_argument("--seed", type=int, default=0, help="split, initialisation and sampling seed")
    p.add_argument("--epochs", type=int, default=10000, help="at most this many epochs (early stopping ends sooner)")
    p.add_argument("--patience", type=int, default=50,
                   help="stop after this many epochs without a new minimum of the validation loss")
    p.add_argument("--eval-every", type=int, default=1, help="epochs between validation passes")
    p.add_argument("--fanouts", type=int, nargs="+", default=[15, 10])
    p.add_argument("--batch-size", type=int, default=512, help="seed nodes per training batch (neighbor)")
    p.add_argument("--eval-batch-size", type=int, default=1024, help="seed nodes per evaluation batch (neighbor)")
    p.add_argument("--clusters", type=int, default=40, help="METIS clusters (cluster)")
    p.add_argument("--clusters-per-batch", type=int, default=4, help="clusters in one batch (cluster)")
    p.add_argument("--eval", default="full", choices=["full", "sampled"],
                   help="validation/test on the whole graph with every neighbour, or on the training loader's batches")
    p.add_argument("--prefetch", type=int, default=1, help="batches built ahead in a background thread (0: none)")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.4)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--weight-decay", type=float, default=0.1,
                   help="L2 regularisation of the first layer's kernels (the loss gains weight_decay/2 * ||W||^2)")
    p.add_argument("--row-normalize", action="store_true", help="row-normalise the features (each row sums to 1)")
    p.add_argument("--smoke", action="store_true", help="2 epochs, for tests")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = p.parse_args(argv)
    start = time.perf_counter()
    epochs = 2 if args.smoke else args.epochs

    csr, x, labels, num_classes = load(args.dataset, args.row_normalize)
    train, val, test = split(labels, num_classes, args.seed)
    make = loaders(args, csr, x, labels, train, val, test)
    train_loader = make("train")
    if args.eval == "full":  # one device copy of the whole graph, evaluated every epoch; the roles differ in mask
        whole = jax.device_put(full_graph(csr, x, labels, val))
        test_mask = np.zeros(whole.mask.shape, bool)
        test_mask[test] = True
        evaluate = {"val": [whole], "test": [whole._replace(mask=jnp.asarray(test_mask))]}
    else:
        evaluate = {role: make(role) for role in ("val", "test")}

    model = SAGE(args.hidden, num_classes, args.dropout)
    first = jax.tree_util.tree_map(jnp.asarray, next(iter(train_loader.epoch(0))))
    params = model.init(jax.random.key(args.seed), first.graph)["params"]
    # Coupled L2 (the decay joins the gradient before Adam), as their loss term: not AdamW.
    tx = optax.chain(optax.masked(optax.add_decayed_weights(args.weight_decay), first_layer_kernels(params)),
                     optax.adam(args.lr))
    opt_state = tx.init(params)
    compiles = []

    @jax.jit
    def train_step(params, opt_state, batch, key):
        compiles.append(1)  # runs once per trace: the batches' static shapes should make that once

        def loss_fn(params):
            logits = model.apply({"params": params}, batch.graph, train=True, rngs={"dropout": key})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
            return jnp.sum(jnp.where(batch.mask, ce, 0.0)) / jnp.maximum(jnp.sum(batch.mask), 1)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def scores(params, batch):
        logits = model.apply({"params": params}, batch.graph)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        hit = jnp.argmax(logits, -1) == batch.labels
        return jnp.sum(jnp.where(batch.mask, ce, 0.0)), jnp.sum(jnp.where(batch.mask, hit, 0)), jnp.sum(batch.mask)

    def evaluate_role(params, role):
        """``(mean cross-entropy, accuracy)`` over the role's nodes."""
        loss, hits, total = 0.0, 0, 0
        batches = evaluate[role]
        for batch in batches if isinstance(batches, list) else batches.epoch(0):
            c, h, t = scores(params, batch)
            loss, hits, total = loss + float(c), hits + int(h), total + int(t)
        return loss / max(total, 1), hits / max(total, 1)

    key = jax.random.key(args.seed + 1)
    best = (np.inf, 0.0, 0, params)  # (val loss, val accuracy, epoch, params) at the minimum of the val loss
    bar = tqdm(range(epochs), desc=f"{args.dataset} {args.loader}", disable=args.no_progress)
    epoch = 0
    for epoch in bar:
        for batch in train_loader.epoch(epoch):
            key, step_key = jax.random.split(key)
            params, opt_state, loss = train_step(params, opt_state, batch, step_key)
        if (epoch + 1) % args.eval_every == 0 or epoch == epochs - 1:
            val_loss, val_acc = evaluate_role(params, "val")
            if val_loss <= best[0]:
                best = (val_loss, val_acc, epoch + 1, params)
            bar.set_postfix(loss=f"{float(loss):.3f}", val_loss=f"{val_loss:.3f}", val=f"{val_acc:.3f}")
            if epoch + 1 - best[2] >= args.patience:
                break
    _, val_acc, best_epoch, params = best
    _, test_acc = evaluate_role(params, "test")
    print(f"{args.dataset} {args.loader}: test accuracy {test_acc:.4f} (val {val_acc:.4f} at epoch {best_epoch})")
    final_json(dataset=args.dataset, loader=args.loader, seed=args.seed, test_accuracy=round(test_acc, 4),
               val_accuracy=round(val_acc, 4), epochs=epoch + 1, best_epoch=best_epoch, compiles=len(compiles),
               node_budget=train_loader.node_budget, edge_budget=train_loader.edge_budget,
               train_nodes=int(train.shape[0]), val_nodes=int(val.shape[0]), test_nodes=int(test.shape[0]),
               seconds=round(time.perf_counter() - start, 1))


if __name__ == "__main__":
    main()
