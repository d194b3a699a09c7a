"""One case, measured: build every system's runner (first call timed), check that all first-step losses agree,
then time interleaved rounds: every system inside each round, the order rotated from round to round, so slow
drifts of the shared machine's load touch every system alike.
"""
from __future__ import annotations

import math
import os
import statistics
import time
import traceback

import numpy as np

from benchmarks.compare import pyg, systems
from benchmarks.compare.cases import Case
from benchmarks.compare.runner import Runner

#: Relative tolerances (f32; systems sum in different orders): the first step's loss; the second's, after one Adam
#: update, which depends on every gradient; inference: the largest logit difference over the largest logit.
LOSS_RTOL = {"first": 1e-4, "second": 1e-3, "logits": 1e-4}
#: The loss every other system is compared with.
LOSS_REFERENCE = "hand"


def build_runner(system: str, case: Case, problem, params) -> Runner:
    train = case.mode == "train"
    if system.startswith("pyg"):
        return pyg.build(case.model, problem, params, train=train, threads=int(system[3:]))
    return systems.build(system, case.model, problem, params, train=train)


def status_of(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"error: {type(exc).__name__}: {first}"


def agreement(runners: dict[str, Runner]) -> dict[str, dict[str, float]]:
    """Each runner's relative differences from `LOSS_REFERENCE` (or the first runner): ``first`` and ``second``
    step losses (training), ``logits`` (inference)."""
    if not runners:
        return {}
    ref = runners.get(LOSS_REFERENCE) or next(iter(runners.values()))
    rel = lambda a, b: float(abs(a - b) / max(abs(b), 1e-30))
    out = {}
    for name, r in runners.items():
        a, b = r.info["losses"], ref.info["losses"]
        errs = {kind: rel(x, y) for kind, x, y in zip(("first", "second"), a, b, strict=False)}
        if "logits" in r.info:
            scale = max(float(np.abs(ref.info["logits"]).max()), 1e-30)
            errs["logits"] = float(np.abs(r.info["logits"] - ref.info["logits"]).max()) / scale
        out[name] = errs
    return out


def disagreement(errors: dict[str, float], rtol: dict[str, float] = LOSS_RTOL) -> str | None:
    """The status of a runner whose results differ from the reference by more than ``rtol``, else ``None``."""
    bad = [f"{kind} {err:.1e} > {rtol[kind]:g}" for kind, err in errors.items() if not err <= rtol[kind]]
    return f"error: differs from {LOSS_REFERENCE} (relative: {', '.join(bad)})" if bad else None


def calls_per_round(seconds: float, target_s: float, cap: int = 25) -> int:
    """Enough calls for a round to last about ``target_s`` (at least 1): short steps are timed several times and
    the round keeps their median."""
    return max(1, min(cap, math.ceil(target_s / max(seconds, 1e-6))))


def interleave(runners: dict[str, Runner], rounds: int, calls: dict[str, int]) -> dict[str, list[float]]:
    """Per runner, the median step time (ms) of each round. Round ``i`` starts at the ``i``-th runner."""
    names = list(runners)
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(rounds if names else 0):
        for name in names[i % len(names):] + names[:i % len(names)]:
            r = runners[name]
            r.enter()
            times = []
            for _ in range(calls[name]):
                t0 = time.perf_counter()
                r.call()
                times.append((time.perf_counter() - t0) * 1e3)
            out[name].append(statistics.median(times))
    return out


def measure_case(case: Case, *, rounds: int, target_s: float, only: tuple[str, ...] | None = None,
                 log=print) -> list[dict]:
    """A row of ``case`` per system (only those in ``only``, if given). Never raises: a failing system gets
    ``status = "error: ..."``."""
    load_before = os.getloadavg()
    problem = case.load()
    params = systems.initial_params(case.model, problem)
    base = {"case": case.key, "model": case.model, "dataset": case.dataset, "mode": case.mode, "group": case.group,
            "num_nodes": problem.num_nodes, "num_edges": problem.num_edges, "source": problem.source}
    rows: dict[str, dict] = {}
    runners: dict[str, Runner] = {}
    for system in case.select(only):
        rows[system] = {**base, "system": system, "status": "ok"}
        try:
            runners[system] = build_runner(system, case, problem, params)
            rows[system].update(runners[system].info)
            log(f"  {case.key} {system}: first call {runners[system].info['first_call_s']:.2f}s, "
                f"loss {runners[system].info['losses'][0]:.6g}")
        except Exception as e:  # noqa: BLE001 - one failing system never stops the others
            rows[system]["status"] = status_of(e)
            rows[system]["traceback"] = traceback.format_exc(limit=8)
            log(f"  {case.key} {system}: {rows[system]['status']}")
    for name, errors in agreement(runners).items():
        rows[name]["rel_error"] = errors
        rows[name].pop("logits", None)
        if status := disagreement(errors):
            rows[name]["status"] = status
            runners.pop(name)
    warm = {}
    for name, r in runners.items():  # one untimed call each, also the estimate of a step's length
        r.enter()
        t0 = time.perf_counter()
        r.call()
        warm[name] = time.perf_counter() - t0
    calls = {n: calls_per_round(t, target_s) for n, t in warm.items()}
    times = interleave(runners, rounds, calls)
    load_after = os.getloadavg()
    for name, ts in times.items():
        rows[name].update(time_ms=statistics.median(ts), time_min_ms=min(ts), time_max_ms=max(ts), round_ms=ts,
                          calls_per_round=calls[name], rounds=rounds)
    for row in rows.values():
        row.update(load_before=load_before, load_after=load_after)
    return list(rows.values())


def add_ratios(rows: list[dict]) -> None:
    """jgnn's time and memory against the best peer (fastest / smallest other system), hand and PyG (its
    better thread count), per case."""
    by_case: dict[str, list[dict]] = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r)
    for rs in by_case.values():
        ok = {r["system"]: r for r in rs if r["status"] == "ok" and r.get("time_ms")}
        me = ok.get("jgnn")
        if me is None:
            continue
        peers = {k: v for k, v in ok.items() if k != "jgnn"}
        if not peers:
            continue
        best = min(peers, key=lambda k: peers[k]["time_ms"])
        smallest = min(peers, key=lambda k: peers[k]["memory_bytes"])
        me.update(best_peer=best, time_vs_best_peer=me["time_ms"] / peers[best]["time_ms"],
                  smallest_peer=smallest, memory_vs_smallest_peer=me["memory_bytes"] / peers[smallest]["memory_bytes"])
        if "hand" in peers:
            me.update(time_vs_hand=me["time_ms"] / peers["hand"]["time_ms"],
                      memory_vs_hand=me["memory_bytes"] / peers["hand"]["memory_bytes"],
                      first_call_vs_hand=me["first_call_s"] / peers["hand"]["first_call_s"])
        pygs = [v for k, v in peers.items() if k.startswith("pyg")]
        if pygs:
            me["time_vs_pyg"] = me["time_ms"] / min(v["time_ms"] for v in pygs)
