"""How an edge op runs: XLA segment ops over all edges, XLA edge blocks, or a Pallas kernel.

`decide` chooses from an op's backend, its size and its edge function, and says why (a `Reason` and parameters
for the report). Derived ops (JVPs, transposes, batching) keep their parent's backend and are decided the same
way. `run` is the lowering of the `edge_op` primitive:

* ``segment``: `jgnn.ops.edge_op.reference` itself: gathers, the edge function over all edges, segment ops.
  Fastest on CPU while the edge temporaries (`edge_bytes`) fit the budget (``JGNN_EDGE_TEMP_BYTES``, default
  512 MiB);
* ``blocks``: the same per block of edges in a ``fori_loop`` (equal blocks, the last one shorter by less than
  the block count), holding one block of edge
  values at a time; max/min keep a running extremum, softmax an online (max, sum, accumulator) per row;
* ``kernel``: the Pallas kernels (`jgnn.ops.pallas`), on a CSR from the `GraphLayout` or sorted in the program.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jgnn.ops import edge_fn
from jgnn.ops import edge_op as eo
from jgnn.ops.gather import normalize
from jgnn.ops.segment import accumulation_dtype, counts, identity, materialize
from jgnn.report import Reason
from jgnn.roles import Group

DEFAULT_TEMP_BYTES = 512 << 20


def temp_budget() -> int:
    return int(os.environ.get("JGNN_EDGE_TEMP_BYTES", DEFAULT_TEMP_BYTES))


def _row_bytes(avals) -> int:
    return sum(int(np.prod(a.shape[1:], dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in avals)


def edge_bytes(spec: eo.EdgeSpec, operand_avals) -> int:
    """Bytes of the edge-sized temporaries the segment lowering keeps after XLA fuses it.

    XLA fuses each gather into its consumer, so gathered rows are not counted where a segment reduction consumes
    the messages: the messages are (a scatter reads its operand whole), and for softmax also the weights
    ``exp(s - m)``. A sum over all edges (a shared operand's cotangent) contracts the gathered rows themselves.
    An op without reduction has no temporaries beyond its outputs, which blocks would not shrink.
    """
    if spec.reduce == eo.Reduce.NONE:
        return 0
    msgs = eo.message_avals(spec, operand_avals)
    if spec.over == Group.ALL:
        row = _row_bytes(a for a, g in zip(operand_avals, spec.groups, strict=True) if g != Group.SHARED)
    elif spec.reduce == eo.Reduce.SOFTMAX:
        row = _row_bytes(msgs) + _row_bytes(msgs[:1])
    else:
        row = _row_bytes(msgs)
    return row * max(spec.num_edges, 1)


@dataclasses.dataclass(frozen=True)
class Choice:
    """How one edge op runs: ``impl`` is ``segment``, ``blocks`` (``block`` edges at a time) or ``kernel``; ``code``
    and ``params`` say why, for the report."""

    impl: str
    block: int
    code: Reason
    params: tuple


def decide(spec: eo.EdgeSpec, operand_avals) -> Choice:
    """The lowering of an edge op on its backend (``spec.backend``), from its size and its edge function.

    Deterministic in the op and its operand shapes: `explain` reports what `run` does.
    """
    total = edge_bytes(spec, operand_avals)
    fixed = edge_fn.fixed_rows(spec.fn)
    if fixed is not None:
        return Choice("segment", 0, Reason.FIXED_SHAPE_BODY, (("edges", spec.num_edges), ("primitive", fixed)))
    if spec.backend != "xla":
        from jgnn.ops import pallas

        why = pallas.eligible(spec, operand_avals)
        if why is None:
            return Choice("kernel", 0, Reason.LOWER_KERNEL, pallas.kernel_params(spec, operand_avals))
        xla = decide(spec.replace(backend="xla"), operand_avals)
        return Choice(xla.impl, xla.block, why[0], tuple(sorted(why[1].items())))
    budget = temp_budget()
    stored = isinstance(spec.fn, edge_fn.RegionFn) and not spec.fn.ops  # blocks of stored rows save no memory
    if total <= budget or spec.num_edges <= 1 or stored:
        return Choice("segment", 0, Reason.LOWER_SEGMENT, (("bytes", total), ("edges", spec.num_edges)))
    # Equal blocks: one block plus a short tail would pay the per-block node-array work (softmax rescaling,
    # the accumulator update) twice for little memory saved, and doubles the code.
    blocks = -(-total // budget)
    block = -(-spec.num_edges // blocks)
    return Choice("blocks", block, Reason.LOWER_BLOCKS, (("block", block), ("budget", budget), ("bytes", total)))


def record(report, spec: eo.EdgeSpec, operand_avals, varying=None, **extra) -> None:
    """Add the kernel record of `decide`'s choice to ``report``; a kernel's also says where its CSR comes from.
    A softmax op's also says how its backward runs (`attention_tangent.backward_record`), for the operands
    ``varying`` marks as differentiated (None: every float one)."""
    choice = decide(spec, operand_avals)
    params = dict(choice.params)
    if choice.impl == "kernel":
        params["csr"] = Reason.CSR_FROM_LAYOUT if spec.layout else Reason.CSR_SORTED_IN_PROGRAM
    if spec.reduce == eo.Reduce.SOFTMAX:
        from jgnn.ops import attention_tangent

        params.update(attention_tangent.backward_record(spec, operand_avals, varying))
    report.kernel(spec.name, spec.backend, choice.impl, choice.code, **extra, **params)


# ---- run ------------------------------------------------------------------------------------------------------

def run(*args, spec: eo.EdgeSpec) -> list:
    _, _, operands, _ = eo.split_args(args, spec)
    choice = decide(spec, [jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in operands])
    if choice.impl == "kernel":
        from jgnn.ops import pallas

        return pallas.run(*args, spec=spec)
    if choice.impl == "blocks" and 0 < choice.block < spec.num_edges:
        return _blocks(args, spec, choice.block)
    return eo.reference(*args, spec=spec)


def _take(x, start, size):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=0)


class _Walk:
    """Blocks of ``size`` edges: ``count`` full blocks in a loop, then a tail block of the remaining edges."""

    def __init__(self, spec: eo.EdgeSpec, args, size: int):
        self.spec = spec
        self.src, self.dst, self.ops, _ = eo.split_args(args, spec)
        self.size = size
        self.count = spec.num_edges // self.size
        self.tail = spec.num_edges - self.count * self.size

    def block(self, start, size):
        """(messages, reduce rows, gather rows of the over group) of ``size`` edges from ``start``."""
        spec = self.spec
        src, dst = _take(self.src, start, size), _take(self.dst, start, size)
        operands = [_take(x, start, size) if g == Group.EDGE else x
                    for x, g in zip(self.ops, spec.groups, strict=True)]
        ys = spec.fn.apply(eo.endpoint_rows(spec, src, dst, operands))
        if spec.reduce == eo.Reduce.NONE or spec.over == Group.ALL:
            return ys, None, None
        ids = src if spec.over == Group.SRC else dst
        return ys, eo.reduce_rows(spec, src, dst), normalize(ids, spec.num_segments, wrap=spec.wrap)

    def fold(self, step, init):
        """``step(carry, start, size)`` over the full blocks, then the tail."""
        carry = init
        if self.count:
            carry = jax.lax.fori_loop(0, self.count, lambda b, c: step(c, b * self.size, self.size), carry)
        if self.tail:
            carry = step(carry, self.count * self.size, self.tail)
        return carry


def _blocks(args, spec: eo.EdgeSpec, size: int) -> list:
    walk = _Walk(spec, args, size)
    n = spec.num_segments
    kind = spec.reduce
    avals = [jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in walk.ops]
    msgs = eo.message_avals(spec, avals)
    if kind == eo.Reduce.NONE:
        init = [jnp.zeros((spec.num_edges,) + m.shape[1:], m.dtype) for m in msgs]

        def step(outs, start, size):
            ys, _, _ = walk.block(start, size)
            return [jax.lax.dynamic_update_slice_in_dim(o, y.astype(o.dtype), start, 0)
                    for o, y in zip(outs, ys, strict=True)]

        return walk.fold(step, init)
    if spec.over == Group.ALL:
        init = [jnp.zeros(m.shape, accumulation_dtype(m.dtype)) for m in msgs]

        def step(acc, start, size):
            ys, _, _ = walk.block(start, size)
            return [a + y.astype(a.dtype) for a, y in zip(acc, ys, strict=True)]

        return [a.astype(m.dtype) for a, m in zip(walk.fold(step, init), msgs, strict=True)]
    if kind == eo.Reduce.SOFTMAX:
        return _online_softmax(walk, msgs, n)
    count0 = jnp.zeros((n,), jnp.float32)
    if kind in (eo.Reduce.SUM, eo.Reduce.MEAN):
        init = ([jnp.zeros((n,) + m.shape[1:], accumulation_dtype(m.dtype)) for m in msgs], count0)

        def step(carry, start, size):
            acc, count = carry
            ys, rows, _ = walk.block(start, size)
            acc = [a + jax.ops.segment_sum(y.astype(a.dtype), rows, n) for a, y in zip(acc, ys, strict=True)]
            return acc, count + counts(rows, n)

        acc, count = walk.fold(step, init)
        if kind == eo.Reduce.SUM:
            return [a.astype(m.dtype) for a, m in zip(acc, msgs, strict=True)]
        count = count.astype(eo.count_dtype(msgs[0].dtype))
        return [(a / eo._trail(jnp.maximum(count, 1), a.ndim).astype(a.dtype)).astype(eo.mean_dtype(m.dtype))
                for a, m in zip(acc, msgs, strict=True)] + [count]
    if spec.hits:
        return _extremum_with_hits(walk, msgs, n)
    segment, combine = EXTREMUM[kind]
    init = ([jnp.full((n,) + m.shape[1:], identity(kind.value, m.dtype), m.dtype) for m in msgs], count0)

    def step(carry, start, size):
        best, count = carry
        ys, rows, _ = walk.block(start, size)
        best = [combine(b, segment(y, rows, n)) for b, y in zip(best, ys, strict=True)]
        return best, count + counts(rows, n)

    best, count = walk.fold(step, init)
    return _empty_rows(spec, best, count)


EXTREMUM = {eo.Reduce.MAX: (jax.ops.segment_max, jnp.maximum), eo.Reduce.MIN: (jax.ops.segment_min, jnp.minimum)}


def _empty_rows(spec: eo.EdgeSpec, best: list, count) -> list:
    if spec.empty != "zero":
        return best
    return [jnp.where(eo._trail(count, b.ndim) > 0, b, jnp.zeros((), b.dtype)) for b in best]


def _extremum_with_hits(walk: _Walk, msgs, n: int) -> list:
    """Max/min and, per edge, whether it attains its row's result: two sweeps of one loop body, so that each
    block's values are the same bits in both (the first sweep reduces, the second compares). The tail is padded
    to a whole block for the same reason: one body computes every block."""
    spec = walk.spec
    segment, combine = EXTREMUM[spec.reduce]
    size, blocks = walk.size, -(-spec.num_edges // walk.size)
    padded = blocks * size
    pad = padded - spec.num_edges
    src = jnp.concatenate([walk.src, jnp.zeros((pad,), walk.src.dtype)])
    dst = jnp.concatenate([walk.dst, jnp.full((pad,), spec.num_segments, walk.dst.dtype)])
    if spec.over == Group.SRC:
        src, dst = (jnp.concatenate([walk.src, jnp.full((pad,), spec.num_segments, walk.src.dtype)]),
                    jnp.concatenate([walk.dst, jnp.zeros((pad,), walk.dst.dtype)]))
    operands = [jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)]) if g == Group.EDGE else x
                for x, g in zip(walk.ops, spec.groups, strict=True)]
    padded_walk = _Walk(spec.replace(num_edges=padded), [src, dst, *operands], size)
    init = ([jnp.full((n,) + m.shape[1:], identity(spec.reduce.value, m.dtype), m.dtype) for m in msgs],
            jnp.zeros((n,), jnp.float32), [jnp.zeros((padded,) + m.shape[1:], jnp.bool_) for m in msgs])

    def step(i, carry):
        best, count, hits = carry
        second = i >= blocks
        start = (i % blocks) * size
        ys, rows, _ = padded_walk.block(start, size)
        ys = [materialize(y) for y in ys]
        new_best = [combine(b, segment(y, rows, n)) for b, y in zip(best, ys, strict=True)]
        best = [jnp.where(second, b, nb) for b, nb in zip(best, new_best, strict=True)]
        count = jnp.where(second, count, count + counts(rows, n))
        marks = [(y == jnp.take(jnp.concatenate([b, jnp.zeros((1,) + b.shape[1:], b.dtype)]), rows, axis=0))
                 & eo._trail(rows < n, y.ndim) for y, b in zip(ys, best, strict=True)]
        hits = [jnp.where(second, jax.lax.dynamic_update_slice_in_dim(h, m, start, 0), h)
                for h, m in zip(hits, marks, strict=True)]
        return best, count, hits

    best, count, hits = jax.lax.fori_loop(0, 2 * blocks, step, init)
    return _empty_rows(spec, best, count) + [h[:spec.num_edges] for h in hits]


def _online_softmax(walk: _Walk, msgs, n: int) -> list:
    """Per row: running max ``m``, normaliser ``l`` and accumulator, one block at a time.

    Equal to the two-pass formula in NaN and infinity behaviour: while a row's running max is −inf nothing is
    committed (the shift is 0 and the correction 1), so a row whose first block is all −inf still gets its
    finite answer later, a row that is −inf throughout gives NaN like −inf − (−inf), and NaN or +inf scores
    propagate. The tangent rules read ``m`` and ``l`` separately, never ``m + log l``.
    """
    s_aval, v_aval = msgs
    stat = accumulation_dtype(s_aval.dtype)
    out_dtype = jnp.result_type(s_aval.dtype, v_aval.dtype)
    acc_dtype = accumulation_dtype(out_dtype)
    heads = s_aval.shape[1:]
    zeros = jnp.zeros((n,) + heads, stat)
    init = (jnp.full((n,) + heads, -jnp.inf, stat), zeros, zeros,
            jnp.zeros((n,) + v_aval.shape[1:], acc_dtype), jnp.zeros((n,), jnp.float32))

    def step(carry, start, size):
        m, l, saved, acc, count = carry
        (s, v), rows, gather_rows = walk.block(start, size)
        s = s.astype(stat)
        m_new = jnp.maximum(m, jax.ops.segment_max(s, rows, n))
        shift = jnp.where(m_new == -jnp.inf, jnp.zeros((), stat), m_new)
        corr = jnp.where(m == m_new, jnp.ones((), stat), jnp.exp(m - shift))
        shift_rows = jnp.take(shift, gather_rows, axis=0, mode="clip")
        p = edge_fn.shifted_exp(s, shift_rows)
        l = l * corr + jax.ops.segment_sum(p, rows, n)
        # an earlier max that snaps to the new one counts 1 there too, as the rules recompute its weight
        saved = (saved * jnp.where(edge_fn.snaps_to_max(m, shift), jnp.ones((), stat), corr)
                 + eo.saved_normaliser(s, shift_rows, rows, n))
        msg = eo._trail(p, v.ndim).astype(acc_dtype) * v.astype(acc_dtype)
        acc = acc * eo._trail(corr, acc.ndim).astype(acc_dtype) + jax.ops.segment_sum(msg, rows, n)
        return m_new, l, saved, acc, count + counts(rows, n)

    m, l, saved, acc, count = walk.fold(step, init)
    has_edges = eo._trail(count, acc.ndim) > 0
    all_neg_inf = eo._trail(m == -jnp.inf, acc.ndim) & has_edges
    out = jnp.where(has_edges, eo.divide_rows(acc, l), jnp.zeros((), acc_dtype))
    out = jnp.where(all_neg_inf, jnp.full((), math.nan, acc_dtype), out)
    return [out.astype(out_dtype), m, saved]
