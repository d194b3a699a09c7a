"""Residency inference: where on the graph each value lives, and how each op moves data.

This is Graphiler's MP-DFG analysis (its Table 1) on a flat jgnn `Program`. Every value gets an `Info`:

* ``residency``: ``shared`` (weights, constants), ``graph`` (one row per graph), ``node_type``/``edge_type``
  (one row per type, e.g. a typed weight table), ``node`` (one row per node), ``edge`` (one row per edge) or
  ``pair`` (one row per unique (source, edge type) pair of a `jgnn.layout.GraphLayout`: Hector's compact
  materialisation, made only by the ``typed_matmul`` pass);
* ``index``: for integer arrays, what they enumerate (``src``/``dst`` node ids of each edge, ``node_type``/
  ``edge_type`` ids, or ``n_node``/``n_edge`` for graph ids derived from the counts). Index provenance flows
  through the ops JAX inserts around a gather (negative-index wrapping, ``convert_element_type``,
  ``broadcast_in_dim``, clamping), so raw jraph code is recognised, not only jgnn's combinator;
* ``expanded``: a shared value broadcast along a graph axis (every row equal), e.g. the zeros a scatter starts
  from;
* ``reduced_by``: for node values made by a reduce, the index they were reduced over, so that gathering them
  back along the same index is recognised as a *norm* (the two halves of a softmax).

Every op gets a *movement*: ``broadcast_src``/``broadcast_dst`` (gather node rows to edges),
``broadcast_type`` (gather a per-type or per-graph table), ``broadcast_pair`` (gather a per-pair table to the
edges), ``reduce`` (scatter edges to nodes, or nodes to
graphs), ``norm`` (gather back a reduction along its own index) or ``dense`` (row-wise compute).

A value that no rule explains (a gather by data-dependent indices, an unknown primitive on graph data) is
``unknown``; the op that made it is recorded as a fallback with its reason, and everything computed from it
is left to the reference program. The rules live in `RULES`, one per primitive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jgnn import ir
from jgnn.rowwise import out_axis

SHARED, GRAPH, NODE_TYPE, EDGE_TYPE, NODE, EDGE, PAIR, UNKNOWN = (
    "shared", "graph", "node_type", "edge_type", "node", "edge", "pair", "unknown")
GRAPH_AXES = (GRAPH, NODE, EDGE)
MOVEMENTS = ("broadcast_src", "broadcast_dst", "broadcast_type", "broadcast_pair", "reduce", "norm", "dense")


@dataclasses.dataclass(frozen=True)
class Info:
    residency: str
    index: str | None = None
    expanded: bool = False
    reduced_by: str | None = None
    axis: int = 0  # where the graph axis is (a multi-head einsum may move it off 0 and back)


@dataclasses.dataclass(frozen=True)
class InputTag:
    """What a flat input of the traced function is: its role in a GraphsTuple, or ``shared``."""

    role: str  # nodes, edges, senders, receivers, n_node, n_edge, globals, node_type, edge_type, shared
    graph: int = 0


INPUT_INFO = {
    "nodes": Info(NODE), "edges": Info(EDGE), "globals": Info(GRAPH), "shared": Info(SHARED),
    "layout": Info(SHARED),
    "senders": Info(EDGE, index="src"), "receivers": Info(EDGE, index="dst"),
    "node_type": Info(NODE, index="node_type"), "edge_type": Info(EDGE, index="edge_type"),
    "n_node": Info(GRAPH, index="n_node"), "n_edge": Info(GRAPH, index="n_edge"),
}

# What residency a gathered row lands at, for each index kind (gathers copy the index array's rows).
_GATHER_MOVEMENT = {"node_id": "dense", "src": "broadcast_src", "dst": "broadcast_dst", "node_type": "broadcast_type",
                    "edge_type": "broadcast_type", "n_node": "broadcast_type", "n_edge": "broadcast_type"}
_TYPE_TABLE = {"node_type": NODE_TYPE, "edge_type": EDGE_TYPE}

# Ops through which an integer array keeps meaning the same ids.
_INDEX_PRESERVING = frozenset({"concatenate", "slice", "convert_element_type", "broadcast_in_dim", "reshape",
                               "squeeze", "copy", "copy_p", "clamp", "select_n", "add", "sub", "stop_gradient"})


@dataclasses.dataclass(frozen=True)
class OpRecord:
    """The analysis of one op, as `explain` shows it."""

    primitive: str
    movement: str
    out_residency: str
    index: str | None = None
    shape: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Fallback:
    primitive: str
    reason: str


@dataclasses.dataclass
class Analysis:
    info: dict[int, Info]
    records: dict[int, OpRecord]  # keyed by id(op)
    fallbacks: list[Fallback]
    sizes: dict[str, int]

    def of(self, atom: ir.Atom) -> Info:
        return Info(SHARED) if isinstance(atom, ir.Const) else self.info[atom.id]


class _Unknown(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---- helpers ---------------------------------------------------------------------------------------------

def _join(infos: list[Info]) -> str:
    """Residency of a row-wise op's output: the finest graph axis among its inputs."""
    axes = {i.residency for i in infos if i.residency != SHARED and not i.expanded}
    if not axes:
        return SHARED
    if len(axes) > 1:
        raise _Unknown(f"combines {' and '.join(sorted(axes))} rows without a broadcast between them")
    return axes.pop()


def row_gather_axis(op: ir.Op) -> int | None:
    """The axis along which ``op`` gathers whole rows by a ``[K, c]`` index array, or None.

    Accepted forms: ``x[senders]``/``jnp.take`` (one index column, that axis collapsed), the batched
    ``dynamic_slice`` that ``vmap`` makes of ``W[t]`` (columns ``[t, 0, ...]``, nothing collapsed: every other
    slice spans its whole axis, so its start can only be 0), and the gathers along axis ``p`` that broadcast
    reordering emits for values whose row axis a multi-head einsum moved.
    """
    dn = op.params.get("dimension_numbers")
    operand, idx = op.inputs
    if dn is None or getattr(dn, "operand_batching_dims", ()) or idx.ndim != 2:
        return None
    sizes, cols = tuple(op.params["slice_sizes"]), idx.shape[-1]
    collapsed, starts, offsets = tuple(dn.collapsed_slice_dims), tuple(dn.start_index_map), tuple(dn.offset_dims)
    if len(collapsed) == 1 and cols == 1 and starts == collapsed:
        p = collapsed[0]
        whole = sizes == tuple(1 if d == p else n for d, n in enumerate(operand.shape))
        return p if whole and offsets == tuple(d for d in range(operand.ndim) if d != p) else None
    if not collapsed and starts == tuple(range(cols)) and sizes == (1, *operand.shape[1:]):
        return 0 if offsets == tuple(range(1, operand.ndim + 1)) else None
    return None


def is_row_scatter(op: ir.Op) -> bool:
    """``operand.at[idx].op(updates)`` along axis 0 with whole rows (what ``segment_sum`` lowers to)."""
    dn = op.params.get("dimension_numbers")
    operand, idx, updates = op.inputs
    return (dn is not None and tuple(dn.inserted_window_dims) == (0,)
            and tuple(dn.scatter_dims_to_operand_dims) == (0,)
            and tuple(dn.update_window_dims) == tuple(range(1, updates.ndim))
            and not getattr(dn, "operand_batching_dims", ()) and idx.shape[-1:] == (1,))


def _expands(op: ir.Op) -> bool:
    (x,) = op.inputs
    out = op.outputs[0]
    return out.ndim > 0 and (0 not in op.params["broadcast_dimensions"] or (x.ndim > 0 and x.shape[0] == 1
                                                                            and out.shape[0] != 1))


# ---- rules: each takes (op, input infos, sizes) and returns (output infos, movement) ---------------------

def _is_per_row_gather(op: ir.Op) -> bool:
    """``x[e, i[e]]``: each row picks from its own row (what ``vmap`` makes of indexing by a per-row id)."""
    dn = op.params.get("dimension_numbers")
    return dn is not None and tuple(getattr(dn, "operand_batching_dims", ())) == (0,) and tuple(
        getattr(dn, "start_indices_batching_dims", ())) == (0,)


def _is_lookup(op: ir.Op, operand: Info, idx: Info) -> bool:
    """A shared table read once per row of a graph-resident index array: output row i uses index row i only."""
    dn = op.params.get("dimension_numbers")
    return (dn is not None and operand.residency == SHARED and not operand.expanded and idx.axis == 0
            and idx.residency in (NODE, EDGE) and 0 not in tuple(dn.offset_dims)
            and not getattr(dn, "operand_batching_dims", ()))


def _rule_gather(op, infos, sizes):
    operand, idx = infos
    if _is_per_row_gather(op) and operand.axis == 0 and idx.axis == 0:
        return [Info(_join([operand, idx]))], "dense"
    axis = row_gather_axis(op)
    if axis is None and _is_lookup(op, operand, idx):  # W[t, id]: rows of a weight table, one lookup per row
        return [Info(idx.residency)], "broadcast_type" if idx.index in _TYPE_TABLE else "dense"
    if axis is None:
        if operand.residency in GRAPH_AXES or idx.residency in GRAPH_AXES:
            raise _Unknown("gather that does not take whole rows along the leading axis")
        return [Info(SHARED)], "dense"
    if idx.index is None:
        if idx.residency == SHARED:
            if operand.residency == SHARED:
                return [Info(SHARED)], "dense"
            raise _Unknown("gather of graph rows by constant indices")
        if _is_lookup(op, operand, idx):  # an embedding lookup: any ids, into a weight table
            return [Info(idx.residency)], "dense"
        raise _Unknown("gather with data-dependent indices (not derived from senders, receivers, types or "
                       "counts)")
    movement = _GATHER_MOVEMENT[idx.index]
    if idx.index == "node_id" and operand.residency == NODE:
        return [Info(NODE, index=operand.index)], movement
    if idx.index in ("src", "dst"):
        if operand.residency != NODE or operand.axis != axis:
            raise _Unknown(f"gather of {operand.residency} rows by {idx.index} node ids")
        if operand.reduced_by == idx.index:
            movement = "norm"
        # A gathered id array still names the same kind of thing (e.g. the type of each edge's source).
        keep = operand.index if operand.index in _TYPE_TABLE else None
        return [Info(EDGE, index=keep, axis=axis)], movement
    if operand.residency not in (SHARED, GRAPH) and operand.residency not in _TYPE_TABLE.values():
        raise _Unknown(f"gather of {operand.residency} rows by {idx.index} ids")
    return [Info(idx.residency)], movement


def _rule_scatter_reduce(op, infos, sizes):
    operand, idx, updates = infos
    if not is_row_scatter(op) or idx.index is None:
        if all(i.residency == SHARED for i in infos):
            return [Info(SHARED)], "dense"
        raise _Unknown("scatter with data-dependent indices or partial rows")
    if idx.index in ("src", "dst") and updates.residency in (EDGE, SHARED) and updates.axis == 0 and \
            operand.residency in (SHARED, NODE):
        return [Info(NODE, reduced_by=idx.index)], "reduce"
    if idx.index in ("n_node", "n_edge"):
        return [Info(GRAPH, index=None)], "reduce"
    if idx.index in _TYPE_TABLE and operand.residency == SHARED:
        return [Info(_TYPE_TABLE[idx.index])], "reduce"
    raise _Unknown(f"scatter of {updates.residency} rows by {idx.index} ids into {operand.residency} rows")


def _rule_broadcast_in_dim(op, infos, sizes):
    (x,) = infos
    if x.residency == SHARED or x.expanded:
        return [Info(SHARED, expanded=_expands(op) or x.expanded)], "dense"
    return _rule_dense(op, infos, sizes)


def _index_out(op: ir.Op, infos: list[Info]) -> str | None:
    """The id kind an index-preserving op keeps (JAX's wrap-negative-index code is add/select_n/clamp)."""
    if op.name not in _INDEX_PRESERVING:
        return None
    if op.name == "slice":  # keeping column 0 of [ids, 0, ...] keeps the ids
        return infos[0].index if op.params["start_indices"][-1] == 0 and op.inputs[0].ndim == 2 else None
    if op.name == "concatenate":  # [ids, 0, ...] columns of a batched dynamic_slice: column 0 names the row
        if op.params["dimension"] == op.outputs[0].ndim - 1 and all(i.residency == SHARED for i in infos[1:]):
            return infos[0].index
        return None
    if op.name == "select_n":  # the predicate is data; the cases must all be the same ids
        cases = [infos[k].index for k in range(1, len(infos)) if not isinstance(op.inputs[k], ir.Const)]
        return cases[0] if cases and all(c == cases[0] for c in cases) else None
    kinds = {i.index for i, a in zip(infos, op.inputs, strict=True)
             if not isinstance(a, ir.Const) and not (i.residency == SHARED and i.index is None)}
    return kinds.pop() if len(kinds) == 1 else None


def _row_axes(infos: list[Info]) -> list[int | None]:
    return [i.axis if i.residency in GRAPH_AXES + (NODE_TYPE, EDGE_TYPE, PAIR) and not i.expanded else None
            for i in infos]


def _rule_dense(op, infos, sizes):
    residency = _join(infos)
    if residency == SHARED:
        if op.name == "broadcast_in_dim":
            return _rule_broadcast_in_dim(op, infos, sizes)
        idx = _index_out(op, infos)
        expanded = any(i.expanded for i in infos)
        return [Info(SHARED, index=idx, expanded=expanded)] * len(op.outputs), "dense"
    axis = out_axis(op, _row_axes(infos))
    if axis is not None:
        return [Info(residency, index=_index_out(op, infos), axis=axis)] * len(op.outputs), "dense"
    if op.name.startswith("reduce_") and 0 in op.params.get("axes", ()) and residency in (NODE, EDGE):
        return [Info(GRAPH)] * len(op.outputs), "reduce"
    if op.name in _DATA_DEPENDENT:
        raise _Unknown(f"`{op.name}` makes a data-dependent permutation of the {residency} rows")
    raise _Unknown(f"`{op.name}` mixes rows of the {residency} axis" if op.name in _KNOWN_NONROWWISE
                   else f"unknown primitive `{op.name}` on {residency} data")


_DATA_DEPENDENT = frozenset({"sort", "top_k", "argsort"})
_KNOWN_NONROWWISE = frozenset({"transpose", "reshape", "concatenate", "slice", "dynamic_slice", "cumsum",
                               "cumprod", "cummax", "cummin", "rev", "pad", "dot_general", "reduce_sum",
                               "reduce_max", "reduce_min", "argmax", "argmin", "squeeze"})


def _rule_counts(op, infos, sizes):
    """Integer bookkeeping on n_node/n_edge (``jnp.repeat`` lowers to scatter + cumsum over them)."""
    kinds = {i.index for i in infos if i.index in ("n_node", "n_edge")}
    if len(kinds) != 1 or not all(i.index in kinds or i.residency == SHARED for i in infos):
        return None
    kind = kinds.pop()
    size_key, axis = {"n_node": ("N", NODE), "n_edge": ("E", EDGE)}[kind]
    rows = op.outputs[0].shape[0] if op.outputs[0].ndim else None
    return [Info(axis if rows == sizes.get(size_key) else GRAPH, index=kind)] * len(op.outputs), "dense"


def _rule_iota(op, infos, sizes):
    """``arange(N)`` names every node once: the self-loop half of an edge list with self edges."""
    out = op.outputs[0]
    if out.ndim == 1 and op.params.get("dimension", 0) == 0 and out.shape[0] == sizes.get("N"):
        return [Info(NODE, index="node_id")], "dense"
    return [Info(SHARED)], "dense"


def _rule_concatenate(op, infos, sizes):
    """Along axis 0, concatenation appends rows: edges plus one row per node is a new (self-loop) edge set."""
    if op.params["dimension"] != 0:
        return _rule_dense(op, infos, sizes)
    kinds = {i.index for i in infos}
    if all(i.index is not None for i in infos) and len(kinds - {"node_id"}) == 1 and kinds - {"node_id"} <= {
            "src", "dst"}:
        return [Info(EDGE, index=(kinds - {"node_id"}).pop())], "dense"
    residencies = {i.residency for i in infos}
    if EDGE in residencies and residencies <= {EDGE, NODE, SHARED}:
        return [Info(EDGE)], "dense"
    if all(i.residency == SHARED for i in infos):
        return [Info(SHARED, expanded=any(i.expanded for i in infos))], "dense"
    raise _Unknown(f"concatenation of {' and '.join(sorted(residencies))} rows along the leading axis")


RULES: dict[str, Callable] = {
    "iota": _rule_iota,
    "concatenate": _rule_concatenate,
    "gather": _rule_gather,
    "scatter-add": _rule_scatter_reduce, "scatter_add": _rule_scatter_reduce,
    "scatter-max": _rule_scatter_reduce, "scatter_max": _rule_scatter_reduce,
    "scatter-min": _rule_scatter_reduce, "scatter_min": _rule_scatter_reduce,
    "scatter-mul": _rule_scatter_reduce, "scatter_mul": _rule_scatter_reduce,
    "broadcast_in_dim": _rule_broadcast_in_dim,
}


def _apply(op: ir.Op, infos: list[Info], sizes) -> tuple[list[Info], str]:
    if "jgnn_residency" in op.params:  # a fused op made by a pass says where its outputs live
        return [Info(r) for r in op.params["jgnn_residency"]], op.params.get("jgnn_movement", "dense")
    if ir.is_fused_call(op.params):  # a fused op of an inner compiled layer, kept whole (see ir.opaque)
        where = ir.fused_call(op.params)[2]
        return [Info(where)] * len(op.outputs), "reduce" if where == NODE else "dense"
    counts = _rule_counts(op, infos, sizes) if any(i.index in ("n_node", "n_edge") for i in infos) else None
    if counts is not None:
        return counts
    if op.name not in RULES and all(i.residency == SHARED and not i.expanded and i.index is None
                                    for i in infos):
        return [Info(SHARED)] * len(op.outputs), "dense"
    return RULES.get(op.name, _rule_dense)(op, infos, sizes)


def reported_residency(info: Info, value: ir.Value, sizes) -> str:
    """Residency as shown to users: an expanded constant lives on the axis it was broadcast along."""
    if info.expanded and value.ndim:
        return {sizes.get("E"): EDGE, sizes.get("N"): NODE}.get(value.shape[0], SHARED)
    return info.residency


def analyze(program: ir.Program, tags: list[InputTag], sizes: dict[str, int]) -> Analysis:
    """Label every value of ``program`` (see module docstring). ``sizes`` holds the static ``N`` and ``E``."""
    info: dict[int, Info] = {v.id: INPUT_INFO[t.role] for v, t in zip(program.inputs, tags, strict=True)}
    records: dict[int, OpRecord] = {}
    fallbacks: list[Fallback] = []
    analysis = Analysis(info, records, fallbacks, sizes)
    for op in program.ops:
        infos = [analysis.of(a) for a in op.inputs]
        if any(i.residency == UNKNOWN for i in infos):
            outs = [Info(UNKNOWN)] * len(op.outputs)  # inside a fallback region, already reported
        else:
            try:
                outs, movement = _apply(op, infos, sizes)
                assert movement in MOVEMENTS, f"rule for {op.name} gave movement {movement!r}"
                records[id(op)] = OpRecord(op.name, movement, reported_residency(outs[0], op.outputs[0], sizes),
                                           outs[0].index, op.outputs[0].shape if op.outputs else ())
            except _Unknown as e:
                outs = [Info(UNKNOWN)] * len(op.outputs)
                fallbacks.append(Fallback(op.name, e.reason))
        info.update((v.id, i) for v, i in zip(op.outputs, outs, strict=True))
    _mark_type_tables(program, analysis)
    return analysis


def _mark_type_tables(program: ir.Program, analysis: Analysis) -> None:
    """A shared table read through a type index lives at that type's residency (Graphiler's type broadcast)."""
    for op in program.ops:
        if op.name == "gather" and isinstance(op.inputs[0], ir.Value) and id(op) in analysis.records:
            idx = analysis.of(op.inputs[1])
            if idx.index in _TYPE_TABLE and analysis.of(op.inputs[0]).residency == SHARED:
                analysis.info[op.inputs[0].id] = dataclasses.replace(
                    analysis.info[op.inputs[0].id], residency=_TYPE_TABLE[idx.index])


def body_out_axis(body: ir.Program, axes) -> int | None:
    """Where a custom_jvp/vjp body puts the row axis of its (single) output, or None if not row-wise."""
    where = {v.id: a for v, a in zip(body.inputs, axes, strict=True)}
    for op in body.ops:
        ins = [where.get(a.id) if isinstance(a, ir.Value) else None for a in op.inputs]
        out = out_axis(op, ins) if any(a is not None for a in ins) else None
        if out is None and any(a is not None for a in ins):
            return None
        where.update((v.id, out) for v in op.outputs)
    results = {where.get(a.id) if isinstance(a, ir.Value) else None for a in body.outputs}
    return results.pop() if len(results) == 1 else None
