"""Every JAX / Pallas version difference lives here (CPU dev box: JAX 0.10.x; GPU box: JAX 0.11.x).

Kernel modules and jgnn import Pallas entry points only through this module, so a Pallas API move is a
one-file fix. Nothing here imports from ``jgnn``.

Facts this module encodes (verified against the installed JAX source):

* ``pl.pallas_call`` on GPU defaults to the Mosaic GPU backend; the Triton lowering is selected only by
  passing ``compiler_params=plgpu.CompilerParams(...)`` (``jax.experimental.pallas.triton``).
  Older releases spelled it ``TritonCompilerParams``.
* The Triton lowering requires every load/store *indexer* shape to have a power-of-two size; refs
  themselves may have any shape. It rejects scalar prefetch and dynamic grids.
* The HLO interpreter (``interpret=True``) fills un-aliased outputs with NaN (floats) / INT_MIN (ints),
  so any output element a kernel forgets to write shows up as NaN in interpret-mode tests.
* Internal entry points used here (same call form in 0.10.2, 0.11.2 and 0.12.0.1):
  ``partial_eval.dce_jaxpr(jaxpr, used_outputs, instantiate=)``, ``core.eval_jaxpr``, and the Triton lowering's
  ``lower_jaxpr_to_triton_module``, which ``pallas_call_registration`` calls as a module attribute.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import core as _core  # ManualAxisType: no public name in JAX 0.10-0.12
from jax.experimental import pallas as pl

try:  # JAX >= 0.5: the Triton-specific Pallas API.
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover - very old JAX
    from jax.experimental.pallas import gpu as plgpu  # type: ignore[no-redef]

#: Custom-call target name the Triton lowering emits (checked by the lowering tests).
TRITON_CUSTOM_CALL = "__gpu$xla.gpu.triton"

_CompilerParams = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams


def triton_compiler_params(num_warps: int = 4, num_stages: int = 2) -> Any:
    """Compiler params that force the Triton lowering (not Mosaic GPU) for ``pl.pallas_call``."""
    return _CompilerParams(num_warps=num_warps, num_stages=num_stages)


def pallas_call(
    kernel: Callable[..., None],
    *,
    out_shape: Any,
    grid: tuple[int, ...],
    interpret: bool,
    num_warps: int = 4,
    num_stages: int = 2,
    input_output_aliases: dict[int, int] | None = None,
    name: str | None = None,
) -> Callable[..., Any]:
    """``pl.pallas_call`` with whole-array refs (no BlockSpecs), a static grid, and Triton params.

    Every kernel in this package indexes its refs with explicit pointer-style gathers (see
    ``pallas_kernels._access``), so no BlockSpec is needed: each program sees the full arrays.
    """
    kwargs: dict[str, Any] = {}
    if input_output_aliases:
        kwargs["input_output_aliases"] = input_output_aliases
    if name is not None:
        kwargs["name"] = name

    def call(*args: Any) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=varying_like(out_shape, args),
            grid=grid,
            compiler_params=triton_compiler_params(num_warps, num_stages),
            interpret=interpret,
            **kwargs,
        )(*args)

    return call


def varying_like(out_shape: Any, args: Sequence[Any]) -> Any:
    """``out_shape`` whose arrays vary over every manual mesh axis that some argument varies over.

    Inside ``shard_map`` with ``check_vma=True`` (its default), ``pallas_call`` needs each output's varying
    axes (none is an answer too); a graph kernel's output depends on all its inputs, so it varies wherever one
    of them does. Outside a manual context Pallas ignores them. The ``manual_axis_type`` spelling holds in JAX
    0.10-0.12.
    """
    axes: frozenset = frozenset()
    for a in jax.tree_util.tree_leaves(args):
        mat = getattr(jax.typeof(a), "manual_axis_type", None)
        axes |= getattr(mat, "varying", frozenset())
    mat = _core.ManualAxisType(varying=axes)
    return jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, manual_axis_type=mat)
        if isinstance(s, jax.ShapeDtypeStruct) else s, out_shape)


def program_id(axis: int) -> jax.Array:
    return pl.program_id(axis)


def triton_load(ref: Any, index: tuple[jax.Array, ...], mask: jax.Array | None, other: Any) -> jax.Array:
    """Masked Triton load ``ref[index]`` (all-integer-array index, broadcast together)."""
    return plgpu.load(ref.at[index], mask=mask, other=other)


def triton_store(ref: Any, index: tuple[jax.Array, ...], value: jax.Array, mask: jax.Array | None) -> None:
    """Masked Triton store ``ref[index] = value`` where ``mask``."""
    plgpu.store(ref.at[index], value, mask=mask)


def ragged_dot(x: jax.Array, w: jax.Array, group_sizes: jax.Array,
               preferred_element_type: Any = jnp.float32) -> jax.Array:
    """``jax.lax.ragged_dot``: ``y[rows of group g] = x[rows] @ w[g]``; rows past sum(group_sizes) are 0."""
    return jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=preferred_element_type)


#: The GPU that CUDA lowering targets when none is attached: the kind a Hopper H100 reports, and its SM count.
CUDA_TARGET_KIND = "NVIDIA H100 80GB HBM3"
CUDA_TARGET_CORES = 132


def abstract_gpu_mesh(device_kind: str = CUDA_TARGET_KIND, num_cores: int = CUDA_TARGET_CORES) -> Any:
    """A zero-axis abstract mesh on one abstract ``device_kind`` GPU, to lower for CUDA with no GPU attached.

    From JAX 0.11 the Pallas Triton lowering reads the target's compute capability from the context's abstract
    device (it raises "No supported GPU devices found" without one); 0.10.x assumes sm_90 and ignores it. The
    API exists in both. No axes, so nothing in the traced program gets a sharding from it. Inside
    ``jax.sharding.use_abstract_mesh`` nothing may run eagerly: build concrete inputs before entering it.
    """
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=num_cores, platform="cuda")
    return jax.sharding.AbstractMesh((), (), abstract_device=device)


def export_cuda_mlir(fn: Callable[..., Any], *args: Any) -> str:
    """Lower ``jax.jit(fn)(*args)`` for CUDA (an H100) without a GPU and return the StableHLO text.

    The Triton custom call is allowed explicitly; PTX compilation is *not* run, so this checks the
    Pallas -> Triton IR lowering, plus the one rule of Triton's verifier that the lowering leaves to the GPU:
    every kernel value has a power-of-two size (`odd_sized_value`; a ValueError names the kernel and op).
    Concrete ``args`` are fine: only their shapes and dtypes are read.
    """
    specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), args)
    export = jax.export.export(
        jax.jit(fn),
        platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)],
    )
    with jax.sharding.use_abstract_mesh(abstract_gpu_mesh()), _checking_kernel_sizes():
        return export(*specs).mlir_module()


@contextlib.contextmanager
def _checking_kernel_sizes():
    """Every Triton kernel lowered inside is checked with `odd_sized_value` first (by wrapping the Triton
    lowering's entry point, internal; where a JAX moved it, nothing is checked). The wrap is process-wide while
    it lasts (not thread-safe), and a lowering JAX cached from an earlier export is not checked again."""
    try:
        from jax._src.pallas.triton import lowering as triton_lowering
    except ImportError:  # pragma: no cover - a JAX without the Triton backend
        yield
        return
    lower = getattr(triton_lowering, "lower_jaxpr_to_triton_module", None)
    if lower is None:  # pragma: no cover - a JAX that renamed it
        yield
        return

    def checked(jaxpr, *args, **kwargs):
        odd = odd_sized_value(jaxpr)
        if odd is not None:
            name = getattr(getattr(jaxpr, "debug_info", None), "func_name", "a kernel")
            raise ValueError(f"Triton kernel {name}: {odd[0]} makes a value of shape {odd[1]}, whose size is not "
                             "a power of two (the GPU's Triton verifier rejects the module)")
        return lower(jaxpr, *args, **kwargs)

    triton_lowering.lower_jaxpr_to_triton_module = checked
    try:
        yield
    finally:
        triton_lowering.lower_jaxpr_to_triton_module = lower


def _odd_sized(eqn) -> tuple[int, ...] | None:
    for v in eqn.outvars:
        shape = tuple(getattr(v.aval, "shape", ()))
        size = math.prod(shape)
        if size & (size - 1):
            return shape
    return None


def odd_sized_value(jaxpr: Any) -> tuple[str, tuple[int, ...]] | None:
    """The first op of ``jaxpr`` (sub-jaxprs included) with a result whose size is not a power of two, as
    (primitive name, shape): Triton's tensor types must have power-of-two sizes (``TensorSizeTrait``), and
    Pallas checks this only for load and store indexers."""
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        shape = _odd_sized(eqn)
        if shape is not None:
            return eqn.primitive.name, shape
        for sub in _core.jaxprs_in_params(eqn.params):
            inner = odd_sized_value(sub)
            if inner is not None:
                return inner
    return None


def fori_loop(lower: Any, upper: Any, body: Callable[[Any, Any], Any], init: Any) -> Any:
    """``lax.fori_loop`` with traced bounds (lowers to ``scf.while`` in Triton, a while in interpret)."""
    return jax.lax.fori_loop(lower, upper, body, init)


__all__: Sequence[str] = (
    "CUDA_TARGET_CORES", "CUDA_TARGET_KIND", "TRITON_CUSTOM_CALL", "abstract_gpu_mesh",
    "export_cuda_mlir", "fori_loop", "pallas_call", "pl",
    "plgpu", "program_id", "ragged_dot", "triton_compiler_params", "triton_load", "triton_store",
)


# ---- jaxpr interpretation (used by jgnn's evaluator) ----------------------------------------------------

# Call primitives, by name (their names changed across versions: ``pjit`` became ``jit``), and the param that
# holds the callee. The first kind is inlined by jgnn; custom_jvp/vjp calls stay whole so their rules run.
CALL_PRIMITIVES_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
                           "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr"}
CALL_PRIMITIVES_CUSTOM = {"custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
                          "custom_vjp_call_jaxpr": "fun_jaxpr"}


def bind_primitive(prim: Any, params: dict, args) -> Any:
    """Bind ``prim`` as ``jax.core.eval_jaxpr`` does.

    ``get_bind_params`` returned ``(subfuns, params)`` before JAX 0.10 and returns params with the subfuns
    folded in since.
    """
    bound = prim.get_bind_params(params)
    if isinstance(bound, tuple) and len(bound) == 2 and isinstance(bound[1], dict):
        subfuns, bound = bound
        return prim.bind(*subfuns, *args, **bound)
    return prim.bind(*args, **bound)



def _dce(jaxpr: Any, *, keep_inputs: bool) -> tuple[Any, list[bool]] | None:
    """``partial_eval.dce_jaxpr`` (internal): ``jaxpr`` without the ops no output needs, and which inputs it
    reads; ``keep_inputs`` keeps every input. None where a JAX moved it (callers then keep everything)."""
    try:
        from jax._src.interpreters.partial_eval import dce_jaxpr
    except ImportError:  # pragma: no cover - a JAX that moved it
        return None
    return dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=keep_inputs)


def without_dead_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (pure, on pytrees of arrays) with the ops that no output reads removed before they reach a kernel.

    Triton verifies every op of a module (each tensor's size a power of two) before it eliminates dead code. A
    derivative's edge function builds tangents it then drops, such as the zero tangent of a width-3 message,
    and one such value fails the whole kernel on a GPU, though the interpreter runs it. Pallas drops dead code
    when it traces a kernel, but not inside loop bodies (JAX 0.10.2 has no DCE rule for ``while``), and a
    kernel's edge function runs inside its chunk loop."""
    def pruned(*args):
        flat, tree = jax.tree_util.tree_flatten(args)
        closed, out_shape = jax.make_jaxpr(lambda *xs: fn(*jax.tree_util.tree_unflatten(tree, xs)),
                                           return_shape=True)(*flat)
        kept = _dce(closed.jaxpr, keep_inputs=True)
        jaxpr = closed.jaxpr if kept is None else kept[0]
        outs = _core.eval_jaxpr(jaxpr, closed.consts, *flat)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return pruned


def _concatenate_lowers(eqn) -> bool:
    """What the Triton rule accepts: two operands joined along their last axis, each of size 1 there."""
    avals = [v.aval for v in eqn.invars]
    last = avals[0].ndim - 1
    return len(avals) == 2 and eqn.params["dimension"] == last and all(a.shape[-1] == 1 for a in avals)


# Rules of Pallas' Triton lowering that exist for some shapes only (jax/_src/pallas/triton/lowering.py).
_TRITON_SHAPE_RULES: dict[str, Callable[[Any], bool]] = {"concatenate": _concatenate_lowers}


def triton_gap(jaxpr: Any) -> str | None:
    """The name of the first op in ``jaxpr`` (a Jaxpr or ClosedJaxpr traced at power-of-two tile shapes;
    sub-jaxprs included; dead ops aside, as `without_dead_code` drops them) that Pallas' Triton lowering cannot
    lower: a primitive without a rule (``slice``, ``pad``, ``erf``, ``gather``), a shape that its rule rejects
    (``concatenate`` of anything but two ``[..., 1]`` operands), or a result whose size is not a power of two.
    None when every op lowers. The interpreter (``interpret=True``) runs all of these, so only a GPU compile
    would find them."""
    try:
        from jax._src.pallas.triton import lowering as triton_lowering  # internal: no public rule table
    except ImportError:  # pragma: no cover - a JAX without the Triton backend: nothing to check against
        return None
    rules = triton_lowering.triton_lowering_rules
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    pruned = _dce(jaxpr, keep_inputs=True)
    for eqn in (jaxpr if pruned is None else pruned[0]).eqns:
        name = eqn.primitive.name
        shapes_ok = _TRITON_SHAPE_RULES.get(name, lambda _: True)
        if eqn.primitive not in rules or not shapes_ok(eqn) or _odd_sized(eqn):
            return name
        for sub in _core.jaxprs_in_params(eqn.params):
            inner = triton_gap(sub)
            if inner is not None:
                return inner
    return None
