"""Common-subexpression and dead-code elimination over a jgnn Program."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jgnn import compat, facts, ir
from jgnn.passes.context import Builder, Context
from jgnn.report import Pass, Reason


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
    arr = np.asarray(atom.value)
    return ("c", str(arr.dtype), arr.item())


def cse(program: ir.Program, ctx: Context) -> ir.Program:
    """Merge ops that bind the same primitive with the same params on the same inputs (effects excepted)."""
    seen: dict[Any, ir.Op] = {}
    b = Builder(program, ctx)
    merged = 0
    for op in program.ops:
        op.inputs = tuple(b.read(a) for a in op.inputs)
        if op.effects or facts.of(op.prim).impure or not op.outputs:
            b.emit(op)
            continue
        key = (op.prim, _param_key(op.params), tuple(map(_atom_key, op.inputs)))
        if key in seen:
            for old, new in zip(op.outputs, seen[key].outputs, strict=True):
                b.alias(old, new)
            merged += 1
            continue
        seen[key] = op
        b.emit(op)
    if merged:
        ctx.applied(Pass.CSE, Reason.MERGED_DUPLICATES, count=merged)
    return b.finish()


def _evaluate(op: ir.Op) -> np.ndarray | None:
    """``op`` on its literal inputs now, or None where JAX cannot evaluate it here: inside ``shard_map`` a
    primitive casts even literals to vary over the mesh axes, which needs the mapped trace."""
    try:
        with jax.ensure_compile_time_eval():  # plans are built inside the caller's trace
            return np.asarray(op.run(*(a.value for a in op.inputs))[0])
    except ValueError:
        return None


def fold(program: ir.Program, ctx: Context) -> ir.Program:
    """Evaluate ops on literal scalars now (the index arithmetic JAX writes around ``W[t]``: ``0 < 0``,
    ``0 + n``) and use their values as literals."""
    b = Builder(program, ctx)
    folded = 0
    for op in program.ops:
        op.inputs = tuple(b.read(a) for a in op.inputs)
        if (op.inputs and all(isinstance(a, ir.Const) for a in op.inputs) and len(op.outputs) == 1
                and op.outputs[0].ndim == 0 and not op.effects and not op.prim.multiple_results
                and op.prim not in (compat.CUSTOM_JVP, compat.CUSTOM_VJP)
                and not jax.dtypes.issubdtype(op.outputs[0].dtype, jax.dtypes.extended)):  # a key is no NumPy literal
            value = _evaluate(op)
            if value is None:
                b.emit(op)
                continue
            b.alias(op.outputs[0], ir.Const(value))
            folded += 1
            continue
        b.emit(op)
    if folded:
        ctx.applied(Pass.CSE, Reason.FOLDED_CONSTANTS, count=folded)
    return b.finish()


def dce(program: ir.Program, ctx: Context) -> ir.Program:
    """Drop ops none of whose outputs is used (effects excepted)."""
    live = {a.id for a in program.outputs if isinstance(a, ir.Value)}
    kept = []
    for op in reversed(program.ops):
        if op.effects or facts.of(op.prim).impure or any(v.id in live for v in op.outputs):
            kept.append(op)
            live.update(a.id for a in op.inputs if isinstance(a, ir.Value))
    dropped = len(program.ops) - len(kept)
    if dropped:
        ctx.applied(Pass.DCE, Reason.REMOVED_DEAD, count=dropped)
    return ir.Program(program.inputs, program.outputs, kept[::-1])
