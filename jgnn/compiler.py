"""`compile` and `explain`: trace any function of GraphsTuples, analyse it, rewrite it and run it.

Every call traces the function to a jaxpr (cheap) and looks its *structure* up in a bounded LRU cache of plans
(`PlanCache`): primitives, params, shapes and literals, not the values of captured constants. A plan is built
once per structure:

1. flatten the arguments, tagging each leaf of a GraphsTuple with its role (`jgnn.analysis.InputTag`);
2. translate the jaxpr to a `jgnn.ir.Program` (captured constants, such as the weights ``phi`` closes over,
   become inputs, so a new Flax ``apply`` with new parameters reuses the plan);
3. infer residency (`jgnn.analysis`), once;
4. unless ``backend="reference"``, run the optimizer passes (`jgnn.passes`) and choose what to recompute under
   ``grad`` (`jgnn.remat`);
5. compile the program's evaluation with ``jax.jit``.

A call runs the plan's jitted evaluation on the flat arguments and the trace's constants, so a compiled
function works under ``jit``, ``grad``, ``jvp``, ``vmap``, ``shard_map`` and ``checkpoint`` like the original.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import jraph
import numpy as np

from jgnn import analysis as analysis_lib
from jgnn import bucketing, emit, facts, ir
from jgnn import layout as layout_lib
from jgnn import remat as remat_lib
from jgnn.report import CacheStats, EquationRecord, Report
from jgnn.roles import Index

BACKENDS = ("auto", "pallas", "pallas_interpret", "xla", "reference")
_GRAPH_ROLES = {"nodes": "nodes", "edges": "edges", "senders": "senders", "receivers": "receivers",
                "n_node": "n_node", "n_edge": "n_edge", "globals": "globals"}
_TYPE_ROLES = {"nodes": "node_type", "edges": "edge_type"}
_LAYOUT_ROLES = {("pairs", "pair_src"): "pair_src", ("pairs", "pair_type"): "pair_type",
                 ("pairs", "edge_pair"): "edge_pair"}


def resolve_backend(backend: str) -> str:
    """``auto`` means the Pallas kernels on a GPU and the XLA lowering of the fused ops elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "xla"
    return backend


# ---- flattening with roles -------------------------------------------------------------------------------

def _is_array(x) -> bool:
    return isinstance(x, jax.Array | np.ndarray | np.generic | jax.core.Tracer) or hasattr(x, "__jax_array__")


def _graph_role(path) -> str:
    field = path[0].name
    if field in _TYPE_ROLES and len(path) > 1 and getattr(path[1], "key", None) == "type":
        return _TYPE_ROLES[field]
    return _GRAPH_ROLES[field]


@dataclasses.dataclass(frozen=True)
class Flat:
    """Arguments split into traced array leaves (with roles) and static leaves (part of the cache key)."""

    arrays: list[Any]
    tags: list[analysis_lib.InputTag]
    static: tuple
    rebuild: Callable[[list[Any]], Any]
    graphs: list[jraph.GraphsTuple]


def flatten_arguments(tree) -> Flat:
    top, top_def = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, jraph.GraphsTuple))
    arrays, tags, static, pieces, graphs = [], [], [], [], []
    for item in top:
        if isinstance(item, jraph.GraphsTuple):
            with_path, sub_def = jax.tree_util.tree_flatten_with_path(item)
            leaves = [leaf for _, leaf in with_path]
            roles = [_graph_role(p) for p, _ in with_path]
            gi = len(graphs)
            graphs.append(item)
        else:
            leaves, sub_def = jax.tree_util.tree_flatten(item)
            roles, gi = ["shared"] * len(leaves), 0
        kinds = []
        for leaf, role in zip(leaves, roles, strict=True):
            if _is_array(leaf):
                arrays.append(leaf)
                tags.append(analysis_lib.InputTag(role, gi))
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
    return Flat(arrays, tags, (top_def, tuple(p[0] for p in pieces), key_static), rebuild, graphs)


def graph_sizes(flat: Flat) -> dict[int, dict[str, int]]:
    """Static node and edge counts of every graph argument."""
    from jgnn import graph as graph_lib

    sizes = {}
    for gi, g in enumerate(flat.graphs):
        entry = {"E": int(np.shape(g.senders)[0])} if g.senders is not None else {}
        try:
            entry["N"] = graph_lib.num_nodes(g)
        except ValueError:
            pass
        sizes[gi] = entry
    return sizes


# ---- layouts ---------------------------------------------------------------------------------------------

def normalize_layouts(layout, flat: Flat) -> dict[int, layout_lib.GraphLayout]:
    """``layout=`` as {graph argument index: GraphLayout}; a bare layout belongs to the first graph argument."""
    if layout is None:
        return {}
    table = layout if isinstance(layout, Mapping) else {0: layout}
    out = {}
    for gi, lay in table.items():
        if not isinstance(lay, layout_lib.GraphLayout):
            raise TypeError(f"layout must be a jgnn.layout.GraphLayout (or a dict of them), got {type(lay).__name__}")
        if not 0 <= gi < len(flat.graphs):
            raise ValueError(f"layout given for graph argument {gi}, but the call has {len(flat.graphs)} graph(s)")
        lay.check(flat.graphs[gi])
        out[gi] = lay
    return out


def _graph_tags(flat: Flat, layouts: dict[int, layout_lib.GraphLayout]) -> list[analysis_lib.InputTag]:
    """The graph arguments' tags, with the edge list of a graph whose layout says its edges already hold the
    self-loops (`GraphLayout.looped_input`: a layer's inner call) named as that layout's, so the two match."""
    looped = {gi for gi, lay in layouts.items() if lay.looped_input(flat.graphs[gi])}
    return [dataclasses.replace(t, edges=layouts[t.graph].edges_name(t.graph))
            if t.role != "shared" and t.graph in looped else t for t in flat.tags]


def _layout_inputs(layouts: dict[int, layout_lib.GraphLayout]):
    """(flat leaves, tags, (graph, edges name, tree, pair roles)) of every layout, in graph order."""
    leaves, tags, described = [], [], []
    for gi in sorted(layouts):
        lay = layouts[gi]
        with_path, tree = jax.tree_util.tree_flatten_with_path(lay)
        edges = lay.edges_name(gi)
        for path, leaf in with_path:
            names = tuple(getattr(p, "name", getattr(p, "key", None)) for p in path)
            role = _LAYOUT_ROLES.get(tuple(n for n in names if isinstance(n, str))[-2:], "layout")
            leaves.append(leaf)
            tags.append(analysis_lib.InputTag(role, gi, edges))
        described.append((gi, edges, tree, len(with_path)))
    return leaves, tags, described


def _unless_layouts_match(outs: list, layouts: dict[int, layout_lib.GraphLayout], flat: Flat) -> list:
    """``outs``, with every float output NaN unless each layout describes its graph. `normalize_layouts` checked
    the concrete graphs on the host; a traced graph (under ``jit``) is checked here, in the program
    (`GraphLayout.matches`): a kernel that walks another graph's CSR would give a wrong answer silently."""
    traced = [gi for gi in layouts if any(isinstance(a, jax.core.Tracer) for a in
                                          (flat.graphs[gi].senders, flat.graphs[gi].receivers))]
    if not traced:
        return outs
    ok = functools.reduce(jnp.logical_and, [layouts[gi].matches(flat.graphs[gi]) for gi in traced])
    # A factor, not a select: the gradients are NaN too (a select would pass them zero cotangents).
    factor = jnp.where(ok, 1.0, jnp.nan)
    return [o * factor.astype(o.dtype) if jnp.issubdtype(o.dtype, jnp.inexact) else o for o in outs]


# ---- plans -----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    """A compiled program for one program structure, and the report that explains it."""

    program: ir.Program
    out_tree: Any
    report: Report
    run: Callable
    out_rows: list  # per output leaf: (residency, graph argument, whether it is an input passed through)


class PlanCache:
    """A bounded LRU of plans, shared by every compiled function (a Flax module makes a new layer per call)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._plans: collections.OrderedDict[Any, Plan] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key) -> Plan | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
            return plan

    def put(self, key, plan: Plan) -> None:
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


PLANS = PlanCache()


def _trace(fn: Callable, flat: Flat):
    def flat_fn(*arrays):
        args, kwargs = flat.rebuild(list(arrays))
        return fn(*args, **kwargs)

    # The arguments themselves, not their shapes: their abstract values carry what an enclosing shard_map knows
    # (which mesh axes each varies over), so the trace has the same casts a direct call would.
    with emit.tracing_for_analysis():
        return jax.make_jaxpr(flat_fn, return_shape=True)(*flat.arrays)


def build_plan(closed, out_shape, flat: Flat, *, backend: str, remat: Any, layouts) -> Plan:
    from jgnn import passes  # the optimizer builds on this module's inputs

    traced = ir.from_closed_jaxpr(closed)
    program = traced.program
    layout_leaves, layout_tags, described = _layout_inputs(layouts)
    layout_values = [ir.Value(tuple(np.shape(x)), x.dtype) for x in layout_leaves]
    program = ir.Program(program.inputs + layout_values, program.outputs, program.ops)
    tags = _graph_tags(flat, layouts) + [analysis_lib.InputTag("constant")] * len(traced.consts) + layout_tags
    ctx = facts.Ctx(graph_sizes(flat))
    analysis = analysis_lib.analyze(program, tags, ctx)
    sizes0 = ctx.sizes.get(0, {})
    report = Report(backend=backend, sizes=dict(sizes0))
    report.equations = [EquationRecord(op.name, analysis.movement[id(op)].value,
                                       analysis_lib.reported_residency(analysis.info[op.outputs[0].id],
                                                                       op.outputs[0], ctx),
                                       op.outputs[0].shape,
                                       (analysis.info[op.outputs[0].id].index or None) and
                                       analysis.info[op.outputs[0].id].index.value)
                        for op in program.ops if id(op) in analysis.movement and op.outputs]
    for f in analysis.fallbacks:
        report.fallback(f.code, f.op.name, **dict(f.params))
    constants = frozenset(v.id for v, t in zip(program.inputs, tags, strict=True) if t.role == "constant")
    _nested_kernels(program, report, constants)
    policy = None
    names: dict[int, str] = {}
    if backend != "reference":
        from jgnn.passes.context import Context, LayoutInputs

        lays, k = [], 0
        for gi, edges, tree, count in described:
            vals = tuple(layout_values[k:k + count])
            k += count
            lay = jax.tree_util.tree_unflatten(tree, vals)
            ends = {Index.SRC: lay.every_node_sends, Index.DST: lay.every_node_receives}
            lays.append(LayoutInputs(gi, edges, vals, tree, lay.pairs, lay.pair_groups, lay.node_groups,
                                     lay.num_nodes, frozenset(end for end, every in ends.items() if every)))
        pctx = Context(analysis, report, backend, tags, tuple(lays), constants)
        program = passes.optimize(program, pctx)
        names = remat_lib.value_names(program, analysis)
        policy = remat_lib.resolve(remat)[1]
        report.remat.append(remat_lib.record(remat, names, report))
    # Two jitted programs: as XLA gets it (`jgnn.emit`'s rules), and as an enclosing jgnn trace reads it; the jit
    # cache would otherwise hand a later outer trace the emitted form.
    emitted, as_traced = (jax.jit(functools.partial(_evaluate, program, names, policy, rules))
                          for rules in (True, False))
    run = lambda *flat: (as_traced if emit.analysing() else emitted)(*flat)  # noqa: E731
    inputs = {v.id for v in traced.program.inputs}
    out_rows = [(analysis.of(a).residency, analysis.of(a).graph, isinstance(a, ir.Value) and a.id in inputs)
                for a in traced.program.outputs]
    return Plan(program, jax.tree_util.tree_structure(out_shape), report, run, out_rows)


def _nested_kernels(program: ir.Program, report: Report, constants: frozenset[int]) -> None:
    """Fused ops already in the traced program (a compiled layer inside a compiled model) are kernels too."""
    from jgnn.ops import lowering
    from jgnn.ops.edge_op import edge_op_p

    made_by = ir.producers(program)
    for op in program.ops:
        if op.prim is edge_op_p:
            spec = op.params["spec"]
            mine = op.inputs[2:2 + len(spec.groups)]
            lowering.record(report, spec, [a.aval for a in mine], nested=True,
                            varying=tuple(ir.varies(a, made_by, constants) for a in mine))


def _evaluate(program: ir.Program, names: dict, policy, rules: bool, *flat):
    return remat_lib.evaluate(program, list(flat), names, policy, emit.run if rules else None)


class Compiled:
    """A function of GraphsTuples compiled by jgnn (made by `jgnn.compile`); call it like the original.

    Extra keyword ``layout=``: a `jgnn.GraphLayout` of the first graph argument (or a dict
    ``{graph argument index: layout}``), so fused ops skip sorting the edges inside the program.
    ``explain(*args)`` returns the `jgnn.Report` of the plan for those arguments, and ``stats`` counts this
    function's plan-cache hits and misses.
    """

    def __init__(self, fn: Callable, *, backend: str = "auto", remat: Any = "auto", cache: PlanCache = PLANS,
                 buckets=None):
        self.__wrapped__ = fn
        self.backend = resolve_backend(backend)
        remat_lib.resolve(remat)  # reject a bad option now, not at the first call
        self.remat = remat
        self.cache = cache
        self.buckets = bucketing.resolve(buckets)
        self.stats = CacheStats(capacity=cache.capacity)
        functools.update_wrapper(self, fn)

    def _key(self, closed, flat: Flat, layouts) -> Any:
        layout_key = tuple((gi, jax.tree_util.tree_structure(lay), tuple(np.shape(x) for x in jax.tree_util.tree_leaves(
            lay))) for gi, lay in sorted(layouts.items()))
        remat_key = self.remat if isinstance(self.remat, str) else id(self.remat)
        return (ir.structure_key(closed), tuple(flat.tags), flat.static, self.backend, remat_key, layout_key,
                tuple(sorted((g, tuple(sorted(s.items()))) for g, s in graph_sizes(flat).items())))

    def _plan(self, flat: Flat, layouts) -> tuple[Plan, list]:
        closed, out_shape = _trace(self.__wrapped__, flat)
        key = self._key(closed, flat, layouts)
        plan = self.cache.get(key)
        if plan is None:
            self.stats.misses += 1
            plan = build_plan(closed, out_shape, flat, backend=self.backend, remat=self.remat, layouts=layouts)
            self.cache.put(key, plan)
        else:
            self.stats.hits += 1
        self.stats.size = len(self.cache)
        return plan, ir.captured_consts(closed)

    def plan(self, *args, layout=None, **kwargs) -> Plan:
        flat = flatten_arguments((args, kwargs))
        return self._plan(flat, normalize_layouts(layout, flat))[0]

    def __call__(self, *args, layout=None, **kwargs):
        if self.backend == "reference":
            return self.__wrapped__(*args, **kwargs)
        if self.buckets is not None and layout is None:
            padded = bucketing.pad_arguments((args, kwargs), self.buckets)
            if padded is not None:
                (p_args, p_kwargs), sizes = padded
                out, plan = self._run(p_args, p_kwargs, None)
                return bucketing.unpad(out, plan, sizes)
        return self._run(args, kwargs, layout)[0]

    def _run(self, args, kwargs, layout):
        flat = flatten_arguments((args, kwargs))
        layouts = normalize_layouts(layout, flat)
        plan, consts = self._plan(flat, layouts)
        layout_leaves = _layout_inputs(layouts)[0]
        outs = _unless_layouts_match(plan.run(*flat.arrays, *consts, *layout_leaves), layouts, flat)
        return jax.tree_util.tree_unflatten(plan.out_tree, outs), plan

    def explain(self, *args, layout=None, **kwargs) -> Report:
        flat = flatten_arguments((args, kwargs))
        layouts = normalize_layouts(layout, flat)
        if self.backend == "reference":
            closed, out_shape = _trace(self.__wrapped__, flat)
            return build_plan(closed, out_shape, flat, backend="reference", remat=self.remat, layouts={}).report
        plan, _ = self._plan(flat, layouts)
        report = copy.copy(plan.report)
        report.cache = dataclasses.replace(self.stats)
        return report


def compile(fn: Callable, *, backend: str = "auto", remat: Any = "auto", buckets=None) -> Compiled:  # noqa: A001
    """Compile any function that takes GraphsTuples (and other pytrees); the result keeps its signature.

    Every `jraph.GraphsTuple` argument (at any depth of the arguments) is recognised as a graph, and its leaves
    by role: ``nodes`` leaves ``[N, ...]``, ``edges`` leaves ``[E, ...]``, int32 ``senders``/``receivers``
    ``[E]``, ``n_node``/``n_edge`` ``[G]``, ``globals`` leaves ``[G, ...]``; on a typed graph, int32
    ``nodes["type"]`` ``[N]`` and ``edges["type"]`` ``[E]``. Every other array argument, and every array ``fn``
    closes over (weights), is shared by all rows. Non-array leaves are static: part of the plan's key.

    Args:
      fn: a function of pytrees, for example a jraph model (``jraph.GraphConvolution(...)``) or a Flax
        ``module.apply``. Its outputs may be any pytree.
      backend: ``"auto"`` (``"pallas"`` when JAX's default backend is a GPU, else ``"xla"``); ``"xla"`` (the
        optimised program, fused ops as XLA segment ops or edge blocks); ``"pallas"`` (fused ops as Pallas/Triton
        kernels where they are lane-wise; needs a GPU); ``"pallas_interpret"`` (the same kernels in the Pallas
        interpreter, on CPU); ``"reference"`` (``fn`` itself, uncompiled). Anything else raises ``ValueError``.
      remat: what a training step keeps for the backward pass (`jgnn.remat`): ``"auto"`` (node-level values,
        fused ops' per-node statistics, values per unique (source, edge type) pair and edge-level matmul
        outputs; other edge values are recomputed), ``"edges"`` (as ``"auto"`` but edge-level matmul outputs
        and pair values are recomputed too), ``"none"`` (no checkpoint: JAX keeps what it keeps) or a
        ``jax.checkpoint`` policy over jgnn's value names.
      buckets: ``None``, ``"pow2"`` or a sequence of `jgnn.batching.Bucket`: graphs whose arrays are concrete are
        padded (``jraph.pad_with_graphs``) to the smallest bucket that holds them and the outputs cut back, so
        varying batch sizes share a few plans and compilations (see `jgnn.bucketing`). Under ``jit`` shapes are
        fixed already and nothing is padded.

    Returns:
      A `Compiled` callable with ``fn``'s signature plus a ``layout=`` keyword: a `jgnn.GraphLayout` of the first
      graph argument, or ``{graph argument index: GraphLayout}``. It works under ``jit``, ``grad``, ``jvp``,
      ``vmap``, ``shard_map`` and ``checkpoint``. A plan is built per program structure (shapes, dtypes,
      primitives; not the values of weights) and cached.
    """
    return Compiled(fn, backend=backend, remat=remat, buckets=buckets)


def explain(fn: Callable, *args, **kwargs) -> Report:
    """What jgnn does to ``fn`` on these arguments, as a `jgnn.Report` (a plan is built and cached; nothing runs).

    Args:
      fn: a `jgnn.message_passing` layer, a `Compiled` function (its backend and remat are used), a Flax module
        (explained as ``module.apply(variables, *rest)``: pass ``variables`` first) or any function of
        GraphsTuples (compiled with the defaults of `jgnn.compile`).
      *args, **kwargs: the arguments ``fn`` is called with (graphs as in `jgnn.compile`); ``layout=`` as there,
        or, for a Flax module, passed to ``module.apply`` as its layers take it.

    Returns:
      A `jgnn.Report` with, as data: ``equations`` (one `EquationRecord` per analysed op: ``primitive``,
      ``movement``, ``out_residency``, ``shape``), ``decisions`` / ``rewrites`` (`Decision`: ``by`` a `jgnn.Pass`,
      ``code`` a `jgnn.Reason`, ``applied``, ``params``), ``kernels`` (`KernelRecord`: ``op``, ``backend``,
      ``lowering``, ``code``, ``params``), ``fallbacks`` (regions left as traced, with a reason code), ``remat``
      and ``cache``; ``report.codes(by, applied=...)`` lists reason codes, ``summary()`` is one line and
      ``str(report)`` renders everything. A model of `jgnn.nn` layers lists each layer's fused ops as kernels
      with ``nested=True``: each layer was compiled on its own, so explain the layer to see its rewrites.
    """
    target = getattr(fn, "compiled", None) or fn
    try:
        import flax.linen as nn
    except ImportError:  # pragma: no cover
        nn = None
    if nn is not None and isinstance(target, nn.Module):
        # ``layout=`` is the module's own argument: its layers compile themselves and read it.
        target = functools.partial(target.apply, **{k: kwargs.pop(k) for k in ("layout",) if k in kwargs})
    if not isinstance(target, Compiled):
        target = compile(target)
    return target.explain(*args, **kwargs)
