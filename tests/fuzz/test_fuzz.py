"""Differential fuzzing of jgnn (issue 13): random programs × graphs × values, every backend against the reference.

Each hypothesis example is a `Batch`: one random program and dtype evaluated on several graphs and value sets
of one shape (so its compiled functions are reused). The run is derandomized (the same cases every time, so
it cannot flake); ``make fuzz`` runs a long randomized campaign instead. On a failure hypothesis shrinks the
batch and the report ends with a standalone reproducer script.
"""

from __future__ import annotations

import functools
import os

from hypothesis import HealthCheck, given, note, settings

from tests.fuzz import checker, reproducer, strategies

# Enough batches for >= MIN_CASES cases (most batches hold 12; a hub batch holds 3).
BATCHES = int(os.environ.get("JGNN_FUZZ_BATCHES", "90"))
MIN_CASES = int(os.environ.get("JGNN_FUZZ_MIN_CASES", "1000"))


@functools.cache
def failure_type(kind: str, part: str, backend: str) -> type[AssertionError]:
    """One exception class per failure signature, so hypothesis shrinks each bug on its own."""
    return type(f"Fuzz_{kind}_{part}_{backend}", (AssertionError,), {})


def raise_failure(f: checker.Failure) -> None:
    note(reproducer.reproducer(f))
    raise failure_type(f.kind, f.mode, f.backend)(
        f"{f.kind} in {f.mode} on {f.backend}, {f.case.program.family} program, dtype {f.case.dtype}, "
        f"graph {f.case.graph}: {f.where} {f.detail} ({checker.KINDS[f.kind]})")


def test_backends_match_reference():
    """At least MIN_CASES cases; the first failure (shrunk) fails the test with its reproducer."""
    counted = {"cases": 0, "batches": 0}
    target: list[checker.Target] = []  # the first failure: shrinking keeps to it and checks only what it needs

    @settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(batch=strategies.batches())
    def fuzz(batch):
        result = checker.check_batch(batch, stop_at_first=True, target=target[0] if target else None)
        counted["cases"] += result.cases
        counted["batches"] += 1
        if result.failures:
            target[:] = [checker.Target.of(result.failures[0])]
            raise_failure(result.failures[0])

    fuzz()
    assert counted["cases"] >= MIN_CASES, counted
