"""Pallas (Triton) GNN kernels for jgnn: fused gather/reduce, edge-softmax attention, SDDMM, typed matmul.

Forward entry points (what jgnn's primitives lower to; derivatives are other calls of the same kernels):
:func:`gather_reduce_forward`, :func:`gather_compute_forward`, :func:`attention_forward` (and the per-head
:func:`head_reduce_forward`, :func:`head_compute_forward` that attention's backward runs), each with a pure-jnp
``*_reference`` that defines its semantics. Differentiable wrappers with custom VJPs for standalone use:
:func:`gather_reduce`, :func:`gather_compute`, :func:`attention_aggregate`, :func:`typed_matmul`.
:func:`describe_schedule` reports how a kernel would walk a CSR (computed on the host, no kernel runs).
``interpret=True`` runs the Pallas interpreter (CPU). All JAX/Pallas version differences live in
:mod:`pallas_kernels.compat`. This package imports nothing from jgnn.
"""
from pallas_kernels import compat
from pallas_kernels.attention import (
    attention_aggregate,
    attention_aggregate_reference,
    attention_forward,
    attention_forward_reference,
)
from pallas_kernels.csr import CSR, build_csr_jax, build_csr_numpy
from pallas_kernels.dropout import edge_dropout_keep
from pallas_kernels.gather_compute import (
    gather_compute,
    gather_compute_forward,
    gather_compute_forward_reference,
    gather_compute_reference,
)
from pallas_kernels.gather_reduce import (
    REDUCTIONS,
    gather_reduce,
    gather_reduce_forward,
    gather_reduce_forward_reference,
    gather_reduce_reference,
)
from pallas_kernels.head_reduce import head_compute_forward, head_reduce_forward
from pallas_kernels.typed_matmul import AUTO_IMPL, AUTO_IMPL_REASON, auto_impl, typed_matmul, typed_matmul_reference

__all__ = [
    "AUTO_IMPL", "AUTO_IMPL_REASON", "CSR", "REDUCTIONS", "attention_aggregate", "attention_aggregate_reference",
    "auto_impl", "attention_forward", "attention_forward_reference", "build_csr_jax", "build_csr_numpy", "compat",
    "edge_dropout_keep", "gather_compute", "gather_compute_forward", "gather_compute_forward_reference",
    "gather_compute_reference", "gather_reduce", "gather_reduce_forward", "gather_reduce_forward_reference",
    "gather_reduce_reference", "head_compute_forward", "head_reduce_forward", "typed_matmul",
    "typed_matmul_reference",
]
