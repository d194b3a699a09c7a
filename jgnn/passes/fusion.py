"""``fuse_gather_reduce``: gather → edge compute → segment sum chains become one fused op (SpMM-like).

Grown backwards from each ``scatter-add`` of edge rows into zeros by destination ids (what
``jax.ops.segment_sum`` lowers to) through lane-wise ops (elementwise, and the broadcasts/reshapes between
``[E]``, ``[E, 1]`` and ``[E, F]``) whose results nothing outside the region reads. Its leaves become the
fused op's operands: node rows gathered by ``src`` or ``dst`` ids, edge rows, and expanded constants
(passed as per-destination rows). Dense ``dot_general``s are never pulled in: they stay with XLA/cuBLAS
(UGCG's rule), usually already moved to the nodes by broadcast reordering.

Each fused op is listed in ``report.kernels`` with its backend and where its CSR comes from.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jgnn import fused, ir, residency
from jgnn.passes.context import Context, producers
from jgnn.report import KernelRecord
from jgnn.rowwise import ELEMENTWISE

KIND = "fuse_gather_reduce"
_SHAPE_ONLY = frozenset({"broadcast_in_dim", "reshape", "squeeze", "convert_element_type"})


def _rows_shape_ok(value: ir.Value, e: int, width: int) -> bool:
    return value.shape in ((e,), (e, 1), (e, width))


def _is_zeros(atom: ir.Atom, made_by) -> bool:
    op = made_by.get(atom.id) if isinstance(atom, ir.Value) else None
    return (op is not None and op.name == "broadcast_in_dim" and isinstance(op.inputs[0], ir.Const)
            and np.all(np.asarray(op.inputs[0].value) == 0))


def _grow(updates: ir.Value, made_by, users, e: int, width: int, ctx: Context):
    """Region ops and leaves of the lane-wise tree that computes ``updates``; None if it cannot be fused."""
    region: dict[int, ir.Op] = {}
    member_ops: set[int] = set()
    leaves, stack = {}, [updates]
    while stack:
        v = stack.pop()
        op = made_by.get(v.id)
        read_inside = v.id == updates.id or (
            len(users.get(v.id, [])) == 1 and id(users[v.id][0]) in member_ops)
        inside = (read_inside and op is not None and len(op.outputs) == 1 and _rows_shape_ok(v, e, width)
                  and (op.name in ELEMENTWISE or op.name in _SHAPE_ONLY))
        if not inside:
            leaves[v.id] = v
            continue
        region[v.id] = op
        member_ops.add(id(op))
        for a in op.inputs:
            if isinstance(a, ir.Value) and a.id not in region:
                stack.append(a)
            elif isinstance(a, ir.Const) and np.ndim(a.value) != 0:
                return None
    return region, leaves


def _classify(leaf: ir.Value, made_by, ctx: Context, e: int, width: int):
    """('src'|'dst'|'edge', operand, index) for one leaf, or None when the kernel cannot take it."""
    op = made_by.get(leaf.id)
    if op is not None and op.name == "gather" and residency.row_gather_axis(op) == 0:
        idx = ctx.info(op.inputs[1])
        node = op.inputs[0]
        if idx.index in ("src", "dst") and isinstance(node, ir.Value) and node.ndim in (1, 2) and (
                node.ndim == 1 or node.shape[1] in (1, width)):
            return idx.index, node, op.inputs[1]
    info = ctx.info(leaf)
    if info.expanded and op is not None and op.name == "broadcast_in_dim":
        # An expanded constant row (the same for every edge) enters as one row per destination.
        src, dims = op.inputs[0], tuple(op.params["broadcast_dimensions"])
        if src.ndim == 0 or (src.ndim == 1 and dims == (leaf.ndim - 1,) and src.shape[0] in (1, width)):
            return "const", src, None
        return None
    if info.residency == residency.EDGE and info.axis == 0 and _rows_shape_ok(leaf, e, width):
        return "edge", leaf, None
    return None


def _edge_fn(region_ops, slots, consts, out_id):
    """Evaluate the region on ``[B, W]`` blocks: shape-only ops are identities once inputs are broadcast."""
    def edge_fn(src_rows, dst_rows, edge_rows):
        env = dict(consts)
        groups = {"src": src_rows, "dst": dst_rows, "edge": edge_rows}
        env.update((vid, groups[g][i]) for vid, (g, i) in slots.items())
        for op in region_ops:
            args = [a.value if isinstance(a, ir.Const) else env[a.id] for a in op.inputs]
            if op.name in _SHAPE_ONLY and op.name != "convert_element_type":
                out = args[0]
            else:
                out = op.run(*args)[0]
            env[op.outputs[0].id] = out
        return env[out_id]

    return edge_fn


def run(program: ir.Program, ctx: Context) -> ir.Program:
    made_by = producers(program)
    users = ir.users(program)
    n = ctx.sizes.get("N")
    replaced: dict[int, ir.Op] = {}
    fused_away: set[int] = set()
    for op in program.ops:
        if op.name != "scatter-add" or not residency.is_row_scatter(op):
            continue
        operand, idx, updates = op.inputs
        if ctx.info(idx).index != "dst" or not _is_zeros(operand, made_by) or not isinstance(updates, ir.Value):
            continue
        e = updates.shape[0]
        width = int(np.prod(updates.shape[1:], dtype=np.int64)) if updates.ndim > 1 else 1
        if updates.ndim > 2 or operand.shape[0] != n:
            ctx.skipped(KIND, f"segment sum of {list(updates.shape)} rows: only [E, F] rows are fused")
            continue
        if len(users.get(updates.id, [])) != 1 or any(a is updates for a in program.outputs):
            ctx.skipped(KIND, f"segment sum of {list(updates.shape)} messages that are also used elsewhere: "
                              "they must be stored anyway")
            continue
        grown = _grow(updates, made_by, users, e, width, ctx)
        if grown is None:
            ctx.skipped(KIND, "segment sum whose messages are not a lane-wise edge computation")
            continue
        region, leaves = grown
        kinds = {vid: _classify(v, made_by, ctx, e, width) for vid, v in leaves.items()}
        if any(k is None for k in kinds.values()):
            ctx.skipped(KIND, "a message operand is neither gathered node rows, edge rows nor a constant")
            continue
        src_idx = [k[2] for k in kinds.values() if k[0] == "src"]
        if not src_idx:
            ctx.skipped(KIND, "no source-gathered operand: nothing to fuse a gather with")
            continue
        groups = {"src": [], "dst": [], "edge": []}
        slots = {}
        for vid, (kind, operand_v, _) in kinds.items():
            group = "dst" if kind == "const" else kind
            slots[vid] = (group, len(groups[group]))
            groups[group].append(operand_v)
        order = [o for o in program.ops if o.outputs[0].id in region]
        backend = ctx.backend
        layout = ctx.layout_values if ctx.layout_values and e == ctx.sizes.get("E") else ()
        edge_fn = _edge_fn(order, slots, {}, updates.id)
        impl = functools.partial(_run_fused, edge_fn, len(groups["src"]), len(groups["dst"]),
                                 len(layout), num_nodes=n, width=width, backend=backend,
                                 out_shape=op.outputs[0].shape, out_dtype=op.outputs[0].dtype,
                                 layout_tree=ctx.layout_tree)
        inputs = tuple(groups["src"] + groups["dst"] + groups["edge"]) + (src_idx[0], idx) + tuple(layout)
        new = ir.Op("fused_gather_reduce", inputs, op.outputs,
                    {"jgnn_residency": ("node",), "jgnn_movement": "reduce"}, impl=impl, origin=KIND)
        replaced[id(op)] = new
        fused_away.update(id(o) for o in order)
        where = "the GraphLayout passed in" if layout else "sorted inside the program (pass a " \
            "GraphLayout to skip this)"
        ctx.report.kernels.append(KernelRecord(
            "gather_reduce(sum)", backend,
            f"{len(order)} edge ops fused; {len(groups['src'])} src, {len(groups['dst'])} dst, "
            f"{len(groups['edge'])} edge operands; width {width}; CSR "
            f"{where if backend != 'xla' else 'not needed (segment_sum under jax.checkpoint)'}"))
        ctx.applied(KIND, f"gather→{len(order)} lane-wise ops→segment_sum over {e} edges into one op; the "
                          f"{list(updates.shape)} messages are never stored")
    ops = []
    for op in program.ops:
        if id(op) in fused_away:
            continue
        ops.append(replaced.get(id(op), op))
    return ir.Program(program.inputs, program.outputs, ops)


def _run_fused(edge_fn, n_src, n_dst, n_layout, *args, num_nodes, width, backend, out_shape, out_dtype,
               layout_tree):
    layout = jax.tree_util.tree_unflatten(layout_tree, args[len(args) - n_layout:]) if n_layout else None
    *operands, senders, receivers = args[:len(args) - n_layout]
    src, dst, edge = operands[:n_src], operands[n_src:n_src + n_dst], operands[n_src + n_dst:]
    dst = tuple(x if x.ndim and x.shape[0] == num_nodes else _repeat_rows(x, num_nodes) for x in dst)
    out = fused.gather_reduce(edge_fn, src, dst, edge, senders, receivers, num_nodes=num_nodes, width=width,
                              backend=backend, layout=layout, out_dtype=out_dtype)
    return [out.reshape(out_shape)]


def _repeat_rows(x, rows):
    return jnp.broadcast_to(jnp.reshape(x, (1, -1)), (rows, max(int(np.prod(np.shape(x))), 1)))
