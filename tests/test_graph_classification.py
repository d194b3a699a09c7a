"""Graph classification: the TU loader (text format and npz), padded bucket batching, readouts and pooling."""
import io
import zipfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest

from jgnn import batching
from jgnn import datasets as D
from jgnn import nn as jnn
from jgnn.datasets import cache, tu

RTOL = {np.float32: 1e-5, jnp.bfloat16: 2e-2}

# --------------------------------------------------------------------------------------------
# TU text format
# --------------------------------------------------------------------------------------------


def write_tu(directory, name, files):
    directory.mkdir(parents=True, exist_ok=True)
    for key, lines in files.items():
        (directory / f"{name}_{key}.txt").write_text("\n".join(lines) + "\n")


# Two graphs: graph 1 = nodes 1..3 (path 1-2-3, plus a self-loop on 1 and a duplicate 2->1 line),
# graph 2 = nodes 4..5 (one undirected edge). Node labels start at 1, graph labels are -1 / 1.
TINY = {
    "A": ["1, 2", "2, 1", "2, 3", "3, 2", "1, 1", "2, 1", "4, 5", "5, 4"],
    "graph_indicator": ["1", "1", "1", "2", "2"],
    "graph_labels": ["1", "-1"],
    "node_labels": ["3", "1", "2", "1", "1"],
    "edge_labels": ["0", "0", "1", "1", "2", "3", "1", "1"],
    "node_attributes": ["0.5, 1.0", "1.5, 2.0", "2.5, 3.0", "3.5, 4.0", "4.5, 5.0"],
}


def test_parse_tu_tiny(tmp_path):
    write_tu(tmp_path / "T", "T", TINY)
    a = D.parse_tu_directory(tmp_path / "T", "T")
    # self-loop dropped, duplicate 2->1 coalesced (first label kept), sorted by (sender, receiver), 0-based
    assert a["senders"].tolist() == [0, 1, 1, 2, 3, 4]
    assert a["receivers"].tolist() == [1, 0, 2, 1, 4, 3]
    assert a["edge_label"].tolist() == [0, 0, 1, 1, 1, 1]
    assert a["n_node"].tolist() == [3, 2] and a["n_edge"].tolist() == [4, 2]
    assert a["node_graph"].tolist() == [0, 0, 0, 1, 1]
    assert a["graph_label_values"].tolist() == [-1, 1] and a["graph_label"].tolist() == [1, 0]
    assert a["node_label"].tolist() == [2, 0, 1, 0, 0] and int(a["num_node_labels"]) == 3
    assert int(a["num_edge_labels"]) == 2  # labels 0 and 1 survive (2 and 3 were on dropped edges)
    assert a["node_attr"].dtype == np.float32 and a["node_attr"][4].tolist() == [4.5, 5.0]
    for k in ("senders", "receivers", "node_graph", "n_node", "n_edge", "graph_label"):
        assert a[k].dtype == np.int32


def test_tu_features_follow_pyg(tmp_path):
    write_tu(tmp_path / "T", "T", TINY)
    arrays = D.parse_tu_directory(tmp_path / "T", "T")
    ds = tu.tu_dataset_from_arrays(arrays, "T")
    np.testing.assert_array_equal(ds.graph.nodes, np.eye(3, dtype=np.float32)[[2, 0, 1, 0, 0]])
    np.testing.assert_array_equal(ds.graph.edges, np.eye(2, dtype=np.float32)[[0, 0, 1, 1, 1, 1]])
    with_attr = tu.tu_dataset_from_arrays(arrays, "T", use_node_attr=True)
    assert with_attr.graph.nodes.shape == (5, 5)  # attributes first, then the one-hot labels (PyG)
    np.testing.assert_array_equal(with_attr.graph.nodes[:, :2], arrays["node_attr"])
    assert ds.num_graphs == 2 and ds.num_classes == 2 and ds.labels.tolist() == [1, 0]


@pytest.mark.parametrize("bad,pattern", [
    ({"A": ["1, 4"]}, "joins two graphs"),
    ({"A": ["1, 9"]}, "outside 1..5"),
    ({"graph_indicator": ["1", "2", "1", "2", "2"]}, "sorted"),
    ({"node_labels": ["1", "2"]}, "2 rows for 5 nodes"),
    ({"edge_labels": ["1"]}, "1 rows for 8 edges"),
])
def test_parse_tu_errors(tmp_path, bad, pattern):
    write_tu(tmp_path / "T", "T", {**TINY, **bad})
    with pytest.raises(ValueError, match=pattern):
        D.parse_tu_directory(tmp_path / "T", "T")


def test_parse_tu_missing_file(tmp_path):
    write_tu(tmp_path / "T", "T", {k: v for k, v in TINY.items() if k != "graph_labels"})
    with pytest.raises(ValueError, match="T_graph_labels.txt"):
        D.parse_tu_directory(tmp_path / "T", "T")


def write_tu_from_npz(directory, name, d, rng):
    """The TU text form of a converted npz: 1-based ids, every edge listed twice and shuffled (as IMDB's raw
    file lists its edges), raw graph label values."""
    e = d["senders"].shape[0]
    order = rng.permutation(np.concatenate([np.arange(e), np.arange(e)]))
    files = {
        "A": [f"{s + 1}, {r + 1}" for s, r in zip(d["senders"][order], d["receivers"][order], strict=True)],
        "graph_indicator": [str(g + 1) for g in d["node_graph"]],
        "graph_labels": [str(v) for v in d["graph_label_values"][d["graph_label"]]],
    }
    if "node_label" in d:
        files["node_labels"] = [str(v + 7) for v in d["node_label"]]  # any offset: labels are shifted to 0
    if "edge_label" in d:
        files["edge_labels"] = [str(v) for v in d["edge_label"][order]]
    write_tu(directory, name, files)


@pytest.mark.parametrize("name,stem", [("MUTAG", "mutag"), ("IMDB-BINARY", "imdb_binary")])
def test_parse_tu_real_round_trip(data_dir, tmp_path, name, stem):
    """The real graphs, written back in the TU text format and parsed, give the converted npz arrays."""
    with np.load(data_dir / f"tu_{stem}.npz") as z:
        d = dict(z)
    write_tu_from_npz(tmp_path / name, name, d, np.random.default_rng(0))
    a = D.parse_tu_directory(tmp_path / name, name)
    for k in ("senders", "receivers", "node_graph", "n_node", "n_edge", "graph_label", "graph_label_values",
              "node_label", "edge_label"):
        if k in d:
            np.testing.assert_array_equal(a[k], d[k], err_msg=k)


# graphs, N, E (directed), classes, class counts, node feature width (shared/data/README.md section 4)
TU_README = {
    "MUTAG": (188, 3371, 7442, 2, [63, 125], 7),
    "PROTEINS": (1113, 43471, 162088, 2, [663, 450], 3),
    "ENZYMES": (600, 19580, 74564, 6, [100] * 6, 3),
    "NCI1": (4110, 122747, 265506, 2, [2053, 2057], 37),
    "IMDB-BINARY": (1000, 19773, 193062, 2, [500, 500], None),
    "REDDIT-BINARY": (2000, 859254, 1991016, 2, [1000, 1000], None),
}


@pytest.mark.parametrize("name", sorted(TU_README))
def test_load_tu_npz_counts(data_dir, name):
    g, n, e, c, counts, f = TU_README[name]
    ds = D.load_tu(name, root=data_dir)
    assert ds.num_graphs == g and ds.num_nodes == n and ds.num_edges == e and ds.num_classes == c
    assert ds.num_features == f and ds.name == name
    assert np.bincount(ds.labels, minlength=c).tolist() == counts
    assert int(ds.graph.n_node.sum()) == n and int(ds.graph.n_edge.sum()) == e
    # every edge stays inside its graph
    off = np.concatenate([[0], np.cumsum(ds.graph.n_node)])
    graph_of = np.repeat(np.arange(g), ds.graph.n_node)
    assert (graph_of[ds.graph.senders] == np.repeat(np.arange(g), ds.graph.n_edge)).all()
    assert (graph_of[ds.graph.receivers] == graph_of[ds.graph.senders]).all() and off[-1] == n


def test_load_tu_aliases_and_degree_features(data_dir):
    ds = D.load_tu("imdb_binary", root=data_dir)
    assert ds.name == "IMDB-BINARY" and ds.graph.nodes is None
    x = D.one_hot_degree(ds)
    deg = np.bincount(ds.graph.receivers, minlength=ds.num_nodes)
    assert x.shape == (ds.num_nodes, deg.max() + 1) and (x.argmax(1) == deg).all() and (x.sum(1) == 1).all()
    proteins = D.load_tu("PROTEINS", root=data_dir, use_node_attr=True)
    assert proteins.num_features == 4 and proteins.node_attributes.shape == (43471, 1)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "shared_data_dir", lambda: tmp_path / "no-shared")
    return tmp_path


def test_load_tu_text_directory(isolated):
    write_tu(isolated / "root" / "TINY", "TINY", TINY)
    ds = D.load_tu("TINY", root=isolated / "root", allow_download=False)
    assert ds.num_graphs == 2 and ds.num_edges == 6


def test_load_tu_download_and_failure(isolated, monkeypatch):
    mirror = isolated / "mirror"
    mirror.mkdir()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for key, lines in TINY.items():
            z.writestr(f"TINY/TINY_{key}.txt", "\n".join(lines) + "\n")
    (mirror / "TINY.zip").write_bytes(buf.getvalue())
    monkeypatch.setattr(tu, "TU_URL", (isolated / "nowhere").as_uri() + "/{name}.zip")
    with pytest.raises(D.DatasetUnavailableError, match="TINY.zip"):
        D.load_tu("TINY")
    assert not (isolated / "cache").exists()  # a failed download leaves no cache directory
    with pytest.raises(D.DatasetUnavailableError, match="allow_download=False"):
        D.load_tu("TINY", allow_download=False)
    monkeypatch.setattr(tu, "TU_URL", mirror.as_uri() + "/{name}.zip")
    ds = D.load_tu("TINY")
    assert ds.num_graphs == 2 and (isolated / "cache" / "tu" / "TINY" / "TINY_A.txt").is_file()
    assert sorted(p.name for p in (isolated / "cache" / "tu").iterdir()) == ["TINY"]


# --------------------------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mutag():
    from tests.conftest import DATA_DIR

    return D.load_tu("MUTAG", root=DATA_DIR)


def test_select_graphs_matches_jraph_batch(mutag):
    graphs = jraph.unbatch_np(jax.tree_util.tree_map(np.copy, mutag.graph))  # unbatch_np works in place
    idx = [5, 0, 187, 5, 42]
    got = batching.select_graphs(mutag.graph, idx)
    want = jraph.batch_np([graphs[i] for i in idx])
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.senders.dtype == np.int32
    with pytest.raises(IndexError, match="188"):
        batching.select_graphs(mutag.graph, [188])


def test_buckets_hold_every_batch_and_jit_compiles_once_per_bucket(mutag):
    buckets = batching.padding_buckets(mutag.graph, 16, num_buckets=3, seed=0)
    assert 1 <= len(buckets) <= 3 and all(b.n_graph == 17 for b in buckets)

    @jax.jit
    def readout(graph):
        return jnn.sum_pool(graph)

    used = set()
    rng = np.random.default_rng(0)
    for _ in range(3):  # three shuffled epochs
        for batch in batching.padded_batches(mutag.graph, mutag.labels, np.arange(188), 16, buckets, rng=rng):
            size = (int(batch.graph.n_node.sum()), int(batch.graph.n_edge.sum()), batch.graph.n_node.shape[0])
            assert size in {(b.n_node, b.n_edge, b.n_graph) for b in buckets}
            used.add(size)
            np.testing.assert_array_equal(batch.mask, jraph.get_graph_padding_mask(batch.graph))
            real = batch.index[batch.mask]
            np.testing.assert_array_equal(batch.labels[batch.mask], mutag.labels[real])
            out = readout(batch.graph)
            want = np.stack([mutag.graph.nodes[np.repeat(np.arange(188), mutag.graph.n_node) == i].sum(0)
                             for i in real])
            np.testing.assert_allclose(np.asarray(out)[batch.mask], want, rtol=RTOL[np.float32])
    assert readout._cache_size() == len(used)


def test_pad_to_bucket_is_jraph_padding(mutag):
    sub = batching.select_graphs(mutag.graph, [1, 2, 3])
    bucket = batching.Bucket(200, 400, 5)
    got = batching.pad_to_bucket(sub, [bucket])
    want = jraph.pad_with_graphs(sub, 200, 400, 5)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="no bucket holds"):
        batching.pad_to_bucket(sub, [batching.Bucket(10, 400, 5)])


# --------------------------------------------------------------------------------------------
# readouts
# --------------------------------------------------------------------------------------------


def small_batch(seed=0, f=4):
    """Three real graphs (one without nodes) padded with jraph: the padding must not leak into real rows."""
    rng = np.random.default_rng(seed)
    sizes = [3, 0, 5]
    graphs = []
    for n in sizes:
        e = 2 * n
        s = rng.integers(0, max(n, 1), e) if n else np.zeros(0, np.int64)
        r = rng.integers(0, max(n, 1), e) if n else np.zeros(0, np.int64)
        graphs.append(jraph.GraphsTuple(nodes=rng.standard_normal((n, f)).astype(np.float32), edges=None,
                                        senders=s.astype(np.int32), receivers=r.astype(np.int32),
                                        n_node=np.array([n], np.int32), n_edge=np.array([e], np.int32),
                                        globals=None))
    padded = jraph.pad_with_graphs(jraph.batch_np(graphs), 12, 20, 5)
    return graphs, padded


@pytest.mark.parametrize("pool,ref", [
    (jnn.sum_pool, lambda x: x.sum(0)),
    (jnn.mean_pool, lambda x: x.mean(0) if len(x) else np.zeros(x.shape[1], np.float32)),
    (jnn.max_pool, lambda x: x.max(0) if len(x) else np.zeros(x.shape[1], np.float32)),
])
def test_simple_readouts(pool, ref):
    graphs, padded = small_batch()
    out = np.asarray(jax.jit(pool)(padded))
    assert out.shape == (5, 4)
    for i, g in enumerate(graphs):
        np.testing.assert_allclose(out[i], ref(g.nodes), rtol=RTOL[np.float32], atol=1e-6)
    dict_graph = padded._replace(nodes={"h": padded.nodes})
    np.testing.assert_allclose(np.asarray(pool(dict_graph)), out, rtol=RTOL[np.float32])


def np_softmax(z):
    z = z - z.max()
    return np.exp(z) / np.exp(z).sum()


def test_attention_readout():
    graphs, padded = small_batch(1)
    module = jnn.AttentionReadout(value=nn.Dense(3))
    params = module.init(jax.random.key(0), padded)
    out = np.asarray(module.apply(params, padded))
    w_gate = np.asarray(params["params"]["gate_dense"]["kernel"])
    b_gate = np.asarray(params["params"]["gate_dense"]["bias"])
    w_v, b_v = (np.asarray(params["params"]["value"][k]) for k in ("kernel", "bias"))
    for i, g in enumerate(graphs):
        if not len(g.nodes):
            np.testing.assert_array_equal(out[i], 0.0)
            continue
        alpha = np_softmax((g.nodes @ w_gate + b_gate)[:, 0])
        np.testing.assert_allclose(out[i], alpha @ (g.nodes @ w_v + b_v), rtol=1e-4, atol=1e-6)


def np_set2set(x, steps, lstm):
    """Set2Set on one graph with an LSTM written out (gates i, f, g, o)."""
    f = x.shape[1]
    h, c, q_star = np.zeros(f), np.zeros(f), np.zeros(2 * f)
    sig = lambda z: 1 / (1 + np.exp(-z))
    for _ in range(steps):
        gates = {k: q_star @ lstm[f"i{k}"]["kernel"] + h @ lstm[f"h{k}"]["kernel"] + lstm[f"h{k}"]["bias"]
                 for k in "ifgo"}
        c = sig(gates["f"]) * c + sig(gates["i"]) * np.tanh(gates["g"])
        h = sig(gates["o"]) * np.tanh(c)
        a = np_softmax(x @ h) if len(x) else np.zeros(0)
        q_star = np.concatenate([h, a @ x if len(x) else np.zeros(f)])
    return q_star


def test_set2set_matches_written_out_lstm():
    graphs, padded = small_batch(2)
    module = jnn.Set2Set(processing_steps=3)
    params = module.init(jax.random.key(0), padded)
    out = np.asarray(jax.jit(module.apply)(params, padded))
    assert out.shape == (5, 8)
    lstm = jax.tree_util.tree_map(np.asarray, params["params"]["lstm"])
    for i, g in enumerate(graphs):
        np.testing.assert_allclose(out[i], np_set2set(g.nodes.astype(np.float64), 3, lstm), rtol=1e-4, atol=1e-5)


@pytest.mark.pyg
def test_set2set_matches_pyg():
    torch = pytest.importorskip("torch")
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    graphs, padded = small_batch(3)
    torch.manual_seed(0)
    ref = pyg_nn.Set2Set(4, processing_steps=2)
    module = jnn.Set2Set(processing_steps=2)
    params = module.init(jax.random.key(0), padded)["params"]
    assert set(params["lstm"]) == {f"{a}{k}" for a in "ih" for k in "ifgo"}
    w_ih, w_hh = ref.lstm.weight_ih_l0.detach().numpy(), ref.lstm.weight_hh_l0.detach().numpy()
    bias = (ref.lstm.bias_ih_l0 + ref.lstm.bias_hh_l0).detach().numpy()
    lstm = {}
    for j, k in enumerate("ifgo"):  # torch stacks the gates in the order i, f, g, o
        rows = slice(4 * j, 4 * j + 4)
        lstm[f"i{k}"] = {"kernel": w_ih[rows].T}
        lstm[f"h{k}"] = {"kernel": w_hh[rows].T, "bias": bias[rows]}
    out = np.asarray(module.apply({"params": {"lstm": lstm}}, padded))
    real = jraph.batch_np(graphs)
    batch = torch.as_tensor(np.repeat(np.arange(3), real.n_node))
    want = ref(torch.as_tensor(real.nodes), batch).detach().numpy()
    np.testing.assert_allclose(out[:3], want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------


def np_topk(graphs, scores, ratio):
    """Per-graph reference: the kept nodes in descending score order, their scaled features, and kept edges."""
    out = []
    for g, score in zip(graphs, scores, strict=True):
        k = int(np.ceil(ratio * len(score)))
        perm = np.argsort(-score, kind="stable")[:k]
        new_id = {int(old): new for new, old in enumerate(perm)}
        x = g.nodes[perm] * score[perm][:, None]
        edges = sorted((new_id[s], new_id[r]) for s, r in zip(g.senders.tolist(), g.receivers.tolist(), strict=True)
                       if s in new_id and r in new_id)
        out.append((x, edges))
    return out


def check_pooled(pooled, reference, num_real):
    g = jax.device_get(pooled.graph)
    x = g.nodes["h"] if isinstance(g.nodes, dict) else g.nodes
    node_off = np.concatenate([[0], np.cumsum(g.n_node)])
    edge_off = np.concatenate([[0], np.cumsum(g.n_edge)])
    for i, (want_x, want_edges) in enumerate(reference[:num_real]):
        np.testing.assert_allclose(x[node_off[i]:node_off[i + 1]], want_x, rtol=1e-5, atol=1e-6)
        s = g.senders[edge_off[i]:edge_off[i + 1]] - node_off[i]
        r = g.receivers[edge_off[i]:edge_off[i + 1]] - node_off[i]
        assert sorted(zip(s.tolist(), r.tolist(), strict=True)) == want_edges
    mask = jraph.get_node_padding_mask(g)
    assert int(mask.sum()) == sum(len(ref[0]) for ref in reference[:num_real])
    assert (x[~np.asarray(mask)] == 0).all()
    assert int(g.n_node.sum()) == x.shape[0] and int(g.n_edge.sum()) == g.senders.shape[0]


def test_topk_pooling_matches_reference():
    graphs, padded = small_batch(4)
    module = jnn.TopKPooling(ratio=0.5)
    params = module.init(jax.random.key(0), padded)
    pooled = jax.jit(module.apply)(params, padded)
    p = np.asarray(params["params"]["projection"])
    reference = np_topk(graphs, [np.tanh(g.nodes @ p / np.linalg.norm(p)) for g in graphs], 0.5)
    check_pooled(pooled, reference, 3)
    # the projection learns: the gradient of the pooled features reaches it
    grad = jax.grad(lambda prm: jnp.sum(module.apply(prm, padded).graph.nodes ** 2))(params)
    assert float(jnp.abs(grad["params"]["projection"]).sum()) > 0


def pyg_pool(ref, graphs):
    """PyG's pooling of the real graphs: (pooled features, pooled edge_index)."""
    import torch

    real = jraph.batch_np(graphs)
    batch = torch.as_tensor(np.repeat(np.arange(len(graphs)), real.n_node))
    edge_index = torch.as_tensor(np.stack([real.senders, real.receivers]).astype(np.int64))
    x_ref, ei_ref, *_ = ref(torch.as_tensor(real.nodes), edge_index, batch=batch)
    return x_ref.detach().numpy(), ei_ref.numpy()


def check_pooled_like_pyg(pooled, x_ref, ei_ref):
    """The kept nodes are PyG's, in PyG's order, and the kept edges are PyG's (as a set)."""
    kept = int(jraph.get_node_padding_mask(pooled.graph).sum())
    assert kept == x_ref.shape[0]
    np.testing.assert_allclose(np.asarray(pooled.graph.nodes)[:kept], x_ref, rtol=1e-5, atol=1e-6)
    real_edges = int(jraph.get_edge_padding_mask(pooled.graph).sum())
    got = np.stack([np.asarray(pooled.graph.senders)[:real_edges], np.asarray(pooled.graph.receivers)[:real_edges]])
    assert sorted(map(tuple, got.T.tolist())) == sorted(map(tuple, ei_ref.T.tolist()))


def _topk_from_pyg(ref):
    return jnn.TopKPooling(ratio=ref.ratio), {"projection": ref.select.weight.detach().numpy()[0]}


def _sag_from_pyg(ref):
    """PyG's default SAGPooling: ``GraphConv(F, 1)`` then ``SelectTopK(1)``, whose score ``x w / |w|`` with one
    weight is ``sign(w) x``; that sign is folded into the copied GraphConv weights (the score is linear in them)."""
    sign = float(np.sign(ref.select.weight.detach().numpy()[0, 0]))
    t = lambda w: sign * w.detach().numpy()
    gnn = {"kernel_rel": t(ref.gnn.lin_rel.weight).T, "bias": t(ref.gnn.lin_rel.bias),
           "kernel_root": t(ref.gnn.lin_root.weight).T}
    return jnn.SAGPooling(ratio=ref.ratio), {"gnn": gnn}


@pytest.mark.pyg
@pytest.mark.parametrize("name,seed,ratio,ours", [("TopKPooling", 5, 0.6, _topk_from_pyg),
                                                  ("SAGPooling", 7, 0.5, _sag_from_pyg)], ids=["topk", "sag"])
def test_pooling_matches_pyg(name, seed, ratio, ours):
    torch = pytest.importorskip("torch")
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    graphs, padded = small_batch(seed)
    torch.manual_seed(0)
    ref = getattr(pyg_nn, name)(4, ratio=ratio)
    x_ref, ei_ref = pyg_pool(ref, graphs)
    module, params = ours(ref)
    check_pooled_like_pyg(module.apply({"params": params}, padded), x_ref, ei_ref)


def test_sag_pooling_keeps_dict_entries():
    graphs, padded = small_batch(6)
    typed = padded._replace(nodes={"h": padded.nodes, "id": np.arange(12, dtype=np.int32)})
    module = jnn.SAGPooling(jnn.GCNConv(1), ratio=0.5)
    params = module.init(jax.random.key(0), typed)
    pooled = module.apply(params, typed)
    score = np.tanh(np.asarray(jnn.GCNConv(1).apply({"params": params["params"]["gnn"]}, padded).nodes)[:, 0])
    np.testing.assert_array_equal(np.asarray(pooled.graph.nodes["id"]), np.asarray(pooled.perm))
    node_off = np.concatenate([[0], np.cumsum(padded.n_node)])
    scores = [score[node_off[i]:node_off[i + 1]] for i in range(len(graphs))]
    check_pooled(pooled, np_topk(graphs, scores, 0.5), 3)


def test_topk_ratio_error():
    _, padded = small_batch()
    with pytest.raises(ValueError, match="ratio"):
        jnn.TopKPooling(ratio=0.0).init(jax.random.key(0), padded)


@pytest.mark.parametrize("name", ["attention", "set2set"])
def test_readouts_follow_dtype_and_param_dtype(name):
    """``param_dtype`` for every parameter, ``dtype`` for the output, near the float32 run of the same parameters."""
    make = {"attention": lambda **d: jnn.AttentionReadout(**d), "set2set": lambda **d: jnn.Set2Set(2, **d)}[name]
    _, padded = small_batch(8)
    half = make(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    params = half.init(jax.random.key(0), padded)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    out = jax.jit(half.apply)(params, padded)
    assert out.dtype == jnp.bfloat16
    full = jax.jit(make().apply)(jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params), padded)
    assert full.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(full), rtol=0.1, atol=0.1)


@pytest.mark.parametrize("name", ["topk", "sag"])
def test_pools_follow_dtype_and_param_dtype(name):
    """As the readouts, but rounding may reorder near-tied scores: the half-precision output is checked against
    its own selection (``x[perm] * score``), and its scores against float32 on the nodes both runs keep."""
    make = {"topk": lambda **d: jnn.TopKPooling(0.5, **d), "sag": lambda **d: jnn.SAGPooling(ratio=0.5, **d)}[name]
    _, padded = small_batch(8)
    half = make(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    params = half.init(jax.random.key(0), padded)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    low = jax.device_get(jax.jit(half.apply)(params, padded))
    high = jax.device_get(jax.jit(make().apply)(jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params),
                                                padded))
    assert (low.graph.nodes.dtype, low.score.dtype, high.graph.nodes.dtype) == (jnp.bfloat16, jnp.bfloat16,
                                                                                jnp.float32)
    kept = int(jraph.get_node_padding_mask(low.graph).sum())
    x = np.asarray(padded.nodes, np.float32)
    np.testing.assert_allclose(np.asarray(low.graph.nodes[:kept], np.float32),
                               x[low.perm[:kept]] * np.asarray(low.score[:kept], np.float32)[:, None],
                               rtol=RTOL[jnp.bfloat16], atol=RTOL[jnp.bfloat16])
    both = np.intersect1d(low.perm[:kept], high.perm[:kept])
    assert len(both) >= kept - 2
    by_node = lambda pooled: dict(zip(pooled.perm[:kept].tolist(), np.asarray(pooled.score[:kept], np.float32),
                                      strict=True))
    low_score, high_score = by_node(low), by_node(high)
    np.testing.assert_allclose([low_score[v] for v in both], [high_score[v] for v in both], rtol=0.05, atol=0.05)
