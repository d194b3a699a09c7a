"""The `explain` report: what the analysis found and every decision the compiler made, as data.

Every rewrite, skip, fallback, kernel choice and recomputation decision is a record with a `Reason` code and
its parameters. ``str(report)`` renders them through `MESSAGES`; no code reads the rendered text back.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class Pass(enum.StrEnum):
    """Who made a decision: an optimizer pass, the lowering choice, the analysis, or the plan cache."""

    CANONICALIZE = "canonicalize"
    LINEAR_SPLIT = "linear_split"
    LINEAR_REORDER = "linear_reorder"
    BROADCAST_REORDER = "broadcast_reorder"
    COMPACT_MATERIALIZE = "compact_materialize"
    CSE = "cse"
    DCE = "dce"
    TYPED_MATMUL = "typed_matmul"
    FUSE = "fuse"
    LOWERING = "lowering"
    ANALYSIS = "analysis"
    REMAT = "remat"
    CACHE = "cache"


class Reason(enum.StrEnum):
    """Why a decision, fallback or kernel choice was made: the structured code a `Report` records (assert on these,
    not on the rendered text). Grouped below by the pass that emits them; `Report.codes` lists a report's."""

    # canonicalize
    RAISED_GATHER = "raised_gather"
    RAISED_SEGMENT = "raised_segment"
    RAISED_SOFTMAX = "raised_softmax"
    RAISED_MEAN = "raised_mean"
    RAISED_COUNT_REPEAT = "raised_count_repeat"
    # linear split / reorder
    SPLIT_CONCAT = "split_concat"
    SPLIT_SUM = "split_sum"
    SAME_PROVENANCE = "same_provenance"
    SPLIT_DIM_NOT_CONTRACTED = "split_dim_not_contracted"
    CANCELLING_DIFFERENCE = "cancelling_difference"
    BROADCAST_PIECE = "broadcast_piece"
    REASSOCIATED = "reassociated"
    REASSOCIATION_COSTS_MORE = "reassociation_costs_more"
    MATMUL_BEFORE_REDUCTION = "matmul_before_reduction"
    MATMUL_DOES_NOT_NARROW = "matmul_does_not_narrow"
    DIFFERENT_TYPE_INDICES = "different_type_indices"
    # broadcast reordering
    LIFTED = "lifted"
    DIFFERENT_INDICES = "different_indices"
    UNGATHERED_EDGE_OPERAND = "ungathered_edge_operand"
    NOT_ROWWISE = "not_rowwise"
    COST_KEEPS_EDGES = "cost_keeps_edges"
    FIXED_SHAPE_BODY = "fixed_shape_body"
    # compaction, typed matmul
    COMPACTED_NODE_TYPE = "compacted_node_type"
    COMPACTED_PAIRS = "compacted_pairs"
    NEEDS_LAYOUT = "needs_layout"
    NO_SAVING = "no_saving"
    GROUPED_MATMUL = "grouped_matmul"
    UNSUPPORTED_DIMENSION_NUMBERS = "unsupported_dimension_numbers"
    # cleanup
    MERGED_DUPLICATES = "merged_duplicates"
    MERGED_TYPED_MATMULS = "merged_typed_matmuls"
    FOLDED_CONSTANTS = "folded_constants"
    REMOVED_DEAD = "removed_dead"
    # fusion
    FUSED_REDUCE = "fused_reduce"
    FUSED_ATTENTION = "fused_attention"
    FUSED_COMPUTE = "fused_compute"
    MESSAGES_STORED_ANYWAY = "messages_stored_anyway"
    NOT_A_GRAPH_REDUCTION = "not_a_graph_reduction"
    NO_EDGE_WORK = "no_edge_work"
    SOFTMAX_NOT_FUSED = "softmax_not_fused"
    FILL_MODE_GATHER = "fill_mode_gather"
    # lowering choices
    LOWER_SEGMENT = "lower_segment"
    LOWER_BLOCKS = "lower_blocks"
    LOWER_KERNEL = "lower_kernel"
    NOT_LANEWISE = "not_lanewise"
    NOT_ZERO_PADDING_SAFE = "not_zero_padding_safe"
    NOT_IN_TRITON = "not_in_triton"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    NO_EDGES = "no_edges"
    TYPED_MATMUL_KERNEL = "typed_matmul_kernel"
    TYPED_MATMUL_RAGGED_DOT = "typed_matmul_ragged_dot"
    TYPED_MATMUL_PER_HEAD = "typed_matmul_per_head"
    TYPED_MATMUL_XLA_DTYPE = "typed_matmul_xla_dtype"
    BACKWARD_ON_KERNELS = "backward_on_kernels"
    BACKWARD_ON_XLA = "backward_on_xla"
    BACKWARD_MIXED_LOWERINGS = "backward_mixed_lowerings"
    CSR_FROM_LAYOUT = "csr_from_layout"
    CSR_SORTED_IN_PROGRAM = "csr_sorted_in_program"
    # analysis / fallback
    DATA_DEPENDENT_GATHER = "data_dependent_gather"
    DATA_DEPENDENT_SCATTER = "data_dependent_scatter"
    PARTIAL_ROW_GATHER = "partial_row_gather"
    MIXED_RESIDENCIES = "mixed_residencies"
    MIXES_ROWS = "mixes_rows"
    DATA_DEPENDENT_PERMUTATION = "data_dependent_permutation"
    UNKNOWN_PRIMITIVE = "unknown_primitive"
    IMPURE = "impure"
    # recomputation
    REMAT_POLICY = "remat_policy"
    EDGE_MATMUL_SAVED = "edge_matmul_saved"
    # plan cache
    # hierarchical neighbourhoods (jgnn.neighborhood): the lowering of each level
    LEVEL_DENSE = "level_dense"
    LEVEL_SEGMENT = "level_segment"
    LEVEL_FUSED = "level_fused"
    LEVEL_NOT_FUSED = "level_not_fused"
    CACHE_HIT = "cache_hit"
    CACHE_MISS = "cache_miss"
    BUCKETED = "bucketed"
    # distributed: how a layer's cut edges travel (jgnn.distributed.strategy)
    SEND_SOURCE_ROWS = "send_source_rows"
    SEND_PARTIAL_AGGREGATES = "send_partial_aggregates"
    PARTIALS_NEED_AGGREGATE = "partials_need_aggregate"


MESSAGES: dict[Reason, str] = {
    Reason.RAISED_GATHER: "{count} gather(s) by {index} ids recognised as graph broadcasts",
    Reason.RAISED_SEGMENT: "{count} {kind} scatter(s) by {index} ids recognised as segment reductions",
    Reason.RAISED_SOFTMAX: "edge softmax by {index} ids recognised (max, shift, exp, sum, divide)",
    Reason.RAISED_MEAN: "segment mean recognised (a sum divided by the clamped count of the same ids)",
    Reason.RAISED_COUNT_REPEAT: "per-{axis} graph ids made from the graph counts recognised",
    Reason.SPLIT_CONCAT: "concatenate({pieces}) @ W split into {n} matmuls of widths {widths}",
    Reason.SPLIT_SUM: "({pieces}) @ W split into {n} matmuls so each can move to its own rows",
    Reason.SAME_PROVENANCE: "{op} feeding dot_general: operands come through the same index, nothing to split",
    Reason.SPLIT_DIM_NOT_CONTRACTED: "concatenate feeding dot_general along a dimension that is not contracted",
    Reason.BROADCAST_PIECE: "{op} feeding dot_general has a piece broadcast along a unit axis: it does not fit W",
    Reason.CANCELLING_DIFFERENCE: "(x[{a}] - x[{b}]) @ W kept per edge: neighbours' features cancel in the difference, "
                                  "and x[{a}] @ W - x[{b}] @ W would keep the rounding of the large terms",
    Reason.REASSOCIATED: "{form} → {to}: {before:.3g} → {after:.3g} FLOPs",
    Reason.REASSOCIATION_COSTS_MORE: "{form}: reassociating costs more ({before:.3g} vs {after:.3g} FLOPs)",
    Reason.MATMUL_BEFORE_REDUCTION: "{form} → segment(rows @ W): the {edges} edges carry {d_out} values, not "
                                    "{d_in}",
    Reason.MATMUL_DOES_NOT_NARROW: "{form}: W does not narrow the rows ({d_in} → {d_out}), reduced first",
    Reason.DIFFERENT_TYPE_INDICES: "(x @ W[t]) @ a[s] through different type indices: no per-type product",
    Reason.LIFTED: "{op} on {index}-gathered rows moved to the nodes: {edges}→{rows} rows, "
                   "est. {before:.3g} → {after:.3g} FLOP+elem",
    Reason.DIFFERENT_INDICES: "{op}: operands come through different indices ({indices})",
    Reason.UNGATHERED_EDGE_OPERAND: "{op}: an operand is edge data that was not gathered from the nodes",
    Reason.NOT_ROWWISE: "{op}: not row-wise (an output row reads several input rows)",
    Reason.COST_KEEPS_EDGES: "{op}: the cost model keeps it on the edges ({why}; {before:.3g} vs {after:.3g})",
    Reason.FIXED_SHAPE_BODY: "{primitive}: its derivative rule holds its traced shapes: it runs on all rows at once",
    Reason.COMPACTED_NODE_TYPE: "{types}-type table read through the {index} node's type made per node "
                                "({rows} rows, {ratio:.1f}× fewer than the {edges} edges)",
    Reason.COMPACTED_PAIRS: "x[src] @ W[edge_type] computed for {pairs} unique (source, edge type) pairs instead "
                            "of {edges} edges ({ratio:.2f}×), then gathered per edge",
    Reason.NEEDS_LAYOUT: "x[src] @ W[edge_type] over {edges} edges: pass a GraphLayout of the typed graph to "
                         "compute it once per unique (source, edge type) pair",
    Reason.NO_SAVING: "{what}: {rows} rows for {edges} edges, no saving",
    Reason.GROUPED_MATMUL: "x @ W[{index}] over {rows} rows as a grouped matmul ({impl}); the "
                           "[{rows}, {d_in}, {d_out}] weight gather is never built",
    Reason.UNSUPPORTED_DIMENSION_NUMBERS: "dot_general with a typed weight in a layout the grouped matmul does "
                                          "not cover",
    Reason.MERGED_DUPLICATES: "merged {count} duplicate ops",
    Reason.MERGED_TYPED_MATMULS: "{count} typed matmuls of the same {rows} rows by the same types run as one "
                                 "({d_out} output columns): the rows are packed once",
    Reason.FOLDED_CONSTANTS: "evaluated {count} ops on literal scalars at compile time",
    Reason.REMOVED_DEAD: "removed {count} dead ops",
    Reason.FUSED_REDUCE: "gather→{ops} edge ops→segment {reduce} over {edges} edges in one op; the {shape} "
                         "messages are never stored",
    Reason.FUSED_ATTENTION: "edge softmax over {edges} edges and the weighted sum after it in one op; scores "
                            "{scores} and weights are never stored",
    Reason.FUSED_COMPUTE: "gather→{ops} edge ops written once per edge ({shape})",
    Reason.MESSAGES_STORED_ANYWAY: "segment {reduce} of {shape} messages that something else also reads: they "
                                   "are stored anyway, and the reduction over {edges} edges reads them in one op",
    Reason.NO_EDGE_WORK: "segment {reduce} of edge rows that no per-edge computation feeds: nothing to fuse",
    Reason.NOT_A_GRAPH_REDUCTION: "segment {reduce} by {index} ids: not an edge-to-node reduction",
    Reason.SOFTMAX_NOT_FUSED: "edge softmax whose weights are used outside a weighted sum: kept as one norm op",
    Reason.FILL_MODE_GATHER: "a gather with mode 'fill' stays outside the fused op (its out-of-range rows are "
                             "NaN, not clamped)",
    Reason.LOWER_SEGMENT: "{op}: XLA segment ops over all {edges} edges ({bytes:.3g} B of edge temporaries)",
    Reason.LOWER_BLOCKS: "{op}: XLA edge blocks of {block} edges ({bytes:.3g} B of edge temporaries over the "
                         "{budget:.3g} B budget)",
    Reason.LOWER_KERNEL: "{op}: Pallas kernel ({csr})",
    Reason.BACKWARD_ON_KERNELS: "its backward's {backward_ops} edge ops run as Pallas kernels",
    Reason.BACKWARD_ON_XLA: "its backward's {backward_ops} edge ops run on XLA",
    Reason.BACKWARD_MIXED_LOWERINGS: "its backward's {backward_ops} edge ops run on XLA, although "
                                     "{backward_kernel_ops} of them could run as kernels: one backward's ops "
                                     "recompute the same values and must round them alike",
    Reason.NOT_LANEWISE: "{op}: runs on XLA: the edge function is not lane-wise ({prim})",
    Reason.NOT_ZERO_PADDING_SAFE: "{op}: runs on XLA: its scores are not safe on zero-padded lanes",
    Reason.NOT_IN_TRITON: "{op}: runs on XLA: Pallas' Triton lowering has no rule for its {prim} at these shapes",
    Reason.UNSUPPORTED_DTYPE: "{op}: runs on XLA: the Pallas kernels take floating point, not {dtype}",
    Reason.NO_EDGES: "{op}: runs on XLA: no edges, nothing for a kernel to walk",
    Reason.TYPED_MATMUL_KERNEL: "typed matmul: the Triton kernel (pallas_kernels.typed_matmul, {dtype})",
    Reason.TYPED_MATMUL_RAGGED_DOT: "typed matmul: jax.lax.ragged_dot (the kernel takes 16- and 32-bit floats, not "
                                    "{dtype})",
    Reason.TYPED_MATMUL_PER_HEAD: "typed matmul: XLA per-row products (per-head tables; the kernel multiplies "
                                  "2-D rows)",
    Reason.TYPED_MATMUL_XLA_DTYPE: "typed matmul: XLA blocked GEMMs (neither the kernel nor ragged_dot takes "
                                   "{dtype})",
    Reason.CSR_FROM_LAYOUT: "CSR from the GraphLayout passed in",
    Reason.CSR_SORTED_IN_PROGRAM: "CSR sorted inside the program (pass a GraphLayout to sort once on the host)",
    Reason.DATA_DEPENDENT_GATHER: "gather with data-dependent indices (not derived from the graph's index arrays)",
    Reason.DATA_DEPENDENT_SCATTER: "scatter with data-dependent indices or partial rows",
    Reason.PARTIAL_ROW_GATHER: "gather that does not take whole rows of {residency} data",
    Reason.MIXED_RESIDENCIES: "combines {residencies} rows without a broadcast between them",
    Reason.MIXES_ROWS: "`{primitive}` mixes rows of the {residency} axis",
    Reason.DATA_DEPENDENT_PERMUTATION: "`{primitive}` makes a data-dependent permutation of the {residency} rows",
    Reason.UNKNOWN_PRIMITIVE: "unknown primitive `{primitive}` on {residency} data",
    Reason.IMPURE: "`{primitive}` has effects; the values around it are left as traced",
    Reason.REMAT_POLICY: "{policy}: saved {saved}; recomputed {recomputed}",
    Reason.EDGE_MATMUL_SAVED: "{count} edge-level matmul output(s) are saved where the backward reads them "
                              "(remat='edges' recomputes them at one more matmul each{hint})",
    Reason.LEVEL_DENSE: "level {level}: fan-out {fanout} into {groups} groups as a reshape and dense reductions "
                        "(no segment op)",
    Reason.LEVEL_SEGMENT: "level {level}: {members} members into {groups} groups by segment reductions",
    Reason.LEVEL_FUSED: "level {level}: gather→compute→reduce over its {members} members is one fused op",
    Reason.LEVEL_NOT_FUSED: "level {level}: no fused op reduces its {members} members",
    Reason.CACHE_HIT: "plan reused ({hits} hits, {misses} misses)",
    Reason.CACHE_MISS: "plan built ({hits} hits, {misses} misses)",
    Reason.BUCKETED: "padded to the ({nodes}, {edges}) bucket",
    Reason.SEND_SOURCE_ROWS: "cut edges send halo source rows: {source_bytes:.3g} B vs {partial_bytes:.3g} B of "
                             "partial aggregates",
    Reason.SEND_PARTIAL_AGGREGATES: "cut edges send partial aggregates per destination: {partial_bytes:.3g} B vs "
                                    "{source_bytes:.3g} B of halo source rows",
    Reason.PARTIALS_NEED_AGGREGATE: "partial aggregates would cost {partial_bytes:.3g} B vs {source_bytes:.3g} B, "
                                    "but an opaque layer can only send source rows (use distributed.aggregate)",
}


def _frozen(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


@dataclasses.dataclass(frozen=True)
class Decision:
    """A rewrite that was applied (``applied=True``) or declined, by ``by``, for ``code``, with parameters."""

    by: Pass
    code: Reason
    applied: bool = True
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def kind(self) -> str:
        return self.by.value

    def get(self, key: str, default=None):
        return dict(self.params).get(key, default)

    def render(self) -> str:
        return MESSAGES[self.code].format(**dict(self.params))


@dataclasses.dataclass(frozen=True)
class EquationRecord:
    """One analysed equation: its primitive, how it moves data and where its output lives."""

    primitive: str
    movement: str
    out_residency: str
    shape: tuple[int, ...] = ()
    index: str | None = None


@dataclasses.dataclass(frozen=True)
class FallbackRecord:
    """A region left as traced: the primitive that started it and why."""

    code: Reason
    primitive: str
    params: tuple[tuple[str, Any], ...] = ()

    def render(self) -> str:
        return MESSAGES[self.code].format(primitive=self.primitive, **dict(self.params))


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """A fused op, the backend and lowering that run it, and why (``code``)."""

    op: str
    backend: str
    lowering: str
    code: Reason
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default=None):
        return dict(self.params).get(key, default)

    def render(self) -> str:
        params = dict(self.params)
        text = MESSAGES[self.code].format(op=self.op, **params)
        if "backward_code" in params:  # a softmax op's backward: several derived ops on one lowering
            text += "; " + MESSAGES[params["backward_code"]].format(op=self.op, **params)
        return text


@dataclasses.dataclass(frozen=True)
class RematRecord:
    """What the training step saves for the backward pass and what it recomputes."""

    policy: str
    saved: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()
    edge_matmuls: int = 0
    layout_would_compact: bool = False


@dataclasses.dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    size: int = 0
    capacity: int = 0


@dataclasses.dataclass
class Report:
    """What jgnn did to one function on one argument signature (`jgnn.explain`), all as data.

    Attributes:
      backend: the backend the plan was built for.
      sizes: static node/edge counts of the graph arguments.
      equations: one `EquationRecord` per analysed op (primitive, movement, residency of its output, shape).
      decisions: every `Decision` (``by`` a `Pass`, ``code`` a `Reason`, ``applied``, ``params``), rewrites and
        lowering choices alike; ``rewrites`` / ``applied_rewrites`` filter them.
      fallbacks: regions left as traced, one `FallbackRecord` (code, primitive, params) per distinct cause.
      kernels: one `KernelRecord` per fused op (op, backend, lowering, code, params; ``nested`` for a compiled
        layer inside the function).
      remat: what a training step recomputes (`jgnn.remat`).
      cache: the plan cache's hit/miss counts for this function.
    """

    backend: str
    sizes: dict[str, int]
    equations: list[EquationRecord] = dataclasses.field(default_factory=list)
    decisions: list[Decision] = dataclasses.field(default_factory=list)
    fallbacks: list[FallbackRecord] = dataclasses.field(default_factory=list)
    kernels: list[KernelRecord] = dataclasses.field(default_factory=list)
    remat: list[RematRecord] = dataclasses.field(default_factory=list)
    cache: CacheStats = dataclasses.field(default_factory=CacheStats)

    def add(self, by: Pass, code: Reason, *, applied: bool = True, **params) -> None:
        self.decisions.append(Decision(by, code, applied, _frozen(params)))

    def fallback(self, code: Reason, primitive: str, **params) -> None:
        record = FallbackRecord(code, primitive, _frozen(params))
        if record not in self.fallbacks:  # one line per distinct cause, however many ops share it
            self.fallbacks.append(record)

    def kernel(self, op: str, backend: str, lowering: str, code: Reason, **params) -> None:
        self.kernels.append(KernelRecord(op, backend, lowering, code, _frozen(params)))

    @property
    def rewrites(self) -> list[Decision]:
        return [d for d in self.decisions if d.by not in (Pass.LOWERING, Pass.CACHE)]

    @property
    def applied_rewrites(self) -> list[Decision]:
        return [d for d in self.rewrites if d.applied]

    def codes(self, by: Pass | None = None, *, applied: bool | None = None) -> list[Reason]:
        return [d.code for d in self.decisions
                if (by is None or d.by == by) and (applied is None or d.applied == applied)]

    def summary(self) -> str:
        moves = collections.Counter(e.movement for e in self.equations)
        kinds = collections.Counter(d.kind for d in self.applied_rewrites)
        parts = [f"backend={self.backend}", f"N={self.sizes.get('N')}", f"E={self.sizes.get('E')}",
                 "movements: " + ", ".join(f"{k}×{v}" for k, v in sorted(moves.items())),
                 "rewrites: " + (", ".join(f"{k}×{v}" for k, v in sorted(kinds.items())) or "none"),
                 f"kernels: {len(self.kernels)}", f"fallbacks: {len(self.fallbacks)}"]
        return "; ".join(parts)

    def __str__(self) -> str:
        lines = [f"jgnn explain — {self.summary()}", "", "equations (primitive, movement, out residency, shape):"]
        width = max((len(e.primitive) for e in self.equations), default=8)
        for i, e in enumerate(self.equations):
            idx = f"  [{e.index} ids]" if e.index else ""
            lines.append(f"  {i:3d}  {e.primitive:<{width}}  {e.movement:<15} {e.out_residency:<9} "
                         f"{list(e.shape)}{idx}")
        remat = [f"{r.policy}: saved {', '.join(r.saved) or '-'}; recomputed {', '.join(r.recomputed) or '-'}"
                 + (f"; {r.edge_matmuls} edge-level matmul output(s) saved (remat='edges' recomputes them"
                    + ("; a GraphLayout would compact the typed ones" if r.layout_would_compact else "") + ")"
                    if r.edge_matmuls else "") for r in self.remat]
        sections = [("rewrites", [f"{'' if d.applied else 'skipped '}{d.kind}: {d.render()}"
                                  for d in self.rewrites]),
                    ("kernels", [f"{k.op} -> {k.backend}/{k.lowering}: {k.render()}" for k in self.kernels]),
                    ("recomputation", remat),
                    ("fallbacks", [f"{f.primitive}: {f.render()}" for f in self.fallbacks]),
                    ("plan cache", [f"{self.cache.hits} hits, {self.cache.misses} misses, "
                                    f"{self.cache.size}/{self.cache.capacity} plans"])]
        for title, rows in sections:
            lines += ["", f"{title}:"] + ([f"  - {r}" for r in rows] if rows else ["  (none)"])
        return "\n".join(lines)
