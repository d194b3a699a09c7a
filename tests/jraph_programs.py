"""jraph's own test programs (``jraph/_src/models_test.py`` and ``utils_test.py``), as (name, function, input).

They are imported from the installed jraph package and compiled unmodified: the programs that jraph itself tests
against, on the batched graphs jraph tests them with (7 graphs of 0–3 nodes: as many graphs as nodes, which is
what tells residency by provenance from residency by row count). utils_test's segment programs take
``(data, segment_ids)``, its own arrays (NaN data, negative ids, the ``indices_are_sorted`` and
``unique_indices`` flags), as one tuple.
"""

from __future__ import annotations

import jax.numpy as jnp
import jraph
from jraph._src import models_test, utils

ModelsTest = models_test.ModelsTest


def _nested_batch() -> jraph.GraphsTuple:
    return ModelsTest()._get_list_and_batched_graph()[1]


def _flat_batch() -> jraph.GraphsTuple:
    return jraph.GraphsTuple(
        n_node=jnp.array([1, 3, 1, 0, 2, 0, 0]), n_edge=jnp.array([1, 7, 1, 0, 3, 0, 0]),
        nodes=jnp.arange(14).reshape(7, 2), edges=jnp.arange(36).reshape(12, 3),
        globals=jnp.arange(14).reshape(7, 2),
        senders=jnp.array([0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 3, 6]),
        receivers=jnp.array([0, 1, 2, 3, 4, 5, 6, 2, 3, 2, 1, 5]))


def _float(graph: jraph.GraphsTuple) -> jraph.GraphsTuple:
    import jax

    return jax.tree_util.tree_map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.integer) and
                                  x.ndim == 2 else x, graph)


CONNECT = ("_get_graph_network", "_get_graph_network_no_node_update", "_get_graph_network_no_edge_update",
           "_get_graph_network_no_global_update", "_get_attention_graph_network",
           "_get_multi_head_attention_graph_network", "_get_graph_gat")
NONES = ("_get_graph_network", "_get_graph_network_no_node_update", "_get_graph_network_no_edge_update",
         "_get_graph_network_no_global_update")
GNNS = ("_get_interaction_network", "_get_graph_independent", "_get_gat", "_get_relation_network", "_get_deep_sets")
# Programs whose messages are computed per edge from gathered node rows and summed to the nodes.
GATHER_SEGMENT = frozenset({"_get_interaction_network", "_get_gat", "_get_interaction_network[float]",
                            "_get_gat[float]", "sum_of_sent_over_receivers", "graph_network_concatenated_args"})


def programs() -> list[tuple[str, object, jraph.GraphsTuple]]:
    out = []
    for name in CONNECT:
        out.append((name, getattr(models_test, name), _nested_batch()))
    base = _nested_batch()
    for name in NONES:
        for variant, g in (("no_globals", base._replace(globals=None)), ("empty_globals", base._replace(globals=[])),
                           ("no_edges", base._replace(edges=None)), ("empty_edges", base._replace(edges=[]))):
            out.append((f"{name}[{variant}]", getattr(models_test, name), g))
    for name in GNNS:
        out.append((name, getattr(models_test, name), _flat_batch()))
        out.append((f"{name}[float]", getattr(models_test, name), _float(_flat_batch())))
    flat = _float(_flat_batch())
    # Not here: `utils.partition_softmax` (``jnp.repeat`` by traced counts: plain jit rejects it too),
    # `utils.zero_out_padding` and `with_zero_out_padding_outputs` (they call ``jax.tree_map``, which JAX 0.10 no
    # longer has), and `utils.batch` inside the program (a concat of two graphs' node rows: a regional fallback,
    # `Reason.MIXED_RESIDENCIES`).
    for name, fn in (("get_node_padding_mask", utils.get_node_padding_mask),
                     ("get_edge_padding_mask", utils.get_edge_padding_mask),
                     ("get_graph_padding_mask", utils.get_graph_padding_mask),
                     ("get_number_of_padding_with_graphs_nodes", utils.get_number_of_padding_with_graphs_nodes),
                     ("get_number_of_padding_with_graphs_edges", utils.get_number_of_padding_with_graphs_edges),
                     ("segment_mean_of_edges", lambda g: utils.segment_mean(g.edges, g.receivers, 7)),
                     ("segment_softmax_of_edges", lambda g: utils.segment_softmax(g.edges, g.receivers, 7)),
                     ("segment_normalize_of_edges", lambda g: utils.segment_normalize(g.edges, g.receivers, 7)),
                     ("segment_max_or_constant", lambda g: utils.segment_max_or_constant(g.edges, g.receivers, 7)),
                     ("segment_variance_of_edges", lambda g: utils.segment_variance(g.edges, g.receivers, 7)),
                     ("sum_of_sent_over_receivers", lambda g: utils.segment_sum(g.nodes[g.senders], g.receivers, 7)),
                     ("segment_sum_of_edges", lambda g: utils.segment_sum(g.edges, g.receivers, 7)),
                     ("segment_max_of_edges", lambda g: utils.segment_max(g.edges, g.receivers, 7)),
                     ("segment_min_of_edges", lambda g: utils.segment_min(g.edges, g.receivers, 7)),
                     ("segment_min_or_constant", lambda g: utils.segment_min_or_constant(g.edges, g.receivers, 7)),
                     ("graph_network_concatenated_args", _concatenated_graph_network)):
        out.append((name, fn, flat))
    return out + _segment_programs()


def _segment_programs() -> list[tuple[str, object, tuple]]:
    """utils_test's segment tests as jitted programs of ``(data, segment_ids)``, on its data; the ``_or_constant``
    ones also as ``jax.grad``, which utils_test checks is finite."""
    import jax

    out = []
    ids9 = jnp.array([0, 1, 2, 0, 4, 0, 1, 1, 0])
    ids8 = jnp.array([0, 0, 0, 1, 1, 2, 2, 2])
    out.append(("segment_sum", lambda a: utils.segment_sum(a[0], a[1], 6), (jnp.arange(9), ids9)))
    for nan in (False, True):
        tag = "[nan]" if nan else ""
        d9, d8 = jnp.arange(9, dtype=jnp.float32), jnp.arange(8, dtype=jnp.float32)
        if nan:
            d9, d8 = d9.at[0].set(jnp.nan), d8.at[0].set(jnp.nan)
        out += [(f"segment_mean{tag}", lambda a: utils.segment_mean(a[0], a[1], 6), (d9, ids9)),
                (f"segment_variance{tag}", lambda a: utils.segment_variance(a[0], a[1], 3), (d8, ids8)),
                (f"segment_normalize{tag}", lambda a: utils.segment_normalize(a[0], a[1], 3), (d8, ids8)),
                (f"segment_softmax{tag}", lambda a: utils.segment_softmax(a[0], a[1], 6), (d9, ids9))]
    for is_sorted, unique in ((False, False), (True, False), (True, True), (False, True)):
        tag = f"[sorted={is_sorted},unique={unique}]"
        if unique:
            ids = jnp.array([0, 1, 2, 3, 4, 5]) if is_sorted else jnp.array([1, 0, 2, 4, 3, -5])
            rows, n = 6, 6 if is_sorted else 5
        else:
            ids = jnp.array([0, 0, 0, 1, 1, 1, 2, 3, 4]) if is_sorted else jnp.array([0, 1, 2, 0, 4, 0, 1, 1, -6])
            rows, n = 9, 6
        for name in ("segment_max", "segment_min", "segment_max_or_constant", "segment_min_or_constant"):
            f = getattr(utils, name)
            k = 7 if name == "segment_max_or_constant" and unique and is_sorted else n  # as utils_test has it
            flags = dict(indices_are_sorted=is_sorted, unique_indices=unique)
            if not name.endswith("_or_constant"):
                out.append((f"{name}{tag}", lambda a, f=f, k=k, kw=flags: f(a[0], a[1], k, **kw),
                            (jnp.arange(rows), ids)))
                continue
            data = jnp.arange(rows, dtype=jnp.float32)
            two_d = jnp.stack([jnp.arange(rows), jnp.arange(rows, 0, -1)], axis=1)
            out += [(f"{name}{tag}", lambda a, f=f, k=k, kw=flags: f(a[0], a[1], k, **kw), (data, ids)),
                    (f"{name}_2d{tag}", lambda a, f=f, n=n, kw=flags: f(a[0], a[1], n, **kw), (two_d, ids)),
                    (f"grad_{name}{tag}", lambda a, f=f, k=k, kw=flags: jax.grad(
                        lambda x: jnp.sum(f(x, a[1], k, **kw)))(a[0]), (data, ids))]
    return out


def _concatenated_graph_network(graph: jraph.GraphsTuple) -> jraph.GraphsTuple:
    """A `jraph.GraphNetwork` whose updates read what they are given (`utils.concatenated_args`): unlike the
    identity updates of models_test, its node update reads the aggregated edges, a live gather→segment chain
    whose messages (the updated edges) are also an output."""
    def dense(width):
        return utils.concatenated_args(lambda x: jnp.tanh(x @ (jnp.arange(x.shape[-1] * width, dtype=x.dtype)
                                                               .reshape(x.shape[-1], width) / 100.0)))
    return jraph.GraphNetwork(dense(3), dense(2), dense(2))(graph)

