"""Knowledge-graph link prediction with an R-GCN encoder and a DistMult decoder (Schlichtkrull et al. 2018).

    python examples/link_prediction.py --dataset fb15k237 --seed 0

Encoder: a learned entity embedding, then `--layers` relational graph convolutions written with
`jgnn.message_passing` over the training graph with inverse relations (2R edge types), basis decomposition
(`--bases`), per-relation mean normalisation 1/c_{i,r} and a self-connection, as in the paper. The
normalisation is computed once on the host and travels as an edge feature. Decoder: DistMult,
``score(h, r, t) = sum(e_h * w_r * e_t)``.

Training: every step runs the encoder on the full training graph and scores a batch of ``--batch-size``
queries. ``--objective 1vsall`` (default): each training triple asks ``(h, r, ?)`` and its inverse asks
``(t, r⁻¹, ?)``; the loss is the cross-entropy of the softmax over every entity's score (1-N scoring, Dettmers et
al. 2018; the softmax form of Ruffinelli et al. 2020). ``--objective negatives``: the paper's objective, the binary
cross-entropy of each training triple against ``--negatives`` corruptions of its head or tail drawn by
`jgnn.linkpred.uniform_negatives`. Both add ``--l2`` times the mean squared embedding norms of the decoded
entities and relations. Adam, lr ``--lr``. After every epoch the filtered MRR on ``--valid-queries`` validation
triples (both directions) picks the parameters that the test evaluates (model selection on validation only).

Evaluation: filtered MRR and Hits@{1,3,10} (`jgnn.linkpred`) over the test triples, both directions (tail
queries and head queries asked as inverse-relation tail queries), filtering every known train/valid/test
triple; ties count half (the expected rank). Published (R-GCN paper, FB15k-237, filtered): MRR 0.248,
Hits@1 0.153, Hits@3 0.258, Hits@10 0.414. Measured figures: `examples/README.md`.

Ends with one JSON line: ``{"dataset", "seed", "epochs", "best_epoch", "valid_mrr", "test_mrr", ...}``.
"""

from __future__ import annotations

import argparse
import functools
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
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--bases", type=int, default=2)
    p.add_argument("--objective", default="1vsall", choices=["1vsall", "negatives"])
    p.add_argument("--batch-size", type=int, default=4096, help="queries (1vsall) or triples (negatives) per step")
    p.add_argument("--negatives", type=int, default=32, help="corruptions per triple (--objective negatives)")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--l2", type=float, default=0.01)
    p.add_argument("--valid-queries", type=int, default=2000,
                   help="validation triples (asked both ways) that select the epoch; 0: all")
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

    def regulariser(entities, relations, triples):
        decoded = jnp.concatenate([triples[:, 0], triples[:, 2]])
        return jnp.mean(entities[decoded] ** 2) + jnp.mean(relations[triples[:, 1] % num_rel] ** 2)

    def one_vs_all(entities, relations, queries, key):
        del key
        scores = (entities[queries[:, 0]] * relations[queries[:, 1] % num_rel]) @ entities.T  # [B, N]
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(scores, queries[:, 2]))

    def negative_sampling(entities, relations, positives, key):
        negatives = linkpred.uniform_negatives(key, positives, ds.num_nodes, args.negatives)  # [B, K, 3]
        pos, neg = distmult(entities, relations, positives), distmult(entities, relations, negatives)
        return jnp.mean(optax.sigmoid_binary_cross_entropy(pos, jnp.ones_like(pos))) + jnp.mean(
            optax.sigmoid_binary_cross_entropy(neg, jnp.zeros_like(neg)))

    objective = {"1vsall": one_vs_all, "negatives": negative_sampling}[args.objective]

    @jax.jit
    def step(params, opt_state, graph, layout, batch, key):
        def loss_fn(params):
            entities, relations = model.apply({"params": params}, graph, layout)
            return objective(entities, relations, batch, key) + args.l2 * regulariser(entities, relations, batch)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    known = linkpred.KnownAnswers(linkpred.with_inverses(
        np.concatenate([ds.train_triples, ds.valid_triples, ds.test_triples]), num_rel))
    encode = jax.jit(model.apply)
    # entities and relations are arguments, not closed-over constants: one trace and compile for every evaluation
    score_tails = jax.jit(lambda entities, relations, h, r: (entities[h] * relations[r % num_rel]) @ entities.T)

    def ranks_of(params, triples):
        entities, relations = encode({"params": params}, graph, layout)
        return linkpred.rank_queries(functools.partial(score_tails, entities, relations),
                                     linkpred.with_inverses(triples, num_rel), known, batch_size=args.eval_batch_size)

    rng = np.random.default_rng(args.seed)
    valid = ds.valid_triples
    if args.smoke or 0 < args.valid_queries < valid.shape[0]:
        valid = valid[rng.permutation(valid.shape[0])[:256 if args.smoke else args.valid_queries]]
    # 1vsall asks every triple both ways (the head query as an inverse-relation tail query); negatives corrupts
    # the head or the tail of the triple itself
    train = linkpred.with_inverses(ds.train_triples, num_rel) if args.objective == "1vsall" else ds.train_triples
    epochs = 1 if args.smoke else args.epochs
    steps_per_epoch = 2 if args.smoke else -(-train.shape[0] // args.batch_size)
    losses, valid_mrrs = [], []
    best = (-1.0, 0, params)
    train_start = time.perf_counter()
    for epoch in tqdm(range(1, epochs + 1), desc=f"rgcn+distmult/{ds.name}", file=sys.stderr):
        order = rng.permutation(train.shape[0])
        for s in range(steps_per_epoch):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            if idx.shape[0] < args.batch_size:  # keep one batch shape: top the last batch up with random triples
                idx = np.concatenate([idx, rng.integers(0, train.shape[0], args.batch_size - idx.shape[0])])
            key, sub = jax.random.split(key)
            params, opt_state, loss = step(params, opt_state, graph, layout, jnp.asarray(train[idx]), sub)
        losses.append(float(loss))
        valid_mrrs.append(linkpred.mean_reciprocal_rank(ranks_of(params, valid)))
        if valid_mrrs[-1] > best[0]:
            best = (valid_mrrs[-1], epoch, params)
    train_seconds = time.perf_counter() - train_start

    test = ds.test_triples[:256] if args.smoke else ds.test_triples
    ranks = ranks_of(best[2], test)
    metrics = {"test_mrr": round(linkpred.mean_reciprocal_rank(ranks), 4),
               **{f"test_hits@{k}": round(linkpred.hits_at(ranks, k), 4) for k in (1, 3, 10)}}
    print(f"{ds.name}: filtered test MRR {metrics['test_mrr']:.4f}, Hits@1 {metrics['test_hits@1']:.4f}, "
          f"Hits@3 {metrics['test_hits@3']:.4f}, Hits@10 {metrics['test_hits@10']:.4f} "
          f"({ranks.shape[0]} queries" + ("; paper: 0.248 / 0.153 / 0.258 / 0.414)" if ds.name == "fb15k237" else ")"))
    final_json(example="link_prediction", dataset=ds.name, seed=args.seed, objective=args.objective, epochs=epochs,
               dim=args.dim, layers=args.layers, bases=args.bases, batch_size=args.batch_size,
               **({"negatives": args.negatives} if args.objective == "negatives" else {}), lr=args.lr, l2=args.l2,
               losses=[round(x, 4) for x in losses], valid_mrrs=[round(x, 4) for x in valid_mrrs],
               best_epoch=best[1], valid_mrr=round(best[0], 4), valid_queries=2 * int(valid.shape[0]), **metrics,
               queries=int(ranks.shape[0]),
               train_seconds=round(train_seconds, 1), seconds=round(time.perf_counter() - start, 1),
               backend=args.backend)


if __name__ == "__main__":
    main()
