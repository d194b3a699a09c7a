"""Relational (typed) data sets: R-GCN entity classification and KG link prediction.

Typed graphs follow the jgnn convention: ``graph.nodes = {"type": int32 [N]}`` (or ``None``)
and ``graph.edges = {"type": int32 [E]}``.

Entity classification (AIFB, MUTAG; Schlichtkrull et al. 2018):
  read from ``<name>.npz`` (``shared/data/README.md`` section 2) or parsed from the R-GCN raw
  files ``<name>_stripped.nt.gz`` + ``trainingSet.tsv`` + ``testSet.tsv`` with a minimal
  N-Triples reader (:func:`parse_ntriples`, :func:`build_entity_dataset`).

Link prediction (FB15k-237, WN18RR, Kinship, Nations, UMLS; ConvE splits):
  read from ``<name>.npz`` (README section 3) or from ``train.txt``/``valid.txt``/``test.txt``
  (tab-separated ``head\\trelation\\ttail``), either in a directory or inside the ConvE
  ``*.tar.gz`` archive (:func:`parse_triples`, :func:`build_link_prediction_arrays`).
"""
from __future__ import annotations

import collections
import csv
import gzip
import io
import os
import pathlib
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from jgnn.datasets import cache
from jgnn.datasets.types import EntityClassificationDataset, LinkPredictionDataset, make_graph

# ---------------------------------------------------------------------------------------------
# Relation augmentation
# ---------------------------------------------------------------------------------------------


def add_inverse_and_self_loops(
    senders: np.ndarray,
    receivers: np.ndarray,
    edge_type: np.ndarray,
    num_nodes: int,
    num_relations: int,
    *,
    add_inverse: bool = True,
    add_self_loops: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """R-GCN edge augmentation.

    With ``add_inverse`` every edge ``s -(t)-> r`` gets a reverse edge ``r -(t + R)-> s``
    (appended after the originals). With ``add_self_loops`` every node gets one edge ``i -> i``
    whose type is the relation count at that point (``2R`` with inverses, ``R`` without).

    Returns ``(senders, receivers, edge_type, num_edge_types)`` with int32 arrays.
    """
    s, r, t = (np.asarray(a, dtype=np.int32) for a in (senders, receivers, edge_type))
    num_types = int(num_relations)
    if add_inverse:
        s, r, t = np.concatenate([s, r]), np.concatenate([r, s]), np.concatenate([t, t + num_types])
        num_types *= 2
    if add_self_loops:
        loop = np.arange(num_nodes, dtype=np.int32)
        s, r = np.concatenate([s, loop]), np.concatenate([r, loop])
        t = np.concatenate([t, np.full(num_nodes, num_types, dtype=np.int32)])
        num_types += 1
    return s, r, t.astype(np.int32), num_types


# ---------------------------------------------------------------------------------------------
# Entity classification (AIFB, MUTAG)
# ---------------------------------------------------------------------------------------------

ENTITY_NAMES = ("aifb", "mutag")
NODE_KIND_IRI, NODE_KIND_BLANK, NODE_KIND_LITERAL = 0, 1, 2
NUM_NODE_KINDS = 3
_LATENT_GCN = (
    "https://raw.githubusercontent.com/alexanderdesouza/latent-GCN/"
    "9a3b70966ae041f41105315ca4fc55e13af89681/data/{name}/{file}"
)
#: name -> (entity column, label column) of the R-GCN ``trainingSet.tsv``/``testSet.tsv``.
ENTITY_TSV_COLUMNS = {"aifb": ("person", "label_affiliation"), "mutag": ("bond", "label_mutagenic")}

_IRI = r"<[^>]*>"
_BLANK = r"_:\S+"
_LITERAL = r'"(?:[^"\\]|\\.)*"(?:@[A-Za-z0-9-]+|\^\^<[^>]*>)?'
_NT_LINE = re.compile(
    rf"^\s*({_IRI}|{_BLANK})\s+({_IRI})\s+({_IRI}|{_BLANK}|{_LITERAL})\s*\.\s*$"
)


def parse_ntriples(lines: Iterable[str]) -> list[tuple[str, str, str]]:
    """Parse N-Triples lines into ``(subject, predicate, object)`` term strings.

    Terms are kept exactly as written (``<iri>``, ``_:label`` or ``"lex"[@lang|^^<dt>]``).
    Blank lines and ``#`` comments are skipped; any other line that does not parse raises
    ``ValueError`` naming its line number.
    """
    out = []
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _NT_LINE.match(stripped)
        if m is None:
            raise ValueError(f"N-Triples line {lineno} does not parse: {stripped[:120]!r}")
        out.append((m.group(1), m.group(2), m.group(3)))
    return out


def node_kind(term: str) -> int:
    """0 for an IRI, 1 for a blank node, 2 for a literal."""
    if term.startswith("<"):
        return NODE_KIND_IRI
    if term.startswith("_:"):
        return NODE_KIND_BLANK
    return NODE_KIND_LITERAL


def read_label_tsv(lines: Iterable[str], entity_column: str, label_column: str) -> list[tuple[str, str]]:
    """``(entity term, label string)`` pairs from an R-GCN split TSV (header row, tab-separated).

    Entity IRIs are wrapped in ``<...>`` unless already bracketed.
    """
    reader = csv.DictReader(lines, delimiter="\t")
    missing = {entity_column, label_column} - set(reader.fieldnames or ())
    if missing:
        raise ValueError(f"label TSV lacks column(s) {sorted(missing)}; has {reader.fieldnames}")
    pairs = []
    for row in reader:
        ent = row[entity_column].strip()
        if not (ent.startswith("<") or ent.startswith("_:") or ent.startswith('"')):
            ent = f"<{ent}>"
        pairs.append((ent, row[label_column].strip()))
    return pairs


def build_entity_dataset(
    triples: Sequence[tuple[str, str, str]],
    train: Sequence[tuple[str, str]],
    test: Sequence[tuple[str, str]],
) -> dict[str, np.ndarray]:
    """R-GCN processing of parsed triples and labelled entities into npz-schema arrays.

    * nodes: all distinct subject/object terms, sorted by term string (literals are nodes);
    * relations: ordered by frequency (most frequent first), ties broken by predicate string;
    * duplicate triples are dropped; edges sorted by (edge_type, sender, receiver);
    * label ids follow the sorted distinct label strings.

    Returns a dict with ``senders``, ``receivers``, ``edge_type``, ``train_idx``, ``test_idx``,
    ``labels`` (train then test), ``y`` (int32 [N], -1 unlabelled), ``node_kind`` (int8 [N]),
    ``num_nodes``, ``num_relations``, ``relation_names``, ``label_names``, ``entity_names``.
    """
    triples = sorted(set(triples))
    entities = sorted({t[0] for t in triples} | {t[2] for t in triples})
    ent_id = {e: i for i, e in enumerate(entities)}
    counts = collections.Counter(p for _, p, _ in triples)
    relations = sorted(counts, key=lambda p: (-counts[p], p))
    rel_id = {p: i for i, p in enumerate(relations)}
    s = np.asarray([ent_id[t[0]] for t in triples], dtype=np.int64)
    p = np.asarray([rel_id[t[1]] for t in triples], dtype=np.int64)
    o = np.asarray([ent_id[t[2]] for t in triples], dtype=np.int64)
    order = np.lexsort((o, s, p))
    label_names = sorted({lab for _, lab in train} | {lab for _, lab in test})
    lab_id = {lab: i for i, lab in enumerate(label_names)}
    for ent, _ in list(train) + list(test):
        if ent not in ent_id:
            raise ValueError(f"labelled entity {ent} does not occur in the graph")
    train_idx = np.asarray([ent_id[e] for e, _ in train], dtype=np.int32)
    test_idx = np.asarray([ent_id[e] for e, _ in test], dtype=np.int32)
    labels = np.asarray([lab_id[lab] for _, lab in list(train) + list(test)], dtype=np.int32)
    y = np.full(len(entities), -1, dtype=np.int32)
    y[np.concatenate([train_idx, test_idx])] = labels
    return {
        "senders": s[order].astype(np.int32),
        "receivers": o[order].astype(np.int32),
        "edge_type": p[order].astype(np.int32),
        "train_idx": train_idx,
        "test_idx": test_idx,
        "labels": labels,
        "y": y,
        "node_kind": np.asarray([node_kind(e) for e in entities], dtype=np.int8),
        "num_nodes": np.int64(len(entities)),
        "num_relations": np.int64(len(relations)),
        "relation_names": np.asarray(relations, dtype=str),
        "label_names": np.asarray(label_names, dtype=str),
        "entity_names": np.asarray(entities, dtype=str),
    }


def parse_entities_raw(directory: str | os.PathLike, name: str) -> dict[str, np.ndarray]:
    """Parse ``<name>_stripped.nt.gz`` (or ``.nt``), ``trainingSet.tsv``, ``testSet.tsv``."""
    directory = pathlib.Path(directory)
    nt = directory / f"{name}_stripped.nt.gz"
    if nt.is_file():
        with gzip.open(nt, "rt", encoding="utf-8") as f:
            triples = parse_ntriples(f)
    else:
        with open(directory / f"{name}_stripped.nt", encoding="utf-8") as f:
            triples = parse_ntriples(f)
    ent_col, lab_col = ENTITY_TSV_COLUMNS[name]
    with open(directory / "trainingSet.tsv", encoding="utf-8", newline="") as f:
        train = read_label_tsv(f, ent_col, lab_col)
    with open(directory / "testSet.tsv", encoding="utf-8", newline="") as f:
        test = read_label_tsv(f, ent_col, lab_col)
    return build_entity_dataset(triples, train, test)


def entity_dataset_from_arrays(
    arrays: Mapping[str, np.ndarray],
    name: str,
    *,
    add_inverse: bool = True,
    add_self_loops: bool = False,
) -> EntityClassificationDataset:
    """Build an :class:`EntityClassificationDataset` from npz-schema arrays (see module doc)."""
    num_nodes = int(arrays["num_nodes"])
    num_base = int(arrays["num_relations"])
    s, r, t, num_types = add_inverse_and_self_loops(
        arrays["senders"], arrays["receivers"], arrays["edge_type"], num_nodes, num_base,
        add_inverse=add_inverse, add_self_loops=add_self_loops,
    )
    train_idx = np.asarray(arrays["train_idx"], dtype=np.int32)
    test_idx = np.asarray(arrays["test_idx"], dtype=np.int32)
    labels = np.asarray(arrays["labels"], dtype=np.int32)
    n_train = train_idx.shape[0]
    if "label_names" in arrays:
        num_classes = len(arrays["label_names"])
    else:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    graph = make_graph(
        s, r, num_nodes,
        nodes={"type": np.asarray(arrays["node_kind"], dtype=np.int32)},
        edges={"type": t},
    )
    return EntityClassificationDataset(
        graph=graph,
        num_relations=num_types,
        num_base_relations=num_base,
        num_node_types=NUM_NODE_KINDS,
        train_idx=train_idx,
        test_idx=test_idx,
        train_labels=labels[:n_train],
        test_labels=labels[n_train:],
        num_classes=num_classes,
        name=name,
    )


def load_entities(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    add_inverse: bool = True,
    add_self_loops: bool = False,
    allow_download: bool = True,
) -> EntityClassificationDataset:
    """Load the R-GCN entity classification set ``"aifb"`` or ``"mutag"``.

    Graph: the stripped RDF graph (target relations removed); nodes are all subjects/objects
    (literals included). ``edges["type"]`` holds the relation id ``t in [0, R)``; with
    ``add_inverse`` (R-GCN default) the reverse edges are appended with type ``t + R``; with
    ``add_self_loops`` one self-loop per node is appended with type ``2R`` (``R`` without
    inverses). ``num_relations`` counts all edge types in the returned graph.

    Node types: AIFB/MUTAG have no node features and no single-valued node type, so
    ``nodes["type"]`` is the RDF term kind (0 = IRI, 1 = blank node, 2 = literal) and
    ``num_node_types = 3`` (MUTAG has no blank nodes, so type 1 is unused there).

    Lookup, in each search directory in turn: ``<name>.npz``, else raw
    ``<name>_stripped.nt.gz`` + ``trainingSet.tsv`` + ``testSet.tsv`` in ``<dir>/<name>/``;
    if none has them, download those raw files
    (R-GCN data as committed to github.com/alexanderdesouza/latent-GCN).
    """
    name = name.lower()
    if name not in ENTITY_NAMES:
        raise ValueError(f"unknown entity data set {name!r}; expected one of {ENTITY_NAMES}")
    kw = {"add_inverse": add_inverse, "add_self_loops": add_self_loops}
    dirs = cache.search_dirs(root)
    raw_files = (f"{name}_stripped.nt.gz", "trainingSet.tsv", "testSet.tsv")
    for d in dirs:  # earlier directories win; within one, the .npz wins over raw files
        if (d / f"{name}.npz").is_file():
            with np.load(d / f"{name}.npz", allow_pickle=False) as z:
                return entity_dataset_from_arrays(dict(z), name, **kw)
        if all((d / name / f).is_file() for f in raw_files):
            return entity_dataset_from_arrays(parse_entities_raw(d / name, name), name, **kw)
    if not allow_download:
        raise cache.DatasetUnavailableError(
            f"entity data set {name!r}: neither {name}.npz nor {name}/{raw_files[0]} found in "
            f"[{', '.join(map(str, dirs))}] and allow_download=False"
        )
    files = {f: _LATENT_GCN.format(name=name, file=f) for f in raw_files}
    target = cache.download_all(files, cache.data_dir() / name, searched=dirs)
    return entity_dataset_from_arrays(parse_entities_raw(target, name), name, **kw)


# ---------------------------------------------------------------------------------------------
# Link prediction (ConvE splits)
# ---------------------------------------------------------------------------------------------

#: data set name -> ConvE archive name.
LINK_PREDICTION_ARCHIVES = {
    "fb15k237": "FB15k-237.tar.gz",
    "wn18rr": "WN18RR.tar.gz",
    "kinship": "kinship.tar.gz",
    "nations": "nations.tar.gz",
    "umls": "umls.tar.gz",
}
_CONVE = "https://raw.githubusercontent.com/TimDettmers/ConvE/f3c0eb286025410fa5b4c04696c918264163d0ca/{file}"
SPLITS = ("train", "valid", "test")


def parse_triples(lines: Iterable[str]) -> list[tuple[str, str, str]]:
    """``(head, relation, tail)`` strings from tab-separated lines (CR/LF stripped, blanks skipped)."""
    out = []
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"triple line {lineno} has {len(parts)} tab-separated fields, expected 3")
        out.append((parts[0], parts[1], parts[2]))
    return out


def build_link_prediction_arrays(
    splits: Mapping[str, Sequence[tuple[str, str, str]]],
) -> dict[str, np.ndarray]:
    """Map string triples of ``train``/``valid``/``test`` to int32 [*, 3] id triples.

    Entity ids enumerate the entities of all splits sorted by name; relation ids likewise.
    Returns ``train_triples``, ``valid_triples``, ``test_triples``, ``num_nodes``,
    ``num_relations``, ``entity_names``, ``relation_names``.
    """
    all_triples = [t for k in SPLITS for t in splits[k]]
    entities = sorted({t[0] for t in all_triples} | {t[2] for t in all_triples})
    relations = sorted({t[1] for t in all_triples})
    ent_id = {e: i for i, e in enumerate(entities)}
    rel_id = {r: i for i, r in enumerate(relations)}
    out: dict[str, np.ndarray] = {}
    for k in SPLITS:
        arr = np.asarray([(ent_id[h], rel_id[r], ent_id[t]) for h, r, t in splits[k]], dtype=np.int32)
        out[f"{k}_triples"] = arr.reshape(-1, 3)
    out["num_nodes"] = np.int64(len(entities))
    out["num_relations"] = np.int64(len(relations))
    out["entity_names"] = np.asarray(entities, dtype=str)
    out["relation_names"] = np.asarray(relations, dtype=str)
    return out


def read_triples_directory(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read ``train.txt``, ``valid.txt``, ``test.txt`` from a directory."""
    directory = pathlib.Path(directory)
    splits = {}
    for k in SPLITS:
        with open(directory / f"{k}.txt", encoding="utf-8", newline="") as f:
            splits[k] = parse_triples(f)
    return build_link_prediction_arrays(splits)


def read_triples_archive(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read ``train.txt``, ``valid.txt``, ``test.txt`` from a ConvE ``.tar.gz`` archive.

    Members are matched by base name, so a leading directory inside the archive is fine.
    """
    splits: dict[str, list] = {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar.getmembers():
            base = pathlib.PurePosixPath(member.name).name
            if member.isfile() and base in {f"{k}.txt" for k in SPLITS}:
                raw = tar.extractfile(member).read()
                splits[base[:-4]] = parse_triples(io.StringIO(raw.decode("utf-8"), newline=""))
    missing = [k for k in SPLITS if k not in splits]
    if missing:
        raise ValueError(f"archive {path} lacks {', '.join(k + '.txt' for k in missing)}")
    return build_link_prediction_arrays(splits)


def link_prediction_from_arrays(
    arrays: Mapping[str, np.ndarray], name: str, *, add_inverse: bool = False
) -> LinkPredictionDataset:
    """Build a :class:`LinkPredictionDataset`; the graph is the (optionally inverse-augmented)
    train triples: ``head -(relation)-> tail`` (inverses ``tail -(relation + R)-> head``)."""
    train = np.asarray(arrays["train_triples"], dtype=np.int32).reshape(-1, 3)
    num_nodes = int(arrays["num_nodes"])
    num_rel = int(arrays["num_relations"])
    s, r, t, num_types = add_inverse_and_self_loops(
        train[:, 0], train[:, 2], train[:, 1], num_nodes, num_rel, add_inverse=add_inverse
    )
    return LinkPredictionDataset(
        graph=make_graph(s, r, num_nodes, nodes={"type": np.zeros(num_nodes, np.int32)}, edges={"type": t}),
        train_triples=train,
        valid_triples=np.asarray(arrays["valid_triples"], dtype=np.int32).reshape(-1, 3),
        test_triples=np.asarray(arrays["test_triples"], dtype=np.int32).reshape(-1, 3),
        num_nodes=num_nodes,
        num_relations=num_types,
        name=name,
    )


def load_link_prediction(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    add_inverse: bool = False,
    allow_download: bool = True,
) -> LinkPredictionDataset:
    """Load a KG link prediction set: fb15k237, wn18rr, kinship, nations or umls (ConvE splits).

    The message-passing graph uses the raw directed train triples (``senders = head``,
    ``receivers = tail``, ``edges = {"type": relation}``, ``nodes = {"type": zeros}``: one node type); pass
    ``add_inverse=True`` to append reverse edges with type ``relation + R`` (then
    ``num_relations = 2R``). Triples always use the raw relation ids in ``[0, R)``.

    Lookup, in each search directory in turn: ``<name>.npz``, else
    ``<dir>/<name>/{train,valid,test}.txt``, else the ConvE archive ``<dir>/<Archive>.tar.gz``
    (e.g. ``FB15k-237.tar.gz``); if none has them the archive is downloaded from
    github.com/TimDettmers/ConvE into :func:`~jgnn.datasets.cache.data_dir`.
    """
    name = name.lower()
    if name not in LINK_PREDICTION_ARCHIVES:
        raise ValueError(
            f"unknown link prediction data set {name!r}; expected one of {tuple(LINK_PREDICTION_ARCHIVES)}"
        )
    archive = LINK_PREDICTION_ARCHIVES[name]
    dirs = cache.search_dirs(root)
    path = None
    for d in dirs:  # earlier directories win; within one: .npz, then the .txt files, then archive
        if (d / f"{name}.npz").is_file():
            with np.load(d / f"{name}.npz", allow_pickle=False) as z:
                return link_prediction_from_arrays(dict(z), name, add_inverse=add_inverse)
        if all((d / name / f"{k}.txt").is_file() for k in SPLITS):
            arrays = read_triples_directory(d / name)
            return link_prediction_from_arrays(arrays, name, add_inverse=add_inverse)
        if (d / archive).is_file():
            path = d / archive
            break
    if path is None:
        if not allow_download:
            raise cache.DatasetUnavailableError(
                f"link prediction data set {name!r}: neither {name}.npz, {name}/train.txt nor "
                f"{archive} found in [{', '.join(map(str, dirs))}] and allow_download=False"
            )
        path = cache.download(_CONVE.format(file=archive), cache.data_dir() / archive, searched=dirs)
    return link_prediction_from_arrays(read_triples_archive(path), name, add_inverse=add_inverse)
