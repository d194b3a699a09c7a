"""The graph classification and link prediction examples, the examples' README flags and the memory figures."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _run(data_dir, script, *args, timeout=600):
    env = {**os.environ, "JGNN_DATA_DIR": str(data_dir), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _readme_flags() -> dict[str, list[str]]:
    flags = {}
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        m = re.match(r"- `(\w+\.py)`: (.*)", line)
        if m:
            flags[m.group(1)] = re.findall(r"`(--[a-z][a-z-]*)", m.group(2))
    return flags


def _help_text(script: str, capsys) -> str:
    """``script --help``, run in this process (importing the example once is far cheaper than a subprocess)."""
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLES))
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        with pytest.raises(SystemExit):
            module.main(["--help"])
    finally:
        sys.path.remove(str(EXAMPLES))
        del sys.modules[spec.name]
    return capsys.readouterr().out


def test_readme_lists_every_script_and_only_real_flags(capsys):
    flags = _readme_flags()
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert set(flags) == scripts
    for script, listed in flags.items():
        assert listed, script
        real = set(re.findall(r"(--[a-z][a-z-]*)", _help_text(script, capsys))) - {"--help"}
        assert set(listed) == real, (script, sorted(set(listed) ^ real))


@pytest.mark.slow  # training runs: in the slow tier with the other example runs
def test_graph_classification_smoke(data_dir):
    proc = _run(data_dir, "graph_classification.py", "--dataset", "MUTAG", "--smoke", "--seed", "3", "--buckets", "2")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["folds"] == 2 and result["epochs"] == 2 and result["seed"] == 3
    assert 0.0 <= result["accuracy_mean"] <= 100.0 and len(result["fold_accuracies"]) == 2
    # padded buckets: the training step compiled at most once per bucket
    assert result["buckets"] <= 2 and 1 <= result["compiled_sizes"]["step"] <= result["buckets"]


@pytest.mark.slow  # training runs: in the slow tier with the other example runs
def test_link_prediction_smoke(data_dir):
    proc = _run(data_dir, "link_prediction.py", "--dataset", "nations", "--smoke", "--dim", "8",
                "--batch-size", "256")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["queries"] == 2 * 201  # every Nations test triple, as a tail and as a head query
    assert 0.0 < result["test_mrr"] <= 1.0
    assert result["test_hits@1"] <= result["test_hits@3"] <= result["test_hits@10"] <= 1.0


def test_memory_comparison_reports_more_or_less_as_measured():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import _common
    finally:
        sys.path.remove(str(EXAMPLES))
    x = jnp.ones((256,), jnp.float32)
    small = lambda x: jnp.sum(x)
    big = lambda x: jnp.sum(jnp.sin(x[:, None] * x[None, :]))  # a 256 x 256 temporary
    less = _common.memory_comparison(lambda b: small if b == "auto" else big, "auto", x)
    more = _common.memory_comparison(lambda b: big if b == "auto" else small, "auto", x)
    if less is None:
        pytest.fail("XLA reported no memory analysis on CPU")
    assert less["change_percent"] < 0 < more["change_percent"]
    assert less["jgnn_temp_mib"] < less["reference_temp_mib"]
