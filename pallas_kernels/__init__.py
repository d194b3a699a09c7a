"""Pallas (Triton) GNN kernels for jgnn: fused gather/reduce, edge softmax attention, SDDMM, typed matmul.

Each kernel module holds the Pallas forward and backward kernels, a ``jax.custom_vjp`` wrapper, and a
pure-jnp ``*_reference`` with identical semantics. ``interpret=True`` runs the Pallas interpreter (CPU).
All JAX/Pallas version differences live in :mod:`pallas_kernels.compat`. This package imports nothing
from jgnn.
"""
from pallas_kernels import compat
from pallas_kernels.attention import attention_aggregate, attention_aggregate_reference
from pallas_kernels.csr import CSR, build_csr_jax, build_csr_numpy, degrees
from pallas_kernels.dropout import edge_dropout_keep
from pallas_kernels.gather_compute import gather_compute, gather_compute_reference
from pallas_kernels.gather_reduce import REDUCTIONS, gather_reduce, gather_reduce_reference
from pallas_kernels.typed_matmul import AUTO_IMPL, AUTO_IMPL_REASON, typed_matmul, typed_matmul_reference

__all__ = [
    "AUTO_IMPL", "AUTO_IMPL_REASON", "CSR", "REDUCTIONS", "attention_aggregate", "attention_aggregate_reference",
    "build_csr_jax", "build_csr_numpy", "compat", "degrees", "edge_dropout_keep", "gather_compute",
    "gather_compute_reference", "gather_reduce", "gather_reduce_reference", "typed_matmul",
    "typed_matmul_reference",
]
