"""Deviceless GPU checks: compile every kernel and layer for Hopper GPUs on a machine without one.

* `targets`: the H100 and H200 as XLA compile-only devices;
* `toolchain`: the CUDA ``ptxas`` that XLA runs, wrapped so every PTX it assembles is kept, and its ``-v`` report;
* `deviceless`: one compile of one traced step for one target, with its Triton calls and per-kernel resources;
* `cases`: the kernel configurations (reductions, attention, gather_compute, typed matmul);
* `layers`: every `jgnn.nn` layer's training step, and the kernels each one should reach;
* `verdict`: failures (compile errors, spills, missing kernels), the JSON file and the readable tables;
* `venv`: the Python 3.12 virtualenvs with JAX and the CUDA 13 plugin (standard library only).

`benchmarks.gpu_check` is the command line.
"""
