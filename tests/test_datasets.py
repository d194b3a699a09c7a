"""Tests for jgnn.datasets: real files (counts from shared/data/README.md), raw-format parsers on
tiny synthetic inputs, synthetic generators, converters and error messages."""
import gzip
import io
import pathlib
import pickle
import tarfile

import jax
import numpy as np
import pytest

import jgnn
from jgnn import datasets as D
from jgnn import nn as jnn
from jgnn.datasets import cache, planetoid, relational

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def edge_set(graph):
    return set(zip(graph.senders.tolist(), graph.receivers.tolist(), strict=True))


def check_graph(graph, num_nodes, num_edges):
    assert graph.senders.dtype == np.int32 and graph.receivers.dtype == np.int32
    assert graph.senders.shape == graph.receivers.shape == (num_edges,)
    assert graph.n_node.tolist() == [num_nodes] and graph.n_edge.tolist() == [num_edges]
    assert graph.globals is None
    if num_edges:
        assert graph.senders.min() >= 0 and graph.receivers.min() >= 0
        assert graph.senders.max() < num_nodes and graph.receivers.max() < num_nodes


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No $JGNN_DATA_DIR, no shared data, cache in tmp: loaders see only what a test provides."""
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "shared_data_dir", lambda: tmp_path / "no-shared")
    return tmp_path


# --------------------------------------------------------------------------------------------
# real files: the counts the shared README states
# --------------------------------------------------------------------------------------------

PLANETOID_README = {
    # name: N, E, F, C, train, val, test
    "cora": (2708, 10556, 1433, 7, 140, 500, 1000),
    "citeseer": (3327, 9104, 3703, 6, 120, 500, 1000),
    "pubmed": (19717, 88648, None, 3, 60, 500, 1000),
}


@pytest.mark.parametrize("name", sorted(PLANETOID_README))
def test_planetoid_npz_counts(data_dir, name):
    n, e, f, c, ntr, nva, nte = PLANETOID_README[name]
    ds = D.load_planetoid(name, root=data_dir)
    check_graph(ds.graph, n, e)
    assert ds.num_features == f and ds.num_classes == c and ds.name == name
    if f is None:
        assert ds.graph.nodes is None
    else:
        assert ds.graph.nodes.dtype == np.float32 and ds.graph.nodes.shape == (n, f)
    assert ds.labels.dtype == np.int32 and ds.labels.shape == (n,)
    for m, size in ((ds.train_mask, ntr), (ds.val_mask, nva), (ds.test_mask, nte)):
        assert m.dtype == np.bool_ and m.shape == (n,) and int(m.sum()) == size
    assert not (ds.train_mask & ds.val_mask).any() and not (ds.train_mask & ds.test_mask).any()
    assert not (ds.val_mask & ds.test_mask).any()
    # 20 training nodes per class; undirected edges stored both ways; no self-loops.
    assert np.bincount(ds.labels[ds.train_mask], minlength=c).tolist() == [20] * c
    edges = edge_set(ds.graph)
    assert len(edges) == e and all((r, s) in edges for s, r in edges)
    assert not (ds.graph.senders == ds.graph.receivers).any()


def test_planetoid_class_counts(data_dir):
    cora = D.load_planetoid("cora", root=data_dir)
    assert np.bincount(cora.labels).tolist() == [351, 217, 418, 818, 426, 298, 180]
    citeseer = D.load_planetoid("citeseer", root=data_dir)
    assert int((citeseer.labels == -1).sum()) == 15
    assert np.bincount(citeseer.labels[citeseer.labels >= 0]).tolist() == [249, 590, 668, 701, 596, 508]
    pubmed = D.load_planetoid("pubmed", root=data_dir)
    assert np.bincount(pubmed.labels).tolist() == [4103, 7739, 7875]


ENTITY_README = {
    # name: N, E, R, classes, train, test, train class counts, test class counts
    "aifb": (8285, 29043, 45, 4, 140, 36, [58, 22, 48, 12], [15, 6, 12, 3]),
    "mutag": (23644, 74227, 23, 2, 272, 68, [166, 106], [45, 23]),
}


@pytest.mark.parametrize("name", sorted(ENTITY_README))
def test_entities_npz_counts(data_dir, name):
    n, e, r, c, ntr, nte, trc, tec = ENTITY_README[name]
    raw = D.load_entities(name, root=data_dir, add_inverse=False)
    check_graph(raw.graph, n, e)
    assert raw.num_relations == raw.num_base_relations == r and raw.num_classes == c
    assert raw.graph.edges["type"].dtype == np.int32 and raw.graph.edges["type"].max() == r - 1
    assert raw.graph.nodes["type"].dtype == np.int32 and raw.num_node_types == 3
    assert raw.train_idx.shape == (ntr,) and raw.test_idx.shape == (nte,)
    assert np.bincount(raw.train_labels, minlength=c).tolist() == trc
    assert np.bincount(raw.test_labels, minlength=c).tolist() == tec

    inv = D.load_entities(name, root=data_dir)  # R-GCN default: inverse edges, type t + R
    check_graph(inv.graph, n, 2 * e)
    assert inv.num_relations == 2 * r
    np.testing.assert_array_equal(inv.graph.senders[e:], raw.graph.receivers)
    np.testing.assert_array_equal(inv.graph.receivers[e:], raw.graph.senders)
    np.testing.assert_array_equal(inv.graph.edges["type"][e:], raw.graph.edges["type"] + r)

    loops = D.load_entities(name, root=data_dir, add_self_loops=True)
    check_graph(loops.graph, n, 2 * e + n)
    assert loops.num_relations == 2 * r + 1
    assert (loops.graph.edges["type"][2 * e :] == 2 * r).all()
    np.testing.assert_array_equal(loops.graph.senders[2 * e :], np.arange(n))


LINK_README = {
    # name: N, R, train, valid, test
    "fb15k237": (14541, 237, 272115, 17535, 20466),
    "wn18rr": (40943, 11, 86835, 3034, 3134),
    "kinship": (104, 25, 8544, 1068, 1074),
    "nations": (14, 55, 1592, 199, 201),
    "umls": (135, 46, 5216, 652, 661),
}


@pytest.mark.parametrize("name", sorted(LINK_README))
def test_link_prediction_npz_counts(data_dir, name):
    n, r, ntr, nva, nte = LINK_README[name]
    ds = D.load_link_prediction(name, root=data_dir)
    check_graph(ds.graph, n, ntr)
    assert ds.num_nodes == n and ds.num_relations == r
    np.testing.assert_array_equal(ds.graph.nodes["type"], np.zeros(n, np.int32))
    for arr, size in ((ds.train_triples, ntr), (ds.valid_triples, nva), (ds.test_triples, nte)):
        assert arr.dtype == np.int32 and arr.shape == (size, 3)
        assert arr[:, [0, 2]].max() < n and arr[:, 1].max() < r and arr.min() >= 0
    np.testing.assert_array_equal(ds.graph.senders, ds.train_triples[:, 0])
    np.testing.assert_array_equal(ds.graph.edges["type"], ds.train_triples[:, 1])
    np.testing.assert_array_equal(ds.graph.receivers, ds.train_triples[:, 2])


def test_link_prediction_graph_is_typed(data_dir):
    """The KG graph is a typed graph with one node type: the relational modules name the missing "h"
    features instead of claiming the graph lacks node types."""
    ds = D.load_link_prediction("nations", root=data_dir, add_inverse=True)
    jgnn.validate(ds.graph, typed=True, num_node_types=1, num_edge_types=ds.num_relations)
    conv = jnn.RGCNConv(4, ds.num_relations, input_dim=ds.num_nodes)
    with pytest.raises(ValueError, match='"h"'):
        conv.init(jax.random.key(0), ds.graph)
    ids = ds.graph._replace(nodes={**ds.graph.nodes, "h": np.arange(ds.num_nodes, dtype=np.int32)})
    out, _ = conv.init_with_output(jax.random.key(0), ids)
    assert out.nodes["h"].shape == (ds.num_nodes, 4)


def test_link_prediction_add_inverse(data_dir):
    ds = D.load_link_prediction("nations", root=data_dir, add_inverse=True)
    assert ds.num_relations == 110 and ds.num_edges == 2 * 1592
    np.testing.assert_array_equal(ds.graph.edges["type"][1592:], ds.train_triples[:, 1] + 55)


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown Planetoid"):
        D.load_planetoid("reddit")
    with pytest.raises(ValueError, match="unknown entity"):
        D.load_entities("bgs")
    with pytest.raises(ValueError, match="unknown link prediction"):
        D.load_link_prediction("fb15k")


# --------------------------------------------------------------------------------------------
# raw Planetoid files (tiny synthetic ind.* pickles)
# --------------------------------------------------------------------------------------------


def write_planetoid_raw(directory: pathlib.Path, name: str, test_index: list[int]):
    """4 'all' nodes (2 labelled train nodes), test rows for ``test_index``; 3 features, 3 classes.

    Returns (expected features [N, 3], expected labels [N]) derived from Kipf's semantics:
    row i of tx/ty belongs to node test_index[i]; nodes in the test id range without a row get
    zero features and label -1.
    """
    import scipy.sparse as sp

    directory.mkdir(parents=True, exist_ok=True)
    allx = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=np.float32)
    ally = np.eye(3)[[0, 1, 2, 1]]
    k = len(test_index)
    tx = (np.arange(k * 3, dtype=np.float32).reshape(k, 3) + 10.0)
    ty_ids = [(i + 1) % 3 for i in range(k)]
    ty = np.eye(3)[ty_ids]
    graph = {0: [1, 2], 1: [0], 2: [2, 7], 3: [], 4: [6], 5: [], 6: [4], 7: [2]}
    objs = {
        "x": sp.csr_matrix(allx[:2]), "y": ally[:2], "tx": sp.csr_matrix(tx), "ty": ty,
        "allx": sp.csr_matrix(allx), "ally": ally, "graph": graph,
    }
    for key, obj in objs.items():
        with open(directory / f"ind.{name}.{key}", "wb") as f:
            pickle.dump(obj, f)
    (directory / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in test_index))

    n = 4 + (max(test_index) - min(test_index) + 1)
    feats = np.zeros((n, 3), np.float32)
    feats[:4] = allx
    labels = np.full(n, -1, np.int32)
    labels[:4] = [0, 1, 2, 1]
    for i, node in enumerate(test_index):
        feats[node] = tx[i]
        labels[node] = ty_ids[i]
    return feats, labels


@pytest.mark.parametrize("test_index", [[7, 4, 6, 5], [7, 4, 6]], ids=["contiguous", "citeseer-gap"])
def test_parse_planetoid_raw(tmp_path, test_index):
    feats, labels = write_planetoid_raw(tmp_path, "toy", test_index)
    ds = D.parse_planetoid_raw(tmp_path, "toy", num_val=1)
    check_graph(ds.graph, 8, 8)
    np.testing.assert_array_equal(ds.graph.nodes, feats)
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.graph.nodes.dtype == np.float32 and ds.num_classes == 3
    # self-loop 2-2 dropped, duplicates removed, both directions present, sorted.
    expected = {(0, 1), (1, 0), (0, 2), (2, 0), (2, 7), (7, 2), (4, 6), (6, 4)}
    assert edge_set(ds.graph) == expected
    pairs = list(zip(ds.graph.senders.tolist(), ds.graph.receivers.tolist(), strict=True))
    assert pairs == sorted(pairs)
    assert np.flatnonzero(ds.train_mask).tolist() == [0, 1]
    assert np.flatnonzero(ds.val_mask).tolist() == [2]
    assert np.flatnonzero(ds.test_mask).tolist() == sorted(test_index)
    if 5 not in test_index:
        assert ds.labels[5] == -1 and not ds.graph.nodes[5].any()


def test_load_planetoid_prefers_root_raw(isolated):
    feats, labels = write_planetoid_raw(isolated / "root" / "planetoid", "cora", [7, 4, 6, 5])
    ds = D.load_planetoid("cora", root=isolated / "root")
    assert ds.num_nodes == 8
    np.testing.assert_array_equal(ds.labels, labels)


def test_load_planetoid_downloads_raw_files(isolated, monkeypatch):
    src = isolated / "mirror"
    feats, _ = write_planetoid_raw(src, "citeseer", [7, 4, 6])
    monkeypatch.setattr(planetoid, "PLANETOID_URL", src.as_uri() + "/ind.{name}.{suffix}")
    ds = D.load_planetoid("citeseer")  # nothing on disk: "downloads" into the cache
    assert (isolated / "cache" / "planetoid" / "ind.citeseer.graph").is_file()
    np.testing.assert_array_equal(ds.graph.nodes, feats)


def test_load_planetoid_unavailable(isolated, monkeypatch):
    with pytest.raises(D.DatasetUnavailableError, match="allow_download=False"):
        D.load_planetoid("cora", allow_download=False)
    url = (isolated / "nowhere").as_uri() + "/ind.{name}.{suffix}"
    monkeypatch.setattr(planetoid, "PLANETOID_URL", url)
    with pytest.raises(D.DatasetUnavailableError) as err:
        D.load_planetoid("cora", root=isolated / "root")
    msg = str(err.value)
    assert "ind.cora.x" in msg and str(isolated / "nowhere") in msg and str(isolated / "root") in msg
    assert isinstance(err.value, OSError)


# --------------------------------------------------------------------------------------------
# cache helpers
# --------------------------------------------------------------------------------------------


def test_data_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    assert D.data_dir() == tmp_path
    monkeypatch.delenv(cache.ENV_VAR)
    assert D.data_dir() == pathlib.Path("~/.cache/jgnn").expanduser()


def test_search_dirs_order(isolated):
    dirs = D.search_dirs(isolated / "r")
    assert dirs == [isolated / "r", isolated / "cache", isolated / "no-shared"]


def test_download(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = D.download(src.as_uri(), tmp_path / "sub" / "dest.bin")
    assert dest.read_bytes() == b"payload"
    assert not [p for p in dest.parent.iterdir() if p.name.endswith(".part")]
    with pytest.raises(D.DatasetUnavailableError) as err:
        D.download((tmp_path / "missing.bin").as_uri(), tmp_path / "x.bin", searched=[tmp_path / "a"])
    msg = str(err.value)
    assert "'x.bin'" in msg and "missing.bin" in msg and str(tmp_path / "a") in msg
    assert not (tmp_path / "x.bin").exists()


def test_failed_download_leaves_no_directory(tmp_path):
    """No network: neither the file nor the cache directories created for it remain."""
    missing = (tmp_path / "missing.bin").as_uri()
    with pytest.raises(D.DatasetUnavailableError):
        D.download(missing, tmp_path / "cache" / "sub" / "x.bin")
    assert not (tmp_path / "cache").exists()


def test_download_all_is_all_or_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("A")
    files = {"a.txt": (src / "a.txt").as_uri(), "b.txt": (src / "b.txt").as_uri()}
    with pytest.raises(D.DatasetUnavailableError) as err:
        cache.download_all(files, tmp_path / "cache" / "set", searched=[tmp_path / "looked"])
    assert "b.txt" in str(err.value) and str(tmp_path / "cache" / "set") in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no cache dir, no staging dir
    (src / "b.txt").write_text("B")
    out = cache.download_all(files, tmp_path / "cache" / "set")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]
    assert (out / "b.txt").read_text() == "B"
    assert sorted(p.name for p in out.parent.iterdir()) == ["set"]


def test_failed_planetoid_download_leaves_no_cache_directory(isolated, monkeypatch):
    src = isolated / "mirror"
    write_planetoid_raw(src, "cora", [7, 4, 6, 5])
    (src / "ind.cora.graph").unlink()  # one of the eight files cannot be fetched
    monkeypatch.setattr(planetoid, "PLANETOID_URL", src.as_uri() + "/ind.{name}.{suffix}")
    with pytest.raises(D.DatasetUnavailableError, match="ind.cora.graph"):
        D.load_planetoid("cora")
    assert not (isolated / "cache").exists()


# --------------------------------------------------------------------------------------------
# raw RDF entity files (tiny N-Triples + TSV)
# --------------------------------------------------------------------------------------------

NT = """# a comment
<http://x/b> <http://p/knows> <http://x/a> .
<http://x/a> <http://p/knows> <http://x/c> .
<http://x/a> <http://p/name> "Ann \\"A\\" Smith"@en .
_:n1 <http://p/knows> <http://x/b> .
<http://x/c> <http://p/age> "42"^^<http://www.w3.org/2001/XMLSchema#int> .

<http://x/b> <http://p/name> "Bob" .
<http://x/b> <http://p/knows> <http://x/a> .
"""


def write_entities_raw(directory: pathlib.Path, name="aifb"):
    directory.mkdir(parents=True, exist_ok=True)
    with gzip.open(directory / f"{name}_stripped.nt.gz", "wt", encoding="utf-8") as f:
        f.write(NT)
    ent, lab = relational.ENTITY_TSV_COLUMNS[name]
    (directory / "trainingSet.tsv").write_text(f"id\t{ent}\t{lab}\n1\thttp://x/a\tgroupB\n2\thttp://x/b\tgroupA\n")
    (directory / "testSet.tsv").write_text(f"id\t{ent}\t{lab}\n3\thttp://x/c\tgroupB\n")


def test_parse_ntriples_terms():
    triples = relational.parse_ntriples(io.StringIO(NT))
    assert len(triples) == 7
    assert triples[2] == ("<http://x/a>", "<http://p/name>", '"Ann \\"A\\" Smith"@en')
    assert triples[3][0] == "_:n1"
    assert triples[4][2] == '"42"^^<http://www.w3.org/2001/XMLSchema#int>'
    with pytest.raises(ValueError, match="line 2"):
        relational.parse_ntriples(["<a> <b> <c> .", "<a> <b> ."])


def test_load_entities_raw(isolated):
    write_entities_raw(isolated / "root" / "aifb")
    ds = D.load_entities("aifb", root=isolated / "root", add_inverse=False)
    # nodes sorted by term string: '"42"^^..', '"Ann..."@en', '"Bob"', <http://x/a>, <b>, <c>, _:n1
    names = sorted(['"42"^^<http://www.w3.org/2001/XMLSchema#int>', '"Ann \\"A\\" Smith"@en', '"Bob"',
                    "<http://x/a>", "<http://x/b>", "<http://x/c>", "_:n1"])
    nid = {t: i for i, t in enumerate(names)}
    # 6 distinct triples (one duplicate); relations by frequency: knows (3), name (2), age (1).
    assert ds.num_base_relations == ds.num_relations == 3 and ds.num_edges == 6
    a, b, c = nid["<http://x/a>"], nid["<http://x/b>"], nid["<http://x/c>"]
    got = set(zip(ds.graph.senders.tolist(), ds.graph.edges["type"].tolist(),
                  ds.graph.receivers.tolist(), strict=True))
    assert got == {
        (b, 0, a), (a, 0, c), (nid["_:n1"], 0, b),
        (a, 1, nid['"Ann \\"A\\" Smith"@en']), (b, 1, nid['"Bob"']),
        (c, 2, nid['"42"^^<http://www.w3.org/2001/XMLSchema#int>']),
    }
    assert ds.graph.edges["type"].tolist() == sorted(ds.graph.edges["type"].tolist())
    kinds = [2, 2, 2, 0, 0, 0, 1]  # literal, literal, literal, IRI x3, blank
    assert ds.graph.nodes["type"].tolist() == kinds
    assert ds.train_idx.tolist() == [a, b] and ds.test_idx.tolist() == [c]
    assert ds.train_labels.tolist() == [1, 0] and ds.test_labels.tolist() == [1]  # sorted label ids
    assert ds.num_classes == 2


def test_entities_unknown_label_entity(tmp_path):
    write_entities_raw(tmp_path)
    (tmp_path / "testSet.tsv").write_text("id\tperson\tlabel_affiliation\n3\thttp://x/zzz\tgroupB\n")
    with pytest.raises(ValueError, match="zzz"):
        relational.parse_entities_raw(tmp_path, "aifb")


# --------------------------------------------------------------------------------------------
# raw link prediction files (tiny train/valid/test.txt and a ConvE style archive)
# --------------------------------------------------------------------------------------------

TRIPLES = {
    "train": "bob\tlikes\tann\r\nann\tknows\tcid\n\ncid\tlikes\tbob\n",
    "valid": "ann\tlikes\tbob\n",
    "test": "dan\tknows\tann\n",
}


def expected_link_arrays():
    ents = {e: i for i, e in enumerate(["ann", "bob", "cid", "dan"])}
    rels = {"knows": 0, "likes": 1}
    out = {}
    for k, text in TRIPLES.items():
        rows = [line.strip().split("\t") for line in text.splitlines() if line.strip()]
        out[k] = [[ents[h], rels[r], ents[t]] for h, r, t in rows]
    return out


def test_load_link_prediction_directory(isolated):
    d = isolated / "root" / "umls"
    d.mkdir(parents=True)
    for k, text in TRIPLES.items():
        (d / f"{k}.txt").write_bytes(text.encode())
    ds = D.load_link_prediction("umls", root=isolated / "root")
    exp = expected_link_arrays()
    assert ds.num_nodes == 4 and ds.num_relations == 2
    assert ds.train_triples.tolist() == exp["train"]
    assert ds.valid_triples.tolist() == exp["valid"] and ds.test_triples.tolist() == exp["test"]
    assert ds.train_triples.dtype == np.int32
    check_graph(ds.graph, 4, 3)


def test_load_link_prediction_archive(isolated):
    root = isolated / "root"
    root.mkdir()
    with tarfile.open(root / "FB15k-237.tar.gz", "w:gz") as tar:
        for k, text in TRIPLES.items():
            data = text.encode()
            info = tarfile.TarInfo(f"FB15k-237/{k}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ds = D.load_link_prediction("fb15k237", root=root)
    assert ds.train_triples.tolist() == expected_link_arrays()["train"]
    with pytest.raises(ValueError, match="line 1 has 2 tab-separated fields, expected 3"):
        relational.parse_triples(["a\tb\n"])


# --------------------------------------------------------------------------------------------
# OGB node-property directory
# --------------------------------------------------------------------------------------------


def write_gz(path: pathlib.Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def make_ogb_dir(root: pathlib.Path, schemes=("time",)):
    raw = root / "raw"
    write_gz(raw / "edge.csv.gz", "0,1\n1,2\n3,0\n")
    write_gz(raw / "num-node-list.csv.gz", "4\n")
    write_gz(raw / "num-edge-list.csv.gz", "3\n")
    write_gz(raw / "node-feat.csv.gz", "0.5,1.0\n-1.0,2.0\n0.0,0.0\n3.0,-0.25\n")
    write_gz(raw / "node-label.csv.gz", "1\n0\nnan\n2\n")
    for s in schemes:
        write_gz(root / "split" / s / "train.csv.gz", "0\n3\n")
        write_gz(root / "split" / s / "valid.csv.gz", "1\n")
        write_gz(root / "split" / s / "test.csv.gz", "2\n")


def test_load_ogb_directory(tmp_path):
    make_ogb_dir(tmp_path / "arxiv")
    ds = D.load_ogb_directory(tmp_path / "arxiv")
    check_graph(ds.graph, 4, 3)
    assert ds.graph.senders.tolist() == [0, 1, 3] and ds.graph.receivers.tolist() == [1, 2, 0]
    feats = np.array([[0.5, 1], [-1, 2], [0, 0], [3, -0.25]], np.float32)
    np.testing.assert_array_equal(ds.graph.nodes, feats)
    assert ds.graph.nodes.dtype == np.float32
    assert ds.labels.tolist() == [1, 0, -1, 2] and ds.num_classes == 3 and ds.name == "arxiv"
    assert ds.train_mask.tolist() == [True, False, False, True]
    assert ds.val_mask.tolist() == [False, True, False, False]
    assert ds.test_mask.tolist() == [False, False, True, False]
    und = D.load_ogb_directory(tmp_path / "arxiv", to_undirected=True)
    assert edge_set(und.graph) == {(0, 1), (1, 2), (3, 0), (1, 0), (2, 1), (0, 3)}


def test_load_ogb_directory_errors(tmp_path):
    make_ogb_dir(tmp_path / "d", schemes=("time", "random"))
    with pytest.raises(ValueError, match="split="):
        D.load_ogb_directory(tmp_path / "d")
    assert D.load_ogb_directory(tmp_path / "d", split="random").num_nodes == 4
    write_gz(tmp_path / "d" / "raw" / "edge.csv.gz", "0,1\n1,9\n3,0\n")
    with pytest.raises(ValueError, match=r"edge.csv.gz column 1 .* 9 >= num_nodes=4"):
        D.load_ogb_directory(tmp_path / "d", split="time")
    with pytest.raises(FileNotFoundError, match="raw"):
        D.load_ogb_directory(tmp_path / "nope")


def test_load_ogb_npz(data_dir):
    ds = D.load_ogb_directory(data_dir / "cora.npz")
    assert ds.num_nodes == 2708 and ds.name == "cora"


# --------------------------------------------------------------------------------------------
# synthetic generators
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rmat", "uniform"])
@pytest.mark.parametrize("n,e", [(1000, 5000), (37, 0), (1, 5), (1025, 777)])
def test_power_law_graph_sizes(kind, n, e):
    ds = D.power_law_graph(n, e, 8, 3, seed=0, kind=kind)
    check_graph(ds.graph, n, e)
    assert ds.graph.nodes.dtype == np.float32 and ds.graph.nodes.shape == (n, 8)
    assert ds.labels.dtype == np.int32 and ds.labels.min() >= 0 and ds.labels.max() < 3
    masks = np.stack([ds.train_mask, ds.val_mask, ds.test_mask])
    assert (masks.sum(0) == 1).all()


def test_power_law_graph_deterministic_and_skewed():
    a = D.power_law_graph(4096, 40000, 4, 2, seed=3)
    b = D.power_law_graph(4096, 40000, 4, 2, seed=3)
    c = D.power_law_graph(4096, 40000, 4, 2, seed=4)
    np.testing.assert_array_equal(a.graph.senders, b.graph.senders)
    np.testing.assert_array_equal(a.graph.nodes, b.graph.nodes)
    assert not np.array_equal(a.graph.senders, c.graph.senders)
    deg = np.bincount(a.graph.receivers, minlength=4096)
    uni = np.bincount(D.power_law_graph(4096, 40000, 4, 2, seed=3, kind="uniform").graph.receivers)
    assert deg.max() > 5 * uni.max()  # R-MAT hubs vs. Poisson degrees


def test_power_law_graph_errors():
    with pytest.raises(ValueError, match="kind"):
        D.power_law_graph(10, 10, 2, 2, seed=0, kind="ba")
    with pytest.raises(ValueError, match="num_nodes"):
        D.power_law_graph(0, 10, 2, 2, seed=0)
    with pytest.raises(ValueError, match="sum to 1"):
        D.rmat_edges(10, 10, np.random.default_rng(0), (0.5, 0.5, 0.5, 0.5))


@pytest.mark.parametrize("n,e,tn,te", [(500, 3000, 4, 12), (7, 100, 7, 3), (50, 5, 3, 9)])
def test_typed_graph_consistency(n, e, tn, te):
    tg = D.typed_graph(n, e, tn, te, feature_dim=5, seed=1)
    g = tg.graph
    check_graph(g, n, e)
    ntype, etype = g.nodes["type"], g.edges["type"]
    assert ntype.dtype == np.int32 and etype.dtype == np.int32
    assert tg.relation_schema.shape == (te, 2) and tg.relation_schema.dtype == np.int32
    assert set(ntype.tolist()) == set(range(tn))  # every node type has a node
    if e >= te:
        assert set(etype.tolist()) == set(range(te))
    assert etype.min(initial=0) >= 0 and etype.max(initial=0) < te
    np.testing.assert_array_equal(ntype[g.senders], tg.relation_schema[etype, 0])
    np.testing.assert_array_equal(ntype[g.receivers], tg.relation_schema[etype, 1])
    assert (np.diff(etype) >= 0).all() and (np.diff(ntype) >= 0).all()
    assert g.nodes["h"].shape == (n, 5) and g.nodes["h"].dtype == np.float32


def test_typed_graph_errors():
    with pytest.raises(ValueError, match="num_node_types"):
        D.typed_graph(2, 10, 3, 1, seed=0)


def test_presets_table():
    p = D.PRESETS
    def stats(name):
        s = p[name]
        return s.num_nodes, s.num_edges, s.num_features, s.num_classes

    assert stats("pubmed") == (19_717, 88_651, 500, 3)
    assert stats("ppi") == (56_944, 1_644_208, 50, 121)
    assert stats("ogbn-arxiv") == (169_343, 1_166_243, 128, 40)
    assert stats("reddit") == (232_965, 114_615_892, 602, 41)
    assert stats("cora") == (2_708, 10_556, 1_433, 7)
    # Hector Table 3
    assert (p["aifb"].num_node_types, p["aifb"].num_edge_types) == (7, 104)
    assert (p["mutag"].num_nodes, p["mutag"].num_edges, p["mutag"].num_edge_types) == (27_000, 148_000, 50)
    assert p["wikikg2"].num_edge_types == 535 and p["ogbn-mag"].num_node_types == 4
    assert {"bgs", "ogbn-biokg", "am", "fb15k"} <= set(p)
    assert all(s.source for s in p.values())


def test_synthetic_from_preset_scaled():
    ds = D.synthetic_from_preset("pubmed", scale=0.01, seed=0)
    assert isinstance(ds, D.NodeClassificationDataset)
    assert ds.num_nodes == round(19717 * 0.01) and ds.num_edges == round(88651 * 0.01)
    assert ds.num_features == 500 and ds.num_classes == 3
    tg = D.synthetic_from_preset("bgs", scale=0.001, seed=0, feature_dim=16)
    assert isinstance(tg, D.TypedGraph)
    assert tg.num_nodes == 95 and tg.num_edges == 673 and tg.num_edge_types == 122
    tiny = D.synthetic_from_preset("aifb", scale=1e-6, seed=0)
    assert tiny.num_nodes == 7 and tiny.num_edges == 104 and "features" not in tiny.graph.nodes
    with pytest.raises(ValueError, match="unknown preset"):
        D.synthetic_from_preset("nope", seed=0)


# --------------------------------------------------------------------------------------------
# converters
# --------------------------------------------------------------------------------------------


def test_from_edge_index():
    ei = np.array([[0, 1, 2, 2], [1, 2, 0, 3]], dtype=np.int64)
    g = D.from_edge_index(ei)
    check_graph(g, 4, 4)
    assert g.senders.tolist() == [0, 1, 2, 2] and g.receivers.tolist() == [1, 2, 0, 3]
    x = np.ones((6, 2), np.float32)
    g = D.from_edge_index(ei, nodes={"x": x}, edges=np.arange(4.0))
    assert g.n_node.tolist() == [6]  # inferred from nodes
    assert D.from_edge_index(np.zeros((2, 0), np.int32)).n_node.tolist() == [0]


@pytest.mark.parametrize(
    "ei,kw,exc,pattern",
    [
        (np.zeros((3, 4), np.int64), {}, ValueError, r"edge_index must have shape \[2, E\].*\(3, 4\)"),
        (np.zeros(4, np.int64), {}, ValueError, r"edge_index must have shape"),
        (np.zeros((2, 2), np.float32), {}, TypeError, r"edge_index must have an integer dtype.*float32"),
        (np.zeros((2, 2), bool), {}, TypeError, r"edge_index must have an integer dtype"),
        (np.array([[0, -1], [1, 1]]), {}, ValueError,
         r"edge_index\[0\] \(senders\) contains negative node id -1"),
        (np.array([[0, 1], [1, 5]]), {"num_nodes": 3}, ValueError,
         r"edge_index\[1\] \(receivers\) contains node id 5 >= num_nodes=3"),
        (np.array([[0, 1], [1, 2]]), {"nodes": np.ones((2, 3))}, ValueError,
         r"edge_index\[1\].*>= num_nodes=2"),
        (np.array([[0, 1], [1, 2]]), {"edges": {"w": np.ones(3)}}, ValueError,
         r"edges\['w'\] must have leading dimension 2"),
        (np.array([[0, 1], [1, 2]]), {"num_nodes": 3, "nodes": {"x": np.ones(2)}}, ValueError,
         r"nodes\['x'\] must have leading dimension 3"),
    ],
)
def test_from_edge_index_errors(ei, kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        D.from_edge_index(ei, **kw)


def test_from_scipy_round_trip():
    import scipy.sparse as sp

    m = sp.random(30, 30, density=0.1, format="csr", random_state=np.random.default_rng(0), dtype=np.float64)
    g = D.from_scipy(m, nodes=np.zeros((30, 1)), weight_key="w")
    check_graph(g, 30, m.nnz)
    back = sp.coo_matrix((g.edges["w"], (g.senders, g.receivers)), shape=(30, 30)).toarray()
    np.testing.assert_allclose(back, m.toarray(), rtol=1e-6)
    assert g.edges["w"].dtype == np.float32
    coo = D.from_scipy(m.tocoo())
    assert edge_set(coo) == edge_set(g) and coo.edges is None
    with pytest.raises(TypeError, match="matrix must be a scipy.sparse"):
        D.from_scipy(m.toarray())
    with pytest.raises(ValueError, match=r"square.*\(3, 4\)"):
        D.from_scipy(sp.csr_matrix((3, 4)))
    with pytest.raises(ValueError, match="nodes must have leading dimension 30"):
        D.from_scipy(m, nodes=np.zeros(29))


def test_from_networkx_round_trip():
    import networkx as nx

    dg = nx.gnm_random_graph(25, 80, seed=1, directed=True)
    for i, n in enumerate(dg.nodes):
        dg.nodes[n]["x"] = [float(i), 1.0]
    for u, v in dg.edges:
        dg.edges[u, v]["w"] = u * 100 + v
    g = D.from_networkx(dg, node_attrs=("x",), edge_attrs=("w",))
    check_graph(g, 25, 80)
    assert edge_set(g) == set(dg.edges)
    assert g.nodes["x"].dtype == np.float32 and g.nodes["x"][:, 0].tolist() == list(range(25))
    assert g.edges["w"].dtype == np.int32
    np.testing.assert_array_equal(g.edges["w"], g.senders * 100 + g.receivers)
    back = nx.DiGraph(list(zip(g.senders.tolist(), g.receivers.tolist(), strict=True)))
    assert nx.utils.graphs_equal(nx.DiGraph(back.edges), nx.DiGraph(dg.edges))


def test_from_networkx_undirected_and_labels():
    import networkx as nx

    ug = nx.Graph([("a", "b"), ("b", "c"), ("c", "c")])
    g = D.from_networkx(ug)
    check_graph(g, 3, 5)  # two directions per edge, self-loop once
    assert edge_set(g) == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)} and g.nodes is None
    with pytest.raises(ValueError, match="node attribute 'x' is missing on node 'a'"):
        D.from_networkx(ug, node_attrs=("x",))
    with pytest.raises(ValueError, match="edge attribute 'w' is missing"):
        D.from_networkx(ug, edge_attrs=["w"])
    with pytest.raises(TypeError, match="g must be a networkx graph"):
        D.from_networkx({0: [1]})
    with pytest.raises(TypeError, match="not str"):
        D.from_networkx(ug, node_attrs="x")


class _DGLEdges:
    """DGL's ``g.edges``: called, the (src, dst) id tensors in edge-id order; indexed by type, a feature view."""

    def __init__(self, index, data):
        self._index, self._data = index, data

    def __call__(self, *, order="eid", etype=None):
        assert order == "eid"
        src, dst = self._index[etype if etype is not None else next(iter(self._index))]
        return src.astype(np.int64), dst.astype(np.int64)

    def __getitem__(self, etype):
        return type("EdgeSpace", (), {"data": self._data.get(etype, {})})()


class FakeDGLGraph:
    """The part of ``dgl.DGLGraph``'s public API the converters read (DGL is not a dependency), with DGL's
    dtypes: int64 ids and counts, float64 features where a user left them so."""

    def __init__(self, num_nodes, index, ndata=None, edata=None, batch=None):
        self.ntypes = list(num_nodes)
        self.canonical_etypes = list(index)
        self._num = num_nodes
        self.edges = _DGLEdges(index, edata or {})
        self.nodes = {t: type("NodeSpace", (), {"data": (ndata or {}).get(t, {})})() for t in num_nodes}
        homogeneous = len(num_nodes) == 1 and len(index) == 1
        self.ndata = self.nodes[self.ntypes[0]].data if homogeneous else {}
        self.edata = self.edges[self.canonical_etypes[0]].data if homogeneous else {}
        self._batch = batch
        self.batch_size = 1 if batch is None else len(batch[0])

    def num_nodes(self, ntype=None):
        return sum(self._num.values()) if ntype is None else self._num[ntype]

    def batch_num_nodes(self):
        return np.asarray(self._batch[0], np.int64)

    def batch_num_edges(self):
        return np.asarray(self._batch[1], np.int64)


def test_from_dgl_homogeneous_and_batched():
    rng = np.random.default_rng(3)
    key = ("_N", "_E", "_N")
    src = np.concatenate([rng.integers(0, 4, 6), 4 + rng.integers(0, 3, 5)])  # graph 0: nodes 0-3, graph 1: 4-6
    dst = np.concatenate([rng.integers(0, 4, 6), 4 + rng.integers(0, 3, 5)])
    feat, w = rng.normal(size=(7, 3)), rng.normal(size=(11, 2)).astype(np.float32)
    g = FakeDGLGraph({"_N": 7}, {key: (src, dst)}, {"_N": {"feat": feat, "label": np.arange(7)}},
                     {key: {"feat": w}}, batch=([4, 3], [6, 5]))
    graph = D.from_dgl(g)
    np.testing.assert_array_equal(graph.senders, src)
    np.testing.assert_array_equal(graph.receivers, dst)
    assert graph.senders.dtype == np.int32 and graph.nodes.dtype == np.float32
    np.testing.assert_allclose(graph.nodes, feat.astype(np.float32))
    np.testing.assert_array_equal(graph.edges, w)
    assert graph.n_node.tolist() == [4, 3] and graph.n_edge.tolist() == [6, 5]
    both = D.from_dgl(g, node_attrs=("feat", "label"), edge_attrs=())
    assert set(both.nodes) == {"feat", "label"} and both.nodes["label"].dtype == np.int32 and both.edges is None
    single = FakeDGLGraph({"_N": 7}, {key: (src, dst)})
    assert D.from_dgl(single).nodes is None and D.from_dgl(single).n_node.tolist() == [7]
    shuffled = FakeDGLGraph({"_N": 7}, {key: (src[::-1], dst[::-1])}, batch=([4, 3], [6, 5]))
    with pytest.raises(ValueError, match="not grouped by graph"):
        D.from_dgl(shuffled)
    with pytest.raises(TypeError, match="must be a DGLGraph"):
        D.from_dgl({"edges": []})


def test_from_dgl_hetero_round_trips_through_the_typed_graph():
    rng = np.random.default_rng(4)
    num = {"author": 5, "paper": 6}
    index = {("author", "writes", "paper"): (rng.integers(0, 5, 8), rng.integers(0, 6, 8)),
             ("paper", "cites", "paper"): (rng.integers(0, 6, 4), rng.integers(0, 6, 4))}
    feats = {"paper": {"feat": rng.normal(size=(6, 3))}}
    edge_feats = {("paper", "cites", "paper"): {"feat": rng.normal(size=(4, 2)).astype(np.float32)}}
    g = FakeDGLGraph(num, index, feats, edge_feats)
    with pytest.raises(ValueError, match="from_dgl_hetero"):
        D.from_dgl(g)
    hg = D.from_dgl_hetero(g)
    assert hg.num_nodes == num and list(hg.edge_index) == list(index)
    for et, (s, d) in index.items():
        np.testing.assert_array_equal(hg.edge_index[et], np.stack([s, d]))
    assert set(hg.node_features) == {"paper"} and hg.node_features["paper"].dtype == np.float32
    assert set(hg.edge_features) == {("paper", "cites", "paper")}
    graph, schema = jgnn.hetero.to_typed_graph(hg)
    assert schema.node_types == ("author", "paper") and graph.senders.shape == (12,)


def test_dataset_is_frozen(data_dir):
    ds = D.load_planetoid("cora", root=data_dir)
    with pytest.raises(AttributeError):
        ds.num_classes = 3
