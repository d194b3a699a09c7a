"""Smoke test of the benchmark harness: ``--suite all --quick --device cpu`` produces every expected row.

Runs the CLI once in a subprocess (module-scoped). Asserts the shape of the output, never a timing.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import suites

# Minutes of XLA compiles: CI runs it as its own step (`make test-slow`).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--suite", "all", "--quick", "--device", "cpu", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads(out.read_text())


def test_every_expected_row_has_a_status(quick_run):
    _, result = quick_run
    rows = result["rows"]
    got = [(r["suite"], r["model"], r["dataset"], r["system"], r["mode"]) for r in rows]
    expected = suites.expected_rows(["all"])
    assert sorted(got) == sorted(expected)  # each exactly once
    for r in rows:
        assert isinstance(r["status"], str) and r["status"], r


def test_no_row_errors(quick_run):
    """Every row is measured, skipped or unavailable: an error or OOM row is a failure of the harness or jgnn."""
    _, result = quick_run
    failed = [(r["suite"], r["model"], r["dataset"], r["system"], r["mode"], r["status"][:200])
              for r in result["rows"] if r["status"].startswith(("error", "OOM"))]
    assert not failed, failed


def test_row_table_covers_the_issue():
    rows = set(suites.expected_rows(["all"]))
    assert {r[0] for r in rows} == {"graphiler", "ugcg", "hector", "seastar", "micro"}
    for model in ("gcn", "gat"):
        for ds in ("pubmed", "ppi", "ogbn-arxiv", "reddit"):
            for system in ("jgnn", "jgnn_xla", "reference", "jraph", "pyg"):
                assert ("graphiler", model, ds, system, "inference") in rows
    for model in ("rgcn", "rgat", "hgt"):
        for ds in ("aifb", "mutag", "bgs", "ogbn-biokg", "am", "fb15k", "ogbn-mag", "wikikg2"):
            for mode in ("training", "inference"):
                assert ("hector", model, ds, "jgnn", mode) in rows
                assert ("hector", model, ds, "reference", mode) in rows
    for kernel in ("gather_reduce", "attention_aggregate", "gather_compute", "typed_matmul"):
        for d in (64, 128, 602):
            for system in ("pallas", "xla", "byte_floor"):
                assert ("micro", kernel, f"ogbn-arxiv/d={d}", system, "forward") in rows


def test_cpu_statuses(quick_run):
    _, result = quick_run
    for r in result["rows"]:
        if r["system"] in ("pallas", "jgnn_xla"):
            assert r["status"].startswith(("skipped", "unavailable")), r
        if r["system"] == "pyg" or r["dataset"] in ("ogbn-mag", "wikikg2"):
            assert r["status"].startswith(("skipped", "unavailable")), r
        if r["status"] == "ok" and r["system"] != "byte_floor":
            assert r["time_ms"] > 0 and r["runs"] >= 1, r


def test_meta(quick_run):
    _, result = quick_run
    meta = result["meta"]
    for key in ("device", "jax", "jaxlib", "torch", "git_commit", "date", "copy_bandwidth_gbps"):
        assert key in meta, key
    assert meta["device"] == "cpu" and meta["quick"] is True


def test_markdown_and_charts(quick_run):
    out, result = quick_run
    md = out.with_suffix(".md")
    assert md.is_file() and "| model |" in md.read_text()
    for suite in suites.SUITES:
        png = out.with_name(f"{out.stem}-{suite}.png")
        assert png.is_file() and png.stat().st_size > 1000, png


def test_unknown_costs_are_none_not_negative():
    """XLA's GPU cost analysis says -2 bytes for a program with a Triton kernel (the 2026-11-26/27 micro tables
    showed negative GB/s): an unknown cost is None, and no bandwidth is derived from it."""
    from benchmarks import measure

    class Compiled:
        def cost_analysis(self):
            return {"flops": 10.0, "bytes accessed": -2.0}

    assert measure.xla_cost(Compiled()) == {"flops": 10.0, "bytes_accessed": None}


@pytest.mark.pyg
def test_flexible_runs_every_system_with_memory(tmp_path, data_dir):
    """`benchmarks.flexible` on its two Cora models, ``--repeat 1``: every system (torch/PyG included) has a time
    and a memory, and the hand-written and torch outputs agreed with jgnn's (the run raises before timing
    otherwise)."""
    pytest.importorskip("torch_geometric")
    out = tmp_path / "flexible"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.flexible", "--models", "jknet", "pinsage", "--repeat", "1",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "JGNN_DATA_DIR": str(data_dir)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["model"].split()[0] for r in rows] == ["jknet", "pinsage"]
    for r in rows:
        for system in ("jgnn", "reference", "hand", "torch"):
            assert r[system] > 0 and r[f"{system}_bytes"] > 0, (r["model"], system)
        assert 0 <= r["torch_max_abs_diff"] < 1e-3 and 0 <= r["hand_max_abs_diff"] < 1e-3, r
    md = out.with_suffix(".md").read_text()
    assert "torch/PyG ms" in md and "jgnn / PyG" in md and "Command:" in md


def test_thunk_profile_names_the_compiled_programs_thunks():
    """`profile.thunk_profile` reads the JAX profiler's per-thunk events: the thunks it names are instructions of
    the compiled HLO, and the work it sums is time the call took on some thread."""
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.compare.profile import thunk_profile

    x = jnp.asarray(np.random.default_rng(0).standard_normal((512, 512)), jnp.float32)
    compiled = jax.jit(lambda a: jnp.tanh(a @ a @ a).sum(0)).lower(x).compile()
    names = set(re.findall(r"%([\w.\-]+) = ", compiled.as_text()))
    result = thunk_profile(lambda: jax.block_until_ready(compiled(x)), calls=2)
    assert result["top"] and {t["thunk"] for t in result["top"]} <= names
    assert result["wall_ms"] > 0 and 0 < result["work_ms"] <= result["wall_ms"] * (os.cpu_count() + 1)
