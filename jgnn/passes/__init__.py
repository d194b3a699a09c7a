"""The optimizer: residency-driven rewrites of an analysed program, each recorded in the report.

Passes run in a fixed order over one analysis that each keeps current (`jgnn.passes.context.Builder`). Each
pass is ``run(program, ctx) -> program``. Ops in a fallback region (``unknown`` residency) are left as traced
by every pass; the rest of the program is optimised.
"""

from __future__ import annotations

from jgnn import ir
from jgnn.passes import broadcast_reorder, canonicalize, cleanup, fusion, linear_reorder, linear_split, typed_matmul
from jgnn.passes.context import Context

PIPELINE = (
    ("fold", cleanup.fold),
    ("canonicalize", canonicalize.run),
    ("dce", cleanup.dce),
    ("linear_split", linear_split.run),
    ("linear_reorder", linear_reorder.run),
    ("broadcast_reorder", broadcast_reorder.run),
    ("cse", cleanup.cse),
    ("dce", cleanup.dce),
    ("typed_matmul", typed_matmul.run),
    ("cse", cleanup.cse),  # the type columns each typed matmul sliced out are one value again
    ("typed_matmul_merge", typed_matmul.merge),
    ("fuse", fusion.run),
    ("dce", cleanup.dce),
)


def optimize(program: ir.Program, ctx: Context) -> ir.Program:
    for _, run in PIPELINE:
        program = run(program, ctx)
    return program
