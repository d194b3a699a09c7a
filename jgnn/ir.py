"""jgnn's program representation: a flat SSA list of primitive applications built from a jaxpr.

A `Program` is what the analysis reads, the passes rewrite and the evaluator runs. It mirrors a jaxpr, with
three differences that make rewriting easy:

* values are plain Python objects (`Value`), so passes can create new ones without touching JAX internals;
* every op binds a primitive with params (jgnn's fused ops are primitives too, `jgnn.ops.edge_op`), so a
  program is data that an outer compilation can read again;
* constants closed over by the traced function (weights captured by ``phi``, arrays of a Flax module) are
  program *inputs*, not baked-in values: one plan serves every call whose program has the same structure.
  Only literals (scalars written in the jaxpr) stay `Const`.

Call-like primitives (``jit``, ``closed_call``, ``checkpoint``) are inlined, so a ``jax.jit``-decorated helper
does not hide its body. ``custom_jvp_call`` and ``custom_vjp_call`` stay single ops, so their derivative rules
still run (``jax.nn.relu`` keeps its zero gradient at 0); their bodies are translated too (``Op.body``) for
the analysis to look into.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from jgnn import compat

_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Value:
    """An SSA value: its abstract shape and dtype, and a unique id."""

    shape: tuple[int, ...]
    dtype: Any
    id: int = dataclasses.field(default_factory=lambda: next(_ids))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def aval(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"v{self.id}:{np.dtype(self.dtype).name}{list(self.shape)}"


@dataclasses.dataclass(eq=False)
class Const:
    """A literal written in the jaxpr (a Python scalar or a scalar array)."""

    value: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.value))

    @property
    def dtype(self):
        return jax.numpy.result_type(self.value)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def aval(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"{self.value}"


Atom = Value | Const


@dataclasses.dataclass(eq=False)
class Op:
    """One equation: a primitive bound to ``inputs`` with ``params``."""

    prim: Any
    inputs: tuple[Atom, ...]
    outputs: tuple[Value, ...]
    params: dict = dataclasses.field(default_factory=dict)
    body: Program | None = None  # the callee of a custom_jvp/vjp call, for the analysis
    effects: frozenset = frozenset()  # the equation's JAX effects (callbacks, ordered io): never dropped or merged

    @property
    def name(self) -> str:
        return self.prim.name

    def run(self, *args) -> list:
        out = compat.bind(self.prim, self.params, args)
        return list(out) if self.prim.multiple_results else [out]

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self.inputs))
        return f"{', '.join(map(repr, self.outputs))} = {self.name}({ins})"


@dataclasses.dataclass(eq=False)
class Program:
    inputs: list[Value]
    outputs: list[Atom]
    ops: list[Op]

    def __repr__(self) -> str:
        lines = [f"inputs: {self.inputs}"] + [f"  {op!r}" for op in self.ops] + [f"outputs: {self.outputs}"]
        return "\n".join(lines)


@dataclasses.dataclass
class Traced:
    """A translated jaxpr: the program (arguments, then captured constants, as inputs) and those constants."""

    program: Program
    consts: list[Any]


def _is_literal(x) -> bool:
    """A numeric scalar known at trace time (random keys and tracers are values, not literals)."""
    if isinstance(x, jax.core.Tracer) or np.ndim(x) != 0:
        return False
    dtype = getattr(x, "dtype", None)
    return dtype is None or jax.numpy.issubdtype(dtype, jax.numpy.number) or dtype == np.bool_


def from_closed_jaxpr(closed: jcore.ClosedJaxpr) -> Traced:
    """Translate a ClosedJaxpr, inlining call primitives (see module docstring)."""
    env: dict = {}
    consts: list[Any] = []
    const_inputs: list[Value] = []

    def capture(value) -> Atom:
        if _is_literal(value):  # kept on the host: a device scalar in a Pallas kernel's body is a captured const
            return Const(np.asarray(value) if isinstance(value, jax.Array) else value)
        v = Value(tuple(np.shape(value)), jax.numpy.result_type(value))
        consts.append(value)
        const_inputs.append(v)
        return v

    args = [Value(tuple(v.aval.shape), v.aval.dtype) for v in closed.jaxpr.invars]
    env.update(zip(closed.jaxpr.invars, args, strict=True))
    env.update((var, capture(c)) for var, c in zip(closed.jaxpr.constvars, closed.consts, strict=True))
    ops: list[Op] = []
    _translate(closed.jaxpr, env, ops, capture)
    program = Program(args + const_inputs, [_read(env, v) for v in closed.jaxpr.outvars], ops)
    return Traced(program, consts)


def _read(env, var) -> Atom:
    if isinstance(var, jcore.Literal):
        return Const(var.val)
    return env[var]


def _closed(j) -> jcore.ClosedJaxpr:
    return j if isinstance(j, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(j, ())


def _translate(jaxpr: jcore.Jaxpr, env: dict, ops: list[Op], capture: Callable) -> None:
    for eqn in jaxpr.eqns:
        ins = [_read(env, v) for v in eqn.invars]
        prim = eqn.primitive
        if prim in compat.INLINED_CALLS and compat.INLINED_CALLS[prim] in eqn.params:
            sub = _closed(eqn.params[compat.INLINED_CALLS[prim]])
            sub_env = dict(zip(sub.jaxpr.invars, ins, strict=True))
            sub_env.update((var, capture(c)) for var, c in zip(sub.jaxpr.constvars, sub.consts, strict=True))
            _translate(sub.jaxpr, sub_env, ops, capture)
            for outer, inner in zip(eqn.outvars, sub.jaxpr.outvars, strict=True):
                env[outer] = _read(sub_env, inner)
            continue
        outs = [Value(tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars]
        body = None
        if prim in compat.CUSTOM_CALLS:
            callee = compat.custom_body(eqn.params)
            body = from_closed_jaxpr(_closed(callee)).program if callee is not None else None
        ops.append(Op(prim, tuple(ins), tuple(outs), dict(eqn.params), body, frozenset(eqn.effects)))
        env.update((v, o) for v, o in zip(eqn.outvars, outs, strict=True) if not isinstance(v, jcore.DropVar))


def captured_consts(closed: jcore.ClosedJaxpr) -> list[Any]:
    """The constants `from_closed_jaxpr` makes program inputs, in the same order: what a plan built from another
    trace of the same structure takes for this trace."""
    out = [c for c in closed.consts if not _is_literal(c)]

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            key = compat.INLINED_CALLS.get(eqn.primitive)
            if key is not None and key in eqn.params:
                sub = _closed(eqn.params[key])
                out.extend(c for c in sub.consts if not _is_literal(c))
                walk(sub.jaxpr)

    walk(closed.jaxpr)
    return out


def evaluate(program: Program, args: Sequence[Any], tag: Callable[[Value, Any], Any] | None = None,
             run: Callable[[Op, list], list] | None = None) -> list[Any]:
    """Run a program: one environment, one loop over ops (as ``jax.core.eval_jaxpr``).

    ``tag(value, x)`` may wrap each op's result (the recomputation policy names values with it). ``run(op, xs)``
    replaces ``op.run`` (an edge block resizes params, a kernel tile treats unit-axis moves as identities).
    """
    env: dict[int, Any] = {}

    def read(a: Atom):
        return a.value if isinstance(a, Const) else env[a.id]

    for v, x in zip(program.inputs, args, strict=True):
        env[v.id] = x
    for op in program.ops:
        xs = list(map(read, op.inputs))
        outs = op.run(*xs) if run is None else run(op, xs)
        for v, x in zip(op.outputs, outs, strict=True):
            env[v.id] = x if tag is None else tag(v, x)
    return [read(a) for a in program.outputs]


def retrace(closed: jcore.ClosedJaxpr, in_avals: Sequence[Any],
            runner: Callable[[Program], Callable[[Op, list], list]]) -> jcore.ClosedJaxpr:
    """``closed`` traced again at ``in_avals``, each op run by ``runner(program)`` (`evaluate`'s ``run``; it may
    look at the translated program, inputs then consts): a callee whose params hold the shapes it was traced with
    (a custom_jvp's ``jit``) moved to new ones."""
    traced = from_closed_jaxpr(closed)
    run = runner(traced.program)
    return jax.make_jaxpr(lambda *xs: evaluate(traced.program, [*xs, *traced.consts], run=run))(*in_avals)


OUTPUT = object()  # stands for "the program returns it" among a value's readers


def users(program: Program) -> dict[int, list]:
    """Map value id -> ops that read it; a value the program returns also lists `OUTPUT`."""
    table: dict[int, list] = {}
    for op in program.ops:
        for a in op.inputs:
            if isinstance(a, Value):
                table.setdefault(a.id, []).append(op)
    for a in program.outputs:
        if isinstance(a, Value):
            table.setdefault(a.id, []).append(OUTPUT)
    return table


def producers(program: Program) -> dict[int, Op]:
    return {v.id: op for op in program.ops for v in op.outputs}


def varies(atom: Atom, made_by: dict[int, Op], constants: frozenset[int] = frozenset()) -> bool:
    """Whether ``atom`` depends on an input other than ``constants`` (the ids of closed-over arrays): only such
    values carry tangents under ``grad`` and ``jvp``; literals and constants do not."""
    stack, seen = [atom], set()
    while stack:
        a = stack.pop()
        if not isinstance(a, Value) or a.id in seen:
            continue
        seen.add(a.id)
        op = made_by.get(a.id)
        if op is None and a.id not in constants:
            return True
        stack.extend(op.inputs if op is not None else ())
    return False


def has_effects(op: Op) -> bool:
    return bool(op.effects)


def new_op(prim, inputs: Sequence[Atom], params: dict, *, outputs: Sequence[Value] | None = None) -> Op:
    """An op binding ``prim``; output shapes come from JAX's own shape rule (``jax.eval_shape``)."""
    if outputs is None:
        specs = [a.value if isinstance(a, Const) else a.aval for a in inputs]
        out = jax.eval_shape(lambda *xs: compat.bind(prim, params, xs), *specs)
        outs = out if prim.multiple_results else [out]
        outputs = [Value(tuple(o.shape), o.dtype) for o in outs]
    return Op(prim, tuple(inputs), tuple(outputs), dict(params))


def structure_key(closed: jcore.ClosedJaxpr) -> Any:
    """A hashable description of a jaxpr's structure: primitives, params, shapes, dtypes and literals, not the
    values of its captured constants (only their shapes and dtypes). Two traces with equal keys run the same
    program on different constants, so they share one plan."""
    return (_jaxpr_key(closed.jaxpr),
            tuple((np.shape(c), str(jax.numpy.result_type(c))) if not _is_literal(c) else ("lit", _literal_key(c))
                  for c in closed.consts))


def _literal_key(x) -> Any:
    arr = np.asarray(x)
    return (str(arr.dtype), arr.item() if arr.dtype != object else id(x))


def _var_key(v, names: dict) -> Any:
    if isinstance(v, jcore.Literal):
        return ("lit", _literal_key(v.val))
    return names.setdefault(v, len(names))


def _param_key(value: Any) -> Any:
    if isinstance(value, jcore.ClosedJaxpr):
        return ("closed", _jaxpr_key(value.jaxpr),
                tuple((np.shape(c), str(jax.numpy.result_type(c))) for c in value.consts))
    if isinstance(value, jcore.Jaxpr):
        return ("jaxpr", _jaxpr_key(value))
    if isinstance(value, tuple | list):
        return tuple(_param_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _param_key(v)) for k, v in value.items()))
    try:
        hash(value)  # params compare by value where JAX defines it (WrappedFun, dimension numbers, dtypes)
        return value
    except TypeError:
        return ("id", id(value))


def _jaxpr_key(jaxpr: jcore.Jaxpr) -> Any:
    names: dict = {}
    head = tuple((tuple(v.aval.shape), str(v.aval.dtype), str(getattr(v.aval, "vma", "")), _var_key(v, names))
                 for v in (*jaxpr.constvars, *jaxpr.invars))
    body = tuple((eqn.primitive, tuple(_var_key(v, names) for v in eqn.invars),
                  tuple((tuple(v.aval.shape), str(v.aval.dtype), _var_key(v, names)) for v in eqn.outvars),
                  tuple(sorted((k, _param_key(p)) for k, p in eqn.params.items())))
                 for eqn in jaxpr.eqns)
    return head, body, tuple(_var_key(v, names) for v in jaxpr.outvars)
