"""Residency inference: one loop over a program's ops, the rules in `jgnn.facts`.

This is Graphiler's MP-DFG analysis on a flat jgnn `Program`. Every input gets an `Info` from its role in a
GraphsTuple (`InputTag`); every op gets its outputs' `Info` and a `Movement` from its primitive's rule. An op no
rule explains (a gather by data-dependent indices, an unknown primitive on graph data) starts a *fallback
region*: its outputs are ``unknown``, so is everything computed from them, and the passes leave exactly those ops
as traced. The rest of the program is still analysed and optimised.

The analysis runs once per compile; passes keep it current with `Analysis.add` for each op they make.
"""

from __future__ import annotations

import dataclasses

from jgnn import facts, ir
from jgnn.facts import Info
from jgnn.report import Reason
from jgnn.roles import Index, Movement, Residency


@dataclasses.dataclass(frozen=True)
class InputTag:
    """What a flat input of the traced function is: its role in GraphsTuple ``graph``, or ``shared``."""

    role: str  # nodes, edges, senders, receivers, n_node, n_edge, globals, node_type, edge_type, shared,
    # constant (an array the traced function closed over: shared, and never differentiated), or a GraphLayout
    # leaf: layout, edge_pair, pair_src, pair_type
    graph: int = 0
    # The edge list a graph's edge leaves (default ``g{graph}``) or a layout's leaves belong to: ``g{graph}+loops``
    # when a layer passes its graph with the self-loops already appended, together with a looped layout.
    edges: str | None = None


#: Roles of `GraphLayout` leaves (see `layout_info`).
LAYOUT_ROLES = frozenset({"layout", "edge_pair", "pair_src", "pair_type"})


def input_info(tag: InputTag) -> Info:
    g, edges = tag.graph, tag.edges or f"g{tag.graph}"
    if tag.role in LAYOUT_ROLES:
        return layout_info(tag.role, g, edges)
    table = {
        "nodes": Info(Residency.NODE, graph=g), "edges": Info(Residency.EDGE, graph=g, edges=edges),
        "globals": Info(Residency.GRAPH, graph=g),
        "senders": Info(Residency.EDGE, index=Index.SRC, graph=g, edges=edges),
        "receivers": Info(Residency.EDGE, index=Index.DST, graph=g, edges=edges),
        "node_type": Info(Residency.NODE, index=Index.NODE_TYPE, graph=g),
        "edge_type": Info(Residency.EDGE, index=Index.EDGE_TYPE, graph=g, edges=edges),
        "n_node": Info(Residency.GRAPH, index=Index.N_NODE, graph=g),
        "n_edge": Info(Residency.GRAPH, index=Index.N_EDGE, graph=g),
    }
    return table.get(tag.role, facts.SHARED)


def layout_info(role: str, graph: int, edges: str) -> Info:
    """What a `GraphLayout` leaf is: its typed pairs are graph data; its CSR arrays are opaque ids."""
    table = {
        "edge_pair": Info(Residency.EDGE, index=Index.PAIR, graph=graph, edges=edges),
        "pair_src": Info(Residency.PAIR, index=Index.PAIR_SRC, graph=graph),
        "pair_type": Info(Residency.PAIR, index=Index.PAIR_TYPE, graph=graph),
    }
    return table.get(role, facts.SHARED)


@dataclasses.dataclass(frozen=True)
class Fallback:
    op: ir.Op
    code: Reason
    params: tuple


@dataclasses.dataclass
class Analysis:
    info: dict[int, Info]
    movement: dict[int, Movement]  # keyed by id(op)
    fallbacks: list[Fallback]
    ctx: facts.Ctx

    def of(self, atom: ir.Atom) -> Info:
        return facts.SHARED if isinstance(atom, ir.Const) else self.info[atom.id]

    def unknown(self, atom: ir.Atom) -> bool:
        return self.of(atom).residency == Residency.UNKNOWN

    def add(self, op: ir.Op) -> None:
        """Analyse one op whose inputs are already analysed."""
        infos = [self.of(a) for a in op.inputs]
        if any(i.residency == Residency.UNKNOWN for i in infos):
            outs = [facts.UNKNOWN] * len(op.outputs)  # inside a fallback region, already reported
        else:
            try:
                outs, movement = _apply(op, infos, self.ctx)
                self.movement[id(op)] = movement
            except facts.Unknown as e:
                outs = [facts.UNKNOWN] * len(op.outputs)
                self.fallbacks.append(Fallback(op, e.code, tuple(sorted(e.params.items()))))
        self.info.update((v.id, i) for v, i in zip(op.outputs, outs, strict=True))

    def is_shared(self, atom: ir.Atom) -> bool:
        """No graph axis: a weight, a constant or a scalar."""
        info = self.of(atom)
        return info.residency == Residency.SHARED and not info.expanded


def _apply(op: ir.Op, infos: list[Info], ctx: facts.Ctx):
    entry = facts.of(op.prim)
    if entry.impure or op.effects:
        if any(facts.graph_resident(i) for i in infos) and op.outputs:
            raise facts.Unknown(Reason.IMPURE)
        return [facts.SHARED] * len(op.outputs), Movement.DENSE
    if entry.residency is not None:
        return entry.residency(op, infos, ctx)
    if not any(facts.graph_resident(i) or i.expanded or i.index is not None for i in infos):
        return [facts.SHARED] * len(op.outputs), Movement.DENSE
    return facts.dense(op, infos, ctx)


def analyze(program: ir.Program, tags: list[InputTag], ctx: facts.Ctx) -> Analysis:
    """Label every value of ``program`` (see module docstring)."""
    analysis = Analysis({v.id: input_info(t) for v, t in zip(program.inputs, tags, strict=True)}, {}, [], ctx)
    for op in program.ops:
        analysis.add(op)
    return analysis


def reported_residency(info: Info, value: ir.Value, ctx: facts.Ctx) -> str:
    """Residency as shown to users: an expanded constant lives on the axis it was broadcast along."""
    if info.expanded and value.ndim:
        sizes = ctx.sizes.get(0, {})
        return {sizes.get("E"): "edge", sizes.get("N"): "node"}.get(value.shape[0], "shared")
    return info.residency.value
