"""The optimizer: residency-driven rewrites of an analysed program, each recorded in the report.

Passes run in a fixed order and the program is re-analysed between them, so every pass sees exact
residencies. Each pass is ``run(program, ctx) -> program`` and records what it did, and what it declined
to do and why, with ``ctx.applied`` / ``ctx.skipped``.
"""

from __future__ import annotations

import jax

from jgnn import ir, residency
from jgnn import remat as remat_lib
from jgnn.passes import attention, broadcast_reorder, cleanup, fusion, linear_reorder, linear_split, typed_matmul
from jgnn.passes.context import Context

PIPELINE = (
    ("linear_split", linear_split.run),
    ("linear_reorder", linear_reorder.run),
    ("broadcast_reorder", broadcast_reorder.run),
    ("cse", cleanup.cse),
    ("dce", cleanup.dce),
    ("typed_matmul", typed_matmul.run),
    ("fuse_edge_softmax", attention.run),
    ("fuse_gather_reduce", fusion.run),
    ("fuse_gather_compute", fusion.run_gather_compute),
    ("dce", cleanup.dce),
)


def optimize(plan, analysis, *, flat, backend, remat, layout):
    """Rewrite ``plan.program`` in place of the traced one, then choose what to recompute under grad."""
    ctx = Context(tags=flat.tags, sizes=analysis.sizes, backend=backend, report=plan.report, layout=layout,
                  analysis=analysis)
    if analysis.fallbacks:
        # Rewrites reason about every value's residency; with unknown values in the program the analysis
        # cannot vouch for them, so the whole program runs as traced.
        plan.report.notes.append("optimizer skipped: the program has fallback regions")
    else:
        _rewrite(plan, ctx, layout)
    plan.remat_names = remat_lib.value_names(plan.program, ctx.analysis)
    plan.remat_policy = remat_lib.resolve(remat)[1]
    no_layout = any(not r.applied and r.kind == typed_matmul.COMPACT and typed_matmul.NEEDS_LAYOUT in r.detail
                    for r in plan.report.rewrites)
    plan.report.remat.append(remat_lib.record(remat, plan.remat_names, layout_would_compact=no_layout))
    return plan


def _rewrite(plan, ctx: Context, layout) -> None:
    program = plan.program
    if layout is not None:  # the layout's arrays become extra program inputs, so plans never hold them
        leaves, ctx.layout_tree = jax.tree_util.tree_flatten(layout)
        ctx.layout_values = tuple(ir.Value(tuple(x.shape), x.dtype) for x in leaves)
        program = ir.Program(program.inputs + list(ctx.layout_values), program.outputs, program.ops)
        ctx.tags = list(ctx.tags) + [residency.InputTag("layout")] * len(leaves)
        plan.layout_inputs = len(leaves)
    for name, run in PIPELINE:
        program = run(program, ctx)
        ctx.analysis = residency.analyze(program, ctx.tags, ctx.sizes)
        for f in ctx.analysis.fallbacks:  # a pass made ops the analysis cannot label: later passes leave them be
            plan.report.notes.append(f"after {name}: {f.primitive}: {f.reason}")
    plan.program = program
