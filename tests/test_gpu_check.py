"""The gpu-check machinery that runs without a GPU or the CUDA plugin: parsing, verdicts, the ptxas wrapper."""

from __future__ import annotations

import os
import subprocess

import pytest

from benchmarks.gpu import cases, layers, toolchain, venv, verdict
from benchmarks.gpu.deviceless import triton_call_names
from pallas_kernels import compat

# ptxas -v as CUDA 13.0 prints it: a frame line only where ptxas has one to report, smem only when static.
PTXAS_V = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gnn_attention_bwd_src' for 'sm_90a'
ptxas info    : Function properties for gnn_attention_bwd_src
    400 bytes stack frame, 396 bytes spill stores, 384 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 96 bytes smem
ptxas info    : Compile time = 2104.5 ms
ptxas info    : Compiling entry function 'gnn_gather_reduce_sum__1' for 'sm_90a'
ptxas info    : Function properties for gnn_gather_reduce_sum__1
ptxas info    : Used 56 registers, used 1 barriers
"""


def test_parse_verbose_reads_every_entry_and_defaults_missing_lines_to_zero():
    bwd, red = toolchain.parse_verbose(PTXAS_V)
    assert bwd == toolchain.KernelResources("gnn_attention_bwd_src", registers=255, spill_stores=396, spill_loads=384,
                                            stack_frame=400, static_shared=96, barriers=1)
    assert bwd.spills
    assert red == toolchain.KernelResources("gnn_gather_reduce_sum__1", 56, 0, 0, 0, 0, 1)
    assert not red.spills


def test_triton_call_names_lists_every_kernel_of_a_lowered_step():
    step = next(c for c in cases.kernel_cases() if c.name == "gather_reduce/sum/w7/f32").build()
    text = compat.export_cuda_mlir(step.fn, *step.args)
    names = triton_call_names(text)
    assert len(names) == text.count(compat.TRITON_CUSTOM_CALL)
    assert "gnn_gather_reduce_sum" in names
    assert "gnn_gather_compute" in names  # the backward's per-edge cotangents


def test_triton_call_names_reads_optimized_hlo_lines():
    # the shape of an XLA optimized-HLO Triton call: metadata names (no spaces) before the backend config's name
    hlo = ('%pallas_call.2 = f32[64,64]{1,0} custom-call(%a, %b), custom_call_target="__gpu$xla.gpu.triton", '
           'metadata={op_name="jit(loss)/gnn_gather_reduce_sum/pallas_call" scheduling_name="pallas_call.2"}, '
           'backend_config={debug = false, grid_x = 64 : i32, ir = "ML\\EFR", name = "gnn_gather_reduce_sum", '
           'num_stages = 2 : i32}\n%add = f32[64,64]{1,0} add(%pallas_call.2, %b), metadata={op_name="x"}\n')
    assert triton_call_names(hlo) == ["gnn_gather_reduce_sum"]


def test_missing_kernels_counts_calls_by_prefix():
    calls = ["gnn_gather_reduce_sum", "gnn_gather_reduce_sum", "gnn_edge_fn_bwd_src"]
    assert layers.missing_kernels({"gnn_gather_reduce_sum": 2, "gnn_edge_fn_bwd": 1}, calls) == {}
    assert layers.missing_kernels({"gnn_gather_reduce_max": 1, "gnn_edge_fn_bwd": 2}, calls) == {
        "gnn_gather_reduce_max": {"expected": 1, "found": 0}, "gnn_edge_fn_bwd": {"expected": 2, "found": 1}}


def test_every_layer_has_an_expectation():
    assert set(layers.LAYERS) == set(layers.EXPECTED_KERNELS)
    assert all(layers.EXPECTED_KERNELS[name] for name in layers.LAYERS)


@pytest.mark.parametrize("name", list(layers.LAYERS))
def test_every_layer_training_step_lowers_to_its_kernels_for_cuda(name):
    """The gpu-check's layer cases at the CUDA lowering (layer 2, this JAX, no GPU venv): each `jgnn.nn` layer's
    training step emits at least the Triton calls `EXPECTED_KERNELS` names, so a layer that falls back to XLA
    (GINE's relu message before custom_jvp calls ran on tiles; one-head GAT's backward) fails here, in CI."""
    step = layers._train_step(layers.LAYERS[name])
    calls = triton_call_names(compat.export_cuda_mlir(step.fn, *step.args))
    assert layers.missing_kernels(layers.EXPECTED_KERNELS[name], calls) == {}, calls


def _kernel(name, stores=0, loads=0):
    return {"name": name, "registers": 64, "spill_stores": stores, "spill_loads": loads, "stack_frame": stores,
            "static_shared": 0, "barriers": 1, "dynamic_shared": 1024, "threads": 128, "grid": [16, 1, 1],
            "ptx_sha": "0" * 12}


def _record(case="c", kind="kernel", kernels=(), calls=("k",), error_code=None, missing=None):
    return {"case": case, "kind": kind, "family": "f", "params": {"expected": {}}, "target": "h100",
            "lowered_triton_calls": list(calls), "triton_calls": list(calls), "kernels": list(kernels),
            "seconds": 1.0, "error_code": error_code,
            "error": "boom" if error_code else None, "missing": missing or {}}


@pytest.mark.parametrize("record,codes", [
    (_record(kernels=[_kernel("k")]), []),
    (_record(kernels=[_kernel("k", stores=8), _kernel("j", loads=4)]), ["spill", "spill"]),
    (_record(error_code="compile_error"), ["compile_error"]),
    (_record(calls=()), ["no_kernel"]),
    (_record(kind="layer", calls=(), missing={"gnn_attention_fwd": {"expected": 1, "found": 0}}),
     ["missing_kernel"]),
])
def test_failures_have_one_code_per_fault(record, codes):
    assert [f.code for f in verdict.failures(record)] == codes


def test_report_summary_counts_spills_and_layers_missing_kernels():
    records = [_record(kernels=[_kernel("k", stores=8, loads=8)]),
               _record(case="layer/gat", kind="layer", missing={"gnn_attention_fwd": {"expected": 1, "found": 0}})]
    rep = verdict.report({"jax": "x", "ptxas": "y", "tier": "quick"}, records)
    s = rep["summary"]["h100"]
    assert (s["configurations"], s["spilling_kernels"], s["spill_bytes_max"]) == (2, 1, 16)
    assert s["layers_missing_kernels"] == ["layer/gat"]
    assert "| spill | c | h100 | k |" in verdict.markdown(rep)


def test_kernel_cases_cover_the_matrix_once_each():
    all_cases = cases.kernel_cases()
    assert len({c.name for c in all_cases}) == len(all_cases)
    per_family = {f: sum(c.family == f for c in all_cases) for f in ("gather_reduce", "gather_compute", "attention",
                                                                      "typed_matmul")}
    w, d, h = len(cases.WIDTHS), len(cases.DTYPES), len(cases.HEADS)
    assert per_family == {"gather_reduce": len(cases.REDUCTIONS) * w * d, "gather_compute": w * d,
                          "attention": h * w * d * len(cases.DROPOUT), "typed_matmul": w * d * 2}


def test_venv_requirements_pin_jax_and_add_the_cuda13_plugin():
    reqs = venv.requirements("0.12.0.1")
    assert "jax==0.12.0.1" in reqs and "jaxlib==0.12.0.1" in reqs
    assert "jax-cuda13-plugin==0.12.0.1" in reqs and "jax-cuda13-pjrt==0.12.0.1" in reqs
    assert not [r for r in reqs if r.startswith(("jax>", "jaxlib>"))]
    assert any(r.startswith("flax") for r in reqs)
    with pytest.raises(SystemExit, match="not a JAX release"):
        venv.requirements("latest")


def test_ptxas_wrapper_keeps_ptx_and_report_and_passes_the_exit_code(tmp_path, monkeypatch):
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    (root / "nvvm").mkdir()
    real = root / "bin" / "ptxas"
    real.write_text('#!/bin/sh\necho "ptxas info    : Used 7 registers, args $*" >&2\nexit 3\n')
    real.chmod(0o755)
    monkeypatch.setenv(toolchain.REAL_PTXAS_ENV, "unset")  # install_wrapper sets it; restored after the test
    cuda = toolchain.install_wrapper(toolchain.Toolchain(root, real, "test"), tmp_path / "wrapped")
    ptx, log_dir = tmp_path / "kernel", tmp_path / "log"
    ptx.write_text(".target sm_90a\n")
    log_dir.mkdir()
    env = {**os.environ, toolchain.PTX_LOG_ENV: str(log_dir)}
    proc = subprocess.run([str(cuda / "bin" / "ptxas"), str(ptx), "-o", str(tmp_path / "out.cubin")], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 3
    assert "Used 7 registers, args -v " in proc.stderr
    [kept] = log_dir.glob("*.ptx")
    assert kept.read_text() == ".target sm_90a\n"
    assert "Used 7 registers" in kept.with_suffix(".log").read_text()
    env.pop(toolchain.PTX_LOG_ENV)
    subprocess.run([str(cuda / "bin" / "ptxas"), str(ptx)], env=env, capture_output=True)
    assert len(list(log_dir.iterdir())) == 2  # without $JGNN_PTX_LOG nothing more is kept
