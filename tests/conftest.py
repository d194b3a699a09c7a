"""Shared fixtures: random graphs with the awkward cases every rewrite and kernel must survive."""
import os
import pathlib

import jax
import pytest
from hypothesis import settings

jax.config.update("jax_enable_x64", False)
# Property tests draw the same examples every run: a failure reproduces, and CI never flakes on a new draw.
settings.register_profile("jgnn", derandomize=True, database=None)
settings.load_profile("jgnn")

_SIBLING_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
DATA_DIR = pathlib.Path(os.environ.get("JGNN_DATA_DIR", _SIBLING_DATA))


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


# On a GPU, XLA and the Pallas Triton kernels multiply float32 matrices in TF32 by default (10 mantissa bits), and a
# rewrite that moves a product (linear splitting, reassociation) rounds other operands: the suite's float32
# tolerances assume IEEE products, so it asks for them. TF32 itself is checked by the benchmarks, not here.
if has_gpu():
    jax.config.update("jax_default_matmul_precision", "highest")


# The fast tier's slowest tests run in the slow tier instead, so that `make test` stays within 12 minutes on CI's 2
# cores; `make test-slow` still runs each of them in CI (the file says how they were chosen).
MOVED_TO_SLOW_TIER = frozenset(
    line for line in (pathlib.Path(__file__).with_name("slow_tier.txt")).read_text().splitlines()
    if line and not line.startswith("#"))


def _beyond_each_value_once(items) -> list:
    """The fast tier runs each parameter value of a parametrized test once (unless tests/slow_tier.txt moves the
    case that brought it); the rest of the cross product runs in the slow tier. In collection order, a case stays
    fast when it brings a value (of any argument) that no earlier fast case of its test had: with ``name`` x
    ``backend``, every name and every backend is run, but not every pair."""
    seen: dict[str, set] = {}
    moved = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or item.get_closest_marker("slow") is not None:
            continue
        values = {(arg, repr(value)) for arg, value in callspec.params.items()}
        covered = seen.setdefault(item.nodeid.split("[")[0], set())
        if values <= covered:
            moved.append(item)
        covered |= values
    return moved


def pytest_collection_modifyitems(config, items):
    files = {item.nodeid.split("::")[0] for item in items}
    collected = {item.nodeid for item in items}
    stale = sorted(i for i in MOVED_TO_SLOW_TIER if i.split("::")[0] in files and i not in collected)
    chosen = config.getoption("-k") or config.getoption("deselect") or any("::" in a for a in config.args)
    if stale and not chosen:
        raise pytest.UsageError(f"tests/slow_tier.txt names tests that no longer exist: {stale}")
    # the listed tests move after the cover is taken: a value that only they brought is not made up by another case
    for item in _beyond_each_value_once(items) + [item for item in items if item.nodeid in MOVED_TO_SLOW_TIER]:
        item.add_marker(pytest.mark.slow)
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# JGNN_TEST_INTERPRET_ON_GPU=1 on a GPU machine: every "pallas_interpret" test runs the real (Triton) kernels
# instead, so the suite's reference comparisons check the compiled kernels too (benchmarks/gpu_session.sh).
INTERPRET_ON_GPU = os.environ.get("JGNN_TEST_INTERPRET_ON_GPU") == "1"


@pytest.fixture(autouse=INTERPRET_ON_GPU)
def pallas_interpret_runs_real_kernels(monkeypatch):
    from jgnn.ops import edge_op

    if not has_gpu():
        pytest.fail("JGNN_TEST_INTERPRET_ON_GPU=1 needs a CUDA GPU")
    monkeypatch.setitem(edge_op.INTERPRET, "pallas_interpret", False)


@pytest.fixture
def data_dir() -> pathlib.Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"data directory {DATA_DIR} not found; set JGNN_DATA_DIR")
    return DATA_DIR
