"""jgnn.distributed: partition quality records, per-part halo graphs, the strategy cost model, and (in
subprocesses with forced host devices) GAT and RGCN forward and gradients on 2/4/8 devices and on 2 processes
equal to one device."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jraph
import numpy as np
import pytest

from jgnn import distributed
from jgnn.report import Reason

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _graph(seed: int = 0, n: int = 60, e: int = 300) -> jraph.GraphsTuple:
    rng = np.random.default_rng(seed)
    s, r = rng.integers(0, n - 5, e), rng.integers(0, n - 5, e)  # the last 5 nodes are isolated
    s[:40] = 2  # a hub
    return jraph.GraphsTuple(nodes=rng.normal(size=(n, 3)).astype(np.float32), edges=np.arange(e, dtype=np.int32),
                             senders=s.astype(np.int32), receivers=r.astype(np.int32), n_node=np.array([n]),
                             n_edge=np.array([e]), globals=None)


@pytest.mark.parametrize("method", ["ldg", "metis"])
def test_partition_covers_every_node_and_counts_the_cut(method):
    if method == "metis" and not distributed.metis_available():
        pytest.skip("pymetis is not installed (the 'distributed' extra)")
    g = _graph()
    part = distributed.partition(g, 4, method=method)
    a, st = part.assignment, part.stats
    assert a.shape == (60,) and a.min() >= 0 and a.max() < 4
    cut = int(np.sum(a[g.senders] != a[g.receivers]))
    assert st.method == method and st.edge_cut == cut and sum(st.sizes) == 60 and sum(st.edges) == 300
    assert st.node_imbalance == pytest.approx(max(st.sizes) / 15)
    assert st.cut_fraction < 0.75  # better than random assignment's expected 3/4


def test_partition_rejects_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        distributed.partition(_graph(), 2, method="spectral")
    with pytest.raises(ValueError, match="num_parts"):
        distributed.partition(_graph(), 0)


@pytest.mark.parametrize("parts", [1, 3])
def test_local_graphs_hold_each_edge_once_with_its_true_endpoints(parts):
    g = _graph(1)
    pg = distributed.build_parts(g, distributed.partition(g, parts, method="ldg"))
    padded_ids = np.asarray(pg.to_padded(np.arange(60) + 1))  # 0 marks an unused row
    seen = []
    for p in range(parts):
        local_rows = np.concatenate([padded_ids[p * pg.owned:(p + 1) * pg.owned], padded_ids[pg.halo_rows[p]], [0]])
        for k in range(pg.edges):
            s, r, eid = pg.senders[p, k], pg.receivers[p, k], pg.edge_order[p, k]
            if eid < 0:  # padding edges: the padding node to itself
                assert s == r == pg.padding_node
                continue
            assert r < pg.owned and local_rows[s] - 1 == g.senders[eid] and local_rows[r] - 1 == g.receivers[eid]
            seen.append(eid)
    assert sorted(seen) == list(range(300))
    np.testing.assert_array_equal(np.asarray(pg.from_padded(pg.to_padded(g.nodes))), g.nodes)
    assert pg.halo >= max(pg.stats.halo) and tuple(pg.n_edge) == pg.stats.edges


def test_strategy_picks_the_cheaper_crossing_and_says_why():
    g = _graph(2)
    pg = distributed.build_parts(g, distributed.partition(g, 4, method="ldg"))
    wide_in = distributed.choose(pg, layer="l", in_width=1000, out_width=1, partials_supported=True)
    assert wide_in.code == Reason.SEND_PARTIAL_AGGREGATES and wide_in.partial_bytes < wide_in.source_bytes
    opaque = distributed.choose(pg, layer="l", in_width=1000, out_width=1)
    assert opaque.code == Reason.PARTIALS_NEED_AGGREGATE and opaque.strategy == "source"
    wide_out = distributed.choose(pg, layer="l", in_width=1, out_width=1000, partials_supported=True)
    assert wide_out.code == Reason.SEND_SOURCE_ROWS and wide_out.source_bytes == sum(pg.stats.halo) * 4


def _run(args: list[str], env_extra: dict, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **env_extra)
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


PARTIALS = ("partial_sum", "partial_max", "partial_min", "partial_softmax")


def _check_devices(parts: list[int], models: str, **env) -> None:
    env = {"JGNN_CHECK_MODELS": models, **env}
    proc = _run([str(ROOT / "tests" / "distributed_check.py"), *map(str, parts)], env, 600)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    names = [m for m in ("gat", "rgcn") if m in models] + list(PARTIALS if "partial" in models else ())
    assert sorted((r["model"], r["parts"]) for r in results) == sorted((m, p) for m in names for p in parts)
    for r in results:
        assert max(r["errors"].values()) <= 1e-5, r


def test_gat_and_rgcn_on_4_devices_equal_one_device():
    """Strategy (a), halo source rows, for compiled layers: outputs and gradients equal one device to 1e-5."""
    _check_devices([4], "gat,rgcn")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["auto", "ldg"])
def test_gat_and_rgcn_on_2_and_8_devices_equal_one_device(method):
    _check_devices([2, 8], "gat,rgcn", JGNN_CHECK_METHOD=method)


@pytest.mark.slow
def test_partial_aggregates_equal_one_device():
    """Strategy (b): sum/max/min and softmax-weighted sums sent as partials, on 2/4/8 devices, to 1e-5."""
    _check_devices([2, 4, 8], "partial")


def _free_port() -> int | None:
    import socket

    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError:
        return None


@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_device():
    """jax.distributed on loopback: 2 processes × 4 CPU devices, GAT and RGCN loss and grads vs one device."""
    port = _free_port()
    if port is None:
        pytest.skip("no loopback port can be opened here")
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    script = str(ROOT / "tests" / "distributed_multiprocess.py")
    procs = [subprocess.Popen([sys.executable, script, str(i), "2", f"127.0.0.1:{port}"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=180))
    except subprocess.TimeoutExpired:
        pytest.fail("the 2-process run did not finish in 180 s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs, strict=True):
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert p.returncode == 0 and lines, out + err[-3000:]
        assert lines[0]["devices"] == 8 and max(lines[0]["errors"].values()) <= 1e-5, lines


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gat", "rgcn"])
def test_train_distributed_example_losses_equal_one_device(data_dir, model):
    """examples/train_distributed.py on 8 forced devices: it exits 1 when a loss differs from one device's by more
    than 1e-5 (relative)."""
    proc = _run([str(ROOT / "examples" / "train_distributed.py"), "--model", model, "--devices", "8", "--steps", "3"],
                {"JGNN_DATA_DIR": str(data_dir)}, 900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
