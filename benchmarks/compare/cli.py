"""``python -m benchmarks.compare [--suite cpu | --quick] [--only SUBSTRING] [--rounds N] [--out-dir DIR]``

Writes ``<out-dir>/cpu-compare-<date>.{json,md,png}`` (``cpu-compare-quick-<date>`` with ``--quick``) and exits
with status 1 if any row is not ``ok`` (an error, or a first-step loss that disagrees).

Each case runs in a fresh process (``--isolate``, the default of the full suite), so graphs, compile caches and
jgnn's plan cache of one case never touch the next, and first-call times are cold.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "flax", "optax", "jraph", "numpy", "torch", "torch_geometric"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing package is recorded as such
            out[name] = None
    return out


def _pyg_extensions() -> str:
    try:
        import torch_geometric.typing as t

        found = {"pyg-lib": t.WITH_PYG_LIB, "torch-scatter": t.WITH_TORCH_SCATTER, "torch-sparse": t.WITH_TORCH_SPARSE}
    except Exception as e:  # noqa: BLE001
        return f"torch_geometric does not import ({type(e).__name__})"
    return ", ".join(f"{k} {'present' if v else 'absent'}" for k, v in found.items())


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        la = os.getloadavg()
        return f"load average: {la[0]:.2f}, {la[1]:.2f}, {la[2]:.2f}"


def _git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if sha.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="cpu", help="cpu (default) or quick")
    p.add_argument("--quick", action="store_true", help="the quick suite, 1 round, in this process (CI)")
    p.add_argument("--only", default=None, help="only cases whose key (model/dataset/mode) contains this")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; quick 1)")
    p.add_argument("--target-s", type=float, default=None,
                   help="seconds each system's calls should last per round (default 0.3; quick 0)")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="one process per case (default: on, except with --quick)")
    p.add_argument("--systems", default=None,
                   help="comma-separated systems to run (default: every system of each case), e.g. jgnn,hand")
    p.add_argument("--case-timeout", type=float, default=3000.0, help="seconds per isolated case")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--name", default=None, help="file stem (default cpu-compare[-quick]-<date>)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="write one report from earlier runs' JSON files (a later file's rows replace an earlier "
                        "file's rows of the same case and system) to --out-dir/--name; nothing is measured")
    p.add_argument("--note", default=None, help="a remark printed at the top of the report (e.g. on the load)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.suite = "quick"
    quick = args.suite == "quick"
    args.rounds = args.rounds or (1 if quick else 7)
    args.target_s = (0.0 if quick else 0.3) if args.target_s is None else args.target_s
    args.isolate = (not quick) if args.isolate is None else args.isolate
    args.systems = tuple(args.systems.split(",")) if args.systems else None
    from benchmarks.compare.cases import ALL_SYSTEMS

    if unknown := sorted(set(args.systems or ()) - set(ALL_SYSTEMS)):
        p.error(f"unknown systems {unknown} in --systems; expected some of {list(ALL_SYSTEMS)}")
    return args


def run_isolated(case, args) -> list[dict]:
    """One case in a fresh interpreter; its rows come back as one ``ROWS <json>`` line."""
    from benchmarks.compare.measure import status_of

    cmd = [sys.executable, "-m", "benchmarks.compare", "--suite", args.suite, "--worker", case.key,
           "--rounds", str(args.rounds), "--target-s", str(args.target_s),
           *(["--systems", ",".join(args.systems)] if args.systems else [])]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired as e:
        status = f"error: timeout after {args.case_timeout:.0f}s"
        return [_failed(case, s, status) for s in case.select(args.systems)] or [_failed(case, "all", status_of(e))]
    sys.stderr.write(proc.stderr[-4000:] if proc.returncode else "")
    for line in proc.stdout.splitlines():
        if line.startswith("ROWS "):
            return json.loads(line[5:])
        print(line, flush=True)
    reason = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit {proc.returncode}"
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:300]
    return [_failed(case, s, f"error: worker {reason}: {tail}") for s in case.select(args.systems)]


def _failed(case, system: str, status: str) -> dict:
    return {"case": case.key, "model": case.model, "dataset": case.dataset, "mode": case.mode, "group": case.group,
            "system": system, "status": status, "num_nodes": 0, "num_edges": 0}


def write(out: pathlib.Path, stem: str, meta: dict, rows: list[dict], *, chart: bool = True) -> None:
    """``<out>/<stem>.{json,md}`` and, if ``chart``, ``.png``; jgnn's ratios are (re)computed first."""
    from benchmarks.compare import measure, report

    measure.add_ratios(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=float))
    (out / f"{stem}.md").write_text(report.markdown(meta, rows))
    if chart:
        report.chart(rows, out / f"{stem}.png", f"jgnn vs hand-written JAX, jraph, PyG on CPU ({meta['date'][:10]})")


def merge(paths: list[str]) -> tuple[dict, list[dict]]:
    """One (meta, rows) from several runs: the first run's meta, every run's command and load, and the rows of
    each (case, system) from the last run that has it, in the order the cases first appear."""
    runs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    rows: dict[tuple[str, str], dict] = {}
    for run in runs:
        rows.update({(r["case"], r["system"]): r for r in run["rows"]})
    metas = [run["meta"] for run in runs]
    meta = dict(metas[0], command=" ; then ".join(m["command"] for m in metas),
                rounds=" / ".join(str(m["rounds"]) for m in metas) + " (per run, in the order of the commands)",
                uptime_before=" / ".join(m["uptime_before"] for m in metas),
                uptime_after=" / ".join(m["uptime_after"] for m in metas),
                git_commit=" / ".join(str(m["git_commit"]) for m in metas), cases_done="merged")
    return meta, list(rows.values())


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        meta, rows = merge(args.merge)
        meta["note"] = args.note or meta.get("note")
        write(pathlib.Path(args.out_dir), args.name or "cpu-compare-merged", meta, rows)
        return 1 if any(r["status"] != "ok" for r in rows) else 0
    from benchmarks.compare import cases, measure

    todo = cases.select(args.suite, args.only if not args.worker else None)
    if args.worker:
        case = next(c for c in todo if c.key == args.worker)
        rows = measure.measure_case(case, rounds=args.rounds, target_s=args.target_s, only=args.systems, log=print)
        print("ROWS " + json.dumps(rows, default=float), flush=True)
        return 0
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": shlex.join(["python", "-m", "benchmarks.compare", *(sys.argv[1:] if argv is None else argv)]),
            "git_commit": _git_commit(), "versions": library_versions(), "pyg_extensions": _pyg_extensions(),
            "cpu": cpu_model(), "num_cpus": os.cpu_count(), "suite": args.suite, "rounds": args.rounds,
            "target_s": args.target_s, "isolate": args.isolate, "systems": args.systems, "rtol": measure.LOSS_RTOL,
            "train_step": "forward, mean cross-entropy over the training nodes, backward, Adam lr 0.01; f32",
            "memory_metric": "JAX: XLA's buffer assignment of the compiled step (arguments + outputs + temp − "
                             "donated; parameters and Adam state are donated); PyG: bytes of the tensors alive at "
                             "the step's start (parameters, Adam state, inputs) + the peak the step allocates, "
                             "from the PyTorch profiler's memory events (CPU allocator)",
            "uptime_before": machine_uptime(), "note": args.note}
    print(f"{len(todo)} cases; {meta['uptime_before']}", flush=True)
    t0 = time.perf_counter()
    date = meta["date"][:10]
    stem = args.name or f"cpu-compare{'-quick' if args.suite == 'quick' else ''}-{date}"
    out = pathlib.Path(args.out_dir)
    rows: list[dict] = []
    for i, case in enumerate(todo):
        print(f"[{i + 1}/{len(todo)}] {case.key}", flush=True)
        case_rows = run_isolated(case, args) if args.isolate else \
            measure.measure_case(case, rounds=args.rounds, target_s=args.target_s, only=args.systems)
        for r in case_rows:
            t = r.get("time_ms")
            print(f"    {r['system']:6s} {r['status'][:70]:70s} {'' if t is None else f'{t:10.2f} ms'}", flush=True)
        rows += case_rows
        # written after every case, so that a run stopped early keeps the cases it finished
        meta.update(uptime_after=machine_uptime(), elapsed_s=time.perf_counter() - t0,
                    cases_done=f"{i + 1} of {len(todo)}")
        write(out, stem, meta, rows, chart=i + 1 == len(todo))
    bad = [f"{r['case']} {r['system']}: {r['status']}" for r in rows if r["status"] != "ok"]
    print(f"wrote {out / stem}.{{json,md,png}}: {len(rows)} rows, {len(bad)} not ok, "
          f"{meta['elapsed_s']:.0f}s; {meta['uptime_after']}")
    for b in bad:
        print("NOT OK: " + b)
    return 1 if bad else 0
