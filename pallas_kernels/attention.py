"""Edge-softmax attention aggregation (GAT / Transformer-conv / HGT style) with online softmax.

For every row ``v`` of the forward CSR and head ``h``::

    s[e, h]   = score_fn(src_rows, dst_rows, edge_rows)[e, h]          (logits, recomputed, never stored)
    α[e, h]   = softmax over the row's slots e of s[:, h]
    out[v,h,:] = Σ_e  α[e,h] · keep(seed, eid, h) / (1 - rate) · values[idx(e), h, :]

``idx(e)`` is the slot's source node (``value_index="src"``) or its edge id (``"edge"``, per-edge values
as in HGT). Operands are ``[*, H]`` or ``[*, H, Dk]`` arrays (``src`` rows gathered by ``csr.col``,
``dst`` read at the row, ``edge`` gathered by ``csr.eid``), zero-padded to powers of two, so
``score_fn`` must be zero-padding-safe (dot products over Dk, elementwise over heads) and return
``[B, Hp]``. Rows without in-edges give 0.

The forward is one pass with a running max / sum / accumulator per head; the only residuals are the
per-node logsumexp ``[R, H]`` and the output. The backward recomputes logits and the dropout mask
(:func:`pallas_kernels.dropout.edge_dropout_keep`, a hash of (seed, edge id, head)) and uses the flash
attention identity ``Σ_e α_e dα_e = <dO_v, out_v>`` (node-level ``delta``), walking the forward CSR for
dst / edge / per-edge-value cotangents and the reverse CSR for src / per-node-value cotangents.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import _access as acc
from pallas_kernels import _edgewalk as ew
from pallas_kernels import compat, residuals
from pallas_kernels import dropout as dr
from pallas_kernels._config import EdgeBlock, edge_block, next_pow2
from pallas_kernels.csr import CSR


class AttnLayout(NamedTuple):
    n_src: int
    n_dst: int
    n_edge: int
    heads: int
    hp: int
    dim: int  # value width D
    dp: int
    pads: tuple[tuple[int, ...], ...]  # padded trailing shape per operand (src, dst, edge order)
    cfg: EdgeBlock


def _layout(src, dst, edge, values) -> AttnLayout:
    heads, dim = values.shape[1], values.shape[2]
    hp, dp = next_pow2(heads), next_pow2(dim)
    pads = []
    widest = hp * dp
    for x in (*src, *dst, *edge):
        if x.ndim not in (2, 3) or x.shape[1] != heads:
            raise ValueError(f"score operands must be [*, H] or [*, H, Dk] with H={heads}; got {x.shape}")
        p = (hp,) + tuple(next_pow2(d) for d in x.shape[2:])
        widest = max(widest, math.prod(p))
        pads.append(p)
    return AttnLayout(len(src), len(dst), len(edge), heads, hp, dim, dp, tuple(pads), edge_block(widest))


def _load_ops(refs, pads, rows, mask, block, *, interpret):
    out = []
    for ref, p in zip(refs, pads, strict=True):
        x = acc.gather_block(ref, rows, mask, p, interpret=interpret).astype(jnp.float32)
        out.append(jnp.broadcast_to(x, (block,) + p))
    return tuple(out)


def _scores(score_fn, s, d, e, block, hp):
    return jnp.broadcast_to(jnp.asarray(score_fn(s, d, e), jnp.float32), (block, hp))


def _keep_scale(seed, eid, lay: AttnLayout, rate: float):
    """float32 [B, Hp]: keep(seed, eid, h) / (1 - rate), or None without dropout."""
    if rate <= 0.0:
        return None
    head = jax.lax.broadcasted_iota(jnp.int32, (1, lay.hp), 1)
    keep = dr.edge_dropout_keep(seed, eid[:, None], head, rate)
    return jnp.where(keep, 1.0 / (1.0 - rate), 0.0).astype(jnp.float32)


def _split(refs, lay: AttnLayout):
    a, b, c = lay.n_src, lay.n_src + lay.n_dst, lay.n_src + lay.n_dst + lay.n_edge
    return refs[:a], refs[a:b], refs[b:c], refs[c:]


def _pads(lay: AttnLayout):
    a, b = lay.n_src, lay.n_src + lay.n_dst
    return lay.pads[:a], lay.pads[a:b], lay.pads[b:]


def _fwd_kernel(indptr_ref, col_ref, eid_ref, order_ref, seed_ref, *refs, score_fn, lay, value_index, rate,
                interpret):
    s_refs, d_refs, e_refs, rest = _split(refs, lay)
    v_ref, out_ref, lse_ref = rest
    ps, pd, pe = _pads(lay)
    block, hp, dp = lay.cfg.block_edges, lay.hp, lay.dp
    seed = acc.load_scalar(seed_ref, 0, interpret=interpret)
    r, start, end = ew.row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = ew.own_row(r)
    d_rows = _load_ops(d_refs, pd, own, one, block, interpret=interpret)

    def body(c, carry):
        m_run, l_run, o_run = carry
        m, col, eid = ew.chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        s_rows = _load_ops(s_refs, ps, col, m, block, interpret=interpret)
        e_rows = _load_ops(e_refs, pe, eid, m, block, interpret=interpret)
        s = jnp.where(m[:, None], _scores(score_fn, s_rows, d_rows, e_rows, block, hp), -jnp.inf)
        # Every chunk that runs holds >= 1 valid slot, so m_new is finite and exp(-inf - m_new) = 0.
        m_new = jnp.maximum(m_run, jnp.max(s, axis=0, keepdims=True))
        p = jnp.exp(s - m_new)
        corr = jnp.exp(m_run - m_new)
        l_new = l_run * corr + jnp.sum(p, axis=0, keepdims=True)
        ks = _keep_scale(seed, eid, lay, rate)
        if ks is not None:
            p = p * ks
        vals = acc.gather_block(v_ref, col if value_index == "src" else eid, m, (hp, dp),
                                interpret=interpret).astype(jnp.float32)
        o_new = o_run * corr[:, :, None] + jnp.sum(p[:, :, None] * vals, axis=0, keepdims=True)
        return m_new, l_new, o_new

    init = (jnp.full((1, hp), -jnp.inf, jnp.float32), jnp.zeros((1, hp), jnp.float32),
            jnp.zeros((1, hp, dp), jnp.float32))
    m_run, l_run, o_run = compat.fori_loop(0, ew.num_chunks(start, end, block), body, init)
    nonempty = l_run > 0.0
    out = jnp.where(nonempty[:, :, None], o_run / jnp.where(nonempty, l_run, 1.0)[:, :, None], 0.0)
    lse = jnp.where(nonempty, m_run + jnp.log(jnp.where(nonempty, l_run, 1.0)), 0.0)
    acc.scatter_block(out_ref, own, one, out, interpret=interpret)
    acc.scatter_block(lse_ref, own, one, lse, interpret=interpret)


def _operand_grads(score_fn, s, d, e, ds, slot_ok, lay: AttnLayout, block):
    """vjp of score_fn at one chunk, masked to valid slots and real (unpadded) lanes."""
    _, pull = jax.vjp(lambda a, b, c: _scores(score_fn, a, b, c, block, lay.hp), s, d, e)
    grads = pull(ds)
    return tuple(tuple(jnp.where(slot_ok.reshape((-1,) + (1,) * (g.ndim - 1)), g, 0.0) for g in grp)
                 for grp in grads)


def _softmax_grad(s, m, lse, do, vals, delta, ks):
    """(ds [B,Hp], P [B,Hp]) from logits, node stats and dO; P is the dropped, normalized weight."""
    alpha = jnp.where(m[:, None], jnp.exp(s - lse), 0.0)
    dp_ = jnp.sum(do * vals, axis=2)
    p = alpha if ks is None else alpha * ks
    dalpha = dp_ if ks is None else dp_ * ks
    ds = jnp.where(m[:, None], alpha * (dalpha - delta), 0.0)
    return ds, p


def _bwd_dst_kernel(indptr_ref, col_ref, eid_ref, order_ref, seed_ref, *refs, score_fn, lay, value_index,
                    rate, interpret):
    s_refs, d_refs, e_refs, rest = _split(refs, lay)
    v_ref, do_ref, lse_ref, delta_ref = rest[:4]
    n_alias = lay.n_edge + (value_index == "edge")
    outs = rest[4 + n_alias:]
    dd_refs, de_refs = outs[:lay.n_dst], outs[lay.n_dst:lay.n_dst + lay.n_edge]
    ps, pd, pe = _pads(lay)
    block, hp, dp = lay.cfg.block_edges, lay.hp, lay.dp
    seed = acc.load_scalar(seed_ref, 0, interpret=interpret)
    r, start, end = ew.row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = ew.own_row(r)
    d_rows = _load_ops(d_refs, pd, own, one, block, interpret=interpret)
    do = acc.gather_block(do_ref, own, one, (hp, dp), interpret=interpret).astype(jnp.float32)
    lse = acc.gather_block(lse_ref, own, one, (hp,), interpret=interpret)
    delta = acc.gather_block(delta_ref, own, one, (hp,), interpret=interpret)

    def body(c, dacc):
        m, col, eid = ew.chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        s_rows = _load_ops(s_refs, ps, col, m, block, interpret=interpret)
        e_rows = _load_ops(e_refs, pe, eid, m, block, interpret=interpret)
        s = _scores(score_fn, s_rows, d_rows, e_rows, block, hp)
        vals = acc.gather_block(v_ref, col if value_index == "src" else eid, m, (hp, dp),
                                interpret=interpret).astype(jnp.float32)
        ds, p = _softmax_grad(s, m, lse, do, vals, delta, _keep_scale(seed, eid, lay, rate))
        _, gd, ge = _operand_grads(score_fn, s_rows, d_rows, e_rows, ds, m, lay, block)
        for ref, x in zip(de_refs, ge, strict=True):
            acc.scatter_block(ref, eid, m, x, interpret=interpret)
        if value_index == "edge":
            acc.scatter_block(outs[-1], eid, m, p[:, :, None] * do, interpret=interpret)
        return tuple(a + jnp.sum(x, axis=0, keepdims=True) for a, x in zip(dacc, gd, strict=True))

    init = tuple(jnp.zeros((1,) + p, jnp.float32) for p in pd)
    dacc = compat.fori_loop(0, ew.num_chunks(start, end, block), body, init)
    for ref, x in zip(dd_refs, dacc, strict=True):
        acc.scatter_block(ref, own, one, x, interpret=interpret)


def _bwd_src_kernel(indptr_ref, col_ref, eid_ref, order_ref, seed_ref, *refs, score_fn, lay, value_index,
                    rate, interpret):
    s_refs, d_refs, e_refs, rest = _split(refs, lay)
    v_ref, do_ref, lse_ref, delta_ref = rest[:4]
    outs = rest[4:]
    ps, pd, pe = _pads(lay)
    block, hp, dp = lay.cfg.block_edges, lay.hp, lay.dp
    seed = acc.load_scalar(seed_ref, 0, interpret=interpret)
    u, start, end = ew.row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = ew.own_row(u)
    s_rows = _load_ops(s_refs, ps, own, one, block, interpret=interpret)
    own_vals = acc.gather_block(v_ref, own, one, (hp, dp), interpret=interpret).astype(jnp.float32)

    def body(c, carry):
        sacc, vacc = carry
        m, v, eid = ew.chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        d_rows = _load_ops(d_refs, pd, v, m, block, interpret=interpret)
        e_rows = _load_ops(e_refs, pe, eid, m, block, interpret=interpret)
        s = _scores(score_fn, s_rows, d_rows, e_rows, block, hp)
        do = acc.gather_block(do_ref, v, m, (hp, dp), interpret=interpret).astype(jnp.float32)
        lse = acc.gather_block(lse_ref, v, m, (hp,), interpret=interpret)
        delta = acc.gather_block(delta_ref, v, m, (hp,), interpret=interpret)
        if value_index == "src":
            vals = jnp.broadcast_to(own_vals, (block, hp, dp))
        else:
            vals = acc.gather_block(v_ref, eid, m, (hp, dp), interpret=interpret).astype(jnp.float32)
        ds, p = _softmax_grad(s, m, lse, do, vals, delta, _keep_scale(seed, eid, lay, rate))
        gs, _, _ = _operand_grads(score_fn, s_rows, d_rows, e_rows, ds, m, lay, block)
        sacc = tuple(a + jnp.sum(x, axis=0, keepdims=True) for a, x in zip(sacc, gs, strict=True))
        vacc = vacc + jnp.sum(p[:, :, None] * do, axis=0, keepdims=True)
        return sacc, vacc

    init = (tuple(jnp.zeros((1,) + p, jnp.float32) for p in ps), jnp.zeros((1, hp, dp), jnp.float32))
    sacc, vacc = compat.fori_loop(0, ew.num_chunks(start, end, block), body, init)
    for ref, x in zip(outs[:lay.n_src], sacc, strict=True):
        acc.scatter_block(ref, own, one, x, interpret=interpret)
    if value_index == "src":
        acc.scatter_block(outs[-1], own, one, vacc, interpret=interpret)


def _check(value_index, rate, seed):
    if value_index not in ("src", "edge"):
        raise ValueError(f"value_index must be 'src' or 'edge', got {value_index!r}")
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
    if rate > 0.0 and seed is None:
        raise ValueError("dropout_rate > 0 needs a dropout_seed")


def _seed_array(seed) -> jax.Array:
    return jnp.reshape(jnp.asarray(0 if seed is None else seed, jnp.int32), (1,))


def _kernel(fn, **kw):
    def kernel(*refs):
        return fn(*refs, **kw)
    return kernel


def _forward(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, seed):
    lay = _layout(src, dst, edge, values)
    num_rows = csr.num_rows
    dtype = jnp.result_type(values.dtype, *(x.dtype for x in (*src, *dst, *edge)))
    kern = _kernel(_fwd_kernel, score_fn=score_fn, lay=lay, value_index=value_index, rate=rate,
                   interpret=interpret)
    out, lse = compat.pallas_call(
        kern,
        out_shape=(jax.ShapeDtypeStruct((num_rows, lay.heads, lay.dim), dtype),
                   jax.ShapeDtypeStruct((num_rows, lay.heads), jnp.float32)),
        grid=(num_rows,), interpret=interpret, num_warps=lay.cfg.num_warps, num_stages=lay.cfg.num_stages,
        name="gnn_attention_fwd",
    )(*csr, seed, *src, *dst, *edge, values)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _attention(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, rev_csr, seed):
    del rev_csr
    return _forward(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, seed)[0]


def _attention_fwd(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, rev_csr, seed):
    out, lse = _forward(score_fn, value_index, rate, interpret, src, dst, edge, values, csr, seed)
    return out, (src, dst, edge, values, csr, rev_csr, seed, *residuals.name_stats(out, lse))


def _attention_bwd(score_fn, value_index, rate, interpret, res, g):
    src, dst, edge, values, csr, rev_csr, seed, out, lse = res
    lay = _layout(src, dst, edge, values)
    g32 = g.astype(jnp.float32)
    delta = jnp.sum(g32 * out.astype(jnp.float32), axis=-1)  # [R, H]: Σ_e α_e dα_e per node and head
    common = dict(score_fn=score_fn, lay=lay, value_index=value_index, rate=rate, interpret=interpret)
    cfg = lay.cfg
    operands = (*src, *dst, *edge)
    d_src: tuple = ()
    d_values = None
    if src or value_index == "src":
        shapes = [*src] + ([values] if value_index == "src" else [])
        outs = compat.pallas_call(
            _kernel(_bwd_src_kernel, **common),
            out_shape=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in shapes),
            grid=(rev_csr.num_rows,), interpret=interpret, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, name="gnn_attention_bwd_src",
        )(*rev_csr, seed, *operands, values, g32, lse, delta)
        outs = tuple(outs)
        d_src = outs[:len(src)]
        if value_index == "src":
            d_values = outs[-1]
    d_dst: tuple = ()
    d_edge: tuple = ()
    if dst or edge or value_index == "edge":
        per_edge = [*edge] + ([values] if value_index == "edge" else [])
        zeros = tuple(jnp.zeros(x.shape, x.dtype) for x in per_edge)
        n_in = 5 + len(operands) + 4
        outs = compat.pallas_call(
            _kernel(_bwd_dst_kernel, **common),
            out_shape=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (*dst, *per_edge)),
            grid=(csr.num_rows,), interpret=interpret, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, name="gnn_attention_bwd_dst",
            input_output_aliases={n_in + k: len(dst) + k for k in range(len(per_edge))},
        )(*csr, seed, *operands, values, g32, lse, delta, *zeros)
        outs = tuple(outs)
        d_dst = outs[:len(dst)]
        d_edge = outs[len(dst):len(dst) + len(edge)]
        if value_index == "edge":
            d_values = outs[-1]
    return d_src, d_dst, d_edge, d_values, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention_aggregate(score_fn, src: tuple, dst: tuple, edge: tuple, values: jax.Array, csr: CSR,
                        rev_csr: CSR, *, value_index: str = "src", dropout_rate: float = 0.0,
                        dropout_seed=None, interpret: bool = False) -> jax.Array:
    """``[R, H, D]`` softmax-weighted aggregation of ``values`` (see the module docstring).

    Args:
      score_fn: ``(src_rows, dst_rows, edge_rows) -> [B, Hp]`` logits; rows are float32, zero-padded.
      src, dst, edge: tuples of ``[*, H]`` / ``[*, H, Dk]`` score operands.
      values: ``[N_src, H, D]`` (value_index="src") or ``[E, H, D]`` (value_index="edge").
      csr, rev_csr: forward (rows = dst) and reverse (rows = src) CSRs.
      dropout_rate: static attention dropout rate; ``dropout_seed`` an int32 scalar (traced is fine).
      interpret: run the Pallas interpreter instead of Triton.
    """
    _check(value_index, dropout_rate, dropout_seed)
    return _attention(score_fn, value_index, float(dropout_rate), interpret, tuple(src), tuple(dst),
                      tuple(edge), values, csr, rev_csr, _seed_array(dropout_seed))


def attention_aggregate_reference(score_fn, src: tuple, dst: tuple, edge: tuple, values: jax.Array,
                                  csr: CSR, rev_csr: CSR | None = None, *, value_index: str = "src",
                                  dropout_rate: float = 0.0, dropout_seed=None) -> jax.Array:
    """Pure-jnp reference of :func:`attention_aggregate` (materializes per-edge logits)."""
    del rev_csr
    _check(value_index, dropout_rate, dropout_seed)
    rows, valid = ew.slot_rows(csr)
    num_rows = csr.num_rows
    seg = jnp.where(valid, rows, num_rows)

    def take(xs, idx):
        return tuple(x[idx].astype(jnp.float32) for x in xs)

    s = jnp.asarray(score_fn(take(src, csr.col), take(dst, rows), take(edge, csr.eid)), jnp.float32)
    s_max = jax.ops.segment_max(jnp.where(valid[:, None], s, -jnp.inf), seg, num_segments=num_rows + 1)
    s_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(s_max), s_max, 0.0))
    p = jnp.where(valid[:, None], jnp.exp(s - s_max[seg]), 0.0)
    denom = jax.ops.segment_sum(p, seg, num_segments=num_rows + 1)
    alpha = p / jnp.where(denom > 0, denom, 1.0)[seg]
    if dropout_rate > 0.0:
        heads = jnp.arange(values.shape[1], dtype=jnp.int32)[None, :]
        keep = dr.edge_dropout_keep(jnp.asarray(dropout_seed, jnp.int32), csr.eid[:, None], heads,
                                    dropout_rate)
        alpha = jnp.where(keep, alpha / (1.0 - dropout_rate), 0.0)
    vals = values[csr.col if value_index == "src" else csr.eid].astype(jnp.float32)
    out = jax.ops.segment_sum(alpha[:, :, None] * vals, seg, num_segments=num_rows + 1)[:num_rows]
    dtype = jnp.result_type(values.dtype, *(x.dtype for x in (*src, *dst, *edge)))
    return out.astype(dtype)
