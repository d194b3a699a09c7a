"""The JAX systems of the comparison (``jgnn``, ``hand``, ``jraph``) for each model kind: their inputs, built
once on the host, and their forward functions over the shared initial weights.

Every model kind is one row of `KINDS`; `build` turns (system, kind, problem) into a `runner.Runner`.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from benchmarks.compare import models, weights
from benchmarks.compare.data import Problem
from benchmarks.compare.runner import Runner, jax_runner
from benchmarks.hand import gat as hand_gat
from benchmarks.hand import gcn as hand_gcn
from benchmarks.hand import hgt as hand_hgt
from benchmarks.hand import rgcn as hand_rgcn
from jgnn.layout import GraphLayout

# ---- inputs ---------------------------------------------------------------------------------------------------


def jgnn_graph(problem: Problem) -> jraph.GraphsTuple:
    """The single graph `jgnn.nn` reads: features (or int32 node ids when featureless), and types."""
    x = np.arange(problem.num_nodes, dtype=np.int32) if problem.x is None else problem.x
    nodes = x if problem.node_type is None else {"h": x, "type": problem.node_type}
    edges = None if problem.edge_type is None else {"type": problem.edge_type}
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=problem.senders, receivers=problem.receivers,
                             n_node=np.array([problem.num_nodes], np.int32),
                             n_edge=np.array([problem.num_edges], np.int32), globals=None)


def with_self_loops(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """The edges followed by one self-loop per node (the graphs here have none of their own)."""
    loop = np.arange(problem.num_nodes, dtype=np.int32)
    return np.concatenate([problem.senders, loop]), np.concatenate([problem.receivers, loop])


def local_sources(problem: Problem) -> np.ndarray:
    """Each edge's sender as an id within its node type (node types are contiguous blocks)."""
    starts = np.asarray(problem.type_offsets(problem.node_type, problem.num_node_types))
    return (problem.senders - starts[problem.node_type[problem.senders]]).astype(np.int32)


# ---- model kinds ----------------------------------------------------------------------------------------------

Forward = Callable  # (params, *consts) -> logits [N, C]


def _hand_gat(p: Problem):
    return (lambda params, inputs: hand_gat.forward(params["params"], inputs, models.GAT_HEADS),
            hand_gat.Inputs(p.x, *with_self_loops(p)))


def _hand_gcn(p: Problem):
    return lambda params, inputs: hand_gcn.forward(params["params"], inputs), hand_gat.Inputs(p.x, *with_self_loops(p))


def _hand_rgcn(p: Problem):
    n, r = p.num_nodes, p.num_relations
    return (lambda params, inputs: hand_rgcn.forward(params["params"], inputs, n, r),
            hand_rgcn.Inputs(p.senders, p.receivers, p.edge_type))


def _hand_hgt(p: Problem):
    static = hand_hgt.Static(p.type_offsets(p.node_type, p.num_node_types),
                             p.type_offsets(p.edge_type, p.num_relations),
                             tuple(tuple(int(v) for v in row) for row in p.schema), models.HGT_HEADS)
    return (lambda params, inputs: hand_hgt.forward(params["params"], inputs, static),
            hand_hgt.Inputs(p.x, local_sources(p), p.receivers))


@dataclasses.dataclass(frozen=True)
class Kind:
    """How each JAX system runs one model kind.

    ``model(problem, backend)`` is the `jgnn.nn` module (its init gives the canonical weights);
    ``self_loops``: the layers append one self-loop per node (the `GraphLayout` must describe them);
    ``hand(problem) -> (forward(params, inputs), inputs)``; ``jraph(problem)``: jraph's model, if any."""

    model: Callable[[Problem, str], object]
    self_loops: bool
    hand: Callable[[Problem], tuple[Forward, object]]
    jraph: Callable[[Problem], object] | None = None


KINDS: dict[str, Kind] = {
    "gat": Kind(lambda p, b: models.GAT(p.num_classes, b), True, _hand_gat,
                lambda p: models.JraphGATModel(p.num_classes)),
    "gcn": Kind(lambda p, b: models.GCN(p.num_classes, b), True, _hand_gcn,
                lambda p: models.JraphGCNModel(p.num_classes)),
    "rgcn": Kind(lambda p, b: models.RGCN(p.num_classes, p.num_relations, p.num_nodes, b), False, _hand_rgcn),
    "hgt": Kind(lambda p, b: models.HGT(p.num_classes, p.num_node_types, p.num_relations, b), False, _hand_hgt),
}


def stand_in(problem: Problem, size: int = 8) -> jraph.GraphsTuple:
    """A ``size``-node ring with ``problem``'s feature width and type counts: parameter shapes depend on
    nothing else, so ``init`` runs on it instead of on the whole graph (and leaves jgnn's plan cache cold)."""
    ring = np.arange(size, dtype=np.int32)
    x = ring if problem.x is None else problem.x[:size]
    nodes = x if problem.node_type is None else {"h": x, "type": ring % problem.num_node_types}
    edges = None if problem.edge_type is None else {"type": ring % problem.num_relations}
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=ring, receivers=np.roll(ring, 1),
                             n_node=np.array([size], np.int32), n_edge=np.array([size], np.int32), globals=None)


def initial_params(kind: str, problem: Problem, seed: int = 0) -> dict:
    """The canonical initial weights: the jgnn module's ``init`` (seeded), as host NumPy arrays."""
    model = KINDS[kind].model(problem, "reference")
    params = model.init(jax.random.key(seed), stand_in(problem))
    return jax.tree_util.tree_map(np.asarray, params)


def fresh(tree):
    """Device copies that the runner may donate (the canonical host arrays stay intact)."""
    return jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), tree)


def program(system: str, kind: str, problem: Problem, params: dict, *, backend: str = "xla"):
    """``(forward, consts, params)`` of a JAX ``system`` (``"jgnn"``, ``"hand"`` or ``"jraph"``) for ``kind``:
    ``forward(params, *consts) -> logits [N, C]``, its graph inputs and its weights (converted from ``params``)."""
    spec = KINDS[kind]
    if system == "jgnn":
        model, graph = spec.model(problem, backend), jgnn_graph(problem)
        layout = GraphLayout.from_graph(graph, self_loops=spec.self_loops)
        return (lambda q, g, lay: model.apply(q, g, lay)), (graph, layout), params
    if system == "hand":
        forward, inputs = spec.hand(problem)
        return forward, (inputs,), params
    if system == "jraph":
        if spec.jraph is None:
            raise ValueError(f"jraph has no {kind} model")
        model = spec.jraph(problem)
        return (lambda q, g: model.apply(q, g)), (jgnn_graph(problem),), weights.jraph_params(kind, params)
    raise ValueError(f"unknown JAX system {system!r}; expected jgnn, hand or jraph")


def build(system: str, kind: str, problem: Problem, params: dict, *, train: bool, backend: str = "xla") -> Runner:
    """The runner of a JAX ``system`` (``"jgnn"``, ``"hand"`` or ``"jraph"``) for ``kind`` on ``problem``.

    ``info["prep_s"]`` is the host preprocessing each system needs once (jgnn: its `GraphLayout`)."""
    t0 = time.perf_counter()
    forward, consts, sys_params = program(system, kind, problem, params, backend=backend)
    prep_s = time.perf_counter() - t0
    runner = jax_runner(system, forward, fresh(sys_params), jax.device_put(consts), problem.labels,
                        problem.train_idx, train=train)
    runner.info["prep_s"] = prep_s
    return runner
