"""Entity classification on typed RDF graphs (AIFB, MUTAG) with `jgnn.nn` relational layers.

    python examples/train_hetero.py --model rgcn --dataset aifb --seed 0

R-GCN paper settings (Schlichtkrull et al. 2018): 2 layers, 16 hidden, ReLU, no dropout, full batch, Adam
lr 0.01, 50 epochs; basis decomposition with no bases on AIFB and 30 bases on MUTAG; L2 5e-4 on the first
layer's weights (bases and root, not the basis coefficients) on MUTAG (0 on AIFB), added to the loss as
``wd * ||W||^2`` (Keras' ``l2`` regulariser, as in the authors' code). Inverse relations are added
(``load_entities(add_inverse=True)``); the self-connection is RGCNConv's root weight. Featureless input is
the one-hot identity as in the paper: node ids index the rows of the first layer's relation matrices (an
embedding table per relation, combined from the bases).

RGAT and HGT use a learned 16-d node embedding as input (2 layers, 16 hidden; RGAT 2 heads x 8, HGT 2 heads
of 8 plus a linear classifier), with the same optimiser. The reported accuracy is on the test split after the
last epoch (there is no validation split in these data sets).

Same outputs as ``train.py``: tqdm bar, compile report of the first layer, memory vs the reference, a PNG of
the curves and one JSON line at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from _common import Timer, default_out_dir, final_json, memory_comparison, memory_line, save_curves
from tqdm import tqdm

import jgnn
from jgnn import nn as jnn
from jgnn.datasets import load_entities
from jgnn.layout import GraphLayout


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 16
    num_bases: int | None = None
    lr: float = 0.01
    weight_decay: float = 0.0
    epochs: int = 50


def config_for(dataset: str) -> Config:
    if dataset == "mutag":
        return Config(num_bases=30, weight_decay=5e-4)
    return Config()  # aifb (and others): no bases, no L2


def first_layer(model: str, ds, c: Config, b: str, **kw) -> nn.Module:
    r = ds.num_relations
    if model == "rgcn":
        return jnn.RGCNConv(c.hidden, r, num_bases=c.num_bases, input_dim=ds.num_nodes, backend=b, **kw)
    if model == "rgat":
        return jnn.RGATConv(c.hidden // 2, r, num_heads=2, backend=b, **kw)
    if model == "hgt":
        return jnn.HGTConv(c.hidden, 2, ds.num_node_types, r, backend=b, **kw)
    raise ValueError(f"unknown model {model!r}")


class EntityClassifier(nn.Module):
    model: str
    num_nodes: int
    num_relations: int
    num_node_types: int
    num_classes: int
    config: Config
    backend: str = "auto"

    @nn.compact
    def __call__(self, graph, *, layout=None, deterministic: bool = True):
        c, b, r, k = self.config, self.backend, self.num_relations, self.num_classes
        ids = jnp.arange(self.num_nodes, dtype=jnp.int32)
        if self.model == "rgcn":
            g = graph._replace(nodes={**graph.nodes, "h": ids})
        else:
            g = graph._replace(nodes={**graph.nodes, "h": nn.Embed(self.num_nodes, c.hidden, name="embed")(ids)})
        ds = _Sizes(self.num_nodes, r, self.num_node_types)
        g = first_layer(self.model, ds, c, b, name="conv1")(g, layout=layout, deterministic=deterministic)
        g = g._replace(nodes={**g.nodes, "h": nn.relu(g.nodes["h"])})
        if self.model == "rgcn":
            return jnn.RGCNConv(k, r, num_bases=c.num_bases, backend=b, name="conv2")(g, layout=layout).nodes["h"]
        if self.model == "rgat":
            g = jnn.RGATConv(k, r, num_heads=2, concat=False, backend=b, name="conv2")(g, layout=layout)
            return g.nodes["h"]
        g = jnn.HGTConv(c.hidden, 2, self.num_node_types, r, backend=b, name="conv2")(g, layout=layout)
        return nn.Dense(k, name="classifier")(g.nodes["h"])


@dataclasses.dataclass(frozen=True)
class _Sizes:
    num_nodes: int
    num_relations: int
    num_node_types: int


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="rgcn", choices=["rgcn", "rgat", "hgt"])
    p.add_argument("--dataset", default="aifb", choices=["aifb", "mutag"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--smoke", action="store_true", help="3 epochs, for tests")
    p.add_argument("--backend", default="auto", choices=list(jgnn.BACKENDS))
    p.add_argument("--out-dir", default=default_out_dir())
    p.add_argument("--no-memory", action="store_true")
    args = p.parse_args(argv)
    start = time.perf_counter()

    config = config_for(args.dataset)
    epochs = 3 if args.smoke else (args.epochs or config.epochs)
    ds = load_entities(args.dataset, add_inverse=True)
    graph = jax.device_put(ds.graph)
    train_idx, test_idx = jnp.asarray(ds.train_idx), jnp.asarray(ds.test_idx)
    train_y, test_y = jnp.asarray(ds.train_labels), jnp.asarray(ds.test_labels)

    def build(backend):
        return EntityClassifier(args.model, ds.num_nodes, ds.num_relations, ds.num_node_types, ds.num_classes,
                                config, backend)

    model = build(args.backend)
    key = jax.random.PRNGKey(args.seed)
    params = model.init(key, graph)["params"]
    tx = optax.adam(config.lr)
    opt_state = tx.init(params)

    # Built once on the host: the sorted CSRs and the unique (source, relation) pairs that RGCN's typed
    # matmul is computed over (see `jgnn.explain`'s compact_materialize line).
    layout = jax.device_put(GraphLayout.from_graph(ds.graph))
    # The data travels as jit arguments, never as closure constants (XLA would constant-fold the graph).
    data = (graph, train_idx, train_y, layout)

    def make_step(model):
        def loss_fn(params, data):
            graph, train_idx, train_y, layout = data
            logits = model.apply({"params": params}, graph, layout=layout)[train_idx]
            loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, train_y))
            decayed = [v for k, v in params["conv1"].items() if k != "comp" and v.ndim >= 2]
            return loss + config.weight_decay * sum(jnp.sum(x * x) for x in decayed), logits

        def step(params, opt_state, data):
            train_y = data[2]
            (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, data)
            updates, opt_state = tx.update(grads, opt_state, params)
            acc = jnp.mean(jnp.argmax(logits, -1) == train_y)
            return optax.apply_updates(params, updates), opt_state, loss, acc
        return step

    @jax.jit
    def test_accuracy(params, graph, test_idx, test_y, layout):
        return jnp.mean(jnp.argmax(model.apply({"params": params}, graph, layout=layout)[test_idx], -1) == test_y)

    step = jax.jit(make_step(model))
    history = {"loss": [], "train_acc": [], "test_acc": []}
    epoch = 0
    with Timer() as train_timer:
        bar = tqdm(range(1, epochs + 1), desc=f"{args.model}/{args.dataset}", file=sys.stderr, mininterval=0.5)
        for epoch in bar:  # noqa: B007
            params, opt_state, loss, acc = step(params, opt_state, data)
            test_acc = float(test_accuracy(params, graph, test_idx, test_y, layout))
            history["loss"].append(float(loss))
            history["train_acc"].append(float(acc))
            history["test_acc"].append(test_acc)
            bar.set_postfix(loss=f"{float(loss):.3f}", train=f"{float(acc):.3f}", test=f"{test_acc:.3f}")
        bar.close()

    conv1 = first_layer(args.model, _Sizes(ds.num_nodes, ds.num_relations, ds.num_node_types), config,
                        args.backend)
    if args.model == "rgcn":
        sample = graph._replace(nodes={**graph.nodes, "h": jnp.arange(ds.num_nodes, dtype=jnp.int32)})
    else:
        sample = graph._replace(nodes={**graph.nodes, "h": params["embed"]["embedding"]})
    report = jgnn.explain(lambda g: conv1.apply({"params": params["conv1"]}, g), sample)
    print(f"compile report (first layer): {report.summary()}")
    memory = None
    if not args.no_memory:
        memory = memory_comparison(lambda b: make_step(build(b)), args.backend, params, opt_state, data)
        print(memory_line(memory, args.backend))
    stem = f"{args.model}_{args.dataset}_seed{args.seed}"
    png = save_curves(history, args.out_dir, stem, f"{args.model} on {args.dataset} (seed {args.seed})")
    print(f"training curves: {png}")
    final = history["test_acc"][-1] if history["test_acc"] else 0.0
    print(f"test accuracy after {epoch} epochs: {final:.4f}")
    final_json(model=args.model, dataset=args.dataset, seed=args.seed, test_accuracy=round(final, 4), epochs=epoch,
               seconds=round(time.perf_counter() - start, 2), train_seconds=round(train_timer.seconds, 2),
               backend=args.backend, memory=memory)


if __name__ == "__main__":
    main()
