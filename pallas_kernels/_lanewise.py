"""The lane-wise ``edge_fn`` contract shared by gather_reduce and gather_compute.

Operands are 2-D ``[rows, w]`` with ``w ∈ {1, F}`` (``F`` the widest); ``edge_fn(col, row, edge, shared)`` gets
tuples of ``[B, Fb]`` tiles (width-1 operands broadcast, ``Fb`` a block of the padded feature lanes: wide
features are split across programs) in the compute dtype, and returns ``[B, Fb]`` (or anything that broadcasts
to it). Lane-wise means lane ``f`` of the result depends on lane ``f`` of the operands only.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _dtypes
from pallas_kernels import _reference as ref
from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR

EdgeFn = Callable[[tuple, tuple, tuple, tuple], jax.Array]


class Call(NamedTuple):
    groups: tuple[tuple[jax.Array, ...], ...]
    width: int
    plan: wk.Plan
    out_dtype: np.dtype


def prepare(edge_fn: EdgeFn, col, row, edge, shared, csr: CSR, *, integers: bool, what: str, out_dtype=None) -> Call:
    """Check operands, choose the compute dtype and the tiles of one lane-wise call."""
    groups = tuple(tuple(g) for g in (col, row, edge, shared))
    arrays = [x for g in groups for x in g]
    if not arrays:
        raise ValueError(f"{what}: edge_fn needs at least one operand")
    for name, g in zip(wk.GROUPS, groups, strict=True):
        for x in g:
            if x.ndim != 2:
                raise ValueError(f"{what}: {name} operands must be 2-D [rows, width], got shape {x.shape}")
    for x in groups[3]:
        if x.shape[0] != 1:
            raise ValueError(f"{what}: shared operands must have one row, got shape {x.shape}")
    width = max(x.shape[1] for x in arrays)
    compute = _dtypes.compute_dtype(arrays, integers=integers, what=what, result=out_dtype)
    plan = wk.make_plan(groups, csr, axis=width, compute=compute)
    tiles, _ = wk.abstract_inputs(plan)
    out = jax.eval_shape(edge_fn, *tiles)
    _dtypes.check_edge_fn_output(out.dtype, compute, what)
    return Call(groups, width, plan, np.dtype(out_dtype or _dtypes.result_dtype(arrays)))


def values(edge_fn: EdgeFn, plan: wk.Plan, col, row, edge, shared) -> jax.Array:
    """``edge_fn`` on one chunk, as ``[B, Fb]`` in the compute dtype."""
    y = jnp.asarray(edge_fn(col, row, edge, shared)).astype(plan.compute)
    return jnp.broadcast_to(y, (plan.block, plan.split))


def reference_values(edge_fn: EdgeFn, call: Call, csr: CSR) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(``edge_fn`` per slot ``[nnz, F]``, row per slot, slot validity), unpadded, in the compute dtype."""
    rows, valid = ref.slot_rows(csr)
    tiles = ref.slot_operands(call.groups, csr, rows, axis=call.width, compute=call.plan.compute)
    vals = jnp.asarray(edge_fn(*tiles)).astype(call.plan.compute)
    return jnp.broadcast_to(vals, (rows.shape[0], call.width)), rows, valid


def widths(groups: Sequence[Sequence[jax.Array]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(x.shape[1] for x in g) for g in groups)
