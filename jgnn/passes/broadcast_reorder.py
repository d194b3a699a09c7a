"""``broadcast_reorder``: run dense work before the broadcast, ``f(h[src]) → f(h)[src]`` (Graphiler).

One forward walk with *lazy gathers*. A row gather of node data by ``src`` or ``dst`` ids is not emitted at
first: the walk remembers the node-level value, the index and the axis the rows sit on. An op whose every
graph-resident operand is such a lazy gather through the same index, and which is row-wise (see
`jgnn.rowwise`), is re-run on the node-level operands instead, and its result becomes a lazy gather in turn,
so whole chains move (``reshape(h[src] @ W) · a``). A gather is emitted only where a value is needed in its
edge form. Expanded constants (``jnp.broadcast_to(w, (E, d))``) are re-broadcast at the node count.

The cost model compares ``E·f`` with ``N·f`` plus the extra bytes the output gather moves when the result
is wider than the operands. It refuses when ``N ≥ E`` or when a wide result would be gathered, and says so.
"""

from __future__ import annotations

import jax

from jgnn import ir, residency
from jgnn.passes.context import Context, flops, is_shared, row_elems
from jgnn.rowwise import ROW_LENGTH_PARAMS, out_axis

KIND = "broadcast_reorder"
_NOT_LIFTED = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


class _Lazy:
    """A value that is ``take(node_value, idx, axis)``; ``template`` is the gather op that made its index."""

    def __init__(self, node_value: ir.Value, idx: ir.Value, key: tuple, axis: int, template: ir.Op,
                 original: ir.Op | None):
        self.node_value, self.idx, self.key, self.axis = node_value, idx, key, axis
        self.template, self.original = template, original


def _gather_op(lazy: _Lazy, out: ir.Value) -> ir.Op:
    """The gather that materialises ``out = take(node_value, idx, axis)``."""
    if lazy.original is not None:
        return lazy.original
    y, p = lazy.node_value, lazy.axis
    dn = jax.lax.GatherDimensionNumbers(offset_dims=tuple(d for d in range(y.ndim) if d != p),
                                        collapsed_slice_dims=(p,), start_index_map=(p,))
    params = dict(lazy.template.params, dimension_numbers=dn,
                  slice_sizes=tuple(1 if d == p else n for d, n in enumerate(y.shape)))
    return ir.Op("gather", (y, lazy.idx), (out,), params, lazy.template.prim, origin=KIND)


def _expanded_source(ctx: Context, atom: ir.Atom, made_by) -> ir.Op | None:
    """The broadcast_in_dim of a shared value that made an expanded constant, if that is what ``atom`` is."""
    if not isinstance(atom, ir.Value) or not ctx.info(atom).expanded:
        return None
    op = made_by.get(atom.id)
    if op is not None and op.name == "broadcast_in_dim" and is_shared(ctx, op.inputs[0]):
        return op
    return None


def _with_rows(params: dict, name: str, position: int, rows: int) -> dict:
    key = ROW_LENGTH_PARAMS.get(name)
    if key is None or params.get(key) is None:
        return params
    sizes = list(params[key])
    sizes[position] = rows
    return dict(params, **{key: tuple(sizes)})


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    lazy: dict[int, _Lazy] = {}
    emitted: set[int] = set()
    ops: list[ir.Op] = []
    n, e = ctx.sizes.get("N"), ctx.sizes.get("E")

    def need(atom):
        if isinstance(atom, ir.Value) and atom.id in lazy and atom.id not in emitted:
            ops.append(_gather_op(lazy[atom.id], atom))
            emitted.add(atom.id)

    for op in program.ops:
        if op.name == "gather" and residency.row_gather_axis(op) == 0:
            idx_info, src_info = ctx.info(op.inputs[1]), ctx.info(op.inputs[0])
            if idx_info.index in ("src", "dst") and src_info.residency == residency.NODE and src_info.axis == 0:
                key = (idx_info.index, op.inputs[1].shape[0])
                lazy[op.outputs[0].id] = _Lazy(op.inputs[0], op.inputs[1], key, 0, op, op)
                continue
            through_node_type = _per_node_table(op, ctx, made_by)
            if through_node_type is not None:  # W[type[src]] is (W[type])[src]: a node value, gathered lazily
                node_ops, lz = through_node_type
                ops += node_ops
                lazy[op.outputs[0].id] = lz
                continue
        lifted = _try_lift(op, ctx, lazy, made_by, n, e)
        if lifted is None:
            for a in op.inputs:
                need(a)
            ops.append(op)
            continue
        new_ops, out_lazy = lifted
        ops += new_ops
        lazy[op.outputs[0].id] = out_lazy
    for a in program.outputs:
        need(a)
    return ir.Program(program.inputs, program.outputs, ops)


def _per_node_table(op: ir.Op, ctx: Context, made_by):
    """For ``W[type[src]]`` (a typed table read through the source's node type), the node-level ``W[type]``
    and a lazy src gather of it, so that ``x[src] @ W[type[src]]`` moves to the nodes (compact
    materialisation: the value depends on the source node only)."""
    table, idx = op.inputs
    if not is_shared(ctx, table) or ctx.info(idx).index != "node_type" or ctx.info(idx).residency != residency.EDGE:
        return None
    v = idx
    while (p := made_by.get(v.id) if isinstance(v, ir.Value) else None) is not None and p.name != "gather":
        v = p.inputs[0] if p.name != "select_n" else p.inputs[1]
    if p is None or residency.row_gather_axis(p) != 0 or ctx.info(p.inputs[1]).index not in ("src", "dst"):
        return None
    types, via = p.inputs
    if ctx.info(types).residency != residency.NODE or types.ndim != 1:
        return None
    if via.shape[0] <= types.shape[0]:
        ctx.skipped("compact_materialize", f"{table.shape[0]}-type table read through the node type: "
                                           f"{via.shape[0]} edges ≤ {types.shape[0]} nodes, compacting does not pay")
        return None
    column = ir.new_op(jax.lax.broadcast_in_dim_p, [types], dict(shape=(types.shape[0], 1), broadcast_dimensions=(0,),
                                                                 sharding=None), origin=KIND)
    keeps_unit_axis = op.outputs[0].ndim == table.ndim + 1  # the batched dynamic-slice form [rows, 1, ...]
    dn = jax.lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, table.ndim + keeps_unit_axis)), collapsed_slice_dims=() if keeps_unit_axis else (0,),
        start_index_map=(0,))
    per_node = ir.new_op(op.prim, [table, column.outputs[0]],
                         dict(op.params, dimension_numbers=dn, slice_sizes=(1, *table.shape[1:])), origin=KIND)
    node_ops = [column, per_node]
    value = per_node.outputs[0]
    key = (ctx.info(via).index, via.shape[0])
    ctx.applied("compact_materialize", f"{table.shape[0]}-type table read through the {key[0]} node's type: "
                                       f"values depend on the node only, so they are made per node "
                                       f"({types.shape[0]} rows, compaction {via.shape[0] / types.shape[0]:.1f}×) "
                                       f"and gathered to the {via.shape[0]} edges only where needed")
    return node_ops, _Lazy(value, via, key, 0, p, None)


def _try_lift(op: ir.Op, ctx: Context, lazy, made_by, n, e):
    graph_inputs = [a for a in op.inputs if not is_shared(ctx, a)]
    through = [lazy[a.id] for a in graph_inputs if a.id in lazy]
    if not through or len(op.outputs) != 1:
        return None
    keys = {lz.key for lz in through}
    described = f"{op.name} on {'/'.join(k[0] for k in sorted(keys))}-gathered rows"
    if len(keys) > 1:
        ctx.skipped(KIND, f"{described}: operands come through different indices")
        return None
    expanded = {a.id: src for a in graph_inputs if a.id not in lazy
                if (src := _expanded_source(ctx, a, made_by)) is not None}
    if len(through) + len(expanded) != len(graph_inputs):
        ctx.skipped(KIND, f"{described}: an operand is edge data that was not gathered")
        return None
    if op.name in _NOT_LIFTED:
        ctx.skipped(KIND, f"{described}: {op.name} bodies have fixed shapes")
        return None
    axes = [lazy[a.id].axis if isinstance(a, ir.Value) and a.id in lazy else None for a in op.inputs]
    out_ax = out_axis(op, axes)
    if out_ax is None:
        ctx.skipped(KIND, f"{described}: not row-wise (mixes rows)")
        return None
    lz0 = through[0]
    rows = lz0.node_value.shape[lz0.axis]
    f_edge = flops(op)
    f_node = f_edge * rows / max(op.outputs[0].shape[out_ax], 1)
    extra = max(0, row_elems(op.outputs[0], out_ax) - sum(row_elems(a, lazy[a.id].axis)
                                                          for a in graph_inputs if a.id in lazy))
    edges = op.outputs[0].shape[out_ax]
    cost_after = f_node + edges * extra
    if cost_after >= f_edge:
        reason = "N ≥ E" if rows >= edges else "the result is wider than its operands"
        ctx.skipped(KIND, f"{described}: cost model keeps it on edges ({reason}; {f_edge:.3g} vs "
                          f"{cost_after:.3g})")
        return None
    new_ops, inputs = [], []
    for a, ax in zip(op.inputs, axes, strict=True):
        if ax is not None:
            inputs.append(lazy[a.id].node_value)
        elif isinstance(a, ir.Value) and a.id in expanded:
            src = expanded[a.id]
            bc = ir.new_op(src.prim, src.inputs, _with_rows(src.params, "broadcast_in_dim", out_ax, rows),
                           origin=KIND)
            new_ops.append(bc)
            inputs.append(bc.outputs[0])
        else:
            inputs.append(a)
    in_ax = next(ax for ax in axes if ax is not None)
    position = in_ax if op.name == "slice" else out_ax
    lifted = ir.new_op(op.prim, inputs, _with_rows(op.params, op.name, position, rows), origin=KIND)
    new_ops.append(lifted)
    ctx.applied(KIND, f"{described} moved to the nodes: {edges}→{rows} rows, est. "
                      f"{f_edge:.3g} → {cost_after:.3g} FLOP+elem")
    return new_ops, _Lazy(lifted.outputs[0], lz0.idx, lz0.key, out_ax, lz0.template, None)
