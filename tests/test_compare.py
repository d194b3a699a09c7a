"""CI tier of the CPU comparison (``python -m benchmarks.compare --quick``): every row of the quick suite runs and
is ``ok``, i.e. it did not raise and its losses (training) or logits (inference) agree with the hand-written
system's within `measure.LOSS_RTOL`.

The suite runs once per module, in this process, on tiny synthetic graphs (no data set needed). Its timings are not
results and nothing here asserts one. The jgnn, hand and jraph rows always run; the PyG rows (single-threaded: the
2-thread system is the same code) only where torch and torch_geometric are installed (the ``[bench]`` extra).
"""
import importlib.util
import json

import pytest

from benchmarks.compare import cases, cli, measure
from benchmarks.compare.runner import Runner

# Minutes of XLA compiles: CI runs it as its own step (`make test-slow`).
pytestmark = pytest.mark.slow

HAVE_PYG = all(importlib.util.find_spec(m) is not None for m in ("torch", "torch_geometric"))
SYSTEMS = ("jgnn", "hand", "jraph", *(("pyg1",) if HAVE_PYG else ()))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    code = cli.main(["--quick", "--out-dir", str(out), "--name", "quick", "--systems", ",".join(SYSTEMS)])
    return code, json.loads((out / "quick.json").read_text())["rows"], out


def _expected(pyg: bool) -> set[tuple[str, str]]:
    return {(c.key, s) for c in cases.QUICK for s in c.select(SYSTEMS) if s.startswith("pyg") == pyg}


def _check(rows: list[dict], pyg: bool) -> None:
    mine = [r for r in rows if r["system"].startswith("pyg") == pyg]
    assert {(r["case"], r["system"]) for r in mine} == _expected(pyg)
    bad = {(r["case"], r["system"]): r["status"] for r in mine if r["status"] != "ok"}
    assert not bad, bad
    for r in mine:
        assert r["time_ms"] > 0 and r["memory_bytes"] > 0, r
        assert set(r["rel_error"]) == ({"first", "second"} if r["mode"] == "train" else {"first", "logits"}), r


def test_quick_jax_rows_are_ok(quick):
    _check(quick[1], pyg=False)


@pytest.mark.pyg
def test_quick_pyg_rows_are_ok(quick):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    _check(quick[1], pyg=True)


def test_quick_exits_zero_and_writes_the_report(quick):
    code, rows, out = quick
    assert code == 0
    assert (out / "quick.png").stat().st_size > 0
    assert all(f"| {r['case']} | {r['system']} | ok |" in (out / "quick.md").read_text() for r in rows)


def _runner(losses, logits=None) -> Runner:
    return Runner("x", lambda: None, info={"losses": losses, **({} if logits is None else {"logits": logits})})


def test_a_loss_that_disagrees_makes_the_row_an_error():
    """The check that turns a row into an error: the second step's loss off by 1e-2 (relative) is caught, a 1e-6
    difference is not; the reference agrees with itself."""
    base = [2.0, 1.5]
    runners = {"hand": _runner(base), "close": _runner([2.0 * (1 + 1e-6), 1.5]), "far": _runner([2.0, 1.5 * 1.01])}
    errors = measure.agreement(runners)
    assert errors["hand"] == {"first": 0.0, "second": 0.0}
    assert measure.disagreement(errors["hand"]) is None
    assert measure.disagreement(errors["close"]) is None
    assert measure.disagreement(errors["far"]).startswith("error:")


def test_logits_that_disagree_make_an_inference_row_an_error():
    import numpy as np

    ref = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
    off = ref.copy()
    off[1, 0] += 4.0 * 1e-3  # 1e-3 of the largest logit
    errors = measure.agreement({"hand": _runner([1.0], ref), "off": _runner([1.0], off)})
    assert errors["hand"]["logits"] == 0.0
    assert errors["off"]["logits"] == pytest.approx(1e-3, rel=1e-3)
    assert measure.disagreement(errors["off"]).startswith("error:")


def test_loop_ids_probe_runs_and_both_emissions_agree(capsys):
    from benchmarks.compare import loop_ids

    loop_ids.main(["gcn/rmat-600/train", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "concatenate vs update_slices: 0.0e+00" in out
    assert sum(line.split()[0] in ("concatenate", "update_slices", "hand") for line in out.splitlines()) == 6
