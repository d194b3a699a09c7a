"""Recompute, don't store: which values a training step saves for the backward pass.

The compiled program runs under ``jax.checkpoint``. Every floating-point value an op makes is tagged with
``jax.ad_checkpoint.checkpoint_name`` by where it lives (`jgnn.roles.Residency`) and by what it costs to make
again:

* ``jgnn_node``/``jgnn_graph``/``jgnn_shared``/``jgnn_type``: node-, graph-, weight- and type-level values;
* ``jgnn_pair``: a typed matmul made once per unique (source, edge type) pair (Hector's compact
  materialisation, with a `jgnn.layout.GraphLayout`): fewer rows than edges, O(d) work per element;
* ``jgnn_edge_matmul``: an edge-level matmul the optimizer could neither move to the nodes nor compact to
  pairs: O(d) work per element to recompute;
* ``jgnn_edge``: every other edge-level value (gathers, elementwise maps): O(1) work per element.

Inside the fused edge ops (`jgnn.ops.edge_op`) nothing edge-sized is kept at all: their derivatives are edge ops
that recompute each edge's values from node-level operands. What they keep is named too: per-row statistics
(``jgnn_stats``: softmax max and normaliser, counts) and, for max/min, the mask of edges attaining the extremum
(``jgnn_edge_mask``, one byte per element: recomputed values are not bit-identical across XLA fusions).

UGCG/dgNN's rule recomputes a value when remaking it costs O(1) per element and stores per-node reductions.
So the policies are:

* ``"auto"`` (default): save everything but ``jgnn_edge``;
* ``"edges"``: save node-level values (and the statistics and masks) only; edge and pair matmuls are recomputed;
* ``"none"``: no checkpoint, everything the backward pass wants is stored (plain JAX behaviour);
* a ``jax.checkpoint`` policy callable, used as given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from jgnn import ir
from jgnn.analysis import Analysis
from jgnn.ops.edge_op import EDGE_MASK_NAME, STATS_NAME
from jgnn.ops.typed_matmul import typed_matmul_p
from jgnn.report import RematRecord, Report
from jgnn.roles import Residency

NODE_LEVEL = ("jgnn_node", "jgnn_graph", "jgnn_shared", "jgnn_type", STATS_NAME, EDGE_MASK_NAME)
POLICIES = {
    "auto": NODE_LEVEL + ("jgnn_pair", "jgnn_edge_matmul"),
    "edges": NODE_LEVEL,
}
_MATMULS = frozenset({lax.dot_general_p, typed_matmul_p})
_NAME_OF = {Residency.NODE: "jgnn_node", Residency.GRAPH: "jgnn_graph", Residency.SHARED: "jgnn_shared",
            Residency.NODE_TYPE: "jgnn_type", Residency.EDGE_TYPE: "jgnn_type", Residency.PAIR: "jgnn_pair"}


def value_names(program: ir.Program, analysis: Analysis) -> dict[int, str]:
    """The checkpoint name of every floating-point value an op makes."""
    names: dict[int, str] = {}
    for op in program.ops:
        for v in op.outputs:
            if not jnp.issubdtype(v.dtype, jnp.floating):
                continue
            info = analysis.info.get(v.id)
            if info is None or info.residency == Residency.UNKNOWN:
                continue
            if info.residency == Residency.EDGE:
                names[v.id] = "jgnn_edge_matmul" if op.prim in _MATMULS else "jgnn_edge"
            else:
                names[v.id] = _NAME_OF[info.residency]
    return names


def resolve(remat: Any) -> tuple[str, Callable | None]:
    """(description, jax.checkpoint policy or None for no checkpoint)."""
    if remat == "none":
        return "none", None
    if callable(remat):
        return getattr(remat, "__name__", "custom policy"), remat
    if remat not in POLICIES:
        raise ValueError(f"remat must be 'auto', 'none', 'edges' or a jax.checkpoint policy, got {remat!r}")
    return remat, jax.checkpoint_policies.save_only_these_names(*POLICIES[remat])


def record(remat: Any, names: dict[int, str], report: Report) -> RematRecord:
    """What ``remat`` saves and recomputes, as data."""
    from jgnn.report import Pass, Reason

    label, policy = resolve(remat)
    counts: dict[str, int] = {}
    for n in names.values():
        counts[n] = counts.get(n, 0) + 1
    if policy is None:
        return RematRecord("none", saved=("everything the backward needs",))
    saved = POLICIES.get(remat, ())
    kept = tuple(f"{n[5:]}×{c}" for n, c in sorted(counts.items()) if n in saved) if saved else ("per policy",)
    redo = tuple(f"{n[5:]}×{c}" for n, c in sorted(counts.items()) if saved and n not in saved)
    edge_matmuls = counts.get("jgnn_edge_matmul", 0) if "jgnn_edge_matmul" in saved else 0
    layout_would_compact = any(d.by == Pass.COMPACT_MATERIALIZE and d.code == Reason.NEEDS_LAYOUT
                               for d in report.decisions)
    return RematRecord(label, saved=kept, recomputed=redo, edge_matmuls=edge_matmuls,
                       layout_would_compact=layout_would_compact)


def evaluate(program: ir.Program, args, names: dict[int, str], policy: Callable | None, run=None):
    """`ir.evaluate` with every named value tagged, under ``jax.checkpoint(policy)`` when one is given; ``run`` as
    `ir.evaluate`'s (`jgnn.emit.run`)."""
    if policy is None:
        return ir.evaluate(program, args, run=run)

    def tagged(*xs):
        return ir.evaluate(program, xs, tag=lambda v, x: checkpoint_name(x, names[v.id]) if v.id in names else x,
                           run=run)

    return jax.checkpoint(tagged, policy=policy)(*args)
