"""Pallas (Triton) GNN kernels for jgnn: fused gather/reduce, edge-softmax attention, SDDMM, typed matmul.

Forward kernels only: :func:`gather_reduce_forward`, :func:`gather_compute_forward`, :func:`attention_forward`
and the per-head :func:`head_reduce_forward`, :func:`head_compute_forward`, each with a pure-jnp
``*_reference`` that defines what the kernel computes. Derivatives are jgnn's: every derivative of a fused op is
another fused op (jgnn's edge-op JVP and transpose rules), which jgnn lowers to these same kernels, so a
gradient has one definition, whatever runs it. :func:`typed_matmul` is linear, and its VJP is two more typed
matmuls. :func:`describe_schedule` reports how a kernel would walk a CSR (computed on the host, no kernel runs).
``interpret=True`` runs the Pallas interpreter (CPU). All JAX/Pallas version differences live in
:mod:`pallas_kernels.compat`. This package imports nothing from jgnn.
"""
from pallas_kernels import compat
from pallas_kernels.attention import attention_forward, attention_forward_reference
from pallas_kernels.csr import CSR, build_csr_jax, build_csr_numpy
from pallas_kernels.dropout import edge_dropout_keep
from pallas_kernels.gather_compute import gather_compute_forward, gather_compute_forward_reference
from pallas_kernels.gather_reduce import REDUCTIONS, gather_reduce_forward, gather_reduce_forward_reference
from pallas_kernels.head_reduce import head_compute_forward, head_reduce_forward
from pallas_kernels.typed_matmul import AUTO_IMPL, AUTO_IMPL_REASON, auto_impl, typed_matmul, typed_matmul_reference

__all__ = [
    "AUTO_IMPL", "AUTO_IMPL_REASON", "CSR", "REDUCTIONS", "attention_forward", "attention_forward_reference",
    "auto_impl", "build_csr_jax", "build_csr_numpy", "compat", "edge_dropout_keep", "gather_compute_forward",
    "gather_compute_forward_reference", "gather_reduce_forward", "gather_reduce_forward_reference",
    "head_compute_forward", "head_reduce_forward", "typed_matmul", "typed_matmul_reference",
]
