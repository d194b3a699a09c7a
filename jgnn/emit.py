"""How the optimised program emits an op, where binding its primitive gives XLA a slower program for the same
value. Rules are keyed by primitive; every other op binds its primitive (`jgnn.ir.Op.run`).

* ``concatenate`` of 1-D integer arrays (the ids a layer extends with ``arange(N)`` when it appends a self-loop
  per node, `jgnn.layout.append_self_loops`): written as ``dynamic_update_slice``s into one buffer. On XLA:CPU
  (jax 0.10.2, 2 cores) GCN on Amazon Computers (492k edges + 13.8k loops) ran its forward in 76.9 ms median with
  the concatenation and 66.0 ms with the update slices (hand-written: 57.9), its training step in 100.1 and
  97.4 ms (87.4); GAT on Pubmed's step 97.4 and 93.2 ms (83.5) (`python -m benchmarks.compare.loop_ids`,
  `benchmarks/results/cpu-loop-ids-2026-11-27.md`). The HLO is the same but for those ops; why XLA's
  concatenation costs more here was not found.
  The analysis and every pass still see the ``concatenate`` (it tells them the ids append ``arange(N)``).

While jgnn traces a function to analyse it (`tracing_for_analysis`), an inner compiled layer runs the program
without these rules (`jgnn.compiler` keeps both): the outer compile reads the ``concatenate`` and emits it by
these rules itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import jax.numpy as jnp
import numpy as np
from jax import lax

from jgnn import ir


def _concatenate(op: ir.Op, xs: list) -> list:
    if op.params["dimension"] != 0 or np.ndim(xs[0]) != 1 or not np.issubdtype(op.outputs[0].dtype, np.integer):
        return op.run(*xs)
    out = jnp.zeros(op.outputs[0].shape, op.outputs[0].dtype)
    start = 0
    for x in xs:
        out = lax.dynamic_update_slice(out, jnp.asarray(x, out.dtype), (start,))
        start += np.shape(x)[0]
    return [out]


RULES: dict[object, Callable[[ir.Op, list], list]] = {lax.concatenate_p: _concatenate}


_state = threading.local()


@contextlib.contextmanager
def tracing_for_analysis() -> Iterator[None]:
    """Within: every op binds its own primitive (see the module docstring)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def analysing() -> bool:
    """Whether jgnn is tracing a function to analyse it (a compiled layer inside then runs its unemitted program)."""
    return getattr(_state, "depth", 0) > 0


def run(op: ir.Op, xs: list) -> list:
    """``op`` on ``xs`` as the compiled program emits it (`ir.evaluate`'s ``run``)."""
    rule = RULES.get(op.prim)
    return op.run(*xs) if rule is None else rule(op, xs)
