"""Failure classes: which of issue 12's bug classes (a)–(q) a shrunk failure belongs to.

A failure's *signature* (`checker.Failure.signature`) is what the campaign counts: kind, part, backend, crash
site and dtype. After shrinking, the features that remain in the case (program tags, graph flags and shape,
value patterns, dtype) name the bug; `RULES` maps them to the issue's letters. The first matching rule wins,
so specific rules come first. A failure that no rule matches is reported as ``"?"``: a new bug, or one the
table does not know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tests.fuzz.checker import Failure


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a shrunk failure still contains."""

    kind: str
    part: str
    backend: str
    where: str
    detail: str
    dtype: str
    family: str
    features: frozenset
    flags: frozenset
    shape: str
    patterns: frozenset
    magnitude: str

    @classmethod
    def of(cls, f: Failure) -> Facts:
        c = f.case
        return cls(f.kind, f.mode, f.backend, f.where, f.detail, c.dtype, c.program.family, c.program.features,
                   c.graph.flags, c.graph.shape, frozenset(p.kind for p in c.values.patterns), c.values.magnitude)

    def has(self, *features: str) -> bool:
        return any(x in self.features for x in features)


_SOFTMAX = ("rho_softmax", "rho_softmax_scaled", "rho_softmax_of_softmax", "rho_softmax_plus_max",
            "reduce_segment_softmax", "jraph_gat", "gn_attention")
_CRASH = ("crash", "rejects")
_WRONG = ("value", "nonfinite")
_PALLAS = "pallas_interpret"
_ONES_LIKE = ("two_graphs", "reduce_segment_mean", "reduce_degree_mean", "reduce_segment_normalize",
              "reduce_segment_min_or_constant", "rho_mean_by_degree", "rho_mean")  # segment_sum(ones_like(.))

# (letter, what it is, predicate). Order matters: the first match wins, so causes named by a program feature
# come before symptoms (a jvp crash, a value mismatch) that many causes share.
RULES: tuple[tuple[str, str, Callable[[Facts], bool]], ...] = (
    ("p", "the degree as jgnn.sum(jnp.ones_like(mb[:, :1])) is rejected, the reference included",
     lambda x: x.has("rho_mean_by_degree") and "mailbox" in x.where),
    ("o", "explain crashes on a function that takes a PRNG key argument",
     lambda x: x.part == "explain" and x.kind in _CRASH and x.has("key_arg_typed", "key_arg_raw")),
    ("i", "a closed-over key, a key argument, uint32 key data in edges, or softmax of a softmax crashes",
     lambda x: x.kind in _CRASH and ((x.has("closed_key", "edge_key", "arg_key") and "remat" in x.where)
                                     or (x.has("rho_softmax_of_softmax") and "residency" in x.where))),
    ("q", "a data-dependent scatter (receivers * R + type) or a gather by an index argument falls back",
     lambda x: x.kind == "fallback" and x.has("reduce_relation_mean", "gather_idx_arg")),
    ("5", "an op on graph data falls back (issue 12, item 5: jnp.stack, split, dynamic_slice, ...)",
     lambda x: x.kind == "fallback"),
    ("k", "shard_map over a layer on the Pallas path needs check_vma=False",
     lambda x: x.kind in _CRASH and x.part == "shard_map" and x.backend == _PALLAS),
    ("j", "no forward-mode AD through fused layers (JAX refuses jvp of a custom_vjp)",
     lambda x: x.kind in _CRASH and x.part == "jvp" and "/" not in x.where),
    ("h", "float64 / complex64 crash or lose precision",
     lambda x: x.dtype in ("float64", "complex64") and x.kind in _CRASH + ("value",)),
    ("d", "linear_split / broadcast_reorder crash on (x[s] + c) @ W or x[s] @ W * arange(E)",
     lambda x: x.kind in _CRASH and (x.has("edge_plus_one_linear", "edge_arange_scale")
                                     or "linear_split" in x.where or "broadcast_reorder" in x.where)),
    ("a", "integer index arithmetic fused into float kernels (E <= N) crashes Pallas",
     lambda x: x.kind in _CRASH and x.backend == _PALLAS and x.has("typed_weight", "int_arith", "edge_typed")),
    ("o", "bf16 constants in a fused region crash Pallas",
     lambda x: x.kind in _CRASH and x.dtype == "bfloat16" and x.backend == _PALLAS),
    ("e", "Pallas crashes on segment_sum(ones_like(e)) or on two graphs of different sizes",
     lambda x: x.kind in _CRASH and x.backend == _PALLAS and x.has(*_ONES_LIKE)),
    ("j", "no forward-mode AD through fused layers",
     lambda x: x.kind in _CRASH and x.part == "jvp"),
    ("m", "a layout of the first graph applied to a second graph of the same size",
     lambda x: x.kind in _WRONG and x.has("two_graphs") and x.has("layout")),
    ("n", "int32 messages summed in float32 / wrong Pallas int32 max",
     lambda x: x.kind == "value" and x.detail.startswith("integer")),
    ("f", "wrong answers with a negative (or out-of-range) id under jit",
     lambda x: x.kind in _WRONG and bool({"negative", "out_of_range"} & x.flags)),
    ("b", "Pallas attention returns 0 when a row's first chunk is all -inf",
     # (b) is a finite answer replaced by 0; differing NaN positions (a row that is all -inf) belong to (g).
     lambda x: x.kind == "value" and x.backend == _PALLAS and x.has(*_SOFTMAX) and "neginf_prefix" in x.patterns),
    ("c", "fused attention gradients wrong when all in-edges are masked with -1e9",
     lambda x: x.kind in _WRONG and x.part == "grad" and x.has(*_SOFTMAX)
     and ("mask_rows_1e9" in x.patterns or x.has("mask_1e9"))),
    ("g", "fused attention and NaN / overflow / +inf logits",
     lambda x: x.kind in _WRONG and x.has(*_SOFTMAX)
     and (bool(x.patterns & {"nan", "posinf", "neginf", "mask_rows_inf"}) or x.magnitude == "huge")),
    ("h", "bf16/f16 accumulation", lambda x: x.kind == "value" and x.dtype in ("bfloat16", "float16")),
)


def classify(f: Failure) -> tuple[str, str]:
    """(letter, description) of the first matching rule, or ("?", "unclassified")."""
    facts = Facts.of(f)
    for letter, what, pred in RULES:
        if pred(facts):
            return letter, what
    return "?", "unclassified"
