"""Deviceless GPU check: compile every kernel configuration and every layer's training step for H100 and H200.

    python -m benchmarks.gpu_check [--full] [--targets h100,h200] [--only REGEX] [--out PREFIX]

Needs JAX 0.11+ with the CUDA 13 PJRT plugin (``make gpu-check`` builds such virtualenvs) and the CUDA
toolchain's ``ptxas``; no GPU. Compiles through XLA's own deviceless path (compile-only devices from
``jax.experimental.topologies``), prints each kernel's registers, spills and shared memory, and checks that
each layer calls the Triton kernels it should. Writes ``PREFIX.json`` (meta, summary, failures with codes,
one record per case and target) and ``PREFIX.md`` (the same as tables). Exit status 1 on any failure:
a lowering, compile or ptxas error, a register spill, or a layer missing a kernel (`benchmarks.gpu.verdict`).
The default tier is the quick one (`benchmarks.gpu.cases`); ``--full`` compiles the whole matrix.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
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
    p.add_argument("--full", action="store_true", help="every width, dtype and head count (default: quick tier)")
    p.add_argument("--targets", default="h100,h200", help="comma-separated, from benchmarks.gpu.targets.TARGETS")
    p.add_argument("--only", default=None, help="regular expression: compile only the cases whose name matches")
    p.add_argument("--out", default="build/gpu-check/report", help="output prefix: PREFIX.json and PREFIX.md")
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


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # The compile-only devices need the CUDA plugin registered, not initialised; CPU is the only live backend.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from benchmarks.gpu import cases, layers, targets, toolchain, verdict
    from benchmarks.gpu.deviceless import compile_step

    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in names if t not in targets.TARGETS]
    if unknown or not names:
        sys.exit(f"gpu_check: unknown target(s) {unknown or names}; known: {', '.join(targets.TARGETS)}")
    tc = toolchain.find_toolchain()
    try:
        devices = {t: targets.compile_only_device(targets.TARGETS[t]) for t in names}
    except (NotImplementedError, RuntimeError) as exc:
        sys.exit(f"gpu_check: no compile-only CUDA device ({exc}). This needs JAX >= 0.11 with jax-cuda13-plugin "
                 "and jax-cuda13-pjrt installed; `make gpu-check` builds such a virtualenv.")
    selected = cases.kernel_cases(args.full) + layers.layer_cases()
    if args.only:
        selected = [c for c in selected if re.search(args.only, c.name)]
    meta = {"jax": jax.__version__, **{p: _version(p) for p in ("jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt")},
            "python": platform.python_version(),
            "ptxas": tc.version, "targets": {t: targets.TARGETS[t].device_kind for t in names},
            "tier": "full" if args.full else "quick", "only": args.only, "commit": _commit(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count()}
    print(f"gpu_check: JAX {meta['jax']}, {tc.version}, {len(selected)} cases x {len(names)} targets", flush=True)
    records, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jgnn-cuda-") as tmp:
        cuda_dir = toolchain.install_wrapper(tc, pathlib.Path(tmp))
        for i, case in enumerate(selected, 1):
            try:
                step = case.build()
            except Exception as exc:  # a layer that cannot even be traced: recorded for every target
                step, build_error = None, f"{type(exc).__name__}: {exc}"
            for t in names:
                if step is None:
                    compiled = {"triton_calls": [], "kernels": [], "seconds": 0.0,
                                "error_code": "lowering_error", "error": build_error}
                else:
                    compiled = compile_step(step, targets.TARGETS[t], devices[t], cuda_dir).to_json()
                expected = case.params.get("expected")
                missing = layers.missing_kernels(expected, compiled["triton_calls"]) if case.kind == "layer" else {}
                record = {"case": case.name, "kind": case.kind, "family": case.family, "params": case.params,
                          "target": t, **compiled, "missing": missing if not compiled["error_code"] else {}}
                records.append(record)
                print(f"[{i}/{len(selected)}] {verdict.progress_line(record)}", flush=True)
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
