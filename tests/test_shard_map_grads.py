"""Compiled layers inside `jax.shard_map` with the varying-axes checks on, on 2 devices: their gradients equal the
reference's (tests/vma_check.py, in a subprocess with 2 forced host devices; the main test process has one).

On one device a missing or extra ``psum`` over the mesh axis is the identity, so only 2+ devices show it: an edge
op's pullback that summed every device's cotangents (RGCN's mean, relative error ~1), a pullback whose zeros did
not vary like its cotangents (a crash for sum), and JAX's Pallas interpreter mixing varying blocks with grid
indices (a crash on every pallas_interpret kernel).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOL = 1e-5  # float32


def test_grads_under_checked_shard_map_on_2_devices_equal_reference():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "vma_check.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    cases = sorted((r["aggr"], r["backend"], r["mode"]) for r in results)
    assert cases == sorted([(a, b, "grad") for a in ("sum", "scaled", "mean") for b in ("xla", "pallas_interpret")]
                           + [(a, "xla", "vmap") for a in ("sum", "scaled")])
    for r in results:
        assert "error" not in r, r
        assert r["grad_w"] <= TOL and r["grad_x"] <= TOL, r
