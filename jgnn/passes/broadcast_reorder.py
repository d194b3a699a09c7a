"""``broadcast_reorder``: run dense work before the broadcast, ``f(h[src]) → f(h)[src]`` (Graphiler).

One forward walk with *lazy gathers*. A `gather` of node rows by ``src`` or ``dst`` ids is not emitted at
first: the walk remembers the node value, the ids and the axis the rows sit on. An op whose every graph-resident
operand is such a lazy gather through the same ids, and which is row-wise (`jgnn.facts.row_axis`), is re-run on
the node values instead, and its result becomes a lazy gather in turn, so whole chains move
(``reshape(h[src] @ W) · a``). A gather is emitted only where a value is needed in its edge form. Expanded
constants (``jnp.broadcast_to(w, (E, d))``) are re-broadcast at the node count; any other operand with edge rows
(edge features, ``arange(E)``) keeps the op on the edges.

The cost model compares ``E·f`` with ``N·f`` plus the extra bytes the output gather moves when the result is
wider than its operands; it refuses when ``N ≥ E`` or when a wide result would be gathered, and says so.

A lifted op runs on every node row, also on rows no id reads (isolated nodes, receivers only, padding). The
reference never computes anything there; the lifted gradient multiplies those rows by their zero cotangent, and
a NaN or ±inf row (or weight) would make ``inf · 0 = NaN`` in a weight's gradient (or the row's). So a lifted
op reads its node operands *masked*: rows its gather does not read (`_reads`, with the gather's own
wrap/clamp/fill semantics) become a stop-gradient copy of the first row it reads (`_unread_masked`). Every
product the lifted gradient forms at such a row is then one the reference forms for the copied row (non-finite
only where the reference is), and the row's own gradient is exactly 0. The forward pass is unchanged (unread
rows are never gathered). A first op that both ends apply alike (``h[src] @ W`` and ``h[dst] @ W``, one
``h @ W`` after CSE) reads ``h`` masked for the rows either end reads, which is as exact (the reference applies
that op to each such row); each end's later ops mask its result again for their own gather. A per-node table
``W[type]`` masks its types, so it stays a typed table. No mask is made for ids that provably read every row
(they append ``arange(N)``: a self-loop per node), or whose layout says so (every node occurs among them,
counted on the host: the loops a layer appends before its inner call, or a graph in which every node sends or
receives). ``LIFTED`` decisions say whether the op's node operands are masked (``masked_unread``). A mask costs a
pass over its operand.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgnn import facts, ir
from jgnn.ops.gather import gather_p, normalize
from jgnn.passes import cleanup
from jgnn.passes.context import Builder, Context, row_elems
from jgnn.report import Pass, Reason
from jgnn.roles import ENDPOINTS, Index, Residency


@dataclasses.dataclass(frozen=True)
class _Lazy:
    """A value that is ``gather(node_value, ids)`` along ``axis``; ``params`` are the gather's."""

    node_value: ir.Atom
    ids: ir.Atom
    params: dict
    axis: int
    original: ir.Op | None  # the gather that made it, if it was in the traced program
    # Lifted values only: the gathers whose read rows are real in ``node_value`` (the others are copies of a read
    # row, `_unread_masked`), and whether a mask was made (none is when those gathers read every row).
    real: frozenset | None = None
    masked: bool = False

    @property
    def key(self) -> tuple:
        return self.ids.id, self.params["mode"], self.params["wrap"]


def _is_lazy_gather(op: ir.Op, ctx: Context) -> bool:
    return (op.prim is gather_p and op.params["index"] in ENDPOINTS and isinstance(op.inputs[0], ir.Value)
            and facts.endpoint_table(ctx.info(op.inputs[0])) and ctx.info(op.inputs[0]).axis == 0)


def _materialise(lazy: _Lazy, out: ir.Value, b: Builder) -> None:
    """Emit the gather that makes ``out = take(node_value, ids, axis)``."""
    if lazy.original is not None:
        b.emit(lazy.original)
        return
    x, p = lazy.node_value, lazy.axis
    if p == 0:
        b.bind(gather_p, [x, lazy.ids], lazy.params, outputs=[out])
        return
    # Rows on axis p: move them to the front, gather, move them back.
    perm = (p,) + tuple(d for d in range(x.ndim) if d != p)
    (front,) = b.bind(lax.transpose_p, [x], dict(permutation=perm))
    (rows,) = b.bind(gather_p, [front, lazy.ids], lazy.params)
    back = tuple(perm.index(d) for d in range(x.ndim))
    b.bind(lax.transpose_p, [rows], dict(permutation=back), outputs=[out])


def _reads(ids, *, rows: int, mode: str, wrap: bool):
    """``[rows]`` bool: whether some id reads the row, as the gather reads it (the transpose of its ones, > 0)."""
    read = normalize(ids, rows, wrap=wrap, clip=mode == "clip")
    # jax's segment sum, as the gather's transpose (which drops ids outside [0, rows)), but not jgnn's `segment`
    # primitive: `fuse` would make that an edge op with a kernel of its own.
    return jax.ops.segment_sum(jnp.ones(ids.shape, jnp.int32), read, rows) > 0


def _unread_masked(x, reads, *, axis: int):
    """``x`` with every row (along ``axis``) no edge reads replaced by a copy of the first row one reads (no
    gradient flows through the copy).

    Unread rows are never gathered, so the forward is unchanged. Backward, their cotangent is 0; what the lifted
    chain computes there is what the reference computes for the copied row, so ``0 · p`` is NaN only where the
    reference's own ``c · p`` is non-finite, and the row itself gets exactly 0, as in the reference. (Zeros
    would not do: ``log(0)``, ``1/0`` or ``rsqrt(0)`` in the chain would make NaN in a weight's gradient.)
    """
    column = tuple(-1 if d == axis else 1 for d in range(x.ndim))
    first = jnp.argmax(reads)  # row 0 when nothing is read; then every cotangent of the chain is 0
    fill = jnp.take(x, first[None], axis=axis, mode="clip")
    return jnp.where(reads.reshape(column), x, lax.stop_gradient(fill))


def _inline(b: Builder, fn, args: list[ir.Atom]) -> ir.Atom:
    """Emit the ops of ``fn(*args)`` (traced on their shapes); its one output."""
    traced = ir.from_closed_jaxpr(jax.make_jaxpr(fn)(*[a.aval for a in args]))
    assert not traced.consts, "the mask closes over no arrays"
    env = {v.id: a for v, a in zip(traced.program.inputs, args, strict=True)}
    read = lambda a: env.get(a.id, a) if isinstance(a, ir.Value) else a  # noqa: E731
    for op in traced.program.ops:
        env.update((v.id, o) for v, o in zip(op.outputs, b.bind(op.prim, [read(a) for a in op.inputs], op.params),
                                             strict=True))
    (out,) = traced.program.outputs
    return read(out)


def _through_casts(atom: ir.Atom, made_by) -> ir.Op | None:
    """The op that made ``atom``, seen through integer casts and reshapes (which keep small ids' values)."""
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    while op is not None and op.prim in (lax.convert_element_type_p, lax.reshape_p) and \
            np.issubdtype(op.inputs[0].dtype, np.integer) and np.issubdtype(op.outputs[0].dtype, np.integer):
        op = made_by.get(op.inputs[0].id) if isinstance(op.inputs[0], ir.Value) else None
    return op


def _reads_every_row(ids: ir.Atom, rows: int, made_by) -> bool:
    """Whether ``ids`` provably reads every row of ``rows``: it appends ``arange(k)``, ``k ≥ rows`` (a self-loop
    per node, as GAT and GCN add), so no row is unread and no mask is needed."""
    cat = _through_casts(ids, made_by)
    if cat is None or cat.prim is not lax.concatenate_p or cat.params["dimension"] != 0:
        return False
    fits = rows <= np.iinfo(ids.dtype).max + 1
    return fits and any((op := _through_casts(a, made_by)) is not None and op.prim is lax.iota_p
                        and len(op.params["shape"]) == 1 and op.params["shape"][0] >= rows for a in cat.inputs)


def _layout_reads_every_row(ids: ir.Atom, rows: int, made_by, ctx: Context) -> bool:
    """Whether ``ids`` are a graph argument's senders or receivers (not ids computed from them) at which, by their
    layout, every one of the ``rows`` nodes occurs (`LayoutInputs.every_node`, counted on the host). That covers
    the self-loops a layer appends before its inner call, which `_reads_every_row` cannot see there, and any
    graph whose every node sends (or receives) an edge."""
    if not isinstance(ids, ir.Value) or ids.id in made_by:
        return False
    info = ctx.info(ids)
    lay = ctx.layout_for(info.edges) if info.index in ENDPOINTS else None
    return lay is not None and rows == lay.num_nodes and info.index in lay.every_node


def _shared_first_ops(program: ir.Program, ctx: Context) -> dict[int, frozenset]:
    """For each op on lazily gathered rows, the gathers (`_Lazy.key`) whose rows an identical op reads.

    ``h[src] @ W`` and ``h[dst] @ W`` are one ``h @ W`` after CSE: lifted, it runs on ``h`` masked for the rows
    either gather reads. That is exact: each row left real there is one the reference applies the same op (same
    weights) to. Later ops of each chain are masked again for their own gather's rows."""
    fresh = {op.outputs[0].id: (op.inputs[0].id, op.inputs[1].id, op.params["mode"], op.params["wrap"])
             for op in program.ops if _is_lazy_gather(op, ctx)}
    readers: dict[tuple, set] = {}
    signature = {}
    for op in program.ops:
        ins = [a for a in op.inputs if isinstance(a, ir.Value) and a.id in fresh]
        if not ins or len(op.outputs) != 1:
            continue
        sig = (op.prim, cleanup._param_key(op.params),
               tuple(("rows of", fresh[a.id][0]) if isinstance(a, ir.Value) and a.id in fresh else cleanup._atom_key(a)
                     for a in op.inputs))
        signature[id(op)] = sig
        readers.setdefault(sig, set()).update(fresh[a.id][1:] for a in ins)
    return {op_id: frozenset(readers[sig]) for op_id, sig in signature.items()}


class _Masks:
    """Masked node values (`_unread_masked`) and the rows each gather reads, each made once (CSE then shares the
    read rows of one ids across layers)."""

    def __init__(self, b: Builder, made_by, ctx: Context):
        self.b, self.made_by, self.ctx, self.reads, self.masked = b, made_by, ctx, {}, {}
        self.gathers: dict[tuple, tuple] = {}  # key -> (ids, gather params)

    def note(self, lz: _Lazy) -> None:
        self.gathers.setdefault(lz.key, (lz.ids, lz.params))

    def every_row(self, key: tuple, rows: int) -> bool:
        ids = self.gathers[key][0]
        return _reads_every_row(ids, rows, self.made_by) or _layout_reads_every_row(ids, rows, self.made_by,
                                                                                    self.ctx)

    def _reads_of(self, keys: frozenset, rows: int) -> ir.Atom:
        if (keys, rows) not in self.reads:
            parts = []
            for key in sorted(keys):
                ids, params = self.gathers[key]
                if (frozenset([key]), rows) not in self.reads:
                    self.reads[frozenset([key]), rows] = _inline(self.b, lambda i, p=params: _reads(
                        i, rows=rows, mode=p["mode"], wrap=p["wrap"]), [ids])
                parts.append(self.reads[frozenset([key]), rows])
            union = parts[0]
            for part in parts[1:]:
                (union,) = self.b.bind(lax.or_p, [union, part], {})
            self.reads[keys, rows] = union
        return self.reads[keys, rows]

    def rows(self, x: ir.Atom, keys: frozenset, axis: int) -> tuple[ir.Atom, bool]:
        """``x`` with only the rows (along ``axis``) that the gathers ``keys`` read left real, and whether a
        mask was needed."""
        rows = x.shape[axis]
        if any(self.every_row(k, rows) for k in keys):
            return x, False
        if (x.id, keys, axis) not in self.masked:
            reads = self._reads_of(keys, rows)
            self.masked[x.id, keys, axis] = _inline(self.b, functools.partial(_unread_masked, axis=axis), [x, reads])
        return self.masked[x.id, keys, axis], True

    def operand(self, lz: _Lazy, first_readers: frozenset) -> tuple[ir.Atom, frozenset, bool]:
        """What a lifted op on ``lz``'s rows reads: (node operand, the gathers whose rows are real in it, whether
        it is masked). A fresh gather is masked for ``first_readers``; a lifted value for its own gather."""
        if lz.real is None:
            value, masked = self.rows(lz.node_value, first_readers, lz.axis)
            return value, first_readers, masked
        own = frozenset([lz.key])
        if lz.real == own or self.every_row(lz.key, lz.node_value.shape[lz.axis]):
            return lz.node_value, lz.real, lz.masked
        value, masked = self.rows(lz.node_value, own, lz.axis)
        return value, own, masked


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    b = Builder(program, ctx)
    masks = _Masks(b, made_by, ctx)
    first_readers = _shared_first_ops(program, ctx)
    for op in program.ops:  # a shared first op may be met before the gather of its other end
        if _is_lazy_gather(op, ctx):
            masks.note(_Lazy(op.inputs[0], op.inputs[1], op.params, 0, op))
    lazy: dict[int, _Lazy] = {}
    emitted: set[int] = set()

    def need(atom):
        atom = b.read(atom)
        if isinstance(atom, ir.Value) and atom.id in lazy and atom.id not in emitted:
            emitted.add(atom.id)
            _materialise(lazy[atom.id], atom, b)

    for op in program.ops:
        if _is_lazy_gather(op, ctx):
            lazy[op.outputs[0].id] = _Lazy(b.read(op.inputs[0]), b.read(op.inputs[1]), op.params, 0, op)
            continue
        per_node = _per_node_table(op, ctx, made_by, b, masks)
        if per_node is not None:
            lazy[op.outputs[0].id] = per_node
            continue
        lifted = _try_lift(op, ctx, lazy, made_by, b, masks, first_readers)
        if lifted is None:
            for a in op.inputs:
                need(a)
            b.emit(op)
            continue
        lazy[op.outputs[0].id] = lifted
    for a in program.outputs:
        need(a)
    return b.finish()


def _expanded_source(ctx: Context, atom: ir.Atom, made_by) -> ir.Op | None:
    """The broadcast_in_dim of a shared value that made an expanded constant, if that is what ``atom`` is."""
    if not isinstance(atom, ir.Value) or not ctx.info(atom).expanded:
        return None
    op = made_by.get(atom.id)
    if op is not None and op.prim is lax.broadcast_in_dim_p and ctx.is_shared(op.inputs[0]):
        return op
    return None


def _per_node_table(op: ir.Op, ctx: Context, made_by, b: Builder, masks: _Masks) -> _Lazy | None:
    """``W[type[src]]`` (a typed table read through the source's node type) is ``(W[type])[src]``: made per node
    and gathered lazily, so ``x[src] @ W[type[src]]`` moves to the nodes (compact materialisation)."""
    if op.prim is not lax.gather_p or facts.row_gather_axis(op) != 0:
        return None
    table, column = op.inputs
    if not ctx.is_shared(table) or ctx.info(column).index != Index.NODE_TYPE or \
            ctx.info(column).residency != Residency.EDGE:
        return None
    v = column
    while (p := made_by.get(v.id) if isinstance(v, ir.Value) else None) is not None and p.prim is not gather_p:
        if p.prim not in (lax.broadcast_in_dim_p, lax.convert_element_type_p, lax.select_n_p, lax.clamp_p,
                          lax.concatenate_p, lax.reshape_p):
            return None
        v = p.inputs[1] if p.prim in (lax.select_n_p, lax.clamp_p) else p.inputs[0]
    if p is None or p.params["index"] not in ENDPOINTS:
        return None
    types, ids = p.inputs
    if ctx.info(types).residency != Residency.NODE or types.ndim != 1:
        return None
    edges, rows = ids.shape[0], types.shape[0]
    if edges <= rows:
        ctx.skipped(Pass.COMPACT_MATERIALIZE, Reason.NO_SAVING, what="typed table read through the node type",
                    rows=rows, edges=edges)
        return None
    # The types, not the table rows, are masked: the per-node table stays a table read by a type column, which
    # `typed_matmul` recognises (a masked table would be [N, d_in, d_out] floats).
    own = _Lazy(types, ids, p.params, 0, None)
    masks.note(own)
    masked, needed = masks.rows(types, frozenset([own.key]), 0)
    ctx.analysis.info[masked.id] = ctx.info(types)  # still node types, at the rows that are read
    (col,) = b.bind(lax.broadcast_in_dim_p, [masked], dict(shape=(rows, 1), broadcast_dimensions=(0,),
                                                          sharding=None))
    keeps_unit_axis = op.outputs[0].ndim == table.ndim + 1  # the batched dynamic-slice form [rows, 1, ...]
    dn = lax.GatherDimensionNumbers(offset_dims=tuple(range(1, table.ndim + keeps_unit_axis)),
                                    collapsed_slice_dims=() if keeps_unit_axis else (0,), start_index_map=(0,))
    (per_node,) = b.bind(lax.gather_p, [table, col],
                         dict(op.params, dimension_numbers=dn, slice_sizes=(1, *table.shape[1:])))
    ctx.applied(Pass.COMPACT_MATERIALIZE, Reason.COMPACTED_NODE_TYPE, types=table.shape[0],
                index=p.params["index"].value, rows=rows, edges=edges, ratio=edges / rows)
    return _Lazy(per_node, ids, p.params, 0, None, real=frozenset([own.key]), masked=needed)


def _try_lift(op: ir.Op, ctx: Context, lazy: dict, made_by, b: Builder, masks: _Masks,
              first_readers: dict) -> _Lazy | None:
    ins = [b.read(a) for a in op.inputs]
    graph_inputs = [a for a in ins if not ctx.is_shared(a)]
    through = [lazy[a.id] for a in graph_inputs if isinstance(a, ir.Value) and a.id in lazy]
    if not through or len(op.outputs) != 1:
        return None
    keys = {lz.key for lz in through}
    index = "/".join(sorted({lz.params["index"].value for lz in through}))
    if len(keys) > 1:
        ctx.skipped(Pass.BROADCAST_REORDER, Reason.DIFFERENT_INDICES, op=op.name, indices=index)
        return None
    expanded = {a.id: src for a in graph_inputs if isinstance(a, ir.Value) and a.id not in lazy
                if (src := _expanded_source(ctx, a, made_by)) is not None}
    # A shared array with a row per edge (arange(E), data from an op no rule names) is edge data: it stays.
    aligned = [a for a in ins if ctx.is_shared(a) and facts.is_elementwise(op.prim) and a.ndim > 0
               and a.ndim == op.outputs[0].ndim]
    if aligned or len(through) + len(expanded) != len(graph_inputs):
        ctx.skipped(Pass.BROADCAST_REORDER, Reason.UNGATHERED_EDGE_OPERAND, op=op.name)
        return None
    fixed = facts.fixed_rows([op])
    if fixed is not None:
        ctx.skipped(Pass.BROADCAST_REORDER, Reason.FIXED_SHAPE_BODY, primitive=fixed)
        return None
    axes = [lazy[a.id].axis if isinstance(a, ir.Value) and a.id in lazy else None for a in ins]
    out_ax = facts.row_axis(op, axes)
    if out_ax is None:
        ctx.skipped(Pass.BROADCAST_REORDER, Reason.NOT_ROWWISE, op=op.name)
        return None
    lz0 = through[0]
    rows = lz0.node_value.shape[lz0.axis]
    f_edge = facts.flops(op)
    edges = op.outputs[0].shape[out_ax]
    f_node = f_edge * rows / max(edges, 1)
    extra = max(0, row_elems(op.outputs[0], out_ax) - sum(row_elems(a, lazy[a.id].axis) for a in graph_inputs
                                                          if isinstance(a, ir.Value) and a.id in lazy))
    cost_after = f_node + edges * extra
    if cost_after >= f_edge:
        why = "N ≥ E" if rows >= edges else "the result is wider than its operands"
        ctx.skipped(Pass.BROADCAST_REORDER, Reason.COST_KEEPS_EDGES, op=op.name, why=why, before=f_edge,
                    after=cost_after)
        return None
    lazies = [lazy[a.id] for a, ax in zip(ins, axes, strict=True) if ax is not None]
    fresh = all(lz.real is None for lz in lazies)
    readers = first_readers.get(id(op), frozenset()) if fresh else frozenset()
    readers = readers if lz0.key in readers else frozenset([lz0.key])
    inputs, real, masked = [], frozenset(), False
    for a, ax in zip(ins, axes, strict=True):
        if ax is not None:
            node_value, reals, was_masked = masks.operand(lazy[a.id], readers)
            inputs.append(node_value)
            real, masked = real | reals, masked or was_masked
        elif isinstance(a, ir.Value) and a.id in expanded:
            src = expanded[a.id]
            (bc,) = b.bind(src.prim, src.inputs, facts.resize(src, rows, out_ax))
            inputs.append(bc)
        else:
            inputs.append(a)
    in_ax = next(ax for ax in axes if ax is not None)
    position = in_ax if op.prim is lax.slice_p else out_ax
    (lifted,) = b.bind(op.prim, inputs, facts.resize(op, rows, position))
    ctx.applied(Pass.BROADCAST_REORDER, Reason.LIFTED, op=op.name, index=index, edges=edges, rows=rows,
                before=f_edge, after=cost_after, masked_unread=masked)
    return dataclasses.replace(lz0, node_value=lifted, axis=out_ax, original=None, real=real, masked=masked)

