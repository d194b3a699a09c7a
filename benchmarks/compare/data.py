"""The graphs of the CPU comparison: real data sets from ``$JGNN_DATA_DIR`` and seeded synthetic graphs.

Every loader returns a `Problem`: host (NumPy) arrays that every system converts to its own inputs once, before
any timing. Homogeneous graphs are undirected, without self-loops (the GAT and GCN layers add one per node), so
that every system's normalisation sees the same graph (jraph normalises sources by their out-degree, PyG by their
in-degree: on a symmetric graph both are the same).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jgnn import datasets


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """One full-batch node classification problem.

    Attributes:
      name: data set name as shown in the tables.
      senders, receivers: int32 ``[E]``.
      num_nodes: ``N``.
      x: float32 ``[N, F]`` node features, or ``None`` (featureless: the first layer embeds node ids).
      labels: int32 ``[N]`` (only ``labels[train_idx]`` is read).
      train_idx: int32 ``[M]`` nodes whose cross-entropy is the loss.
      num_classes: ``C``.
      node_type: int32 ``[N]`` sorted (typed graphs), else ``None``.
      edge_type: int32 ``[E]`` sorted (typed graphs), else ``None``.
      schema: int32 ``[R, 2]``: (source type, destination type) of each relation (HGT), else ``None``.
      num_relations, num_node_types: type counts (1 for homogeneous graphs).
      source: where the graph, features and labels come from (shown in the tables).
    """

    name: str
    senders: np.ndarray
    receivers: np.ndarray
    num_nodes: int
    x: np.ndarray | None
    labels: np.ndarray
    train_idx: np.ndarray
    num_classes: int
    node_type: np.ndarray | None = None
    edge_type: np.ndarray | None = None
    schema: np.ndarray | None = None
    num_relations: int = 1
    num_node_types: int = 1
    source: str = ""

    @property
    def num_edges(self) -> int:
        return int(self.senders.shape[0])

    @property
    def num_features(self) -> int | None:
        return None if self.x is None else int(self.x.shape[1])

    def type_offsets(self, types: np.ndarray, count: int) -> tuple[int, ...]:
        """``count + 1`` offsets of the contiguous blocks of a sorted type array."""
        return tuple(int(v) for v in np.searchsorted(types, np.arange(count + 1)))


# ---- homogeneous -------------------------------------------------------------------------------------------


def _train_idx(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask).astype(np.int32)


def planetoid(name: str, *, feature_dim: int = 500, seed: int = 0) -> Problem:
    """Cora / CiteSeer / PubMed with the public split. ``pubmed.npz`` has no features: standard normal
    ``[N, feature_dim]`` ones are drawn (the source has 500-d TF-IDF rows, so the width is the real one)."""
    ds = datasets.load_planetoid(name, allow_download=False)
    g = ds.graph
    x, source = g.nodes, f"{name}.npz"
    if x is None:
        x = np.random.default_rng(seed).standard_normal((ds.num_nodes, feature_dim), dtype=np.float32)
        source += f" (graph, labels, split); features synthetic N(0, 1) [{ds.num_nodes}, {feature_dim}]"
    return Problem(name, np.asarray(g.senders, np.int32), np.asarray(g.receivers, np.int32), ds.num_nodes,
                   np.asarray(x, np.float32), ds.labels, _train_idx(ds.train_mask), ds.num_classes, source=source)


def undirected_rmat(num_nodes: int, num_edges: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``num_edges`` (even) directed edges: ``num_edges / 2`` distinct undirected R-MAT pairs without
    self-loops, each stored in both directions (PyG's ``to_undirected`` + ``coalesce``). R-MAT repeats pairs
    around its hubs, so pairs are drawn until enough distinct ones exist."""
    if num_edges % 2:
        raise ValueError(f"num_edges must be even (each pair is stored both ways), got {num_edges}")
    want = num_edges // 2
    if want > num_nodes * (num_nodes - 1) // 2:
        raise ValueError(f"{num_nodes} nodes have fewer than {want} distinct pairs")
    keys = np.zeros(0, np.int64)
    while keys.shape[0] < want:
        s, r = datasets.rmat_edges(num_nodes, 2 * (want - keys.shape[0]) + 64, rng)
        lo, hi = np.minimum(s, r).astype(np.int64), np.maximum(s, r).astype(np.int64)
        new = (lo * num_nodes + hi)[lo != hi]
        keys = np.unique(np.concatenate([keys, new]))  # sorted, so the kept pairs do not depend on draw order
    keys = keys[np.sort(rng.choice(keys.shape[0], want, replace=False))]
    lo, hi = (keys // num_nodes).astype(np.int32), (keys % num_nodes).astype(np.int32)
    return np.concatenate([lo, hi]), np.concatenate([hi, lo])


def rmat(num_nodes: int, num_edges: int, *, features: int = 128, classes: int = 16, seed: int = 0) -> Problem:
    """A synthetic R-MAT graph (`undirected_rmat`), N(0, 1) features, labels ``argmax(x @ W)`` for a random
    ``W`` (learnable), and a random 10 % training split."""
    rng = np.random.default_rng(seed)
    s, r = undirected_rmat(num_nodes, num_edges, rng)
    x = rng.standard_normal((num_nodes, features), dtype=np.float32)
    labels = (x @ rng.standard_normal((features, classes), dtype=np.float32)).argmax(1).astype(np.int32)
    train = np.sort(rng.choice(num_nodes, max(1, num_nodes // 10), replace=False)).astype(np.int32)
    return Problem(f"rmat-{_short(num_nodes)}", s, r, num_nodes, x, labels, train, classes,
                   source=f"synthetic R-MAT (a,b,c,d = 0.57,0.19,0.19,0.05), undirected, seed {seed}; "
                          f"features N(0, 1) [{num_nodes}, {features}]")


def amazon(name: str, *, seed: int = 0) -> Problem:
    """Amazon Computers / Photo (real features and labels; no standard split: 20 random nodes per class)."""
    with np.load(datasets.cache.find_file(f"{name}.npz", datasets.search_dirs()), allow_pickle=False) as d:
        s, r, x, y, c = d["senders"], d["receivers"], d["x"], d["y"], int(d["num_classes"])
    rng = np.random.default_rng(seed)
    train = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == k), 20, replace=False) for k in range(c)]))
    return Problem(name, s.astype(np.int32), r.astype(np.int32), int(x.shape[0]), x.astype(np.float32),
                   y.astype(np.int32), train.astype(np.int32), c,
                   source=f"{name}.npz (graph, features, labels); split 20 random nodes per class, seed {seed}")


def _short(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 and n >= 1000 else str(n)


# ---- typed -------------------------------------------------------------------------------------------------


def aifb() -> Problem:
    """AIFB as PyG's ``Entities``: the R-GCN stripped graph with inverse edges (90 relations), featureless
    (the first layer embeds node ids), labelled persons, the standard 140-node training split."""
    ds = datasets.load_entities("aifb", add_inverse=True, allow_download=False)
    g = ds.graph
    labels = np.full(ds.num_nodes, -1, np.int32)
    labels[ds.train_idx] = ds.train_labels
    edge_type = np.asarray(g.edges["type"], np.int32)
    return Problem("aifb", np.asarray(g.senders, np.int32), np.asarray(g.receivers, np.int32), ds.num_nodes,
                   None, labels, np.asarray(ds.train_idx, np.int32), ds.num_classes, edge_type=edge_type,
                   num_relations=ds.num_relations, source="aifb.npz with inverse edges (PyG Entities); featureless")


#: HGT's synthetic schema: every ordered pair of 3 node types is one relation, so every type receives edges.
HETERO_SCHEMA = np.array([[0, 1], [1, 0], [0, 2], [2, 0], [1, 2], [2, 1]], np.int32)


def hetero(num_nodes: int, num_edges: int, *, features: int = 64, classes: int = 8, seed: int = 0,
           schema: np.ndarray = HETERO_SCHEMA) -> Problem:
    """A synthetic typed graph: node types in contiguous blocks of near-equal size, ``num_edges`` edges split
    evenly over the relations of ``schema`` and sorted by relation, endpoints uniform within their types;
    N(0, 1) features, random labels, a random 10 % training split."""
    rng = np.random.default_rng(seed)
    t, r = int(schema.max()) + 1, schema.shape[0]
    type_offsets = np.linspace(0, num_nodes, t + 1).astype(np.int64)
    node_type = np.repeat(np.arange(t, dtype=np.int32), np.diff(type_offsets))
    edge_type = np.repeat(np.arange(r, dtype=np.int32), np.diff(np.linspace(0, num_edges, r + 1).astype(np.int64)))
    src_t, dst_t = schema[edge_type, 0], schema[edge_type, 1]
    pick = lambda types: type_offsets[types] + (rng.random(num_edges) * np.diff(type_offsets)[types]).astype(np.int64)
    s, d = pick(src_t).astype(np.int32), pick(dst_t).astype(np.int32)
    x = rng.standard_normal((num_nodes, features), dtype=np.float32)
    labels = rng.integers(0, classes, num_nodes).astype(np.int32)
    train = np.sort(rng.choice(num_nodes, max(1, num_nodes // 10), replace=False)).astype(np.int32)
    return Problem(f"typed-{_short(num_nodes)}", s, d, num_nodes, x, labels, train, classes, node_type=node_type,
                   edge_type=edge_type, schema=schema, num_relations=r, num_node_types=t,
                   source=f"synthetic typed graph, {t} node types, {r} relations (all ordered type pairs), "
                          f"uniform endpoints, seed {seed}; features N(0, 1) [{num_nodes}, {features}]")
