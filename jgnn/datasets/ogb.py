"""Reader for OGB node-property-prediction directories (e.g. an unpacked ``ogbn-arxiv``).

Expected layout (as in the OGB zip archives, e.g. ``arxiv/``)::

    <path>/raw/edge.csv.gz            E lines "src,dst" (directed src -> dst)
    <path>/raw/num-node-list.csv.gz   one line: N
    <path>/raw/num-edge-list.csv.gz   one line: E
    <path>/raw/node-feat.csv.gz       optional; N lines of F comma-separated floats
    <path>/raw/node-label.csv.gz      N lines, one class id per line ("nan" = unlabelled)
    <path>/split/<scheme>/{train,valid,test}.csv.gz   one node id per line

A ``.npz`` path is also accepted, in the jgnn node-classification schema (see
:func:`jgnn.datasets.planetoid.read_node_classification_npz`). No download is attempted: OGB
archives are large; fetch them with the ``ogb`` package and point this reader at the directory.
"""
from __future__ import annotations

import gzip
import os
import pathlib

import numpy as np

from jgnn.datasets.convert import check_indices
from jgnn.datasets.planetoid import read_node_classification_npz
from jgnn.datasets.types import NodeClassificationDataset, make_graph


def _read_csv_gz(path: pathlib.Path, dtype, ncols: int | None = None) -> np.ndarray:
    """Comma-separated numeric text (gzip) as a 2-D array [rows, cols] (empty files -> [0, ncols])."""
    with gzip.open(path, "rt") as f:
        arr = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)
    if arr.size == 0 and ncols is not None:
        arr = arr.reshape(0, ncols)
    return arr


def _single_count(path: pathlib.Path, what: str) -> int:
    counts = _read_csv_gz(path, np.int64).ravel()
    if counts.shape[0] != 1:
        raise ValueError(
            f"{path} lists {counts.shape[0]} graphs; a node-property set has exactly one ({what})"
        )
    return int(counts[0])


def _pick_split(split_root: pathlib.Path, split: str | None) -> pathlib.Path:
    schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
    if split is None:
        if len(schemes) != 1:
            raise ValueError(f"{split_root} has split schemes {schemes}; pass split=<one of them>")
        split = schemes[0]
    if split not in schemes:
        raise ValueError(f"split scheme {split!r} not found in {split_root} (has {schemes})")
    return split_root / split


def load_ogb_directory(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    name: str | None = None,
    to_undirected: bool = False,
) -> NodeClassificationDataset:
    """Load an OGB node-property directory (or a jgnn ``.npz``) as a node classification set.

    Args:
      path: the data set directory (containing ``raw/`` and ``split/``) or a ``.npz`` file.
      split: split scheme sub-directory of ``split/`` (e.g. ``"time"``); required only when there
        is more than one.
      name: data set name (default: the directory name).
      to_undirected: append the reverse of every edge (duplicates are not removed).

    Returns:
      ``graph.nodes`` float32 [N, F] (``None`` without ``node-feat.csv.gz``), int32 edges in
      file order, ``labels`` int32 [N] (``-1`` for ``nan``), masks from the split files, and
      ``num_classes = max(label) + 1``.
    """
    path = pathlib.Path(path)
    if path.suffix == ".npz":
        return read_node_classification_npz(path, name or path.stem)
    raw = path / "raw"
    if not raw.is_dir():
        raise FileNotFoundError(f"{path} is not an OGB directory: {raw} does not exist")
    num_nodes = _single_count(raw / "num-node-list.csv.gz", "num-node-list")
    num_edges = _single_count(raw / "num-edge-list.csv.gz", "num-edge-list")
    edge = _read_csv_gz(raw / "edge.csv.gz", np.int64, ncols=2)
    if edge.shape != (num_edges, 2):
        raise ValueError(f"edge.csv.gz has shape {edge.shape}, expected ({num_edges}, 2) from num-edge-list")
    senders = check_indices(edge[:, 0], num_nodes, "edge.csv.gz column 0 (senders)")
    receivers = check_indices(edge[:, 1], num_nodes, "edge.csv.gz column 1 (receivers)")
    if to_undirected:
        senders, receivers = np.concatenate([senders, receivers]), np.concatenate([receivers, senders])

    feats = None
    if (raw / "node-feat.csv.gz").is_file():
        feats = _read_csv_gz(raw / "node-feat.csv.gz", np.float32)
        if feats.shape[0] != num_nodes:
            raise ValueError(f"node-feat.csv.gz has {feats.shape[0]} rows, expected {num_nodes}")
    lab = _read_csv_gz(raw / "node-label.csv.gz", np.float64)
    if lab.shape != (num_nodes, 1):
        raise ValueError(f"node-label.csv.gz has shape {lab.shape}, expected ({num_nodes}, 1)")
    lab = lab[:, 0]
    labels = np.where(np.isnan(lab), -1, lab).astype(np.int32)

    split_dir = _pick_split(path / "split", split)
    masks = {}
    for k in ("train", "valid", "test"):
        idx = _read_csv_gz(split_dir / f"{k}.csv.gz", np.int64, ncols=1).ravel()
        idx = check_indices(idx, num_nodes, f"split/{split_dir.name}/{k}.csv.gz")
        m = np.zeros(num_nodes, dtype=bool)
        m[idx] = True
        masks[k] = m
    return NodeClassificationDataset(
        graph=make_graph(senders, receivers, num_nodes, nodes=feats),
        labels=labels,
        train_mask=masks["train"],
        val_mask=masks["valid"],
        test_mask=masks["test"],
        num_classes=int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 0,
        name=name or path.name,
    )
