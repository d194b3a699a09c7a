"""The registry of primitive facts, keyed by the primitive object: one entry per primitive.

Each `Facts` entry says, for one primitive:

* ``row_axis(op, axes)``: where the row axis lands in the output, given where it is in each input (None: the
  input is not row-batched), or None when the op is not row-wise (an output row reads several input rows).
  Row-wise is the legality condition of broadcast reordering (``f(h[src]) == f(h)[src]``), of mailbox lowering
  and of fusion;
* ``residency(op, infos, ctx)``: where the outputs live and how the op moves data (Graphiler's MP-DFG rules),
  or `Unknown` to start a fallback region; default: the row-wise rule (`dense`);
* ``resize(op, rows, axis)``: the params to run the op with ``rows`` rows along ``axis`` (an edge block,
  or node rows instead of edge rows) when some param holds that length (a shape, or a callee traced at the
  old length); default: params unchanged;
* ``fixed_rows``: no params can change the op's row count (a custom_vjp's backward checks its inputs' shapes):
  it runs only at the length it was traced with, so never on edge blocks, kernel tiles or node rows;
* ``linear``: the operand positions the op is linear in (linear splitting, reordering);
* ``cost(op)``: FLOPs, for the cost models.

The analysis loop (`jgnn.analysis`) never changes when a primitive is added: jgnn's own primitives register
their entries beside their other rules (`jgnn.ops`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from jgnn import compat, ir
from jgnn.report import Reason
from jgnn.roles import ENDPOINTS, GRAPH_AXES, TABLES, TYPE_INDEX, Index, Movement, Residency

Axes = Sequence["int | None"]


@dataclasses.dataclass(frozen=True)
class Info:
    """What the analysis knows about one value.

    * ``residency``, and ``graph``: which graph argument's axis (a function may take several graphs);
    * ``index``: for integer arrays, what they enumerate (`jgnn.roles.Index`);
    * ``edges``: for edge values and edge ids, which edge list (``"g0"``, or ``"g0+loops"`` for the graph's
      edges followed by one self-loop per node), so a `GraphLayout` is only used for the edges it describes;
    * ``expanded``: a shared value broadcast along a graph axis (every row equal);
    * ``reduced_by``: for node values made by a reduction, the index reduced over (gathering them back by the
      same index is a *norm*);
    * ``axis``: where the row axis is (a multi-head einsum may move it).
    """

    residency: Residency
    index: Index | None = None
    graph: int = 0
    edges: str | None = None
    expanded: bool = False
    reduced_by: Index | None = None
    axis: int = 0


SHARED = Info(Residency.SHARED)
UNKNOWN = Info(Residency.UNKNOWN)


class Unknown(Exception):
    """An op the analysis cannot explain: it and everything computed from it fall back to the traced program."""

    def __init__(self, code: Reason, **params: Any):
        super().__init__(code.value)
        self.code, self.params = code, params


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What rules may read besides the op: per graph argument, its static node and edge counts."""

    sizes: dict[int, dict[str, int]]

    def size(self, graph: int, key: str) -> int | None:
        return self.sizes.get(graph, {}).get(key)


@dataclasses.dataclass(frozen=True)
class Facts:
    row_axis: Callable[[Any, Axes], int | None] | None = None
    residency: Callable[[Any, list[Info], Ctx], tuple[list[Info], Movement]] | None = None
    resize: Callable[[Any, int, int], dict] | None = None
    linear: tuple[int, ...] = ()
    cost: Callable[[Any], float] | None = None
    impure: bool = False
    fixed_rows: bool = False


REGISTRY: dict[Any, Facts] = {}
NO_FACTS = Facts()


def register(prims, facts: Facts) -> None:
    for p in prims if isinstance(prims, list | tuple) else [prims]:
        REGISTRY[p] = facts


def of(prim) -> Facts:
    return REGISTRY.get(prim, NO_FACTS)


def row_axis(op, axes: Axes) -> int | None:
    """Where ``op`` puts the row axis (see module docstring); None when it is not row-wise."""
    rule = of(op.prim).row_axis
    if rule is None or all(a is None for a in axes):
        return None
    if any(a is not None and (x.ndim == 0 or a >= x.ndim) for a, x in zip(axes, op.inputs, strict=True)):
        return None
    return rule(op, axes)


def resize(op, rows: int, axis: int = 0) -> dict:
    """``op``'s params for running it with ``rows`` rows along ``axis`` of its output."""
    rule = of(op.prim).resize
    return op.params if rule is None else rule(op, rows, axis)


def _resized(shape: tuple, old: int, new: int, axis: int) -> tuple:
    return shape[:axis] + (new,) + shape[axis + 1:] if len(shape) > axis and shape[axis] == old else shape


def fixed_rows(ops) -> str | None:
    """The name of an op among ``ops`` (or inside their bodies) that runs only at its traced row count."""
    for op in ops:
        if of(op.prim).fixed_rows:
            return op.name
        inner = fixed_rows(op.body.ops) if op.body is not None else None
        if inner is not None:
            return inner
    return None


def row_values(program: ir.Program, has_rows: Sequence[bool], old: int, axis: int = 0) -> frozenset[int]:
    """The ids of ``program``'s values whose ``axis`` is the row axis, given which inputs carry rows there.

    A length alone does not say it: with 4 edges, a dropout mask ``uniform(key, (4,))`` drawn once for all edges
    has 4 entries and no rows (resizing it to an edge block gave wrong messages: fuzz campaign 20261400). An op
    that keeps ``axis`` where it is (its `row_axis` rule) ties the values of that length it reads and makes: all
    of them have rows or none (``vmap`` gives an elementwise op's operands one shape). A broadcast that puts a new
    ``axis`` on shared data (``vmap`` materialising a shared operand) ties nothing upstream. Rows start at the
    inputs that have them and at the outputs (messages have rows), and flow through ties and, where an op has no
    rule, from its inputs to its outputs.
    """
    long = lambda a: isinstance(a, ir.Value) and a.ndim > axis and a.shape[axis] == old
    ties: dict[int, set[int]] = {}
    flows: list[tuple[set[int], set[int]]] = []
    for op in program.ops:
        ins = {a.id for a in op.inputs if long(a)}
        outs = {v.id for v in op.outputs if long(v)}
        if not ins or not outs:
            continue
        if row_axis(op, [axis if long(a) else None for a in op.inputs]) == axis:
            for k in ins | outs:
                ties.setdefault(k, set()).update(ins | outs)
        else:
            flows.append(({a.id for a in op.inputs if isinstance(a, ir.Value)}, outs))
    shared = {v.id for v, r in zip(program.inputs, has_rows, strict=True) if not r}
    rows: set[int] = set()
    todo = [v.id for v, r in zip(program.inputs, has_rows, strict=True) if r]
    todo += [a.id for a in program.outputs if long(a)]
    while todo:
        while todo:
            k = todo.pop()
            if k not in rows:
                rows.add(k)
                todo.extend(t for t in ties.get(k, ()) if t not in shared and t not in rows)
        todo = [k for ins, outs in flows if ins & rows for k in outs if k not in rows]
    return frozenset(rows)


def run_resized(old: int, new: int, rows: frozenset[int], axis: int = 0) -> Callable[[Any, list], list]:
    """An `ir.evaluate` op runner for a program traced with ``old`` rows along ``axis`` and run with ``new``:
    each op with an output among ``rows`` (`row_values`) runs with its `resize` params (as an edge block runs a
    traced region)."""
    def run(op, xs):
        params = resize(op, new, axis) if any(o.id in rows for o in op.outputs) else op.params
        out = compat.bind(op.prim, params, xs)
        return list(out) if op.prim.multiple_results else [out]
    return run


def resized_jaxpr(closed, old: int, new: int, axis: int = 0):
    """``closed`` (a ClosedJaxpr traced with ``old`` rows along ``axis``) traced again with ``new`` rows: the
    inputs with ``old`` rows there get ``new``, and every op inside is resized by its rule."""
    avals = [jax.ShapeDtypeStruct(_resized(tuple(a.shape), old, new, axis), a.dtype) for a in closed.in_avals]
    moved = [a.shape != b.shape for a, b in zip(closed.in_avals, avals, strict=True)]

    def runner(program):
        has_rows = moved + [False] * (len(program.inputs) - len(moved))  # the consts have no rows
        return run_resized(old, new, row_values(program, has_rows, old, axis), axis)
    return ir.retrace(closed, avals, runner)


def flops(op) -> float:
    rule = of(op.prim).cost
    if rule is not None:
        return rule(op)
    return float(sum(int(np.prod(o.shape, dtype=np.int64)) for o in op.outputs))


# ---- row-axis rules ---------------------------------------------------------------------------------------

def _common(axes: Axes) -> int | None:
    present = {a for a in axes if a is not None}
    return present.pop() if len(present) == 1 else None


def _elementwise(op, axes: Axes) -> int | None:
    # Unbatched operands broadcast trivially: scalars, or the same rank (constant along the row axis).
    out_rank = op.outputs[0].ndim
    if not all(a.ndim in (0, out_rank) for a in op.inputs):
        return None
    return _common(axes)


def _broadcast_in_dim(op, axes: Axes) -> int | None:
    a = axes[0]
    x = op.inputs[0]
    out = op.params["broadcast_dimensions"][a]
    return out if op.outputs[0].shape[out] == x.shape[a] else None


def _reduction(op, axes: Axes) -> int | None:
    a = axes[0]
    reduced = op.params["axes"]
    return None if a in reduced else a - sum(r < a for r in reduced)


def _cumulative(op, axes: Axes) -> int | None:
    return None if op.params["axis"] == axes[0] else axes[0]


def _dot_general(op, axes: Axes) -> int | None:
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    a, b = axes
    lhs, rhs = op.inputs
    lhs_free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rhs_free = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    if a is not None and b is not None:  # rows paired: both row axes are the same batch dim
        return list(lb).index(a) if a in lb and b in rb and list(lb).index(a) == list(rb).index(b) else None
    if a is not None:
        return len(lb) + lhs_free.index(a) if a in lhs_free else None
    return len(lb) + len(lhs_free) + rhs_free.index(b) if b in rhs_free else None


def _reshape(op, axes: Axes) -> int | None:
    a = axes[0]
    x = op.inputs[0]
    new = tuple(op.params["new_sizes"])
    keeps = op.params.get("dimensions") is None and len(new) > a and new[:a + 1] == x.shape[:a + 1]
    return a if keeps else None


def _transpose(op, axes: Axes) -> int | None:
    return list(op.params["permutation"]).index(axes[0])


def _concatenate(op, axes: Axes) -> int | None:
    # Unbatched pieces are constant columns shared by every row (e.g. the zero starts of a batched slice).
    a = _common(axes)
    return None if a is None or op.params["dimension"] == a else a


def _split(op, axes: Axes) -> int | None:
    # jnp.split into pieces along a feature axis keeps each row's pieces in that row.
    return None if op.params["axis"] == axes[0] else axes[0]


def _squeeze(op, axes: Axes) -> int | None:
    a, dims = axes[0], op.params["dimensions"]
    return None if a in dims else a - sum(d < a for d in dims)


def _expand_dims(op, axes: Axes) -> int | None:
    a, dims = axes[0], op.params["dimensions"]
    return a + sum(d <= a for d in dims)


def _stack(op, axes: Axes) -> int | None:
    # Every piece must carry the rows at the same axis (a constant piece would differ per row).
    a = axes[0]
    if any(x != a for x in axes):
        return None
    return a if a < op.params["axis"] else a + 1


def _rev(op, axes: Axes) -> int | None:
    return None if axes[0] in op.params["dimensions"] else axes[0]


def _slice(op, axes: Axes) -> int | None:
    a, x = axes[0], op.inputs[0]
    strides = op.params.get("strides") or (1,) * x.ndim
    full = op.params["start_indices"][a] == 0 and op.params["limit_indices"][a] == x.shape[a] and strides[a] == 1
    return a if full else None


def _pad(op, axes: Axes) -> int | None:
    a = axes[0]
    return a if axes[1] is None and tuple(op.params["padding_config"][a]) == (0, 0, 0) else None


def _per_row_gather(op) -> bool:
    """``x[e, i[e]]``: each row picks from its own row (what ``vmap`` makes of indexing by a per-row id)."""
    dn = op.params["dimension_numbers"]
    return tuple(getattr(dn, "operand_batching_dims", ())) == (0,) and tuple(
        getattr(dn, "start_indices_batching_dims", ())) == (0,)


def _gather_rows(op, axes: Axes) -> int | None:
    return 0 if _per_row_gather(op) and all(a in (0, None) for a in axes) else None


def _custom_call(op, axes: Axes) -> int | None:
    # A custom_jvp/vjp function (jax.nn.relu, jax.nn.gelu, ...) is row-wise if its body is.
    if op.body is None:
        return None
    where = {v.id: a for v, a in zip(op.body.inputs, axes, strict=True)}
    for inner in op.body.ops:
        ins = [where.get(a.id) if hasattr(a, "id") else None for a in inner.inputs]
        if all(a is None for a in ins):
            where.update((v.id, None) for v in inner.outputs)
            continue
        out = row_axis(inner, ins)
        if out is None:
            return None
        where.update((v.id, out) for v in inner.outputs)
    results = {where.get(a.id) if hasattr(a, "id") else None for a in op.body.outputs}
    return results.pop() if len(results) == 1 else None


# ---- resize rules: params that hold the row axis' length --------------------------------------------------

def _resize_key(key: str) -> Callable[..., dict]:
    def rule(op, rows: int, axis: int = 0) -> dict:
        params = op.params
        sizes = params.get(key)
        if sizes is None:
            return params
        sizes = list(sizes)
        sizes[axis] = rows
        return dict(params, **{key: tuple(sizes)})
    return rule


def _resize_custom_call(op, rows: int, axis: int = 0) -> dict:
    # A custom_jvp's callee and JVP jaxprs were traced at the old length (a nested ``jit`` keeps it in its output
    # types), so they are traced again; the rule itself (relu's zero gradient at 0) is kept.
    old = next(o.shape[axis] for o in op.outputs if o.ndim > axis)
    return compat.resize_custom_call(op.params, lambda closed: resized_jaxpr(closed, old, rows, axis))


def _dot_cost(op) -> float:
    (lc, _), _ = op.params["dimension_numbers"]
    contracted = int(np.prod([op.inputs[0].shape[d] for d in lc], dtype=np.int64))
    return 2.0 * contracted * int(np.prod(op.outputs[0].shape, dtype=np.int64))


# ---- residency rules --------------------------------------------------------------------------------------

def graph_resident(info: Info) -> bool:
    return info.residency in GRAPH_AXES or info.residency in TABLES


def endpoint_table(info: Info) -> bool:
    """Whether src/dst ids may read rows of this value as a broadcast of node rows: node values, or a shared array
    that is not a broadcast (a per-group table of a `jgnn.hierarchical` level, a node table passed beside the
    graph): ``table[receivers]`` is the same movement as ``nodes[receivers]``."""
    return info.residency == Residency.NODE or (info.residency == Residency.SHARED and not info.expanded)


def _join(infos: list[Info]) -> Info:
    """The residency of a row-wise op's output: the graph axis its operands share."""
    live = [i for i in infos if graph_resident(i) and not i.expanded]
    if not live:
        return SHARED
    axes = {(i.residency, i.graph) for i in live}
    if len(axes) > 1:
        raise Unknown(Reason.MIXED_RESIDENCIES,
                      residencies=" and ".join(sorted(f"{r.value}(graph {g})" for r, g in axes)))
    first = live[0]
    edges = {i.edges for i in live} - {None}
    return Info(first.residency, graph=first.graph, edges=edges.pop() if len(edges) == 1 else None)


# Ops through which an integer array keeps meaning the same ids.
_INDEX_PRESERVING = frozenset(compat.primitives(
    "convert_element_type broadcast_in_dim reshape squeeze expand_dims copy clamp select_n add sub stop_gradient"))


def _index_out(op, infos: list[Info]) -> Index | None:
    """The id kind an index-preserving op keeps (JAX's wrap-negative-index code is lt/add/select_n)."""
    if op.prim not in _INDEX_PRESERVING:
        return None
    if op.prim is lax.select_n_p:  # the predicate is data; the cases must all be the same ids
        cases = [infos[k].index for k in range(1, len(infos)) if hasattr(op.inputs[k], "id")]
        return cases[0] if cases and all(c == cases[0] for c in cases) else None
    kinds = {i.index for i, a in zip(infos, op.inputs, strict=True)
             if hasattr(a, "id") and not (i.residency == Residency.SHARED and i.index is None)}
    return kinds.pop() if len(kinds) == 1 else None


def dense(op, infos: list[Info], ctx: Ctx) -> tuple[list[Info], Movement]:
    """The default rule: row-wise ops keep their operands' residency; anything else on graph data is unknown."""
    joined = _join(infos)
    n = len(op.outputs)
    if joined.residency == Residency.SHARED:
        return [Info(Residency.SHARED, index=_index_out(op, infos),
                     expanded=any(i.expanded for i in infos))] * n, Movement.DENSE
    axes = [i.axis if graph_resident(i) and not i.expanded else None for i in infos]
    axis = row_axis(op, axes)
    if axis is not None:
        return [dataclasses.replace(joined, index=_index_out(op, infos), axis=axis)] * n, Movement.DENSE
    if op.prim in _REDUCTIONS and 0 in op.params.get("axes", ()) and joined.residency in (
            Residency.NODE, Residency.EDGE):
        return [Info(Residency.SHARED)] * n, Movement.REDUCE  # a whole-batch reduction (a loss)
    if joined.residency == Residency.GRAPH and all(i.index in _COUNTS for i in infos if graph_resident(i)):
        # Bookkeeping on the graph counts (jraph's padding masks reverse and search them): plain data, with no
        # row per graph any more.
        return [Info(Residency.SHARED)] * n, Movement.DENSE
    if op.prim in _PERMUTATIONS:
        raise Unknown(Reason.DATA_DEPENDENT_PERMUTATION, residency=joined.residency.value)
    if op.prim in REGISTRY:
        raise Unknown(Reason.MIXES_ROWS, residency=joined.residency.value)
    raise Unknown(Reason.UNKNOWN_PRIMITIVE, residency=joined.residency.value)


def _broadcast_rule(op, infos, ctx):
    (x,) = infos
    if x.residency == Residency.SHARED or x.expanded:
        out, dims = op.outputs[0], tuple(op.params["broadcast_dimensions"])
        expands = x.expanded or (out.ndim > 0 and (0 not in dims or (
            op.inputs[0].shape[dims.index(0)] == 1 and out.shape[0] != 1)))
        return [Info(Residency.SHARED, index=None if expands else x.index, expanded=expands)], Movement.DENSE
    return dense(op, infos, ctx)


def _iota_rule(op, infos, ctx):
    """``arange(k)``: ids that name rows by position; they take a meaning from how they are used."""
    out = op.outputs[0]
    if out.ndim == 1:
        return [Info(Residency.SHARED, index=Index.NODE_ID)], Movement.DENSE
    return [SHARED], Movement.DENSE


def _cumsum_rule(op, infos, ctx):
    """Graph bookkeeping: counts → start positions (graph rows); start markers → graph ids (node rows)."""
    (x,) = infos
    step = {Index.N_NODE: Index.NODE_POS, Index.N_EDGE: Index.EDGE_POS,
            Index.NODE_MARK: Index.NODE_GRAPH, Index.EDGE_MARK: Index.EDGE_GRAPH}
    if x.index in step and op.params.get("axis", 0) == 0 and not op.params.get("reverse", False):
        return [dataclasses.replace(x, index=step[x.index])], Movement.DENSE
    return dense(op, infos, ctx)


def _concatenate_rule(op, infos, ctx):
    """Along axis 0, concatenation appends rows: edge ids plus one id per node make a new (self-loop) edge list.
    Along the last axis, ``[ids, 0, ...]`` columns (the index of a batched ``W[t]``) still name ``ids``' rows."""
    if op.params["dimension"] != 0 or op.outputs[0].ndim == 0:
        outs, movement = dense(op, infos, ctx)
        last = op.params["dimension"] == op.outputs[0].ndim - 1
        if last and infos[0].index is not None and all(i.residency == Residency.SHARED for i in infos[1:]):
            outs = [dataclasses.replace(o, index=infos[0].index) for o in outs]
        return outs, movement
    kinds = [i.index for i in infos]
    edge_ids = [i for i in infos if i.index in ENDPOINTS]
    if edge_ids and all(k in ENDPOINTS or k == Index.NODE_ID for k in kinds) and len({i.index for i in edge_ids}) \
            == 1 and len({i.graph for i in edge_ids}) == 1 and all(i.residency == Residency.EDGE for i in edge_ids):
        base = edge_ids[0]
        loops = any(k == Index.NODE_ID for k in kinds)
        edges = f"{base.edges}+loops" if loops and base.edges else None
        return [Info(Residency.EDGE, index=base.index, graph=base.graph, edges=edges)], Movement.DENSE
    residencies = {i.residency for i in infos}
    if Residency.EDGE in residencies and residencies <= {Residency.EDGE, Residency.NODE, Residency.SHARED}:
        graphs = {i.graph for i in infos if i.residency == Residency.EDGE}
        base = next(i for i in infos if i.residency == Residency.EDGE)
        loops = any(i.residency in (Residency.NODE, Residency.SHARED) for i in infos)
        edges = f"{base.edges}+loops" if loops and base.edges and "+" not in base.edges else None
        return [Info(Residency.EDGE, graph=graphs.pop() if len(graphs) == 1 else 0, edges=edges)], Movement.DENSE
    if residencies == {Residency.SHARED}:
        if all(i.index in (Index.N_NODE, Index.N_EDGE) for i in infos[:1]) and op.outputs[0].shape == \
                op.inputs[0].shape[:0] + (sum(a.shape[0] for a in op.inputs),):
            return [infos[0]], Movement.DENSE  # a roll of the counts (jnp.repeat's prologue)
        return [Info(Residency.SHARED, expanded=any(i.expanded for i in infos))], Movement.DENSE
    if residencies == {Residency.GRAPH} and all(i.index == infos[0].index for i in infos):
        return [infos[0]], Movement.DENSE
    raise Unknown(Reason.MIXED_RESIDENCIES, residencies=" and ".join(sorted(r.value for r in residencies)))


def _slice_rule(op, infos, ctx):
    (x,) = infos
    if x.residency == Residency.SHARED:
        if x.index is not None and op.inputs[0].ndim == 2 and op.params["start_indices"][-1] == 0:
            return [x], Movement.DENSE  # column 0 of [ids, 0, ...] names the row
        return [Info(Residency.SHARED, expanded=x.expanded)], Movement.DENSE
    if x.residency == Residency.GRAPH and x.index in (Index.N_NODE, Index.N_EDGE):
        return [x], Movement.DENSE  # slices of the counts (jnp.repeat, padding masks)
    return dense(op, infos, ctx)


# The primitives the rules above handle, and the groups of lax primitives with table entries.
ELEMENTWISE = compat.primitives("""
abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp conj convert_element_type copy cos cosh
digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma log log1p
logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round rsqrt select_n sign sin
sinh sqrt square stop_gradient sub tan tanh xor shift_left shift_right_logical shift_right_arithmetic
population_count clz bitcast_convert_type igamma igammac polygamma zeta bessel_i0e bessel_i1e
regularized_incomplete_beta
random_gamma_grad complex
""")
_REDUCTIONS = frozenset(compat.primitives("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or "
                                          "reduce_xor argmax argmin"))
_CUMULATIVE = compat.primitives("cumsum cumprod cummax cummin cumlogsumexp")
_PERMUTATIONS = frozenset(compat.primitives("sort top_k"))
_COUNTS = frozenset({Index.N_NODE, Index.N_EDGE, Index.NODE_POS, Index.EDGE_POS})



# ---- raw gathers and scatters (jraph code before `jgnn.canonicalize` raises them) ----------------------------

def row_gather_axis(op) -> int | None:
    """The axis along which a lax ``gather`` takes whole rows by a ``[K, c]`` index array, or None.

    Accepted forms: ``x[senders]``/``jnp.take`` (one index column, that axis collapsed), the batched
    ``dynamic_slice`` that ``vmap`` makes of ``W[t]`` (columns ``[t, 0, ...]``, nothing collapsed: every other
    slice spans its whole axis, so its start can only be 0), and gathers along axis ``p`` of values whose row
    axis a multi-head einsum moved.
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


def is_row_scatter(op) -> bool:
    """``operand.at[idx].op(updates)`` along axis 0 with whole rows (what ``segment_sum`` lowers to)."""
    dn = op.params.get("dimension_numbers")
    operand, idx, updates = op.inputs[:3]
    return (dn is not None and tuple(dn.inserted_window_dims) == (0,)
            and tuple(dn.scatter_dims_to_operand_dims) == (0,)
            and tuple(dn.update_window_dims) == tuple(range(1, updates.ndim))
            and not getattr(dn, "operand_batching_dims", ()) and idx.shape[-1:] == (1,))


def _lookup(op, operand: Info, idx: Info) -> bool:
    """A shared table read once per row of a graph-resident index array: output row i uses index row i only."""
    dn = op.params.get("dimension_numbers")
    return (dn is not None and operand.residency == Residency.SHARED and not operand.expanded and idx.axis == 0
            and idx.residency in (Residency.NODE, Residency.EDGE) and 0 not in tuple(dn.offset_dims)
            and not getattr(dn, "operand_batching_dims", ()))


def gather_rule(op, infos, ctx):
    operand, idx = infos
    if _per_row_gather(op) and operand.axis == 0 and idx.axis == 0:
        return [_join([operand, idx])], Movement.DENSE
    axis = row_gather_axis(op)
    if axis is None:
        if _lookup(op, operand, idx):  # W[t, id]: a weight table read once per row
            return [Info(idx.residency, graph=idx.graph, edges=idx.edges)], (
                Movement.BROADCAST_TYPE if idx.index in TYPE_INDEX else Movement.DENSE)
        if graph_resident(operand) or graph_resident(idx):
            raise Unknown(Reason.PARTIAL_ROW_GATHER, residency=(operand if graph_resident(operand)
                                                                else idx).residency.value)
        return [SHARED], Movement.DENSE
    kind = idx.index
    if kind in ENDPOINTS:
        if operand.residency != Residency.NODE or operand.axis != axis or operand.graph != idx.graph:
            if operand.residency == Residency.SHARED and not operand.expanded:
                return [Info(Residency.EDGE, graph=idx.graph, edges=idx.edges, axis=axis)], Movement.DENSE
            raise Unknown(Reason.MIXED_RESIDENCIES, residencies=f"{operand.residency.value} and {kind.value} ids")
        movement = Movement.NORM if operand.reduced_by == kind else BROADCAST[kind]
        keep = operand.index if operand.index in TYPE_INDEX else None  # e.g. the type of each edge's source
        return [Info(Residency.EDGE, index=keep, graph=idx.graph, edges=idx.edges, axis=axis)], movement
    if kind == Index.NODE_ID and operand.residency == Residency.NODE:
        return [dataclasses.replace(operand, axis=axis)], Movement.DENSE
    if kind in TYPE_INDEX:
        if graph_resident(operand) and operand.residency not in TABLES:
            raise Unknown(Reason.MIXED_RESIDENCIES, residencies=f"{operand.residency.value} and {kind.value} ids")
        return [Info(idx.residency, graph=idx.graph, edges=idx.edges)], Movement.BROADCAST_TYPE
    if kind in MEMBERSHIP_INDEX:
        if operand.residency not in (Residency.SHARED, Residency.GRAPH):
            raise Unknown(Reason.MIXED_RESIDENCIES, residencies=f"{operand.residency.value} and {kind.value} ids")
        # graph ids gathered through graph ids per node are graph ids per node
        out_index = kind if operand.index == Index.NODE_ID else None
        return [Info(idx.residency, index=out_index, graph=idx.graph, edges=idx.edges)], Movement.BROADCAST_GRAPH
    if graph_resident(idx) and operand.residency == Residency.SHARED:
        return [Info(idx.residency, graph=idx.graph, edges=idx.edges)], Movement.DENSE  # an embedding lookup
    if idx.residency == Residency.SHARED:
        # Rows picked by ids that are not the graph's (negative samples, a query list): a new axis of data
        # that no graph rule describes; it is constant with respect to the graph's rows.
        return [SHARED], Movement.DENSE
    raise Unknown(Reason.DATA_DEPENDENT_GATHER)


def scatter_rule(op, infos, ctx):
    operand, idx, updates = infos[:3]
    if not is_row_scatter(op):
        if all(not graph_resident(i) for i in infos[:3]):
            return [Info(Residency.SHARED, index=operand.index)], Movement.DENSE
        raise Unknown(Reason.DATA_DEPENDENT_SCATTER)
    kind = idx.index
    init_ok = operand.residency == Residency.SHARED or (operand.residency == Residency.NODE
                                                        and operand.graph == idx.graph)
    if kind in ENDPOINTS and updates.residency in (Residency.EDGE, Residency.SHARED) and updates.axis == 0 \
            and init_ok and op.inputs[0].shape[0] == ctx.size(idx.graph, "N"):
        return [Info(Residency.NODE, graph=idx.graph, reduced_by=kind)], Movement.REDUCE
    if kind in MEMBERSHIP_INDEX and updates.residency in (MEMBERSHIP_INDEX[kind], Residency.SHARED):
        return [Info(Residency.GRAPH, graph=idx.graph)], Movement.REDUCE
    if kind in TYPE_INDEX and operand.residency == Residency.SHARED:
        return [Info(TYPE_INDEX[kind])], Movement.REDUCE
    if kind in (Index.NODE_POS, Index.EDGE_POS) and operand.residency == Residency.SHARED:
        axis_kind, mark = {Index.NODE_POS: ("N", Index.NODE_MARK), Index.EDGE_POS: ("E", Index.EDGE_MARK)}[kind]
        rows = op.outputs[0].shape[0] if op.outputs[0].ndim else None
        if rows == ctx.size(idx.graph, axis_kind):
            residency = Residency.NODE if axis_kind == "N" else Residency.EDGE
            return [Info(residency, index=mark, graph=idx.graph)], Movement.DENSE
        return [SHARED], Movement.DENSE
    if operand.index in (Index.N_NODE, Index.N_EDGE) and not graph_resident(updates):
        return [operand], Movement.DENSE  # jnp.repeat's prologue sets the first count to 0
    if not graph_resident(operand) and not graph_resident(updates):
        return [Info(Residency.SHARED)], Movement.DENSE
    if operand.residency == Residency.SHARED and graph_resident(updates):
        # Rows chosen by ids that no graph rule names (receivers * R + type): data rows with no graph axis.
        return [SHARED], Movement.REDUCE
    if graph_resident(operand) and not graph_resident(updates):
        return [operand], Movement.DENSE
    raise Unknown(Reason.DATA_DEPENDENT_SCATTER)


BROADCAST = {Index.SRC: Movement.BROADCAST_SRC, Index.DST: Movement.BROADCAST_DST}
MEMBERSHIP_INDEX = {Index.NODE_GRAPH: Residency.NODE, Index.EDGE_GRAPH: Residency.EDGE}


# ---- the table ------------------------------------------------------------------------------------------

# Operand positions each lax primitive is linear in (mul and dot_general: in each operand with the other fixed).
LINEAR = {"add": (0, 1), "sub": (0, 1), "neg": (0,), "convert_element_type": (0,), "copy": (0,), "mul": (0, 1),
          "reduce_sum": (0,), "cumsum": (0,)}

register(ELEMENTWISE + [compat.CHECKPOINT_NAME], Facts(row_axis=_elementwise))
register(list(_REDUCTIONS), Facts(row_axis=_reduction))
register(_CUMULATIVE, Facts(row_axis=_cumulative))
register(lax.cumsum_p, Facts(row_axis=_cumulative, residency=_cumsum_rule))
register(lax.broadcast_in_dim_p, Facts(row_axis=_broadcast_in_dim, residency=_broadcast_rule,
                                       resize=_resize_key("shape"), linear=(0,)))
register(lax.dot_general_p, Facts(row_axis=_dot_general, linear=(0, 1), cost=_dot_cost))
register(lax.reshape_p, Facts(row_axis=_reshape, resize=_resize_key("new_sizes"), linear=(0,)))
register(lax.transpose_p, Facts(row_axis=_transpose, linear=(0,)))
register(lax.concatenate_p, Facts(row_axis=_concatenate, residency=_concatenate_rule, linear=(0,)))
register(compat.primitives("split"), Facts(row_axis=_split))
register(lax.squeeze_p, Facts(row_axis=_squeeze, linear=(0,)))
register(compat.primitives("expand_dims"), Facts(row_axis=_expand_dims, linear=(0,)))
register(lax.slice_p, Facts(row_axis=_slice, residency=_slice_rule, resize=_resize_key("limit_indices"),
                            linear=(0,)))
register(lax.pad_p, Facts(row_axis=_pad))
register(compat.primitives("stack"), Facts(row_axis=_stack, linear=(0,)))
register(lax.rev_p, Facts(row_axis=_rev, linear=(0,)))
register(lax.iota_p, Facts(residency=_iota_rule))
register(lax.gather_p, Facts(row_axis=_gather_rows, residency=gather_rule))
register(compat.primitives("scatter_add scatter_max scatter_min scatter_mul scatter"),
         Facts(residency=scatter_rule))
register(list(_PERMUTATIONS), Facts())
register(compat.CUSTOM_JVP, Facts(row_axis=_custom_call, resize=_resize_custom_call))
register(compat.CUSTOM_VJP, Facts(row_axis=_custom_call, fixed_rows=True))
register(compat.primitives("debug_callback io_callback pure_callback"), Facts(impure=True))
for _name, _positions in LINEAR.items():
    for _p in compat.primitives(_name):
        REGISTRY[_p] = dataclasses.replace(REGISTRY[_p], linear=_positions)


def is_elementwise(prim) -> bool:
    return of(prim).row_axis is _elementwise


SHAPE_ONLY = frozenset(compat.primitives("broadcast_in_dim reshape squeeze expand_dims"))
