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


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def data_dir() -> pathlib.Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"data directory {DATA_DIR} not found; set JGNN_DATA_DIR")
    return DATA_DIR
