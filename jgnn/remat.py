"""Recompute, don't store: which values a training step saves for the backward pass.

The compiled program runs under ``jax.checkpoint``. Every value an op makes is tagged with
``jax.ad_checkpoint.checkpoint_name`` by where it lives (`residency`) and by what it costs to make again:

* ``jgnn_node``/``jgnn_graph``/``jgnn_shared``/``jgnn_type``: node-, graph-, weight- and type-level values;
* ``jgnn_pair``: a typed matmul made once per unique (source, edge type) pair (Hector's compact
  materialisation, with a `jgnn.layout.GraphLayout`): fewer rows than edges, O(d) work per element;
* ``jgnn_edge_matmul``: an edge-level ``dot_general`` (or typed matmul) the optimizer could neither move to
  the nodes nor compact to pairs: O(d) work per element to recompute;
* ``jgnn_edge``: every other edge-level value (gathers, elementwise maps): O(1) work per element.

UGCG/dgNN's rule recomputes a value when remaking it costs O(1) per element and stores per-node reductions.
So the policies are:

* ``"auto"`` (default): save everything but ``jgnn_edge``. An edge matmul is saved only when nothing smaller
  can stand in for it; the report names each one and what would remove it;
* ``"edges"``: save node-level values only; edge and pair matmuls are recomputed;
* ``"none"``: no checkpoint, everything the backward pass wants is stored (plain JAX behaviour);
* a ``jax.checkpoint`` policy callable, used as given.

The fused ops (`jgnn.fused`) keep only node-level residuals: their inputs, and per-node statistics (softmax
log-sum-exp, argmax ids) named ``pallas_kernels.residuals.STATS_NAME``, which every policy here saves;
unsaved, the backward would rerun the whole fused forward to remake them. Edge operands their backward does
not read are not kept at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jgnn import ir, residency
from jgnn.report import RematRecord
from pallas_kernels.residuals import STATS_NAME

NODE_LEVEL = ("jgnn_node", "jgnn_graph", "jgnn_shared", "jgnn_type", STATS_NAME)
POLICIES = {
    "auto": NODE_LEVEL + ("jgnn_pair", "jgnn_edge_matmul"),
    "edges": NODE_LEVEL,
}
_MATMULS = frozenset({"dot_general", "typed_matmul"})
_NAME_OF = {residency.NODE: "jgnn_node", residency.GRAPH: "jgnn_graph", residency.SHARED: "jgnn_shared",
            residency.NODE_TYPE: "jgnn_type", residency.EDGE_TYPE: "jgnn_type", residency.PAIR: "jgnn_pair"}


def value_names(program: ir.Program, analysis: residency.Analysis) -> dict[int, str]:
    """The checkpoint name of every floating-point value an op makes."""
    names: dict[int, str] = {}
    for op in program.ops:
        for v in op.outputs:
            if not np.issubdtype(np.dtype(v.dtype), np.floating):
                continue
            info = analysis.info.get(v.id)
            if info is None or info.residency == residency.UNKNOWN:
                continue
            if info.residency == residency.EDGE:
                names[v.id] = "jgnn_edge_matmul" if op.name in _MATMULS else "jgnn_edge"
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


def record(remat: Any, names: dict[int, str], *, layout_would_compact: bool = False) -> RematRecord:
    """What ``remat`` saves and recomputes; ``layout_would_compact``: a typed matmul was left per edge only
    because no `jgnn.layout.GraphLayout` was passed."""
    label, policy = resolve(remat)
    counts: dict[str, int] = {}
    for n in names.values():
        counts[n] = counts.get(n, 0) + 1
    if policy is None:
        return RematRecord("none", saved=("everything the backward needs",), detail="no recomputation")
    saved = POLICIES.get(remat, ())
    kept = tuple(f"{n[5:]}×{c}" for n, c in sorted(counts.items()) if n in saved) if saved else ("per policy",)
    redo = tuple(f"{n[5:]}×{c}" for n, c in sorted(counts.items()) if saved and n not in saved)
    detail = ("edge-level values that cost O(1) per element to remake are recomputed under grad (UGCG's rule); "
              "fused ops keep node-level residuals only")
    if "jgnn_edge_matmul" in saved and counts.get("jgnn_edge_matmul"):
        detail += (f"; {counts['jgnn_edge_matmul']} edge-level matmul output(s) are saved where the backward "
                   "reads them, one edge-sized array each: "
                   + ("a GraphLayout would make the typed ones per (source, edge type) pair (see "
                      "compact_materialize), and " if layout_would_compact else "")
                   + "remat='edges' recomputes them at one more matmul each")
    return RematRecord(label, saved=kept, recomputed=redo, detail=detail)


def evaluate(program: ir.Program, args, names: dict[int, str], policy: Callable | None):
    """`ir.evaluate` with every named value tagged, under ``jax.checkpoint(policy)`` when one is given."""
    if policy is None:
        return ir.evaluate(program, args)

    def tagged(*xs):
        return ir.evaluate(program, xs, tag=lambda v, x: checkpoint_name(x, names[v.id]) if v.id in names else x)

    return jax.checkpoint(tagged, policy=policy)(*args)
