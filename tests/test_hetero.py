"""Heterogeneous graphs: per-type dicts <-> typed GraphsTuple, DBLP, typed layers through the conversion, PyG."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgnn import datasets as D
from jgnn import hetero
from jgnn import nn as jnn


def small_hetero(seed=0):
    rng = np.random.default_rng(seed)
    num_nodes = {"user": 5, "item": 7, "tag": 3}
    edge_types = [("user", "buys", "item"), ("item", "bought_by", "user"), ("item", "has", "tag"),
                  ("user", "follows", "user")]
    edge_index = {}
    for src, rel, dst in edge_types:
        e = int(rng.integers(3, 12))
        edge_index[(src, rel, dst)] = np.stack([rng.integers(0, num_nodes[src], e), rng.integers(0, num_nodes[dst], e)])
    features = {"user": rng.standard_normal((5, 4)).astype(np.float32),
                "item": rng.standard_normal((7, 6)).astype(np.float32)}
    edge_features = {et: rng.standard_normal((ei.shape[1], 2)).astype(np.float32) for et, ei in edge_index.items()}
    return hetero.HeteroGraph(num_nodes, edge_index, features, edge_features)


def test_to_typed_graph_layout():
    hg = small_hetero()
    graph, schema = hetero.to_typed_graph(hg)
    assert schema.node_types == ("user", "item", "tag")
    assert schema.node_offsets.tolist() == [0, 5, 12, 15]
    assert schema.relation_schema.tolist() == [[0, 1], [1, 0], [1, 2], [0, 0]]
    assert graph.nodes["type"].tolist() == [0] * 5 + [1] * 7 + [2] * 3
    assert "h" not in graph.nodes  # widths 4 and 6 differ (and tags have none): HeteroInput projects them
    assert graph.edges["h"].shape == (graph.senders.shape[0], 2)  # same-width edge features are concatenated
    for r, et in enumerate(schema.edge_types):
        rows = slice(int(schema.edge_offsets[r]), int(schema.edge_offsets[r + 1]))
        assert (graph.edges["type"][rows] == r).all()
        np.testing.assert_array_equal(graph.senders[rows], hg.edge_index[et][0] + schema.node_offsets[
            schema.relation_schema[r, 0]])
        np.testing.assert_array_equal(graph.receivers[rows], hg.edge_index[et][1] + schema.node_offsets[
            schema.relation_schema[r, 1]])
    assert graph.senders.dtype == np.int32 and graph.nodes["type"].dtype == np.int32


def test_round_trip_with_schema():
    hg = small_hetero(1)
    hg = hetero.HeteroGraph(hg.num_nodes, hg.edge_index, {**hg.node_features,
                                                          "tag": np.zeros((3, 6), np.float32)}, {})
    hg = hetero.HeteroGraph(hg.num_nodes, hg.edge_index, {k: v[:, :4] for k, v in hg.node_features.items()}, {})
    graph, schema = hetero.to_typed_graph(hg)
    assert graph.nodes["h"].shape == (15, 4)
    back = hetero.from_typed_graph(graph, schema)
    assert back.num_nodes == hg.num_nodes and back.edge_types == hg.edge_types
    for et in hg.edge_types:
        np.testing.assert_array_equal(back.edge_index[et], hg.edge_index[et])
    for t in hg.node_types:
        np.testing.assert_array_equal(back.node_features[t], hg.node_features[t])
    np.testing.assert_array_equal(schema.join_nodes(schema.split_nodes(graph.nodes["h"])), graph.nodes["h"])


def test_from_typed_graph_infers_types_from_interleaved_nodes():
    tg = D.typed_graph(40, 200, 3, 4, feature_dim=5, seed=2)
    perm = np.random.default_rng(0).permutation(40)  # interleave the node types
    inv = np.argsort(perm)
    g = tg.graph
    shuffled = g._replace(nodes={k: v[perm] for k, v in g.nodes.items()}, senders=inv[g.senders].astype(np.int32),
                          receivers=inv[g.receivers].astype(np.int32))
    hg = hetero.from_typed_graph(shuffled)
    assert sum(hg.num_nodes.values()) == 40 and sum(ei.shape[1] for ei in hg.edge_index.values()) == 200
    for s, r, d in hg.edge_index:
        assert tg.relation_schema[int(r)].tolist() == [int(s), int(d)]
    # the features of type t are the rows of that type, in id order
    t0 = np.flatnonzero(shuffled.nodes["type"] == 0)
    np.testing.assert_array_equal(hg.node_features["0"], shuffled.nodes["h"][t0])


@pytest.mark.parametrize("bad,pattern", [
    ({"edge_index": {("user", "x", "nobody"): np.zeros((2, 1), np.int64)}}, "nobody"),
    ({"edge_index": {("user", "x", "item"): np.asarray([[0], [7]])}}, r"outside \[0, 7\)"),
    ({"edge_index": {("user", "x", "item"): np.zeros((3, 1), np.int64)}}, r"\[2, E\]"),
    ({"node_features": {"user": np.zeros((4, 2))}}, "expected 5"),
])
def test_hetero_graph_errors(bad, pattern):
    kw = {"num_nodes": {"user": 5, "item": 7}, "edge_index": {}, **bad}
    with pytest.raises(ValueError, match=pattern):
        hetero.HeteroGraph(**kw)


def test_typed_layers_accept_hetero_graphs():
    """HGT and RGCN through HeteroInput: the per-type outputs do not depend on how node ids are arranged."""
    hg = small_hetero(3)
    graph, schema = hetero.to_typed_graph(hg)
    inp = hetero.HeteroInput(8)
    inp_params = inp.init(jax.random.key(0), hg.node_features, schema)
    x = inp.apply(inp_params, hg.node_features, schema)
    assert x.shape == (15, 8)
    g = graph._replace(nodes={**graph.nodes, "h": x})
    hgt = jnn.HGTConv(8, 2, schema.num_node_types, schema.num_edge_types)
    rgcn = jnn.RGCNConv(8, schema.num_edge_types)
    # the same graph with node ids reversed
    perm = np.arange(15)[::-1]
    inv = np.argsort(perm)
    flipped = g._replace(nodes={k: np.asarray(v)[perm] for k, v in g.nodes.items()},
                         senders=inv[g.senders].astype(np.int32), receivers=inv[g.receivers].astype(np.int32))
    for conv in (hgt, rgcn):
        params = jax.jit(conv.init)(jax.random.key(1), g)  # jitted: eager init compiles op by op
        apply = jax.jit(lambda p, graph, conv=conv: conv.apply(p, graph).nodes["h"])  # one compile for both
        out = schema.split_nodes(apply(params, g))
        out_flipped = np.asarray(apply(params, flipped))[inv]
        for t in schema.node_types:
            np.testing.assert_allclose(np.asarray(out[t]), out_flipped[schema.node_slice(t)], rtol=1e-5, atol=1e-5)


def test_hetero_input_follows_dtype_and_param_dtype():
    hg = small_hetero(4)
    _, schema = hetero.to_typed_graph(hg)
    counts = {**hg.node_features, "user": np.arange(20, dtype=np.int32).reshape(5, 4)}  # integer features enter
    half = hetero.HeteroInput(8, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    params = half.init(jax.random.key(0), counts, schema)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    out = half.apply(params, counts, schema)
    assert out.dtype == jnp.bfloat16 and out.shape == (15, 8)
    full = hetero.HeteroInput(8).apply(jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params), counts,
                                       schema)
    assert full.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(full), rtol=2e-2, atol=2e-2)


def test_hetero_dblp(data_dir):
    ds = D.load_hetero_dblp(root=data_dir)
    hg = ds.graph
    assert hg.num_nodes == {"author": 4057, "paper": 14328, "term": 7723, "venue": 20}
    assert {k: v.shape for k, v in hg.node_features.items()} == {"author": (4057, 334), "paper": (14328, 4231),
                                                                 "term": (7723, 50)}
    assert int(hg.node_features["paper"].sum()) == 95030  # binary bag of words: one per stored non-zero
    assert ds.target == "author" and np.bincount(ds.labels).tolist() == [1197, 745, 1109, 1006]
    assert (ds.train_idx.size, ds.val_idx.size, ds.test_idx.size) == (400, 400, 3257)
    assert np.bincount(ds.labels[ds.train_idx]).tolist() == [117, 69, 118, 96]
    graph, schema = hetero.to_typed_graph(hg)
    with np.load(data_dir / "hetero_dblp.npz") as z:
        np.testing.assert_array_equal(graph.nodes["type"], z["node_type"])
        np.testing.assert_array_equal(graph.edges["type"], z["edge_type"])
        np.testing.assert_array_equal(graph.senders, z["senders"])
        np.testing.assert_array_equal(graph.receivers, z["receivers"])
        assert schema.relation_schema.tolist() == np.stack([z["edge_type_src"], z["edge_type_dst"]], 1).tolist()


# --------------------------------------------------------------------------------------------
# PyG converters (run when torch-geometric is installed)
# --------------------------------------------------------------------------------------------


@pytest.mark.pyg
def test_from_pyg_hetero_matches_to_homogeneous():
    torch = pytest.importorskip("torch")
    pyg_data = pytest.importorskip("torch_geometric.data")
    hg = small_hetero(4)
    data = pyg_data.HeteroData()
    for t, n in hg.num_nodes.items():
        data[t].num_nodes = n
        if t in hg.node_features:
            data[t].x = torch.as_tensor(hg.node_features[t])
    for et, ei in hg.edge_index.items():
        data[et].edge_index = torch.as_tensor(ei)
    got = D.from_pyg_hetero(data)
    graph, _ = hetero.to_typed_graph(got)
    homo = data.to_homogeneous(node_attrs=[], edge_attrs=[])
    np.testing.assert_array_equal(np.stack([graph.senders, graph.receivers]), homo.edge_index.numpy())
    np.testing.assert_array_equal(graph.nodes["type"], homo.node_type.numpy())
    np.testing.assert_array_equal(graph.edges["type"], homo.edge_type.numpy())
    np.testing.assert_array_equal(got.node_features["item"], hg.node_features["item"])


@pytest.mark.pyg
def test_from_pyg_data_and_batch():
    torch = pytest.importorskip("torch")
    pyg_data = pytest.importorskip("torch_geometric.data")
    rng = np.random.default_rng(5)
    graphs = []
    for n, e in ((4, 6), (3, 2), (5, 9)):
        graphs.append(pyg_data.Data(x=torch.as_tensor(rng.standard_normal((n, 3))),
                                    edge_index=torch.as_tensor(rng.integers(0, n, (2, e))),
                                    edge_attr=torch.as_tensor(rng.standard_normal((e, 2)).astype(np.float32))))
    one = D.from_pyg(graphs[0])
    assert one.nodes.dtype == np.float32 and one.nodes.shape == (4, 3) and one.edges.shape == (6, 2)
    np.testing.assert_array_equal(one.senders, graphs[0].edge_index[0].numpy())
    batch = pyg_data.Batch.from_data_list(graphs)
    g = D.from_pyg(batch)
    assert g.n_node.tolist() == [4, 3, 5] and g.n_edge.tolist() == [6, 2, 9]
    np.testing.assert_array_equal(np.stack([g.senders, g.receivers]), batch.edge_index.numpy())
    with pytest.raises(TypeError, match="Data"):
        D.from_pyg(np.zeros(3))
