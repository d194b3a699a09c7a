"""How a kernel would walk a CSR, as data: programs, serial chunks, masked lanes, barriers and bytes per edge.

Everything is computed on the host from the CSR's work list and the operands' trailing shapes; no kernel runs.
jgnn's ``explain`` reports it. The figures:

* ``programs``: main-grid programs (segments / segments per program, times split-axis blocks), and
  ``combine_programs`` for split rows;
* ``serial_chunks``: chunks the longest main program walks (its critical path), ``combine_chunks`` likewise;
* ``masked_lane_fraction``: lanes of the walked chunks that hold no slot (wasted issue slots);
* ``barriers_per_edge``: the schedule's reduction barriers per edge, cross-warp reductions times
  :data:`BARRIERS_PER_REDUCTION`: none inside the chunk loop, one lane merge per program after it when several
  lanes serve a segment (none when each lane owns one), one per combine program. Layout conversions that
  Triton adds (narrow tiles, attention's mixed ranks) are not modelled: read them from the PTX
  (``benchmarks/results/kernel-schedule-cpu.md`` has both);
* ``bytes_per_edge`` vs ``min_bytes_per_edge``: requested global-memory bytes per edge (masked lanes touch no
  memory; identical addresses within a program count once), against the compulsory traffic (each operand
  row, id and output row once).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _walk as wk
from pallas_kernels.csr import CSR

#: bar.sync per cross-warp reduction of a chunk tile, as read from the PTX of the row-per-program kernels
#: (issue 14: 4 per gather_reduce chunk, one reduction; 10 per attention chunk, three reductions).
BARRIERS_PER_REDUCTION = {"gather_reduce": 4.0, "gather_compute": 0.0, "attention": 10.0 / 3.0}
#: Cross-lane reductions in one merge of a segment's lanes (attention: max, weight sum, output sum).
REDUCTIONS_PER_MERGE = {"gather_reduce": 1, "gather_compute": 0, "attention": 3}
KERNELS = tuple(REDUCTIONS_PER_MERGE)


class ScheduleReport(NamedTuple):
    kernel: str
    rows: int
    edges: int  # slots that belong to a row
    block: int  # slots per chunk
    lanes: int  # slots per segment per chunk
    split_blocks: int  # programs along the split axis (feature lanes or heads)
    programs: int
    combine_programs: int
    serial_chunks: int
    combine_chunks: int
    masked_lane_fraction: float
    barriers_per_edge: float
    bytes_per_edge: float
    min_bytes_per_edge: float


def _abstract(shapes: Sequence[Sequence[int]], dtype) -> tuple:
    return tuple(jax.ShapeDtypeStruct((1,) + tuple(t), dtype) for t in shapes)


def _row_bytes(shapes: Sequence[Sequence[int]], itemsize: int) -> int:
    return sum(math.prod(t) for t in shapes) * itemsize


def describe_schedule(csr: CSR, *, kernel: str, col=(), row=(), edge=(), shared=(), heads: int | None = None,
                      value_dim: int | None = None, dtype=jnp.float32) -> ScheduleReport:
    """The schedule of ``kernel`` over ``csr`` (concrete arrays) for operands of the given trailing shapes.

    Args:
      kernel: "gather_reduce" | "gather_compute" | "attention".
      col, row, edge, shared: trailing shapes of the operands (``(w,)`` for the gather kernels, ``(H,)`` or
        ``(H, Dk)`` for attention).
      heads, value_dim: attention's ``H`` and ``D``.
      dtype: the operands' dtype (bytes per element).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    groups = tuple(_abstract(g, dtype) for g in (col, row, edge, shared))
    shapes = [t for g in (col, row, edge, shared) for t in g]
    if kernel == "attention":
        if heads is None or value_dim is None:
            raise ValueError("attention needs heads and value_dim")
        out_shape, axis, extra = (heads, value_dim), heads, [(heads, value_dim)]
    else:
        width = max(t[0] for t in shapes)
        out_shape, axis, extra = (width,), width, []
    plan = wk.make_plan(groups, csr, axis=axis, extra=extra, compute=jnp.float32)
    item = np.dtype(dtype).itemsize
    seg, comb = csr.segments, csr.combine
    length = np.asarray(seg.end) - np.asarray(seg.start)
    big, lanes = plan.block, plan.lanes
    k = big // lanes
    pad = (-length.shape[0]) % k
    groups_len = np.concatenate([length, np.zeros(pad, length.dtype)]).reshape(-1, k)
    chunks = -(-groups_len.max(axis=1) // lanes)
    edges = int(length.sum())
    walked = int(chunks.sum()) * big
    programs = groups_len.shape[0] * plan.num_blocks
    count = np.asarray(comb.count)[np.asarray(comb.row) < csr.num_rows]
    combine = kernel != "gather_compute" and count.size > 0
    per_merge = REDUCTIONS_PER_MERGE[kernel] * BARRIERS_PER_REDUCTION[kernel]
    busy = int((chunks > 0).sum()) * plan.num_blocks
    barriers = (busy if lanes > 1 else 0) * per_merge + (count.size * plan.num_blocks * per_merge if combine else 0)
    rows = int((np.asarray(seg.row) < csr.num_rows).sum())  # segments that own a row or a piece
    state = (_row_bytes([out_shape, (heads,), (heads,)], 4) if kernel == "attention"
             else _row_bytes([out_shape], 4))
    out_row = _row_bytes([out_shape], item) * (kernel != "gather_compute")
    ids = 4 + 4 * bool(edge) + 4 * (kernel == "gather_compute")
    per_edge = _row_bytes(col, item) + _row_bytes(edge, item) + (_row_bytes([out_shape], item)
                                                                 if kernel == "gather_compute" else 0)
    requested = (edges * (8 * plan.num_blocks + per_edge) + rows * 16 + rows * _row_bytes(row, item)
                 + csr.num_rows * out_row + programs * _row_bytes(shared, item)
                 + (int(count.sum()) * 2 * state + count.size * 12 if combine else 0))
    minimum = (edges * (ids + per_edge) + csr.num_rows * (4 + _row_bytes(row, item) + out_row)
               + _row_bytes(shared, item))
    return ScheduleReport(kernel, csr.num_rows, edges, big, lanes, plan.num_blocks, programs,
                          int(count.size * plan.num_blocks) if combine else 0, int(chunks.max(initial=0)),
                          int((-(-count // big)).max(initial=0)) if combine else 0,
                          1.0 - edges / walked if walked else 0.0, barriers / max(edges, 1),
                          requested / max(edges, 1), minimum / max(edges, 1))
