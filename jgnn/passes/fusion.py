"""``fuse_gather_reduce``: gather → edge compute → segment sum/max/min chains become one fused op (SpMM-like).

Grown backwards (see `regions`) from each ``scatter-add`` of edge rows into zeros by destination ids (what
``jax.ops.segment_sum`` lowers to), or ``scatter-max``/``scatter-min`` into ``∓inf`` (``segment_max``/
``segment_min``), through lane-wise ops whose results nothing outside the region reads.
Dense ``dot_general``s are never pulled in: they stay with XLA/cuBLAS (UGCG's rule), usually already moved
to the nodes by broadcast reordering. Messages that something else also reads are not fused: they must be
stored anyway.

Each fused op is listed in ``report.kernels`` with its backend and where its CSR comes from.
"""

from __future__ import annotations

import functools

import numpy as np

from jgnn import fused, ir, residency
from jgnn.passes import regions
from jgnn.passes.context import Context
from jgnn.report import KernelRecord

KIND = "fuse_gather_reduce"

# scatter primitive -> (reduction, the value segment ops start from)
REDUCTIONS = {"scatter-add": ("sum", 0.0), "scatter_add": ("sum", 0.0), "scatter-max": ("max", -np.inf),
              "scatter_max": ("max", -np.inf), "scatter-min": ("min", np.inf), "scatter_min": ("min", np.inf)}
# Pallas's max/min kernels give a tie's whole gradient to its smallest edge id; the reference splits it among
# the tied edges, and so does the edge-block lowering, which max/min therefore use on every backend.
EXTREMUM_WHY = "max/min use edge blocks on every backend: they split a tie's gradient as the reference does"


def is_zeros(atom: ir.Atom, made_by, value=0.0) -> bool:
    """A broadcast of the literal ``value`` (what segment ops start from)."""
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    return (op is not None and op.name == "broadcast_in_dim" and isinstance(op.inputs[0], ir.Const)
            and np.all(np.asarray(op.inputs[0].value) == value))


def dst_scatter(op: ir.Op, ctx: Context, made_by, name: str, init: float) -> bool:
    """``op`` is a segment reduction (``name``) of edge rows into ``init`` by destination ids."""
    return (op.name == name and residency.is_row_scatter(op) and ctx.info(op.inputs[1]).index == "dst"
            and is_zeros(op.inputs[0], made_by, init) and isinstance(op.inputs[2], ir.Value))


def layout_inputs(ctx: Context, e: int) -> tuple:
    return ctx.layout_values if ctx.layout_values and e == ctx.sizes.get("E") else ()


def csr_source(backend: str, layout: tuple) -> str:
    if backend == "xla":
        return "edge blocks with a node-level custom VJP (jgnn.edge_blocks), no CSR needed"
    return "CSR from the GraphLayout passed in" if layout else "CSR sorted inside the program (pass a GraphLayout)"


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by, users, order = regions.links(program)
    n = ctx.sizes.get("N")
    replaced: dict[int, ir.Op] = {}
    fused_away: set[int] = set()
    for op in program.ops:
        reduce, init = REDUCTIONS.get(op.name, (None, None))
        if reduce is None or not dst_scatter(op, ctx, made_by, op.name, init):
            continue
        updates = op.inputs[2]
        e, width = updates.shape[0], int(np.prod(updates.shape[1:], dtype=np.int64))
        if updates.ndim > 2 or op.inputs[0].shape[0] != n:
            ctx.skipped(KIND, f"segment {reduce} of {list(updates.shape)} rows: only [E, F] rows are fused "
                              "(attention-weighted sums are fused by fuse_edge_softmax)")
            continue
        stored = len(users.get(updates.id, [])) != 1
        # unit axes are free on [B, width] lanes: the [E, 1, F] that vmap's broadcasts make is an [E, F] row
        lane_ok = lambda o: not stored and regions.is_lane_op(o) and all(
            regions.squeezed(v.shape[1:]) in ((), (width,)) for v in o.outputs if v.shape[:1] == (e,))
        grown = regions.grow(updates, made_by, users, lane_ok, order)
        region = grown and regions.build(updates, *grown, made_by, ctx)
        widths_ok = region is not None and all(
            int(np.prod(a.shape[1:], dtype=np.int64)) in (1, width) for g in region.groups.values() for a in g)
        src_index = region.src_index if region is not None else None
        src_index = src_index or regions.find_index(program, ctx, "src", e, op)
        if not widths_ok or src_index is None:
            ctx.skipped(KIND, "messages are not a lane-wise function of gathered node rows, edge rows and "
                              "constants")
            continue
        layout = layout_inputs(ctx, e)
        g = region.groups
        backend = "xla" if reduce != "sum" else ctx.backend
        impl = ir.opaque(functools.partial(_run, regions.evaluator(region, lanes=True), len(g["src"]),
                                 len(g["dst"]) + len(g["const"]), len(layout), num_nodes=n, width=width,
                                 reduce=reduce, backend=backend, out_shape=op.outputs[0].shape,
                                 out_dtype=op.outputs[0].dtype, layout_tree=ctx.layout_tree),
                         "gather_reduce", "node", backend)
        inputs = tuple(g["src"] + g["dst"] + g["const"] + g["edge"]) + (src_index, op.inputs[1]) \
            + tuple(layout)
        replaced[id(op)] = ir.Op("fused_gather_reduce", inputs, op.outputs,
                                 {"jgnn_residency": ("node",), "jgnn_movement": "reduce"}, impl=impl, origin=KIND)
        fused_away.update(id(o) for o in region.ops)
        why = f"; {EXTREMUM_WHY}" if backend != ctx.backend else ""
        ctx.report.kernels.append(KernelRecord(
            f"gather_reduce({reduce})", backend,
            f"{len(region.ops)} edge ops fused; {len(g['src'])} src, {len(g['dst']) + len(g['const'])} dst, "
            f"{len(g['edge'])} edge operands; width {width}; {csr_source(backend, layout)}{why}"))
        ctx.applied(KIND, f"segment_{reduce} over {e} edges of messages that are stored anyway (also used "
                          "elsewhere): one walk whose backward keeps node-level values only" if stored else
                    f"gather→{len(region.ops)} lane-wise ops→segment_{reduce} over {e} edges in one op; the "
                    f"{list(updates.shape)} messages are never stored")
    return regions.replace_ops(program, replaced, fused_away)


def split_operands(args, n_src: int, n_dst: int, n_layout: int, layout_tree):
    """(src, dst, edge, senders, receivers, layout) from a fused op's flat operands."""
    import jax

    layout = jax.tree_util.tree_unflatten(layout_tree, args[len(args) - n_layout:]) if n_layout else None
    *operands, senders, receivers = args[:len(args) - n_layout]
    return (operands[:n_src], operands[n_src:n_src + n_dst], operands[n_src + n_dst:], senders, receivers,
            layout)


def _run(edge_fn, n_src, n_dst, n_layout, *args, num_nodes, width, reduce, backend, out_shape, out_dtype,
         layout_tree):
    src, dst, edge, senders, receivers, layout = split_operands(args, n_src, n_dst, n_layout, layout_tree)
    dst = tuple(regions.as_rows(x, num_nodes) for x in dst)
    out = fused.gather_reduce(edge_fn, src, dst, edge, senders, receivers, num_nodes=num_nodes, width=width,
                              reduce=reduce, backend=backend, layout=layout, out_dtype=out_dtype)
    return [out.reshape(out_shape)]


GATHER_COMPUTE = "fuse_gather_compute"


def run_gather_compute(program: ir.Program, ctx: Context) -> ir.Program:
    """``fuse_gather_compute``: an edge value that must exist (a program output, or read by a non-lane op),
    computed lane-wise from gathered node rows, becomes one SDDMM-like kernel writing it edge by edge.

    Only on the kernel backends: XLA already fuses a gather with the elementwise ops after it.
    """
    if ctx.backend == "xla":
        return program
    made_by, users, order = regions.links(program)
    replaced: dict[int, ir.Op] = {}
    fused_away: set[int] = set()
    for op in reversed(program.ops):  # outermost roots first, so nested candidates are already claimed
        if id(op) in fused_away or len(op.outputs) != 1 or not regions.is_lane_op(op):
            continue
        root = op.outputs[0]
        info = ctx.info(root)
        if info.residency != residency.EDGE or info.axis != 0 or root.ndim not in (1, 2):
            continue
        readers = users.get(root.id, [])
        if readers and all(regions.is_lane_op(u) and u is not ir.OUTPUT for u in readers):
            continue  # an inner value of a larger lane-wise region
        e, width = root.shape[0], int(np.prod(root.shape[1:], dtype=np.int64))
        lane_ok = lambda o, e=e, width=width: regions.is_lane_op(o) and all(
            v.shape[1:] in ((), (1,), (width,)) for v in o.outputs if v.shape[:1] == (e,))
        grown = regions.grow(root, made_by, users, lane_ok, order)
        region = grown and regions.build(root, *grown, made_by, ctx)
        if region is None or not region.ops or (region.src_index is None and region.dst_index is None):
            continue
        g = region.groups
        if any(int(np.prod(a.shape[1:], dtype=np.int64)) not in (1, width) for grp in g.values() for a in grp):
            continue
        src_index = region.src_index or regions.find_index(program, ctx, "src", e, op)
        dst_index = region.dst_index or regions.find_index(program, ctx, "dst", e, op)
        if src_index is None or dst_index is None:
            continue
        layout = layout_inputs(ctx, e)
        impl = ir.opaque(functools.partial(_run_gather_compute, regions.evaluator(region, lanes=True), len(g["src"]),
                                           len(g["dst"]) + len(g["const"]), len(layout), num_nodes=ctx.sizes["N"],
                                           width=width, backend=ctx.backend, out_shape=root.shape,
                                           out_dtype=root.dtype, layout_tree=ctx.layout_tree),
                         "gather_compute", "edge", ctx.backend)
        inputs = tuple(g["src"] + g["dst"] + g["const"] + g["edge"]) + (src_index, dst_index) + tuple(layout)
        replaced[id(op)] = ir.Op("fused_gather_compute", inputs, (root,), {"jgnn_residency": ("edge",)},
                                 impl=impl, origin=GATHER_COMPUTE)
        fused_away.update(id(o) for o in region.ops if o is not op)
        detail = f"{len(region.ops)} edge ops, width {width}; {csr_source(ctx.backend, layout)}"
        ctx.report.kernels.append(KernelRecord("gather_compute", ctx.backend, detail))
        ctx.applied(GATHER_COMPUTE, f"gather→{len(region.ops)} lane-wise ops over {e} edges, written once per edge "
                                    f"(the edge values are needed as {list(root.shape)})")
    return regions.replace_ops(program, replaced, fused_away)


def _run_gather_compute(edge_fn, n_src, n_dst, n_layout, *args, num_nodes, width, backend, out_shape, out_dtype,
                        layout_tree):
    src, dst, edge, senders, receivers, layout = split_operands(args, n_src, n_dst, n_layout, layout_tree)
    dst = tuple(regions.as_rows(x, num_nodes) for x in dst)
    out = fused.gather_compute(edge_fn, src, dst, edge, senders, receivers, num_nodes=num_nodes, width=width,
                               backend=backend, layout=layout, out_dtype=out_dtype)
    return [out.reshape(out_shape)]
