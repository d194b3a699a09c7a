"""``python -m benchmarks.compare.profile CASE [CASE ...] [--out DIR] [--repeats N]``: why jgnn is slower or
larger than the hand-written program on a case of the comparison (e.g. ``hgt/typed-20k/train``).

For each case: jgnn's `jgnn.explain` kernel records (how each fused op is lowered: ``segment``, ``blocks`` or
``kernel``, with its parameters), and for jgnn and hand side by side: the optimised HLO of the compiled step
(instructions by opcode, the bytes written by scatters, gathers and dots, while loops, the largest buffers), XLA's
memory analysis, and the forward's and the whole step's time (interleaved, median of ``--repeats``). The optimised
HLO texts go to ``--out`` (one file per case and system) for reading by hand.

``--thunks`` also runs each program under the JAX profiler and reports where its time goes: per XLA thunk (an HLO
fusion, dot, scatter, ...) the milliseconds per call summed over the threads that ran it, the call's wall time,
and their ratio (how many threads were busy on average). A program can do no more work than another and still
take longer, when XLA overlaps less of it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import statistics
import tempfile
import time

import jax
import numpy as np

import jgnn
from benchmarks.compare import cases, systems
from benchmarks.compare.runner import step, xla_memory

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\(")
_ARRAY = re.compile(r"^(pred|[a-z]+\d+)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8,
             "s64": 8, "u64": 8}
#: bookkeeping opcodes that move no data
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy-start", "copy-done"}
#: opcodes whose count and bytes say what a graph program does
_WATCH = ("scatter", "gather", "dot", "sort", "while", "dynamic-slice", "dynamic-update-slice", "reduce",
          "custom-call", "fusion", "copy", "transpose")


def _bytes(shape: str) -> int:
    m = _ARRAY.match(shape)
    if not m:
        return 0
    dims = [int(d) for d in m.group(2).split(",") if d]
    return int(np.prod(dims, dtype=np.int64)) * _ITEMSIZE.get(m.group(1), 4)


def hlo_summary(text: str, top: int = 8) -> dict:
    """Instruction counts and output bytes by opcode of an optimised HLO module (every computation, fusion
    bodies included), and the ``top`` largest outputs (opcode, shape)."""
    count, written, largest = collections.Counter(), collections.Counter(), []
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m or m.group(2) in _FREE:
            continue
        shape, op = m.group(1), m.group(2)
        count[op] += 1
        written[op] += _bytes(shape)
        largest.append((_bytes(shape), op, shape))
    largest.sort(reverse=True)
    return {"instructions": sum(count.values()),
            "by_opcode": {op: {"count": count[op], "mib": round(written[op] / 2**20, 1)} for op in _WATCH if count[op]},
            "largest": [{"opcode": op, "shape": shape, "mib": round(b / 2**20, 1)} for b, op, shape in largest[:top]]}


def kernel_records(kind: str, problem, params) -> list[dict]:
    """jgnn's kernel records for the forward of ``kind`` on ``problem`` (`jgnn.explain`)."""
    forward, consts, q = systems.program("jgnn", kind, problem, params)
    report = jgnn.explain(forward, q, *consts)
    return [{"op": k.op, "lowering": k.lowering, "code": str(k.code), "params": dict(k.params)} for k in report.kernels]


BUDGET_VAR = "JGNN_EDGE_TEMP_BYTES"


def _set_budget(value: str | None) -> None:
    if value is None:
        os.environ.pop(BUDGET_VAR, None)
    else:
        os.environ[BUDGET_VAR] = value


def compiled_step(system: str, case, problem, params, *, train: bool):
    """``(compiled, call)``: ``system``'s training step (or forward) for ``case``, compiled; ``call()`` runs it once
    and returns its outputs (a step also updates its own parameters and optimizer state)."""
    forward, consts, q = systems.program(system, case.model, problem, params)
    fn, state, donate = step(forward, systems.fresh(q), jax.device_put(problem.labels),
                             jax.device_put(problem.train_idx), train=train)
    consts = jax.device_put(consts)
    compiled = jax.jit(fn, donate_argnums=donate).lower(*state, *consts).compile()

    def call():
        out = jax.block_until_ready(compiled(*state, *consts))
        if train:
            state[:] = out[:2]
        return out

    return compiled, call


def thunk_profile(call, calls: int = 3, top: int = 12) -> dict:
    """Where ``call``'s time goes, from the JAX profiler's per-thunk events over ``calls`` calls (see the module
    docstring): ``wall_ms`` (as the caller sees it, under the profiler) and ``work_ms`` per call,
    ``overlap = work / wall``, and the ``top`` thunks by work."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            start = time.perf_counter()
            for _ in range(calls):
                call()
            wall = (time.perf_counter() - start) * 1e3 / calls
        trace = next(pathlib.Path(d).rglob("*.xplane.pb"))
        data = jax.profiler.ProfileData.from_file(str(trace))
    work: collections.Counter = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if "XLA" not in line.name:  # XLA's client and Eigen pool threads run the thunks
                continue
            for ev in line.events:
                if "::" not in ev.name and not ev.name.startswith("end: "):  # C++ scopes are bookkeeping
                    work[ev.name] += ev.duration_ns / 1e6 / calls
    total = sum(work.values())
    return {"wall_ms": round(wall, 2), "work_ms": round(total, 2), "overlap": round(total / wall, 2) if wall else None,
            "top": [{"thunk": k, "ms": round(v, 2)} for k, v in work.most_common(top)]}


def _variants(budgets: list[int]) -> list[tuple[str, str, int | None]]:
    """(name, system, edge-temp budget): hand, jgnn as configured, and jgnn at each of ``budgets``."""
    return [("hand", "hand", None), ("jgnn", "jgnn", None)] + [(f"jgnn@{b >> 20}MiB", "jgnn", b) for b in budgets]


def profile_case(key: str, out: pathlib.Path, repeats: int, budgets: list[int] = (), thunks: bool = False) -> dict:
    """See the module docstring. ``budgets``: also jgnn with ``JGNN_EDGE_TEMP_BYTES`` at each of these (the edge
    temporaries above which a fused op runs in edge blocks instead of segment ops), decided afresh per variant.
    ``thunks``: add each program's `thunk_profile`."""
    case = next(c for c in cases.CPU if c.key == key)
    problem = case.load()
    params = systems.initial_params(case.model, problem)
    result = {"case": key, "kernels": kernel_records(case.model, problem, params), "systems": {}}
    calls = {}
    default = os.environ.get(BUDGET_VAR)
    for system, base, budget in _variants(list(budgets)):
        for mode, train in (("step", case.mode == "train"), ("forward", False)):
            if mode == "forward" and case.mode != "train":
                continue
            _set_budget(default if budget is None else str(budget))
            jax.clear_caches()  # lowering decides blocks or segments: lower again under this budget
            compiled, calls[(system, mode)] = compiled_step(base, case, problem, params, train=train)
            if repeats:
                calls[(system, mode)]()  # warm
            text = compiled.as_text()
            (out / f"{key.replace('/', '_')}.{system}.{mode}.hlo.txt").write_text(text)
            result["systems"].setdefault(system, {})[mode] = {"hlo": hlo_summary(text), "memory": xla_memory(compiled)}
    _set_budget(default)
    times = collections.defaultdict(list)
    for i in range(repeats):  # interleaved: every program once per repeat, order rotated
        order = list(calls)[i % len(calls):] + list(calls)[:i % len(calls)]
        for k in order:
            t0 = time.perf_counter()
            calls[k]()
            times[k].append((time.perf_counter() - t0) * 1e3)
    for (system, mode), ts in times.items():
        result["systems"][system][mode]["ms"] = statistics.median(ts)
    if thunks:
        for (system, mode), call in calls.items():
            result["systems"][system][mode]["thunks"] = thunk_profile(call)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="+", help=f"case keys, from {[c.key for c in cases.CPU]}")
    p.add_argument("--out", default="/tmp/jgnn-profile")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each program (0: compile only)")
    p.add_argument("--budgets", default="", help="comma-separated byte counts: jgnn also with JGNN_EDGE_TEMP_BYTES "
                                                 "at each (e.g. 4294967296: every fused op on segment ops)")
    p.add_argument("--thunks", action="store_true", help="also profile each program per XLA thunk (JAX profiler)")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for key in args.cases:
        result = profile_case(key, out, args.repeats, [int(b) for b in args.budgets.split(",") if b], args.thunks)
        (out / f"{key.replace('/', '_')}.json").write_text(json.dumps(result, indent=1, default=str))
        print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
