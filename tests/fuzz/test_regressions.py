"""Cases the fuzzer found, pinned: each is checked as the fuzzer checks it, on `pallas_interpret` in the fast tier
and on `xla` with its CUDA lowering in the slow tier.

A CI run's derandomized draw and a developer's can differ in what they catch (the huge-magnitude cases depend
on each machine's floating-point code generation), so a case that once failed is kept here, built from its
specs, and must pass on every machine.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tests.fuzz import checker, rounded, tolerances
from tests.fuzz import programs as pg
from tests.fuzz.graphs import GraphSpec, Pattern, Signature, ValueSpec
from tests.fuzz.strategies import Case


def _compiled_source(lines: list[str], ret: str, extra_args: tuple[str, ...] = ()) -> str:
    """``model(backend, inputs, params)`` running ``fn(graph, *extra_args, P)`` (body ``lines``, returning ``ret``)
    under `jgnn.compile`; each extra argument is the input of that name."""
    args = ", ".join(("graph",) + extra_args + ("P",))
    fn = pg.function("fn", args, lines, ret)
    body = fn.splitlines() + ["compiled = jgnn.compile(fn, backend=backend)"]
    call = ", ".join(["inputs['graph']"] + [f"inputs['{a}']" for a in extra_args] + ["params"])
    return pg.function("model", "backend, inputs, params", body, f"compiled({call})")


def _jraph_gat(width: int = 8, head_width: int = 4) -> pg.Program:
    """`strategies.gat_programs` with features of ``width``, 2 heads of ``head_width``, no bias and no mask."""
    lines = [
        f'query = lambda x: (x @ P["W0"]).reshape(x.shape[0], 2, {head_width})',
        'logit = lambda sent, received, edges: jax.nn.leaky_relu(jnp.sum(sent * P["W1"] + received * P["W2"], '
        '-1), 0.2)[..., None]',
        "update = lambda x: jax.nn.elu(x.reshape(x.shape[0], -1))",
        'out = jraph.GAT(query, logit, update)(graph._replace(nodes=graph.nodes["h"]))',
    ]
    source = _compiled_source(lines, '{"h": out.nodes}')
    sig = Signature(node_feats=(("h", (width,)),), edge_feats=(("m", ()),))
    return pg.Program("jraph_gat", source, sig, (("W0", (width, 2 * head_width)), ("W1", (2, head_width)),
                                                 ("W2", (2, head_width))), frozenset({"jraph_gat"}))


def _typed_differences_softmax() -> pg.Program:
    """Typed messages from the difference of the endpoints, scaled by an edge feature, weighted by a jraph softmax
    of their own scores (campaign 20261600)."""
    lines = ['x = graph.nodes["h"]',
             "s, r = graph.senders, graph.receivers",
             "n = x.shape[0]",
             'm = jnp.einsum("ef,efk->ek", x[s] - x[r], P["W0"][graph.edges["type"]])',
             'm = (m * graph.edges["x"][:, :1]) @ P["W1"]',
             'agg = jax.ops.segment_sum(m * jraph.segment_softmax(jnp.sum(m * P["W2"], -1), r, n)[:, None], r, n)']
    source = _compiled_source(lines, '{"h": agg}')
    sig = Signature(node_feats=(("h", (3,)),), edge_feats=(("x", (4,)),), edge_types=3)
    return pg.Program("segments", source, sig, (("W0", (3, 3, 4)), ("W1", (4, 8)), ("W2", (8,))),
                      frozenset({"typed_weight"}))


def _graph_network_attention_summed() -> pg.Program:
    """`jraph.GraphNetwork` with attention over its edge updates, node and global updates of concatenations
    (campaign 20261600)."""
    source = """
def model(backend, inputs, params):
    def fn(graph, P):
        def update_edge_fn(edges, sent, received, globals_):
            x = jnp.concatenate([sent["h"], received["h"], edges["x"]] + [globals_], -1)
            return {"x": jnp.tanh(x @ P["W0"])}
        def update_node_fn(nodes, sent, received, globals_):
            return {"h": jnp.concatenate([nodes["h"], received["x"]], -1) @ P["W1"]}
        def update_global_fn(nodes, edges, globals_):
            return jnp.concatenate([nodes["h"], edges["x"]] + [globals_], -1) @ P["W2"]
        def attention_logit_fn(edges, sent, received, globals_):
            return jnp.sum(edges["x"] * P["W3"], -1)
        def attention_reduce_fn(edges, weights):
            return jax.tree_util.tree_map(lambda x: x * weights[:, None], edges)
        net = jraph.GraphNetwork(update_edge_fn, update_node_fn, update_global_fn=update_global_fn,
                                 aggregate_edges_for_nodes_fn=jraph.segment_sum,
                                 attention_logit_fn=attention_logit_fn, attention_reduce_fn=attention_reduce_fn)
        out = net(graph)
        return {"nodes": out.nodes, "edges": out.edges["x"], "globals": out.globals}
    compiled = jgnn.compile(fn, backend=backend)
    return compiled(inputs['graph'], params)
"""
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("x", (4,)),), globals_width=3)
    return pg.Program("graph_network", source, sig, (("W0", (9, 4)), ("W1", (5, 1)), ("W2", (8, 3)), ("W3", (4,))),
                      frozenset({"graph_network", "gn_attention"}))


def _range_and_attention_padded() -> pg.Program:
    """A max − min range, a tanh sum and a softmax over head logits from an edge feature, whose values are that
    feature's projection (campaign 20261700)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p1 = src["h"] @ P["W0"]
        p3 = (edge["x"] @ P["W1"]).reshape(2, 4)
        p6 = jax.nn.leaky_relu(jnp.sum(p3 * P["W2"], -1) + edge["b"], 0.2)
        return {"m0": p1, "m1": src["h"], "l": p6, "v": p3}
    def rho(mb, node):
        return {"a_m0": jgnn.max(mb["m0"]) - jgnn.min(mb["m0"]), "a_m1": jgnn.sum(jnp.tanh(mb["m1"])),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"])[..., None] * mb["v"])}
    def psi(node, agg, glob):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1), agg["a_att"].reshape(-1)])
        return {"h": q1 @ P["W3"] + glob @ P["W4"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (3,)),), edge_feats=(("b", (2,)), ("x", (4,))), globals_width=3,
                    node_types=3)
    return pg.Program("message_passing", source, sig, (("W0", (3, 8)), ("W1", (4, 8)), ("W2", (2, 4)),
                                                       ("W3", (19, 4)), ("W4", (3, 4))), frozenset({"softmax"}))


def _typed_chain_max() -> pg.Program:
    """Two typed matmuls after the source gather, then a max: `linear_reorder` makes ``x[s] @ (W0 @ W1)[t]``."""
    lines = ['x = graph.nodes["h"]',
             "m = x[graph.senders]",
             'm = jnp.einsum("ef,efk->ek", m, P["W0"][graph.edges["type"]])',
             'm = jnp.einsum("ef,efk->ek", m, P["W1"][graph.edges["type"]])',
             "agg = jraph.segment_max(m, graph.receivers, x.shape[0])"]
    source = _compiled_source(lines, '{"h": agg}')
    sig = Signature(node_feats=(("h", (8,)),), edge_types=3)
    return pg.Program("typed_chain", source, sig, (("W0", (3, 8, 4)), ("W1", (3, 4, 4))), frozenset({"typed_weight"}))


def _typed_chain_tanh_sum() -> pg.Program:
    """Two typed matmuls after the destination gather, a tanh, a sum and a node update: `linear_reorder` makes
    ``x[r] @ (W0 @ W1)[t]`` (campaign 20261700)."""
    lines = ['x = graph.nodes["h"]',
             "s, r = graph.senders, graph.receivers",
             "n, e = x.shape[0], s.shape[0]",
             "m = x[r]",
             'm = jnp.einsum("ef,efk->ek", m, P["W0"][graph.edges["type"]])',
             'm = jnp.einsum("ef,efk->ek", m, P["W1"][graph.edges["type"]])',
             "m = jnp.tanh(m)",
             "agg = jax.ops.segment_sum(m, r, n)",
             'agg = jnp.tanh(agg @ P["W2"]) + x @ P["W3"]']
    source = _compiled_source(lines, '{"h": agg}')
    sig = Signature(node_feats=(("h", (8,)),), edge_types=3)
    return pg.Program("segments", source, sig, (("W0", (3, 8, 4)), ("W1", (3, 4, 4)), ("W2", (4, 4)),
                                                ("W3", (8, 4))), frozenset({"typed_weight"}))


def _typed_attention_sum() -> pg.Program:
    """Typed messages, a normalised sum, and a softmax over scores from both endpoints and an edge feature, whose
    values are read at the source (campaign 20261201)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p2 = jax.nn.relu(src["h"]) @ P["W0"][edge["type"]]
        p4 = (src["h"] @ P["W1"]).reshape(2, 4)
        p8 = jnp.sum((dst["h"] @ P["W3"]).reshape(2, 4) * P["W4"], -1)
        p11 = jax.nn.leaky_relu(jnp.sum(p4 * P["W2"], -1) + p8 + edge["b"], 0.2)
        return {"m0": p2, "m1": src["h"], "l": p11, "v": p4}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"]), "a_m1": jgnn.sum(mb["m1"]) / (1.0 + jgnn.sum(jnp.abs(mb["m1"]))),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"] * 0.5)[..., None] * mb["v"])}
    def psi(node, agg, glob):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1), agg["a_att"].reshape(-1)])
        return {"h": q1 @ P["W5"] + glob @ P["W6"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (3,)),), edge_feats=(("b", (2,)),), globals_width=3, edge_types=3)
    return pg.Program("message_passing", source, sig, (("W0", (3, 3, 8)), ("W1", (3, 8)), ("W2", (2, 4)),
                                                       ("W3", (3, 8)), ("W4", (2, 4)), ("W5", (19, 4)),
                                                       ("W6", (3, 4))), frozenset({"softmax", "typed_weight"}))


def _node_product_summed() -> pg.Program:
    """A node feature one wide times a shared weight, summed over in-edges, beside typed messages and a softmax
    over heads (campaign 20261600)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p1 = src["h"] @ P["W0"]
        p4 = jnp.concatenate([src["h"], p1])
        p6 = (p4 @ P["W2"]).reshape(2, 4)
        p9 = jax.nn.leaky_relu(jnp.sum(p6 * P["W3"], -1) + edge["b"], 0.2)
        # "t" is read by no reduction, as in the campaign's program: W1 stays, so the params draw as they did
        return {"m0": p4, "m1": p1, "l": p9, "v": p6, "t": src["h"] @ P["W1"][src["type"]]}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"]), "a_m1": jgnn.sum(mb["m1"]),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"] * 0.5)[..., None] * mb["v"])}
    layer = jgnn.message_passing(phi, rho, None, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("b", (2,)),), node_types=3, edge_types=3)
    return pg.Program("message_passing", source, sig, (("W0", (1, 8)), ("W1", (3, 1, 4)), ("W2", (9, 8)),
                                                       ("W3", (2, 4))), frozenset({"softmax", "typed_weight"}))


def _destination_tanh() -> pg.Program:
    """Messages from the destination only, a node-scaled sum and a max, under a tanh (campaign 20261201)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p2 = jnp.concatenate([dst["h"], dst["h"]]) @ P["W0"]
        return {"m0": p2.reshape(2, 1), "m1": p2}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"] * node["h"][0]), "a_m1": jgnn.max(mb["m1"])}
    def psi(node, agg, glob):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1)])
        return {"h": jnp.tanh(q1 @ P["W1"]) @ P["W2"] + glob @ P["W3"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (3,)),), globals_width=3)
    return pg.Program("message_passing", source, sig, (("W0", (6, 2)), ("W1", (4, 8)), ("W2", (8, 4)),
                                                       ("W3", (3, 4))), frozenset())


def _concat_globals() -> pg.Program:
    """The fuzz case that crashed an H100 (`checker.check_cuda_lowering`): messages that concatenate a width-1
    node feature with the globals, and per-head copies stacked, which the per-head kernels would run."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge, glob):
        p1 = jnp.concatenate([src["h"], glob])
        p2 = jnp.stack([src["h"], src["h"]])
        p3 = jnp.concatenate([glob, p2.reshape(2)])
        return {"m0": p3, "m1": p1}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"]) / (1.0 + jgnn.sum(jnp.abs(mb["m0"]))),
                "a_m1": jgnn.sum(mb["m1"] * node["h"][0])}
    def psi(node, agg):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1)])
        q2 = q1 @ P["W0"]
        q3 = jnp.tanh(q2)
        q4 = q3 @ P["W1"]
        q5 = node["h"] @ P["W2"]
        q6 = q4 + q5
        return {"h": q6}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (1,)),), globals_width=3)
    params = (("W0", (9, 8)), ("W1", (8, 4)), ("W2", (1, 4)))
    return pg.Program("message_passing", source.lstrip("\n"), sig, params)


def _hub_mean_by_index() -> pg.Program:
    """A mean over in-edges of rows gathered by an index argument, scaled by an edge feature (campaign 20261128)."""
    lines = ['x = graph.nodes["h"]',
             "s, r = graph.senders, graph.receivers",
             "n, e = x.shape[0], s.shape[0]",
             "m = x[idx]",
             'm = m * graph.edges["x"][:, :1]',
             "agg = jax.ops.segment_sum(m, r, n) / jnp.maximum(jax.ops.segment_sum(jnp.ones_like(m[:, :1]), r, n), 1)"]
    source = _compiled_source(lines, '{"h": agg}', ("idx",))
    sig = Signature(node_feats=(("h", (8,)),), edge_feats=(("x", (4,)),), extras=(("idx", 1100),))
    return pg.Program("segments", source, sig, (), frozenset({"gather_idx_arg", "rho_mean"}))


def _graph_network_concat() -> pg.Program:
    """`jraph.GraphNetwork` whose edge and node updates multiply concatenations by shared weights (campaign
    20261127)."""
    lines = ['def update_edge_fn(edges, sent, received, globals_):',
             '    return {"x": jnp.tanh(jnp.concatenate([sent["h"], received["h"], edges["x"]] + [globals_], -1)'
             ' @ P["W0"])}',
             'def update_node_fn(nodes, sent, received, globals_):',
             '    return {"h": jnp.concatenate([nodes["h"], received["x"]], -1) @ P["W1"]}',
             'net = jraph.GraphNetwork(update_edge_fn, update_node_fn, aggregate_edges_for_nodes_fn=jraph.segment_sum)',
             "out = net(graph)"]
    source = _compiled_source(lines, '{"nodes": out.nodes, "edges": out.edges["x"]}')
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("x", (4,)),), globals_width=3)
    return pg.Program("graph_network", source, sig, (("W0", (9, 4)), ("W1", (5, 1))), frozenset({"graph_network"}))


def _destination_softmax() -> pg.Program:
    """A message-passing program whose softmax scores and values are read from the destination only, beside a
    node-scaled sum and a max, under a tanh MLP (campaign 20261127)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p1 = jnp.stack([edge["x"], edge["x"]])
        p2 = p1.reshape(8) @ P["W0"]
        p3 = p2.reshape(2, 1)
        p5 = dst["h"] @ P["W1"]
        p6 = p5.reshape(2, 1)
        p7 = jnp.sum(p6 * P["W2"], -1)
        return {"m0": p3, "m1": p2, "l": p7, "v": p6}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"] * node["h"][0]), "a_m1": jgnn.max(mb["m1"]),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"])[..., None] * mb["v"])}
    def psi(node, agg):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1), agg["a_att"].reshape(-1)])
        return {"h": jnp.tanh(q1 @ P["W3"]) @ P["W4"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("m", ()), ("x", (4,))), node_types=3, edge_types=3)
    return pg.Program("message_passing", source, sig, (("W0", (8, 2)), ("W1", (1, 2)), ("W2", (2, 1)),
                                                       ("W3", (6, 8)), ("W4", (8, 4))),
                      frozenset({"rho_softmax", "rho_max", "rho_node_scaled", "psi_mlp", "stack"}))



def _range_edge_attention() -> pg.Program:
    """Squared destination features near 1e38 feed a softmax-weighted sum and a max (campaign 20261128, classes
    c and g): the fused sum of ``exp(s − m) v`` overflows before it divides where the reference's weighted terms
    do not, and a gradient entry whose float64 value is −8.6e40 is −inf in the reference and finite in jgnn.
    Both sit at the range edge (`tolerances.at_range_edge`)."""
    source = """
def model(backend, inputs, params):
    P = params
    key = jax.random.PRNGKey(3)
    def phi(src, dst, edge):
        p1 = dst["h"] @ P["W0"]
        p3 = p1 * p1
        p4 = jnp.where((jax.random.uniform(key, (8,), jnp.float32) < 0.75), p3 / 0.75, 0.0)
        p6 = (p4 @ P["W1"]).reshape(2, 1)
        p9 = jax.nn.leaky_relu(jnp.sum(p6 * P["W2"], -1) + edge["b"], 0.2)
        return {"m0": p4, "l": p9, "v": p6, "k": dst["type"] * 16777217 + 3}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"]), "a_k": jgnn.sum(mb["k"]),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"])[..., None] * mb["v"]) + jgnn.max(mb["v"])}
    layer = jgnn.message_passing(phi, rho, None, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (3,)),), edge_feats=(("b", (2,)),), node_types=2)
    return pg.Program("message_passing", source, sig, (("W0", (3, 8)), ("W1", (8, 2)), ("W2", (2, 1))),
                      frozenset())


def _stacked_attention_and_max() -> pg.Program:
    """A bfloat16 softmax-weighted sum of typed values plus their max, scores near 1e19 with near-tied edge
    features (campaign 20261300 at 4029d02, 4 signatures, bfloat16 and float16, ``jvp`` and ``grad`` on
    ``pallas_interpret``)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p1 = jnp.stack([dst["h"], src["h"]])
        p3 = (src["h"] @ P["W0"]).reshape(2, 4)
        p4 = jnp.sum(p3 * P["W1"], -1)
        p7 = jnp.sum((dst["h"] @ P["W2"]).reshape(2, 4) * P["W3"], -1)
        p10 = jax.nn.leaky_relu(p4 + p7 + edge["b"], 0.2)
        return {"m0": p1, "m1": src["h"], "l": p10, "v": p3}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(jnp.tanh(mb["m0"])), "a_m1": jgnn.min(mb["m1"]),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"])[..., None] * mb["v"]) + jgnn.max(mb["v"])}
    layer = jgnn.message_passing(phi, rho, None, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (3,)),), edge_feats=(("x", (4,)), ("b", (2,))), node_types=3, edge_types=1)
    return pg.Program("message_passing", source, sig,
                      (("W0", (3, 8)), ("W1", (2, 4)), ("W2", (3, 8)), ("W3", (2, 4))), frozenset())


def _dropout_mask_as_long_as_the_edge_list() -> pg.Program:
    """A dropout mask ``uniform(key, (4,))`` drawn once for all 4 edges, and a split (campaign 20261400, 270
    float64 cases on ``pallas_interpret``)."""
    source = """
def model(backend, inputs, params):
    P = params
    key = inputs["key"]
    def phi(src, dst, edge):
        p1 = jnp.split(dst["h"], 2)[1]
        p3 = p1 * p1
        p4 = jnp.where((jax.random.uniform(key, (4,), jnp.float32) < 0.75), p3 / 0.75, 0.0)
        return {"m0": p4, "m1": p1}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"] * node["h"][0]), "a_m1": jgnn.sum(jnp.tanh(mb["m1"]))}
    def psi(node, agg):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1)])
        return {"h": jnp.tanh(q1 @ P["W0"]) @ P["W1"] + node["h"] @ P["W2"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(edge_feats=(("b", (2,)),), edge_types=3, extras=(("key", "raw"),))
    return pg.Program("message_passing", source, sig, (("W0", (8, 8)), ("W1", (8, 4)), ("W2", (8, 4))),
                      frozenset({"dropout"}))


def _typed_chain_float16() -> pg.Program:
    """``h[src] @ W0[type] @ W1[type]``, reassociated to ``h[src] @ (W0 @ W1)[type]`` (campaign 20261400, float16
    gradients, 2 cases per backend)."""
    source = """
def model(backend, inputs, params):
    P = params
    def phi(src, dst, edge):
        p2 = src["h"] @ P["W0"][src["type"]] @ P["W1"][src["type"]]
        p5 = (p2 @ P["W3"]).reshape(2, 4)
        p7 = jax.nn.leaky_relu(jnp.sum(p5 * P["W4"], -1), 0.2)
        return {"m0": p2 @ P["W2"], "m1": dst["h"], "l": p7, "v": p5}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"] * node["h"][0]), "a_m1": jgnn.max(mb["m1"]) - jgnn.min(mb["m1"]),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"] * 0.5)[..., None] * mb["v"])}
    def psi(node, agg, glob):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1), agg["a_att"].reshape(-1)])
        return {"h": q1 @ P["W5"] + glob @ P["W6"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (8,)),), edge_feats=(("m", ()),), globals_width=3, node_types=3)
    return pg.Program("message_passing", source, sig,
                      (("W0", (3, 8, 8)), ("W1", (3, 8, 8)), ("W2", (8, 8)), ("W3", (8, 8)), ("W4", (2, 4)),
                       ("W5", (24, 4)), ("W6", (3, 4))), frozenset())


def _graph_network_mean() -> pg.Program:
    """A `jraph.GraphNetwork` with a tanh edge update and `jraph.segment_mean` (campaign 20261400, complex64 on a
    graph with negative and out-of-range receivers, 11 cases per backend)."""
    lines = ['def update_edge_fn(edges, sent, received, globals_):',
             '    return {"x": jnp.tanh(jnp.concatenate([sent["h"], received["h"], edges["x"]], -1) @ P["W0"])}',
             'def update_node_fn(nodes, sent, received, globals_):',
             '    return {"h": jnp.concatenate([nodes["h"], received["x"]], -1) @ P["W1"]}',
             'out = jraph.GraphNetwork(update_edge_fn, update_node_fn, '
             'aggregate_edges_for_nodes_fn=jraph.segment_mean)(graph)']
    sig = Signature(node_feats=(("h", (8,)),), edge_feats=(("x", (4,)),))
    return pg.Program("graph_network", _compiled_source(lines, '{"nodes": out.nodes, "edges": out.edges["x"]}'),
                      sig, (("W0", (20, 4)), ("W1", (12, 8))), frozenset(), complex_ok=True)


def _jraph_gat_edge_bias(width: int = 1, head_width: int = 1, masked: bool = False) -> pg.Program:
    """`jraph.GAT` of features ``width`` wide, 2 heads of ``head_width``, scores plus an edge feature (campaign
    20261128, class b; width 8: campaign 20261400; width 3, heads of 4: FINDINGS-2714b3a's campaign f); with
    ``masked``, −1e9 where the edge feature ``m`` is not positive (campaign 20261700)."""
    logit = 'jnp.sum(sent * P["W1"] + received * P["W2"], -1) + edges["b"]'
    if masked:
        logit = f'jnp.where(edges["m"][:, None] > 0, {logit}, -1e9)'
    lines = [
        f'query = lambda x: (x @ P["W0"]).reshape(x.shape[0], 2, {head_width})',
        f"logit = lambda sent, received, edges: jax.nn.leaky_relu({logit}, 0.2)[..., None]",
        "update = lambda x: jax.nn.elu(x.reshape(x.shape[0], -1))",
        'out = jraph.GAT(query, logit, update)(graph._replace(nodes=graph.nodes["h"]))',
    ]
    sig = Signature(node_feats=(("h", (width,)),), edge_feats=(("b", (2,)),) + ((("m", ()),) if masked else ()))
    return pg.Program("jraph_gat", _compiled_source(lines, '{"h": out.nodes}'), sig,
                      (("W0", (width, 2 * head_width)), ("W1", (2, head_width)), ("W2", (2, head_width))),
                      frozenset({"jraph_gat"} | ({"mask_1e9"} if masked else set())))


def _index_gathered_softmax() -> pg.Program:
    """Rows gathered by an index argument, a jraph softmax over destinations and a weighted sum (campaign
    20261205): at scores near 1e19 XLA recomputed a score inside ``s − m`` with its product fused, every edge of a
    row got ``exp(−1e12) = 0``, and the row's output was 0 where the reference's is −3.3e19. Fixed by
    `edge_fn.shifted_exp` in the forward pass."""
    lines = ['x = graph.nodes["h"]',
             "r, n = graph.receivers, x.shape[0]",
             'm = jnp.tanh(x[idx]) * graph.edges["x"][:, :1]',
             'agg = jax.ops.segment_sum(m * jraph.segment_softmax(jnp.sum(m * P["W0"], -1), r, n)[:, None], r, n)']
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("x", (4,)),), extras=(("idx", 36),))
    return pg.Program("jraph_ops", _compiled_source(lines, '{"h": agg}', ("idx",)), sig, (("W0", (1,)),),
                      frozenset({"softmax"}))


def _difference_of_neighbours() -> pg.Program:
    """``(x_dst − x_src) @ W`` summed, with and without dropout, on near-tied features (campaign 20261205):
    `linear_split` made it ``x_dst @ W − x_src @ W``, two products of unit size whose difference is 1e-5, and
    kept their rounding: outputs 30% off. A difference of one array at two ends is no longer split
    (`Reason.CANCELLING_DIFFERENCE`)."""
    source = """
def model(backend, inputs, params):
    P = params
    key = jax.random.PRNGKey(3)
    def phi(src, dst, edge):
        p1 = src["h"] * src["h"]
        p2 = jnp.concatenate([p1, p1])
        p3 = dst["h"] - src["h"]
        p4 = p3 @ P["W0"]
        p5 = jnp.where((jax.random.uniform(key, (8,), jnp.float32) < 0.75), p4 / 0.75, 0.0)
        return {"m0": p5, "m1": p4}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"]), "a_m1": jgnn.sum(mb["m1"])}
    layer = jgnn.message_passing(phi, rho, None, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (3,)),), edge_feats=(("b", (2,)),), node_types=2, edge_types=3)
    return pg.Program("message_passing", source, sig, (("W0", (3, 8)),), frozenset())


def _overflow_under_an_mlp() -> pg.Program:
    """A softmax-weighted sum of values near 1e38 over rows masked with −1e9 (every weight 1/k), under a tanh MLP
    (campaign 20261205): the fused sum overflows before it divides, and the MLP's ``inf − inf`` makes an output
    NaN whose float64 value is −2.08. A program at the range edge (`tolerances.at_range_edge`)."""
    source = """
def model(backend, inputs, params):
    P = params
    key = jax.random.PRNGKey(3)
    def phi(src, dst, edge):
        p1 = dst["h"] * dst["h"]
        p2 = jnp.where((jax.random.uniform(key, (1,), jnp.float32) < 0.75), p1 / 0.75, 0.0)
        p3 = p2 @ P["W0"]
        p4 = p3.reshape(2, 4)
        p5 = jnp.sum(p4 * P["W1"], -1)
        p6 = dst["h"] @ P["W2"]
        p7 = p6.reshape(2, 4)
        p8 = jnp.sum(p7 * P["W3"], -1)
        p9 = p5 + p8
        p10 = jnp.where(edge["m"] > 0, p9, -1e9)
        p11 = jax.nn.leaky_relu(p10, 0.2)
        p12 = src["type"] * 16777217 + 3
        return {"m0": p2, "m1": src["h"], "l": p11, "v": p4, "k": p12}
    def rho(mb, node):
        return {"a_m0": jgnn.sum(mb["m0"]) / jnp.maximum(jgnn.sum(jnp.ones_like(mb["m0"][:, :1])), 1.0),
                "a_m1": jgnn.sum(mb["m1"] * node["h"][0]), "a_k": jgnn.min(mb["k"]),
                "a_att": jgnn.sum(jgnn.softmax(mb["l"])[..., None] * mb["v"]) + jgnn.max(mb["v"])}
    def psi(node, agg):
        q1 = jnp.concatenate([agg["a_m0"].reshape(-1), agg["a_m1"].reshape(-1), agg["a_att"].reshape(-1)])
        q2 = q1 @ P["W4"]
        q3 = jnp.tanh(q2)
        q4 = q3 @ P["W5"]
        return {"h": q4, "a_k": agg["a_k"]}
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    return layer(inputs["graph"]).nodes
"""
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("m", ()),), node_types=2)
    return pg.Program("message_passing", source, sig, (("W0", (1, 8)), ("W1", (2, 4)), ("W2", (1, 8)),
                                                       ("W3", (2, 4)), ("W4", (10, 8)), ("W5", (8, 4))), frozenset())


def _graph_network_attention_negative_ids() -> pg.Program:
    """jraph's GraphNetwork with attention, its weighted edges returned, on a graph with negative receivers
    (campaign 20261205, at de9c9b3): a wrapped id reads the max of an empty row, −inf, so ``s − m`` is +inf, and
    the forward snap of 05eb179 made ``exp(+inf − +inf) = NaN`` of the reference's inf. Only a finite exponent
    snaps now."""
    source = """
def model(backend, inputs, params):
    def fn(graph, P):
        def update_edge_fn(edges, sent, received, globals_):
            return {"x": jnp.tanh(jnp.concatenate([sent["h"], received["h"], edges["x"]], -1) @ P["W0"])}
        def update_node_fn(nodes, sent, received, globals_):
            return {"h": jnp.concatenate([nodes["h"], received["x"]], -1) @ P["W1"]}
        def attention_logit_fn(edges, sent, received, globals_):
            return jnp.sum(edges["x"] * P["W2"], -1)
        def attention_reduce_fn(edges, weights):
            return jax.tree_util.tree_map(lambda x: x * weights[:, None], edges)
        net = jraph.GraphNetwork(update_edge_fn, update_node_fn, aggregate_edges_for_nodes_fn=jraph.segment_max,
                                 attention_logit_fn=attention_logit_fn, attention_reduce_fn=attention_reduce_fn)
        out = net(graph)
        return {"nodes": out.nodes, "edges": out.edges["x"]}
    compiled = jgnn.compile(fn, backend=backend)
    return compiled(inputs['graph'], params)
"""
    sig = Signature(node_feats=(("h", (1,)),), edge_feats=(("x", (4,)),))
    return pg.Program("graph_network", source, sig, (("W0", (6, 4)), ("W1", (5, 1)), ("W2", (4,))),
                      frozenset({"jraph_graph_network"}))

CASES = {
    # CI at ce3ef70: float32 features near 1e19 saturate every softmax row. The tangent α·ds − α·T cancelled two
    # 1e19 terms (xla: 1e32 where the reference has −5e19), and the Pallas forward's row max, recomputed by
    # XLA in the tangent, missed by 3 ulps, making weights 0 and NaN (pallas_interpret).
    "gat_saturated_jvp": Case(_jraph_gat(), "float32",
                              GraphSpec("small", frozenset({"isolated", "self_loops", "sources"}), 23298),
                              ValueSpec(4584, "huge", ())),
    # CI at 4d01fbb: float32 features near 1e19 on a dense graph, with up to five duplicate edges tied at each
    # row's max. The grad of W0 was 1e31 where the reference has 1e23: the transpose of the softmax tangent, op by
    # op, summed the two halves of each score cotangent over a row separately (two sums of 1e20 that cancel).
    # `jgnn.ops.attention_tangent` now forms each edge's cotangent first, as jraph's backward does.
    "gat_tied_duplicates_grad": Case(_jraph_gat(), "float32", GraphSpec("dense", frozenset(), 314),
                                     ValueSpec(65535, "huge", ())),
    # Class g of FINDINGS-2714b3a, forward mode: a star whose hub has ~15 duplicate in-edges tied at its max, float32
    # features near 1e19. The tangent shift was the mean of the tied edges' tangents, an ulp of 1e19 from each of
    # them, and ``Σ dα V`` made that 3e25 where the reference has 4e18; `tangent_shift` now takes the ties' largest
    # tangent, equal to theirs bit for bit.
    "gat_tied_star_jvp": Case(_jraph_gat(), "float32", GraphSpec("star", frozenset(), 0),
                              ValueSpec(0, "huge", (Pattern("ties", "graph.nodes.h"),))),
    # The same class in reverse mode: a hub of in-degree 1,050 from 40 senders. The score cotangent α (p − Σ α p) left
    # an ulp of p (~1e19) at tied duplicates; W0's gradient was 1.7e27 off where the reference is 3.5e23 off. The
    # backward now centres p on the ties' largest p first (`attention_tangent`, step 0).
    "gat_tied_hub_grad": Case(_jraph_gat(), "float32", GraphSpec("hub", frozenset(), 4),
                              ValueSpec(4, "huge", (Pattern("ties", "graph.nodes.h"),))),
    # Campaign 20261124: negative ids with float32 features near 1e19. The reference's reverse mode gave NaN
    # (0 · inf on an edge that jraph's softmax computes and its segment_sum drops); jgnn equals ``ctᵀ J``.
    # Campaign 20261128 (chunk 20261131, batch 39): float32 features near 1e19 on a sparse graph; pallas_interpret's
    # gradients 1e11 times the reference's. The backward ran its row sums and src/dst pullbacks as kernels and the
    # shared weights' pullback on XLA, whose recomputed values rounded apart, so the score cotangent did not cancel.
    # `attention_tangent._one_lowering` now runs every op of such a backward on XLA.
    "gat_mixed_lowerings_grad": Case(_jraph_gat(3, 1), "float32", GraphSpec("sparse", frozenset({"isolated"}), 261),
                                     ValueSpec(65536, "huge", ())),
    "gat_mixed_lowerings_sorted_grad": Case(_jraph_gat(3, 1), "float32",
                                            GraphSpec("sparse", frozenset({"sorted"}), 57349),
                                            ValueSpec(3492, "huge", ())),
    "gat_negative_ids_grad": Case(_jraph_gat(), "float32", GraphSpec("small", frozenset({"isolated", "negative"}), 0),
                                  ValueSpec(0, "huge", ())),
    # Campaign 20261126 (118 of 1,500 cases): -inf in a few features before a reassociated typed chain. The
    # reference's (x @ W0) @ W1 makes inf - inf = NaN, jgnn's x @ (W0 @ W1) makes -inf, which the max drops: the
    # outputs the reference makes non-finite are not compared, and every other output and gradient is
    # (`checker.REASSOCIATING`).
    "typed_chain_neginf_max": Case(_typed_chain_max(), "float32",
                                   GraphSpec("small", frozenset({"duplicates", "isolated", "sorted"}), 281),
                                   ValueSpec(65301, "normal", (Pattern("neginf", "graph.nodes.h"),))),
    # The first GPU session (H100, 2026-11-26): the grad's per-head kernel concatenated [E, 1] and [E, 3] tiles,
    # which Pallas' Triton lowering rejects ("Only arguments with shape [..., 1] are supported"); the interpreter
    # ran it. Those ops now stay on XLA (`NOT_IN_TRITON`).
    # Campaign 20261128 (10 cases per backend): float16 features near 256 (√ of float16's max) on a 1,050-edge hub.
    # The mean (6,804) fits float16, its sum does not: the reference's float16 partial sums overflow both ways
    # (NaN), jgnn's float32 sum overflows once when rounded (+inf), which the program with each operation rounded
    # once also gives (`tests.fuzz.rounded`).
    "hub_mean_float16_overflow": Case(_hub_mean_by_index(), "float16",
                                      GraphSpec("hub", frozenset({"duplicates", "self_loops", "sorted"}), 20840),
                                      ValueSpec(3073, "huge", ())),
    # Campaign 20261127 (1 case per backend): bfloat16, a GraphNetwork's concat([sent, received, edge, globals]) @ W0.
    # `linear_split` made four matmuls, each rounded to bfloat16, and added them in bfloat16: a row that cancels
    # was 0.0078 from the oracle (the reference's one matmul accumulates in float32 and rounds once: 0.0006).
    # The pieces now accumulate in float32 and round once.
    "graph_network_bfloat16_split": Case(_graph_network_concat(), "bfloat16", GraphSpec("padded", frozenset(), 523),
                                         ValueSpec(4124, "normal", (Pattern("neginf", "graph.nodes.h"),))),
    # Campaign 20261127 (2 cases per backend, `repro_13`): float32 features near 1e19; a one-edge row's softmax
    # weight is NaN in the jitted reference, 1 in jgnn: jitted, s - max was 3.2e10 and -5.5e11, not 0 (the score
    # recomputed unrounded inside the subtraction), so exp overflowed. Op by op it is 0 and the reference gives
    # jgnn's answer (`checker.Oracle.eager`).
    "destination_softmax_reference_recomputes": Case(_destination_softmax(), "float32",
                                                     GraphSpec("padded", frozenset({"sources"}), 102),
                                                     ValueSpec(314, "huge", ())),
    # Campaign 20261201 (6 bfloat16 cases, `jvp` and `grad`): scores near 2e19, one 2 bfloat16 ulps below its row's
    # max (weight exp(−3e17) = 0). The derivative ops' window of 4 bfloat16 ulps, meant for a recomputed score
    # that misses the saved max, took it for a tie: weight 1, tangents 9e37 where the reference's are 3e20. The
    # window is now 4 float32 ulps, the precision bfloat16 scores are computed in (`edge_fn.MAX_ULPS`).
    "bfloat16_score_two_ulps_below_the_max_jvp": Case(
        _typed_attention_sum(), "bfloat16", GraphSpec("small", frozenset({"duplicates", "out_of_range",
                                                                          "self_loops"}), 65535),
        ValueSpec(0, "huge", ())),
    # Campaign 20261201 (3 float32 cases per backend): ids out of range, so the reference's gradient is ``ctᵀ J`` by
    # forward mode; at features near 1e19 the sum a tanh reads had one sign in that program and the other in the
    # reference's reverse-mode one, which jgnn equals exactly (a W2 gradient of -1.7 against 0.9). The checker
    # takes the reference's reverse-mode gradient as a second answer (`checker.REVERSE_MODE_GRAD`).
    "destination_tanh_out_of_range_grad": Case(_destination_tanh(), "float32",
                                               GraphSpec("sparse", frozenset({"out_of_range"}), 376),
                                               ValueSpec(3254, "huge", ())),
    "attention_at_the_range_edge": Case(_range_edge_attention(), "float32", GraphSpec("padded", frozenset(), 158),
                                        ValueSpec(886, "huge", (Pattern("mask_rows_1e9", "graph.edges.b"),
                                                                Pattern("posinf", "graph.nodes.h")))),
    "gat_one_finite_score_huge_grad": Case(_jraph_gat_edge_bias(), "float32",
                                           GraphSpec("dense", frozenset({"sorted"}), 23498),
                                           ValueSpec(703, "huge", (Pattern("neginf_prefix", "graph.edges.b"),
                                                                   Pattern("neginf_prefix", "graph.edges.b")))),
    "index_gathered_softmax_huge_forward": Case(_index_gathered_softmax(), "float32",
                                                GraphSpec("batch", frozenset({"duplicates", "out_of_range", "sorted"}),
                                                          6432), ValueSpec(2878, "huge", ())),
    "difference_of_neighbours_split": Case(_difference_of_neighbours(), "float32",
                                           GraphSpec("small", frozenset({"duplicates", "isolated", "out_of_range"}),
                                                     6532),
                                           ValueSpec(2133, "normal", (Pattern("near_ties", "graph.nodes.h"),
                                                                      Pattern("neginf", "graph.edges.b")))),
    "overflow_under_an_mlp": Case(_overflow_under_an_mlp(), "float32", GraphSpec("batch", frozenset(), 15744),
                                  ValueSpec(4573, "huge", (Pattern("zeros", "graph.edges.m"),
                                                           Pattern("zeros", "graph.edges.m")))),
    "graph_network_attention_negative_ids": Case(_graph_network_attention_negative_ids(), "float32",
                                                 GraphSpec("padded", frozenset({"negative"}), 378),
                                                 ValueSpec(421, "normal", (Pattern("near_ties", "graph.nodes.h"),
                                                                           Pattern("nan", "graph.edges.x")))),
    # Campaign 20261300 (63 cases): XLA may drop a float32 -> bfloat16 -> float32 round trip in one fusion and keep
    # it in another (``xla_allow_excess_precision``). The forward kernel's row max and the tangent op's recomputed
    # score differed by one bfloat16 ulp (1.4e17 at 2.5e19): that edge's weight was exp(-1.4e17) = 0 in the
    # tangent, half the reference's. Each 16-bit result is now settled by ``reduce_precision``
    # (`jgnn.ops.edge_fn._settle`), which XLA keeps.
    "bfloat16_recomputed_score_keeps_its_rounding": Case(
        _stacked_attention_and_max(), "bfloat16", GraphSpec("sparse", frozenset(), 739),
        ValueSpec(910, "huge", (Pattern("near_ties", "graph.edges.x"),))),
    # Campaign 20261400: `linear_reorder` formed the per-type weight product W0 @ W1 in float16, and its rounding
    # reached every row: a W2 gradient 584 from float64 where the reference is 36 from it. The product now stays
    # float32 and the chain rounds once.
    "float16_typed_chain_reassociated": Case(
        _typed_chain_float16(), "float16",
        GraphSpec("batch", frozenset({"duplicates", "isolated", "sources"}), 880), ValueSpec(5833, "huge", ())),
    # Campaign 20261400: out-of-range receivers, which the reference's forward clamps and its reverse mode drops. The
    # checker compares gradients with ``ctᵀ J`` by forward mode on such graphs, but not for complex dtypes (jacfwd
    # needs real inputs): jgnn's gradient, the derivative of its forward, was compared with the reverse-mode one.
    # Complex inputs are now differentiated along their real and imaginary parts (`checker._compiled`).
    "complex_gradient_out_of_range_receivers": Case(
        _graph_network_mean(), "complex64",
        GraphSpec("dense", frozenset({"negative", "out_of_range", "sources"}), 24362), ValueSpec(0, "normal", ())),
    # Campaign 20261400 (270 float64 cases, 4 signatures): with 4 edges, the fusion pass took the shared dropout
    # mask (4 values, broadcast along the features) for one value per edge, and an edge block resized ops by their
    # length alone: wrong messages, or a broadcast that failed. `fusion._rows_at_zero` and `facts.row_values`
    # decide rows by data flow.
    "dropout_mask_as_long_as_the_edge_list": Case(
        _dropout_mask_as_long_as_the_edge_list(), "float64", GraphSpec("sparse", frozenset({"negative"}), 1935),
        ValueSpec(42, "normal", (Pattern("near_ties", "graph.edges.b"),))),
    # Campaign 20261400 (7 float32 cases, pallas_interpret): a kernel fused the product p = g·V into p − P (a
    # multiply-add), so the edge that set the pivot P, at |p| near 1e19, got the product's rounding error as its
    # score cotangent: an edge-feature gradient 1.2e11 where the reference's is 0. `edge_fn._centre`.
    "attention_pivot_edge_scores_cotangent_zero": Case(
        _jraph_gat_edge_bias(8), "float32", GraphSpec("padded", frozenset(), 5445),
        ValueSpec(11299, "huge", (Pattern("neginf", "graph.edges.b"), Pattern("neginf_prefix", "graph.edges.b")))),
    # Campaign f of FINDINGS-2714b3a (20,000 cases; still failing at 477217c): float32 features near 1e19 and
    # scores that cancel (terms near 1e20 summing to far less). The backward's recomputed score of a one-edge row
    # missed the forward's max by more than 4 ulps of the score (ulps of the terms), so its weight was exp(-1e13) =
    # 0 where the reference's is 1: a W0 gradient of -1.4e19 where the reference's is -2.8e19. The window is now
    # at least the score's rounding bound (`jgnn.ops.rounding`).
    "gat_cancelling_score_one_edge_row_grad": Case(
        _jraph_gat_edge_bias(3, 4), "float32", GraphSpec("sparse", frozenset(), 1235),
        ValueSpec(966, "huge", (Pattern("posinf", "graph.nodes.h"),))),
    # Campaign 20261600 (1 bfloat16 case per backend): features near 1e-20 whose per-edge products cancel (their
    # magnitudes sum to 50 times the result). jgnn forms ``h @ W0`` per node, rounded to bfloat16, and sums it;
    # the jitted reference's XLA fusion keeps each edge's product in float32 before its sum (excess precision), so
    # the reference was 30 times nearer float64 than its own program rounded op by op, which jgnn equals. The
    # checker now allows a backend the rounded program's error (`checker.compare_leaf`).
    "bfloat16_node_product_rounded_before_its_sum": Case(
        _node_product_summed(), "bfloat16", GraphSpec("dense", frozenset({"isolated", "negative", "sorted"}), 12643),
        ValueSpec(8, "tiny", ())),
    # Campaign 20261600 (2 float32 cases per backend), after the rounding bound above: scores near 1e38, whose
    # rounding bound overflowed to inf, so every edge of a row snapped to its max (weight 1): a gradient 2.1e19 off
    # where the reference is 1.5e12 from float64. An overflowed bound now leaves the ulp window.
    "typed_differences_softmax_bound_overflows": Case(
        _typed_differences_softmax(), "float32", GraphSpec("batch", frozenset(), 119), ValueSpec(346, "huge", ())),
    # Campaign 20261600 (6 bfloat16 cases per backend), the same excess precision at normal magnitudes: a node
    # output that cancels, 0.00117 in jgnn and in the program rounded op by op, 0.000455 in float64, where the
    # jitted reference (0.000433) kept its fused products in float32.
    "bfloat16_graph_network_attention_excess_precision": Case(
        _graph_network_attention_summed(), "bfloat16", GraphSpec("small", frozenset(), 1132),
        ValueSpec(1923, "normal", ())),
    # Campaign 20261700 (2 float32 cases per backend, hvp): jraph padding, whose 6 padding edges are duplicate
    # self-loops with zero features, so their scores tie and their messages are 0. The backward centred the
    # messages' products on the row's pivot with a constant 0 where they equal it, and forward-over-reverse lost
    # their derivative: the padding edges' Hessian-vector product 0 where the reference's is up to 0.113.
    "padded_tied_attention_hvp": Case(
        _range_and_attention_padded(), "float32", GraphSpec("padded", frozenset(), 20632),
        ValueSpec(9232, "normal", ())),
    # Campaign 20261700 (1 float32 case per backend): +inf features through a reassociated typed chain. The
    # reference's x[r] @ W0 @ W1 makes inf − inf = NaN, which its tanh backward turns into NaN gradients whatever
    # the (zeroed) cotangent of the tainted outputs: 0 · NaN. jgnn's x[r] @ (W0 @ W1) stays ±inf and its gradient
    # finite. The checker does not compare a reassociated case's gradient where the reference's is NaN.
    "reassociated_chain_nan_gradient": Case(
        _typed_chain_tanh_sum(), "float32", GraphSpec("batch", frozenset(), 1426),
        ValueSpec(1474, "tiny", (Pattern("ties", "graph.nodes.h"), Pattern("posinf", "graph.nodes.h")))),
    # Campaign 20261700 (1 float32 case, hvp, pallas_interpret): features near 1e19, rows with one unmasked edge.
    # Such a row's weight is 1, so its second-order terms must cancel: the backward's recomputed score tangent
    # against the forward's normaliser tangent. The normaliser's tangent ran as a Pallas kernel, the backward on
    # XLA; they rounded differently, and the Hessian-vector product was 9.5e31 off where the reference's is 3.7.
    "gat_one_edge_rows_huge_hvp": Case(
        _jraph_gat_edge_bias(1, 4, masked=True), "float32", GraphSpec("star", frozenset({"sorted"}), 4603),
        ValueSpec(2147, "huge", (Pattern("near_ties", "graph.edges.m"), Pattern("mask_rows_1e9", "graph.edges.m")))),
    "concat_globals_cuda_lowering": Case(_concat_globals(), "float32",
                                         GraphSpec("small", frozenset({"self_loops", "sorted", "sources"}), 3311),
                                         ValueSpec(63109, "normal", (Pattern("posinf", "graph.nodes.h"),
                                                                     Pattern("neginf", "graph.nodes.h")))),
}


# The fast tier checks each case on `pallas_interpret`, which runs every rewrite and every kernel; the slow tier
# checks it on `xla` and its CUDA lowering too (3-11 s of `jax.export` per case), except where that check found it.
FOUND_BY_LOWERING = frozenset({"concat_globals_cuda_lowering"})
# Cases found under a transform of the layer (`checker.check_transform`), which each is checked under too.
FOUND_BY_TRANSFORM = {"padded_tied_attention_hvp": "hvp", "gat_one_edge_rows_huge_hvp": "hvp"}


def _check(name: str, backend: str) -> None:
    explained, report = checker.check_explain(CASES[name])  # as `checker.check_batch` does
    reassociated = checker.reassociates(report)
    failures = explained + checker.check_case(CASES[name], backends=(backend,), reassociated=reassociated)
    if name in FOUND_BY_TRANSFORM:
        failures += checker.check_transform(CASES[name], FOUND_BY_TRANSFORM[name], backends=(backend,),
                                            reassociated=reassociated)
    lowers_in_this_tier = name in FOUND_BY_LOWERING if backend == "pallas_interpret" else name not in FOUND_BY_LOWERING
    if lowers_in_this_tier:
        failures += checker.check_cuda_lowering(CASES[name])
    assert not failures, [(f.kind, f.mode, f.backend, f.where) for f in failures]


@pytest.mark.parametrize("name", sorted(CASES))
def test_pinned_case_matches_reference(name):
    _check(name, "pallas_interpret")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_pinned_case_matches_reference_on_xla_and_lowers_for_cuda(name):
    _check(name, "xla")


def test_typed_chain_case_is_reassociated_and_has_untainted_outputs():
    """The reassociation exemption of the pinned case is narrow: its plan does reassociate, and only the outputs
    the reference makes NaN are exempt (its empty rows' -inf and its finite outputs are compared)."""
    case = CASES["typed_chain_neginf_max"]
    _, report = checker.check_explain(case)
    assert checker.reassociates(report)
    ops = checker.operands(case)
    ops = checker.with_cotangent(ops, checker.out_shapes(case.program, ops, case.dtype), case.values.seed)
    (tainted,) = jax.tree_util.tree_leaves(checker.tainted_outputs(case, ops, True))
    assert 0 < tainted.sum() < tainted.size


@pytest.mark.parametrize("got, oracle, rounded, passes", [
    (np.inf, 1e5, None, True),  # the true sum is past float16's range: +inf is it, correctly rounded
    (-np.inf, 1e5, None, False),  # the wrong sign
    (np.inf, 100.0, None, False),  # the true value fits float16, and nothing says the program overflows
    (np.inf, 100.0, 100.0, False),  # ... nor does the program with each operation rounded once
    (np.inf, 100.0, np.inf, True),  # it does: an intermediate sum past the range (a mean that fits)
    (-np.inf, 100.0, np.inf, False),  # the rounded program's overflow has the other sign
    (np.nan, 1e5, None, True),  # the reference's own answer
])
def test_an_inf_where_the_reference_overflowed_to_nan_is_checked_against_the_rounded_oracle(got, oracle, rounded,
                                                                                          passes):
    """Campaign 20261127, 18 float16 cases: a segment mean of huge features, which the reference sums in float16
    (partial sums overflowing to +inf and -inf: NaN) and jgnn in float32 (one overflow: +inf). Campaign
    20261128: 10 more, where the mean itself fits float16 (6,804) but the sum does not."""
    ref = np.array([1.0, np.nan], np.float16)
    rounded_leaf = None if rounded is None else lambda: np.array([1.0, rounded], np.float16)
    res = checker.compare_leaf(ref, np.array([1.0, got], np.float16), "float16",
                               lambda: np.array([1.0, oracle], np.float64), rounded_leaf=rounded_leaf)
    assert (res is None) == passes, res


@pytest.mark.parametrize("rounded_value, passes", [(6.882e-21, True), (6.4586e-21, False), (None, False)])
def test_a_backend_may_be_as_far_from_float64_as_the_program_rounded_op_by_op(rounded_value, passes):
    """Campaign 20261600 (`bfloat16_node_product_rounded_before_its_sum`'s values): the jitted bfloat16 reference
    kept excess precision and is 30 times nearer float64 than its program rounded op by op; a backend equal to the
    latter passes, and without it (or with a rounded program as near as the reference) it does not."""
    ref = np.array([1.0, 6.4586e-21], ml_dtypes.bfloat16)
    got = np.array([1.0, 6.882e-21], ml_dtypes.bfloat16)
    oracle = lambda: np.array([1.0, 6.4540e-21])
    rounded_leaf = None if rounded_value is None else lambda: np.array([1.0, rounded_value], ml_dtypes.bfloat16)
    res = checker.compare_leaf(ref[1:], got[1:], "bfloat16", lambda: oracle()[1:],
                               rounded_leaf=None if rounded_leaf is None else lambda: rounded_leaf()[1:])
    assert (res is None) == passes, res


def test_a_gradient_that_cancels_to_zero_is_compared_at_the_values_unit_scale():
    """Campaign 20261127, 6 float64 cases: every finite entry of the reference's gradient is exactly 0 (the rest
    ±inf), jgnn's rounding noise of the cancelling unit-scale terms is 5e-17. Unit-scale values give a least row
    scale of 1; a real error of that size still fails."""
    ref = {"g": np.array([[0.0, np.inf], [0.0, 0.0]])}
    noise = {"g": np.array([[5.3e-17, np.inf], [0.0, 0.0]])}
    wrong = {"g": np.array([[1e-3, np.inf], [0.0, 0.0]])}
    least = tolerances.least_scale("normal")
    assert checker.compare_trees(ref, noise, "float64", lambda: ref, "positions", 1.0, least) is None
    assert checker.compare_trees(ref, wrong, "float64", lambda: ref, "positions", 1.0, least) is not None
    assert checker.compare_trees(ref, noise, "float64", lambda: ref, "positions", 1.0, 0.0) is not None


@pytest.mark.parametrize("ref, got, oracle, edge, passes", [
    (3.39e38, np.inf, 3.39e38, True, True),  # the fused sum overflows before it divides (campaign 20261128, g)
    (-np.inf, 5.0e19, -8.6e40, True, True),  # past the range: the reference's inf is its rounding noise (c)
    (-2.08, np.nan, -2.08, True, True),  # an overflow inside, through a tanh MLP to a small output (20261205)
    (1.0, np.inf, 1.0, False, False),  # a program below the edge: an overflow is wrong
    (np.nan, 1.0, np.nan, True, False),  # NaN from a NaN input stays exact
    (np.nan, np.inf, -39420.0, True, True),  # inf − inf in the reference, one overflow in jgnn (20261400)
    (np.nan, np.inf, -39420.0, False, False),  # ... below the edge it is compared
    (np.inf, -np.inf, 5.0, True, False),  # both overflow: the signs are still compared
])
def test_overflow_is_compared_only_below_the_range_edge(ref, got, oracle, edge, passes):
    res = checker.compare_leaf(np.array([1.0, ref], np.float32), np.array([1.0, got], np.float32), "float32",
                               lambda: np.array([1.0, oracle], np.float64), range_edge=lambda: edge)
    assert (res is None) == passes, res


@pytest.mark.parametrize("scale, edge", [(1e19, True), (1e17, False)])
def test_a_program_is_at_the_range_edge_when_one_operation_comes_near_the_largest_float(scale, edge):
    """Squares of features near 1e19 are 1e38, 2^-11 of float32's largest number or nearer; of 1e17, 1e34."""
    x = np.array([1.0, scale], np.float32)
    largest = rounded.largest(lambda x: jnp.tanh(x * x), x)
    assert largest == pytest.approx(float(scale) ** 2, rel=1e-6)
    assert tolerances.at_range_edge(largest, "float32") == edge


def test_a_derivative_that_is_zero_everywhere_is_compared_at_the_forward_scale():
    """Campaign 20261128, class b: a softmax row with one finite score has a score derivative of exactly 0 in the
    reference; a kernel's weight of 1 − 2^-24 leaves 8e11 at outputs of 3.2e19. That noise passes at the
    forward scale, an error of 1e-3 of it does not, and with no forward scale neither does the noise."""
    ref, noise, wrong = ({"g": np.array([[0.0], [v]], np.float32)} for v in (0.0, 8.4e11, 3.2e16))
    least = tolerances.least_scale("huge", 3.2e19)
    assert checker.compare_trees(ref, noise, "float32", lambda: ref, "positions", 1.0, least) is None
    assert checker.compare_trees(ref, wrong, "float32", lambda: ref, "positions", 1.0, least) is not None
    assert checker.compare_trees(ref, noise, "float32", lambda: ref, "positions", 1.0,
                                 tolerances.least_scale("huge")) is not None


def test_transforms_take_the_reference_run_op_by_op_as_a_second_opinion():
    """Campaign 20261128 (2 signatures): under ``vmap`` the jitted reference made NaN of the one-edge softmax rows
    of `destination_softmax_reference_recomputes` (its score recomputed unrounded inside ``s − max``); run op by op
    it gives jgnn's answer, as `checker.Oracle.eager` already said for the parts (fails without
    `checker._eager_transform`)."""
    assert not checker.check_transform(CASES["destination_softmax_reference_recomputes"], "vmap")


def test_nan_positions_of_complex_outputs_keep_their_shape():
    """Campaign 20261205 (4 batches): a complex64 output's NaN mask had a trailing axis of 2 (real and imaginary
    parts), and zeroing the cotangent there raised, killing the checking process."""
    x = np.array([[1 + 1j, complex(np.nan, 0)], [complex(0, np.nan), 2j]], np.complex64)
    np.testing.assert_array_equal(checker._nan_positions(x), [[False, True], [True, False]])
