"""The README's examples run as written and do what the README says they do.

Each Python block that follows a ``<!-- test: NAME -->`` line in README.md is executed on its own, with
``$JGNN_DATA_DIR`` set to the test data directory, and then ``CHECKS[NAME]`` inspects what it left behind.
Tracebacks point at README.md's own line numbers.
"""

from __future__ import annotations

import math
import pathlib
import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import tree_close

import jgnn

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^<!-- test: ([\w-]+) -->\n```python\n(.*?)^```$", re.S | re.M)


def readme_blocks(text: str) -> dict[str, tuple[int, str]]:
    """``{name: (line number of the block's first code line, code)}`` of every marked block."""
    blocks = {}
    for m in BLOCK.finditer(text):
        name = m.group(1)
        if name in blocks:
            raise ValueError(f"README.md: two blocks are marked '<!-- test: {name} -->'")
        blocks[name] = (text.count("\n", 0, m.start(2)) + 1, m.group(2))
    return blocks


def check_first_model(ns: dict) -> None:
    assert math.isfinite(float(ns["loss"]))
    # Cora has 7 classes (the largest is 30% of the nodes); the GCN paper reports 81.5%. A trained model is far
    # above chance; a broken one (no training, wrong labels or masks) is not.
    accuracy = float(ns["accuracy"](ns["params"], ns["graph"], ns["test_mask"]))
    assert accuracy > 0.7, accuracy


def check_custom_layer(ns: dict) -> None:
    params, graph, layer = ns["params"], ns["graph"], ns["gat_layer"](ns["params"])
    h, d = params["a_src"].shape
    out = ns["forward"](params, graph).nodes
    assert out.shape == (graph.nodes.shape[0], h * d)
    tree_close(out, layer.reference(graph).nodes, what="compiled layer vs its reference program")
    assert jax.tree_util.tree_structure(ns["grads"]) == jax.tree_util.tree_structure(params)
    want = jax.grad(lambda p: jnp.sum(ns["gat_layer"](p).reference(graph).nodes ** 2))(params)
    tree_close(ns["grads"], want, what="grad vs the reference program's")
    # What the README's explain excerpt shows: the attention is fused, and the weight matmuls moved to the nodes.
    report = ns["report"]
    assert report.codes(jgnn.Pass.FUSE, applied=True) == [jgnn.Reason.FUSED_ATTENTION]
    lifted = [dec for dec in report.rewrites if dec.code == jgnn.Reason.LIFTED]
    assert {dec.get("op") for dec in lifted} >= {"dot_general"}
    assert [(k.op, k.backend) for k in report.kernels] == [("attention", "xla")]
    assert not report.fallbacks


CHECKS = {"first-model": check_first_model, "custom-layer": check_custom_layer}


def test_blocks_are_found():
    text = "intro\n<!-- test: a -->\n```python\nx = 1\n\ny = 2\n```\n\n```python\nz = 3\n```\n"
    assert readme_blocks(text) == {"a": (4, "x = 1\n\ny = 2\n")}
    with pytest.raises(ValueError, match="two blocks"):
        readme_blocks(text + "<!-- test: a -->\n```python\nw = 0\n```\n")


def test_every_marked_block_has_a_check():
    assert set(readme_blocks(README.read_text())) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_readme_block(name, data_dir, monkeypatch):
    monkeypatch.setenv("JGNN_DATA_DIR", str(data_dir))
    line, code = readme_blocks(README.read_text())[name]
    module = types.ModuleType(f"readme_{name.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # Flax modules are dataclasses: they look it up
    np.random.seed(0)  # the blocks seed jax themselves; this pins anything that draws from numpy's global state
    exec(compile("\n" * (line - 1) + code, str(README), "exec"), module.__dict__)  # noqa: S102 - the README is ours
    CHECKS[name](module.__dict__)
