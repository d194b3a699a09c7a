"""Every JAX version difference jgnn's compiler depends on (JAX 0.10 to the newest release).

`pallas_kernels.compat` holds the Pallas ones; that package imports nothing from jgnn, so each keeps its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.extend import core as jcore


def _primitive_of(fn: Callable, *args) -> jcore.Primitive:
    return jax.make_jaxpr(fn)(*args).jaxpr.eqns[0].primitive


def _first_primitive(name: str) -> jcore.Primitive | None:
    """``<name>_p`` from the modules that have held lax primitives across versions."""
    import jax._src.ad_util as ad_util
    import jax._src.lax.lax as lax_internal
    import jax._src.lax.slicing as slicing

    for module in (lax, lax_internal, slicing, ad_util):
        prim = getattr(module, f"{name}_p", None)
        if prim is not None:
            return prim
    return None


def primitives(names: str) -> list[jcore.Primitive]:
    """The primitive objects for space-separated names, skipping those this JAX version lacks."""
    found = (_first_primitive(n) for n in names.split())
    return [p for p in found if p is not None]


# Call primitives: found by tracing, since their names changed (``pjit`` became ``jit``, ``remat`` ``remat2``).
def _custom_vjp_primitive() -> jcore.Primitive:
    @jax.custom_vjp
    def f(x):
        return x

    f.defvjp(lambda x: (x, None), lambda _, g: (g,))
    return _primitive_of(f, 1.0)


JIT = _primitive_of(jax.jit(lambda x: x), 1.0)
CHECKPOINT = _primitive_of(jax.checkpoint(lambda x: x * 2.0), 1.0)
CLOSED_CALL = getattr(jcore.primitives, "closed_call_p", None)
CUSTOM_JVP = _primitive_of(jax.nn.relu, 1.0)
CUSTOM_VJP = _custom_vjp_primitive()
CHECKPOINT_NAME = _primitive_of(lambda x: checkpoint_name(x, "n"), 1.0)

# Inlined by jgnn's IR: call primitive -> the param holding the callee's jaxpr.
INLINED_CALLS = {p: k for p, k in ((JIT, "jaxpr"), (CHECKPOINT, "jaxpr"), (CLOSED_CALL, "call_jaxpr"))
                 if p is not None}
# Kept whole (their derivative rules must run); their bodies are analysed.
CUSTOM_CALLS = frozenset({CUSTOM_JVP, CUSTOM_VJP})
CALLS = frozenset(INLINED_CALLS) | CUSTOM_CALLS


def custom_body(eqn_params: dict) -> Any:
    """The callee of a custom_jvp/custom_vjp call (``call_jaxpr`` or ``fun_jaxpr`` by version)."""
    for key in ("call_jaxpr", "fun_jaxpr"):
        if key in eqn_params:
            return eqn_params[key]
    return None


def resize_custom_call(params: dict, retrace: Callable[[Any], Any]) -> dict:
    """A custom_jvp/vjp call's params with its callee and its JVP/forward jaxprs passed through ``retrace``
    (ClosedJaxpr -> ClosedJaxpr). The derivative thunks return ``(jaxpr, consts, *rest)``; their names differ
    across JAX versions. The backward of a custom_vjp is Python and retraces itself."""
    from jax._src import linear_util as lu

    out = dict(params)
    for key in ("call_jaxpr", "fun_jaxpr"):
        if key in params:
            out[key] = retrace(params[key])
    for key in ("jvp_jaxpr_fun", "jvp_jaxpr_thunk", "fwd_jaxpr_thunk"):
        if key not in params:
            continue
        thunk = params[key]
        call = getattr(thunk, "call_wrapped", thunk)

        @functools.cache
        def resized(*zeros, call=call):
            jaxpr, consts, *rest = call(*zeros)
            new = retrace(jcore.ClosedJaxpr(jaxpr, consts))
            return (new.jaxpr, new.consts, *rest)

        out[key] = (lu.wrap_init(resized, debug_info=thunk.debug_info) if hasattr(thunk, "call_wrapped")
                    else resized)
    return out


def bind(prim: jcore.Primitive, params: dict, args) -> Any:
    """Bind ``prim`` as ``jax.core.eval_jaxpr`` does.

    ``get_bind_params`` returned ``(subfuns, params)`` before JAX 0.10 and returns params with the subfuns
    folded in since.
    """
    bound = prim.get_bind_params(params)
    if isinstance(bound, tuple) and len(bound) == 2 and isinstance(bound[1], dict):
        subfuns, bound = bound
        return prim.bind(*subfuns, *args, **bound)
    if prim not in CALLS:
        args = match_vma(args)
    return prim.bind(*args, **bound)


def _varying(aval) -> frozenset:
    """The mesh axes an abstract value varies over inside ``shard_map`` (``aval.mat.varying`` in JAX 0.10,
    ``aval.vma`` in later releases)."""
    mat = getattr(aval, "mat", None)
    if mat is not None and hasattr(mat, "varying"):
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", frozenset()) or frozenset())


def shaped_like(shape, dtype, avals) -> jax.core.ShapedArray:
    """A ShapedArray varying over every mesh axis any of ``avals`` varies over (what an op combining them makes
    inside ``shard_map``; its operands have been cast to that set by `match_vma`)."""
    varying = frozenset().union(*(_varying(a) for a in avals))
    if not varying:
        return jax.core.ShapedArray(shape, dtype)
    from jax._src import core
    from jax.sharding import PartitionSpec

    sharding = core.get_cur_mesh_sharding(PartitionSpec(*([None] * len(shape))))
    if hasattr(core, "ManualAxisType"):
        return jax.core.ShapedArray(shape, dtype, sharding=sharding,
                                    manual_axis_type=core.ManualAxisType(varying=varying))
    return jax.core.ShapedArray(shape, dtype, sharding=sharding, vma=varying)  # pragma: no cover - other JAX


def match_vma(args):
    """``args`` cast to vary over the same mesh axes, as JAX does before binding its own primitives (a weight
    closed over by phi does not vary; node features split by ``shard_map`` do)."""
    from jax._src import core

    for name in ("auto_insert_reshard", "standard_insert_pvary"):
        insert = getattr(core, name, None)
        if insert is not None:
            return list(insert(*args))
    return list(args)  # pragma: no cover


def vary_like(values, like) -> list:
    """``values`` cast to vary over every mesh axis that some of ``like`` varies over (inside ``shard_map``).

    For constants that stand in for an operand: they must have the operand's type, which inside an edge function
    is that of the other rows (`match_vma` cast every operand of the op alike). Left unvarying, a zero at which
    a function is differentiated gets cast where it meets the varying rows, inside the function, and the
    pullback transposes that cast into a ``psum`` of the cotangent over the mesh axis.
    """
    values = list(values)
    return match_vma([*values, *like])[:len(values)]


def _unvarying(aval):
    """``aval`` without the mesh axes it varies over."""
    if not _varying(aval):
        return aval
    if hasattr(aval, "update_manual_axis_type"):
        from jax._src import core

        return aval.update_manual_axis_type(core.empty_mat)
    return aval.update(vma=frozenset())  # pragma: no cover - other JAX


def local_lowering(fn: Callable, *, multiple_results: bool) -> Callable:
    """``mlir.lower_fun(fn)`` for a primitive that computes on one shard's values alone (no collective), traced
    as outside ``shard_map``: its operands' types without the mesh axes they vary over.

    Inside ``shard_map`` a lowering rule sees the operands' varying types. JAX's Pallas HLO interpreter
    (``interpret=True``) evaluates the kernel, traced without them, on those varying blocks and fails on the
    first op mixing a block with a grid index; and a lowering that differentiates (an edge op's pullback) would
    turn any varying mismatch into a ``psum``: an all-reduce hidden inside the op.
    """
    from jax.interpreters import mlir

    lowered = mlir.lower_fun(fn, multiple_results=multiple_results)

    def rule(ctx, *args, **params):
        ctx = ctx.replace(avals_in=[_unvarying(a) for a in ctx.avals_in],
                          avals_out=[_unvarying(a) for a in ctx.avals_out])
        return lowered(ctx, *args, **params)

    return rule


def dce_reads(closed: jcore.ClosedJaxpr, n_inputs: int) -> list[bool] | None:
    """Which of the first ``n_inputs`` inputs a jaxpr's outputs depend on (JAX's internal DCE); None when this
    JAX moved it."""
    try:
        from jax._src.interpreters.partial_eval import dce_jaxpr
    except ImportError:  # pragma: no cover
        return None
    return list(dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))[1])[:n_inputs]


def apply_primitive(prim: jcore.Primitive, *args, **params):
    """Run a primitive eagerly through its lowering, compiled once per params (what ``def_impl`` of a lowered
    primitive needs)."""
    from jax._src import dispatch

    return dispatch.apply_primitive(prim, *args, **params)


def zero_tangent(x):
    """JAX's symbolic zero tangent of a primal value (``ad.Zero`` of its tangent aval)."""
    from jax.interpreters import ad

    return ad.Zero(jax.typeof(x).to_tangent_aval())


try:  # the marker for "this argument has no batch axis" in batching rules
    from jax._src.interpreters.batching import not_mapped
except ImportError:  # pragma: no cover
    not_mapped = None

float0 = jax.dtypes.float0
accumulation_floor = jnp.float32
