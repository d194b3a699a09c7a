"""Rows that no edge reads (isolated nodes, receivers only, jraph padding) holding NaN or ±inf (issue 12, "NaN
propagation backward").

`broadcast_reorder` runs ``f(h[src])`` as ``f(h)[src]``: ``f`` runs on every node row. A row that no edge reads
has cotangent 0 there, so a non-finite row would give ``inf · 0 = NaN`` in the gradient of a weight of ``f``
(and a non-finite weight would give NaN in the gradient of such a row), where the reference never forms the
product. Gradients and tangents must equal the reference's: NaN/±inf positions exactly, values to rtol.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from checks import check_against_reference

import jgnn
from jgnn.report import Pass, Reason

BACKENDS = ["xla", "pallas_interpret"]
N, D, K = 10, 6, 4


def _graph(rng) -> jraph.GraphsTuple:
    """Edges among nodes 0..6, three parallel edges per sender (more edges than nodes, so the edge work is lifted
    to the nodes; one receiver per sender, so no sum of infinities is reassociated); node 7 only receives, nodes
    8 and 9 are isolated."""
    senders = np.repeat(np.array([0, 1, 2, 3, 4, 5, 6], np.int32), 3)
    receivers = np.repeat(np.array([1, 2, 0, 7, 5, 7, 3], np.int32), 3)
    h = rng.normal(size=(N, D)).astype(np.float32)
    return jraph.GraphsTuple(nodes=jnp.asarray(h), edges=None, senders=jnp.asarray(senders),
                             receivers=jnp.asarray(receivers), n_node=jnp.array([N]),
                             n_edge=jnp.array([senders.size]), globals=None)


def _poison(nodes, rows):
    """NaN, +inf and -inf in rows no edge's sender reads."""
    h = np.asarray(nodes).copy()
    for r, value in zip(rows, (np.nan, np.inf, -np.inf), strict=False):
        h[r, ::2] = value
    return jnp.asarray(h)


def _weights(rng, inf_weight: bool = False):
    w = rng.normal(size=(D, K)).astype(np.float32)
    if inf_weight:
        w[1, 2] = np.inf
    return {"w": jnp.asarray(w), "a_src": jnp.asarray(rng.normal(size=(K,)), jnp.float32),
            "a_dst": jnp.asarray(rng.normal(size=(K,)), jnp.float32)}


def _gcn_jraph(graph: jraph.GraphsTuple, params):
    messages = graph.nodes[graph.senders] @ params["w"]
    return jax.ops.segment_sum(messages, graph.receivers, graph.nodes.shape[0])


def _gat_phi(s, d, p):
    z = s @ p["w"]
    logit = jax.nn.leaky_relu(z @ p["a_src"] + (d @ p["w"]) @ p["a_dst"], 0.2)
    return {"logit": logit, "v": z}


def _gat_rho(mb, node):
    return jgnn.sum(jgnn.softmax(mb["logit"])[:, None] * mb["v"])


def _gat_layer(backend):
    def apply(graph, params):
        layer = jgnn.message_passing(lambda s, d, e: _gat_phi(s, d, params), _gat_rho, backend=backend)
        return layer(graph).nodes

    return apply


def _programs(backend):
    compiled = jgnn.compile(_gcn_jraph, backend=backend)
    return {"jraph": lambda g, p: compiled(g, p), "gat": _gat_layer(backend)}


def _as_args(graph, params):
    """The graph's features and the weights as the differentiated arguments."""
    return lambda fn: (lambda h, p: fn(graph._replace(nodes=h), p))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", ["jraph", "gat"])
@pytest.mark.parametrize("poisoned", ["isolated", "receiver_only"])
def test_nonfinite_unread_rows_give_the_reference_gradients(backend, program, poisoned):
    rng = np.random.default_rng(12)
    g = _graph(rng)
    rows = {"isolated": (8, 9), "receiver_only": (7,)}[poisoned]
    # GAT reads destination rows too: a receiver-only row is read there (its NaN reaches the reference's result).
    if program == "gat" and poisoned == "receiver_only":
        rows = (9,)
    g = g._replace(nodes=_poison(g.nodes, rows))
    params = _weights(rng)
    wrap = _as_args(g, params)
    check_against_reference(wrap(_programs(backend)[program]), wrap(_programs("reference")[program]),
                            g.nodes, params)


@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_weight_gives_zero_gradient_on_unread_rows(backend):
    """The gradient of an unread row is 0 in the reference even when a weight is infinite (0 · inf otherwise)."""
    rng = np.random.default_rng(13)
    g = _graph(rng)
    params = _weights(rng, inf_weight=True)
    wrap = _as_args(g, params)
    check_against_reference(wrap(_programs(backend)["jraph"]), wrap(_programs("reference")["jraph"]),
                            g.nodes, params)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_jraph_padding_rows(backend):
    """`jraph.pad_with_graphs` adds nodes; padding edges read only the first of them. NaN in the others."""
    rng = np.random.default_rng(14)
    g = _graph(rng)
    padded = jraph.pad_with_graphs(g, n_node=N + 4, n_edge=g.senders.shape[0] + 3, n_graph=2)
    h = np.asarray(padded.nodes).copy()
    h[N + 1:] = np.nan
    h[N + 2, 1] = np.inf
    padded = padded._replace(nodes=jnp.asarray(h))
    params = _weights(rng)
    wrap = _as_args(padded, params)
    for name in ("jraph", "gat"):
        check_against_reference(wrap(_programs(backend)[name]), wrap(_programs("reference")[name]),
                                padded.nodes, params, terms=8)  # GAT: cancelling sums of 3 edges


def _shared_weight(graph: jraph.GraphsTuple, params):
    """``h[src] @ W`` and ``h[dst] @ W`` are one ``h @ W`` on the nodes (CSE), then each goes its own way."""
    z_src, z_dst = graph.nodes[graph.senders] @ params["w"], graph.nodes[graph.receivers] @ params["w"]
    messages = jnp.tanh(z_src * params["a_src"]) + z_dst * params["a_dst"]
    return jax.ops.segment_sum(messages, graph.receivers, graph.nodes.shape[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_lifted_matmul_for_both_ends_keeps_each_chain_exact(backend):
    """Row 7 only receives: ``h @ W`` is masked for the rows either end reads, so row 7 stays real there (its
    NaN reaches W's gradient, as in the reference); the source chain (``a_src``) must not see it."""
    rng = np.random.default_rng(17)
    g = _graph(rng)
    g = g._replace(nodes=_poison(g.nodes, (7, 8)))
    params = _weights(rng)
    wrap = _as_args(g, params)
    compiled = jgnn.compile(_shared_weight, backend=backend)
    reference = jgnn.compile(_shared_weight, backend="reference")
    # a row's gradient sums 3 parallel edges x K lanes of products that cancel; a GPU kernel sums them in
    # another order (2.2e-5 relative on an H100 at terms=1)
    check_against_reference(wrap(compiled), wrap(reference), g.nodes, params, terms=3 * K)


def _with_self_loops(graph: jraph.GraphsTuple, params):
    n = graph.nodes.shape[0]
    loops = jnp.arange(n, dtype=graph.senders.dtype)
    senders, receivers = jnp.concatenate([graph.senders, loops]), jnp.concatenate([graph.receivers, loops])
    return jax.ops.segment_sum(graph.nodes[senders] @ params["w"], receivers, n)


@pytest.mark.parametrize("program, masked", [(_gcn_jraph, True), (_with_self_loops, False)])
def test_lifted_chains_say_whether_unread_rows_are_masked(program, masked):
    """A self-loop per node (ids that append ``arange(N)``) reads every row: no mask is needed there."""
    rng = np.random.default_rng(15)
    g = _graph(rng)
    report = jgnn.explain(program, g, _weights(rng))
    lifted = [d for d in report.decisions if d.by == Pass.BROADCAST_REORDER and d.code == Reason.LIFTED]
    assert lifted and all(d.get("masked_unread") is masked for d in lifted)
    assert not report.fallbacks


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_layers_inner_call_with_a_looped_layout_reads_every_row_and_the_layouts_csr(backend):
    """How a bipartite `jgnn.nn` layer calls its inner layer: the loops appended outside it, passed as graph
    arguments with a ``self_loops`` layout. The layout names those edges, so the fused op walks its CSR (on the
    kernels) and no lifted op masks a row (every node has a loop). Values and gradients equal the reference's;
    the same layer on the graph without loops and a plain layout still masks (nodes 7 to 9 send nothing)."""
    from jgnn.layout import GraphLayout, with_self_loops

    rng = np.random.default_rng(16)
    g = _graph(rng)
    params = _weights(rng)
    ref = _gat_layer("reference")
    looped, lay = with_self_loops(g), GraphLayout.from_graph(g, self_loops=True)
    inner = jgnn.message_passing(lambda s, d, e: {"logit": jnp.sum(s @ params["w"]), "v": s @ params["w"]},
                                 lambda mb, node: jgnn.sum(jgnn.softmax(mb["logit"])[:, None] * mb["v"]),
                                 backend=backend)
    for graph, layout, masked, csr in [(looped, lay, False, Reason.CSR_FROM_LAYOUT),
                                       (g, GraphLayout.from_graph(g), True, Reason.CSR_FROM_LAYOUT),
                                       (looped, None, True, Reason.CSR_SORTED_IN_PROGRAM)]:
        report = jgnn.explain(inner, graph, layout=layout)
        lifted = [d for d in report.decisions if d.by == Pass.BROADCAST_REORDER and d.code == Reason.LIFTED]
        assert lifted and all(d.get("masked_unread") is masked for d in lifted), (layout, lifted)
        if backend == "pallas_interpret":
            assert [k.get("csr") for k in report.kernels] == [csr]
    wrap = _as_args(looped, params)
    check_against_reference(wrap(lambda h, p: jgnn.message_passing(
        lambda s, d, e: _gat_phi(s, d, p), _gat_rho, backend=backend)(h, layout=lay).nodes),
        wrap(ref), looped.nodes, params)


@pytest.mark.parametrize("backend", BACKENDS)
def test_self_loops_appended_inside_the_layer_read_every_row(backend):
    """``layer(graph, self_loops=True)`` (how GCNConv and GATConv call their inner layer) appends the loops inside
    the compiled program: the compiler sees that every node sends one, so no lifted op masks a row, with or
    without a ``self_loops`` layout (which then names the edges: its CSR is walked). Rows 8 and 9 send only their
    loop and hold NaN and inf: the gradients and tangents have the reference's NaN and inf, to the position."""
    from jgnn.layout import GraphLayout

    rng = np.random.default_rng(18)
    g = _graph(rng)
    g = g._replace(nodes=_poison(g.nodes, [8, 9]))
    params = _weights(rng)

    def layer(backend, p):
        return jgnn.message_passing(lambda s, d, e: _gat_phi(s, d, p), _gat_rho, backend=backend)

    lay = GraphLayout.from_graph(g, self_loops=True)
    for layout, csr in [(None, Reason.CSR_SORTED_IN_PROGRAM), (lay, Reason.CSR_FROM_LAYOUT)]:
        report = jgnn.explain(layer(backend, params), g, None, self_loops=True, layout=layout)
        lifted = [d for d in report.decisions if d.by == Pass.BROADCAST_REORDER and d.code == Reason.LIFTED]
        assert lifted and not any(d.get("masked_unread") for d in lifted), (layout, lifted)
        if backend == "pallas_interpret":
            assert [k.get("csr") for k in report.kernels] == [csr]
    wrap = _as_args(g, params)
    check_against_reference(wrap(lambda h, p: layer(backend, p)(h, self_loops=True, layout=lay).nodes),
                            wrap(lambda h, p: layer("reference", p)(h, self_loops=True).nodes), g.nodes, params)


@pytest.mark.parametrize("make", [lambda: jgnn.nn.GCNConv(4), lambda: jgnn.nn.GATConv(4, num_heads=2)],
                         ids=["gcn", "gat"])
def test_layers_that_add_self_loops_keep_no_copy_of_wide_features(make):
    """GCNConv and GATConv append their loops inside their inner layer, so without a layout no lifted ``x @ W``
    masks unread rows: a training step's temporaries hold no ``[N, F]`` copy of the (wide) input features."""
    rng = np.random.default_rng(19)
    n, f, e = 2000, 512, 6000  # nodes 1,800 to 1,999 send nothing but their loop
    graph = jraph.GraphsTuple(nodes=jnp.asarray(rng.normal(size=(n, f)), jnp.float32), edges=None,
                              senders=jnp.asarray(rng.integers(0, 1800, e), jnp.int32),
                              receivers=jnp.asarray(rng.integers(0, n, e), jnp.int32), n_node=jnp.array([n]),
                              n_edge=jnp.array([e]), globals=None)
    module = make()
    params = module.init(jax.random.key(0), graph)
    step = jax.jit(jax.grad(lambda p, g: jnp.sum(jnp.sin(module.apply(p, g).nodes))))
    temp = step.lower(params, graph).compile().memory_analysis().temp_size_in_bytes  # the graph: an argument
    assert temp < n * f * 4, temp


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_layout_in_which_every_node_sends_needs_no_mask(backend):
    """The layout counts on the host whether every node occurs among the senders (receivers): with edges out of
    nodes 7 to 9 too, the lifted ``h @ W`` of a jraph GCN reads every row, so it is not masked; the layout of
    the original graph (nodes 7 to 9 send nothing) still masks, and so does the call without a layout. A
    reversed layout swaps the two counts."""
    from jgnn.layout import GraphLayout

    rng = np.random.default_rng(17)
    g = _graph(rng)
    extra = np.array([7, 8, 9], np.int32)
    full = g._replace(senders=jnp.concatenate([g.senders, extra]),
                      receivers=jnp.concatenate([g.receivers, extra[::-1]]), n_edge=g.n_edge + 3)
    lay = GraphLayout.from_graph(full)
    assert (lay.every_node_sends, lay.every_node_receives) == (True, False)  # nothing reaches nodes 4 and 6
    assert (lay.reverse().every_node_sends, lay.reverse().every_node_receives) == (False, True)
    params = _weights(rng)
    compiled = jgnn.compile(_gcn_jraph, backend=backend)
    for graph, layout, masked in [(full, lay, False), (full, None, True), (g, GraphLayout.from_graph(g), True)]:
        report = jgnn.explain(compiled, graph, params, layout=layout)
        lifted = [d for d in report.decisions if d.by == Pass.BROADCAST_REORDER and d.code == Reason.LIFTED]
        assert lifted and all(d.get("masked_unread") is masked for d in lifted), (layout, lifted)
    check_against_reference(lambda h, p: compiled(full._replace(nodes=h), p, layout=lay),
                            lambda h, p: _gcn_jraph(full._replace(nodes=h), p), full.nodes, params)


def _typed_jraph(graph: jraph.GraphsTuple, params):
    """``x[src] @ W[type[src]]``: the per-node table ``W[type]`` is lifted with ``x``."""
    h, types = graph.nodes["h"], graph.nodes["type"]
    s = graph.senders
    messages = jnp.einsum("ed,edk->ek", h[s], params["w_typed"][types[s]])
    return jax.ops.segment_sum(messages, graph.receivers, h.shape[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_typed_table_read_through_the_source_type(backend):
    """Unread rows 8, 9 have a type no read row has (its table's gradient is 0 in the reference), and the first
    read row holds inf: an unread row must neither put its own NaN nor row 0's inf into type 2's gradient.

    Where the reference's gradient is non-finite (row 0's type), NaN and ±inf may swap, as for every reassociated
    gradient (`tests/fuzz/tolerances.py`): the positions of non-finite values are compared there."""
    rng = np.random.default_rng(16)
    g = _graph(rng)
    h = np.asarray(_poison(g.nodes, (8, 9))).copy()
    h[0, 1] = np.inf
    types = np.array([0, 1, 0, 1, 0, 1, 0, 1, 2, 2], np.int32)
    g = g._replace(nodes={"h": jnp.asarray(h), "type": jnp.asarray(types)})
    params = {"w_typed": jnp.asarray(rng.normal(size=(3, D, K)), jnp.float32)}
    compiled, reference = jgnn.compile(_typed_jraph, backend=backend), jgnn.compile(_typed_jraph, backend="reference")
    report = jgnn.explain(_typed_jraph, g, params)
    assert any(d.code == Reason.COMPACTED_NODE_TYPE and d.applied for d in report.decisions)
    assert any(d.code == Reason.GROUPED_MATMUL and d.applied for d in report.decisions)

    def wrap(fn):
        return lambda x, p: fn(g._replace(nodes={"h": x, "type": g.nodes["type"]}), p)

    check_against_reference(wrap(compiled), wrap(reference), g.nodes["h"], params, grad=False)
    cot = jnp.asarray(rng.normal(size=(N, K)), jnp.float32)
    grads = [jax.jit(jax.grad(lambda x, p, fn=fn: jnp.sum(wrap(fn)(x, p) * cot), argnums=(0, 1)))(
        g.nodes["h"], params) for fn in (compiled, reference)]
    for got, want in zip(*(jax.tree_util.tree_leaves(gr) for gr in grads), strict=True):
        got, want = np.asarray(got), np.asarray(want)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(grads[1][1]["w_typed"][2]) == 0)  # the type no edge reads: exactly 0
