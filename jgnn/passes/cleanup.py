"""Common-subexpression and dead-code elimination over a jgnn Program."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jgnn import ir
from jgnn.passes.context import Context

# Ops with effects must survive DCE even when nothing reads them.
_EFFECTFUL = frozenset({"debug_callback", "io_callback", "pure_callback", "debug_print"})


def _param_key(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        if isinstance(value, dict):
            return tuple(sorted((k, _param_key(v)) for k, v in value.items()))
        if isinstance(value, list | tuple):
            return tuple(_param_key(v) for v in value)
        return ("id", id(value))


def _atom_key(atom: ir.Atom) -> Any:
    if isinstance(atom, ir.Value):
        return ("v", atom.id)
    val = atom.value
    if np.ndim(val) == 0 and not isinstance(val, jax.core.Tracer):  # a traced scalar has no value to compare
        return ("c", type(val).__name__, np.asarray(val).item(), str(np.asarray(val).dtype))
    return ("c", id(val))


def cse(program: ir.Program, ctx: Context) -> ir.Program:
    """Merge ops that bind the same primitive with the same params on the same inputs."""
    seen: dict[Any, ir.Op] = {}
    rename: dict[int, ir.Value] = {}
    ops, merged = [], 0
    for op in program.ops:
        op.inputs = tuple(rename.get(a.id, a) if isinstance(a, ir.Value) else a for a in op.inputs)
        if op.impl is not None or op.name in _EFFECTFUL:
            ops.append(op)
            continue
        key = (op.name, _param_key(op.params), tuple(map(_atom_key, op.inputs)))
        if key in seen:
            rename.update((a.id, b) for a, b in zip(op.outputs, seen[key].outputs, strict=True))
            merged += 1
            continue
        seen[key] = op
        ops.append(op)
    outputs = [rename.get(a.id, a) if isinstance(a, ir.Value) else a for a in program.outputs]
    if merged:
        ctx.applied("cse", f"merged {merged} duplicate ops (e.g. the node-level matmul shared by src and dst)")
    return ir.Program(program.inputs, outputs, ops)


def dce(program: ir.Program, ctx: Context) -> ir.Program:
    """Drop ops none of whose outputs is used."""
    live = {a.id for a in program.outputs if isinstance(a, ir.Value)}
    kept = []
    for op in reversed(program.ops):
        if op.name in _EFFECTFUL or any(v.id in live for v in op.outputs):
            kept.append(op)
            live.update(a.id for a in op.inputs if isinstance(a, ir.Value))
    dropped = len(program.ops) - len(kept)
    if dropped:
        ctx.applied("dce", f"removed {dropped} dead ops (gathers and edge-level work made redundant)")
    return ir.Program(program.inputs, program.outputs, kept[::-1])
