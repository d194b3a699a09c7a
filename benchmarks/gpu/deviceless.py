"""Compile one traced step for one compile-only GPU and read back what each Triton kernel costs.

The step is lowered for CUDA under an abstract mesh on the target's device kind (the Pallas Triton lowering
reads the compute capability from it), compiled by XLA for the compile-only device, and then:
* its Triton custom calls are read from the lowered StableHLO and from XLA's optimized HLO (their ``name``);
* the ptxas wrapper (`toolchain`) keeps each PTX that XLA assembled and ``ptxas -v``'s report on it: registers,
  spills and static shared memory for each entry function named after a Triton call;
* launch sizes and dynamic shared memory come from XLA's thunk-sequence dump.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import jax

from benchmarks.gpu import toolchain
from benchmarks.gpu.targets import GpuTarget
from pallas_kernels import compat


@dataclass(frozen=True)
class Step:
    """``fn(*args)`` to compile; ``args`` are ``jax.ShapeDtypeStruct`` pytrees (constants live in ``fn``)."""

    fn: Callable[..., Any]
    args: tuple


@dataclass
class Kernel:
    """One Triton kernel of a compiled step. Sizes in bytes; ``None`` where XLA's dump did not say."""

    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_shared: int
    barriers: int
    dynamic_shared: int | None
    threads: int | None
    grid: list[int] | None
    ptx_sha: str  # first 12 hex digits of the PTX file's sha256: equal PTX on two targets, same machine code

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass
class Compiled:
    """The outcome of one compile: ``error_code`` is None, or the stage that failed.

    ``lowered_triton_calls`` are the Triton calls JAX emitted; ``triton_calls`` those left in XLA's optimized
    module (dead ones removed), i.e. the kernels the step launches. Until the compile succeeds they are equal.
    """

    lowered_triton_calls: list[str] = field(default_factory=list)
    triton_calls: list[str] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    seconds: float = 0.0
    error_code: str | None = None  # "lowering_error" | "compile_error" | "ptxas_error" | "no_ptx"
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


_TRITON_NAME = re.compile(re.escape(compat.TRITON_CUSTOM_CALL) + r".*?\bname = \"([^\"]+)\"")
_THUNK = re.compile(r"(\w+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+shared_memory: (\d+) bytes")


def triton_call_names(module_text: str) -> list[str]:
    """The ``name`` of every Triton custom call in StableHLO or HLO text, in program order."""
    return _TRITON_NAME.findall(module_text)


def _launches(dump: pathlib.Path) -> dict[str, tuple[list[int], int, int]]:
    """kernel name -> (grid, threads per block, dynamic shared bytes), from XLA's thunk-sequence dumps."""
    out: dict[str, tuple[list[int], int, int]] = {}
    for path in sorted(dump.glob("*thunk_sequence*.txt")):
        for m in _THUNK.finditer(path.read_text()):
            grid = [int(v) for v in m.group(2).split(",")]
            threads = 1
            for v in m.group(3).split(","):
                threads *= int(v)
            out[m.group(1)] = (grid, threads, int(m.group(4)))
    return out


def _belongs(entry: str, names: set[str]) -> bool:
    """XLA names a kernel after its Triton call, with ``__N`` appended when several calls share a name."""
    return entry in names or re.sub(r"_+\d+$", "", entry) in names


def _short(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text if len(text) <= 3000 else text[:1500] + "\n...\n" + text[-1500:]


def _kernels(ptx_dir: pathlib.Path, names: set[str], dump: pathlib.Path) -> list[Kernel]:
    launches = _launches(dump)
    kernels: dict[str, Kernel] = {}
    for ptx in sorted(ptx_dir.glob("*.ptx")):
        if not any(_belongs(e, names) for e in toolchain.ptx_entries(ptx)):
            continue  # XLA's own fusions
        sha = hashlib.sha256(ptx.read_bytes()).hexdigest()[:12]
        for r in (r for r in toolchain.report(ptx) if _belongs(r.name, names)):
            grid, threads, dynamic = launches.get(r.name, (None, None, None))
            kernels[r.name] = Kernel(r.name, r.registers, r.spill_stores, r.spill_loads, r.stack_frame,
                                     r.static_shared, r.barriers, dynamic, threads, grid, sha)
    return [kernels[k] for k in sorted(kernels)]


def compile_step(step: Step, target: GpuTarget, device, cuda_dir: pathlib.Path) -> Compiled:
    """Lower and compile ``step`` for ``target`` (its compile-only ``device``); never raises for the step's faults."""
    result = Compiled()
    start = time.perf_counter()
    sharding = jax.sharding.SingleDeviceSharding(device)
    jitted = jax.jit(step.fn, in_shardings=sharding, out_shardings=sharding)
    try:
        with jax.sharding.use_abstract_mesh(compat.abstract_gpu_mesh(target.device_kind, target.sm_count)):
            lowered = jitted.trace(*step.args).lower(lowering_platforms=("cuda",))
        result.lowered_triton_calls = result.triton_calls = triton_call_names(lowered.as_text())
    except Exception as exc:  # the step's own fault: recorded, and the check goes on
        result.error_code, result.error = "lowering_error", _short(exc)
        result.seconds = time.perf_counter() - start
        return result
    with tempfile.TemporaryDirectory(prefix="jgnn-gpu-check-") as tmp:
        dump, ptx_dir = pathlib.Path(tmp, "dump"), pathlib.Path(tmp, "ptx")
        ptx_dir.mkdir()
        os.environ[toolchain.PTX_LOG_ENV] = str(ptx_dir)
        try:
            options = {"xla_dump_to": str(dump), "xla_gpu_cuda_data_dir": str(cuda_dir)}
            result.triton_calls = triton_call_names(lowered.compile(compiler_options=options).as_text())
        except Exception as exc:
            result.error_code, result.error = "compile_error", _short(exc)
        finally:
            os.environ.pop(toolchain.PTX_LOG_ENV, None)
        if result.error_code is None:
            try:
                result.kernels = _kernels(ptx_dir, set(result.triton_calls), dump)
            except (OSError, ValueError) as exc:
                result.error_code, result.error = "ptxas_error", _short(exc)
    unseen = sorted({n for n in result.triton_calls if not any(_belongs(k.name, {n}) for k in result.kernels)})
    if result.error_code is None and unseen:
        result.error_code, result.error = "no_ptx", f"no PTX was captured for Triton kernel(s) {', '.join(unseen)}"
    result.seconds = time.perf_counter() - start
    return result
