"""Heterogeneous node classification: DBLP (MAGNN/HGB preprocessing) as a :class:`jgnn.hetero.HeteroGraph`.

Reads ``hetero_dblp.npz`` (``shared/data/README.md`` section 6): authors (334-d bag of words), papers (4,231-d
sparse bag of words, kept as counts 1..5 or made binary), terms (50-d word vectors) and venues (no features),
six relations (author-paper, paper-term, paper-venue and their reverses), author labels in 4 classes and
MAGNN's 400 / 400 / 3,257 split. No download is attempted: the source is a preprocessed release.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from jgnn.datasets import cache
from jgnn.hetero import HeteroGraph


@dataclasses.dataclass(frozen=True, eq=False)
class HeteroNodeClassificationDataset:
    """A heterogeneous graph with labels on one node type.

    Attributes:
      graph: the :class:`~jgnn.hetero.HeteroGraph` (type-local ids; ``node_features`` per type, dense float32).
      target: the labelled node type.
      labels: int32 [N_target] class ids.
      train_idx, val_idx, test_idx: int32 type-local ids of ``target`` nodes.
      num_classes: number of classes.
      name: data set name.
    """

    graph: HeteroGraph
    target: str
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    name: str


def load_hetero_dblp(root: str | os.PathLike | None = None, *, binary_paper_features: bool = True
                     ) -> HeteroNodeClassificationDataset:
    """Load DBLP from ``hetero_dblp.npz``; edge types are ``(src, "<src>-<dst>", dst)`` as named in the file.

    Paper features are made dense (14,328 x 4,231 float32, 243 MB); ``binary_paper_features`` sets every
    non-zero count to 1 (PyG's ``DBLP`` does). Raises :class:`~jgnn.datasets.DatasetUnavailableError` when the
    file is in none of the searched directories.
    """
    dirs = cache.search_dirs(root)
    path = cache.find_file("hetero_dblp.npz", dirs)
    if path is None:
        raise cache.DatasetUnavailableError(
            f"hetero_dblp.npz not found in [{', '.join(map(str, dirs))}]; it is a preprocessed release (see "
            f"shared/data/README.md section 6) and is not downloaded")
    with np.load(path, allow_pickle=False) as d:
        z = dict(d)
    names = [str(n) for n in z["node_type_names"]]
    offsets = z["node_type_offsets"].astype(np.int64)
    num_nodes = {n: int(offsets[t + 1] - offsets[t]) for t, n in enumerate(names)}
    edge_index = {}
    for r, rel in enumerate(str(n) for n in z["edge_type_names"]):
        src, dst = names[int(z["edge_type_src"][r])], names[int(z["edge_type_dst"][r])]
        members = z["edge_type"] == r
        edge_index[(src, rel, dst)] = np.stack([z["senders"][members] - offsets[names.index(src)],
                                                z["receivers"][members] - offsets[names.index(dst)]]).astype(np.int64)
    rows, cols = z["x_paper_shape"].astype(np.int64)
    paper = np.zeros((rows, cols), np.float32)
    row_ids = np.repeat(np.arange(rows), np.diff(z["x_paper_indptr"]))
    paper[row_ids, z["x_paper_indices"]] = 1.0 if binary_paper_features else z["x_paper_data"]
    features = {"author": z["x_author"].astype(np.float32), "paper": paper, "term": z["x_term"].astype(np.float32)}
    target = names[int(z["target_node_type"])]
    t = names.index(target)
    labels = z["y"][offsets[t]:offsets[t + 1]].astype(np.int32)
    local = lambda idx: (np.asarray(idx, np.int64) - offsets[t]).astype(np.int32)
    return HeteroNodeClassificationDataset(
        graph=HeteroGraph(num_nodes, edge_index, {k: v for k, v in features.items() if k in num_nodes}),
        target=target, labels=labels, train_idx=local(z["train_idx"]), val_idx=local(z["val_idx"]),
        test_idx=local(z["test_idx"]), num_classes=int(z["num_classes"]), name="dblp")
