"""Synthetic graphs for benchmarks: R-MAT power-law graphs, schema-consistent typed graphs, and
presets with the sizes of the data sets used by the seed papers (Graphiler, Hector, Seastar).

Everything is vectorised NumPy driven by ``numpy.random.default_rng(seed)``, so outputs are
deterministic for a given seed. Index arrays are int32, features float32.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jgnn.datasets.types import NodeClassificationDataset, TypedGraph, make_graph

RMAT_PROBS = (0.57, 0.19, 0.19, 0.05)


def rmat_edges(
    num_nodes: int,
    num_edges: int,
    rng: np.random.Generator,
    probs: tuple[float, float, float, float] = RMAT_PROBS,
    *,
    permute: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``num_edges`` R-MAT edges over ``num_nodes`` nodes (int32 senders, receivers).

    Each edge picks one quadrant per bit level of a ``2**ceil(log2 N)`` adjacency matrix with
    probabilities ``(a, b, c, d)`` = (top-left, top-right, bottom-left, bottom-right); ids
    ``>= num_nodes`` are rejected and redrawn. Duplicates and self-loops are allowed. With
    ``permute`` node ids are relabelled by a random permutation so that hubs are not all at
    small ids.
    """
    if num_edges < 0:
        raise ValueError(f"num_edges must be >= 0, got {num_edges}")
    if num_nodes <= 0:
        if num_edges:
            raise ValueError(f"num_nodes must be > 0 to place {num_edges} edges, got {num_nodes}")
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    a, b, c, d = probs
    if min(probs) < 0 or not math.isclose(a + b + c + d, 1.0, rel_tol=0, abs_tol=1e-9):
        raise ValueError(f"R-MAT probabilities must be non-negative and sum to 1, got {probs}")
    scale = max(1, math.ceil(math.log2(num_nodes)))
    senders, receivers, have = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0
    while have < num_edges:
        m = int((num_edges - have) * 1.25) + 64
        s = np.zeros(m, dtype=np.int64)
        r = np.zeros(m, dtype=np.int64)
        for _ in range(scale):
            u = rng.random(m)
            s = (s << 1) | (u >= a + b)
            r = (r << 1) | (((u >= a) & (u < a + b)) | (u >= a + b + c))
        keep = (s < num_nodes) & (r < num_nodes)
        s, r = s[keep][: num_edges - have], r[keep][: num_edges - have]
        senders.append(s)
        receivers.append(r)
        have += s.shape[0]
    s, r = np.concatenate(senders), np.concatenate(receivers)
    if permute:
        perm = rng.permutation(num_nodes)
        s, r = perm[s], perm[r]
    return s.astype(np.int32), r.astype(np.int32)


def _random_masks(n: int, rng: np.random.Generator, train: float, val: float):
    order = rng.permutation(n)
    n_train, n_val = int(round(train * n)), int(round(val * n))
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][order[:n_train]] = True
    masks[1][order[n_train : n_train + n_val]] = True
    masks[2][order[n_train + n_val :]] = True
    return masks


def power_law_graph(
    num_nodes: int,
    num_edges: int,
    num_features: int,
    num_classes: int,
    *,
    seed: int,
    kind: str = "rmat",
    train_fraction: float = 0.1,
    val_fraction: float = 0.1,
    name: str | None = None,
) -> NodeClassificationDataset:
    """A random node classification graph with exactly ``num_nodes`` nodes and ``num_edges`` edges.

    Args:
      kind: ``"rmat"`` (skewed power-law degrees, :func:`rmat_edges` with
        ``a, b, c, d = 0.57, 0.19, 0.19, 0.05``) or ``"uniform"`` (Erdős–Rényi style: endpoints
        uniform). Duplicate edges and self-loops can occur.
      num_features: ``F >= 1``; features are standard normal float32 [N, F].
      num_classes: ``C >= 1``; labels int32 [N] are ``argmax(features @ W)`` for a random
        Gaussian ``W`` [F, C] (learnable from the features; no unlabelled nodes).
      train_fraction, val_fraction: sizes of the random disjoint masks; test is the rest.

    Returns:
      :class:`NodeClassificationDataset` whose graph has int32 senders/receivers in ``[0, N)``.
    """
    if num_features < 1 or num_classes < 1:
        raise ValueError(f"num_features and num_classes must be >= 1, got {num_features}, {num_classes}")
    rng = np.random.default_rng(seed)
    if kind == "rmat":
        s, r = rmat_edges(num_nodes, num_edges, rng)
    elif kind == "uniform":
        if num_nodes <= 0 and num_edges:
            raise ValueError(f"num_nodes must be > 0 to place {num_edges} edges, got {num_nodes}")
        s = rng.integers(0, max(num_nodes, 1), num_edges).astype(np.int32)
        r = rng.integers(0, max(num_nodes, 1), num_edges).astype(np.int32)
    else:
        raise ValueError(f"kind must be 'rmat' or 'uniform', got {kind!r}")
    x = rng.standard_normal((num_nodes, num_features), dtype=np.float32)
    w = rng.standard_normal((num_features, num_classes), dtype=np.float32)
    labels = (x @ w).argmax(axis=1).astype(np.int32)
    train, val, test = _random_masks(num_nodes, rng, train_fraction, val_fraction)
    return NodeClassificationDataset(
        graph=make_graph(s, r, num_nodes, nodes=x),
        labels=labels,
        train_mask=train,
        val_mask=val,
        test_mask=test,
        num_classes=num_classes,
        name=name or f"{kind}-{num_nodes}-{num_edges}",
    )


def _types_covering(n: int, num_types: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted int32 [n] type ids in ``[0, num_types)``; every type used when ``n >= num_types``."""
    base = np.arange(min(n, num_types))
    extra = rng.integers(0, num_types, n - base.shape[0])
    return np.sort(np.concatenate([base, extra])).astype(np.int32)


def typed_graph(
    num_nodes: int,
    num_edges: int,
    num_node_types: int,
    num_edge_types: int,
    *,
    feature_dim: int | None = None,
    seed: int,
    name: str | None = None,
) -> TypedGraph:
    """A random heterogeneous graph whose edge types respect a fixed relation schema.

    * Node types: int32 [N], sorted (nodes of one type are contiguous, as Hector presorts);
      every type has at least one node (requires ``num_nodes >= num_node_types``).
    * Relation schema: relation ``r`` gets a random ``(src_type, dst_type)`` pair
      (``relation_schema`` int32 [R, 2]).
    * Edges: int32 [E], sorted by edge type; every relation occurs at least once when
      ``num_edges >= num_edge_types``. An edge of type ``r`` has a sender drawn uniformly from
      the nodes of type ``relation_schema[r, 0]`` and a receiver from those of type
      ``relation_schema[r, 1]``.
    * ``feature_dim``: when given, ``nodes["h"]`` is standard normal float32 [N, D] (``"h"`` is the
      feature key every `jgnn.nn` module reads, so the graph feeds HGT/RGCN/RGAT as it is).
    """
    if num_node_types < 1 or num_edge_types < 1:
        raise ValueError(f"need >= 1 node and edge type, got {num_node_types}, {num_edge_types}")
    if num_nodes < num_node_types:
        raise ValueError(f"num_nodes ({num_nodes}) must be >= num_node_types ({num_node_types})")
    if num_edges < 0:
        raise ValueError(f"num_edges must be >= 0, got {num_edges}")
    rng = np.random.default_rng(seed)
    node_type = _types_covering(num_nodes, num_node_types, rng)
    counts = np.bincount(node_type, minlength=num_node_types)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    schema = rng.integers(0, num_node_types, (num_edge_types, 2)).astype(np.int32)
    edge_type = _types_covering(num_edges, num_edge_types, rng)
    src_t, dst_t = schema[edge_type, 0], schema[edge_type, 1]
    s = starts[src_t] + (rng.random(num_edges) * counts[src_t]).astype(np.int64)
    r = starts[dst_t] + (rng.random(num_edges) * counts[dst_t]).astype(np.int64)
    nodes = {"type": node_type}
    if feature_dim is not None:
        nodes["h"] = rng.standard_normal((num_nodes, feature_dim), dtype=np.float32)
    return TypedGraph(
        graph=make_graph(s, r, num_nodes, nodes=nodes, edges={"type": edge_type}),
        relation_schema=schema,
        num_node_types=num_node_types,
        num_edge_types=num_edge_types,
        name=name or f"typed-{num_nodes}-{num_edges}",
    )


@dataclasses.dataclass(frozen=True)
class GraphStats:
    """Published size of a data set (as used by a seed paper).

    ``num_features``/``num_classes`` are ``None`` where the data set has no input features /
    is not a node classification task. ``source`` cites where the numbers come from.
    """

    name: str
    num_nodes: int
    num_edges: int
    num_features: int | None
    num_classes: int | None
    num_node_types: int = 1
    num_edge_types: int = 1
    source: str = ""

    @property
    def typed(self) -> bool:
        return self.num_node_types > 1 or self.num_edge_types > 1


_GRAPHILER = "Graphiler (MLSys'22) Table 2"
_HECTOR = "Hector (ASPLOS'24) Table 3 (rounded as printed; inverse edges included)"

PRESETS: dict[str, GraphStats] = {
    s.name: s
    for s in (
        # Homogeneous graphs. Cora: PyG Planetoid (10,556 directed edges).
        GraphStats("cora", 2_708, 10_556, 1_433, 7, source="PyG Planetoid; shared/data/README.md"),
        GraphStats("pubmed", 19_717, 88_651, 500, 3, source=_GRAPHILER),
        # PPI is multi-label (121 binary targets); the synthetic stand-in uses 121 classes.
        GraphStats("ppi", 56_944, 1_644_208, 50, 121, source=_GRAPHILER),
        GraphStats("ogbn-arxiv", 169_343, 1_166_243, 128, 40, source=_GRAPHILER),
        GraphStats("reddit", 232_965, 114_615_892, 602, 41, source=_GRAPHILER + "; C: Hamilton et al."),
        # Typed graphs: node/edge/type counts from Hector Table 3. Class counts are not in that
        # table: AIFB 4, MUTAG 2, BGS 2, AM 11 from R-GCN (Schlichtkrull et al. 2018) Table 1;
        # ogbn-mag 349 classes and 128-d paper features from OGB (Hu et al. 2020). Graphiler
        # Table 2 gives exact counts for some of these (e.g. MUTAG 27,163 / 148,100 with 46
        # edge types, BGS 94,806 / 672,884 with 96, AM 1,885,136 / 5,668,682 with 96,
        # ogbn-biokg 93,773 / 4,762,678 with 51); they differ slightly in edge-type counting.
        GraphStats("aifb", 7_300, 49_000, None, 4, 7, 104, source=_HECTOR + "; classes: R-GCN Table 1"),
        GraphStats("mutag", 27_000, 148_000, None, 2, 5, 50, source=_HECTOR + "; classes: R-GCN Table 1"),
        GraphStats("bgs", 95_000, 673_000, None, 2, 27, 122, source=_HECTOR + "; classes: R-GCN Table 1"),
        GraphStats("am", 1_900_000, 5_700_000, None, 11, 7, 108, source=_HECTOR + "; classes: R-GCN Table 1"),
        GraphStats("ogbn-biokg", 94_000, 4_800_000, None, None, 5, 51, source=_HECTOR),
        GraphStats("fb15k", 15_000, 620_000, None, None, 1, 474, source=_HECTOR),
        GraphStats("ogbn-mag", 1_900_000, 21_000_000, 128, 349, 4, 4, source=_HECTOR + "; F, C: OGB"),
        GraphStats("wikikg2", 2_500_000, 16_000_000, None, None, 1, 535, source=_HECTOR),
    )
}


def synthetic_from_preset(
    name: str,
    *,
    scale: float = 1.0,
    seed: int,
    feature_dim: int | None = None,
) -> NodeClassificationDataset | TypedGraph:
    """A synthetic graph with the (scaled) size of preset ``name`` (see :data:`PRESETS`).

    ``N`` and ``E`` are multiplied by ``scale`` (rounded; ``N`` at least the number of node
    types and at least 1, ``E`` at least the number of edge types for typed presets); feature
    width and class count are kept. Homogeneous presets give an R-MAT
    :class:`NodeClassificationDataset` (:func:`power_law_graph`); typed presets give a
    :class:`TypedGraph` (:func:`typed_graph`) with ``feature_dim`` features (default: the
    preset's ``num_features``, i.e. none for the RDF/KG sets).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    st = PRESETS[name]
    n = max(1, st.num_node_types, int(round(st.num_nodes * scale)))
    e = int(round(st.num_edges * scale))
    if st.typed:
        e = max(e, st.num_edge_types)
        dim = st.num_features if feature_dim is None else feature_dim
        return typed_graph(n, e, st.num_node_types, st.num_edge_types, feature_dim=dim, seed=seed, name=name)
    f = st.num_features if feature_dim is None else feature_dim
    return power_law_graph(n, e, f, st.num_classes, seed=seed, name=name)
