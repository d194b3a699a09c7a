"""``typed_matmul``: ``x @ W[type]`` becomes a grouped matmul and never builds ``[E, d_in, d_out]`` (Hector).

Matches a ``dot_general`` whose right operand is a typed weight table gathered row by row through a type id
(``W[edge["type"]]``, or ``W[src["type"]]`` in HGT), possibly after a ``squeeze`` of the unit axis ``vmap``
leaves. The matmul may carry per-row batch dims (one weight per head).

Three lowerings, chosen per backend and platform (`choose_impl`, and the report says which and why):

* ``ragged_dot``: rows sorted by type, one grouped GEMM (``jax.lax.ragged_dot``); for XLA on GPU/TPU;
* ``pallas``: the same with `pallas_kernels.typed_matmul` (its ``AUTO_IMPL_REASON`` says which inner
  implementation it picks);
* ``blocked_gather``: on CPU, where ``ragged_dot`` multiplies every row by every type's weight (R× the
  FLOPs), each block of rows gathers its own weights and runs the original per-row product
  (`jgnn.edge_blocks.typed_dot`): exact FLOPs, one block of weights alive.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels as pk
from jgnn import edge_blocks, ir, residency
from jgnn.passes.context import Context, is_shared
from jgnn.report import KernelRecord
from pallas_kernels.compat import bind_primitive

KIND = "typed_matmul"
COMPACT = "compact_materialize"
# The reason compaction was skipped for want of a layout (the recomputation report points users to it).
NEEDS_LAYOUT = "pass a GraphLayout of the typed graph to compute it once per unique (source, edge type) pair"


def typed_table(atom: ir.Atom, ctx: Context, made_by):
    """(table, index value, gather op, squeeze op) when ``atom`` is ``W[type]`` gathered row by row."""
    if not isinstance(atom, ir.Value):
        return None
    op = made_by.get(atom.id)
    squeeze = None
    if op is not None and op.name == "squeeze" and tuple(op.params["dimensions"]) == (1,):
        squeeze, op = op, made_by.get(op.inputs[0].id)
    if op is None or op.name != "gather" or residency.row_gather_axis(op) != 0:
        return None
    table, idx = op.inputs
    kind = ctx.info(idx).index
    if kind not in ("edge_type", "node_type") or not is_shared(ctx, table):
        return None
    if squeeze is None and op.outputs[0].ndim != table.ndim:
        return None
    return table, idx, op, squeeze


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = ir.producers(program)
    ops = []
    for op in program.ops:
        typed = typed_table(op.inputs[1], ctx, made_by) if op.name == "dot_general" else None
        if typed is None:
            ops.append(op)
            continue
        table, idx, gather, _ = typed
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        if table.ndim - len(rb) < 2:  # x[e] · a[t[e]]: a dot product with a typed vector, no matrix to group
            ops.append(op)
            continue
        x = op.inputs[0]
        ok = (tuple(lb[:1]), tuple(rb[:1])) == ((0,), (0,)) and len(lc) == 1 and x.ndim == 2 + len(lb) - 1 \
            and tuple(lb) == tuple(range(len(lb))) and tuple(rb) == tuple(range(len(rb))) and lc[0] == x.ndim - 1
        if not ok:
            ctx.skipped(KIND, f"dot_general with a typed weight in a layout grouped matmul does not cover "
                              f"({op.params['dimension_numbers']})")
            ops.append(op)
            continue
        heads = len(lb) - 1  # per-row batch dims after the edge axis (one weight per head)
        contract = rc[0]  # the table's type axis sits where the gathered weight's row axis was
        groups = int(table.shape[0])
        impl_name, why = choose_impl(ctx.backend)
        run_typed = functools.partial(_run, impl=impl_name, heads=heads, contract=contract, groups=groups,
                                      backend=ctx.backend, out_dtype=op.outputs[0].dtype, dot=op)
        residency_out = ctx.info(idx).residency
        compact = _compact_pairs(x, idx, ctx, made_by)
        e, din = x.shape[0], x.shape[-1]
        dout = op.outputs[0].shape[-1]
        if compact is None:
            ops.append(ir.Op("typed_matmul", (x, table, idx), op.outputs, {
                "jgnn_residency": (residency_out,), "jgnn_movement": "dense"},
                impl=ir.opaque(run_typed, "typed_matmul", residency_out, ctx.backend), origin=KIND))
            rows = e
        else:
            ops += _pair_ops(run_typed, table, op.outputs[0], *compact, ctx.backend)
            rows = compact[1].pair_src.shape[0]
        ctx.report.kernels.append(KernelRecord(
            "typed_matmul", ctx.backend,
            f"{groups} types, {rows} rows, {din}→{dout}" + (f", {int(np.prod(x.shape[1:-1]))} heads" if heads else "")
            + f"; {impl_name}: {why}"))
        ctx.applied(KIND, f"x @ W[{ctx.info(idx).index}] over {rows} rows as a grouped matmul: the "
                          f"[{rows}, {din}, {dout}] weight gather is never built")
    return ir.Program(program.inputs, program.outputs, ops)


def _compact_pairs(x: ir.Atom, idx: ir.Value, ctx: Context, made_by):
    """(node rows, pairs) when ``x`` is source rows and the layout knows the unique (source, edge type) pairs,
    and they are fewer than the edges (Hector's compact materialisation); else None, with the reason."""
    gather = made_by.get(x.id) if isinstance(x, ir.Value) else None
    if ctx.info(idx).index != "edge_type" or gather is None or gather.name != "gather" or \
            residency.row_gather_axis(gather) != 0 or ctx.info(gather.inputs[1]).index != "src":
        return None
    pairs = jax.tree_util.tree_unflatten(ctx.layout_tree, ctx.layout_values).pairs if ctx.layout_values else None
    e = x.shape[0]
    if pairs is None or pairs.edge_pair.shape[0] != e:
        ctx.skipped(COMPACT, f"x[src] @ W[edge_type] over {e} edges: {NEEDS_LAYOUT}")
        return None
    u = pairs.pair_src.shape[0]
    if u >= e:
        ctx.skipped(COMPACT, f"x[src] @ W[edge_type]: {u} unique (source, type) pairs for {e} edges, no saving")
        return None
    ctx.applied(COMPACT, f"x[src] @ W[edge_type] computed for {u} unique (source, edge type) pairs instead of "
                         f"{e} edges ({e / u:.2f}× compaction), then gathered per edge")
    return gather.inputs[0], pairs


def _pair_ops(run_typed, table, out: ir.Value, node_rows, pairs, backend: str) -> list[ir.Op]:
    """The compacted matmul as two ops: the per-pair table (``pair`` residency, what a training step saves)
    and its per-edge gather (an O(1) edge value that recomputation remakes instead of storing)."""
    per_pair = ir.Value((pairs.pair_src.shape[0],) + out.shape[1:], out.dtype)
    make = ir.Op("typed_matmul", (node_rows, table, pairs.pair_src, pairs.pair_type), (per_pair,),
                 {"jgnn_residency": (residency.PAIR,), "jgnn_movement": "dense"},
                 impl=ir.opaque(functools.partial(_run_pairs, run_typed), "typed_matmul", residency.PAIR, backend),
                 origin=COMPACT)
    spread = ir.Op("gather_pairs", (per_pair, pairs.edge_pair), (out,),
                   {"jgnn_residency": (residency.EDGE,), "jgnn_movement": "broadcast_pair"},
                   impl=ir.opaque(_gather_pairs, "gather_pairs", residency.EDGE, backend), origin=COMPACT)
    return [make, spread]


def _run_pairs(run_typed, node_rows, table, pair_src, pair_type):
    return run_typed(node_rows[pair_src], table, pair_type[:, None])


def _gather_pairs(per_pair, edge_pair):
    return [per_pair[edge_pair]]


def choose_impl(backend: str) -> tuple[str, str]:
    if backend != "xla":
        return "pallas", f"pallas_kernels.typed_matmul (impl={pk.AUTO_IMPL}: {pk.AUTO_IMPL_REASON})"
    if jax.default_backend() == "cpu":
        return "blocked_gather", "ragged_dot on CPU multiplies every row by every type's weight (R× FLOPs)"
    return "ragged_dot", "one grouped GEMM over rows sorted by type"


def _grouped(x, w, group_sizes, backend):
    if backend == "xla":
        return jax.lax.ragged_dot(x, w, group_sizes)
    return pk.typed_matmul(x, w, group_sizes, impl="auto", interpret=backend == "pallas_interpret")


def _run(x, table, idx, *, impl, heads, contract, groups, backend, out_dtype, dot):
    types = jnp.clip(idx[:, 0], 0, groups - 1)  # the gather clamped out-of-range ids the same way
    if impl == "blocked_gather":
        row_bytes = 4 * int(np.prod(table.shape[1:], dtype=np.int64))
        size = edge_blocks.block_size(x.shape[0], row_bytes)
        dot_row = lambda xs, ws: bind_primitive(dot.prim, dot.params, (xs, ws))
        return [edge_blocks.typed_dot(dot_row, x, table, types, size).astype(out_dtype)]
    order = jnp.argsort(types, stable=True)
    group_sizes = jnp.bincount(types, length=groups).astype(jnp.int32)
    last = table.ndim - 1
    w = table if contract == last - 1 else jnp.swapaxes(table, last - 1, last)  # per type: [..., d_in, d_out]
    xs = x[order]
    if heads == 0:
        ys = _grouped(xs, w, group_sizes, backend)
    else:
        hs = x.shape[1]
        ys = jnp.stack([_grouped(xs[:, h], w[:, h], group_sizes, backend) for h in range(hs)], axis=1)
    return [ys[jnp.argsort(order)].astype(out_dtype)]
