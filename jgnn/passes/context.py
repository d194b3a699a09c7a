"""What every pass gets (the analysed program's facts, the report, the layouts) and how it rewrites a program.

A pass walks the ops once with a `Builder`: it keeps an op (`emit`), or emits replacement ops (`bind`) and says
which new value stands for an old one (`alias`). The builder renames later reads and keeps the analysis current
for every op it emits, so the analysis runs once per compile.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jgnn import facts, ir
from jgnn.analysis import Analysis, InputTag
from jgnn.report import Pass, Reason, Report


@dataclasses.dataclass(frozen=True)
class LayoutInputs:
    """A `GraphLayout` passed for graph ``graph``: its leaves are program inputs ``values``."""

    graph: int
    edges: str  # the edge list it describes ("g0" or "g0+loops")
    values: tuple[ir.Value, ...]
    tree: Any  # its pytree structure
    pairs: Any = None  # the TypedPairs leaves among ``values``, as a TypedPairs of Values, if it has them
    pair_groups: tuple = ()  # the layout's static (type, first, end) runs of the pairs
    node_groups: tuple = ()  # and of the graph's node types, if its nodes are sorted by type
    num_nodes: int = 0
    # The ends of the list (`Index.SRC`, `Index.DST`) at which every node id in [0, num_nodes) occurs
    # (`GraphLayout.every_node_sends` / `every_node_receives`).
    every_node: frozenset = frozenset()


@dataclasses.dataclass
class Context:
    analysis: Analysis
    report: Report
    backend: str
    tags: list[InputTag]
    layouts: tuple[LayoutInputs, ...] = ()
    constants: frozenset[int] = frozenset()  # ids of the inputs the traced function closed over

    def varies(self, atom: ir.Atom, made_by: dict[int, ir.Op]) -> bool:
        """Whether ``atom`` carries a tangent under ``grad`` and ``jvp`` (`ir.varies`)."""
        return ir.varies(atom, made_by, self.constants)

    @property
    def sizes(self) -> dict[int, dict[str, int]]:
        return self.analysis.ctx.sizes

    def size(self, graph: int, key: str) -> int | None:
        return self.analysis.ctx.size(graph, key)

    def info(self, atom: ir.Atom) -> facts.Info:
        return self.analysis.of(atom)

    def is_shared(self, atom: ir.Atom) -> bool:
        return self.analysis.is_shared(atom)

    def applied(self, by: Pass, code: Reason, **params) -> None:
        self.report.add(by, code, applied=True, **params)

    def skipped(self, by: Pass, code: Reason, **params) -> None:
        self.report.add(by, code, applied=False, **params)

    def layout_for(self, edges: str | None) -> LayoutInputs | None:
        """The layout that describes exactly this edge list, if one was passed."""
        return next((lay for lay in self.layouts if edges is not None and lay.edges == edges), None)


class Builder:
    """Collects a pass's output program (see module docstring)."""

    def __init__(self, program: ir.Program, ctx: Context):
        self.program, self.ctx = program, ctx
        self.ops: list[ir.Op] = []
        self.rename: dict[int, ir.Atom] = {}

    def read(self, atom: ir.Atom) -> ir.Atom:
        while isinstance(atom, ir.Value) and atom.id in self.rename:
            atom = self.rename[atom.id]
        return atom

    def emit(self, op: ir.Op) -> ir.Op:
        op.inputs = tuple(self.read(a) for a in op.inputs)
        if any(v.id not in self.ctx.analysis.info for v in op.outputs):
            self.ctx.analysis.add(op)
        self.ops.append(op)
        return op

    def bind(self, prim, inputs, params: dict, *, outputs=None) -> list[ir.Value]:
        """Emit a new op binding ``prim``; returns its outputs."""
        op = ir.new_op(prim, [self.read(a) for a in inputs], params, outputs=outputs)
        self.ctx.analysis.add(op)
        self.ops.append(op)
        return list(op.outputs)

    def alias(self, old: ir.Value, new: ir.Atom) -> None:
        if new is not old:
            self.rename[old.id] = new

    def finish(self) -> ir.Program:
        outputs = [self.read(a) for a in self.program.outputs]
        return ir.Program(self.program.inputs, outputs, self.ops)


def row_elems(value: ir.Atom, axis: int = 0) -> int:
    """Elements per row along ``axis``."""
    shape = list(value.shape)
    if not shape:
        return 1
    del shape[axis]
    return int(np.prod(shape, dtype=np.int64))


def links(program: ir.Program):
    """(producer of each value, readers of each value)."""
    return ir.producers(program), ir.users(program)
