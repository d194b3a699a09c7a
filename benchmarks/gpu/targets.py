"""The GPUs the check compiles for, as XLA compile-only devices (``jax.experimental.topologies``).

XLA's GPU compiler reads the target from a ``GpuTargetConfigProto`` (text format) instead of a live device: the
compute capability picks the PTX target (``sm_90a`` for both Hopper parts), and the SM count, shared memory and
memory figures feed its fusion and launch decisions. The figures below are the parts' published ones and what
the lent machines reported (KINDS.md: 132 SMs on both; 81,559 MiB on the H100, 143,771 MiB on the H200; 50 and
60 MB of L2).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class GpuTarget:
    name: str
    device_kind: str  # what the device reports, and what the Pallas lowering maps to a compute capability
    sm_count: int
    memory_bytes: int
    bandwidth_bytes_per_s: float
    l2_bytes: int
    clock_ghz: float = 1.98
    compute_capability: tuple[int, int] = (9, 0)
    shared_per_sm: int = 228 * 1024
    shared_per_block_optin: int = 227 * 1024


TARGETS: dict[str, GpuTarget] = {
    "h100": GpuTarget("h100", "NVIDIA H100 80GB HBM3", 132, 81_559 * MIB, 3.35e12, 50 * MIB),
    "h200": GpuTarget("h200", "NVIDIA H200", 132, 143_771 * MIB, 4.8e12, 60 * MIB),
}

# The CUDA runtime and cuDNN the compile-only client assumes; the CUDA 13 plugin needs a 13.x runtime.
CUDA_RUNTIME = (13, 0)
CUDNN = (9, 10)


def target_config(t: GpuTarget) -> str:
    """``t`` as the text-format ``GpuTargetConfigProto`` that the CUDA PJRT plugin's topology reads."""
    major, minor = t.compute_capability
    info = {
        "threads_per_block_limit": 1024, "threads_per_warp": 32, "shared_memory_per_block": 48 * 1024,
        "shared_memory_per_core": t.shared_per_sm, "threads_per_core_limit": 2048, "core_count": t.sm_count,
        "fpus_per_core": 128, "block_dim_limit_x": 2**31 - 1, "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535, "memory_bandwidth": int(t.bandwidth_bytes_per_s), "l2_cache_size": t.l2_bytes,
        "clock_rate_ghz": t.clock_ghz, "device_memory_size": t.memory_bytes,
        "shared_memory_per_block_optin": t.shared_per_block_optin, "registers_per_core_limit": 65536,
        "registers_per_block_limit": 65536,
    }
    fields = "\n".join(f"  {k}: {v}" for k, v in info.items())
    return (f"gpu_device_info {{\n{fields}\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
            f"runtime_version {{ major: {CUDA_RUNTIME[0]} minor: {CUDA_RUNTIME[1]} patch: 0 }}\n"
            f'platform_name: "CUDA"\n'
            f"dnn_version_info {{ major: {CUDNN[0]} minor: {CUDNN[1]} }}\n"
            f'device_description_str: "{t.device_kind}"\n')


def compile_only_device(t: GpuTarget):
    """One compile-only ``jax.Device`` for ``t`` (needs the CUDA PJRT plugin installed, not a GPU)."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(t.name, "cuda", target_config=target_config(t), topology="1x1x1")
    [device] = topology.devices
    if device.device_kind != t.device_kind:
        raise RuntimeError(f"compile-only device reports {device.device_kind!r}, expected {t.device_kind!r}")
    return device
