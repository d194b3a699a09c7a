"""Benchmark runner.

    python -m benchmarks.run --suite NAME [--suite NAME ...] [--quick] [--device cpu|gpu] --out results.json

Writes ``results.json`` (``{"meta": ..., "rows": [...]}``), ``results.md`` (a table per suite) and
``results-<suite>.png`` (speedup and memory ratio vs the reference, per data set). Every
(suite, model, dataset, system, mode) of the selected suites gets exactly one row; failures become rows with
status ``OOM`` / ``error: ...`` / ``unavailable: ...`` / ``skipped: ...`` and never stop the run.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import jax

from benchmarks import measure, report, suites, systems


def detect_device() -> str:
    try:
        return "gpu" if any(d.platform == "gpu" for d in jax.devices()) else "cpu"
    except RuntimeError:
        return "cpu"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "jax": jax.__version__}
    for name in ("jaxlib", "flax", "optax", "jraph", "torch", "torch_geometric"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        root = pathlib.Path(__file__).resolve().parents[1]
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True,
                               timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if sha.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def make_meta(args, device: str, copy_bw: float) -> dict:
    dev = jax.devices()[0]
    return {
        "device": device,
        "device_kind": getattr(dev, "device_kind", str(dev)),
        "num_cpus": os.cpu_count(),
        "versions": versions(),
        "jax": jax.__version__,
        "jaxlib": versions()["jaxlib"],
        "torch": versions()["torch"],
        "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "suites": args.suite,
        "quick": args.quick,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "isolate": args.isolate,
        "xla_python_client_preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        "jobs": args.jobs,
        "copy_bandwidth_gbps": copy_bw / 1e9,
        "jgnn_backend": systems.jax_backend(device),
        "memory_metric": "peak_bytes (device peak) when every row of a group has it, else xla_bytes "
                         "(XLA buffer assignment: argument + output + temp)",
    }


# ---- one row ----------------------------------------------------------------------------------------------


def base_row(case: suites.Case, system: str) -> dict:
    return {"suite": case.suite, "model": case.model, "dataset": case.dataset, "system": system,
            "mode": case.mode, "status": None}


def measure_row(case: suites.Case, system: str, device: str, args, copy_bw: float) -> dict:
    """Build and measure one row; never raises."""
    row = base_row(case, system)
    try:
        reason = systems.skip_reason(system, case, device)
        if reason:
            raise systems.Skipped(reason)
        spec = suites.MODELS.get(case.model)
        data = systems.load_data(systems.base_dataset(case.dataset), quick=args.quick, seed=args.seed,
                                 in_dim=(spec.in_dim or 64) if spec else 64)
        row.update(num_nodes=data.num_nodes, num_edges=data.num_edges, data_source=data.source)
        run = systems.build(system, case, data, device)
        row.update(run.info)
        if run.framework == "none":  # byte floor
            row["time_ms"] = run.info["floor_bytes"] / copy_bw * 1e3
        elif run.framework == "jax":
            t0 = time.perf_counter()
            compiled = jax.jit(run.fn).lower(*run.args).compile()
            row["compile_s"] = time.perf_counter() - t0
            row["platform"] = jax.devices()[0].platform
            row.update(measure.xla_memory(compiled))
            row.update(measure.xla_cost(compiled))
            row.update(measure.summarize_times(
                measure.time_jax(compiled, run.args, warmup=args.warmup, repeats=args.repeats)))
            if device == "gpu" and args.isolate:
                row["peak_bytes"] = measure.gpu_peak_bytes()
            del compiled
        else:
            row.update(measure.summarize_times(measure.time_torch(run.fn, warmup=args.warmup,
                                                                  repeats=args.repeats)))
            row["peak_bytes"] = run.peak_bytes() if run.peak_bytes else None
        if row.get("bytes_accessed") and row.get("time_ms"):
            row["achieved_gbps"] = row["bytes_accessed"] / (row["time_ms"] / 1e3) / 1e9
            row["bandwidth_fraction"] = row["achieved_gbps"] * 1e9 / copy_bw
        row["status"] = "ok"
    except systems.Skipped as e:
        row["status"] = f"skipped: {e}"
    except systems.Unavailable as e:
        row["status"] = f"unavailable: {e}"
    except Exception as e:  # noqa: BLE001 - one broken system never kills the suite
        row["status"] = measure.status_of(e)
    return row


def measure_row_isolated(case: suites.Case, system: str, args) -> dict:
    """Run one row in a fresh process, so the device's process-wide peak memory belongs to that row alone."""
    cmd = [sys.executable, "-m", "benchmarks.run", "--worker", json.dumps([case.suite, case.model, case.dataset,
                                                                            case.mode, system]),
           "--device", args.device, "--repeats", str(args.repeats), "--warmup", str(args.warmup),
           "--seed", str(args.seed), "--copy-bandwidth", str(args.copy_bandwidth)]
    if args.data_cache:
        cmd += ["--data-cache", args.data_cache]
    if args.quick:
        cmd.append("--quick")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=pathlib.Path(__file__).resolve().parents[1],
                              timeout=args.row_timeout)
    except subprocess.TimeoutExpired:
        return {**base_row(case, system), "status": f"error: timeout after {args.row_timeout}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("ROW "):
            return json.loads(line[4:])
    row = base_row(case, system)
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    row["status"] = "OOM" if proc.returncode in (-9, 137) else f"error: worker exited {proc.returncode}: {tail}"
    return row


def run_case(case: suites.Case, device: str, args, copy_bw: float) -> list[dict]:
    """Every system's row of one case (each row in its own process with ``--isolate``)."""
    rows = []
    for system in case.systems:
        t0 = time.perf_counter()
        if args.isolate and not systems.skip_reason(system, case, device):
            row = measure_row_isolated(case, system, args)
        else:
            row = measure_row(case, system, device, args, copy_bw)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    jax.clear_caches()
    return rows


def _init_worker(device: str) -> None:
    if device == "cpu":
        jax.config.update("jax_platforms", "cpu")


def log_rows(i: int, n: int, rows: list[dict]) -> list[dict]:
    for r in rows:
        t = r.get("time_ms")
        print(f"[{i + 1}/{n}] {r['suite']:9s} {r['model']:19s} {r['dataset']:16s} {r['mode']:9s} {r['system']:10s} "
              f"{r['status'][:60]:60s} {'' if t is None else f'{t:10.3f} ms'}  ({r['wall_s']:.1f}s)", flush=True)
    return rows


# ---- ratios -----------------------------------------------------------------------------------------------


def add_ratios(rows: list[dict]) -> None:
    """speedup / memory / FLOP ratios of every ok row against its group's baseline (reference or xla), and
    the fraction of the byte floor reached by each micro-suite row."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["suite"], r["model"], r["dataset"], r["mode"]), []).append(r)
    for (suite, *_), rs in groups.items():
        base_name = suites.BASELINE["micro" if suite == "micro" else "model"]
        ok = [r for r in rs if r["status"] == "ok"]
        base = next((r for r in ok if r["system"] == base_name), None)
        floor = next((r for r in ok if r["system"] == "byte_floor"), None)
        use_peak = all(r.get("peak_bytes") for r in ok if r["system"] != "byte_floor")
        for r in ok:
            if r["system"] == "byte_floor":
                continue
            r["memory_bytes"] = r.get("peak_bytes") if use_peak else r.get("xla_bytes")
        for r in ok:
            if floor is not None and r is not floor and r.get("time_ms"):
                r["fraction_of_floor"] = floor["time_ms"] / r["time_ms"]
            if base is None or r is floor:
                continue
            if base.get("time_ms") and r.get("time_ms"):
                r["speedup_vs_reference"] = base["time_ms"] / r["time_ms"]
            if base.get("memory_bytes") and r.get("memory_bytes"):
                r["memory_ratio_vs_reference"] = r["memory_bytes"] / base["memory_bytes"]
            if base.get("flops") and r.get("flops") is not None:
                r["flops_ratio_vs_reference"] = r["flops"] / base["flops"]
            if base.get("temp_bytes") and r.get("temp_bytes") is not None:
                r["temp_ratio_vs_reference"] = r["temp_bytes"] / base["temp_bytes"]


# ---- CLI --------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append", default=None,
                   help=f"one of {', '.join(suites.SUITES)} or 'all' (repeatable; default all)")
    p.add_argument("--dataset", action="append", default=None,
                   help="only these data sets (repeatable; micro's ogbn-arxiv/d=N counts as ogbn-arxiv)")
    p.add_argument("--quick", action="store_true", help="small graphs (smoke test; numbers are not meaningful)")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None, help="default: what JAX finds")
    p.add_argument("--out", default="benchmarks/results/results.json")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per row (default 20; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs per row (default 2; 0 with --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="one process per row (default on GPU: makes peak_bytes per row)")
    p.add_argument("--jobs", type=int, default=None,
                   help="cases measured in parallel processes (default 2 with --quick on CPU, else 1; timings "
                        "taken in parallel share the cores, so use 1 for numbers you report)")
    p.add_argument("--row-timeout", type=float, default=1800.0, help="seconds per row with --isolate")
    p.add_argument("--data-cache", default=None,
                   help="directory of generated graphs (pickles) reused across runs and --isolate workers")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--copy-bandwidth", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.suite = args.suite or ["all"]
    if args.repeats is None:
        args.repeats = 2 if args.quick else 20
    if args.warmup is None:
        args.warmup = 0 if args.quick else 2
    return args


def write_json(meta: dict, rows: list[dict], t_start: float, path: str) -> None:
    """The results so far, ratios included, written whole: ``meta["elapsed_s"]`` is the time until now."""
    add_ratios(rows)  # idempotent: each ratio is recomputed from the rows' own measurements
    meta["elapsed_s"] = time.perf_counter() - t_start
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=float))
    tmp.replace(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    # Before JAX creates a GPU client: no 75% preallocation, so the parent process, the per-row workers and
    # PyTorch can share the GPU (peak_bytes_in_use counts live buffers either way).
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.data_cache:
        systems.DATA_CACHE_DIR = pathlib.Path(args.data_cache)
    found = detect_device()
    device = args.device or found
    if device == "gpu" and found != "gpu":
        print("--device gpu but JAX finds no GPU", file=sys.stderr)
        return 2
    if device == "cpu" and found == "gpu":
        jax.config.update("jax_platforms", "cpu")
    args.device = device
    if args.isolate is None:
        args.isolate = device == "gpu"
    if args.jobs is None:
        args.jobs = min(2, os.cpu_count() or 1) if (args.quick and device == "cpu") else 1
    if args.isolate:
        args.jobs = 1

    if args.worker:  # one row, printed for the parent process
        suite, model, dataset, mode, system = json.loads(args.worker)
        case = next(c for c in suites.cases([suite]) if (c.model, c.dataset, c.mode) == (model, dataset, mode))
        args.isolate = True
        print("ROW " + json.dumps(measure_row(case, system, device, args, args.copy_bandwidth)), flush=True)
        return 0

    copy_bw = measure.copy_bandwidth(nbytes=(32 << 20) if args.quick else (512 << 20))
    args.copy_bandwidth = copy_bw
    meta = make_meta(args, device, copy_bw)
    todo = [c for c in suites.cases(args.suite) if not args.dataset or systems.base_dataset(c.dataset) in args.dataset]
    t_start = time.perf_counter()
    rows = []
    if args.isolate and systems.DATA_CACHE_DIR is None:  # workers load each graph from here, not regenerate it
        cache = tempfile.TemporaryDirectory(prefix="jgnn-bench-")
        systems.DATA_CACHE_DIR = pathlib.Path(cache.name)
        args.data_cache = cache.name
    if args.jobs > 1 and not args.isolate:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that has started JAX
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init_worker,
                                                    initargs=(device,)) as pool:
            futures = [pool.submit(run_case, case, device, args, copy_bw) for case in todo]
            for i, (case, fut) in enumerate(zip(todo, futures, strict=True)):
                try:
                    case_rows = fut.result()
                except Exception as e:  # noqa: BLE001 - e.g. a worker killed by the OOM killer
                    case_rows = [{**base_row(case, s), "status": measure.status_of(e), "wall_s": 0.0}
                                 for s in case.systems]
                rows += log_rows(i, len(todo), case_rows)
    else:
        for i, case in enumerate(todo):
            rows += log_rows(i, len(todo), run_case(case, device, args, copy_bw))
            # A run cut short (a device lease, a timeout) keeps every case it finished.
            write_json(meta, rows, t_start, args.out)
    write_json(meta, rows, t_start, args.out)
    out = pathlib.Path(args.out)
    report.write_markdown(meta, rows, out.with_suffix(".md"))
    for suite in dict.fromkeys(r["suite"] for r in rows):
        report.write_chart(meta, [r for r in rows if r["suite"] == suite], suite,
                           out.with_name(f"{out.stem}-{suite}.png"))
    print(f"wrote {out} ({len(rows)} rows, {meta['elapsed_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
