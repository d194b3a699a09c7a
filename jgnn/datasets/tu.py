"""TUDataset graph classification sets (MUTAG, PROTEINS, ENZYMES, NCI1, IMDB-BINARY, REDDIT-BINARY, ...).

Two on-disk forms are read:

* the jgnn ``tu_<name>.npz`` files (schema in ``shared/data/README.md`` section 4: the disjoint union of all
  graphs with global 0-based node ids, ``n_node``/``n_edge`` [G], ``graph_label`` [G] in ``0..C-1``,
  optional ``node_label`` [N], ``node_attr`` [N, d], ``edge_label`` [E]);
* the TU text format of graphlearning.io (Morris et al. 2020): a directory holding
  ``<DS>_A.txt`` (``row, col`` per line, 1-based global node ids), ``<DS>_graph_indicator.txt`` (graph id of
  every node, 1-based), ``<DS>_graph_labels.txt`` (one label per graph) and optionally
  ``<DS>_node_labels.txt``, ``<DS>_node_attributes.txt``, ``<DS>_edge_labels.txt``,
  ``<DS>_edge_attributes.txt`` (comma-separated rows), parsed by :func:`parse_tu_directory` as PyG's
  ``read_tu_data`` does (0-based ids, self-loops dropped, duplicate edges coalesced, labels shifted to start
  at 0, graph labels mapped to their sorted distinct values).

If neither is found, ``<DS>.zip`` is downloaded from the canonical TU address into
``data_dir() / "tu" / <DS>`` (all or nothing: a failed download leaves no directory behind).
"""
from __future__ import annotations

import io
import os
import pathlib
import shutil
import tempfile
import zipfile
from collections.abc import Mapping

import numpy as np

from jgnn.datasets import cache
from jgnn.datasets.types import GraphClassificationDataset, make_batched_graph

TU_URL = "https://www.chrsmrrs.com/graphkerneldatasets/{name}.zip"
#: TU name -> file stem of the converted npz in ``shared/data`` (``tu_<stem>.npz``).
TU_NPZ = {
    "MUTAG": "mutag",
    "PROTEINS": "proteins",
    "ENZYMES": "enzymes",
    "NCI1": "nci1",
    "IMDB-BINARY": "imdb_binary",
    "REDDIT-BINARY": "reddit_binary",
}
_REQUIRED = ("A", "graph_indicator", "graph_labels")
_OPTIONAL = ("node_labels", "node_attributes", "edge_labels", "edge_attributes")


def _canonical_name(name: str) -> str:
    """``"imdb_binary"``, ``"imdb-binary"`` and ``"IMDB-BINARY"`` all name ``IMDB-BINARY``."""
    upper = name.upper().replace("_", "-")
    return upper if upper in TU_NPZ else name


def _read_table(path: pathlib.Path, dtype) -> np.ndarray:
    """A comma-separated numeric text file as a 2-D array [rows, cols] (CR, spaces and blank lines ignored)."""
    text = path.read_text().replace("\r", "")
    rows = [line for line in text.split("\n") if line.strip()]
    if not rows:
        return np.zeros((0, 1), dtype)
    try:
        return np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as err:
        raise ValueError(f"{path.name}: not a comma-separated numeric table ({err})") from err


def _shift_labels(labels: np.ndarray) -> np.ndarray:
    """PyG: every label column minus its minimum (so ids start at 0); one column -> 1-D int32."""
    labels = labels - labels.min(axis=0, keepdims=True)
    return (labels[:, 0] if labels.shape[1] == 1 else labels).astype(np.int32)


def parse_tu_directory(directory: str | os.PathLike, name: str) -> dict[str, np.ndarray]:
    """Parse the TU text files ``<directory>/<name>_*.txt`` into arrays of the ``tu_*.npz`` schema.

    Returns ``senders``, ``receivers`` (int32 [E], sorted by (sender, receiver), self-loops dropped,
    duplicates coalesced keeping the first occurrence's edge label/attribute), ``node_graph`` (int32 [N]),
    ``n_node``, ``n_edge`` (int32 [G]), ``graph_label`` (int32 [G], index into ``graph_label_values``),
    ``graph_label_values``, ``num_graphs``, ``num_nodes``, ``num_classes``, and when present ``node_label``
    (int32 [N], or [N, k] for k label columns), ``num_node_labels``, ``node_attr`` (float32 [N, d]),
    ``edge_label``, ``num_edge_labels``, ``edge_attr`` (float32 [E, d]).

    Raises ``ValueError`` naming the file when a required file is missing, the graph indicator is not sorted
    or does not cover ``1..G``, an edge joins two graphs, or a per-node / per-edge file has the wrong length.
    """
    directory = pathlib.Path(directory)
    path = {k: directory / f"{name}_{k}.txt" for k in _REQUIRED + _OPTIONAL}
    missing = [path[k].name for k in _REQUIRED if not path[k].is_file()]
    if missing:
        raise ValueError(f"TU data set {name!r} in {directory}: missing {', '.join(missing)}")
    indicator = _read_table(path["graph_indicator"], np.int64)[:, 0]
    num_nodes = indicator.shape[0]
    graph_raw = _read_table(path["graph_labels"], np.int64)[:, 0]
    num_graphs = graph_raw.shape[0]
    if np.any(np.diff(indicator) < 0) or (num_nodes and (indicator[0] != 1 or indicator[-1] != num_graphs)):
        raise ValueError(f"{path['graph_indicator'].name}: graph ids must be sorted and run from 1 to {num_graphs}")
    node_graph = (indicator - 1).astype(np.int32)
    n_node = np.bincount(node_graph, minlength=num_graphs).astype(np.int32)
    if n_node.size and n_node.min() == 0:
        raise ValueError(f"{path['graph_indicator'].name}: graph {int(np.argmin(n_node)) + 1} has no nodes")

    a = _read_table(path["A"], np.int64)
    if a.shape[1] != 2:
        raise ValueError(f"{path['A'].name}: expected two columns 'row, col', got {a.shape[1]}")
    senders, receivers = a[:, 0] - 1, a[:, 1] - 1
    bad = (senders < 0) | (senders >= num_nodes) | (receivers < 0) | (receivers >= num_nodes)
    if bad.any():
        raise ValueError(f"{path['A'].name}: line {int(np.argmax(bad)) + 1} names a node outside 1..{num_nodes}")
    if np.any(node_graph[senders] != node_graph[receivers]):
        line = int(np.argmax(node_graph[senders] != node_graph[receivers])) + 1
        raise ValueError(f"{path['A'].name}: the edge on line {line} joins two graphs")

    edge_cols = {}
    for key in ("edge_labels", "edge_attributes"):
        if path[key].is_file():
            table = _read_table(path[key], np.int64 if key == "edge_labels" else np.float64)
            if table.shape[0] != a.shape[0]:
                raise ValueError(f"{path[key].name}: {table.shape[0]} rows for {a.shape[0]} edges")
            edge_cols[key] = table
    # PyG: drop self-loops, then coalesce (sort by (row, col), keep one copy of each edge)
    keep = senders != receivers
    senders, receivers = senders[keep], receivers[keep]
    edge_cols = {k: v[keep] for k, v in edge_cols.items()}
    key = senders * max(num_nodes, 1) + receivers
    _, first = np.unique(key, return_index=True)  # sorted by key = (sender, receiver); first occurrence
    senders, receivers = senders[first], receivers[first]
    edge_cols = {k: v[first] for k, v in edge_cols.items()}

    values, graph_label = np.unique(graph_raw, return_inverse=True)
    out: dict[str, np.ndarray] = {
        "senders": senders.astype(np.int32),
        "receivers": receivers.astype(np.int32),
        "node_graph": node_graph,
        "n_node": n_node,
        "n_edge": np.bincount(node_graph[senders], minlength=num_graphs).astype(np.int32),
        "graph_label": graph_label.astype(np.int32),
        "graph_label_values": values.astype(np.int32),
        "num_graphs": np.int64(num_graphs),
        "num_nodes": np.int64(num_nodes),
        "num_classes": np.int64(values.shape[0]),
    }
    for key, (label_key, count_key) in {"node_labels": ("node_label", "num_node_labels"),
                                        "edge_labels": ("edge_label", "num_edge_labels")}.items():
        table = edge_cols.get(key) if key == "edge_labels" else (
            _read_table(path[key], np.int64) if path[key].is_file() else None)
        if table is None:
            continue
        if key == "node_labels" and table.shape[0] != num_nodes:
            raise ValueError(f"{path[key].name}: {table.shape[0]} rows for {num_nodes} nodes")
        labels = _shift_labels(table)
        out[label_key] = labels
        out[count_key] = np.int64(labels.max() + 1 if labels.size else 0)
    if path["node_attributes"].is_file():
        attr = _read_table(path["node_attributes"], np.float64)
        if attr.shape[0] != num_nodes:
            raise ValueError(f"{path['node_attributes'].name}: {attr.shape[0]} rows for {num_nodes} nodes")
        out["node_attr"] = attr.astype(np.float32)
    if "edge_attributes" in edge_cols:
        out["edge_attr"] = edge_cols["edge_attributes"].astype(np.float32)
    return out


def _one_hot(labels: np.ndarray, width: int) -> np.ndarray:
    """float32 one-hot rows of int labels [N] of width ``width``; [N, k] label columns give k one-hots side by
    side, each as wide as its column's largest label + 1 (PyG's ``TUDataset``)."""
    if labels.ndim == 1:
        return np.eye(width, dtype=np.float32)[labels]
    return np.concatenate([_one_hot(col, int(col.max()) + 1) for col in labels.T], axis=1)


def tu_dataset_from_arrays(arrays: Mapping[str, np.ndarray], name: str, *,
                           use_node_attr: bool = False) -> GraphClassificationDataset:
    """Build a :class:`GraphClassificationDataset` from ``tu_*.npz``-schema arrays.

    Node features follow PyG's ``TUDataset``: the one-hot node labels (width ``num_node_labels``), preceded by
    the continuous node attributes when ``use_node_attr``; ``None`` when the data set has neither (IMDB-BINARY,
    REDDIT-BINARY: use :func:`one_hot_degree`). Edge features are the one-hot edge labels (MUTAG's bond
    types), else ``None``.
    """
    parts = []
    if use_node_attr and "node_attr" in arrays:
        parts.append(np.asarray(arrays["node_attr"], np.float32))
    node_label = arrays.get("node_label")
    if node_label is not None:
        parts.append(_one_hot(np.asarray(node_label), int(arrays["num_node_labels"])))
    nodes = np.concatenate(parts, axis=1) if parts else None
    edge_label = arrays.get("edge_label")
    edges = None if edge_label is None else _one_hot(np.asarray(edge_label), int(arrays["num_edge_labels"]))
    graph = make_batched_graph(arrays["senders"], arrays["receivers"], arrays["n_node"], arrays["n_edge"],
                               nodes=nodes, edges=edges)
    return GraphClassificationDataset(
        graph=graph,
        labels=np.asarray(arrays["graph_label"], np.int32),
        num_classes=int(arrays["num_classes"]),
        node_labels=None if node_label is None else np.asarray(node_label, np.int32),
        node_attributes=None if "node_attr" not in arrays else np.asarray(arrays["node_attr"], np.float32),
        edge_labels=None if edge_label is None else np.asarray(edge_label, np.int32),
        name=name,
    )


def _download_tu(name: str, target: pathlib.Path, searched) -> pathlib.Path:
    """Download and unpack ``<name>.zip`` into ``target``; return it.

    Everything happens in a temporary directory outside the cache; ``target`` appears (by one rename of a
    sibling staging directory) only once the archive parsed, so a failure leaves no cache directory.
    """
    with tempfile.TemporaryDirectory() as tmp:
        archive = cache.download(TU_URL.format(name=name), pathlib.Path(tmp) / f"{name}.zip", searched=searched)
        unpacked = pathlib.Path(tmp) / "unpacked"
        unpacked.mkdir()
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                base = pathlib.PurePosixPath(member).name
                if base.startswith(f"{name}_") and base.endswith(".txt"):
                    (unpacked / base).write_bytes(z.read(member))
        parse_tu_directory(unpacked, name)  # a broken archive must not land in the cache
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}.", suffix=".part"))
        for f in unpacked.iterdir():
            shutil.copyfile(f, staging / f.name)
        os.replace(staging, target)
    return target


def load_tu(name: str, root: str | os.PathLike | None = None, *, use_node_attr: bool = False,
            allow_download: bool = True) -> GraphClassificationDataset:
    """Load a TUDataset graph classification set, e.g. ``"MUTAG"``, ``"PROTEINS"``, ``"IMDB-BINARY"``.

    Lookup, in each directory of :func:`~jgnn.datasets.cache.search_dirs` in turn: ``tu_<stem>.npz`` (the six
    converted sets, see :data:`TU_NPZ`), else the TU text files in ``<dir>/<name>/``, ``<dir>/<name>/raw/`` or
    ``<dir>/tu/<name>/``; otherwise ``<name>.zip`` is downloaded from the TU site into
    ``data_dir()/tu/<name>/``. Any other TU data set name works with the text files or the download.

    Returns a :class:`GraphClassificationDataset`: one ``GraphsTuple`` holding all ``G`` graphs
    (``n_node``/``n_edge`` int32 [G]), graph labels int32 [G]. Node features: see
    :func:`tu_dataset_from_arrays`.
    """
    name = _canonical_name(name)
    dirs = cache.search_dirs(root)
    kw = {"use_node_attr": use_node_attr}
    stem = TU_NPZ.get(name)
    for d in dirs:  # earlier directories win; within one, the npz wins over text files
        if stem is not None and (d / f"tu_{stem}.npz").is_file():
            with np.load(d / f"tu_{stem}.npz", allow_pickle=False) as z:
                return tu_dataset_from_arrays(dict(z), name, **kw)
        for sub in (d / name, d / name / "raw", d / "tu" / name):
            if (sub / f"{name}_A.txt").is_file():
                return tu_dataset_from_arrays(parse_tu_directory(sub, name), name, **kw)
    if not allow_download:
        raise cache.DatasetUnavailableError(
            f"TU data set {name!r}: neither tu_{stem or name.lower()}.npz nor {name}/{name}_A.txt found in "
            f"[{', '.join(map(str, dirs))}] and allow_download=False"
        )
    target = _download_tu(name, cache.data_dir() / "tu" / name, dirs)
    return tu_dataset_from_arrays(parse_tu_directory(target, name), name, **kw)


def one_hot_degree(dataset: GraphClassificationDataset, max_degree: int | None = None) -> np.ndarray:
    """float32 [N, D + 1] one-hot in-degree features (PyG's ``OneHotDegree``), for sets without node labels.

    ``max_degree`` defaults to the largest in-degree of the data set; larger degrees are clipped to it.
    """
    deg = np.bincount(dataset.graph.receivers, minlength=dataset.num_nodes)
    top = int(deg.max(initial=0)) if max_degree is None else int(max_degree)
    return np.eye(top + 1, dtype=np.float32)[np.minimum(deg, top)]
