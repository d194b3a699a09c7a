"""The CSR walk every edge kernel runs: a segment schedule, chunk-wide accumulators, a deterministic combine.

A kernel is a *body* (what one chunk of slots computes) plus a *monoid* (how per-slot results fold into a row's
result). :func:`walk` runs it over a CSR's work list (:mod:`pallas_kernels.schedule`):

* program ``(i, j)`` takes segments ``i*k : (i+1)*k`` (``k = block // lanes``) and block ``j`` of the split axis
  (feature lanes, or heads for attention); lane ``b`` of a chunk serves segment ``b // lanes``;
* the chunk loop keeps one monoid state **per lane** and folds each slot in elementwise, so no chunk needs a
  cross-lane (cross-warp) reduction; lanes are merged once, after the loop;
* the next chunk's slot ids are loaded before the current chunk is computed (software prefetch: the id loads
  are off the col id -> feature row dependency chain);
* a whole row's segment finalizes and writes the output row; a piece of a split row writes its partial state,
  and a combine kernel folds each split row's partials in index order, then finalizes.

Operand groups, as the kernels' public functions take them: ``col`` arrays ``[N_col, *t]`` gathered at each
slot's ``csr.col`` (clamped into range), ``row`` arrays ``[R, *t]`` read at the slot's row, ``edge`` arrays
``[E, *t]`` gathered at ``csr.eid``, ``shared`` arrays ``[1, *t]`` read once. Every trailing shape ``t`` starts
with the split axis, of size 1 (broadcast) or ``T``; tiles reach the body as ``[block, split, *padded rest]``
in the compute dtype, with padding lanes and masked slots zero.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _access as acc
from pallas_kernels import _config, compat
from pallas_kernels.csr import CSR

GROUPS = ("col", "row", "edge", "shared")


class Plan(NamedTuple):
    """Static facts of one kernel call."""

    shapes: tuple[tuple[tuple[int, ...], ...], ...]  # trailing shape of each operand, per group
    axis: int  # real size T of the split axis
    split: int  # lanes of the split axis per program
    num_blocks: int  # programs along the split axis
    block: int  # slots per chunk
    lanes: int  # slots per segment per chunk
    num_warps: int
    num_stages: int
    compute: np.dtype
    exact: tuple[tuple[bool, ...], ...] = ()  # per group and operand: an int32 operand loaded as int32

    def dtype(self, group: int, k: int) -> np.dtype:
        """The dtype operand ``k`` of ``group`` reaches the body in: int32 when loaded exactly, else compute."""
        return np.dtype(np.int32) if self.exact and self.exact[group][k] else self.compute

    def tile(self, trailing: Sequence[int]) -> tuple[int, ...]:
        """Per-slot tile of a trailing shape in one program (size-1 split axes stay 1)."""
        return (1 if trailing[0] == 1 else self.split,) + tuple(_config.next_pow2(d) for d in trailing[1:])

    def out_tile(self, trailing: Sequence[int]) -> tuple[int, ...]:
        """Per-slot tile of an output: lane-wise (``trailing[0] == T``) or, for a value folded over its lanes,
        one column per program block (``trailing[0]`` 1 or ``num_blocks``)."""
        return (self.split if trailing[0] == self.axis else 1,) + self.tile(trailing)[1:]

    def body_tile(self, trailing: Sequence[int]) -> tuple[int, ...]:
        """Per-slot tile the body sees (size-1 split axes broadcast)."""
        return (self.split,) + self.tile(trailing)[1:]

    def widen(self, tile: Sequence[int]) -> tuple[int, ...]:
        """All programs' tiles side by side (the layout of partial states). A state tile's split axis has
        ``split`` lanes, or 1 for a value folded over its lanes (one column per program block)."""
        return (tile[0] * self.num_blocks,) + tuple(tile[1:])


def make_plan(groups: Sequence[Sequence[jax.Array]], csr: CSR, *, axis: int, extra: Sequence[Sequence[int]] = (),
              split: bool = True, compute, exact_integers: bool = False) -> Plan:
    """Tiles for operands ``groups`` (col, row, edge, shared) whose split axis has size ``axis``.

    ``extra`` are trailing shapes of other per-slot tiles (e.g. attention values) that count toward the register
    budget; ``split=False`` keeps the whole split axis in one program (bodies that reduce across it);
    ``exact_integers`` loads int32 operands as int32 (bit patterns an edge function hashes), not in ``compute``.
    """
    shapes = tuple(tuple(tuple(x.shape[1:]) for x in g) for g in groups)
    trailing = [t for g in shapes for t in g] + [tuple(t) for t in extra]
    if not trailing:
        raise ValueError("edge kernels need at least one operand")
    for t in trailing:
        if not t or t[0] not in (1, axis):
            raise ValueError(f"every operand's first trailing axis must be 1 or {axis}; got trailing shapes "
                             f"{trailing}")
    per_lane = [math.prod(_config.next_pow2(d) for d in t[1:]) for t in trailing]
    rest = max(per_lane)
    padded = _config.next_pow2(axis)
    block = _config.split_block(padded, rest) if split else padded
    # Every operand's tile and every extra tile is live in registers at once: the chunk is sized by their sum
    # (a width-1 operand's tile has one element along the split axis).
    cfg = _config.edge_block(sum((block if t[0] == axis else 1) * n for t, n in zip(trailing, per_lane, strict=True)))
    lanes = min(_config.segment_lanes(csr.num_rows), cfg.block_edges)
    exact = tuple(tuple(exact_integers and np.dtype(x.dtype) == np.int32 for x in g) for g in groups)
    return Plan(shapes, axis, block, padded // block, cfg.block_edges, lanes, cfg.num_warps, cfg.num_stages,
                np.dtype(compute), exact)


class Ctx(NamedTuple):
    """Per-chunk facts a body may use. Per-slot values are ``[B, 1]`` columns that broadcast against tiles."""

    eid: jax.Array  # int32[B, 1]: edge id of each slot
    valid: jax.Array  # bool[B, 1]: slot belongs to a segment
    offset: jax.Array  # int32 scalar: first split-axis lane of this program
    seed: jax.Array  # int32 scalar: the call's seed (dropout)


class Monoid(NamedTuple):
    """How per-slot values fold into a row result. States are tuples of ``[n, *tile]`` arrays."""

    lift: Callable  # (values, valid bool[n]) -> state of single slots (the identity where not valid)
    combine: Callable  # (state, state) -> state, elementwise
    reduce: Callable  # (state, axis) -> state with ``axis`` folded away
    finalize: Callable  # (state [k, ...], degree int32[k]) -> row outputs [k, *tile]


def lanes_like(mask: jax.Array, x: jax.Array) -> jax.Array:
    """``mask`` [n] shaped to broadcast against ``x`` [n, ...]."""
    return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


def extent_mask(plan: Plan, trailing: Sequence[int], offset) -> jax.Array:
    """bool ``[1, *tile]``: which lanes of a body tile of ``trailing`` hold real (not padding) elements."""
    tile = (1,) + plan.body_tile(trailing)
    ok = jax.lax.broadcasted_iota(jnp.int32, tile, 1) + offset < plan.axis  # a broadcast operand is real up to T
    for k, w in enumerate(trailing[1:], start=2):
        ok = ok & (jax.lax.broadcasted_iota(jnp.int32, tile, k) < w)
    return ok


def _where_state(ok, a, b):
    return tuple(jnp.where(lanes_like(ok, x), x, y) for x, y in zip(a, b, strict=True))


def _struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def abstract_inputs(plan: Plan):
    tiles = tuple(tuple(_struct((plan.block,) + plan.body_tile(t), plan.dtype(i, k)) for k, t in enumerate(g))
                  for i, g in enumerate(plan.shapes))
    b = plan.block
    ctx = Ctx(_struct((b, 1), jnp.int32), _struct((b, 1), jnp.bool_), _struct((), jnp.int32),
              _struct((), jnp.int32))
    return tiles, ctx


def _identity(monoid: Monoid, values_struct, n: int):
    zeros = tuple(jnp.zeros((n,) + v.shape[1:], v.dtype) for v in values_struct)
    return monoid.lift(zeros, jnp.zeros((n, 1), jnp.bool_))


def _check_tiles(what: str, got, want):
    got = tuple(tuple(x.shape) for x in got)
    if got != tuple(want):
        raise ValueError(f"{what}: the body returned tiles {got}, expected {tuple(want)}")


def walk(body: Callable, csr: CSR, groups: Sequence[Sequence[jax.Array]], *, plan: Plan, monoid: Monoid | None,
         row_out: Sequence[jax.ShapeDtypeStruct] = (), slot_out: Sequence[jax.ShapeDtypeStruct] = (),
         seed: jax.Array | None = None, interpret: bool, name: str) -> tuple[tuple, tuple]:
    """Run ``body`` over every slot of ``csr`` and fold its per-row values with ``monoid``.

    Args:
      body: ``(col, row, edge, shared, ctx) -> (row values, slot values)``; tiles are tuples of
        ``[B, *plan.body_tile(t)]`` arrays; row values feed ``monoid``; slot values (``[B, *plan.tile(t)]``
        for each ``slot_out``) are written at the slot's edge id.
      groups: operands (col, row, edge, shared), see the module docstring.
      row_out: ``[R, *t]`` outputs of ``monoid.finalize`` (cast to their dtypes, padding lanes dropped).
      slot_out: ``[E, *t]`` per-edge outputs; edges no slot reaches are 0.
      seed: int32[1] handed to the body as ``ctx.seed``.

    Returns:
      (row outputs, slot outputs) as tuples.
    """
    if not interpret:  # only Triton rejects dead values of odd sizes; XLA drops them (and the retrace costs)
        body = compat.without_dead_code(body)
    groups = tuple(tuple(g) for g in groups)
    num_rows, nnz = csr.num_rows, csr.col.shape[0]
    seed = jnp.zeros((1,), jnp.int32) if seed is None else seed
    tiles, ctx = abstract_inputs(plan)
    values, slots = jax.eval_shape(body, *tiles, ctx)
    _check_tiles("slot values", slots, [(plan.block,) + plan.out_tile(s.shape[1:]) for s in slot_out])
    state = () if monoid is None else jax.eval_shape(monoid.lift, values, _struct((plan.block, 1), jnp.bool_))
    if nnz == 0 or num_rows == 0:
        return _without_slots(plan, monoid, values, row_out, slot_out)
    n_parts = csr.combine.part_row.shape[0] if monoid is not None and csr.combine.row.shape[0] else 0
    parts = tuple(_struct((n_parts,) + plan.widen(x.shape[1:]), x.dtype) for x in state) if n_parts else ()
    zeros = tuple(jnp.zeros(s.shape, s.dtype) for s in slot_out)
    operands = tuple(x for g in groups for x in g)
    n_in = 7 + len(operands)
    kernel = functools.partial(_main_kernel, body=body, plan=plan, monoid=monoid, num_rows=num_rows,
                               counts=(len(operands), len(zeros), len(row_out), len(parts)), values=values,
                               interpret=interpret)
    seg = csr.segments
    k = plan.block // plan.lanes
    outs = compat.pallas_call(
        kernel, out_shape=(*row_out, *parts, *slot_out), grid=(-(-seg.row.shape[0] // k), plan.num_blocks),
        interpret=interpret, num_warps=plan.num_warps, num_stages=plan.num_stages, name=name,
        input_output_aliases={n_in + s: len(row_out) + len(parts) + s for s in range(len(zeros))},
    )(*seg, csr.col, csr.eid, seed, *operands, *zeros)
    outs = tuple(outs)
    rows, partials, slot_vals = outs[:len(row_out)], outs[len(row_out):len(row_out) + len(parts)], \
        outs[len(row_out) + len(parts):]
    if parts and row_out:
        rows = _combine(csr, plan, monoid, values, partials, rows, interpret=interpret, name=name)
    return rows, slot_vals


def _without_slots(plan, monoid, values, row_out, slot_out):
    """Outputs of a CSR with no slots or rows: every row empty, every edge 0 (no kernel to launch)."""
    rows = ()
    if monoid is not None and row_out:
        num_rows = row_out[0].shape[0]
        full = tuple(_struct((num_rows,) + plan.widen(v.shape[1:]), v.dtype) for v in values)
        state = _identity(monoid, full, num_rows)
        outs = monoid.finalize(state, jnp.zeros((num_rows,), jnp.int32))
        rows = tuple(o[tuple(slice(0, d) for d in r.shape)].astype(r.dtype) for o, r in zip(outs, row_out,
                                                                                            strict=True))
    return rows, tuple(jnp.zeros(s.shape, s.dtype) for s in slot_out)


def _load_group(refs, group: int, ids, mask, plan: Plan, offset, n: int, *, interpret: bool) -> tuple:
    out = []
    for k, (ref, t) in enumerate(zip(refs, plan.shapes[group], strict=True)):
        x = acc.gather_tile(ref, ids, mask, plan.tile(t), offset, interpret=interpret).astype(plan.dtype(group, k))
        out.append(jnp.broadcast_to(x, (n,) + plan.body_tile(t)))
    return tuple(out)


def _main_kernel(*refs, body, plan: Plan, monoid, num_rows, counts, values, interpret):
    seg_row, seg_start, seg_end, seg_part, col_ref, eid_ref, seed_ref = refs[:7]
    n_ops, n_zero, n_row, n_part = counts
    operand_refs, rest = refs[7:7 + n_ops], refs[7 + n_ops + n_zero:]
    row_refs, part_refs, slot_refs = rest[:n_row], rest[n_row:n_row + n_part], rest[n_row + n_part:]
    sizes = [len(g) for g in plan.shapes]
    bounds = np.cumsum([0] + sizes)
    col_refs, row_op_refs, edge_refs, shared_refs = (operand_refs[a:b] for a, b in zip(bounds[:-1], bounds[1:],
                                                                                           strict=True))
    big, lanes = plan.block, plan.lanes
    k = big // lanes
    i, j = compat.program_id(0), compat.program_id(1)
    offset = j * plan.split
    n_seg = seg_row.shape[0]
    # Per segment of this program ([k]) and per lane ([B, 1]: lane b serves segment b // lanes).
    seg_k = i * k + jax.lax.broadcasted_iota(jnp.int32, (k,), 0)
    ok_k = seg_k < n_seg
    rows_k = acc.load_vector(seg_row, seg_k, ok_k, num_rows, interpret=interpret)
    start_k = acc.load_vector(seg_start, seg_k, ok_k, 0, interpret=interpret)
    end_k = acc.load_vector(seg_end, seg_k, ok_k, 0, interpret=interpret)
    lane = jax.lax.broadcasted_iota(jnp.int32, (big, 1), 0)  # per-lane values are [B, 1] columns
    if k == 1:
        start, end = jnp.broadcast_to(start_k[:, None], (big, 1)), jnp.broadcast_to(end_k[:, None], (big, 1))
        row_ids, row_ok = rows_k[:, None], rows_k[:, None] < num_rows
    else:
        seg_lane = i * k + lane // lanes
        ok_lane = seg_lane < n_seg
        start = acc.load_vector(seg_start, seg_lane, ok_lane, 0, interpret=interpret)
        end = acc.load_vector(seg_end, seg_lane, ok_lane, 0, interpret=interpret)
        row_ids = acc.load_vector(seg_row, seg_lane, ok_lane, num_rows, interpret=interpret)
        row_ok = row_ids < num_rows
    first = start + lane % lanes
    row_tiles = _load_group(row_op_refs, 1, row_ids, row_ok, plan, offset, big, interpret=interpret)
    zero = jnp.zeros((1, 1), jnp.int32)
    shared_tiles = _load_group(shared_refs, 3, zero, zero == 0, plan, offset, big, interpret=interpret)
    seed = acc.load_scalar(seed_ref, 0, interpret=interpret)

    def slot_ids(c):
        slot = first + c * lanes
        ok = slot < end
        return (ok, acc.load_vector(col_ref, slot, ok, 0, interpret=interpret),
                acc.load_vector(eid_ref, slot, ok, 0, interpret=interpret))

    def step(c, carry):
        state, (ok, col, eid) = carry
        upcoming = slot_ids(c + 1)  # prefetch: independent of this chunk's feature loads
        col_tiles = _load_group(col_refs, 0, col, ok, plan, offset, big, interpret=interpret)
        edge_tiles = _load_group(edge_refs, 2, eid, ok, plan, offset, big, interpret=interpret)
        vals, slot_vals = body(col_tiles, row_tiles, edge_tiles, shared_tiles, Ctx(eid, ok, offset, seed))
        for ref, v in zip(slot_refs, slot_vals, strict=True):
            acc.scatter_tile(ref, eid, ok, v, _at(j, v), interpret=interpret)
        if monoid is not None:
            state = monoid.combine(state, monoid.lift(tuple(vals), ok))
        return state, upcoming

    init = () if monoid is None else _identity(monoid, values, big)
    # Segments are sorted longest first, so the program's first segment sets its trip count (no reduction).
    longest = acc.load_scalar(seg_end, i * k, interpret=interpret) - acc.load_scalar(seg_start, i * k,
                                                                                     interpret=interpret)
    num_chunks = (longest + lanes - 1) // lanes
    state, _ = compat.fori_loop(0, num_chunks, step, (init, slot_ids(0)))
    if monoid is None:
        return
    if lanes > 1:  # merge each segment's lanes: the kernel's only cross-lane reduction
        state = monoid.reduce(tuple(x.reshape((k, lanes) + x.shape[1:]) for x in state), 1)
    part_k = acc.load_vector(seg_part, seg_k, ok_k, -1, interpret=interpret)
    whole = ok_k & (part_k < 0) & (rows_k < num_rows)
    for ref, v in zip(row_refs, monoid.finalize(state, end_k - start_k), strict=True):
        acc.scatter_tile(ref, rows_k, whole, v, _at(j, v), interpret=interpret)
    for ref, v in zip(part_refs, state if part_refs else (), strict=True):
        acc.scatter_tile(ref, part_k, ok_k & (part_k >= 0), v, _at(j, v), interpret=interpret)


def _combine(csr: CSR, plan: Plan, monoid: Monoid, values, partials, rows, *, interpret: bool, name: str):
    n_part, n_row = len(partials), len(rows)
    kernel = functools.partial(_combine_kernel, plan=plan, monoid=monoid, num_rows=csr.num_rows, values=values,
                               counts=(n_part, n_row), interpret=interpret)
    comb = csr.combine
    n_in = 4 + n_part
    out = compat.pallas_call(
        kernel, out_shape=tuple(_struct(r.shape, r.dtype) for r in rows), grid=(comb.row.shape[0], plan.num_blocks),
        interpret=interpret, num_warps=plan.num_warps, num_stages=plan.num_stages, name=f"{name}_combine",
        input_output_aliases={n_in + r: r for r in range(n_row)},
    )(comb.row, comb.first, comb.count, csr.indptr, *partials, *rows)
    return tuple(out)


def _combine_kernel(*refs, plan: Plan, monoid: Monoid, num_rows, values, counts, interpret):
    """Fold split row ``combine.row[q]``'s partials in index order, ``block`` at a time, then finalize."""
    row_ref, first_ref, count_ref, indptr_ref = refs[:4]
    n_part, n_row = counts
    part_refs, out_refs = refs[4:4 + n_part], refs[4 + n_part + n_row:]
    q, j = compat.program_id(0), compat.program_id(1)
    big = plan.block
    row = acc.load_scalar(row_ref, q, interpret=interpret)
    first = acc.load_scalar(first_ref, q, interpret=interpret)
    count = acc.load_scalar(count_ref, q, interpret=interpret)
    identity = _identity(monoid, values, big)
    lane = jax.lax.broadcasted_iota(jnp.int32, (big, 1), 0)

    def step(c, state):
        p = first + c * big + lane
        ok = p < first + count
        loaded = tuple(acc.gather_tile(ref, p, ok, x.shape[1:], _at(j, x), interpret=interpret)
                       for ref, x in zip(part_refs, identity, strict=True))
        return monoid.combine(state, _where_state(ok, loaded, identity))

    state = compat.fori_loop(0, (count + big - 1) // big, step, identity)
    state = monoid.reduce(tuple(x[None] for x in state), 1)
    r = jnp.minimum(row, num_rows - 1)
    deg = acc.load_scalar(indptr_ref, r + 1, interpret=interpret) - acc.load_scalar(indptr_ref, r,
                                                                                     interpret=interpret)
    own = jnp.full((1,), row, jnp.int32)
    for ref, v in zip(out_refs, monoid.finalize(state, jnp.reshape(deg, (1,))), strict=True):
        acc.scatter_tile(ref, own, own < num_rows, v, _at(j, v), interpret=interpret)


def _at(j, tile: jax.Array):
    """Offset along the split axis of program block ``j``'s output ``tile`` ``[n, t, ...]``: ``t`` is the
    plan's ``split`` for a lane-wise output, or 1 for a value the body folded over its lanes, which each block
    writes as its own partial (column ``j`` of a ``[*, num_blocks, ...]`` output; callers sum the columns).
    A size-1 output ignores the offset (:func:`pallas_kernels._access.gather_tile`)."""
    return j * tile.shape[1]


def _sum_lift(values, valid):
    return tuple(jnp.where(lanes_like(valid, v), v, jnp.zeros((), v.dtype)) for v in values)


#: Sums of any number of components; rows finalize to their sums (empty rows to 0).
SUM = Monoid(
    lift=_sum_lift,
    combine=lambda a, b: tuple(x + y for x, y in zip(a, b, strict=True)),
    reduce=lambda s, axis: tuple(jnp.sum(x, axis=axis) for x in s),
    finalize=lambda s, deg: s,
)
