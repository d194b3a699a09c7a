"""One semantics per op: every backend agrees with the reference on the cases that used to give wrong answers.

Each test names the bug class of the core-redesign issue it guards ((a)–(q)); values are checked against the
reference program (forward, grad and jvp), and the report is checked through its structured fields.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from checks import assert_close, check_against_reference, x64
from graph_cases import random_graph

import jgnn
from jgnn.ops.softmax import segment_softmax
from jgnn.report import Pass, Reason
from jgnn.roles import Index

BACKENDS = ["xla", "pallas_interpret"]


def _pair(phi, rho=None, psi=None, backend="xla"):
    return (jgnn.message_passing(phi, rho, psi, backend=backend),
            jgnn.message_passing(phi, rho, psi, backend="reference"))


def _h(layer):
    return lambda g: layer(g).nodes


def _graph(rng, n, e, d, **kw):
    return random_graph(rng, n, e, d, **kw)


def _fused(report, op_prefix: str) -> list:
    return [k for k in report.kernels if k.op.startswith(op_prefix)]


# ---- attention: -inf rows, masks, NaN and infinities (b, c, g) ------------------------------------------

def _attention_layer(backend, logits_fn):
    def phi(s, d, e):
        return {"logit": logits_fn(s, d, e), "v": s["h"]}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(mb["logit"])[:, None] * mb["v"])

    return _pair(phi, rho, backend=backend)


def _hub_graph(rng, in_degree: int, d: int = 4):
    """Node 0 receives ``in_degree`` edges; a few other edges elsewhere; nodes 5-6 receive none."""
    n = 8
    senders = np.concatenate([rng.integers(1, n, in_degree), rng.integers(0, n, 10)]).astype(np.int32)
    receivers = np.concatenate([np.zeros(in_degree), rng.integers(1, 5, 10)]).astype(np.int32)
    e = senders.shape[0]
    return jraph.GraphsTuple(nodes={"h": jnp.asarray(rng.normal(size=(n, d)), jnp.float32)},
                             edges={"w": jnp.zeros((e,), jnp.float32)}, senders=jnp.asarray(senders),
                             receivers=jnp.asarray(receivers), n_node=jnp.array([n]), n_edge=jnp.array([e]),
                             globals=None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["first_chunk_neg_inf", "all_masked_1e9", "nan_logit", "pos_inf_logit",
                                  "overflowing_logits", "all_neg_inf_row"])
def test_attention_edge_cases_match_reference(backend, case, monkeypatch):
    """(b) a row whose first chunk is all −inf; (c) rows masked with −1e9 (gradients were k× wrong); (g) NaN,
    +inf and overflowing logits; all −inf rows (NaN, like −inf − (−inf))."""
    monkeypatch.setenv("JGNN_EDGE_TEMP_BYTES", "2048")  # the XLA lowering walks edge blocks: chunks matter there
    rng = np.random.default_rng(7)
    g = _hub_graph(rng, 150)
    e = g.senders.shape[0]
    bias = np.zeros(e, np.float32)
    if case == "first_chunk_neg_inf":
        bias[:100] = -np.inf
    elif case == "all_masked_1e9":
        bias[:150] = -1e9
    elif case == "nan_logit":
        bias[3] = np.nan
    elif case == "pos_inf_logit":
        bias[5] = np.inf
    elif case == "overflowing_logits":  # finite edge data whose logits overflow to ±inf inside phi: NaN rows
        bias[:150:2], bias[1:150:2], bias[150:] = 3e38, -3e38, 2e38
    else:
        bias[:150] = -np.inf
    g = g._replace(edges={"w": jnp.asarray(bias)})
    compiled, reference = _attention_layer(backend, lambda s, d, e: jnp.sum(s["h"] * d["h"]) * 0.1 + e["w"] * 2.0)
    check_against_reference(_h(compiled), _h(reference), g)
    assert _fused(jgnn.explain(compiled, g), "attention")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocks", [False, True])
def test_saved_normaliser_counts_an_edge_at_its_rows_max_as_one(backend, blocks, monkeypatch):
    """Fuzz class c (campaign 20261127): scores near 1e9 whose last product XLA fuses into ``s − m``. The max
    edge's ``exp(s − m)`` is then exp of the product's rounding error (5.6e-4 here), the normaliser saved for the
    backward was 5.6e-4, and the backward's weight, recomputed with that edge at exactly its max, was 1,787
    instead of 1: the gradient was 1,787 times the reference's. One edge per row: its weight is 1, and the
    gradient of ``Σ α·m`` is the cotangent times the edge factor, on the all-edges path and on edge blocks."""
    if blocks:
        monkeypatch.setenv("JGNN_EDGE_TEMP_BYTES", "64")
    h = jnp.asarray([[-0.55271447], [0.25], [0.5]], jnp.float32)
    senders, receivers = jnp.asarray([0, 1], jnp.int32), jnp.asarray([1, 2], jnp.int32)
    factor = jnp.asarray([-1e9, -1e9], jnp.float32)
    w0 = jnp.asarray([0.80315316], jnp.float32)

    def fn(graph, factor, w0):
        m = graph.nodes[graph.senders] * factor[:, None]
        alpha = jraph.segment_softmax(jnp.sum(m * w0, -1), graph.receivers, graph.nodes.shape[0])
        return jax.ops.segment_sum(m * alpha[:, None], graph.receivers, graph.nodes.shape[0])

    graph = jraph.GraphsTuple(nodes=h, edges=None, senders=senders, receivers=receivers, n_node=jnp.array([3]),
                              n_edge=jnp.array([2]), globals=None)
    compiled = jgnn.compile(fn, backend=backend)
    ct = jnp.asarray([[0.0], [-1.20178], [0.7]], jnp.float32)
    loss = lambda f: lambda h: jnp.sum(f(graph._replace(nodes=h), factor, w0) * ct)
    got = jax.jit(jax.grad(loss(compiled)))(h)
    want = jnp.asarray([[-1.20178 * -1e9], [0.7 * -1e9], [0.0]], jnp.float32)  # ct[receiver] · factor
    assert_close(got, want)
    assert_close(got, jax.grad(loss(fn))(h))


def _one_row_score_grads(backend, scores, values, dtype):
    """Reference and compiled gradients in the scores of ``out = Σ softmax(s) v`` over one row of edges (every
    edge ``i -> 0``), with ``scores`` and ``values`` in ``dtype``."""
    k = scores.shape[0]
    nodes = {"s": jnp.asarray(scores[:, None], dtype), "v": jnp.asarray(values[:, None], dtype)}
    graph = jraph.GraphsTuple(nodes=nodes, edges=None, senders=jnp.arange(k, dtype=jnp.int32),
                              receivers=jnp.zeros(k, jnp.int32), n_node=jnp.array([k]), n_edge=jnp.array([k]),
                              globals=None)
    assert np.array_equal(np.asarray(graph.nodes["s"], np.float64)[:, 0], scores)  # exactly representable

    def phi(s, d, e):
        return {"s": s["s"], "v": s["v"]}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(mb["s"]) * mb["v"])

    grad = lambda layer: jax.jit(jax.grad(lambda s: jnp.sum(layer(graph._replace(
        nodes={**graph.nodes, "s": s})).nodes[0, 0].astype(jnp.float32))))(graph.nodes["s"])
    return tuple(grad(layer) for layer in reversed(_pair(phi, rho, backend=backend)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, top", [(jnp.bfloat16, 10.0), (jnp.float16, 100.0), (jnp.float32, 1e5)])
def test_scores_a_few_ulps_below_the_max_keep_their_own_weight(backend, dtype, top):
    """Scores 1 to 4 ulps below their row's max, at magnitudes where those ulps are narrow in the exponent:
    the backward's recomputed weights are ``exp(s − m) / l``, not snapped to the max's (equal weights gave a
    bfloat16 gradient 10% off). The gradient of ``out = Σ α v`` in the scores is ``α (v − out)``, computed here in
    float64 from the same rounded scores, and the reference's agrees with it to the dtype's tolerance."""
    ulp = float(jnp.finfo(dtype).eps) * 2.0 ** np.floor(np.log2(top))
    scores = top - ulp * np.arange(5.0)  # 0 to 4 ulps below the max: all within the tie window
    values = np.asarray([0.0, 0.0, 0.0, 0.0, 8.0])
    reference, compiled = _one_row_score_grads(backend, scores, values, dtype)
    alpha = np.exp(scores - scores.max())
    alpha /= alpha.sum()
    exact = (alpha * (values - alpha @ values))[:, None]
    assert_close(reference, exact, dtype=dtype)
    assert_close(compiled, exact, dtype=dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_weights_of_equal_messages_give_zero_score_cotangents(backend):
    """Fuzz class g (campaign 20261127, 4,000 cases): edges carrying one message, bfloat16 scores. The score
    cotangents ``α (g·V − R)`` are exactly 0, as the reference's are; the forward rounded ``exp(s − m)`` to
    bfloat16 in the normaliser it saved, so the backward's float32 weights summed to 1 ± 4e-3 and the cotangents
    were ``±α |V| 4e-3``."""
    scores = np.asarray([0.55078125, -0.41796875, 0.30078125])
    reference, compiled = _one_row_score_grads(backend, scores, np.full(3, 100.0), jnp.bfloat16)
    zeros = np.zeros((3, 1))
    assert_close(reference, zeros, dtype=jnp.bfloat16)
    assert_close(compiled, zeros, dtype=jnp.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_tangent_overflows_where_the_reference_does(backend):
    """(g) The attention tangent is the reference's term by term, ``(α·(ds − c) − α·T)·V + α·dV``: the shorter
    ``α·(ds·(V − out) + dV)`` overflows to ±inf (and NaN after the sum) where the reference's is finite."""
    g = jraph.GraphsTuple(nodes={"s": jnp.zeros((3,), jnp.float32), "v": jnp.array([[2e19], [-2e19], [0.0]])},
                          edges=None, senders=jnp.array([0, 1], jnp.int32), receivers=jnp.array([2, 2], jnp.int32),
                          n_node=jnp.array([3]), n_edge=jnp.array([2]), globals=None)

    def phi(s, d, e):
        return {"logit": s["s"], "v": s["v"]}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(mb["logit"])[:, None] * mb["v"])

    compiled, reference = _pair(phi, rho, backend=backend)
    ds = jnp.full((3,), 1e20, jnp.float32)  # α·ds = 5e19 on both edges, T = 1e20: dα = 0 exactly

    def tangent(layer):
        f = lambda s: layer(g._replace(nodes={**g.nodes, "s": s})).nodes
        return jax.jvp(f, (g.nodes["s"],), (ds,))[1]

    expected = tangent(reference)
    assert np.isfinite(np.asarray(expected)).all()
    assert_close(tangent(compiled), expected)


# ---- max/min ties (split gradient) ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_max_min_ties_split_the_gradient(backend, reduce):
    rng = np.random.default_rng(3)
    g = _graph(rng, 12, 60, 5, duplicates=6)
    agg = getattr(jgnn, reduce)

    def phi(s, d, e):
        return jax.nn.relu(s["h"] - d["h"]) * 2.0 + s["h"] * d["h"]  # ReLU zeros and duplicate edges tie

    compiled, reference = _pair(phi, lambda mb, node: agg(mb), backend=backend)
    check_against_reference(_h(compiled), _h(reference), g)
    assert _fused(jgnn.explain(compiled, g), f"gather_reduce({reduce})")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_float64_ties_split_the_gradient_in_float64(backend, reduce):
    """Three tied edges share the tangent in thirds to float64 precision, as JAX's own segment max does (a
    float32 1/3 is off by 1e-8). The oracle is plain JAX, since jgnn's reference backend shares the rule."""
    with x64():
        h = jnp.asarray(np.random.default_rng(5).normal(size=(4, 6)), jnp.float64)
        senders, receivers = jnp.asarray([0, 0, 0, 2, 3, 3, 3, 1, 2]), jnp.asarray([1, 1, 1, 1, 2, 2, 2, 0, 3])
        g = jraph.GraphsTuple(nodes={"h": h}, edges=None, senders=senders, receivers=receivers,
                              n_node=jnp.asarray([4]), n_edge=jnp.asarray([9]), globals=None)
        compiled = jgnn.message_passing(lambda s, d, e: s["h"] * 1.0, lambda mb, node: getattr(jgnn, reduce)(mb),
                                        lambda node, agg: {"h": agg}, backend=backend)
        segment = getattr(jax.ops, f"segment_{reduce}")
        check_against_reference(lambda x: compiled(g._replace(nodes={"h": x})).nodes["h"],
                                lambda x: segment(x[senders], receivers, 4), h, dtype=np.float64)


# ---- (a) integer index arithmetic, E ≤ N ------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fill", [0.0, "edge"])
def test_a_shared_vector_as_long_as_the_edge_list_is_not_split_into_edge_blocks(backend, fill):
    """With 4 edges and 4 features, a dropout mask drawn once for all edges (broadcast along the features) is as
    long as the edge list; it must not be read as one value per edge, nor ``where``'s fill resized with the edges
    (fuzz campaign 20261400: wrong messages, or a broadcast that failed, on ``pallas_interpret``)."""
    key = jax.random.PRNGKey(3)

    def phi(s, d, e):
        keep = jax.random.uniform(key, (4,)) < 0.5
        other = 0.0 if fill == 0.0 else e["w"] * d["h"]
        return {"m": jnp.where(keep, s["h"] * 2.0, other) + d["h"]}

    layer, ref = _pair(phi, lambda mb, node: {"a": jgnn.sum(mb["m"])}, lambda node, agg: {"h": agg["a"]},
                       backend=backend)
    rng = np.random.default_rng(11)
    g = jraph.GraphsTuple(nodes={"h": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)},
                          edges={"w": jnp.asarray(rng.normal(size=(4, 1)), jnp.float32)},
                          senders=jnp.array([0, 1, 2, 0]), receivers=jnp.array([1, 2, 0, 0]),
                          n_node=jnp.array([3]), n_edge=jnp.array([4]), globals=None)
    check_against_reference(_h(layer), _h(ref), g)


@pytest.mark.parametrize("backend", BACKENDS)
def test_typed_weights_with_fewer_edges_than_nodes(backend):
    rng = np.random.default_rng(11)
    g = _graph(rng, 30, 12, 6, edge_types=3, node_types=2)
    w = jnp.asarray(rng.normal(size=(3, 6, 4)), jnp.float32)

    def phi(s, d, e):
        return s["h"] @ w[e["type"]] + (e["type"] * 2 + 1).astype(jnp.float32)

    compiled, reference = _pair(phi, backend=backend)
    check_against_reference(_h(compiled), _h(reference), g)


# ---- (d) linear splitting and lifting next to constants ---------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_pieces_are_not_split_and_edge_constants_are_not_lifted(backend):
    rng = np.random.default_rng(5)
    g = _graph(rng, 9, 40, 6)  # N ≠ E
    w = jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)

    def program(graph):
        x = graph.nodes["h"]
        plus_one = (x[graph.senders] + 1.0) @ w
        ramp = (x[graph.senders] @ w) * jnp.arange(graph.senders.shape[0], dtype=jnp.float32)[:, None]
        return jax.ops.segment_sum(plus_one + ramp, graph.receivers, 9)

    check_against_reference(jgnn.compile(program, backend=backend), program, g)
    skipped = jgnn.explain(jgnn.compile(program, backend=backend), g).codes(Pass.BROADCAST_REORDER, applied=False)
    assert Reason.UNGATHERED_EDGE_OPERAND in skipped


# ---- (e) ones-like counts and two graphs of different sizes -----------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_segment_mean_of_jraph_and_two_graphs_in_one_function(backend):
    rng = np.random.default_rng(2)
    g1, g2 = _graph(rng, 10, 30, 4), _graph(rng, 17, 25, 4)

    def program(a, b):
        ma = jraph.segment_mean(a.nodes["h"][a.senders], a.receivers, 10)
        mb = jraph.segment_softmax(b.nodes["h"][b.senders] * 2.0, b.receivers, 17)
        return ma, jax.ops.segment_sum(mb * b.nodes["h"][b.receivers], b.receivers, 17)

    compiled = jgnn.compile(program, backend=backend)
    check_against_reference(compiled, program, g1, g2)
    assert not jgnn.explain(compiled, g1, g2).fallbacks


# ---- (f) negative and out-of-range ids under jit --------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_and_out_of_range_ids_follow_jnp_semantics(backend):
    rng = np.random.default_rng(9)
    g = _graph(rng, 10, 30, 4)
    senders = np.asarray(g.senders).copy()
    receivers = np.asarray(g.receivers).copy()
    senders[0], receivers[1], receivers[2], senders[3] = -1, -3, 12, 15  # wrap, drop, drop, clamp
    g = g._replace(senders=jnp.asarray(senders), receivers=jnp.asarray(receivers))

    def phi(s, d, e):
        return {"m": jnp.tanh(s["h"] + d["h"]), "logit": jnp.sum(s["h"] * d["h"], -1, keepdims=True)}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(mb["logit"]) * mb["m"]) + jgnn.max(mb["m"])

    compiled, reference = _pair(phi, rho, backend=backend)
    # validate() rejects such ids on concrete arrays; under jit they follow jraph's semantics.
    check_against_reference(lambda g: compiled.compiled(g).nodes, lambda g: reference.reference(g).nodes, g)


# ---- (h) float64, complex ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "softmax"])
def test_float64_is_float64_accurate(backend, reduce):
    rng = np.random.default_rng(4)
    with x64():
        g = _graph(rng, 11, 40, 5, dtype=jnp.float64)

        def phi(s, d, e):
            return {"m": jnp.sin(s["h"] * 3.0 + d["h"]), "logit": jnp.sum(s["h"] * d["h"], -1, keepdims=True)}

        def rho(mb, node):
            if reduce == "softmax":
                return jgnn.sum(jgnn.softmax(mb["logit"]) * mb["m"])
            return getattr(jgnn, reduce)(mb["m"])

        compiled, reference = _pair(phi, rho, backend=backend)
        check_against_reference(_h(compiled), _h(reference), g, dtype=np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_ids_under_x64_fuse_and_follow_jnp_semantics(backend):
    """x64 graphs carry int64 ids, which jnp indexing wraps then narrows to int32 and `jax.ops.segment_sum`
    narrows then drops: the gathers read the narrowed copy, so they did not fuse with the reduction
    (`DIFFERENT_INDICES`)."""
    rng = np.random.default_rng(17)
    with x64():
        g = _graph(rng, 10, 30, 4, dtype=jnp.float64)
        senders, receivers = np.array(g.senders, np.int64), np.array(g.receivers, np.int64)
        # Gathers wrap negative ids, reductions drop them. (Ids past the end are left out: jnp clamps their reads,
        # and JAX's reverse mode drops the cotangent of a clamped read, which jgnn's gradient does not.)
        senders[0], receivers[1] = -1, -3
        g = g._replace(senders=jnp.asarray(senders), receivers=jnp.asarray(receivers))
        assert g.senders.dtype == jnp.int64

        def program(graph):
            h = graph.nodes["h"]
            logits = jnp.sum(h[graph.senders] * h[graph.receivers], -1)
            alpha = jraph.segment_softmax(logits, graph.receivers, 10)
            return (jax.ops.segment_sum(alpha[:, None] * h[graph.senders], graph.receivers, 10)
                    + jax.ops.segment_max(jnp.tanh(h[graph.senders]), graph.receivers, 10))

        compiled = jgnn.compile(program, backend=backend)
        report = jgnn.explain(compiled, g)
        assert Reason.DIFFERENT_INDICES not in report.codes(Pass.FUSE)
        assert len(report.kernels) == 2
        check_against_reference(compiled, program, g, dtype=np.float64)


def test_complex_sums():
    rng = np.random.default_rng(6)
    g = _graph(rng, 8, 20, 3)
    g = g._replace(nodes={"h": jnp.asarray(rng.normal(size=(8, 3)) + 1j * rng.normal(size=(8, 3)), jnp.complex64)})
    compiled, reference = _pair(lambda s, d, e: s["h"] * jnp.conj(d["h"]), lambda mb, n: jgnn.sum(mb))
    assert_close(jax.jit(_h(compiled))(g), _h(reference)(g))
    # (h) complex derivatives too: reverse mode of a real loss, and forward mode along a complex tangent
    h = g.nodes["h"]
    ct, t = (jnp.asarray(rng.normal(size=(8, 3)) + 1j * rng.normal(size=(8, 3)), jnp.complex64) for _ in range(2))
    on = lambda layer: lambda x: _h(layer)(g._replace(nodes={"h": x}))  # noqa: E731
    loss = lambda layer: lambda x: jnp.sum(jnp.real(on(layer)(x) * ct))  # noqa: E731
    assert_close(jax.jit(jax.grad(loss(compiled)))(h), jax.grad(loss(reference))(h))
    assert_close(jax.jit(lambda x, dx: jax.jvp(on(compiled), (x,), (dx,)))(h, t), jax.jvp(on(reference), (h,), (t,)))


# ---- (i) random keys, softmax of softmax -------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_over_keys_key_features_and_nested_softmax(backend):
    rng = np.random.default_rng(8)
    g = _graph(rng, 10, 35, 4)
    key = jax.random.key(3)
    g = g._replace(edges={"k": jax.random.bits(jax.random.key(1), (35,), jnp.uint32)})

    def phi(s, d, e):
        noise = jax.random.uniform(key, s["h"].shape)
        return {"m": s["h"] * noise + (e["k"] % 7).astype(jnp.float32), "logit": jnp.sum(s["h"], keepdims=True)}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(jgnn.softmax(mb["logit"])) * mb["m"])

    for remat in ("auto", "edges", "none"):
        compiled = jgnn.message_passing(phi, rho, backend=backend, remat=remat)
        reference = jgnn.message_passing(phi, rho, backend="reference")
        check_against_reference(lambda h: compiled(g._replace(nodes={"h": h})).nodes,
                                lambda h: reference(g._replace(nodes={"h": h})).nodes, g.nodes["h"])


# ---- (n) integers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_messages_are_exact(backend):
    rng = np.random.default_rng(12)
    g = _graph(rng, 6, 40, 1)
    big = jnp.asarray(rng.integers(2**24, 2**25, (6, 2)), jnp.int32)
    g = g._replace(nodes={"h": big})
    for reduce in ("sum", "max", "min"):
        compiled, reference = _pair(lambda s, d, e: s["h"] + 1, lambda mb, n, r=reduce: getattr(jgnn, r)(mb),
                                    backend=backend)
        np.testing.assert_array_equal(jax.jit(_h(compiled))(g), _h(reference)(g))


# ---- (p), (q) degrees, composite ids, external ids --------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_degree_counted_from_a_ones_like_mailbox(backend):
    rng = np.random.default_rng(13)
    g = _graph(rng, 12, 50, 3)

    def rho(mb, node):
        degree = jgnn.sum(jnp.ones_like(mb[:, :1]))
        return jgnn.sum(mb) / jnp.maximum(degree, 1.0) + degree

    compiled, reference = _pair(lambda s, d, e: s["h"] * 2.0, rho, backend=backend)
    check_against_reference(_h(compiled), _h(reference), g)


def test_mailbox_length_is_rejected():
    rng = np.random.default_rng(13)
    g = _graph(rng, 12, 50, 3)
    layer = jgnn.message_passing(lambda s, d, e: s["h"], lambda mb, n: jgnn.sum(mb) / mb.shape[0],
                                 backend="reference")
    with pytest.raises(jgnn.UnsupportedMailboxOp):
        layer(g)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_relation_segment_ids_and_external_ids_do_not_fall_back(backend):
    rng = np.random.default_rng(14)
    relations = 3
    g = _graph(rng, 10, 40, 4, edge_types=relations)
    negatives = jnp.asarray(rng.integers(0, 10, 15), jnp.int32)

    def program(graph, neg):
        x = graph.nodes["h"]
        ids = graph.receivers * relations + graph.edges["type"]
        per_relation = jax.ops.segment_sum(x[graph.senders], ids, 10 * relations).reshape(10, relations, 4)
        count = jax.ops.segment_sum(jnp.ones_like(ids, jnp.float32), ids, 10 * relations).reshape(10, relations, 1)
        mean = jnp.sum(per_relation / jnp.maximum(count, 1.0), axis=1)
        return mean, jnp.sum(x[neg] * x[neg[::-1]], -1)

    compiled = jgnn.compile(program, backend=backend)
    check_against_reference(compiled, program, g, negatives)
    assert not jgnn.explain(compiled, g, negatives).fallbacks


# ---- (j) forward mode -------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_jacfwd_and_linearize_through_fused_layers(backend):
    rng = np.random.default_rng(15)
    g = _graph(rng, 7, 20, 3)

    def phi(s, d, e):
        return {"m": jnp.tanh(s["h"] * d["h"]), "logit": jnp.sum(s["h"], keepdims=True)}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(mb["logit"]) * mb["m"]) + jgnn.max(mb["m"]) + jgnn.mean(mb["m"])

    compiled, reference = _pair(phi, rho, backend=backend)
    f = lambda h, layer: layer(g._replace(nodes={"h": h})).nodes
    h = g.nodes["h"]
    assert_close(jax.jit(jax.jacfwd(lambda x: f(x, compiled)))(h), jax.jacfwd(lambda x: f(x, reference))(h))
    y, lin = jax.linearize(lambda x: f(x, compiled), h)
    y_ref, lin_ref = jax.linearize(lambda x: f(x, reference), h)
    assert_close(lin(h), lin_ref(h))


def test_second_order_derivatives_through_fused_layers(backend="xla"):
    """Hessian-vector products (forward over reverse): the softmax weight's snap to the saved max kept no derivative
    in the scores at the edges attaining it (26× off for GAT), and forward mode over a backward op reducing per
    edge crashed."""
    rng = np.random.default_rng(16)
    with x64():
        g = _graph(rng, 7, 20, 4, dtype=jnp.float64)

        def phi(s, d, e):
            return {"m": jnp.tanh(s["h"] * d["h"]), "logit": jnp.sum(s["h"] + 2.0 * d["h"], keepdims=True)}

        def rho(mb, node):
            return jgnn.sum(jgnn.softmax(mb["logit"]) * mb["m"]) + jgnn.max(mb["m"])

        compiled, reference = _pair(phi, rho, backend=backend)
        loss = lambda layer: lambda h: jnp.sum(jnp.sin(layer(g._replace(nodes={"h": h})).nodes))
        h = g.nodes["h"]
        t = jnp.asarray(rng.normal(size=h.shape))
        hvp = lambda layer: jax.jvp(jax.grad(loss(layer)), (h,), (t,))[1]
        assert_close(jax.jit(lambda: hvp(compiled))(), hvp(reference), terms=20)


# ---- 16-bit rounding that XLA keeps --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_sixteen_bit_result_is_settled_as_a_correctly_rounded_convert(dtype):
    """`edge_fn._settle` (``reduce_precision``, with float16's subnormals on their own grid) gives the value a
    correctly rounded convert gives (ml_dtypes' numpy cast), at every magnitude: subnormals, ties to even,
    overflow to inf, NaN, signed zeros. Its tangent is the tangent's convert."""
    from jgnn.ops import edge_fn as ef

    rng = np.random.default_rng(20261128)
    info = jnp.finfo(dtype)
    x = rng.normal(size=20000) * 10.0 ** rng.uniform(-45, 39, size=20000)
    tiny, sub = float(info.tiny), float(info.smallest_subnormal)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, float(info.max) * 1.001, tiny, tiny * 0.999, -tiny * 0.5,
             sub * 0.5, sub * 0.51, sub * 1.5, sub * 2.5, 1.0 + float(info.eps) / 2, 1.0 + 1.5 * float(info.eps)]
    with np.errstate(over="ignore"):
        x = np.concatenate([x, edges]).astype(np.float32)
        want = x.astype(dtype)
    got = np.asarray(jax.jit(lambda y: ef._settle(y, np.dtype(dtype)))(x))
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got.astype(np.float32)) & np.isnan(x))
    assert same.all(), (x[~same][:4], got[~same][:4], want[~same][:4])
    t = rng.normal(size=8).astype(np.float32)
    _, tangent = jax.jvp(lambda y: ef._settle(y, np.dtype(dtype)), (x[:8],), (t,))
    np.testing.assert_array_equal(np.asarray(tangent), t.astype(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_tangents_on_tied_scores_centre_to_zero_fused_or_not(backend):
    """One tie rule for the softmax's tangent, fused or not: rows whose scores all tie (duplicate edges) and whose
    score tangents are equal have weights that do not move, so ``dα`` and ``d(Σ α v)`` are exactly 0. Both
    centre the tangents on the ties' largest (`tangent_shift`). The unfused op took their mean, whose rounding
    left nonzero weight tangents (about ``6e-16``) in 22 of these 300 edges; the fused op already passed."""
    rng = np.random.default_rng(11)
    sizes = np.resize([3, 5, 6, 7, 9, 11, 13], 40)
    ids = jnp.asarray(np.repeat(np.arange(sizes.size), sizes), jnp.int32)
    ds = jnp.asarray(np.repeat(rng.normal(size=sizes.size), sizes), jnp.float32)
    s = jnp.full(ids.shape, 2.0, jnp.float32)
    weights = lambda x: segment_softmax(x, ids, num_segments=sizes.size, index=Index.DST)
    _, d_alpha = jax.jit(lambda x, t: jax.jvp(weights, (x,), (t,)))(s, ds)
    np.testing.assert_array_equal(d_alpha, np.zeros(ids.shape, np.float32))

    graph = jraph.GraphsTuple(nodes={"h": jnp.asarray(rng.normal(size=(sizes.size, 4)), jnp.float32),
                                     "s": jnp.zeros((sizes.size,), jnp.float32)},
                              edges=None, senders=ids, receivers=ids, n_node=jnp.array([sizes.size]),
                              n_edge=jnp.array([ids.shape[0]]), globals=None)
    layer, _ = _attention_layer(backend, lambda s, d, e: s["s"] + 2.0)
    out = lambda t: layer(graph._replace(nodes={**graph.nodes, "s": t})).nodes
    node_ds = jnp.asarray(rng.normal(size=sizes.size), jnp.float32)
    _, d_out = jax.jit(lambda t, dt: jax.jvp(out, (t,), (dt,)))(graph.nodes["s"], node_ds)
    np.testing.assert_array_equal(d_out, np.zeros_like(d_out))
