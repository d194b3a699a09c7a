"""Hierarchical neighbourhoods (`jgnn.neighborhood`): compiled equals reference on random levels with padding and
empty groups, dense levels agree with their ragged form and with a per-group loop, and explain's level records."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from checks import assert_close, check_against_reference, x64

import jgnn
from jgnn.report import Pass, Reason

BACKENDS = ["xla", "pallas_interpret"]


def _graph(x):
    empty = jnp.zeros((0,), jnp.int32)
    return jraph.GraphsTuple(nodes=x, edges=None, senders=empty, receivers=empty, n_node=jnp.asarray([x.shape[0]]),
                             n_edge=jnp.asarray([0]), globals=None)


def _ragged(rng, rows_below, groups, members, *, empty_groups=3):
    """A ragged level over ``rows_below`` rows whose last ``empty_groups`` groups get no member, with ~20%
    padding (padded members point at real rows and real groups: only the mask drops them)."""
    return jgnn.ragged_level(rng.integers(0, rows_below, members), rng.integers(0, groups - empty_groups, members),
                             groups, mask=rng.random(members) > 0.2,
                             features=jnp.asarray(rng.random((members, 1)), jnp.float32))


def _dense(rng, rows_below, groups, k):
    mask = rng.random((groups, k)) > 0.3
    mask[0] = False  # one group made of padding only: it aggregates to 0
    return jgnn.dense_level(rng.integers(0, rows_below, (groups, k)), mask=mask)


def _rho(kind):
    if kind == "softmax":
        return lambda mb, g: jgnn.sum(jgnn.softmax(jnp.sum(mb, -1, keepdims=True)) * mb)
    return lambda mb, g: getattr(jgnn, kind)(mb)


def _layer(kinds, backend, dtype=jnp.float32):
    def apply(x, W):
        aggs = [jgnn.Aggregation(phi=lambda m, g, f: jnp.tanh(m @ W) * (1.0 + f if f is not None else 1.0),
                                 rho=_rho(kinds[0]))]
        aggs += [jgnn.Aggregation(phi=lambda m, g, f: jnp.sin(m) + 0.5 * m, rho=_rho(k)) for k in kinds[1:]]
        return aggs
    return apply


def _hierarchy(rng, n, shape):
    """Levels bottom-up: ``shape`` is a list of ("ragged", groups, members) / ("dense", groups, k)."""
    levels, below = [], n
    for kind, groups, size in shape:
        levels.append(_ragged(rng, below, groups, size) if kind == "ragged" else _dense(rng, below, groups, size))
        below = groups
    return jgnn.Neighborhood(tuple(levels))


SHAPES = {
    "ragged-dense": [("ragged", 45, 160), ("dense", 15, 3)],  # MAGNN's instances → metapaths → node
    "dense-ragged-dense": [("dense", 50, 3), ("ragged", 24, 70), ("dense", 12, 2)],
    "ragged-ragged": [("ragged", 30, 120), ("ragged", 15, 40)],
}


def _run(nbhd, kinds, backend, x, W):
    out = jgnn.hierarchical(_layer(kinds, backend)(x, W), backend=backend)(_graph(x), nbhd)
    return out.nodes


KINDS = [("sum", "mean", "max"), ("softmax", "max", "mean"), ("mean", "softmax", "min")]
# Fast tier: each shape with one rotation of the reductions (every reduction at a ragged and at a dense level);
# the rest of the cross product is slow.
CASES = [pytest.param(shape, kinds, marks=() if i == j else pytest.mark.slow)
         for i, shape in enumerate(sorted(SHAPES)) for j, kinds in enumerate(KINDS)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("shape", "kinds"), CASES)
def test_compiled_equals_reference_f32(backend, shape, kinds):
    rng = np.random.default_rng(len(shape) * 7 + len(kinds[0]))
    nbhd = _hierarchy(rng, 20, SHAPES[shape])
    kinds = kinds[:len(nbhd.levels)]
    x = jnp.asarray(rng.normal(size=(20, 6)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(6, 6)) * 0.5, jnp.float32)
    check_against_reference(lambda x, W: _run(nbhd, kinds, backend, x, W),
                            lambda x, W: _run(nbhd, kinds, "reference", x, W), x, W, terms=8)


@pytest.mark.parametrize("backend", ["xla", pytest.param("pallas_interpret", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kinds", [("sum", "max", "mean"), ("softmax", "mean", "max")])
def test_compiled_equals_reference_f64(backend, kinds):
    rng = np.random.default_rng(11)
    with x64():
        nbhd = _hierarchy(rng, 20, SHAPES["dense-ragged-dense"])
        x = jnp.asarray(rng.normal(size=(20, 5)), jnp.float64)
        W = jnp.asarray(rng.normal(size=(5, 5)) * 0.5, jnp.float64)
        check_against_reference(lambda x, W: _run(nbhd, kinds, backend, x, W),
                                lambda x, W: _run(nbhd, kinds, "reference", x, W), x, W, dtype=np.float64,
                                terms=8)


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "softmax"])
def test_dense_level_equals_its_ragged_form_and_a_loop(kind):
    """The dense lowering (reshape + masked reductions) against the segment lowering of the same members, and
    sum/mean/max/min against a per-group loop over the unmasked members."""
    rng = np.random.default_rng(3)
    g, k, n = 9, 4, 13
    members = rng.integers(0, n, (g, k))
    mask = rng.random((g, k)) > 0.3
    mask[2] = False
    x = jnp.asarray(rng.normal(size=(n, 3)), jnp.float32)
    dense = jgnn.Neighborhood((jgnn.dense_level(members, mask=mask),))
    ragged = jgnn.Neighborhood((jgnn.ragged_level(members.reshape(-1), np.repeat(np.arange(g), k), g,
                                                  mask=mask.reshape(-1)),))
    agg = [jgnn.Aggregation(rho=_rho(kind))]
    got = jgnn.aggregate(x, dense, agg)
    assert_close(got, jgnn.aggregate(x, ragged, agg), what=kind)
    if kind == "softmax":
        return
    xs = np.asarray(x)
    loop = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind]
    want = np.stack([loop(xs[members[i][mask[i]]], 0) if mask[i].any() else np.zeros(3) for i in range(g)])
    assert_close(got, want.astype(np.float32), what=kind)


def test_explain_records_each_level_and_fuses_each_ragged_level():
    rng = np.random.default_rng(5)
    nbhd = _hierarchy(rng, 20, [("ragged", 30, 110), ("ragged", 15, 41), ("dense", 5, 3)])
    x = jnp.asarray(rng.normal(size=(20, 6)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(6, 6)), jnp.float32)
    layer = jgnn.hierarchical(_layer(("mean", "softmax", "sum"), "xla")(x, W), backend="xla")
    report = jgnn.explain(layer, _graph(x), nbhd)
    levels = {(d.code, d.get("level")): d for d in report.decisions if d.get("level") is not None}
    assert levels[(Reason.LEVEL_SEGMENT, 0)].by == Pass.LOWERING
    assert levels[(Reason.LEVEL_SEGMENT, 1)].get("members") == 41
    assert levels[(Reason.LEVEL_DENSE, 2)].get("fanout") == 3
    assert levels[(Reason.LEVEL_FUSED, 0)].applied and levels[(Reason.LEVEL_FUSED, 1)].applied
    fused = {d.get("edges"): d.code for d in report.decisions if d.by == Pass.FUSE and d.get("edges")}
    assert fused == {110: Reason.FUSED_REDUCE, 41: Reason.FUSED_ATTENTION}
    assert sum(e.primitive == "jgnn_segment" for e in report.equations) == 2  # none for the dense level
    assert len(report.kernels) == 2


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="groups"):
        jgnn.ragged_level(np.arange(4), np.arange(3), 5)
    with pytest.raises(ValueError, match="members"):
        jgnn.dense_level(np.arange(4))
    with pytest.raises(ValueError, match="mask"):
        jgnn.dense_level(np.zeros((2, 3), int), mask=np.ones((3, 2), bool))
    nbhd = jgnn.Neighborhood((jgnn.dense_level(np.zeros((2, 3), int)),))
    with pytest.raises(ValueError, match="aggregations"):
        jgnn.aggregate(jnp.ones((4, 2)), nbhd, [])
    with pytest.raises(TypeError, match="Aggregation"):
        jgnn.hierarchical([lambda mb, g: mb])


# ---- models: JK-Net, PinSage -----------------------------------------------------------------------------

def _random_graph(rng, n, e):
    s, r = rng.integers(0, n, e), rng.integers(0, n, e)
    x = jnp.asarray(rng.normal(size=(n, 5)), jnp.float32)
    return jraph.GraphsTuple(nodes=x, edges=None, senders=jnp.asarray(s, jnp.int32),
                             receivers=jnp.asarray(r, jnp.int32), n_node=jnp.asarray([n]), n_edge=jnp.asarray([e]),
                             globals=None)


def test_random_walks_follow_edges():
    rng = np.random.default_rng(7)
    g = _random_graph(rng, 15, 30)  # some nodes have no out-edges: their walks stay put
    walks = np.asarray(jgnn.nn.pinsage.random_walks(g, jax.random.key(0), num_walks=4, walk_length=3))
    assert walks.shape == (15, 4, 3)
    edges = set(zip(np.asarray(g.senders).tolist(), np.asarray(g.receivers).tolist(), strict=True))
    sinks = set(range(15)) - {s for s, _ in edges}
    for v in range(15):
        for walk in walks[v]:
            prev = v
            for u in walk.tolist():
                assert (prev, u) in edges or (prev in sinks and u == prev)
                prev = u


def test_top_visited_is_top_k_by_count_without_self():
    rng = np.random.default_rng(8)
    visits = rng.integers(0, 9, (12, 30))
    ids, counts = jgnn.nn.pinsage.top_visited(jnp.asarray(visits, jnp.int32), 4)
    for v in range(12):
        tally = collections.Counter(u for u in visits[v].tolist() if u != v)
        got = [(int(i), int(c)) for i, c in zip(ids[v], counts[v], strict=True) if c > 0]
        assert len({i for i, _ in got}) == len(got) == min(4, len(tally))
        assert all(tally[i] == c for i, c in got)
        left = [c for u, c in tally.items() if u not in {i for i, _ in got}]
        assert not left or min(c for _, c in got) >= max(left)


def test_jumping_knowledge_modes():
    rng = np.random.default_rng(9)
    xs = [jnp.asarray(rng.normal(size=(7, 4)), jnp.float32) for _ in range(3)]
    for mode, want in (("cat", jnp.concatenate(xs, -1)), ("max", jnp.max(jnp.stack(xs), 0))):
        jk = jgnn.nn.JumpingKnowledge(mode)
        assert_close(jk.apply(jk.init(jax.random.key(0), xs), xs), want, what=mode)
    jk = jgnn.nn.JumpingKnowledge("lstm")
    params = jk.init(jax.random.key(0), xs)["params"]
    out = jk.apply({"params": params}, xs)
    assert out.shape == (7, 4)
    # With a zero score layer every layer weighs 1/L: the attention level is a mean over layers.
    flat = {**params, "att": {"kernel": jnp.zeros_like(params["att"]["kernel"]), "bias": params["att"]["bias"]}}
    assert_close(jk.apply({"params": flat}, xs), jnp.mean(jnp.stack(xs), 0), what="lstm")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pinsage_conv_compiled_equals_reference(backend):
    rng = np.random.default_rng(10)
    g = _random_graph(rng, 25, 80)
    nbhd = jgnn.nn.random_walk_neighbors(g, jax.random.key(1), num_walks=5, walk_length=3, top_k=4)
    conv = jgnn.nn.PinSageConv(6, backend=backend)
    params = conv.init(jax.random.key(2), g, nbhd)
    ref = jgnn.nn.PinSageConv(6, backend="reference")
    check_against_reference(lambda p, x: conv.apply(p, g._replace(nodes=x), nbhd).nodes,
                            lambda p, x: ref.apply(p, g._replace(nodes=x), nbhd).nodes, params, g.nodes,
                            terms=4)


def test_pinsage_level_is_dense_without_segment_ops():
    rng = np.random.default_rng(12)
    g = _random_graph(rng, 20, 60)
    nbhd = jgnn.nn.random_walk_neighbors(g, jax.random.key(1), top_k=5)
    W = jnp.asarray(rng.normal(size=(5, 5)), jnp.float32)
    layer = jgnn.hierarchical([jgnn.Aggregation(phi=lambda m, grp, f: jax.nn.relu(m @ W) * f["importance"])],
                              backend="xla")
    report = jgnn.explain(layer, g, nbhd)
    assert [(d.code, d.get("fanout")) for d in report.decisions if d.get("level") is not None] == \
        [(Reason.LEVEL_DENSE, 5)]
    assert not any(e.primitive.startswith("jgnn_segment") for e in report.equations)


def _tiny_hetero(rng):
    from jgnn.hetero import HeteroGraph

    num = {"author": 12, "paper": 20, "venue": 3}
    ap = np.stack([rng.integers(0, 12, 40), rng.integers(0, 20, 40)])
    pv = np.stack([np.arange(20), rng.integers(0, 3, 20)])
    edges = {("author", "ap", "paper"): ap, ("paper", "pa", "author"): ap[::-1].copy(),
             ("paper", "pv", "venue"): pv, ("venue", "vp", "paper"): pv[::-1].copy()}
    feats = {"author": rng.normal(size=(12, 4)).astype(np.float32), "paper": rng.normal(size=(20, 6)).astype(
        np.float32)}
    return HeteroGraph(num, edges, feats)


def test_metapath_instances_follow_the_metapath():
    rng = np.random.default_rng(13)
    g = _tiny_hetero(rng)
    nbhd, info = jgnn.nn.metapath_neighborhood(g, "author", [("author", "paper", "author"),
                                                             ("author", "paper", "venue", "paper", "author")],
                                               samples=4, seed=0)
    level0, level1, level2 = nbhd.levels
    assert (level0.dense, level1.dense, level2.fanout) == (False, False, 2)
    ap = set(zip(*g.edge_index[("author", "ap", "paper")].tolist(), strict=True))
    pv = set(zip(*g.edge_index[("paper", "pv", "venue")].tolist(), strict=True))
    off = info["offsets"]
    members, groups = np.asarray(level0.graph.senders), np.asarray(level0.graph.receivers)
    owner = np.asarray(level1.graph.receivers)
    for i in range(level0.num_groups):
        nodes = members[groups == i]
        p = owner[i] // 12
        assert owner[i] % 12 == nodes[0] - off["author"]  # the instance starts at its target
        a0, p0 = nodes[0] - off["author"], nodes[1] - off["paper"]
        assert (a0, p0) in ap and (nodes[-1] - off["author"], nodes[-2] - off["paper"]) in ap
        if p == 1:
            assert (p0, nodes[2] - off["venue"]) in pv and (nodes[3] - off["paper"], nodes[2] - off["venue"]) in pv
    assert sum(info["instances"].values()) == level0.num_groups


@pytest.mark.parametrize("encoder", ["rotation", pytest.param("mean", marks=pytest.mark.slow)])
def test_magnn_compiled_equals_reference(encoder):
    rng = np.random.default_rng(14)
    g = _tiny_hetero(rng)
    nbhd, info = jgnn.nn.metapath_neighborhood(g, "author", [("author", "paper", "author"),
                                                             ("author", "paper", "venue", "paper", "author")],
                                               samples=3, seed=1)
    feats = {t: jnp.asarray(g.node_features[t]) if t in g.node_features else None for t in g.num_nodes}
    make = lambda backend: jgnn.nn.MAGNN(8, 3, dict(g.num_nodes), len(info["relations"]), encoder=encoder,
                                         attention_dim=5, backend=backend)
    params = make("xla").init(jax.random.key(0), feats, nbhd)
    check_against_reference(lambda p: make("xla").apply(p, feats, nbhd), lambda p: make("reference").apply(
        p, feats, nbhd), params, terms=8)
    layer_levels = [d for d in jgnn.explain(make("xla"), params, feats, nbhd).kernels if d.get("nested")]
    # level 0, the instance encoder, and level 1, the intra-metapath attention (it reads the targets' table)
    assert sorted(k.op for k in layer_levels) == ["attention", "gather_reduce(mean)"]


def test_hop_similarity_and_closest_anchors():
    # A path 0-1-2-3-4 and an isolated node 5: s(u, v) = 1 / (|u - v| + 1) on the path, 0 across.
    senders, receivers = np.asarray([0, 1, 2, 3]), np.asarray([1, 2, 3, 4])
    sim = jgnn.nn.hop_similarity(senders, receivers, 6)
    want = np.zeros((6, 6), np.float32)
    want[:5, :5] = 1.0 / (np.abs(np.arange(5)[:, None] - np.arange(5)[None, :]) + 1)
    want[5, 5] = 1.0
    assert_close(sim, want)
    assert_close(jgnn.nn.hop_similarity(senders, receivers, 6, max_distance=1), np.where(want >= 0.5, want, 0))
    rng = np.random.default_rng(15)
    sim = jgnn.nn.hop_similarity(rng.integers(0, 16, 30), rng.integers(0, 16, 30), 16)
    level = jgnn.nn.anchor_neighborhood(sim, np.random.default_rng(0), copies=2).levels[0]
    assert level.fanout == 2 * 4  # log2(16) sizes, 2 copies each
    members = np.asarray(level.graph.senders).reshape(16, -1)
    s = np.asarray(level.graph.edges["s"]).reshape(16, -1)
    assert_close(s, sim[np.arange(16)[:, None], members])
    assert level.graph.edges["slot"].shape == (16 * 8,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pgnn_conv_compiled_equals_reference(backend):
    rng = np.random.default_rng(16)
    g = _random_graph(rng, 20, 50)
    sim = jgnn.nn.hop_similarity(np.asarray(g.senders), np.asarray(g.receivers), 20)
    nbhd = jgnn.nn.anchor_neighborhood(sim, np.random.default_rng(1))
    conv, ref = jgnn.nn.PGNNConv(6, backend=backend), jgnn.nn.PGNNConv(6, backend="reference")
    params = conv.init(jax.random.key(0), g, nbhd)
    def run(module):
        def apply(p, x):
            position, out = module.apply(p, g._replace(nodes=x), nbhd)
            return position, out.nodes
        return apply

    check_against_reference(run(conv), run(ref), params, g.nodes, terms=8)


def _dtype_cases():
    """name -> (module constructor taking dtype fields, its arguments, the output array of ``apply``)."""
    rng = np.random.default_rng(17)
    g = _random_graph(rng, 20, 50)
    xs = [jnp.asarray(rng.normal(size=(7, 4)), jnp.float32) for _ in range(3)]
    walks = jgnn.nn.random_walk_neighbors(g, jax.random.key(1), num_walks=5, walk_length=3, top_k=4)
    anchors = jgnn.nn.anchor_neighborhood(jgnn.nn.hop_similarity(np.asarray(g.senders), np.asarray(g.receivers),
                                                                 20), np.random.default_rng(1))
    het = _tiny_hetero(rng)
    metapaths, info = jgnn.nn.metapath_neighborhood(het, "author", [("author", "paper", "author")], samples=3)
    feats = {t: jnp.asarray(het.node_features[t]) if t in het.node_features else None for t in het.num_nodes}
    first = lambda out: out[0] if isinstance(out, tuple) else out
    return {
        "jk_lstm": (lambda **d: jgnn.nn.JumpingKnowledge("lstm", **d), (xs,), first),
        "jknet_sage": (lambda **d: jgnn.nn.JKNet(6, 3, conv="sage", mode="max", **d), (g,), first),
        "pinsage": (lambda **d: jgnn.nn.PinSage(6, 3, top_k=4, **d), (g, jax.random.key(1)), first),
        "pinsage_conv": (lambda **d: jgnn.nn.PinSageConv(6, **d), (g, walks), lambda out: out.nodes),
        "pgnn": (lambda **d: jgnn.nn.PGNN(6, **d), (g, anchors), first),
        "magnn": (lambda **d: jgnn.nn.MAGNN(8, 3, dict(het.num_nodes), len(info["relations"]), attention_dim=5,
                                            **d), (feats, metapaths), first),
    }


@pytest.mark.parametrize("name", ["jk_lstm", "jknet_sage", "pinsage", "pinsage_conv", "pgnn", "magnn"])
def test_models_follow_dtype_and_param_dtype(name):
    """Flax convention: ``param_dtype`` for every parameter, ``dtype`` for the computation and the output, which
    stays near the float32 run of the same (rounded) parameters."""
    make, args, output = _dtype_cases()[name]
    half = make(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    params = half.init(jax.random.key(0), *args)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    out = output(half.apply(params, *args))
    assert out.dtype == jnp.bfloat16
    full = output(make().apply(jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params), *args))
    assert full.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(full), rtol=0.1, atol=0.1)


@pytest.mark.parametrize("backend", ["xla", pytest.param("pallas_interpret", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["jknet_sage", "pinsage", "pgnn"])
def test_models_equal_reference_in_forward_reverse_and_forward_mode(name, backend):
    """The whole models, not only their convolutions: outputs, ``grad`` and ``jvp`` in the parameters and the
    node features equal the reference's."""
    rng = np.random.default_rng(18)
    g = _random_graph(rng, 20, 50)
    anchors = jgnn.nn.anchor_neighborhood(jgnn.nn.hop_similarity(np.asarray(g.senders), np.asarray(g.receivers),
                                                                 20), np.random.default_rng(1))
    make, extra = {
        "jknet_sage": (lambda b: jgnn.nn.JKNet(6, 3, conv="sage", mode="max", backend=b), ()),
        "pinsage": (lambda b: jgnn.nn.PinSage(6, 3, top_k=4, backend=b), (jax.random.key(1),)),
        "pgnn": (lambda b: jgnn.nn.PGNN(6, backend=b), (anchors,)),
    }[name]
    params = make("reference").init(jax.random.key(0), g, *extra)

    def run(module):
        def apply(p, x):
            out = module.apply(p, g._replace(nodes=x), *extra)
            return out[0] if isinstance(out, tuple) else out
        return apply

    check_against_reference(run(make(backend)), run(make("reference")), params, g.nodes, terms=8)
