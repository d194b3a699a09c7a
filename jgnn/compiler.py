"""`compile` and `explain`: trace any function of GraphsTuples, analyse it, rewrite it and run it.

The pipeline, once per abstract signature (shapes, dtypes, pytree structure and static arguments):

1. flatten the arguments, tagging each leaf of a GraphsTuple with its role (`residency.InputTag`);
2. trace the function to a jaxpr and translate it to a `ir.Program` (call primitives inlined);
3. infer residency (`residency.analyze`);
4. unless ``backend="reference"``, run the optimizer passes (`jgnn.passes`) and the recomputation policy;
5. evaluate the program with jgnn's evaluator (`ir.evaluate`) on the flat arguments.

Step 5 runs on every call and is traceable, so a compiled function works under ``jax.jit``, ``jax.grad``,
``jax.vmap`` and ``jax.value_and_grad`` like the original.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import ir, residency
from jgnn import remat as remat_lib
from jgnn.report import EquationRecord, FallbackRecord, KernelRecord, Report

BACKENDS = ("auto", "pallas", "pallas_interpret", "xla", "reference")
_GRAPH_ROLES = {"nodes": "nodes", "edges": "edges", "senders": "senders", "receivers": "receivers",
                "n_node": "n_node", "n_edge": "n_edge", "globals": "globals"}
_TYPE_ROLES = {"nodes": "node_type", "edges": "edge_type"}


def resolve_backend(backend: str) -> str:
    """``auto`` means the Pallas kernels on a GPU and the XLA lowering of the fused ops elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "xla"
    return backend


# ---- flattening with roles -------------------------------------------------------------------------------

def _is_array(x) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic) or hasattr(x, "__jax_array__")


def _graph_role(path) -> str:
    field = path[0].name
    if field in _TYPE_ROLES and len(path) > 1 and getattr(path[1], "key", None) == "type":
        return _TYPE_ROLES[field]
    return _GRAPH_ROLES[field]


@dataclasses.dataclass(frozen=True)
class Flat:
    """Arguments split into traced array leaves (with roles) and static leaves (part of the cache key)."""

    arrays: list[Any]
    tags: list[residency.InputTag]
    static: tuple
    rebuild: Callable[[list[Any]], Any]


def flatten_arguments(tree) -> Flat:
    top, top_def = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, jraph.GraphsTuple))
    arrays, tags, static, pieces = [], [], [], []
    graphs = 0
    for item in top:
        if isinstance(item, jraph.GraphsTuple):
            with_path, sub_def = jax.tree_util.tree_flatten_with_path(item)
            leaves = [leaf for _, leaf in with_path]
            roles = [_graph_role(p) for p, _ in with_path]
            gi, graphs = graphs, graphs + 1
        else:
            leaves, sub_def = jax.tree_util.tree_flatten(item)
            roles, gi = ["shared"] * len(leaves), -1
        kinds = []
        for leaf, role in zip(leaves, roles, strict=True):
            if _is_array(leaf) or isinstance(leaf, jax.core.Tracer):
                arrays.append(leaf)
                tags.append(residency.InputTag(role, gi))
                kinds.append(True)
            else:
                static.append(leaf)
                kinds.append(False)
        pieces.append((sub_def, kinds))

    def rebuild(flat_arrays):
        it_arr, it_static = iter(flat_arrays), iter(static)
        items = [jax.tree_util.tree_unflatten(d, [next(it_arr) if k else next(it_static) for k in kinds])
                 for d, kinds in pieces]
        return jax.tree_util.tree_unflatten(top_def, items)

    key_static = tuple((type(s).__name__, s if isinstance(s, int | float | bool | str | None) else id(s))
                       for s in static)
    return Flat(arrays, tags, (top_def, tuple(p[0] for p in pieces), key_static), rebuild)


def graph_sizes(flat: Flat) -> dict[str, int]:
    """Static N and E of the first graph among the arguments (used by cost models and reports)."""
    sizes: dict[str, int] = {}
    for x, t in zip(flat.arrays, flat.tags, strict=True):
        if t.graph == 0 and t.role in ("nodes", "node_type") and np.ndim(x):
            sizes.setdefault("N", int(np.shape(x)[0]))
        if t.graph == 0 and t.role in ("senders",):
            sizes.setdefault("E", int(np.shape(x)[0]))
    return sizes


# ---- plans -----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    """A compiled program for one abstract signature, and the report that explains it."""

    program: ir.Program
    out_tree: Any
    report: Report
    layout_inputs: int = 0
    remat_names: dict = dataclasses.field(default_factory=dict)
    remat_policy: Any = None

    @property
    def closes_over_tracers(self) -> bool:
        consts = [a.value for op in self.program.ops for a in op.inputs if isinstance(a, ir.Const)]
        return any(isinstance(c, jax.core.Tracer) for c in consts)


def _abstract(x):
    return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))


def build_plan(fn: Callable, flat: Flat, *, backend: str, remat: Any, layout=None) -> Plan:
    def flat_fn(*arrays):
        args, kwargs = flat.rebuild(list(arrays))
        return fn(*args, **kwargs)

    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*map(_abstract, flat.arrays))
    out_tree = jax.tree_util.tree_structure(out_shape)
    program = ir.from_closed_jaxpr(closed)
    sizes = graph_sizes(flat)
    analysis = residency.analyze(program, flat.tags, sizes)
    report = Report(backend=backend, sizes=sizes)
    report.equations = [EquationRecord(r.primitive, r.movement, r.out_residency, r.shape, r.index)
                        for op in program.ops if (r := analysis.records.get(id(op))) is not None]
    report.fallbacks = [FallbackRecord(f.reason, f.primitive) for f in analysis.fallbacks]
    report.kernels = [KernelRecord(kind, backend, "made when a jgnn layer inside this function was compiled")
                      for op in program.ops if ir.is_fused_call(op.params)
                      for kind, backend, _ in [ir.fused_call(op.params)]]
    if report.fallbacks:
        report.notes.append("values computed from a fallback region run as in the reference program")
    plan = Plan(program, out_tree, report)
    if backend != "reference":
        from jgnn import passes  # the optimizer builds on this module

        plan = passes.optimize(plan, analysis, flat=flat, backend=backend, remat=remat, layout=layout)
    return plan


class Compiled:
    """A function of GraphsTuples compiled by jgnn; call it like the original.

    Extra keyword ``layout=`` (a `jgnn.GraphLayout` of the first graph argument) lets fused ops skip sorting
    the edges inside the program.
    """

    def __init__(self, fn: Callable, *, backend: str = "auto", remat: Any = "auto"):
        self.__wrapped__ = fn
        self.backend = resolve_backend(backend)
        remat_lib.resolve(remat)  # reject a bad option now, not at the first call
        self.remat = remat
        self._plans: dict[Any, Plan] = {}
        functools.update_wrapper(self, fn)

    def _key(self, flat: Flat, layout) -> Any:
        avals = tuple((np.shape(x), jnp.result_type(x).name) for x in flat.arrays)
        # A layout's shapes are part of the signature (the number of typed pairs varies by graph).
        layout_key = None if layout is None else (jax.tree_util.tree_structure(layout), tuple(
            np.shape(x) for x in jax.tree_util.tree_leaves(layout)))
        return flat.static, avals, layout_key

    def _plan_for(self, flat: Flat, layout) -> Plan:
        key = self._key(flat, layout)
        plan = self._plans.get(key)
        if plan is None:
            plan = build_plan(self.__wrapped__, flat, backend=self.backend, remat=self.remat, layout=layout)
            # A plan whose constants are tracers of an enclosing transformation must not outlive it.
            if not plan.closes_over_tracers:
                self._plans[key] = plan
        return plan

    def plan(self, *args, layout=None, **kwargs) -> Plan:
        return self._plan_for(flatten_arguments((args, kwargs)), layout)

    def __call__(self, *args, layout=None, **kwargs):
        if self.backend == "reference":
            return self.__wrapped__(*args, **kwargs)
        flat = flatten_arguments((args, kwargs))
        plan = self._plan_for(flat, layout)
        extra = jax.tree_util.tree_leaves(layout) if plan.layout_inputs else []
        outs = remat_lib.evaluate(plan.program, list(flat.arrays) + list(extra), plan.remat_names,
                                  plan.remat_policy)
        return jax.tree_util.tree_unflatten(plan.out_tree, outs)

    def explain(self, *args, layout=None, **kwargs) -> Report:
        if self.backend == "reference":
            flat = flatten_arguments((args, kwargs))
            return build_plan(self.__wrapped__, flat, backend="reference", remat=self.remat).report
        return self.plan(*args, layout=layout, **kwargs).report


def compile(fn: Callable, *, backend: str = "auto", remat: Any = "auto") -> Compiled:  # noqa: A001
    """Compile any function that takes GraphsTuples (and other pytrees); the result keeps its signature.

    ``backend`` is one of ``"auto"``, ``"pallas"``, ``"pallas_interpret"``, ``"xla"`` or ``"reference"``.
    ``remat`` is ``"auto"``, ``"none"``, ``"edges"`` or a ``jax.checkpoint`` policy (see `jgnn.remat`).
    """
    return Compiled(fn, backend=backend, remat=remat)


def explain(fn: Callable, *args, **kwargs) -> Report:
    """Analyse ``fn`` on ``args`` and report residency, rewrites, kernels and fallbacks (nothing is run)."""
    target = getattr(fn, "compiled", None) or fn
    if not isinstance(target, Compiled):
        target = compile(target)
    return target.explain(*args, **kwargs)
