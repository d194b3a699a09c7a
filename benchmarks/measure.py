"""Measurement helpers, one function each: timing, XLA memory / cost analysis, copy bandwidth, GPU peak
memory, and classification of failures into row statuses.

Method (shared by every suite): warm-up calls are excluded; the reported time is the median of
``repeats`` (>= 20 by default) timed calls, each ended by ``block_until_ready`` (JAX) or
``torch.cuda.synchronize`` (PyTorch).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def time_jax(fn: Callable, args: Sequence[Any], *, warmup: int = 2, repeats: int = 20) -> list[float]:
    """Wall-clock milliseconds of ``fn(*args)`` for each of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_torch(fn: Callable[[], Any], *, warmup: int = 2, repeats: int = 20) -> list[float]:
    """Like :func:`time_jax` for a zero-argument PyTorch callable, synchronizing CUDA around every call."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def summarize_times(times: Sequence[float]) -> dict[str, float]:
    """Median (the reported time), min and max in ms, and the number of timed runs."""
    return {"time_ms": statistics.median(times), "time_min_ms": min(times), "time_max_ms": max(times),
            "runs": len(times)}


def normalize_cost(cost: Any) -> dict[str, float]:
    """``Compiled.cost_analysis()`` as one flat dict: JAX returns a dict, a list of dicts (one per
    computation) or ``None`` depending on the version; lists are summed key by key."""
    if cost is None:
        return {}
    if isinstance(cost, dict):
        cost = [cost]
    total: dict[str, float] = {}
    for part in cost:
        for k, v in (part or {}).items():
            if isinstance(v, int | float):
                total[k] = total.get(k, 0.0) + float(v)
    return total


def xla_cost(compiled) -> dict[str, float | None]:
    """FLOPs and bytes accessed of a compiled executable (``None`` where XLA does not say: XLA's GPU cost analysis
    gives -2 bytes for a program with a Triton kernel, which made the micro tables' GB/s negative)."""
    try:
        cost = normalize_cost(compiled.cost_analysis())
    except Exception:  # noqa: BLE001 - some backends do not implement cost analysis
        cost = {}
    known = lambda v: v if v is not None and v >= 0 else None
    return {"flops": known(cost.get("flops")), "bytes_accessed": known(cost.get("bytes accessed"))}


def xla_memory(compiled) -> dict[str, int | None]:
    """XLA's buffer assignment for one executable: argument, output and temp bytes, and their total
    (``xla_bytes`` = argument + output + temp - alias: what the executable needs resident at once)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        m = None
    if m is None:
        return {"argument_bytes": None, "output_bytes": None, "temp_bytes": None, "xla_bytes": None}
    arg, out, tmp = int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.temp_size_in_bytes)
    alias = int(getattr(m, "alias_size_in_bytes", 0) or 0)
    return {"argument_bytes": arg, "output_bytes": out, "temp_bytes": tmp, "xla_bytes": arg + out + tmp - alias}


def device_memory_stats(device=None) -> dict[str, int]:
    """``device.memory_stats()`` or ``{}`` (CPU devices return ``None``)."""
    device = device or jax.devices()[0]
    try:
        return dict(device.memory_stats() or {})
    except Exception:  # noqa: BLE001
        return {}


def gpu_peak_bytes(device=None) -> int | None:
    """Process-wide ``peak_bytes_in_use`` of a JAX GPU (``None`` elsewhere). JAX cannot reset it, so it is
    a per-row figure only when each row runs in its own process (``--isolate``)."""
    return device_memory_stats(device).get("peak_bytes_in_use")


def copy_bandwidth(*, nbytes: int = 256 << 20, repeats: int = 20) -> float:
    """Measured device copy bandwidth in bytes/s: a jitted ``x + 1`` over ``nbytes`` of float32 reads and
    writes ``2 * nbytes``."""
    x = jnp.zeros((nbytes // 4,), jnp.float32)
    f = jax.jit(lambda v: v + 1.0)
    t = statistics.median(time_jax(f, (x,), warmup=2, repeats=repeats)) / 1e3
    del x
    return 2.0 * nbytes / t


def array_bytes(*trees) -> int:
    """Total bytes of every array leaf in ``trees`` (used for byte floors)."""
    return int(sum(np.asarray(x).nbytes if not hasattr(x, "nbytes") else x.nbytes
                   for t in trees for x in jax.tree_util.tree_leaves(t)))


def is_oom(exc: BaseException) -> bool:
    """XLA RESOURCE_EXHAUSTED, ``MemoryError`` or ``torch.cuda.OutOfMemoryError``."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ in ("OutOfMemoryError",):
        return True
    text = f"{type(exc).__name__}: {exc}"
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def status_of(exc: BaseException) -> str:
    """The row status for a failure: ``"OOM"`` or ``"error: <type>: <first line>"``."""
    if is_oom(exc):
        return "OOM"
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"error: {type(exc).__name__}: {first}"
