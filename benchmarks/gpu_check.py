"""Deviceless GPU check: compile every kernel configuration and every layer's training step for H100 and H200.

    python -m benchmarks.gpu_check [--full] [--targets h100,h200] [--only REGEX] [--jobs N] [--out PREFIX]

Needs JAX 0.11+ with the CUDA 13 PJRT plugin (``make gpu-check`` builds such virtualenvs) and the CUDA
toolchain's ``ptxas``; no GPU. Compiles through XLA's own deviceless path (compile-only devices from
``jax.experimental.topologies``), prints each kernel's registers, spills and shared memory, and checks that
each layer calls the Triton kernels it should. Writes ``PREFIX.json`` (meta, summary, failures with codes,
one record per case and target) and ``PREFIX.md`` (the same as tables). Exit status 1 on any failure:
a lowering, compile or ptxas error, a register spill, or a layer missing a kernel (`benchmarks.gpu.verdict`).
Both tiers compile every configuration; the default, quick, tier compiles kernel configurations for the
first target only (layers for all), ``--full`` compiles everything for every target.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.metadata
import json
import multiprocessing
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="kernel configurations on every target, not the first only")
    p.add_argument("--targets", default="h100,h200", help="comma-separated, from benchmarks.gpu.targets.TARGETS")
    p.add_argument("--only", default=None, help="regular expression: compile only the cases whose name matches")
    p.add_argument("--out", default="build/gpu-check/report", help="output prefix: PREFIX.json and PREFIX.md")
    p.add_argument("--jobs", type=int, default=1, help="compile in this many processes (each holds its own JAX)")
    return p.parse_args(argv)


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _select(only: str | None) -> list:
    from benchmarks.gpu import cases, layers

    selected = cases.kernel_cases() + layers.layer_cases()
    return [c for c in selected if not only or re.search(only, c.name)]


def _targets_for(case, names: list[str], full: bool) -> list[str]:
    """Layers on every target; in the quick tier, kernel configurations on the first only: both Hopper parts
    compile to the same sm_90a PTX (the full tier's ``ptx_across_targets`` checks that it stays so)."""
    return names if full or case.kind == "layer" else names[:1]


def _devices(names: list[str]) -> dict:
    from benchmarks.gpu import targets

    try:
        return {t: targets.compile_only_device(targets.TARGETS[t]) for t in names}
    except (NotImplementedError, RuntimeError) as exc:
        sys.exit(f"gpu_check: no compile-only CUDA device ({exc}). This needs JAX >= 0.11 with jax-cuda13-plugin "
                 "and jax-cuda13-pjrt installed; `make gpu-check` builds such a virtualenv.")


class _Worker:
    """One process's compile state: the toolchain, the ptxas wrapper and the compile-only devices."""

    def __init__(self, names: list[str], full: bool, only: str | None):
        from benchmarks.gpu import toolchain

        self.names, self.full, self.cases = names, full, _select(only)
        self.toolchain = toolchain.find_toolchain()
        self.tmp = tempfile.TemporaryDirectory(prefix="jgnn-cuda-")
        self.cuda_dir = toolchain.install_wrapper(self.toolchain, pathlib.Path(self.tmp.name))
        self.devices = _devices(names)

    def run(self, index: int) -> list[dict]:
        """Compile case ``index`` for its targets: one record per target (the step is built once)."""
        from benchmarks.gpu import layers, targets
        from benchmarks.gpu.deviceless import compile_step

        case = self.cases[index]
        try:
            step, build_error = case.build(), None
        except Exception as exc:  # a layer that cannot even be traced: recorded for every target
            step, build_error = None, f"{type(exc).__name__}: {exc}"
        records = []
        for t in _targets_for(case, self.names, self.full):
            if step is None:
                compiled = {"lowered_triton_calls": [], "triton_calls": [], "kernels": [], "seconds": 0.0,
                            "error_code": "lowering_error", "error": build_error}
            else:
                compiled = compile_step(step, targets.TARGETS[t], self.devices[t], self.cuda_dir).to_json()
            missing = {}
            if case.kind == "layer" and not compiled["error_code"]:
                missing = layers.missing_kernels(case.params["expected"], compiled["triton_calls"])
            records.append({"case": case.name, "kind": case.kind, "family": case.family, "params": case.params,
                            "target": t, **compiled, "missing": missing})
        return records


_WORKER: _Worker | None = None


def _init_worker(names: list[str], full: bool, only: str | None) -> None:
    global _WORKER
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _WORKER = _Worker(names, full, only)


def _run_in_worker(index: int) -> list[dict]:
    return _WORKER.run(index)


def _compile_all(names: list[str], args: argparse.Namespace, n_cases: int) -> list[dict]:
    """Every selected case, over ``args.jobs`` processes; progress on stdout; records in case order."""
    from benchmarks.gpu import verdict

    by_index: dict[int, list[dict]] = {}

    def done(i: int, records: list[dict]) -> None:
        by_index[i] = records
        for r in records:
            print(f"[{len(by_index)}/{n_cases}] {verdict.progress_line(r)}", flush=True)

    if args.jobs == 1:
        _init_worker(names, args.full, args.only)
        for i in range(n_cases):
            done(i, _run_in_worker(i))
    else:  # spawned, not forked: each worker starts its own JAX
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_init_worker,
                                                    initargs=(names, args.full, args.only)) as pool:
            futures = {pool.submit(_run_in_worker, i): i for i in range(n_cases)}
            for f in concurrent.futures.as_completed(futures):
                done(futures[f], f.result())
    return [r for i in sorted(by_index) for r in by_index[i]]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # The compile-only devices need the CUDA plugin registered, not initialised; CPU is the only live backend.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from benchmarks.gpu import targets, toolchain, verdict

    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in names if t not in targets.TARGETS]
    if unknown or not names:
        sys.exit(f"gpu_check: unknown target(s) {unknown or names}; known: {', '.join(targets.TARGETS)}")
    if args.jobs < 1:
        sys.exit(f"gpu_check: --jobs must be at least 1, got {args.jobs}")
    tc = toolchain.find_toolchain()
    _devices(names)  # fail here, with the reason, rather than in every worker
    selected = _select(args.only)
    meta = {"jax": jax.__version__, **{p: _version(p) for p in ("jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt")},
            "python": platform.python_version(), "ptxas": tc.version,
            "targets": {t: targets.TARGETS[t].device_kind for t in names},
            "tier": "full" if args.full else "quick", "only": args.only, "commit": _commit(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "jobs": args.jobs}
    print(f"gpu_check: JAX {meta['jax']}, {tc.version}, {meta['tier']} tier: {len(selected)} cases "
          f"(kernels on {', '.join(names if args.full else names[:1])}, layers on {', '.join(names)}), "
          f"{args.jobs} job(s)", flush=True)
    start = time.perf_counter()
    records = _compile_all(names, args, len(selected))
    meta["seconds"] = round(time.perf_counter() - start, 1)
    rep = verdict.report(meta, records)
    json_path, md_path = pathlib.Path(args.out + ".json"), pathlib.Path(args.out + ".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rep, indent=1) + "\n")
    text = verdict.markdown(rep)
    md_path.write_text(text)
    print(text.split("\n## Kernels")[0])
    print(f"gpu_check: {len(rep['failures'])} failure(s) in {meta['seconds']}s; wrote {json_path} and {md_path}")
    return 1 if rep["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
