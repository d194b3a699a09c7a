"""Systems behind one small interface: ``build(system, case, data, device) -> Runnable``.

* ``jgnn``: the `jgnn.nn` modules compiled by jgnn (``backend="pallas"`` on GPU, ``"xla"`` on CPU);
* ``reference``: the same modules with ``backend="reference"`` (the whole-graph program a jraph user writes);
* ``jraph``: `jraph.GraphConvolution` / `jraph.GAT` wrapped in flax (GCN and GAT only);
* ``pyg``: PyG 2.x ``GCNConv`` / ``GATConv`` / ``RGCNConv`` / ``HGTConv`` (CUDA only), mirroring the jgnn stack;
* micro suite: ``pallas`` (the fused kernel), ``xla`` (its pure-jnp segment-op reference), ``ragged_dot``
  (typed_matmul only) and ``byte_floor`` (no code: the bytes the kernel must move / copy bandwidth).

Every model is a stack of ``spec.layers`` convolutions with ReLU between them (see `suites.ModelSpec`).
Inference measures ``apply``; training measures one optimizer step (forward, softmax cross-entropy over all
nodes, backward, Adam update).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import pickle
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax

from benchmarks import suites
from jgnn.layout import GraphLayout


class Unavailable(Exception):
    """A system that cannot run here (missing module or package): recorded as status ``unavailable: ...``."""


class Skipped(Exception):
    """A row that is deliberately not measured on this device: recorded as status ``skipped: ...``."""


@dataclasses.dataclass
class Runnable:
    framework: str  # "jax": jit-compile fn(*args); "torch": call fn() ; "none": nothing to run (byte floor)
    fn: Callable | None = None
    args: tuple = ()
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # extra row fields (e.g. floor_bytes)
    peak_bytes: Callable[[], int | None] | None = None  # torch: per-row peak after the timed runs


# ---- data -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Data:
    name: str
    graph: jraph.GraphsTuple  # host arrays; typed graphs: nodes={"h","type"}, edges={"type"}
    labels: np.ndarray  # int32 [N], taken modulo the model's output width
    num_classes: int
    typed: bool
    num_node_types: int = 1
    num_edge_types: int = 1
    relation_schema: np.ndarray | None = None
    source: str = ""

    @property
    def num_nodes(self) -> int:
        return int(self.graph.n_node.sum())

    @property
    def num_edges(self) -> int:
        return int(self.graph.n_edge.sum())


def base_dataset(dataset: str) -> str:
    return dataset.split("/")[0]


DATA_CACHE_DIR: pathlib.Path | None = None  # set by ``--data-cache`` (and by ``--isolate`` for its workers)


@functools.lru_cache(maxsize=2)
def load_data(dataset: str, *, quick: bool, seed: int = 0, in_dim: int = 64) -> Data:
    """:func:`make_data`, memoised in-process and, when :data:`DATA_CACHE_DIR` is set, on disk (generating a
    Reddit-sized R-MAT graph takes minutes; per-row worker processes load it instead)."""
    if DATA_CACHE_DIR is None:
        return make_data(dataset, quick=quick, seed=seed, in_dim=in_dim)
    path = pathlib.Path(DATA_CACHE_DIR) / f"{dataset}-{'quick' if quick else 'full'}-s{seed}-d{in_dim}.pkl"
    if path.is_file():
        with path.open("rb") as f:
            return pickle.load(f)
    data = make_data(dataset, quick=quick, seed=seed, in_dim=in_dim)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)
    return data


def make_data(dataset: str, *, quick: bool, seed: int = 0, in_dim: int = 64) -> Data:
    """The graph of a benchmark data set: a synthetic graph with the preset's size (scaled down under
    ``--quick``); Cora is the real Planetoid graph when its file is found."""
    from jgnn import datasets

    name = base_dataset(dataset)
    st = datasets.PRESETS[name]
    rng = np.random.default_rng(seed + 1)
    if name == "cora":
        try:
            ds = datasets.load_planetoid("cora")
            return Data(name, ds.graph, np.asarray(ds.labels, np.int32), ds.num_classes, False,
                        source="planetoid")
        except Exception:  # noqa: BLE001 - fall back to the synthetic stand-in of the same size
            pass
    scale = suites.quick_scale(st.num_nodes, st.num_edges, st.typed) if quick else 1.0
    ds = datasets.synthetic_from_preset(name, scale=scale, seed=seed)
    source = f"synthetic(scale={scale:.4g})"
    if not st.typed:
        return Data(name, ds.graph, np.asarray(ds.labels, np.int32), ds.num_classes, False, source=source)
    g = ds.graph
    n = int(np.asarray(g.n_node).sum())
    nodes = {"h": rng.standard_normal((n, in_dim), dtype=np.float32),
             "type": np.asarray(g.nodes["type"], np.int32)}
    graph = g._replace(nodes=nodes, edges={"type": np.asarray(g.edges["type"], np.int32)})
    labels = rng.integers(0, 1 << 16, n).astype(np.int32)
    return Data(name, graph, labels, st.num_classes or in_dim, True, ds.num_node_types, ds.num_edge_types,
                np.asarray(ds.relation_schema), source=source)


def layer_dims(spec: suites.ModelSpec, data: Data) -> list[tuple[int, int]]:
    """``(features_per_head, heads)`` of each layer."""
    if spec.layers == 1:
        return [(spec.hidden, spec.heads)]
    return [(spec.hidden, spec.heads)] * (spec.layers - 1) + [(data.num_classes, 1)]


def node_features(graph: jraph.GraphsTuple):
    return graph.nodes["h"] if isinstance(graph.nodes, dict) else graph.nodes


def _map_features(graph: jraph.GraphsTuple, f) -> jraph.GraphsTuple:
    if isinstance(graph.nodes, dict):
        return graph._replace(nodes={**graph.nodes, "h": f(graph.nodes["h"])})
    return graph._replace(nodes=f(graph.nodes))


# ---- JAX models -------------------------------------------------------------------------------------------


class Stack(nn.Module):
    """Convolutions with ReLU between them; returns the last layer's node features. A `GraphLayout`, when
    given, goes to every layer (jgnn layers only)."""

    layers: tuple

    @nn.compact
    def __call__(self, graph, layout=None):
        for i, layer in enumerate(self.layers):
            if i:
                graph = _map_features(graph, jax.nn.relu)
            graph = layer(graph) if layout is None else layer(graph, layout=layout)
        return node_features(graph)


def _self_edges(graph: jraph.GraphsTuple):
    n = graph.nodes.shape[0]
    loop = jnp.arange(n, dtype=graph.senders.dtype)
    return jnp.concatenate([graph.senders, loop]), jnp.concatenate([graph.receivers, loop])


class JraphGCN(nn.Module):
    """`jraph.GraphConvolution` with self edges and symmetric normalization, bias after aggregation (PyG's
    ``GCNConv``)."""

    features: int

    @nn.compact
    def __call__(self, graph):
        gcn = jraph.GraphConvolution(nn.Dense(self.features, use_bias=False), add_self_edges=True,
                                     symmetric_normalization=True)
        out = gcn(graph)
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        return out._replace(nodes=out.nodes + bias)


class JraphGAT(nn.Module):
    """`jraph.GAT` with self edges added, per-head additive attention (leaky ReLU 0.2), heads concatenated,
    bias after aggregation (PyG's ``GATConv`` defaults)."""

    features: int
    num_heads: int = 1

    @nn.compact
    def __call__(self, graph):
        h, f = self.num_heads, self.features
        n = graph.nodes.shape[0]
        a_src = self.param("att_src", nn.initializers.glorot_uniform(), (1, h, f))
        a_dst = self.param("att_dst", nn.initializers.glorot_uniform(), (1, h, f))
        dense = nn.Dense(h * f, use_bias=False)

        def logits(sent, received, edges):
            del edges
            return jax.nn.leaky_relu((sent * a_src).sum(-1) + (received * a_dst).sum(-1), 0.2)[..., None]

        gat = jraph.GAT(lambda x: dense(x).reshape(n, h, f), logits, lambda x: x.reshape(n, h * f))
        senders, receivers = _self_edges(graph)
        out = gat(graph._replace(senders=senders, receivers=receivers))
        bias = self.param("bias", nn.initializers.zeros, (h * f,))
        return graph._replace(nodes=out.nodes + bias)


def random_params(model: nn.Module, graph, seed: int = 0):
    """Parameters with the shapes ``model.init`` gives, filled with N(0, 1/fan_in) draws on the host.

    Only the shapes come from flax (``eval_shape``: a trace, no compile); running ``init`` itself would cost a
    compile (jitted) or an op-by-op execution (eager) per row, and timings do not depend on the values.
    """
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(seed), graph)
    rng = np.random.default_rng(seed)

    def draw(s):
        fan_in = s.shape[-2] if len(s.shape) >= 2 else 1
        return jnp.asarray((rng.standard_normal(s.shape) / np.sqrt(fan_in)).astype(s.dtype))

    return jax.tree_util.tree_map(draw, shapes)


def jgnn_layers(spec: suites.ModelSpec, data: Data, backend: str) -> tuple:
    try:
        import jgnn.nn as jnn
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"jgnn.nn does not import: {type(e).__name__}: {e}") from e
    cls_name = {"gcn": "GCNConv", "gat": "GATConv", "rgcn": "RGCNConv", "rgat": "RGATConv", "hgt": "HGTConv"}
    cls = getattr(jnn, cls_name[spec.kind], None)
    if cls is None:
        raise Unavailable(f"jgnn.nn.{cls_name[spec.kind]} does not exist yet")
    r, t = data.num_edge_types, data.num_node_types
    make = {
        "gcn": lambda f, h: cls(f, backend=backend),
        "gat": lambda f, h: cls(f, num_heads=h, concat=True, backend=backend),
        "rgcn": lambda f, h: cls(f, num_relations=r, num_bases=None, root_weight=True, backend=backend),
        "rgat": lambda f, h: cls(f, num_relations=r, num_heads=h, backend=backend),
        "hgt": lambda f, h: cls(f, num_heads=h, num_node_types=t, num_edge_types=r, backend=backend),
    }[spec.kind]
    return tuple(make(f, h) for f, h in layer_dims(spec, data))


def jraph_layers(spec: suites.ModelSpec, data: Data) -> tuple:
    if spec.kind == "gcn":
        return tuple(JraphGCN(f) for f, _ in layer_dims(spec, data))
    if spec.kind == "gat":
        return tuple(JraphGAT(f, h) for f, h in layer_dims(spec, data))
    raise Unavailable(f"jraph has no {spec.kind} model")


def jax_backend(device: str) -> str:
    return "pallas" if device == "gpu" else "xla"


def build_jax_model(system: str, case: suites.Case, data: Data, device: str) -> Runnable:
    spec = suites.MODELS[case.model]
    if system in ("jgnn", "jgnn_xla"):
        layers = jgnn_layers(spec, data, "xla" if system == "jgnn_xla" else jax_backend(device))
    elif system == "reference":
        layers = jgnn_layers(spec, data, "reference")
    else:
        layers = jraph_layers(spec, data)
    model = Stack(layers)
    graph = jax.device_put(data.graph)
    # jgnn gets the sorted CSRs and typed pairs built once on the host, as PyG gets its CSR: preprocessing
    # GCNConv and GATConv append a self-loop per node: their layout describes the graph with those loops
    layout = jax.device_put(GraphLayout.from_graph(data.graph, self_loops=spec.kind in ("gcn", "gat"))) \
        if system in ("jgnn", "jgnn_xla") else None
    params = random_params(model, graph)
    out_dim = layer_dims(spec, data)[-1]
    labels = jax.device_put(data.labels % (out_dim[0] * out_dim[1]))
    if case.mode == "inference":
        return Runnable("jax", lambda p, g, lay: model.apply(p, g, lay), (params, graph, layout))
    opt = optax.adam(1e-3)

    def step(p, opt_state, g, y, lay):
        def loss_fn(q):
            logits = model.apply(q, g, lay)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, opt_state = opt.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    return Runnable("jax", step, (params, opt.init(params), graph, labels, layout))


# ---- PyG (GPU machine only; mirrors the jgnn stack) --------------------------------------------------------


def build_pyg_model(case: suites.Case, data: Data, device: str) -> Runnable:
    try:
        import torch
        import torch.nn.functional as F
        import torch_geometric.nn as pyg
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"torch_geometric does not import: {type(e).__name__}: {e}") from e
    if not torch.cuda.is_available():
        raise Unavailable("torch.cuda is not available")
    spec = suites.MODELS[case.model]
    dev = torch.device("cuda")
    g = data.graph
    senders, receivers = np.asarray(g.senders, np.int64), np.asarray(g.receivers, np.int64)
    edge_index = torch.as_tensor(np.stack([senders, receivers]), device=dev)
    x = torch.as_tensor(np.asarray(node_features(g), np.float32), device=dev)
    dims = layer_dims(spec, data)
    d_in = x.shape[1]
    convs = []
    for f, h in dims:
        if spec.kind == "gcn":
            convs.append(pyg.GCNConv(d_in, f))
        elif spec.kind == "gat":
            convs.append(pyg.GATConv(d_in, f, heads=h, concat=True))
        elif spec.kind == "rgcn":
            convs.append(pyg.RGCNConv(d_in, f, num_relations=data.num_edge_types, num_bases=None, root_weight=True))
        elif spec.kind == "hgt":
            convs.append(None)  # built below: needs the metadata
        else:
            raise Unavailable(f"no PyG mirror of {spec.kind}")
        d_in = f * h
    call = None
    if spec.kind in ("gcn", "gat"):
        call = lambda conv, h: conv(h, edge_index)
    elif spec.kind == "rgcn":
        edge_type = torch.as_tensor(np.asarray(g.edges["type"], np.int64), device=dev)
        call = lambda conv, h: conv(h, edge_index, edge_type)
    else:  # hgt: per-type dicts; node types are contiguous (sorted), so a type's rows are a slice
        node_type = np.asarray(g.nodes["type"])
        edge_type = np.asarray(g.edges["type"])
        starts = np.searchsorted(node_type, np.arange(data.num_node_types + 1))
        local = np.arange(node_type.shape[0]) - starts[node_type]
        ntypes = [f"n{t}" for t in range(data.num_node_types)]
        edge_index_dict = {}
        for r in range(data.num_edge_types):
            m = edge_type == r
            st, dt = (int(v) for v in data.relation_schema[r])
            ei = np.stack([local[senders[m]], local[receivers[m]]])
            edge_index_dict[(f"n{st}", f"r{r}", f"n{dt}")] = torch.as_tensor(ei, device=dev)
        metadata = (ntypes, list(edge_index_dict))
        d_in = x.shape[1]
        for i, (f, h) in enumerate(dims):
            convs[i] = pyg.HGTConv(d_in, f * h, metadata, heads=h)
            d_in = f * h
        sizes = np.diff(starts)

        def call(conv, h):
            out = conv({nt: h[starts[t]:starts[t + 1]] for t, nt in enumerate(ntypes)}, edge_index_dict)
            parts = [out.get(nt) if out.get(nt) is not None else h.new_zeros(int(sizes[t]), conv.out_channels)
                     for t, nt in enumerate(ntypes)]
            return torch.cat(parts, 0)

    model = torch.nn.ModuleList(convs).to(dev)

    def forward():
        h = x
        for i, conv in enumerate(model):
            if i:
                h = torch.relu(h)
            h = call(conv, h)
        return h

    out_dim = dims[-1][0] * dims[-1][1]
    labels = torch.as_tensor(data.labels % out_dim, dtype=torch.int64, device=dev)
    if case.mode == "inference":
        model.eval()

        def fn():
            with torch.no_grad():
                return forward()
    else:
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def fn():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward(), labels)
            loss.backward()
            opt.step()
            return loss

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return Runnable("torch", fn, info={"torch_version": torch.__version__},
                    peak_bytes=lambda: int(torch.cuda.max_memory_allocated()))


# ---- micro suite ------------------------------------------------------------------------------------------

MICRO_TYPES = 8  # typed_matmul: rows split evenly into this many types


def build_micro(system: str, case: suites.Case, data: Data, device: str) -> Runnable:
    """One fused kernel's forward on ``data``'s graph at width ``d`` (from the dataset name ``<graph>/d=<d>``),
    against its pure-jnp reference on XLA."""
    kernel = case.model
    d = int(case.dataset.split("d=")[1])
    try:
        import pallas_kernels as pk
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"pallas_kernels: {type(e).__name__}: {e}") from e
    g = data.graph
    n, e = data.num_nodes, data.num_edges
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, d), dtype=np.float32))
    i32 = 4
    if kernel == "typed_matmul":
        w = jnp.asarray(rng.standard_normal((MICRO_TYPES, d, d), dtype=np.float32) / np.sqrt(d))
        gs = jnp.asarray(np.diff(np.linspace(0, n, MICRO_TYPES + 1).astype(np.int32)))
        fns = {"pallas": lambda x, w, gs: pk.typed_matmul(x, w, gs, impl="pallas"),
               "ragged_dot": lambda x, w, gs: pk.typed_matmul(x, w, gs, impl="ragged_dot"),
               "xla": lambda x, w, gs: pk.typed_matmul_reference(x, w, gs)}
        args = (x, w, gs)
        floor = x.nbytes + w.nbytes + n * d * 4 + gs.nbytes
    else:
        csr, _ = pk.build_csr_numpy(np.asarray(g.senders), np.asarray(g.receivers), n)
        csr = jax.device_put(csr)
        csr_bytes = (n + 1 + e) * i32  # indptr + col: the index stream a row walk must read
        if kernel == "gather_reduce":
            edge_fn = lambda c, r, u, s: c[0]
            run = lambda f: lambda x, c: f(edge_fn, (x,), (), (), (), c, reduce="sum")
            args = (x, csr)
            floor = x.nbytes + n * d * 4 + csr_bytes
            fns = {"pallas": run(pk.gather_reduce_forward), "xla": run(pk.gather_reduce_forward_reference)}
        elif kernel == "gather_compute":
            edge_fn = lambda c, r, u, s: c[0] * r[0]
            run = lambda f: lambda x, c: f(edge_fn, (x,), (x,), (), (), c, num_edges=e)
            args = (x, csr)
            floor = x.nbytes + e * d * 4 + csr_bytes + e * i32  # + eid: outputs are addressed by edge id
            fns = {"pallas": run(pk.gather_compute_forward), "xla": run(pk.gather_compute_forward_reference)}
        else:  # attention_aggregate: one head, GAT-style additive score
            a_src = jnp.asarray(rng.standard_normal((n, 1), dtype=np.float32))
            a_dst = jnp.asarray(rng.standard_normal((n, 1), dtype=np.float32))
            edge_fn = lambda c, r, u, s: (jax.nn.leaky_relu(c[0] + r[0], 0.2), c[1])
            run = lambda f: lambda a, b, v, c: f(edge_fn, (a, v), (b,), (), (), c, heads=1)[0]
            v = x[:, None, :]
            args = (a_src, a_dst, v, csr)
            floor = v.nbytes + a_src.nbytes + a_dst.nbytes + n * d * 4 + csr_bytes
            fns = {"pallas": run(pk.attention_forward), "xla": run(pk.attention_forward_reference)}
    info = {"floor_bytes": int(floor)}
    if system == "byte_floor":
        return Runnable("none", info=info)
    if system not in fns:
        raise Unavailable(f"no {system} version of {kernel}")
    return Runnable("jax", fns[system], args, info=info)


# ---- entry point ------------------------------------------------------------------------------------------


def skip_reason(system: str, case: suites.Case, device: str) -> str | None:
    """Why this row is not measured on ``device`` (``None``: it is)."""
    if device == "gpu":
        return None
    if case.gpu_only:
        return "GPU only"
    if system == "pyg":
        return "PyG is measured on the GPU machine only"
    if system == "pallas":
        return "needs GPU (Pallas runs only in interpret mode on CPU)"
    if system == "jgnn_xla":
        return "on CPU the jgnn row runs the XLA backend"
    return None


def build(system: str, case: suites.Case, data: Data, device: str) -> Runnable:
    reason = skip_reason(system, case, device)
    if reason:
        raise Skipped(reason)
    if case.micro:
        return build_micro(system, case, data, device)
    if system == "pyg":
        return build_pyg_model(case, data, device)
    return build_jax_model(system, case, data, device)
