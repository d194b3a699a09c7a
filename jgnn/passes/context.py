"""What every pass gets: the analysed program's facts and the report to explain its decisions in."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jgnn import ir, residency
from jgnn.report import Report, RewriteRecord


@dataclasses.dataclass
class Context:
    tags: list[residency.InputTag]
    sizes: dict[str, int]
    backend: str
    report: Report
    layout: Any = None
    analysis: residency.Analysis | None = None
    layout_values: tuple = ()  # program inputs holding the GraphLayout's leaves, when one was passed
    layout_tree: Any = None

    def applied(self, kind: str, detail: str) -> None:
        self.report.rewrites.append(RewriteRecord(kind, detail, applied=True))

    def skipped(self, kind: str, detail: str) -> None:
        self.report.rewrites.append(RewriteRecord(kind, detail, applied=False))

    def info(self, atom: ir.Atom) -> residency.Info:
        return self.analysis.of(atom)


def row_elems(value: ir.Atom, axis: int = 0) -> int:
    """Elements per row along ``axis``."""
    shape = list(value.shape)
    if not shape:
        return 1
    del shape[axis]
    return int(np.prod(shape, dtype=np.int64))


def flops(op: ir.Op) -> float:
    """FLOPs of one op (dot_general: 2·MACs; anything else: one per output element)."""
    out = op.outputs[0]
    if op.name == "dot_general":
        (lc, _), _ = op.params["dimension_numbers"]
        contracted = int(np.prod([op.inputs[0].shape[d] for d in lc], dtype=np.int64))
        return 2.0 * contracted * int(np.prod(out.shape, dtype=np.int64))
    return float(sum(int(np.prod(o.shape, dtype=np.int64)) for o in op.outputs))


def is_shared(ctx: Context, atom: ir.Atom) -> bool:
    """No graph axis: a weight, a constant or a scalar."""
    if isinstance(atom, ir.Const):
        return True
    info = ctx.info(atom)
    return info.residency == residency.SHARED and not info.expanded
