"""Differential fuzzing of jgnn (issue 13): random programs × graphs × values, every backend against the reference.

Each hypothesis example is a `Batch`: one random program and dtype evaluated on several graphs and value sets
of one shape (so its compiled functions are reused). The run is derandomized (the same cases every time, so
it cannot flake); ``make fuzz`` runs a long randomized campaign instead. On a failure hypothesis shrinks the
batch and the report ends with a standalone reproducer script.
"""

from __future__ import annotations

import collections
import functools
import os
import time

import pytest
from hypothesis import HealthCheck, given, note, settings

from tests.fuzz import checker, classify, reproducer, strategies

# CI runs it as its own step (`make test-slow`): about 5-7 minutes on 2 cores.
pytestmark = pytest.mark.slow

# Enough batches for >= MIN_CASES cases (a batch holds 20 cases, a hub batch 4; 1 batch in 20 is a hub).
BATCHES = int(os.environ.get("JGNN_FUZZ_BATCHES", "60"))
MIN_CASES = int(os.environ.get("JGNN_FUZZ_MIN_CASES", "1000"))
# JGNN_FUZZ_KEEP_GOING=1: check every case of the same derandomized run without stopping or shrinking, then
# print the failures by class and the time taken (and still fail if there were any).
KEEP_GOING = os.environ.get("JGNN_FUZZ_KEEP_GOING") == "1"
# With KEEP_GOING, JGNN_FUZZ_DUMP=DIR also writes the (unshrunk) reproducer of each signature's first failure.
DUMP = os.environ.get("JGNN_FUZZ_DUMP")


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
    seen: collections.Counter = collections.Counter()  # KEEP_GOING: failing cases by (class, signature)
    start = time.perf_counter()

    @settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(batch=strategies.batches())
    def fuzz(batch):
        result = checker.check_batch(batch, stop_at_first=not KEEP_GOING, target=target[0] if target else None)
        counted["cases"] += result.cases
        counted["batches"] += 1
        if KEEP_GOING:
            first = {}
            for f in result.failures:
                first.setdefault((classify.classify(f)[0],) + f.signature(), f)
            for sig, f in first.items():
                if DUMP and sig not in seen:
                    os.makedirs(DUMP, exist_ok=True)
                    name = "_".join(str(x) for x in sig if x).replace("/", ".").replace(":", ".")
                    with open(os.path.join(DUMP, f"{counted['batches']:03d}_{name}.py"), "w") as fh:
                        fh.write(reproducer.reproducer(f))
                seen[sig] += 1
        elif result.failures:
            target[:] = [checker.Target.of(result.failures[0])]
            raise_failure(result.failures[0])

    fuzz()
    if KEEP_GOING:
        print(f"\n{counted['cases']} cases in {counted['batches']} batches, {time.perf_counter() - start:.0f} s")
        for sig, n in seen.most_common():
            print(f"{n:5d} batches  {sig}")
        assert not seen, f"{sum(seen.values())} failures in {len(seen)} signatures"
    assert counted["cases"] >= MIN_CASES, counted
