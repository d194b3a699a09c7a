"""jraph's own test programs, compiled unmodified: none falls back, outputs equal plain jit, and every
gather→segment chain is fused (where the messages are also returned, they are made by one edge op and reduced by
another)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from checks import tree_close
from jraph_programs import GATHER_SEGMENT, programs

import jgnn
from jgnn.report import Pass, Reason

PROGRAMS = programs()


@pytest.mark.parametrize("name, fn, graph", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_jraph_program_compiles_without_fallback(name, fn, graph):
    compiled = jgnn.compile(fn, backend="xla")
    tree_close(jax.jit(compiled)(graph), jax.jit(fn)(graph), what=name)
    report = jgnn.explain(compiled, graph)
    assert not report.fallbacks, [f.render() for f in report.fallbacks]
    if name in GATHER_SEGMENT:  # fused, messages and all; or, where they are returned too, made once and reduced
        fused = {Reason.FUSED_REDUCE, Reason.FUSED_ATTENTION, Reason.FUSED_COMPUTE}
        assert fused & set(report.codes(Pass.FUSE, applied=True)), name
        assert Reason.MESSAGES_STORED_ANYWAY not in report.codes(Pass.FUSE, applied=False), name


def test_programs_cover_models_and_utils():
    names = [p[0] for p in PROGRAMS]
    assert len(names) == len(set(names)) >= 90
    assert sum(n in GATHER_SEGMENT for n in names) == len(GATHER_SEGMENT)
    assert np.all([callable(p[1]) for p in PROGRAMS])


@pytest.mark.parametrize("name, fn, graph", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_every_raised_reduction_is_fused_or_says_why(name, fn, graph):
    """A program whose reductions were raised to graph ops records a fusion decision for them (fused, or skipped
    with a reason: messages stored anyway, a readout by graph ids, no edge work), unless they were all dead
    (jraph's identity-update GraphNetworks)."""
    report = jgnn.explain(jgnn.compile(fn, backend="xla"), graph)
    if Reason.RAISED_SEGMENT in report.codes(Pass.CANONICALIZE, applied=True):
        assert report.codes(Pass.FUSE) or Reason.REMOVED_DEAD in report.codes(Pass.DCE, applied=True), name
