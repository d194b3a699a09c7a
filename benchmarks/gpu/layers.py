"""Every `jgnn.nn` layer's training step on ``backend="pallas"``, and the kernels each one should reach.

A step is ``value_and_grad`` of a loss in the parameters and the input features (as in a layer deep in a
model), so the backward walks over the graph are in it. Layers are driven through the public `jgnn.nn` API;
parameters come from ``jax.eval_shape`` of ``init`` (nothing runs on the CPU).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

import jgnn.nn as gnn
from benchmarks.gpu.cases import Case
from benchmarks.gpu.deviceless import Step
from jgnn.layout import GraphLayout

# layer case -> {Triton kernel name prefix: the fewest calls of it the training step must make}.
# This is what "every layer reaches its kernels on GPU" means (issue 14); update it as kernels are renamed,
# split or merged. A prefix counts every kernel whose name starts with it. The kernels are jgnn's forward
# entry points (`gnn_gather_reduce_<kind>`, `gnn_gather_compute`, `gnn_attention`, `gnn_head_reduce_sum`,
# `gnn_head_compute`, each with a `_combine` for split hub rows); a backward pass is more calls of them, since a
# transpose is another edge op: the cotangent of a sum over destinations is a `gnn_gather_reduce_sum` over
# sources, a per-edge cotangent (typed matmul's edge rows) a `gnn_gather_compute`, max/min's tie mask a
# `gnn_gather_compute` beside the max/min, and attention's transpose (`SoftmaxRowDot` for the row sums,
# `SoftmaxVjp` per operand group) per-head walks, `gnn_head_reduce_sum` (and `gnn_head_compute` for per-edge
# operands such as HGT's typed keys).
EXPECTED_KERNELS: dict[str, dict[str, int]] = {
    "gcn": {"gnn_gather_reduce_sum": 2},
    "gat": {"gnn_attention": 1, "gnn_head_reduce_sum": 2},
    "gat_one_head": {"gnn_attention": 1, "gnn_head_reduce_sum": 2},
    "gat_attention_dropout": {"gnn_attention": 1, "gnn_head_reduce_sum": 2},
    # Forward only: its backward would run the shared attention vector's pullback on XLA (not lane-wise) and the
    # rest as kernels, and one backward's ops must share a lowering (`attention_tangent._one_lowering`).
    "gatv2": {"gnn_attention": 1},
    "sage_mean": {"gnn_gather_reduce_mean": 1, "gnn_gather_reduce_sum": 1},
    "sage_max": {"gnn_gather_reduce_max": 1, "gnn_gather_compute": 1, "gnn_gather_reduce_sum": 1},
    "sage_min": {"gnn_gather_reduce_min": 1, "gnn_gather_compute": 1, "gnn_gather_reduce_sum": 1},
    "gin": {"gnn_gather_reduce_sum": 2},
    "gine": {"gnn_gather_reduce_sum": 2, "gnn_gather_compute": 1},
    "edgeconv": {"gnn_gather_reduce_max": 1, "gnn_gather_compute": 2},
    # the typed matmuls' forward and input cotangent on the kernel; the table's cotangent on XLA's blocked GEMMs
    # (`jgnn.ops.typed_matmul._XLA_TWIN`)
    "rgcn": {"gnn_gather_reduce_sum": 1, "gnn_gather_compute": 1, "gnn_typed_matmul": 2},
    "rgat": {"gnn_attention": 1, "gnn_head_reduce_sum": 2, "gnn_typed_matmul": 4},
    "hgt": {"gnn_attention": 1, "gnn_head_reduce_sum": 2, "gnn_head_compute": 1, "gnn_typed_matmul": 6},
}

N, E, F = 64, 256, 64  # nodes, edges, feature width in and out (attention: 8 heads x 8)
NODE_TYPES, EDGE_TYPES = 2, 3
EDGE_DIM = 16


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(F)(nn.relu(nn.Dense(F)(x)))


@dataclass(frozen=True)
class LayerSpec:
    make: Callable[[str], nn.Module]  # backend -> module
    typed: bool = False
    train: bool = False  # deterministic=False: dropout on (needs the "dropout" rng)
    self_loops: bool = False  # the layer appends a self-loop per node: its layout must hold them
    edge_features: bool = False  # graph.edges["h"], [E, EDGE_DIM]


LAYERS: dict[str, LayerSpec] = {
    "gcn": LayerSpec(lambda b: gnn.GCNConv(F, backend=b), self_loops=True),
    "gat": LayerSpec(lambda b: gnn.GATConv(8, num_heads=8, backend=b), self_loops=True),
    "gat_one_head": LayerSpec(lambda b: gnn.GATConv(F, num_heads=1, backend=b), self_loops=True),
    "gat_attention_dropout": LayerSpec(lambda b: gnn.GATConv(8, num_heads=8, attention_dropout=0.2, backend=b),
                                       train=True, self_loops=True),
    "gatv2": LayerSpec(lambda b: gnn.GATv2Conv(8, num_heads=8, backend=b), self_loops=True),
    "sage_mean": LayerSpec(lambda b: gnn.SAGEConv(F, aggr="mean", backend=b)),
    "sage_max": LayerSpec(lambda b: gnn.SAGEConv(F, aggr="max", backend=b)),
    "sage_min": LayerSpec(lambda b: gnn.SAGEConv(F, aggr="min", backend=b)),
    "gin": LayerSpec(lambda b: gnn.GINConv(_MLP(), backend=b)),
    # GINE: relu(x_j + e), a custom_jvp in the message
    "gine": LayerSpec(lambda b: gnn.GINEConv(_MLP(), edge_dim=EDGE_DIM, backend=b), edge_features=True),
    "edgeconv": LayerSpec(lambda b: gnn.EdgeConv(_MLP(), aggr="max", backend=b)),
    "rgcn": LayerSpec(lambda b: gnn.RGCNConv(F, EDGE_TYPES, backend=b), typed=True),
    "rgat": LayerSpec(lambda b: gnn.RGATConv(8, EDGE_TYPES, num_heads=8, backend=b), typed=True),
    "hgt": LayerSpec(lambda b: gnn.HGTConv(F, 8, NODE_TYPES, EDGE_TYPES, backend=b), typed=True),
}


def _graph(typed: bool, edge_features: bool = False) -> jraph.GraphsTuple:
    rng = np.random.default_rng(1)
    nodes = {"h": jnp.asarray(rng.normal(size=(N, F)), jnp.float32)}
    edges = {"h": jnp.asarray(rng.normal(size=(E, EDGE_DIM)), jnp.float32)} if edge_features else None
    if typed:
        # Types as host arrays: layers range-check concrete types with numpy, which a jax array closed over by a
        # traced step is not.
        nodes["type"] = rng.integers(0, NODE_TYPES, N).astype(np.int32)
        edges = {"type": rng.integers(0, EDGE_TYPES, E).astype(np.int32)}
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=jnp.asarray(rng.integers(0, N, E), jnp.int32),
                             receivers=jnp.asarray(rng.integers(0, N, E), jnp.int32), n_node=jnp.array([N]),
                             n_edge=jnp.array([E]), globals=None)


def _train_step(spec: LayerSpec) -> Step:
    module, graph = spec.make("pallas"), _graph(spec.typed, spec.edge_features)
    # built once on the host, as a training loop would
    layout = GraphLayout.from_graph(graph, self_loops=spec.self_loops)
    rngs = lambda seed: {"params": jax.random.key(seed), "dropout": jax.random.key(seed + 1)}
    params = jax.eval_shape(lambda: module.init(rngs(0), graph, layout=layout, deterministic=not spec.train))

    def loss(p, x, seed):
        g = graph._replace(nodes={**graph.nodes, "h": x})
        out = module.apply(p, g, layout=layout, deterministic=not spec.train, rngs=rngs(seed))
        return jnp.sum(jnp.square(out.nodes["h"]))

    args = (params, jax.ShapeDtypeStruct((N, F), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))
    return Step(jax.value_and_grad(loss, argnums=(0, 1)), args)


def layer_cases() -> list[Case]:
    return [Case(f"layer/{name}", "layer", dict(layer=name, expected=EXPECTED_KERNELS.get(name, {})),
                 functools.partial(_train_step, spec), kind="layer") for name, spec in LAYERS.items()]


def missing_kernels(expected: dict[str, int], triton_calls: list[str]) -> dict[str, dict[str, int]]:
    """Each expected prefix that the step calls fewer times than required: ``{prefix: {"expected", "found"}}``."""
    found = {p: sum(name.startswith(p) for name in triton_calls) for p in expected}
    return {p: {"expected": n, "found": found[p]} for p, n in expected.items() if found[p] < n}
