"""jgnn's program representation: a flat SSA list of ops built from a jaxpr.

A `Program` is what the analysis reads, the passes rewrite and the evaluator runs. It mirrors a jaxpr, with
two differences that make rewriting easy:

* values are plain Python objects (`Value`), so passes can create new ones without touching JAX internals;
* an op may carry its own ``impl`` (a fused op, or a rewritten op whose params changed), otherwise it runs by
  binding its primitive exactly as ``jax.core.eval_jaxpr`` does.

Call-like primitives (``pjit``/``jit``, ``closed_call``, ``core_call``, ``checkpoint``) are inlined, so a
``jax.jit``-decorated helper does not hide its body from the analysis. ``custom_jvp_call`` and
``custom_vjp_call`` stay single ops, so their custom derivative rules still run (``jax.nn.relu`` keeps
its zero gradient at 0); their bodies are translated too (``Op.body``) for the analysis to look into.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from pallas_kernels.compat import CALL_PRIMITIVES_CUSTOM, CALL_PRIMITIVES_INLINED, bind_primitive

INLINED_CALLS, CUSTOM_CALLS = CALL_PRIMITIVES_INLINED, CALL_PRIMITIVES_CUSTOM

_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Value:
    """An SSA value: its abstract shape and dtype, and a unique id for printing."""

    shape: tuple[int, ...]
    dtype: Any
    id: int = dataclasses.field(default_factory=lambda: next(_ids))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"v{self.id}:{np.dtype(self.dtype).name}{list(self.shape)}"


@dataclasses.dataclass(eq=False)
class Const:
    """A literal or a constant closed over by the traced function."""

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

    def __repr__(self) -> str:
        return f"const{list(self.shape)}" if self.shape else f"{self.value}"


Atom = Value | Const


@dataclasses.dataclass(eq=False)
class Op:
    """One equation. ``name`` is the primitive's name (or the fused op's) for reports and rule tables."""

    name: str
    inputs: tuple[Atom, ...]
    outputs: tuple[Value, ...]
    params: dict = dataclasses.field(default_factory=dict)
    prim: Any = None
    impl: Callable[..., Sequence[Any]] | None = None
    body: Program | None = None
    origin: str = ""  # which pass made it; empty for ops straight from the traced program

    def run(self, *args):
        if self.impl is not None:
            return list(self.impl(*args))
        out = bind_primitive(self.prim, self.params, args)
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


def from_closed_jaxpr(closed: jcore.ClosedJaxpr) -> Program:
    """Translate a ClosedJaxpr, inlining call primitives (see module docstring)."""
    env: dict = {}
    inputs = [Value(tuple(v.aval.shape), v.aval.dtype) for v in closed.jaxpr.invars]
    env.update(zip(closed.jaxpr.invars, inputs, strict=True))
    for var, c in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        env[var] = Const(c)
    ops: list[Op] = []
    _translate(closed.jaxpr, env, ops)
    return Program(inputs, [_read(env, v) for v in closed.jaxpr.outvars], ops)


def _read(env, var) -> Atom:
    if isinstance(var, jcore.Literal):
        return Const(var.val)
    return env[var]


def _closed(j) -> jcore.ClosedJaxpr:
    return j if isinstance(j, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(j, ())


def _translate(jaxpr: jcore.Jaxpr, env: dict, ops: list[Op]) -> None:
    for eqn in jaxpr.eqns:
        ins = [_read(env, v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in INLINED_CALLS and INLINED_CALLS[name] in eqn.params and not is_fused_call(eqn.params):
            sub = _closed(eqn.params[INLINED_CALLS[name]])
            sub_env = dict(zip(sub.jaxpr.invars, ins, strict=True))
            sub_env.update((v, Const(c)) for v, c in zip(sub.jaxpr.constvars, sub.consts, strict=True))
            _translate(sub.jaxpr, sub_env, ops)
            for outer, inner in zip(eqn.outvars, sub.jaxpr.outvars, strict=True):
                env[outer] = _read(sub_env, inner)
            continue
        outs = [Value(tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars]
        body = None
        if name in CUSTOM_CALLS and CUSTOM_CALLS[name] in eqn.params:
            sub = _closed(eqn.params[CUSTOM_CALLS[name]])
            body = from_closed_jaxpr(sub)
        ops.append(Op(name, tuple(ins), tuple(outs), dict(eqn.params), eqn.primitive, body=body))
        env.update((v, o) for v, o in zip(eqn.outvars, outs, strict=True) if not isinstance(v, jcore.DropVar))


FUSED_PREFIX = "jgnn_fused"


def opaque(impl: Callable, kind: str, residency: str, backend: str) -> Callable:
    """A fused op's implementation as a named ``jit``, so that compiling code that calls it again (a model of
    compiled layers) keeps it as one op instead of re-analysing it. The name carries what the outer analysis
    needs: ``jgnn_fused__<kind>__<backend>__<output residency>``."""
    def run(*args):
        return impl(*args)

    run.__name__ = run.__qualname__ = f"{FUSED_PREFIX}__{kind}__{backend}__{residency}"
    return jax.jit(run)


def is_fused_call(params: dict) -> bool:
    return str(params.get("name", "")).startswith(FUSED_PREFIX + "__")


def fused_call(params: dict) -> tuple[str, str, str]:
    """(kind, backend, output residency) of an inner fused op (see `opaque`)."""
    _, kind, backend, residency = str(params["name"]).split("__")
    return kind, backend, residency


def evaluate(program: Program, args: Sequence[Any], tag: Callable[[Value, Any], Any] | None = None) -> list[Any]:
    """Run a program: one environment, one loop over ops (as ``jax.core.eval_jaxpr``).

    ``tag(value, x)`` may wrap each op's result (the recomputation policy names values with it).
    """
    env: dict[int, Any] = {}

    def read(a: Atom):
        return a.value if isinstance(a, Const) else env[a.id]

    for v, x in zip(program.inputs, args, strict=True):
        env[v.id] = x
    for op in program.ops:
        outs = op.run(*map(read, op.inputs))
        for v, x in zip(op.outputs, outs, strict=True):
            env[v.id] = x if tag is None else tag(v, x)
    return [read(a) for a in program.outputs]


OUTPUT = Op("program_output", (), ())  # stands for "the program returns it" among a value's readers


def users(program: Program) -> dict[int, list[Op]]:
    """Map value id -> ops that read it; a value the program returns also lists `OUTPUT`."""
    table: dict[int, list[Op]] = {}
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


def new_op(prim, inputs: Sequence[Atom], params: dict, *, origin: str, outputs: Sequence[Value] | None = None) -> Op:
    """An op binding ``prim``; output shapes come from JAX's own shape rule (``jax.eval_shape``)."""
    if outputs is None:
        specs = [a.value if isinstance(a, Const) else jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs]
        out = jax.eval_shape(lambda *xs: bind_primitive(prim, params, xs), *specs)
        outs = out if prim.multiple_results else [out]
        outputs = [Value(tuple(o.shape), o.dtype) for o in outs]
    return Op(prim.name, tuple(inputs), tuple(outputs), dict(params), prim, origin=origin)
