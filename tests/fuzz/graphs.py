"""Graphs and input values for the fuzzer, built deterministically from small specs.

A `GraphSpec` names a shape from the bounded `SHAPES` menu (so jit caches hit when shapes repeat), a set of
structural flags (hubs, isolated nodes, self-loops, duplicates, jraph padding, negative ids, ...) and a seed.
A `ValueSpec` names a magnitude and a list of special-value patterns (NaN, ±inf, −1e9 masks, ties, near-ties), each
applied to one float input leaf. `build_inputs` turns both, with a program's `Signature`, into the concrete
input pytree; the result is plain numpy, so the reproducer can print it.
"""

from __future__ import annotations

import dataclasses

import jax
import jraph
import ml_dtypes
import numpy as np

from jgnn.layout import GraphLayout


@dataclasses.dataclass(frozen=True)
class Shape:
    """A graph shape: real nodes and edges, graphs per batch, and jraph padding (extra nodes, extra edges)."""

    name: str
    nodes: int
    edges: int
    graphs: int = 1
    pad: tuple[int, int] | None = None
    hub: int = 0  # in-degree of node 0: the first ``hub`` edges (lowest ids) all point to it

    @property
    def total_nodes(self) -> int:
        return self.nodes + (self.pad[0] if self.pad else 0)

    @property
    def total_edges(self) -> int:
        return self.edges + (self.pad[1] if self.pad else 0)


# The first entry is the simplest: hypothesis shrinks towards it. The hub shape is slow (1,100 edges), so the
# strategies draw it rarely.
SHAPES = {s.name: s for s in (
    Shape("small", 13, 40),
    Shape("sparse", 9, 4),          # E < N: most nodes have empty neighbourhoods
    Shape("dense", 6, 72),          # E >> N: many duplicates
    Shape("batch", 16, 36, graphs=3),
    Shape("padded", 12, 30, graphs=2, pad=(3, 6)),
    Shape("empty", 5, 0),           # no edges at all
    Shape("star", 10, 160, hub=150),  # in-degree above one kernel chunk (16 to 64 edges)
    Shape("hub", 40, 1100, hub=1050),  # in-degree >= 1,000
)}

# Structural flags, applied in this order by `_structure`.
FLAGS = ("isolated", "sources", "self_loops", "duplicates", "sorted", "negative", "out_of_range")
# Flags outside jraph's defined semantics for concrete (eager) calls; only valid under jit.
UNDER_JIT_ONLY = frozenset({"negative", "out_of_range"})


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """A graph: a shape from `SHAPES`, structure flags from `FLAGS`, and a seed.

    Under x64 (float64 and complex128 cases), a graph with an odd seed has int64 ids and counts, as numpy gives
    them by default: jnp narrows such ids to int32, so jgnn must read through that narrowing (`id_dtype`).
    """

    shape: str = "small"
    flags: frozenset = frozenset()
    seed: int = 0

    def id_dtype(self, dtype) -> np.dtype:
        """The dtype of the graph's ids and counts for values of ``dtype``."""
        wide = np.dtype(dtype) in (np.dtype(np.float64), np.dtype(np.complex128)) and self.seed % 2
        return np.dtype(np.int64 if wide else np.int32)

    def __repr__(self) -> str:
        return f"GraphSpec({self.shape!r}, flags={sorted(self.flags)}, seed={self.seed})"


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A special-value pattern applied to one float input leaf (see `PATTERNS`)."""

    kind: str
    leaf: str  # "nodes.h", "edges.b", "globals", "extras.graph2.nodes.h", ...


@dataclasses.dataclass(frozen=True)
class ValueSpec:
    seed: int = 0
    magnitude: str = "normal"  # key of MAGNITUDES
    patterns: tuple[Pattern, ...] = ()


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a program reads: feature names and trailing shapes, type counts and extra arguments.

    ``extras`` holds ``("idx", k)`` (an int32 index array of k node ids passed as its own argument),
    ``("graph2", shape_name)`` (a second GraphsTuple of another size) and ``("key",)`` (a typed PRNG key).
    """

    node_feats: tuple[tuple[str, tuple[int, ...]], ...] = (("h", (8,)),)
    edge_feats: tuple[tuple[str, tuple[int, ...]], ...] = ()
    globals_width: int = 0
    node_types: int = 0
    edge_types: int = 0
    edge_keys: bool = False  # uint32 [E, 2] raw key data as edges["key"]
    extras: tuple[tuple, ...] = ()


# ---- structure ---------------------------------------------------------------------------------------------

def _edges_within(rng, e: int, live: int, first_receiver: int) -> tuple[np.ndarray, np.ndarray]:
    """``e`` random edges among nodes ``[0, live)``; receivers start at ``first_receiver`` (sources only below)."""
    return rng.integers(0, live, e), rng.integers(min(first_receiver, live - 1), live, e)


def _structure(shape: Shape, flags: frozenset, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """senders, receivers, n_node, n_edge of the real (unpadded) batch."""
    n, e, g = shape.nodes, shape.edges, shape.graphs
    sizes = np.full(g, n // g)
    sizes[-1] += n - sizes.sum()
    edge_counts = np.bincount(np.sort(rng.integers(0, g, e)), minlength=g) if e else np.zeros(g, int)
    senders, receivers, start = [], [], 0
    for size, count in zip(sizes, edge_counts, strict=True):
        live = max(size - (2 if "isolated" in flags and size > 3 else 0), 1)
        s, r = _edges_within(rng, count, live, 2 if "sources" in flags else 0)
        senders.append(s + start)
        receivers.append(r + start)
        start += size
    senders, receivers = np.concatenate(senders), np.concatenate(receivers)
    if shape.hub:  # the hub's in-edges come first, so its first chunks hold the lowest edge ids
        receivers[:shape.hub] = 0
    if "self_loops" in flags and e:
        pick = rng.choice(e, size=max(1, e // 8), replace=False)
        receivers[pick] = senders[pick]
    if "duplicates" in flags and e >= 4:
        k = max(1, e // 8)
        senders[-k:], receivers[-k:] = senders[:k], receivers[:k]
    if "sorted" in flags:
        order = np.lexsort((senders, receivers))
        senders, receivers = senders[order], receivers[order]
    if "negative" in flags and e:  # wrapped by gathers, dropped by segment ops (jraph semantics under jit)
        pick = rng.choice(e, size=max(1, e // 10), replace=False)
        receivers[pick[::2]] = -1 - rng.integers(0, n, len(pick[::2]))
        senders[pick[1::2]] = -1 - rng.integers(0, n, len(pick[1::2]))
    if "out_of_range" in flags and e:  # clamped by gathers, dropped by segment ops
        pick = rng.choice(e, size=max(1, e // 10), replace=False)
        receivers[pick] = n + rng.integers(0, 3, len(pick))
    return senders.astype(np.int32), receivers.astype(np.int32), sizes.astype(np.int32), \
        edge_counts.astype(np.int32)


# ---- values ------------------------------------------------------------------------------------------------

def _finfo(dtype):
    return ml_dtypes.finfo(dtype) if dtype in (ml_dtypes.bfloat16,) else np.finfo(dtype)


# Scale of ordinary values; "huge" and "tiny" sit where products overflow or underflow in the dtype.
MAGNITUDES = {
    "normal": lambda fi: 1.0,
    "huge": lambda fi: float(fi.max) ** 0.5,
    "tiny": lambda fi: float(fi.tiny) ** 0.5,
}


def _rows_of_receivers(receivers: np.ndarray, rng) -> np.ndarray:
    """Edge mask: every in-edge of a random half of the receiving nodes."""
    live = np.unique(receivers[receivers >= 0])
    chosen = rng.choice(live, size=max(1, len(live) // 2), replace=False) if len(live) else live
    return np.isin(receivers, chosen)


def _few(shape, rng) -> np.ndarray:
    mask = np.zeros(shape, bool)
    flat = mask.reshape(-1)
    if flat.size:
        flat[rng.choice(flat.size, size=max(1, flat.size // 16), replace=False)] = True
    return mask


# Each pattern maps (array, receivers of its rows or None, rng) -> new array. Row patterns need edge leaves.
PATTERNS = {
    "nan": lambda x, r, rng: np.where(_few(x.shape, rng), np.nan, x),
    "posinf": lambda x, r, rng: np.where(_few(x.shape, rng), np.inf, x),
    "neginf": lambda x, r, rng: np.where(_few(x.shape, rng), -np.inf, x),
    "ties": lambda x, r, rng: np.round(x),
    "near_ties": lambda x, r, rng: _near_ties(x, rng),
    "zeros": lambda x, r, rng: np.zeros_like(x),
    "mask_rows_1e9": lambda x, r, rng: _masked(x, r, rng, -1e9),
    "mask_rows_inf": lambda x, r, rng: _masked(x, r, rng, -np.inf),
    "neginf_prefix": lambda x, r, rng: _prefix(x, -np.inf),
}
EDGE_PATTERNS = frozenset({"mask_rows_1e9", "mask_rows_inf", "neginf_prefix"})


def _near_ties(x, rng):
    """Values 4 ± a few ulps of one of bfloat16, float16 or float32 (exactly representable there): distinct scores
    inside the window within which a recomputed attention score counts as its row's max."""
    mantissa = rng.choice([7, 10, 23])
    return 4.0 + 4.0 * np.clip(np.round(2 * x.real), -4, 4) * 2.0 ** -mantissa


def _masked(x, receivers, rng, value):
    if receivers is None:
        return x
    rows = _rows_of_receivers(receivers, rng)
    return np.where(rows.reshape((-1,) + (1,) * (x.ndim - 1)), value, x)


def _prefix(x, value):
    out = x.copy()
    out[: len(x) // 2] = value
    return out


def _float_array(rng, shape, dtype, scale: float) -> np.ndarray:
    x = rng.normal(size=shape) * scale
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.normal(size=shape) * scale
    return x


def _cast(x: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Built:
    """Concrete inputs: ``{"graph": GraphsTuple, **extras}`` (numpy arrays), and the float leaf names."""

    inputs: dict
    float_leaves: tuple[str, ...]


def _graph(sig: Signature, shape: Shape, flags: frozenset, rng, dtype, scale: float) -> jraph.GraphsTuple:
    senders, receivers, n_node, n_edge = _structure(shape, flags, rng)
    n, e = shape.nodes, shape.edges
    nodes = {name: _float_array(rng, (n,) + tail, dtype, scale) for name, tail in sig.node_feats}
    if sig.node_types:
        nodes["type"] = rng.integers(0, sig.node_types, n).astype(np.int32)
    edges = {name: _float_array(rng, (e,) + tail, dtype, scale) for name, tail in sig.edge_feats}
    if sig.edge_types:
        edges["type"] = rng.integers(0, sig.edge_types, e).astype(np.int32)
    if sig.edge_keys:
        edges["key"] = rng.integers(0, 2**32, (e, 2), dtype=np.uint64).astype(np.uint32)
    glob = _float_array(rng, (shape.graphs, sig.globals_width), dtype, scale) if sig.globals_width else None
    graph = jraph.GraphsTuple(nodes=nodes, edges=edges or None, senders=senders, receivers=receivers,
                              n_node=n_node, n_edge=n_edge, globals=glob)
    if shape.pad:
        graph = jraph.pad_with_graphs(graph, n_node=shape.total_nodes, n_edge=shape.total_edges,
                                      n_graph=shape.graphs + 1)
        graph = graph._replace(**{f: np.asarray(getattr(graph, f), np.int32)
                                  for f in ("senders", "receivers", "n_node", "n_edge")})
    return graph


def named_leaves(tree):
    """(dotted name, leaf) pairs of a pytree of numpy arrays, and its treedef."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = [".".join(_key_name(k) for k in path) for path, _ in with_path]
    return list(zip(names, [leaf for _, leaf in with_path], strict=True)), treedef


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def is_float(x) -> bool:
    """Floating or complex (bfloat16 included); False for ints, bools and typed PRNG keys."""
    dtype = getattr(x, "dtype", None) or np.asarray(x).dtype
    return not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and jax.dtypes.issubdtype(dtype, np.inexact)


def build_inputs(sig: Signature, graph: GraphSpec, values: ValueSpec, dtype) -> Built:
    """The concrete input pytree for one case; float leaves get ``dtype`` and the value patterns."""
    rng = np.random.default_rng([graph.seed, values.seed])
    fi = _finfo(dtype if not np.issubdtype(dtype, np.complexfloating) else np.float32)
    scale = MAGNITUDES[values.magnitude](fi)
    inputs = {"graph": _with_ids(_graph(sig, SHAPES[graph.shape], graph.flags, rng, dtype, scale),
                                 graph.id_dtype(dtype))}
    shape = SHAPES[graph.shape]
    for extra in sig.extras:
        if extra[0] == "idx":  # one node id per edge, e.g. negative samples
            inputs["idx"] = rng.integers(0, shape.total_nodes, shape.total_edges).astype(np.int32)
        elif extra[0] == "graph2":
            other = shape if extra[1] == "same" else SHAPES[extra[1]]
            inputs["graph2"] = _graph(sig, other, frozenset(), rng, dtype, scale)
        elif extra[0] == "key":
            inputs["key"] = _key(extra[1], values.seed)
    named = dict(named_leaves(inputs)[0])
    receivers_of = {"graph.edges": inputs["graph"].receivers}
    if "graph2" in inputs:
        receivers_of["graph2.edges"] = inputs["graph2"].receivers
    for p in values.patterns:
        if p.leaf not in named or not is_float(named[p.leaf]):
            continue
        owner = next((v for k, v in receivers_of.items() if p.leaf.startswith(k + ".")), None)
        if p.kind in EDGE_PATTERNS and owner is None:
            continue
        named[p.leaf] = PATTERNS[p.kind](np.asarray(named[p.leaf], np.float64 if not np.iscomplexobj(
            named[p.leaf]) else np.complex128), owner, np.random.default_rng([graph.seed, values.seed, 7]))
    flat, treedef = named_leaves(inputs)
    leaves = [_cast(named[name], dtype) if is_float(leaf) else leaf for name, leaf in flat]
    inputs = jax.tree_util.tree_unflatten(treedef, leaves)
    # Host-built CSRs of the first graph, padding edges included: ``padded=True`` would declare the padding graph's
    # outputs and its edges' share of the gradients unspecified (jraph's convention), which the reference does not
    # know; the suite checks that option on real nodes (test_nn, test_optimizer). Campaign 20261205: 36 cases
    # with NaN in padding rows, and every pallas_interpret gradient of a padding node's features.
    if any(extra[0] == "layout" for extra in sig.extras):
        inputs["layout"] = GraphLayout.from_graph(inputs["graph"])
    return Built(inputs, tuple(name for name, leaf in flat if is_float(leaf)))


def _with_ids(g: jraph.GraphsTuple, id_dtype: np.dtype) -> jraph.GraphsTuple:
    return g._replace(**{f: np.asarray(getattr(g, f), id_dtype) for f in ("senders", "receivers", "n_node",
                                                                            "n_edge")})


def _key(kind: str, seed: int):
    """A typed PRNG key (``jax.random.key``) or raw uint32 key data (``jax.random.PRNGKey``)."""
    return jax.random.key(seed) if kind == "typed" else np.asarray(jax.random.PRNGKey(seed))
