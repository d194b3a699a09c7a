"""XLA lowerings of the fused ops that walk the edges in blocks (GraphCast-style edge-block remat).

Each op loops over fixed-size edge blocks (``lax.fori_loop``), so the forward never holds more than one
block of edge values, and has a ``jax.custom_vjp`` whose residuals are its inputs plus node-level values:
the backward recomputes each block's edge values from them (UGCG/dgNN's recompute-don't-store).

* `gather_reduce_sum`: ``out[v] = Σ_{e→v} f(src[s(e)], dst[v], edge[e])``.
* `gather_reduce_extremum`: the same with max or min (``-inf``/``+inf`` for empty rows, as
  ``jax.ops.segment_max``). The residuals are the per-node extremum and its tie count: the backward remakes
  each block's values and splits the gradient equally among tied edges, exactly as JAX's scatter-max rule.
* `attention`: online softmax over blocks (running max, sum and accumulator per node); the backward uses the
  saved per-node log-sum-exp and output, as FlashAttention does.

The block size comes from a memory budget (`block_size`): ``JGNN_EDGE_BLOCK_BYTES``, default 4 MiB per
block-sized edge tensor. Edges are padded to whole blocks with ids pointing past the last node, which segment
sums drop.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from pallas_kernels import residuals

DEFAULT_BLOCK_BYTES = 4 << 20


def block_size(num_edges: int, row_bytes: int) -> int:
    budget = int(os.environ.get("JGNN_EDGE_BLOCK_BYTES", DEFAULT_BLOCK_BYTES))
    rows = max(1, budget // max(row_bytes, 1))
    return int(min(num_edges, rows)) if num_edges else 1


def _blocks(x, size: int, fill):
    """Pad the leading axis to whole blocks: ``[num_blocks * size, ...]``."""
    pad = (-x.shape[0]) % size
    return jnp.concatenate([x, jnp.full((pad,) + x.shape[1:], fill, x.dtype)]) if pad else x


def _take(x, start, size):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=0)


def _rows(group, ids):
    return tuple(x[ids] for x in group)


def _add_block_grads(carry, grads, sb, rb, i):
    """Add one block's pullback ``(d src rows, d dst rows, d edge rows, *d hoisted)`` to the running
    cotangents: node rows scatter-add by their ids, edge rows land in the block's slice."""
    d_src, d_dst, d_edge, d_hoisted = carry
    cs, cd, ce, *ch = grads
    return (tuple(a + jax.ops.segment_sum(c, sb, a.shape[0]) for a, c in zip(d_src, cs, strict=True)),
            tuple(a + jax.ops.segment_sum(c, rb, a.shape[0]) for a, c in zip(d_dst, cd, strict=True)),
            tuple(jax.lax.dynamic_update_slice_in_dim(a, c.astype(a.dtype), i, 0)
                  for a, c in zip(d_edge, ce, strict=True)),
            tuple(a + c for a, c in zip(d_hoisted, ch, strict=True)))


# ---- gather → f → segment sum ----------------------------------------------------------------------------

def _hoist(fn: Callable, size: int, src, dst, edge, senders, receivers):
    """``fn`` with the tracers it closes over (weights, constants) made explicit, differentiable arguments.

    Traced at the block size: every block has exactly ``size`` rows.
    """
    ids = jnp.zeros((size,), jnp.int32)
    example = (_rows(src, ids), _rows(dst, ids), tuple(jnp.zeros((size,) + x.shape[1:], x.dtype) for x in edge))
    converted, hoisted = jax.closure_convert(fn, *example)
    return converted, tuple(hoisted)


def gather_reduce_sum(edge_fn: Callable, num_nodes: int, size: int, src, dst, edge, senders, receivers):
    """``[num_nodes, ...]``: ``Σ_{e→v} edge_fn(src rows, dst rows, edge rows)`` over blocks of ``size`` edges."""
    fn, hoisted = _hoist(edge_fn, size, src, dst, edge, senders, receivers)
    return _gather_reduce_sum(fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers)


def _unread_by_backward(fn: Callable, size: int, src, dst, edge, hoisted) -> tuple:
    """Edge operands a block's pullback never reads (see `pallas_kernels.residuals`): a sum of messages linear
    in one whose other factors are not differentiated (RGCN's typed messages times degree normalisers) keeps
    no copy of it for the backward, so the recomputation policy has nothing edge-sized to save or remake."""
    ids = jnp.zeros((size,), jnp.int32)
    blocks = (_rows(src, ids), _rows(dst, ids), tuple(jnp.zeros((size,) + x.shape[1:], x.dtype) for x in edge))
    return residuals.unread_operands(fn, (*blocks, *hoisted), 2, edge)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gather_reduce_sum(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    return _gr_forward(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers)


def _gr_forward(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    s, r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
    e = tuple(_blocks(x, size, 0) for x in edge)
    ids = jnp.zeros((size,), jnp.int32)
    out0 = jax.eval_shape(lambda: edge_fn(_rows(src, ids), _rows(dst, ids), tuple(_take(x, 0, size) for x in e),
                                          *hoisted))

    def body(b, acc):
        i = b * size
        sb, rb = _take(s, i, size), _take(r, i, size)
        rows = edge_fn(_rows(src, sb), _rows(dst, jnp.minimum(rb, num_nodes - 1)),
                       tuple(_take(x, i, size) for x in e), *hoisted)
        return acc + jax.ops.segment_sum(rows, rb, num_nodes)

    acc = jnp.zeros((num_nodes,) + out0.shape[1:], jnp.float32)
    return jax.lax.fori_loop(0, s.shape[0] // size, body, acc).astype(out0.dtype)


def _gr_fwd(edge_fn, num_nodes, size, *primals):
    (src, dst, edge, hoisted, senders, receivers), perturbed = residuals.split_primals(primals)
    out = _gr_forward(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers)
    fn = residuals.frozen(edge_fn, (*perturbed[:3], *perturbed[3]))
    dropped = _unread_by_backward(fn, size, src, dst, edge, hoisted)
    return out, (src, dst, residuals.keep(edge, dropped), hoisted, senders, receivers,
                 residuals.flags(perturbed[:4]))


def _gr_bwd(edge_fn, num_nodes, size, res, g):
    src, dst, kept, hoisted, senders, receivers, encoded = res
    perturbed = residuals.unflag(encoded, (src, dst, (0,) * len(kept), hoisted))
    edge_fn = residuals.frozen(edge_fn, (*perturbed[:3], *perturbed[3]))
    g = jnp.zeros(g.aval.shape, g.aval.dtype) if isinstance(g, SymbolicZero) else g
    n_edges = senders.shape[0]
    s, r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
    e = tuple(x if residuals.is_dropped(x) else _blocks(x, size, 0) for x in kept)
    # An operand the pullback never reads (see `_unread_by_backward`) is fed as a block of zeros.
    def block(x, i):
        if residuals.is_dropped(x):
            shape, dtype = residuals.dropped_shape(x)
            return jnp.zeros((size,) + shape[1:], dtype)
        return _take(x, i, size)

    g_pad = jnp.concatenate([g, jnp.zeros((1,) + g.shape[1:], g.dtype)])  # row num_nodes: padding edges

    def body(b, carry):
        i = b * size
        sb, rb = _take(s, i, size), _take(r, i, size)
        rb_safe = jnp.minimum(rb, num_nodes - 1)
        eb = tuple(block(x, i) for x in e)
        _, pullback = jax.vjp(edge_fn, _rows(src, sb), _rows(dst, rb_safe), eb, *hoisted)
        return _add_block_grads(carry, pullback(g_pad[rb].astype(jnp.result_type(g))), sb, rb, i)

    zeros = lambda group: tuple(jnp.zeros_like(x) for x in group)
    d_e0 = tuple(_blocks(jnp.zeros_like(x), size, 0) for x in residuals.restore(kept))
    init = (zeros(src), zeros(dst), d_e0, zeros(hoisted))
    d_src, d_dst, d_edge, d_hoisted = jax.lax.fori_loop(0, s.shape[0] // size, body, init)
    d_edge = tuple(x[:n_edges] for x in d_edge)
    return d_src, d_dst, d_edge, d_hoisted, None, None


_gather_reduce_sum.defvjp(_gr_fwd, _gr_bwd, symbolic_zeros=True)


# ---- gather → f → segment max / min ------------------------------------------------------------------

# kind -> (identity, combine, segment reduction)
EXTREMA = {"max": (-jnp.inf, jnp.maximum, jax.ops.segment_max), "min": (jnp.inf, jnp.minimum, jax.ops.segment_min)}


def gather_reduce_extremum(edge_fn: Callable, kind: str, num_nodes: int, size: int, src, dst, edge, senders,
                           receivers):
    """``[num_nodes, ...]``: the ``kind`` ("max"/"min") of ``edge_fn``'s rows over each node's in-edges."""
    fn, hoisted = _hoist(edge_fn, size, src, dst, edge, senders, receivers)
    return _gather_reduce_extremum(fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _gather_reduce_extremum(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    return _ext_forward(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers)[0]


def _ext_rows(edge_fn, num_nodes, size, src, dst, e, hoisted, s, r, i):
    sb, rb = _take(s, i, size), _take(r, i, size)
    return edge_fn(_rows(src, sb), _rows(dst, jnp.minimum(rb, num_nodes - 1)),
                   tuple(_take(x, i, size) for x in e), *hoisted), sb, rb


def _ext_forward(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    identity, combine, segment = EXTREMA[kind]
    s, r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
    e = tuple(_blocks(x, size, 0) for x in edge)
    out0 = jax.eval_shape(lambda: _ext_rows(edge_fn, num_nodes, size, src, dst, e, hoisted, s, r, 0)[0])
    pad = jnp.full((1,) + out0.shape[1:], identity, out0.dtype)

    def body(b, carry):  # running extremum and how many edges attain it, per node and lane
        best, count = carry
        rows, _, rb = _ext_rows(edge_fn, num_nodes, size, src, dst, e, hoisted, s, r, b * size)
        block_best = segment(rows, rb, num_nodes)
        hits = jax.ops.segment_sum((rows == jnp.concatenate([block_best, pad])[rb]).astype(jnp.float32), rb,
                                   num_nodes)
        new = combine(best, block_best)
        return new, jnp.where(block_best == new, hits, 0.0) + jnp.where(best == new, count, 0.0)

    init = (jnp.full((num_nodes,) + out0.shape[1:], identity, out0.dtype),
            jnp.zeros((num_nodes,) + out0.shape[1:], jnp.float32))
    return jax.lax.fori_loop(0, s.shape[0] // size, body, init)


def _ext_fwd(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    best, count = _ext_forward(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers)
    best_saved, count = residuals.name_stats(best, count)
    return best, (src, dst, edge, hoisted, senders, receivers, best_saved, count)  # node-level residuals only


def _ext_bwd(edge_fn, kind, num_nodes, size, res, g):
    src, dst, edge, hoisted, senders, receivers, best, count = res
    identity = EXTREMA[kind][0]
    n_edges = senders.shape[0]
    s, r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
    e = tuple(_blocks(x, size, 0) for x in edge)
    # JAX's scatter-max rule: tied edges share the gradient equally, and so does the identity it started from
    # when every edge attains it (all -inf).
    share = 1.0 / (count + (best == identity))
    pad_row = lambda x, fill: jnp.concatenate([x, jnp.full((1,) + x.shape[1:], fill, x.dtype)])
    best_p, share_p, g_p = pad_row(best, identity), pad_row(share, 0.0), pad_row(g.astype(jnp.float32), 0.0)

    def body(b, carry):
        i = b * size
        sb, rb = _take(s, i, size), _take(r, i, size)
        eb = tuple(_take(x, i, size) for x in e)
        rows, pullback = jax.vjp(edge_fn, _rows(src, sb), _rows(dst, jnp.minimum(rb, num_nodes - 1)), eb, *hoisted)
        ct = jnp.where(rows == best_p[rb], g_p[rb] * share_p[rb], 0.0).astype(rows.dtype)
        return _add_block_grads(carry, pullback(ct), sb, rb, i)

    zeros = lambda group: tuple(jnp.zeros_like(x) for x in group)
    init = (zeros(src), zeros(dst), zeros(e), zeros(hoisted))
    d_src, d_dst, d_edge, d_hoisted = jax.lax.fori_loop(0, s.shape[0] // size, body, init)
    return d_src, d_dst, tuple(x[:n_edges] for x in d_edge), d_hoisted, None, None


_gather_reduce_extremum.defvjp(_ext_fwd, _ext_bwd)


# ---- edge softmax + weighted sum -------------------------------------------------------------------------

def attention(score_fn: Callable, num_nodes: int, size: int, value_index: str, src, dst, edge, values, senders,
              receivers):
    """``[N, H, D]``: per-destination softmax of ``score_fn``'s ``[E, H]`` scores, weighting ``values`` rows."""
    fn, hoisted = _hoist(score_fn, size, src, dst, edge, senders, receivers)
    return _attention(fn, num_nodes, size, value_index, src, dst, edge, hoisted, values, senders, receivers)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _attention(score_fn, num_nodes, size, value_index, src, dst, edge, hoisted, values, senders, receivers):
    return _att_forward(score_fn, num_nodes, size, value_index, src, dst, edge, hoisted, values, senders,
                        receivers)[0]


def _value_rows(values, value_index, sb, i, size):
    return values[sb] if value_index == "src" else _take(values, i, size)


def _att_forward(score_fn, num_nodes, size, value_index, src, dst, edge, hoisted, values, senders, receivers):
    s, r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
    e = tuple(_blocks(x, size, 0) for x in edge)
    vals = values if value_index == "src" else _blocks(values, size, 0)
    heads, width = values.shape[1], values.shape[2]

    def body(b, carry):
        m, l, acc = carry
        i = b * size
        sb, rb = _take(s, i, size), _take(r, i, size)
        scores = score_fn(_rows(src, sb), _rows(dst, jnp.minimum(rb, num_nodes - 1)),
                          tuple(_take(x, i, size) for x in e), *hoisted).astype(jnp.float32)
        m_new = jnp.maximum(m, jax.ops.segment_max(scores, rb, num_nodes))
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        scale = jnp.exp(jnp.where(jnp.isfinite(m), m - shift, -jnp.inf))
        p = jnp.exp(scores - jnp.concatenate([shift, jnp.zeros((1, heads))])[rb])
        v = _value_rows(vals, value_index, sb, i, size).astype(jnp.float32)
        l = l * scale + jax.ops.segment_sum(p, rb, num_nodes)
        acc = acc * scale[..., None] + jax.ops.segment_sum(p[..., None] * v, rb, num_nodes)
        return m_new, l, acc

    init = (jnp.full((num_nodes, heads), -jnp.inf, jnp.float32), jnp.zeros((num_nodes, heads), jnp.float32),
            jnp.zeros((num_nodes, heads, width), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, s.shape[0] // size, body, init)
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    lse = jnp.where(l > 0, jnp.where(jnp.isfinite(m), m, 0.0) + jnp.log(jnp.where(l > 0, l, 1.0)), jnp.inf)
    return out.astype(values.dtype), lse


def _att_fwd(score_fn, num_nodes, size, value_index, src, dst, edge, hoisted, values, senders, receivers):
    out, lse = _att_forward(score_fn, num_nodes, size, value_index, src, dst, edge, hoisted, values, senders,
                            receivers)
    out, lse = residuals.name_stats(out, lse)
    return out, (src, dst, edge, hoisted, values, senders, receivers, out, lse)  # node-level residuals only


def _att_bwd(score_fn, num_nodes, size, value_index, res, g):
    src, dst, edge, hoisted, values, senders, receivers, out, lse = res
    n_edges = senders.shape[0]
    s, r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
    e = tuple(_blocks(x, size, 0) for x in edge)
    vals = values if value_index == "src" else _blocks(values, size, 0)
    g = g.astype(jnp.float32)
    delta = jnp.sum(g * out.astype(jnp.float32), -1)  # [N, H]: Σ_d dout·out, FlashAttention's D
    pad_row = lambda x, fill: jnp.concatenate([x, jnp.full((1,) + x.shape[1:], fill, x.dtype)])
    g_p, lse_p, delta_p = pad_row(g, 0.0), pad_row(lse, jnp.inf), pad_row(delta, 0.0)

    def body(b, carry):
        d_src, d_dst, d_edge, d_hoisted, d_vals = carry
        i = b * size
        sb, rb = _take(s, i, size), _take(r, i, size)
        eb = tuple(_take(x, i, size) for x in e)
        scores, pullback = jax.vjp(score_fn, _rows(src, sb), _rows(dst, jnp.minimum(rb, num_nodes - 1)), eb,
                                   *hoisted)
        p = jnp.exp(scores.astype(jnp.float32) - lse_p[rb])  # α, recomputed
        v = _value_rows(vals, value_index, sb, i, size).astype(jnp.float32)
        dv = p[..., None] * g_p[rb]
        ds = p * (jnp.sum(g_p[rb] * v, -1) - delta_p[rb])
        d_src, d_dst, d_edge, d_hoisted = _add_block_grads((d_src, d_dst, d_edge, d_hoisted),
                                                            pullback(ds.astype(scores.dtype)), sb, rb, i)
        if value_index == "src":
            d_vals = d_vals + jax.ops.segment_sum(dv, sb, d_vals.shape[0])
        else:
            d_vals = jax.lax.dynamic_update_slice_in_dim(d_vals, dv, i, 0)
        return d_src, d_dst, d_edge, d_hoisted, d_vals

    zeros = lambda group: tuple(jnp.zeros_like(x) for x in group)
    init = (zeros(src), zeros(dst), zeros(e), zeros(hoisted), jnp.zeros(vals.shape, jnp.float32))
    d_src, d_dst, d_edge, d_hoisted, d_vals = jax.lax.fori_loop(0, s.shape[0] // size, body, init)
    d_vals = (d_vals if value_index == "src" else d_vals[:n_edges]).astype(values.dtype)
    return d_src, d_dst, tuple(x[:n_edges] for x in d_edge), d_hoisted, d_vals, None, None


_attention.defvjp(_att_fwd, _att_bwd)


def typed_dot(dot_row: Callable, x, table, types, size: int):
    """``y[e] = dot_row(x[e], table[types[e]])`` over blocks of ``size`` rows.

    Exactly the FLOPs of the per-row products, and at most one block of gathered weights alive: the CPU form
    of a typed matmul (``ragged_dot`` multiplies every row by every type's weight there). The block body is
    rematerialised, so the backward re-gathers weights instead of saving them.
    """
    rows = x.shape[0]
    xb = _blocks(x, size, 0).reshape((-1, size) + x.shape[1:])
    tb = _blocks(types, size, 0).reshape(-1, size)

    @jax.checkpoint
    def block(args):
        xs, ts = args
        return dot_row(xs, table[ts])

    out = jax.lax.map(block, (xb, tb))
    return out.reshape((-1,) + out.shape[2:])[:rows]
