"""Planetoid citation graphs (Cora, CiteSeer, PubMed) with the public split.

Two on-disk formats are understood:

* the jgnn ``<name>.npz`` files (schema in ``shared/data/README.md``: ``x`` float32 [N, F]
  (optional), ``y`` int32 [N] (``-1`` = no label), ``senders``/``receivers`` int32 [E],
  ``train_mask``/``val_mask``/``test_mask`` bool [N], ``num_nodes``, ``num_classes``);
* the raw Planetoid pickles ``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}`` from
  github.com/kimiyoung/planetoid (``data/``), parsed with Kipf's ``gcn/utils.py::load_data``
  procedure (see :func:`parse_planetoid_raw`). Reading the pickled sparse matrices needs scipy.

If neither is found, the raw files are downloaded into ``data_dir() / "planetoid"``.
"""
from __future__ import annotations

import os
import pathlib
import pickle

import numpy as np

from jgnn.datasets import cache
from jgnn.datasets.types import NodeClassificationDataset, make_graph

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
RAW_SUFFIXES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
PLANETOID_URL = (
    "https://raw.githubusercontent.com/kimiyoung/planetoid/"
    "af6abf468a772cc055bec88c52e4d6f51b7c37e3/data/ind.{name}.{suffix}"
)


def _dense(m) -> np.ndarray:
    """Dense ndarray from a scipy sparse matrix or array-like."""
    if hasattr(m, "toarray"):
        return np.asarray(m.toarray())
    return np.asarray(m)


def labels_from_onehot(onehot: np.ndarray) -> np.ndarray:
    """int32 [N] argmax of a one-hot [N, C] array; all-zero rows give ``-1``."""
    onehot = np.asarray(onehot)
    labels = onehot.argmax(axis=1).astype(np.int32)
    labels[~onehot.any(axis=1)] = -1
    return labels


def edges_from_adjacency_dict(graph: dict, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetrised, self-loop free, de-duplicated edges from a dict of adjacency lists.

    Every ``(k, v)`` with ``v in graph[k]`` gives ``k -> v`` and ``v -> k``; pairs with ``k == v``
    are dropped. Returns int32 senders/receivers sorted by (sender, receiver).
    """
    src = [int(k) for k, vs in graph.items() for _ in vs]
    dst = [int(v) for vs in graph.values() for v in vs]
    s = np.asarray(src + dst, dtype=np.int64)
    r = np.asarray(dst + src, dtype=np.int64)
    keep = s != r
    s, r = s[keep], r[keep]
    if s.size and (min(s.min(), r.min()) < 0 or max(s.max(), r.max()) >= num_nodes):
        raise ValueError(f"graph adjacency refers to node ids outside [0, {num_nodes})")
    key = np.unique(s * num_nodes + r)
    return (key // num_nodes).astype(np.int32), (key % num_nodes).astype(np.int32)


def _load_pickle(path: pathlib.Path):
    with open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")


def parse_planetoid_raw(
    directory: str | os.PathLike, name: str, *, num_val: int = 500
) -> NodeClassificationDataset:
    """Parse raw ``ind.<name>.*`` Planetoid files (Kipf's ``load_data``).

    Steps (``shared/data/README.md`` section 1):

    1. unpickle ``x, y, tx, ty, allx, ally, graph`` (``encoding="latin1"``); read the test ids
       ``test_idx_reorder`` from ``ind.<name>.test.index``; ``test_idx_range = sort(...)``;
    2. if the test ids are not contiguous (CiteSeer: 15 isolated test-range nodes without
       features/labels) pad ``tx``/``ty`` with zero rows to span ``[min, max]`` and place the
       real rows at ``test_idx_range - min``;
    3. ``features = vstack(allx, tx)``, ``labels = vstack(ally, ty)`` then
       ``features[test_idx_reorder] = features[test_idx_range]`` (same for labels);
    4. edges from the adjacency dict, both directions, no self-loops, de-duplicated;
    5. masks: train = ``range(len(y))``, val = ``range(len(y), len(y) + num_val)``,
       test = ``test_idx_range``.

    Returns features float32 [N, F] (raw values, not row-normalised) and labels int32 [N]
    (``-1`` for all-zero label rows).
    """
    directory = pathlib.Path(directory)
    obj = {k: _load_pickle(directory / f"ind.{name}.{k}") for k in RAW_SUFFIXES if k != "test.index"}
    text = (directory / f"ind.{name}.test.index").read_text()
    test_idx_reorder = np.asarray([int(t) for t in text.split()], dtype=np.int64)
    test_idx_range = np.sort(test_idx_reorder)

    tx, ty = _dense(obj["tx"]), _dense(obj["ty"])
    lo, hi = int(test_idx_range[0]), int(test_idx_range[-1])
    if hi - lo + 1 != len(test_idx_range):  # CiteSeer fix (Kipf): isolated test-range nodes
        tx_ext = np.zeros((hi - lo + 1, tx.shape[1]), dtype=tx.dtype)
        tx_ext[test_idx_range - lo] = tx
        ty_ext = np.zeros((hi - lo + 1, ty.shape[1]), dtype=ty.dtype)
        ty_ext[test_idx_range - lo] = ty
        tx, ty = tx_ext, ty_ext

    features = np.vstack([_dense(obj["allx"]), tx]).astype(np.float32)
    onehot = np.vstack([_dense(obj["ally"]), ty])
    features[test_idx_reorder] = features[test_idx_range]
    onehot[test_idx_reorder] = onehot[test_idx_range]
    labels = labels_from_onehot(onehot)
    num_nodes = features.shape[0]

    senders, receivers = edges_from_adjacency_dict(obj["graph"], num_nodes)
    num_train = _dense(obj["y"]).shape[0]
    train_mask = np.zeros(num_nodes, dtype=bool)
    train_mask[:num_train] = True
    val_mask = np.zeros(num_nodes, dtype=bool)
    val_mask[num_train : num_train + num_val] = True
    test_mask = np.zeros(num_nodes, dtype=bool)
    test_mask[test_idx_range] = True
    return NodeClassificationDataset(
        graph=make_graph(senders, receivers, num_nodes, nodes=features),
        labels=labels,
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=int(onehot.shape[1]),
        name=name,
    )


def read_node_classification_npz(path: str | os.PathLike, name: str) -> NodeClassificationDataset:
    """Read a jgnn node-classification ``.npz`` (the ``shared/data`` Planetoid schema).

    Required keys: ``senders``, ``receivers``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``,
    ``num_nodes``, ``num_classes``; optional ``x`` (float32 [N, F]; ``graph.nodes = None`` if absent).
    """
    with np.load(path, allow_pickle=False) as d:
        num_nodes = int(d["num_nodes"])
        x = d["x"].astype(np.float32) if "x" in d.files else None
        return NodeClassificationDataset(
            graph=make_graph(d["senders"], d["receivers"], num_nodes, nodes=x),
            labels=d["y"].astype(np.int32),
            train_mask=d["train_mask"].astype(bool),
            val_mask=d["val_mask"].astype(bool),
            test_mask=d["test_mask"].astype(bool),
            num_classes=int(d["num_classes"]),
            name=name,
        )


def load_planetoid(
    name: str, root: str | os.PathLike | None = None, *, allow_download: bool = True
) -> NodeClassificationDataset:
    """Load Cora, CiteSeer or PubMed with the public Planetoid split (20 labels per class).

    Looks in each directory of :func:`jgnn.datasets.cache.search_dirs` in turn for
    ``<name>.npz``, then for raw ``ind.<name>.*`` files (directly in the directory or in its
    ``planetoid/`` sub-directory); otherwise downloads the raw files from
    github.com/kimiyoung/planetoid into ``data_dir() / "planetoid"``.

    Note: the shared ``pubmed.npz`` has **no node features** (``ind.pubmed.allx`` could not be
    obtained), so ``graph.nodes`` is ``None`` for PubMed loaded from it; callers needing input
    features must supply their own (e.g. an identity/embedding table or degree features).
    Raw PubMed files, when present, give the 500-d TF-IDF features.

    Returns a :class:`NodeClassificationDataset`; ``graph.nodes`` is float32 [N, F] or ``None``.
    """
    name = name.lower()
    if name not in PLANETOID_NAMES:
        raise ValueError(f"unknown Planetoid data set {name!r}; expected one of {PLANETOID_NAMES}")
    dirs = cache.search_dirs(root)
    for d in dirs:  # earlier directories win; within one, the .npz wins over raw files
        if (d / f"{name}.npz").is_file():
            return read_node_classification_npz(d / f"{name}.npz", name)
        for sub in (d, d / "planetoid"):
            if all((sub / f"ind.{name}.{s}").is_file() for s in RAW_SUFFIXES):
                return parse_planetoid_raw(sub, name)
    if not allow_download:
        raise cache.DatasetUnavailableError(
            f"Planetoid {name!r}: neither {name}.npz nor ind.{name}.* found in "
            f"[{', '.join(map(str, dirs))}] and allow_download=False"
        )
    files = {f"ind.{name}.{s}": PLANETOID_URL.format(name=name, suffix=s) for s in RAW_SUFFIXES}
    target = cache.download_all(files, cache.data_dir() / "planetoid", searched=dirs)
    return parse_planetoid_raw(target, name)
