"""``typed_matmul``: ``x @ W[type]`` becomes one `jgnn.ops.typed_matmul` op and never builds ``[E, d_in, d_out]``.

Matches a ``dot_general`` whose right operand is a typed weight table gathered row by row through a type id
(``W[edge["type"]]``, or ``W[src["type"]]`` in HGT), possibly after a ``squeeze`` of the unit axis ``vmap``
leaves. The matmul may carry per-row batch dims (one weight per head).

With a `GraphLayout` that knows the unique (source, edge type) pairs, ``x[src] @ W[edge_type]`` is computed once
per pair and gathered per edge (Hector's compact materialisation): a ``pair``-resident table, which
recomputation keeps, and a cheap gather, which it remakes.

The implementation is chosen per backend: Pallas backends run the kernel; XLA runs ``sorted_blocks``, or
``static_groups`` where the runs of one type are known on the host: over a layout's pairs, and over a graph's own
node types when its layout found the nodes sorted by type (HGT's K, Q, V and A-linear; hand-written HGT slices
its sorted node types the same way). `merge` then runs typed
matmuls of the same rows and types as one, and records a kernel per typed matmul that runs.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from jgnn import facts, ir
from jgnn.ops import typed_matmul as tm
from jgnn.ops.gather import gather_p
from jgnn.ops.typed_matmul import typed_matmul_p
from jgnn.passes.canonicalize import unwrapped
from jgnn.passes.context import Builder, Context
from jgnn.report import Pass, Reason
from jgnn.roles import TYPE_INDEX, Index


def typed_table(atom: ir.Atom, ctx: Context, made_by):
    """(table, type ids [R], gather op) when ``atom`` is ``W[type]`` gathered row by row, else None."""
    if not isinstance(atom, ir.Value):
        return None
    op = made_by.get(atom.id)
    squeezed = False
    if op is not None and op.prim is lax.squeeze_p and tuple(op.params["dimensions"]) == (1,):
        squeezed, op = True, made_by.get(op.inputs[0].id)
    if op is None or op.prim is not lax.gather_p or facts.row_gather_axis(op) != 0:
        return None
    table, column = op.inputs
    if ctx.info(column).index not in TYPE_INDEX or not ctx.is_shared(table):
        return None
    if not squeezed and op.outputs[0].ndim != table.ndim:
        return None
    return table, column, op


def choose_impl(backend: str) -> tuple[str, str]:
    """(implementation, why) for a backend."""
    if backend in ("pallas", "pallas_interpret"):
        return backend, "pallas_kernels.typed_matmul"
    return "sorted_blocks", "rows sorted by type into whole blocks, one GEMM per block"


def _with_runs(impl: str) -> str:
    """The implementation for rows in static runs of one type: XLA's GEMM per run, or the Pallas backend's engine
    on those runs (`typed_matmul.report_lowering` names it: the kernel, or GEMMs per run for per-head tables)."""
    return "static_groups" if impl == "sorted_blocks" else impl


def _table_layout(op: ir.Op, table: ir.Atom) -> tuple[bool, int] | None:
    """(supported, heads) for ``x @ W_rows``: x ``[R, *heads, d_in]`` and W_rows ``[R, *heads, a, b]`` with
    the rows and heads as batch dims; the table needs a transpose when it contracts its last axis."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    x = op.inputs[0]
    heads = len(lb) - 1
    ok = (tuple(lb) == tuple(range(heads + 1)) and tuple(rb) == tuple(range(heads + 1)) and len(lc) == 1
          and lc[0] == x.ndim - 1 and x.ndim == heads + 2 and table.ndim == heads + 3
          and rc[0] in (heads + 1, heads + 2))
    return (ok, heads) if ok else None


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    b = Builder(program, ctx)
    for op in program.ops:
        typed = typed_table(b.read(op.inputs[1]), ctx, made_by) if op.prim is lax.dot_general_p else None
        if typed is None:
            b.emit(op)
            continue
        table, column, gather = typed
        if table.ndim < 3:  # x[e] · a[t[e]]: a dot product with a typed vector, no matrix to group
            b.emit(op)
            continue
        layout = _table_layout(op, table)
        if layout is None:
            ctx.skipped(Pass.TYPED_MATMUL, Reason.UNSUPPORTED_DIMENSION_NUMBERS)
            b.emit(op)
            continue
        _, heads = layout
        (_, rc), _ = op.params["dimension_numbers"]
        if rc[0] == heads + 2:  # the table contracts its last axis: [T, *heads, d_out, d_in]
            perm = tuple(range(heads + 1)) + (heads + 2, heads + 1)
            (table,) = b.bind(lax.transpose_p, [table], dict(permutation=perm))
        types = column
        if column.ndim == 2:  # [t, 0, ...] columns of a batched W[t]: column 0 names the row
            if column.shape[1] != 1:
                (types,) = b.bind(lax.slice_p, [column], dict(start_indices=(0, 0),
                                                              limit_indices=(column.shape[0], 1), strides=None))
            (types,) = b.bind(lax.squeeze_p, [types], dict(dimensions=(1,)))
        impl, why = choose_impl(ctx.backend)
        x = b.read(op.inputs[0])
        index = ctx.info(column).index
        compact = _compact_pairs(x, ctx, made_by) if index == Index.EDGE_TYPE else None
        if compact is None:
            groups = _node_runs(b, ctx, types, x, table)
            if groups:
                impl, why = _with_runs(impl), "node types sorted in the layout: one GEMM per type, no sort"
            b.bind(typed_matmul_p, [x, table, types], dict(impl=impl, block=128, groups=groups), outputs=op.outputs)
            rows = x.shape[0]
        else:
            node_rows, lay = compact
            pairs = lay.pairs
            (pair_rows,) = b.bind(gather_p, [node_rows, pairs.pair_src], dict(index=Index.PAIR_SRC, mode="clip",
                                                                              wrap=False))
            # The layout's pairs come in static runs of one type: the packing is known on the host, no sort in the
            # program (a Pallas backend keeps its kernel).
            groups = lay.pair_groups
            if groups:
                impl, why = _with_runs(impl), "the layout's typed pairs in runs of one type: no sort"
            (per_pair,) = b.bind(typed_matmul_p, [pair_rows, table, pairs.pair_type],
                                 dict(impl=impl, block=128, groups=groups))
            b.bind(gather_p, [per_pair, pairs.edge_pair], dict(index=Index.PAIR, mode="clip", wrap=False),
                   outputs=op.outputs)
            rows = pairs.pair_src.shape[0]
        ctx.applied(Pass.TYPED_MATMUL, Reason.GROUPED_MATMUL, index=index.value, rows=rows, d_in=x.shape[-1],
                    d_out=op.outputs[0].shape[-1], impl=impl, runs=len(groups), why=why)
    return b.finish()


# Ops that only add or drop unit axes or widen an integer: the rows keep their values.
_SAME_ROWS = (lax.squeeze_p, lax.broadcast_in_dim_p, lax.reshape_p, lax.convert_element_type_p)


def _same_values(atom: ir.Atom, rows: int, made_by: dict) -> ir.Atom | None:
    """The value ``atom`` copies row for row (unit axes aside), seen through the index arithmetic of ``W[t]`` for
    a table of ``rows`` rows: jnp's wrap of negative ids (the identity on the layout's types, all in ``[0, T)``)
    and the first column of a batched gather's index columns; None if it computes anything else."""
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    if op is None:
        return None
    x = op.inputs[0]
    if op.prim is lax.convert_element_type_p and not (
            np.issubdtype(atom.dtype, np.integer) and np.dtype(atom.dtype).itemsize >= np.dtype(x.dtype).itemsize):
        return None  # a narrowing or float conversion changes values
    if op.prim in _SAME_ROWS:
        return x if math.prod(x.shape) == math.prod(atom.shape) else None
    if op.prim is lax.slice_p and tuple(op.params["limit_indices"])[1:] == (1,) * (atom.ndim - 1) \
            and not any(op.params["start_indices"]) and atom.shape[0] == x.shape[0]:
        first = made_by.get(x.id) if isinstance(x, ir.Value) else None
        if first is not None and first.prim is lax.concatenate_p and first.params["dimension"] == 1 \
                and first.inputs[0].shape[1:] == (1,) * (atom.ndim - 1):
            return first.inputs[0]
        return None
    raw, wrapped = unwrapped(atom, rows, made_by)
    return raw if wrapped else None


def _node_runs(b: Builder, ctx: Context, types: ir.Atom, x: ir.Atom, table: ir.Atom) -> tuple:
    """The static runs of ``types`` when it is a graph's own node types (`_same_values`) and a layout of that
    graph found them sorted (checked against the graph when it is called), covering ``x``'s rows with types of
    ``table``; else ()."""
    made_by = {v.id: op for op in b.ops for v in op.outputs}
    while (source := _same_values(types, table.shape[0], made_by)) is not None:
        types = source
    tag = next((t for v, t in zip(b.program.inputs, ctx.tags, strict=False) if v is types), None)
    if tag is None or tag.role != "node_type":
        return ()
    groups = next((lay.node_groups for lay in ctx.layouts if lay.graph == tag.graph and lay.node_groups), ())
    if not groups or groups[-1][2] != x.shape[0] or not all(0 <= t < table.shape[0] for t, _, _ in groups):
        return ()
    return groups


def _compact_pairs(x: ir.Atom, ctx: Context, made_by):
    """(node rows, layout) when ``x`` is source rows and the layout of its edges knows the unique (source, edge
    type) pairs, and they are fewer than the edges; else None, with the reason."""
    gather = made_by.get(x.id) if isinstance(x, ir.Value) else None
    if gather is None or gather.prim is not gather_p or gather.params["index"] != Index.SRC:
        return None
    e = x.shape[0]
    lay = ctx.layout_for(ctx.info(gather.inputs[1]).edges)
    if lay is None or lay.pairs is None:
        ctx.skipped(Pass.COMPACT_MATERIALIZE, Reason.NEEDS_LAYOUT, edges=e)
        return None
    u = lay.pairs.pair_src.shape[0]
    if u >= e:
        ctx.skipped(Pass.COMPACT_MATERIALIZE, Reason.NO_SAVING, what="x[src] @ W[edge_type]", rows=u, edges=e)
        return None
    ctx.applied(Pass.COMPACT_MATERIALIZE, Reason.COMPACTED_PAIRS, pairs=u, edges=e, ratio=e / u)
    return gather.inputs[0], lay


def merge(program: ir.Program, ctx: Context) -> ir.Program:
    """Typed matmuls of the same rows by the same types (HGT's K, Q and V of the node features) run as one, over
    their tables concatenated along the output axis: the rows are packed and unpacked once, in one GEMM.

    Then one kernel record per typed matmul that runs.
    """
    defined = {v.id: i for i, op in enumerate(program.ops) for v in op.outputs}
    groups: dict[tuple, list[int]] = {}
    for i, op in enumerate(program.ops):
        x, table, types = op.inputs if op.prim is typed_matmul_p else (None, None, None)
        if isinstance(x, ir.Value) and isinstance(types, ir.Value):
            key = (x.id, types.id, op.params["impl"], op.params["block"], table.shape[:-1], table.dtype)
            groups.setdefault(key, []).append(i)
    lead: dict[int, list[ir.Op]] = {}
    for members in groups.values():
        first = members[0]
        # Every table must exist where the merged op runs (at the first member).
        members = [i for i in members if defined.get(getattr(program.ops[i].inputs[1], "id", None), -1) < first]
        if len(members) > 1:
            lead[members[0]] = [program.ops[i] for i in members]
    merged = {id(op) for ops in lead.values() for op in ops}
    b = Builder(program, ctx)
    for i, op in enumerate(program.ops):
        if i in lead:
            _emit_merged(b, lead[i], ctx)
        elif id(op) not in merged:
            b.emit(op)
    out = b.finish()
    for op in out.ops:
        if op.prim is typed_matmul_p:
            x, table, types = op.inputs
            impl = op.params["impl"]
            lowering, code = tm.report_lowering(impl, x, table, op.params["groups"])
            ctx.report.kernel("typed_matmul", ctx.backend, lowering, code,
                              index=ctx.info(types).index.value if ctx.info(types).index else "type",
                              rows=x.shape[0], d_in=x.shape[-1], d_out=table.shape[-1], impl=impl,
                              dtype=str(jnp.result_type(x.dtype, table.dtype)))
    return out


def _emit_merged(b: Builder, ops: list[ir.Op], ctx: Context) -> None:
    x, _, types = ops[0].inputs
    tables = [op.inputs[1] for op in ops]
    axis = tables[0].ndim - 1
    (table,) = b.bind(lax.concatenate_p, tables, dict(dimension=axis))
    (y,) = b.bind(typed_matmul_p, [x, table, types], dict(ops[0].params))
    start = 0
    for op, t in zip(ops, tables, strict=True):
        out = op.outputs[0]
        lo, hi = [0] * out.ndim, list(out.shape)
        lo[-1], hi[-1] = start, start + t.shape[-1]
        b.bind(lax.slice_p, [y], dict(start_indices=tuple(lo), limit_indices=tuple(hi), strides=None),
               outputs=[out])
        start += t.shape[-1]
    ctx.applied(Pass.TYPED_MATMUL, Reason.MERGED_TYPED_MATMULS, count=len(ops), rows=x.shape[0],
                d_out=table.shape[-1])

