"""The training examples run end to end in ``--smoke`` mode and end with a JSON line."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _run(data_dir, tmp_path, script, *args, check=True):
    env = {**os.environ, "JGNN_DATA_DIR": str(data_dir), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    cmd = [sys.executable, str(EXAMPLES / script), *args]
    if script != "compile_jraph.py":
        cmd += ["--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 52 s of training on 2 cores: the slow tier keeps `make test` under 15 minutes
@pytest.mark.parametrize("args", [
    ("train.py", "--model", "gat", "--dataset", "cora"),
    ("train.py", "--model", "gcn", "--dataset", "citeseer", "--no-memory"),
    ("train_hetero.py", "--model", "rgcn", "--dataset", "aifb"),
], ids=["gat-cora", "gcn-citeseer", "rgcn-aifb"])
def test_training_smoke(data_dir, tmp_path, args):
    proc = _run(data_dir, tmp_path, *args, "--smoke", "--seed", "1")
    result = _last_json(proc)
    assert {"test_accuracy", "epochs", "seconds", "model", "dataset", "seed"} <= set(result)
    assert result["epochs"] == 3 and result["seed"] == 1 and 0.0 <= result["test_accuracy"] <= 1.0
    assert "compile report" in proc.stdout
    assert list(tmp_path.glob("*.png"))
    if "--no-memory" not in args:
        assert "memory" in proc.stdout


def test_pubmed_without_features_errors_clearly(data_dir, tmp_path):
    proc = _run(data_dir, tmp_path, "train.py", "--model", "gcn", "--dataset", "pubmed", "--smoke", check=False)
    assert proc.returncode != 0 and "--features random" in proc.stderr


def test_compile_jraph(data_dir, tmp_path):
    result = _last_json(_run(data_dir, tmp_path, "compile_jraph.py"))
    assert result["equal"] is True


@pytest.mark.slow
def test_accuracy_cora(data_dir):
    """Multi-minute: GCN and GAT on Cora reach the published accuracy (``examples/accuracy.py``)."""
    env = {**os.environ, "JGNN_DATA_DIR": str(data_dir)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "accuracy.py"), "--seeds", "0", "1", "2", "--only", "cora"],
                          capture_output=True, text=True, env=env, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


@pytest.mark.slow  # four trainings of a few epochs: about 2 minutes on 2 cores
@pytest.mark.parametrize("model, metric, chance", [
    ("jknet", "test_accuracy", 1 / 7), ("pinsage", "test_accuracy", 1 / 7), ("magnn", "test_accuracy", 1 / 4),
    ("pgnn", "test_auc", 1 / 2)])
def test_flexible_models_train(data_dir, model, metric, chance):
    """Each flexible-neighbourhood model of `train_flexible.py` trains on its real data (Cora, DBLP) and, after a
    few epochs, beats chance clearly: twice chance for the classifiers, an ROC AUC above 0.6 for P-GNN."""
    env = {**os.environ, "JGNN_DATA_DIR": str(data_dir), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "train_flexible.py"), "--model", model, "--epochs", "15",
                           "--seed", "0"], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _last_json(proc)
    assert result["model"] == model and result["epochs"] == 15
    assert np.isfinite(result["final_loss"])
    assert result[metric] > (0.6 if model == "pgnn" else 2 * chance), result
