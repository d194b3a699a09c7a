"""Knowledge-graph link prediction with an R-GCN encoder and a DistMult decoder (Schlichtkrull et al. 2018).

    python examples/link_prediction.py --dataset fb15k237 --seed 0

Encoder: a learned entity embedding, then `--layers` relational graph convolutions written with
`jgnn.message_passing` over the training graph with inverse relations (2R edge types), basis decomposition
(`--bases`), per-relation mean normalisation 1/c_{i,r} and a self-connection, as in the paper. The
normalisation is computed once on the host and travels as an edge feature. Decoder: DistMult,
``score(h, r, t) = sum(e_h * w_r * e_t)``.

Training (the paper's objective, sized for a 2-core CPU): every step runs the encoder on the full training
graph, takes ``--batch-size`` training triples, corrupts each ``--negatives`` times with
`jgnn.linkpred.uniform_negatives` (head or tail), and minimises the binary cross-entropy of positives against
negatives plus ``--l2`` times the mean squared embedding norms of the decoded entities and relations. Adam,
lr ``--lr``. The paper trains 500-d embeddings with block-diagonal weights, edge dropout and 1 negative per
positive on a GPU for many more steps; the defaults here are smaller (100-d, 2 bases, 10 epochs) so that a run
finishes in about 6 minutes on 2 cores: they are not the paper's settings, and they do not reach its figures
(filtered test MRR 0.156 here, 0.157 after 50 epochs; `examples/README.md`).

Evaluation: filtered MRR and Hits@{1,3,10} (`jgnn.linkpred`) over the test triples, both directions (tail
queries and head queries asked as inverse-relation tail queries), filtering every known train/valid/test
triple; ties count half (the expected rank). Published (R-GCN paper, FB15k-237, filtered): MRR 0.248,
Hits@1 0.153, Hits@3 0.258, Hits@10 0.414.

Ends with one JSON line: ``{"dataset", "seed", "epochs", "test_mrr", "test_hits@1", ..., "seconds"}``.
"""

from __future__ import annotations

import argparse
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import final_json
from tqdm import tqdm

import jgnn
from jgnn import linkpred
from jgnn.datasets import load_link_prediction
from jgnn.layout import GraphLayout


def relation_norm(receivers: np.ndarray, edge_type: np.ndarray) -> np.ndarray:
    """float32 [E]: 1 / c_{i,r}, the number of edges of the same type into the same receiver (R-GCN's mean)."""
    key = receivers.astype(np.int64) * (int(edge_type.max(initial=0)) + 1) + edge_type
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    return (1.0 / counts[inverse]).astype(np.float32)


class RGCNLayer(nn.Module):
    """One R-GCN layer: ``h_i' = W_0 h_i + sum_r sum_{j in N_r(i)} W_r h_j / c_{i,r}`` with ``W_r`` a
    combination of ``num_bases`` bases; ``edges["norm"]`` holds ``1 / c_{i,r}``."""

    features: int
    num_relations: int
    num_bases: int
    backend: str = "auto"

    @nn.compact
    def __call__(self, graph, layout=None):
        d_in = graph.nodes["h"].shape[-1]
        init = nn.initializers.glorot_uniform()
        bases = self.param("bases", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2,
                                                                   out_axis=-1, batch_axis=(0,)),
                           (self.num_bases, d_in, self.features), jnp.float32)
        comp = self.param("comp", init, (self.num_relations, self.num_bases), jnp.float32)
        root = self.param("root", init, (d_in, self.features), jnp.float32)
        weight = jnp.einsum("rb,bio->rio", comp, bases)

        def phi(src, dst, edge):
            return (src["h"] @ weight[edge["type"]]) * edge["norm"]

        layer = jgnn.message_passing(phi, lambda mailbox, node: jgnn.sum(mailbox),
                                     lambda node, agg: {"h": agg + node["h"] @ root}, backend=self.backend)
        return graph._replace(nodes={**graph.nodes, "h": layer(graph, layout=layout).nodes["h"]})


class RGCNDistMult(nn.Module):
    num_nodes: int
    num_relations: int  # base relations R; the graph has 2R edge types (inverses)
    dim: int
    layers: int
    num_bases: int
    backend: str = "auto"

    def setup(self):
        self.embed = nn.Embed(self.num_nodes, self.dim)
        self.convs = [RGCNLayer(self.dim, 2 * self.num_relations, self.num_bases, self.backend)
                      for _ in range(self.layers)]
        self.relations = self.param("relations", nn.initializers.normal(1.0 / np.sqrt(self.dim)),
                                    (self.num_relations, self.dim))

    def encode(self, graph, layout=None):
        g = graph._replace(nodes={**graph.nodes, "h": self.embed(jnp.arange(self.num_nodes, dtype=jnp.int32))})
        for i, conv in enumerate(self.convs):
            if i:
                g = g._replace(nodes={**g.nodes, "h": nn.relu(g.nodes["h"])})
            g = conv(g, layout)
        return g.nodes["h"]

    def __call__(self, graph, layout=None):
        return self.encode(graph, layout), self.relations


def distmult(entities, relations, triples):
    """[...]: DistMult scores of int triples [..., 3]; relations >= R are inverses and share w_r."""
    r = triples[..., 1] % relations.shape[0]
    return jnp.sum(entities[triples[..., 0]] * relations[r] * entities[triples[..., 2]], axis=-1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="fb15k237", choices=["fb15k237", "wn18rr", "kinship", "nations", "umls"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--bases", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32768)
    p.add_argument("--negatives", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--l2", type=float, default=0.01)
    p.add_argument("--eval-batch-size", type=int, default=1024)
    p.add_argument("--smoke", action="store_true", help="1 epoch on 2 batches, evaluation on 256 test triples")
    p.add_argument("--backend", default="auto", choices=list(jgnn.BACKENDS))
    args = p.parse_args(argv)
    start = time.perf_counter()

    ds = load_link_prediction(args.dataset, add_inverse=True)
    num_rel = ds.num_relations // 2
    graph = ds.graph._replace(edges={**ds.graph.edges,
                                     "norm": relation_norm(ds.graph.receivers, ds.graph.edges["type"])})
    layout = jax.device_put(GraphLayout.from_graph(graph))
    graph = jax.device_put(graph)
    model = RGCNDistMult(ds.num_nodes, num_rel, args.dim, args.layers, args.bases, args.backend)
    key = jax.random.key(args.seed)
    init_key, key = jax.random.split(key)
    params = model.init(init_key, graph, layout)["params"]
    tx = optax.adam(args.lr)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, graph, layout, positives, key):
        negatives = linkpred.uniform_negatives(key, positives, ds.num_nodes, args.negatives)  # [B, K, 3]

        def loss_fn(params):
            entities, relations = model.apply({"params": params}, graph, layout)
            pos, neg = distmult(entities, relations, positives), distmult(entities, relations, negatives)
            bce = jnp.mean(optax.sigmoid_binary_cross_entropy(pos, jnp.ones_like(pos))) + jnp.mean(
                optax.sigmoid_binary_cross_entropy(neg, jnp.zeros_like(neg)))
            decoded = jnp.concatenate([positives[:, 0], positives[:, 2]])
            reg = jnp.mean(entities[decoded] ** 2) + jnp.mean(relations[positives[:, 1]] ** 2)
            return bce + args.l2 * reg

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    train = ds.train_triples
    rng = np.random.default_rng(args.seed)
    epochs = 1 if args.smoke else args.epochs
    steps_per_epoch = 2 if args.smoke else -(-train.shape[0] // args.batch_size)
    losses = []
    train_start = time.perf_counter()
    for _ in tqdm(range(epochs), desc=f"rgcn+distmult/{ds.name}", file=sys.stderr):
        order = rng.permutation(train.shape[0])
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            if idx.shape[0] < args.batch_size:  # keep one batch shape: top the last batch up with random triples
                idx = np.concatenate([idx, rng.integers(0, train.shape[0], args.batch_size - idx.shape[0])])
            key, sub = jax.random.split(key)
            params, opt_state, loss = step(params, opt_state, graph, layout, jnp.asarray(train[idx]), sub)
        losses.append(float(loss))
    train_seconds = time.perf_counter() - train_start

    entities, relations = jax.jit(model.apply)({"params": params}, graph, layout)
    score_tails = jax.jit(lambda h, r: (entities[h] * relations[r % num_rel]) @ entities.T)
    known = linkpred.KnownAnswers(linkpred.with_inverses(
        np.concatenate([ds.train_triples, ds.valid_triples, ds.test_triples]), num_rel))
    test = ds.test_triples[:256] if args.smoke else ds.test_triples
    ranks = linkpred.rank_queries(score_tails, linkpred.with_inverses(test, num_rel), known,
                                  batch_size=args.eval_batch_size)
    metrics = {"test_mrr": round(linkpred.mean_reciprocal_rank(ranks), 4),
               **{f"test_hits@{k}": round(linkpred.hits_at(ranks, k), 4) for k in (1, 3, 10)}}
    print(f"{ds.name}: filtered test MRR {metrics['test_mrr']:.4f}, Hits@1 {metrics['test_hits@1']:.4f}, "
          f"Hits@3 {metrics['test_hits@3']:.4f}, Hits@10 {metrics['test_hits@10']:.4f} "
          f"({ranks.shape[0]} queries; paper: 0.248 / 0.153 / 0.258 / 0.414)")
    final_json(example="link_prediction", dataset=ds.name, seed=args.seed, epochs=epochs, dim=args.dim,
               layers=args.layers, bases=args.bases, negatives=args.negatives, batch_size=args.batch_size,
               losses=[round(x, 4) for x in losses], **metrics, queries=int(ranks.shape[0]),
               train_seconds=round(train_seconds, 1), seconds=round(time.perf_counter() - start, 1),
               backend=args.backend)


if __name__ == "__main__":
    main()
