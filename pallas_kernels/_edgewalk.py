"""Shared machinery of the ``edge_fn`` kernels (gather_reduce, gather_compute): operand loading,
per-slot cotangents, and the two backward row walks.

Layout conventions (all kernels):

* one program per CSR row, taken in ``row_order`` (heaviest rows first);
* a row's slots are visited in chunks of ``block`` edges (an edge-chunked inner ``fori_loop`` with a
  traced trip count), so hubs with thousands of in-edges only cost more iterations;
* features are padded to ``fp = next_pow2(F)`` lanes; width-1 operands are loaded as ``[B, 1]`` and
  broadcast to ``[B, fp]`` *before* ``edge_fn`` sees them; ``edge_fn`` gets float32 rows.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import _access as acc
from pallas_kernels import compat
from pallas_kernels._config import EdgeBlock, edge_block, next_pow2
from pallas_kernels.csr import CSR

EdgeFn = Callable[[tuple, tuple, tuple], jax.Array]
INT_MAX = 2**31 - 1


class Layout(NamedTuple):
    """Static shape facts of one call."""

    n_src: int
    n_dst: int
    n_edge: int
    width: int  # F, the output width
    fp: int  # padded width
    cfg: EdgeBlock


def make_layout(src: Sequence[jax.Array], dst: Sequence[jax.Array], edge: Sequence[jax.Array]) -> Layout:
    widths = [x.shape[1] for x in (*src, *dst, *edge)]
    if not widths:
        raise ValueError("edge_fn kernels need at least one operand")
    for x in (*src, *dst, *edge):
        if x.ndim != 2:
            raise ValueError(f"operands must be 2-D [rows, width], got shape {x.shape}")
    width = max(widths)
    bad = [w for w in widths if w not in (1, width)]
    if bad:
        raise ValueError(f"every operand width must be 1 or F={width}; got {widths}")
    fp = next_pow2(width)
    return Layout(len(src), len(dst), len(edge), width, fp, edge_block(fp))


def split(refs: Sequence, lay: Layout) -> tuple[tuple, tuple, tuple, tuple]:
    a, b, c = lay.n_src, lay.n_src + lay.n_dst, lay.n_src + lay.n_dst + lay.n_edge
    return tuple(refs[:a]), tuple(refs[a:b]), tuple(refs[b:c]), tuple(refs[c:])


def load_group(refs: Sequence, rows: jax.Array, mask: jax.Array, lay: Layout, *, interpret: bool) -> tuple:
    """float32 ``[block, fp]`` tiles of ``ref[rows]`` per ref (``rows`` is ``[block]`` or ``[1]``)."""
    block = lay.cfg.block_edges
    out = []
    for ref in refs:
        pw = 1 if ref.shape[1] == 1 else lay.fp
        x = acc.gather_block(ref, rows, mask, (pw,), interpret=interpret).astype(jnp.float32)
        out.append(jnp.broadcast_to(x, (block, lay.fp)))
    return tuple(out)


def call_edge_fn(edge_fn: EdgeFn, s: tuple, d: tuple, e: tuple, lay: Layout) -> jax.Array:
    y = edge_fn(s, d, e)
    return jnp.broadcast_to(jnp.asarray(y, jnp.float32), (lay.cfg.block_edges, lay.fp))


def lane_iota(lay: Layout) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, (1, lay.fp), 1)


def chunk_slots(start, end, c, block: int) -> tuple[jax.Array, jax.Array]:
    """Slot ids ``[block]`` of chunk ``c`` of the row ``[start, end)`` and their validity mask."""
    slots = start + c * block + jax.lax.broadcasted_iota(jnp.int32, (block,), 0)
    return slots, slots < end


def chunk(col_ref, eid_ref, start, end, c, block: int, *, interpret: bool):
    """Chunk ``c`` of the row ``[start, end)``: (validity mask, the other endpoint's ids, the edge ids)."""
    slots, m = chunk_slots(start, end, c, block)
    col = acc.load_vector(col_ref, slots, m, 0, interpret=interpret)
    eid = acc.load_vector(eid_ref, slots, m, 0, interpret=interpret)
    return m, col, eid


def row_bounds(indptr_ref, order_ref, *, interpret: bool):
    """(row id, first slot, end slot, number of chunks) of this program's row."""
    i = compat.program_id(0)
    r = acc.load_scalar(order_ref, i, interpret=interpret)
    start = acc.load_scalar(indptr_ref, r, interpret=interpret)
    end = acc.load_scalar(indptr_ref, r + 1, interpret=interpret)
    return r, start, end


def num_chunks(start, end, block: int):
    return (end - start + block - 1) // block


def own_row(r) -> tuple[jax.Array, jax.Array]:
    return jnp.full((1,), r, jnp.int32), jnp.ones((1,), jnp.bool_)


def input_cotangents(edge_fn: EdgeFn, s: tuple, d: tuple, e: tuple, cot: jax.Array, ok: jax.Array,
                     lay: Layout, widths: tuple[tuple[int, ...], ...]) -> tuple[tuple, tuple, tuple]:
    """``vjp(edge_fn)`` at one chunk, masked (``ok``: [block, fp]) and summed over lanes for width-1 inputs.

    Masking happens *after* the pullback so that a non-finite partial derivative on a padding lane or an
    invalid slot (e.g. ``log`` at the zero padding) cannot leak into a real cotangent.
    """
    _, pull = jax.vjp(lambda a, b, c: call_edge_fn(edge_fn, a, b, c, lay), s, d, e)
    grads = pull(cot)
    out = []
    for group, ws in zip(grads, widths, strict=True):
        g2 = []
        for g, w in zip(group, ws, strict=True):
            g = jnp.where(ok, g, 0.0)
            g2.append(jnp.sum(g, axis=1, keepdims=True) if w == 1 else g)
        out.append(tuple(g2))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# Per-slot cotangent of edge_fn's output.
# kind: "sum" | "mean" | "max" | "min" (node-level cotangent g[R, F] plus aux) or "edge" (g[E, F]).
#   mean: aux = inv_deg float32[R];  max/min: aux = argslot edge ids int32[R, F] (-1 for empty rows).
# --------------------------------------------------------------------------------------------------

def slot_cotangent(kind: str, g_ref, aux_ref, v, v_mask, eid, m, lay: Layout, *, interpret: bool) -> jax.Array:
    block, fp = lay.cfg.block_edges, lay.fp
    if kind == "edge":
        g = acc.gather_block(g_ref, eid, m, (fp,), interpret=interpret).astype(jnp.float32)
    else:
        g = acc.gather_block(g_ref, v, v_mask, (fp,), interpret=interpret).astype(jnp.float32)
        if kind == "mean":
            g = g * acc.load_vector(aux_ref, v, v_mask, 0.0, interpret=interpret)[:, None]
        elif kind in ("max", "min"):
            arg = acc.gather_block(aux_ref, v, v_mask, (fp,), interpret=interpret, other=-1)
            g = jnp.where(arg == eid[:, None], g, 0.0)
    g = jnp.broadcast_to(g, (block, fp))
    return jnp.where(m[:, None], g, 0.0)


def _widths(src, dst, edge) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(x.shape[1] for x in grp) for grp in (src, dst, edge))


def _bwd_dst_kernel(indptr_ref, col_ref, eid_ref, order_ref, *refs, edge_fn, kind, lay, widths, interpret):
    """Walk the forward CSR: accumulate dst cotangents per row, write edge cotangents per slot."""
    s_refs, d_refs, e_refs, rest = split(refs, lay)
    g_ref, aux_ref = rest[0], rest[1]
    # rest[2 : 2 + n_edge] are the aliased zero inputs of the edge cotangents.
    outs = rest[2 + lay.n_edge:]
    dd_refs, de_refs = outs[:lay.n_dst], outs[lay.n_dst:]
    block = lay.cfg.block_edges
    r, start, end = row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = own_row(r)
    d_rows = load_group(d_refs, own, one, lay, interpret=interpret)
    lane_ok = lane_iota(lay) < lay.width

    def body(c, dacc):
        m, col, eid = chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        s_rows = load_group(s_refs, col, m, lay, interpret=interpret)
        e_rows = load_group(e_refs, eid, m, lay, interpret=interpret)
        cot = slot_cotangent(kind, g_ref, aux_ref, own, one, eid, m, lay, interpret=interpret)
        ok = m[:, None] & lane_ok
        _, gd, ge = input_cotangents(edge_fn, s_rows, d_rows, e_rows, cot, ok, lay, widths)
        for ref, x in zip(de_refs, ge, strict=True):
            acc.scatter_block(ref, eid, m, x, interpret=interpret)
        return tuple(a + jnp.sum(x, axis=0, keepdims=True) for a, x in zip(dacc, gd, strict=True))

    init = tuple(jnp.zeros((1, 1 if w == 1 else lay.fp), jnp.float32) for w in widths[1])
    dacc = compat.fori_loop(0, num_chunks(start, end, block), body, init)
    for ref, x in zip(dd_refs, dacc, strict=True):
        acc.scatter_block(ref, own, one, x, interpret=interpret)


def _bwd_src_kernel(indptr_ref, col_ref, eid_ref, order_ref, *refs, edge_fn, kind, lay, widths, interpret):
    """Walk the reverse CSR (rows = src nodes): accumulate src cotangents, no atomics."""
    s_refs, d_refs, e_refs, rest = split(refs, lay)
    g_ref, aux_ref, ds_refs = rest[0], rest[1], rest[2:]
    block = lay.cfg.block_edges
    u, start, end = row_bounds(indptr_ref, order_ref, interpret=interpret)
    own, one = own_row(u)
    s_rows = load_group(s_refs, own, one, lay, interpret=interpret)
    lane_ok = lane_iota(lay) < lay.width

    def body(c, sacc):
        m, v, eid = chunk(col_ref, eid_ref, start, end, c, block, interpret=interpret)
        d_rows = load_group(d_refs, v, m, lay, interpret=interpret)
        e_rows = load_group(e_refs, eid, m, lay, interpret=interpret)
        cot = slot_cotangent(kind, g_ref, aux_ref, v, m, eid, m, lay, interpret=interpret)
        ok = m[:, None] & lane_ok
        gs, _, _ = input_cotangents(edge_fn, s_rows, d_rows, e_rows, cot, ok, lay, widths)
        return tuple(a + jnp.sum(x, axis=0, keepdims=True) for a, x in zip(sacc, gs, strict=True))

    init = tuple(jnp.zeros((1, 1 if w == 1 else lay.fp), jnp.float32) for w in widths[0])
    sacc = compat.fori_loop(0, num_chunks(start, end, block), body, init)
    for ref, x in zip(ds_refs, sacc, strict=True):
        acc.scatter_block(ref, own, one, x, interpret=interpret)


def backward(edge_fn: EdgeFn, kind: str, src, dst, edge, csr: CSR, rev_csr: CSR, g: jax.Array,
             aux: jax.Array, *, interpret: bool) -> tuple[tuple, tuple, tuple]:
    """Cotangents ``(d_src, d_dst, d_edge)`` (input dtypes) given the per-slot cotangent rule ``kind``.

    ``g`` is node-level ``[R, F]`` (kinds sum/mean/max/min) or edge-level ``[E, F]`` (kind "edge");
    ``aux`` is inv_deg float32[R] (mean), argslot int32[R, F] (max/min), or any dummy array.
    """
    lay = make_layout(src, dst, edge)
    widths = _widths(src, dst, edge)
    cfg = lay.cfg
    operands = (*src, *dst, *edge)
    d_src: tuple = ()
    d_dst: tuple = ()
    d_edge: tuple = ()
    if src:
        kern = _kernel_partial(_bwd_src_kernel, edge_fn=edge_fn, kind=kind, lay=lay, widths=widths,
                               interpret=interpret)
        d_src = compat.pallas_call(
            kern, out_shape=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in src),
            grid=(rev_csr.num_rows,), interpret=interpret, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, name="gnn_edge_fn_bwd_src",
        )(*rev_csr, *operands, g, aux)
        d_src = tuple(d_src)
    if dst or edge:
        zeros = tuple(jnp.zeros(x.shape, x.dtype) for x in edge)
        n_in = 4 + len(operands) + 2
        kern = _kernel_partial(_bwd_dst_kernel, edge_fn=edge_fn, kind=kind, lay=lay, widths=widths,
                               interpret=interpret)
        outs = compat.pallas_call(
            kern,
            out_shape=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (*dst, *edge)),
            grid=(csr.num_rows,), interpret=interpret, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, name="gnn_edge_fn_bwd_dst",
            input_output_aliases={n_in + k: len(dst) + k for k in range(len(edge))},
        )(*csr, *operands, g, aux, *zeros)
        d_dst, d_edge = tuple(outs[:len(dst)]), tuple(outs[len(dst):])
    return d_src, d_dst, d_edge


def _kernel_partial(fn, **kw):
    def kernel(*refs):
        return fn(*refs, **kw)
    return kernel


# --------------------------------------------------------------------------------------------------
# Pure-jnp helpers shared by the references.
# --------------------------------------------------------------------------------------------------

def slot_rows(csr: CSR) -> tuple[jax.Array, jax.Array]:
    """(row id per slot, slot validity) for a CSR whose slots past ``indptr[-1]`` are padding."""
    nnz = csr.col.shape[0]
    slots = jnp.arange(nnz, dtype=jnp.int32)
    rows = jnp.searchsorted(csr.indptr, slots, side="right").astype(jnp.int32) - 1
    valid = slots < csr.indptr[-1]
    return jnp.clip(rows, 0, csr.num_rows - 1), valid


def reference_slot_values(edge_fn: EdgeFn, src, dst, edge, csr: CSR) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(vals float32[nnz, F], row per slot, slot validity): edge_fn evaluated per CSR slot at width F."""
    width = make_layout(src, dst, edge).width
    rows, valid = slot_rows(csr)

    def take(xs, idx):
        return tuple(jnp.broadcast_to(x[idx].astype(jnp.float32), (idx.shape[0], width)) for x in xs)

    vals = edge_fn(take(src, csr.col), take(dst, rows), take(edge, csr.eid))
    vals = jnp.broadcast_to(jnp.asarray(vals, jnp.float32), (rows.shape[0], width))
    return vals, rows, valid


def result_dtype(src, dst, edge):
    return jnp.result_type(*(x.dtype for x in (*src, *dst, *edge)))
