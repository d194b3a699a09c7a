"""A long fuzzing campaign: ``python -m tests.fuzz.campaign --cases 20000`` (``make fuzz N=20000``).

Unlike the CI test, the campaign does not stop at the first failure. It generates batches with hypothesis in
chunks (one seed per chunk), checks every case and counts failures by signature (`checker.Failure.signature`).
Then, for the first failure of each signature, it replays that chunk up to the failing batch and lets
hypothesis shrink it while the failure keeps its signature and class (`classify`). It writes, under
``--out``: ``summary.md`` and ``summary.json`` (counts by class and signature, cases, time, cases per minute)
and one standalone reproducer per signature.

Each chunk runs in a child process (`run_chunk_isolated`), ``--jobs`` of them at a time: a crash of the process
itself (a segmentation fault inside jaxlib, an abort) is recorded as a failure of kind ``crash``, part
``process``, on the batch that was running, and the chunk goes on from the next batch. In one process, such a
fault ended the campaign and everything it had not yet written (FINDINGS-7f4d3d5.md).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import importlib
import json
import multiprocessing
import pathlib
import pickle
import signal
import sys
import tempfile
import threading
import time

import jax
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
    """The chunk's batches, from its seed alone (``derandomize=False`` whatever profile is loaded; checked: the
    test suite's derandomizing profile does not change what a seeded chunk draws)."""
    @settings(max_examples=batches, deadline=None, database=None, derandomize=False, phases=[Phase.generate],
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

    @settings(max_examples=batches, deadline=None, database=None, derandomize=False,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=_QUIET, report_multiple_bugs=False)
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
    """Every signature, or the most frequent signature of each class (all unclassified ones). Process crashes
    are not shrunk: shrinking replays batches in this process, which the crash would end."""
    ranked = sorted(((sig, fd) for sig, fd in found.items() if fd.failure.mode != "process"),
                    key=lambda kv: -kv[1].count)
    if which == "all":
        return ranked
    seen, picked = set(), []
    for sig, fd in ranked:
        letter = classify.classify(fd.failure)[0]
        if letter == "?" or letter not in seen:
            picked.append((sig, fd))
            seen.add(letter)
    return picked


# ---- chunks in child processes -------------------------------------------------------------------------------

# Batches after which a child drops JAX's compiled executables: campaign 20261400 lost one chunk process to LLVM
# ("Unable to allocate section memory") about 100 batches in, its compiled code accumulated.
RELEASE_EVERY = 25
CHECK = "tests.fuzz.checker:check_batch"  # what a child runs on each batch (``module:function``)


def _resolve(name: str):
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


def _chunk_worker(chunk_seed: int, batches: int, skip: int, check: str, work: str, stop: str) -> None:
    """In the child: check the chunk's batches from index ``skip`` on, until the ``stop`` file exists. Before a
    batch runs, ``(index, batch)`` replaces ``work/trail``; after it, ``(index, batch, cases, failures)`` is
    appended to ``work/results``, so a parent outliving this process knows what ran and where it died."""
    check_batch, work, stop = _resolve(check), pathlib.Path(work), pathlib.Path(stop)
    index = [-1]

    def on_batch(batch):
        index[0] += 1
        if index[0] < skip or stop.exists():
            return
        (work / "trail").write_bytes(pickle.dumps((index[0], batch)))
        result = check_batch(batch)
        with (work / "results").open("ab") as fh:
            fh.write(pickle.dumps((index[0], batch, result.cases, result.failures)))
        if (index[0] + 1) % RELEASE_EVERY == 0:
            jax.clear_caches()

    run_chunk(chunk_seed, batches, on_batch)


class _Records:
    """Reads the records a child appends to its results file, each once, as they complete."""

    def __init__(self, path: pathlib.Path):
        self.path, self.offset = path, 0

    def new(self) -> list[tuple]:
        if not self.path.exists():
            return []
        out = []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            while True:
                try:
                    out.append(pickle.load(fh))
                except (EOFError, pickle.UnpicklingError):
                    return out  # the end, or a record still being written: read it next time
                self.offset = fh.tell()


def process_crash(batch: strategies.Batch, exitcode: int) -> checker.Failure:
    """The failure recorded when the process checking ``batch`` died (its first case stands for the batch)."""
    how = signal.Signals(-exitcode).name if exitcode < 0 else f"exit status {exitcode}"
    return checker.Failure(batch.cases()[0], "process", "process", "crash",
                           f"the process checking this batch died ({how}); the batch's reproducer replays the "
                           f"whole check", where=how)


def run_chunk_isolated(chunk_seed: int, batches: int, on_checked, *, stop: pathlib.Path, check: str = CHECK,
                       poll: float = 2.0) -> None:
    """Check one chunk in child processes: ``on_checked(index, batch, cases, failures)`` per batch, in order,
    while the child runs. When the child dies, its batch is recorded as a `process_crash` and a new child
    resumes the chunk after it (hypothesis regenerates the same batches from the chunk's seed)."""
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no JAX state shared with the parent
    skip = 0
    with tempfile.TemporaryDirectory(prefix=f"jgnn-fuzz-{chunk_seed}-") as tmp:
        work = pathlib.Path(tmp)
        while True:
            for name in ("trail", "results"):
                (work / name).unlink(missing_ok=True)
            proc = ctx.Process(target=_chunk_worker, args=(chunk_seed, batches, skip, check, str(work), str(stop)),
                               daemon=True)
            proc.start()
            records, last = _Records(work / "results"), skip - 1
            while True:
                proc.join(poll)
                exited = proc.exitcode is not None  # read before the records: after exit they are complete
                for rec in records.new():
                    last = rec[0]
                    on_checked(*rec)
                if exited:
                    break
            if proc.exitcode == 0:
                return
            if not (work / "trail").exists():
                raise RuntimeError(f"chunk {chunk_seed}: the checking process exited with {proc.exitcode} "
                                   f"before its first batch")
            index, batch = pickle.loads((work / "trail").read_bytes())
            on_checked(index, batch, len(batch.pairs) if index > last else 0, [process_crash(batch, proc.exitcode)])
            if index <= last:
                return  # it died after its last batch (at exit): nothing left to resume
            skip = index + 1


def campaign(cases: int, seed: int, chunk: int, jobs: int = 1, log=print, on_chunk=None,
             check: str = CHECK, max_chunks: int | None = None) -> tuple[dict, int, int, float]:
    """Check batches until ``cases`` cases ran (or ``max_chunks`` chunks did), ``jobs`` chunks at a time (seeds
    ``seed``, ``seed + 1``, ...);
    ``on_chunk(found, cases, batches, seconds)`` after each chunk (the report so far: a campaign cut short
    keeps what it found). Chunks that are running when the count is reached stop after their current batch."""
    found: dict[tuple, Found] = {}
    totals = {"cases": 0, "batches": 0}
    lock = threading.Lock()
    start = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="jgnn-fuzz-") as tmp:
        stop = pathlib.Path(tmp) / "stop"

        def on_checked(chunk_seed, index, batch, n, failures):
            with lock:
                totals["cases"] += n
                totals["batches"] += 1
                per_case = collections.defaultdict(set)
                for f in failures:
                    # The class letter keeps apart different bugs that share a signature (value mismatches
                    # have no site).
                    sig = f.signature() + (classify.classify(f)[0],)
                    per_case[sig].add(f.case)
                    found.setdefault(sig, Found(f, chunk_seed, batch))
                for sig, failing in per_case.items():
                    found[sig].count += len(failing)
                if totals["cases"] >= cases:
                    stop.touch()
                if totals["batches"] % 10 == 0:
                    log(f"{totals['cases']} cases, {totals['batches']} batches, {len(found)} signatures, "
                        f"{time.perf_counter() - start:.0f} s")

        def run(chunk_seed):
            run_chunk_isolated(chunk_seed, chunk, lambda *rec: on_checked(chunk_seed, *rec), stop=stop, check=check)
            if on_chunk is not None:
                with lock:
                    on_chunk(found, totals["cases"], totals["batches"], time.perf_counter() - start)

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            pending, next_seed = set(), seed
            while True:
                while len(pending) < jobs and not stop.exists() and (max_chunks is None or
                                                                      next_seed - seed < max_chunks):
                    pending.add(pool.submit(run, next_seed))
                    next_seed += 1
                if not pending:
                    break
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    fut.result()
    return found, totals["cases"], totals["batches"], time.perf_counter() - start


def write_report(out: pathlib.Path, found: dict, cases: int, batches: int, seconds: float, seed: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (sig, fd) in enumerate(sorted(found.items(), key=lambda kv: -kv[1].count)):
        shown = fd.shrunk or fd.failure
        letter, what = classify.classify(shown)
        name = f"repro_{i:02d}_{letter if letter != '?' else 'x'}_{sig[0]}_{sig[1]}_{sig[2]}.py"
        script = reproducer.batch_reproducer(fd.batch, shown) if shown.mode == "process" else \
            reproducer.reproducer(shown)
        (out / name).write_text(script)
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
    ap.add_argument("--jobs", type=int, default=1, help="chunks checked at once, each in its own process")
    ap.add_argument("--shrink-seconds", type=float, default=300.0, help="per signature; 0 to skip shrinking")
    ap.add_argument("--shrink", choices=("class", "all"), default="class",
                    help="shrink the most frequent signature of each class, or every signature")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/fuzz"))
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 2**31
    print(f"campaign: {args.cases} cases, seed {seed}, writing to {args.out}", flush=True)
    found, cases, batches, seconds = campaign(
        args.cases, seed, args.chunk, args.jobs, log=lambda s: print(s, flush=True),
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
