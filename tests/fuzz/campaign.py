"""A long fuzzing campaign: ``python -m tests.fuzz.campaign --cases 20000`` (``make fuzz N=20000``).

Unlike the CI test, the campaign does not stop at the first failure. It generates batches with hypothesis in
chunks (one seed per chunk), checks every case and counts failures by signature (`checker.Failure.signature`).
Then, for the first failure of each signature, it replays that chunk up to the failing batch and lets
hypothesis shrink it while the failure keeps its signature and class (`classify`). It writes, under
``--out``: ``summary.md`` and ``summary.json`` (counts by class and signature, cases, time, cases per minute)
and one standalone reproducer per signature.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import sys
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.internal.conjecture import engine

from tests.fuzz import checker, classify, reproducer, strategies

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]


@dataclasses.dataclass
class Found:
    """The first failure of a signature, where it came from, and how many cases had that signature."""

    failure: checker.Failure
    chunk_seed: int
    batch: strategies.Batch
    count: int = 0
    shrunk: checker.Failure | None = None


def run_chunk(chunk_seed: int, batches: int, on_batch) -> None:
    @settings(max_examples=batches, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=_QUIET)
    @hypothesis_seed(chunk_seed)
    @given(strategies.batches())
    def chunk(batch):
        on_batch(batch)

    chunk()


class _Shrunk(Exception):
    pass


def _same_bug(f: checker.Failure, target: checker.Failure) -> bool:
    return f.signature()[:4] == target.signature()[:4] and classify.classify(f) == classify.classify(target)


def shrink(found: Found, batches: int, seconds: float) -> checker.Failure:
    """Replay the chunk up to the failing batch, then let hypothesis shrink it, keeping the bug."""
    state = {"seen": False, "best": found.failure}

    @settings(max_examples=batches, deadline=None, database=None, phases=[Phase.generate, Phase.shrink],
              suppress_health_check=_QUIET, report_multiple_bugs=False)
    @hypothesis_seed(found.chunk_seed)
    @given(strategies.batches())
    def replay(batch):
        if not state["seen"]:
            if batch != found.batch:
                return  # before the failing batch: nothing to check
            state["seen"] = True
        result = checker.check_batch(batch, target=checker.Target.of(found.failure))
        same = [f for f in result.failures if _same_bug(f, found.failure)]
        if same:
            state["best"] = same[0]  # hypothesis replays the minimal example last
            raise _Shrunk()

    old, engine.MAX_SHRINKING_SECONDS = engine.MAX_SHRINKING_SECONDS, seconds
    try:
        replay()
    except _Shrunk:
        pass
    finally:
        engine.MAX_SHRINKING_SECONDS = old
    return state["best"]


def to_shrink(found: dict, which: str) -> list[tuple[tuple, Found]]:
    """Every signature, or the most frequent signature of each class (all unclassified ones)."""
    ranked = sorted(found.items(), key=lambda kv: -kv[1].count)
    if which == "all":
        return ranked
    seen, picked = set(), []
    for sig, fd in ranked:
        letter = classify.classify(fd.failure)[0]
        if letter == "?" or letter not in seen:
            picked.append((sig, fd))
            seen.add(letter)
    return picked


def campaign(cases: int, seed: int, chunk: int, log=print, on_chunk=None) -> tuple[dict, int, int, float]:
    """Check batches until ``cases`` cases ran; ``on_chunk(found, cases, batches, seconds)`` after each chunk
    (the report so far: a campaign cut short keeps what it found)."""
    found: dict[tuple, Found] = {}
    totals = {"cases": 0, "batches": 0}
    current = {"seed": seed}
    start = time.perf_counter()

    def on_batch(batch):
        if totals["cases"] >= cases:
            return
        result = checker.check_batch(batch)
        totals["cases"] += result.cases
        totals["batches"] += 1
        per_case = collections.defaultdict(set)
        for f in result.failures:
            # The class letter keeps apart different bugs that share a signature (value mismatches have no site).
            sig = f.signature() + (classify.classify(f)[0],)
            per_case[sig].add(f.case)
            found.setdefault(sig, Found(f, current["seed"], batch))
        for sig, failing in per_case.items():
            found[sig].count += len(failing)
        if totals["batches"] % 10 == 0:
            log(f"{totals['cases']} cases, {totals['batches']} batches, {len(found)} signatures, "
                f"{time.perf_counter() - start:.0f} s")

    while totals["cases"] < cases:
        run_chunk(current["seed"], chunk, on_batch)
        current["seed"] += 1
        if on_chunk is not None:
            on_chunk(found, totals["cases"], totals["batches"], time.perf_counter() - start)
    return found, totals["cases"], totals["batches"], time.perf_counter() - start


def write_report(out: pathlib.Path, found: dict, cases: int, batches: int, seconds: float, seed: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (sig, fd) in enumerate(sorted(found.items(), key=lambda kv: -kv[1].count)):
        shown = fd.shrunk or fd.failure
        letter, what = classify.classify(shown)
        name = f"repro_{i:02d}_{letter if letter != '?' else 'x'}_{sig[0]}_{sig[1]}_{sig[2]}.py"
        (out / name).write_text(reproducer.reproducer(shown))
        rows.append({"class": letter, "description": what, "kind": sig[0], "part": sig[1], "backend": sig[2],
                     "where": sig[3], "dtype": sig[4], "failing_cases": fd.count, "reproducer": name,
                     "detail": shown.detail, "shrunk": fd.shrunk is not None,
                     "facts": {k: sorted(v) if isinstance(v, frozenset) else v
                               for k, v in dataclasses.asdict(classify.Facts.of(shown)).items()},
                     "graph": repr(shown.case.graph), "values": repr(shown.case.values)})
    by_class = collections.Counter()
    for r in rows:
        by_class[r["class"]] += r["failing_cases"]
    summary = {"seed": seed, "cases": cases, "batches": batches, "seconds": round(seconds, 1),
               "cases_per_minute": round(60 * cases / max(seconds, 1e-9), 1),
               "failing_cases_by_class": dict(sorted(by_class.items())), "signatures": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# jgnn fuzz campaign: seed {seed}", "",
             f"{cases} cases in {batches} batches, {seconds:.0f} s ({summary['cases_per_minute']} cases/min).", "",
             "| class | failing cases |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(by_class.items())]
    lines += ["", "| class | kind | part | backend | where | dtype | cases | reproducer |", "|" + "---|" * 8]
    lines += [f"| {r['class']} | {r['kind']} | {r['part']} | {r['backend']} | {r['where']} | {r['dtype']} | "
              f"{r['failing_cases']} | {r['reproducer']} |" for r in rows]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=None, help="first chunk seed (default: from the clock)")
    ap.add_argument("--chunk", type=int, default=100, help="batches per hypothesis run")
    ap.add_argument("--shrink-seconds", type=float, default=300.0, help="per signature; 0 to skip shrinking")
    ap.add_argument("--shrink", choices=("class", "all"), default="class",
                    help="shrink the most frequent signature of each class, or every signature")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/fuzz"))
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 2**31
    print(f"campaign: {args.cases} cases, seed {seed}, writing to {args.out}", flush=True)
    found, cases, batches, seconds = campaign(
        args.cases, seed, args.chunk, log=lambda s: print(s, flush=True),
        on_chunk=lambda *so_far: write_report(args.out, *so_far, seed))
    write_report(args.out, found, cases, batches, seconds, seed)  # unshrunk, in case shrinking is cut short
    if args.shrink_seconds > 0:
        for sig, fd in to_shrink(found, args.shrink):
            t = time.perf_counter()
            fd.shrunk = shrink(fd, args.chunk, args.shrink_seconds)
            print(f"shrunk {sig[:4]} in {time.perf_counter() - t:.0f} s: class {classify.classify(fd.shrunk)[0]}",
                  flush=True)
    summary = write_report(args.out, found, cases, batches, seconds, seed)
    print(json.dumps({k: v for k, v in summary.items() if k != "signatures"}, indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
