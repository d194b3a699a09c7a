"""``typed_matmul``: ``x @ W[type]`` becomes one `jgnn.ops.typed_matmul` op and never builds ``[E, d_in, d_out]``.

Matches a ``dot_general`` whose right operand is a typed weight table gathered row by row through a type id
(``W[edge["type"]]``, or ``W[src["type"]]`` in HGT), possibly after a ``squeeze`` of the unit axis ``vmap``
leaves. The matmul may carry per-row batch dims (one weight per head).

With a `GraphLayout` that knows the unique (source, edge type) pairs, ``x[src] @ W[edge_type]`` is computed once
per pair and gathered per edge (Hector's compact materialisation): a ``pair``-resident table, which
recomputation keeps, and a cheap gather, which it remakes.

The implementation is chosen per backend and platform (the report says which and why).
"""

from __future__ import annotations

from jax import lax

from jgnn import facts, ir
from jgnn.ops.gather import gather_p
from jgnn.ops.typed_matmul import typed_matmul_p
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
            b.bind(typed_matmul_p, [x, table, types], dict(impl=impl, block=128), outputs=op.outputs)
            rows = x.shape[0]
        else:
            node_rows, lay = compact
            pairs = lay.pairs
            (pair_rows,) = b.bind(gather_p, [node_rows, pairs.pair_src], dict(index=Index.PAIR_SRC, mode="clip",
                                                                              wrap=False))
            (per_pair,) = b.bind(typed_matmul_p, [pair_rows, table, pairs.pair_type], dict(impl=impl, block=128))
            b.bind(gather_p, [per_pair, pairs.edge_pair], dict(index=Index.PAIR, mode="clip", wrap=False),
                   outputs=op.outputs)
            rows = pairs.pair_src.shape[0]
        ctx.report.kernel("typed_matmul", ctx.backend, impl, Reason.GROUPED_MATMUL, index=index.value, rows=rows,
                          d_in=x.shape[-1], d_out=op.outputs[0].shape[-1], impl=impl, why=why)
        ctx.applied(Pass.TYPED_MATMUL, Reason.GROUPED_MATMUL, index=index.value, rows=rows, d_in=x.shape[-1],
                    d_out=op.outputs[0].shape[-1], impl=impl, why=why)
    return b.finish()


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
