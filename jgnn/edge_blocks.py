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


def _pad_row(x, fill):
    """One more row of ``fill``: what the padding edges (ids ``num_nodes``) read."""
    return jnp.concatenate([x, jnp.full((1,) + x.shape[1:], fill, x.dtype)])


class _Walk:
    """The edges padded to whole blocks of ``size``, and what every loop reads per block.

    An edge operand may be a `pallas_kernels.residuals.keep` marker (dropped from a VJP's residuals because
    its backward never reads it): its blocks are zeros.
    """

    def __init__(self, size: int, num_nodes: int, src, dst, edge, senders, receivers):
        self.size, self.num_nodes, self.src, self.dst = size, num_nodes, src, dst
        self.n_edges = senders.shape[0]
        self.s, self.r = _blocks(senders, size, 0), _blocks(receivers, size, num_nodes)
        self.e = tuple(x if residuals.is_dropped(x) else _blocks(x, size, 0) for x in edge)
        self.num_blocks = self.s.shape[0] // size

    def block(self, b):
        """(start row, sender ids, receiver ids, (src rows, dst rows, edge rows)) of block ``b``."""
        i = b * self.size
        sb, rb = _take(self.s, i, self.size), _take(self.r, i, self.size)
        edge = tuple(residuals.zeros_for(x, self.size) if residuals.is_dropped(x) else _take(x, i, self.size)
                     for x in self.e)
        return i, sb, rb, (_rows(self.src, sb), _rows(self.dst, jnp.minimum(rb, self.num_nodes - 1)), edge)

    def zero_grads(self, hoisted) -> tuple:
        """Initial cotangents (src, dst, padded edge, hoisted) of a backward walk."""
        zeros = lambda group: tuple(jnp.zeros_like(x) for x in group)
        edge = tuple(residuals.zeros_for(x, self.s.shape[0]) if residuals.is_dropped(x) else jnp.zeros_like(x)
                     for x in self.e)
        return zeros(self.src), zeros(self.dst), edge, zeros(hoisted)

    def add_grads(self, carry, grads, sb, rb, i):
        """Add one block's pullback ``(d src rows, d dst rows, d edge rows, *d hoisted)`` to the running
        cotangents: node rows scatter-add by their ids, edge rows land in the block's slice."""
        d_src, d_dst, d_edge, d_hoisted = carry
        cs, cd, ce, *ch = grads
        return (tuple(a + jax.ops.segment_sum(c, sb, a.shape[0]) for a, c in zip(d_src, cs, strict=True)),
                tuple(a + jax.ops.segment_sum(c, rb, a.shape[0]) for a, c in zip(d_dst, cd, strict=True)),
                tuple(jax.lax.dynamic_update_slice_in_dim(a, c.astype(a.dtype), i, 0)
                      for a, c in zip(d_edge, ce, strict=True)),
                tuple(a + c for a, c in zip(d_hoisted, ch, strict=True)))

    def loop(self, body, init):
        return jax.lax.fori_loop(0, self.num_blocks, body, init)

    def trim(self, d_edge) -> tuple:
        return tuple(x[:self.n_edges] for x in d_edge)


# ---- gather → f → segment sum ----------------------------------------------------------------------------

def _hoist(fn: Callable, size: int, src, dst, edge, senders, receivers):
    """``fn`` with the tracers it closes over (weights, constants) made explicit, differentiable arguments.

    Traced at the block size: every block has exactly ``size`` rows.
    """
    converted, hoisted = jax.closure_convert(fn, *_example_block(size, src, dst, edge))
    return converted, tuple(hoisted)


def _example_block(size: int, src, dst, edge) -> tuple:
    """Stand-in (src rows, dst rows, edge rows) of one block, for tracing."""
    ids = jnp.zeros((size,), jnp.int32)
    return _rows(src, ids), _rows(dst, ids), tuple(jnp.zeros((size,) + x.shape[1:], x.dtype) for x in edge)


def gather_reduce_sum(edge_fn: Callable, num_nodes: int, size: int, src, dst, edge, senders, receivers):
    """``[num_nodes, ...]``: ``Σ_{e→v} edge_fn(src rows, dst rows, edge rows)`` over blocks of ``size`` edges."""
    fn, hoisted = _hoist(edge_fn, size, src, dst, edge, senders, receivers)
    return _gather_reduce_sum(fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gather_reduce_sum(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    return _gr_forward(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers)


def _gr_forward(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    walk = _Walk(size, num_nodes, src, dst, edge, senders, receivers)
    out0 = jax.eval_shape(edge_fn, *_example_block(size, src, dst, edge), *hoisted)

    def body(b, acc):
        _, _, rb, rows = walk.block(b)
        return acc + jax.ops.segment_sum(edge_fn(*rows, *hoisted), rb, num_nodes)

    acc = jnp.zeros((num_nodes,) + out0.shape[1:], jnp.float32)
    return walk.loop(body, acc).astype(out0.dtype)


def _gr_fwd(edge_fn, num_nodes, size, *primals):
    (src, dst, edge, hoisted, senders, receivers), perturbed = residuals.split_primals(primals)
    out = _gr_forward(edge_fn, num_nodes, size, src, dst, edge, hoisted, senders, receivers)
    # A sum of messages linear in an edge operand whose other factors are not differentiated (RGCN's typed
    # messages times degree normalisers) never reads it in the backward: it is not kept, so the
    # recomputation policy has nothing edge-sized to save or remake.
    fn = residuals.frozen(edge_fn, (*perturbed[:3], *perturbed[3]))
    dropped = residuals.unread_operands(fn, (*_example_block(size, src, dst, edge), *hoisted), 2, edge)
    return out, (src, dst, residuals.keep(edge, dropped), hoisted, senders, receivers,
                 residuals.flags(perturbed[:4]))


def _gr_bwd(edge_fn, num_nodes, size, res, g):
    src, dst, kept, hoisted, senders, receivers, encoded = res
    perturbed = residuals.unflag(encoded, (src, dst, (0,) * len(kept), hoisted))
    edge_fn = residuals.frozen(edge_fn, (*perturbed[:3], *perturbed[3]))
    g = jnp.zeros(g.aval.shape, g.aval.dtype) if isinstance(g, SymbolicZero) else g
    walk = _Walk(size, num_nodes, src, dst, kept, senders, receivers)
    g_pad = _pad_row(g, 0)

    def body(b, carry):
        i, sb, rb, rows = walk.block(b)
        _, pullback = jax.vjp(edge_fn, *rows, *hoisted)
        return walk.add_grads(carry, pullback(g_pad[rb].astype(jnp.result_type(g))), sb, rb, i)

    d_src, d_dst, d_edge, d_hoisted = walk.loop(body, walk.zero_grads(hoisted))
    return d_src, d_dst, walk.trim(d_edge), d_hoisted, None, None


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


def _ext_forward(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    identity, combine, segment = EXTREMA[kind]
    walk = _Walk(size, num_nodes, src, dst, edge, senders, receivers)
    out0 = jax.eval_shape(edge_fn, *_example_block(size, src, dst, edge), *hoisted)
    pad = jnp.full((1,) + out0.shape[1:], identity, out0.dtype)

    def body(b, carry):  # running extremum and how many edges attain it, per node and lane
        best, count = carry
        _, _, rb, rows = walk.block(b)
        rows = edge_fn(*rows, *hoisted)
        block_best = segment(rows, rb, num_nodes)
        hits = jax.ops.segment_sum((rows == jnp.concatenate([block_best, pad])[rb]).astype(jnp.float32), rb,
                                   num_nodes)
        new = combine(best, block_best)
        return new, jnp.where(block_best == new, hits, 0.0) + jnp.where(best == new, count, 0.0)

    init = (jnp.full((num_nodes,) + out0.shape[1:], identity, out0.dtype),
            jnp.zeros((num_nodes,) + out0.shape[1:], jnp.float32))
    return walk.loop(body, init)


def _ext_fwd(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers):
    best, count = _ext_forward(edge_fn, kind, num_nodes, size, src, dst, edge, hoisted, senders, receivers)
    best_saved, count = residuals.name_stats(best, count)
    return best, (src, dst, edge, hoisted, senders, receivers, best_saved, count)  # node-level residuals only


def _ext_bwd(edge_fn, kind, num_nodes, size, res, g):
    src, dst, edge, hoisted, senders, receivers, best, count = res
    identity = EXTREMA[kind][0]
    walk = _Walk(size, num_nodes, src, dst, edge, senders, receivers)
    # JAX's scatter-max rule: tied edges share the gradient equally, and so does the identity it started from
    # when every edge attains it (all -inf).
    share = 1.0 / (count + (best == identity))
    best_p, share_p, g_p = _pad_row(best, identity), _pad_row(share, 0.0), _pad_row(g.astype(jnp.float32), 0.0)

    def body(b, carry):
        i, sb, rb, rows = walk.block(b)
        values, pullback = jax.vjp(edge_fn, *rows, *hoisted)
        ct = jnp.where(values == best_p[rb], g_p[rb] * share_p[rb], 0.0).astype(values.dtype)
        return walk.add_grads(carry, pullback(ct), sb, rb, i)

    d_src, d_dst, d_edge, d_hoisted = walk.loop(body, walk.zero_grads(hoisted))
    return d_src, d_dst, walk.trim(d_edge), d_hoisted, None, None


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
    walk = _Walk(size, num_nodes, src, dst, edge, senders, receivers)
    vals = values if value_index == "src" else _blocks(values, size, 0)
    heads, width = values.shape[1], values.shape[2]

    def body(b, carry):
        m, l, acc = carry
        i, sb, rb, rows = walk.block(b)
        scores = score_fn(*rows, *hoisted).astype(jnp.float32)
        m_new = jnp.maximum(m, jax.ops.segment_max(scores, rb, num_nodes))
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        scale = jnp.exp(jnp.where(jnp.isfinite(m), m - shift, -jnp.inf))
        p = jnp.exp(scores - _pad_row(shift, 0.0)[rb])
        v = _value_rows(vals, value_index, sb, i, size).astype(jnp.float32)
        l = l * scale + jax.ops.segment_sum(p, rb, num_nodes)
        acc = acc * scale[..., None] + jax.ops.segment_sum(p[..., None] * v, rb, num_nodes)
        return m_new, l, acc

    init = (jnp.full((num_nodes, heads), -jnp.inf, jnp.float32), jnp.zeros((num_nodes, heads), jnp.float32),
            jnp.zeros((num_nodes, heads, width), jnp.float32))
    m, l, acc = walk.loop(body, init)
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
    walk = _Walk(size, num_nodes, src, dst, edge, senders, receivers)
    vals = values if value_index == "src" else _blocks(values, size, 0)
    g = g.astype(jnp.float32)
    delta = jnp.sum(g * out.astype(jnp.float32), -1)  # [N, H]: Σ_d dout·out, FlashAttention's D
    g_p, lse_p, delta_p = _pad_row(g, 0.0), _pad_row(lse, jnp.inf), _pad_row(delta, 0.0)

    def body(b, carry):
        grads, d_vals = carry
        i, sb, rb, rows = walk.block(b)
        scores, pullback = jax.vjp(score_fn, *rows, *hoisted)
        p = jnp.exp(scores.astype(jnp.float32) - lse_p[rb])  # α, recomputed
        v = _value_rows(vals, value_index, sb, i, size).astype(jnp.float32)
        dv = p[..., None] * g_p[rb]
        ds = p * (jnp.sum(g_p[rb] * v, -1) - delta_p[rb])
        grads = walk.add_grads(grads, pullback(ds.astype(scores.dtype)), sb, rb, i)
        if value_index == "src":
            d_vals = d_vals + jax.ops.segment_sum(dv, sb, d_vals.shape[0])
        else:
            d_vals = jax.lax.dynamic_update_slice_in_dim(d_vals, dv, i, 0)
        return grads, d_vals

    (d_src, d_dst, d_edge, d_hoisted), d_vals = walk.loop(
        body, (walk.zero_grads(hoisted), jnp.zeros(vals.shape, jnp.float32)))
    d_vals = (d_vals if value_index == "src" else d_vals[:walk.n_edges]).astype(values.dtype)
    return d_src, d_dst, walk.trim(d_edge), d_hoisted, d_vals, None, None


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
