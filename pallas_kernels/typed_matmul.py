"""Typed (segment) matmul, Hector's ``Y[S] = X[G] · W[T]``: each row is multiplied by its type's weight.

Rows (``x[gather_idx]`` when ``gather_idx`` is given, else ``x``) are already sorted by type;
``group_sizes[t]`` rows of type ``t`` follow each other; rows past ``sum(group_sizes)`` give 0 (the
``jax.lax.ragged_dot`` convention). ``w`` is ``[T, din, dout]``. No ``[S, din, dout]`` tensor is ever
built.

Two implementations:

* ``impl="pallas"``: a Triton kernel over (row tile, output-column tile); a row tile that straddles
  several types loops over those types with rows of other types masked out. Its custom VJP computes
  ``dx`` with the same kernel on ``w^T`` and ``dW`` with one program per (type, din tile, dout tile)
  that walks that type's rows (per-program partials: every ``dW`` tile has one owner, no atomics).
  With ``gather_idx`` the ``dx`` rows are scatter-added back by XLA (may be nondeterministic on GPU).
* ``impl="ragged_dot"``: ``jax.lax.ragged_dot`` (XLA's grouped GEMM) and its built-in autodiff.

``impl="auto"`` picks by dtype (:func:`auto_impl`); see :data:`AUTO_IMPL_REASON`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import _access as acc
from pallas_kernels import compat
from pallas_kernels._config import next_pow2

# impl="auto", by the operands' dtype: the kernel takes 16- and 32-bit floats, and wider types keep ragged_dot.
AUTO_IMPL: dict[str, str] = {"float32": "pallas", "bfloat16": "pallas", "float16": "pallas"}
AUTO_IMPL_REASON = (
    "Measured on an H100 (JAX 0.11.2, benchmarks/results/gpu-h100-2026-11-26.md): on ogbn-arxiv the kernel "
    "took 0.406 ms at d = 64 and 0.486 ms at d = 128, against ragged_dot's 0.418 and 0.787 ms. XLA's GPU "
    "compiler also expands ragged_dot into a [groups, rows, dout] temporary: 269 MiB at 90 groups x 49,000 rows x "
    "16 in a deviceless H100 compile, and RGCN on aifb used 42-103x the reference's memory with it."
)


def auto_impl(dtype) -> str:
    """What ``impl="auto"`` runs for operands of ``dtype`` (:data:`AUTO_IMPL`, else ragged_dot)."""
    return AUTO_IMPL.get(jnp.dtype(dtype).name, "ragged_dot")


class MatmulBlock(NamedTuple):
    bm: int  # rows per tile
    bk: int  # contraction chunk
    bn: int  # output columns per tile


# Rows per tile. One for every shape: the backward's dx runs the forward kernel on the swapped weights with the
# forward's `Tiles`, which hold the types of these row tiles.
ROW_TILE = 32


def matmul_block(din: int, dout: int) -> MatmulBlock:
    """Power-of-two tiles; >= 16 on every dot dimension (Triton's ``tl.dot`` minimum)."""
    return MatmulBlock(ROW_TILE, max(16, min(32, next_pow2(din))), max(16, min(64, next_pow2(dout))))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Tiles(NamedTuple):
    """Where each row tile's types are: ``offsets`` int32[T + 1] (type ``t``'s rows are ``offsets[t]`` to
    ``offsets[t + 1]``) and the first and last type touching each tile (``last < first`` past the typed rows)."""
    offsets: jax.Array
    first: jax.Array
    last: jax.Array


def _offsets(group_sizes):
    """int32[T + 1]: where each type's rows start, and the end (numpy for numpy sizes)."""
    xp = np if isinstance(group_sizes, np.ndarray) else jnp
    return xp.concatenate([xp.zeros((1,), xp.int32), xp.cumsum(group_sizes).astype(xp.int32)])


def _tiles(group_sizes, num_rows: int) -> Tiles:
    """`Tiles` of ``group_sizes`` for row tiles of `ROW_TILE`: computed on the host when the sizes are (numpy),
    else by loop-free XLA ops. ``jnp.searchsorted``'s default method is a while loop, one kernel launch per step
    on a GPU, which cost more than the kernel on small graphs."""
    bm = ROW_TILE
    num_tiles = _cdiv(num_rows, bm)
    xp = np if isinstance(group_sizes, np.ndarray) else jnp
    offsets = _offsets(group_sizes)
    total = offsets[-1]
    r0 = xp.arange(num_tiles, dtype=xp.int32) * bm
    r1 = xp.minimum(r0 + bm, total) - 1
    ends = offsets[1:]
    if xp is np:
        find = lambda r: np.searchsorted(ends, r, side="right")
    else:  # a [tiles, T] comparison while it is small, else a sort: never a loop
        method = "compare_all" if num_tiles * ends.shape[0] <= 1 << 24 else "sort"
        find = lambda r: jnp.searchsorted(ends, r, side="right", method=method)
    t0, t1 = find(r0).astype(xp.int32), find(r1).astype(xp.int32)
    return Tiles(offsets, t0, xp.where(r0 < total, t1, t0 - 1).astype(xp.int32))


def _load_rows(x_ref, idx_ref, rows, row_ok, kcols, din, *, gathered: bool, interpret: bool):
    src_rows = acc.load_vector(idx_ref, rows, row_ok, 0, interpret=interpret) if gathered else rows
    mask = row_ok[:, None] & (kcols < din)
    return acc.masked_load(x_ref, (src_rows[:, None], kcols), mask, 0, interpret=interpret)


def _fwd_kernel(x_ref, idx_ref, w_ref, off_ref, t0_ref, t1_ref, out_ref, *, blk, din, dout, num_rows,
                gathered, interpret):
    i, j = compat.program_id(0), compat.program_id(1)
    rows = i * blk.bm + jax.lax.broadcasted_iota(jnp.int32, (blk.bm,), 0)
    ncols = j * blk.bn + jax.lax.broadcasted_iota(jnp.int32, (1, blk.bn), 1)
    t0 = acc.load_scalar(t0_ref, i, interpret=interpret)
    t1 = acc.load_scalar(t1_ref, i, interpret=interpret)

    def per_type(t, out):
        lo = acc.load_scalar(off_ref, t, interpret=interpret)
        hi = acc.load_scalar(off_ref, t + 1, interpret=interpret)
        row_ok = (rows >= lo) & (rows < hi)

        def per_k(k, out):
            kcols = k * blk.bk + jax.lax.broadcasted_iota(jnp.int32, (1, blk.bk), 1)
            xt = _load_rows(x_ref, idx_ref, rows, row_ok, kcols, din, gathered=gathered, interpret=interpret)
            kk = k * blk.bk + jax.lax.broadcasted_iota(jnp.int32, (blk.bk, 1), 0)
            wt = acc.masked_load(w_ref, (t, kk, ncols), (kk < din) & (ncols < dout), 0, interpret=interpret)
            return out + jnp.dot(xt, wt, preferred_element_type=jnp.float32)

        return compat.fori_loop(0, _cdiv(din, blk.bk), per_k, out)

    out = compat.fori_loop(t0, t1 + 1, per_type, jnp.zeros((blk.bm, blk.bn), jnp.float32))
    mask = (rows < num_rows)[:, None] & (ncols < dout)
    acc.masked_store(out_ref, (rows[:, None], ncols), out, mask, interpret=interpret)


def _dw_kernel(x_ref, idx_ref, dy_ref, off_ref, dw_ref, *, blk, din, dout, gathered, interpret):
    t, kb, j = compat.program_id(0), compat.program_id(1), compat.program_id(2)
    kcols = kb * blk.bk + jax.lax.broadcasted_iota(jnp.int32, (1, blk.bk), 1)
    ncols = j * blk.bn + jax.lax.broadcasted_iota(jnp.int32, (1, blk.bn), 1)
    lo = acc.load_scalar(off_ref, t, interpret=interpret)
    hi = acc.load_scalar(off_ref, t + 1, interpret=interpret)

    def body(c, part):
        rows = lo + c * blk.bm + jax.lax.broadcasted_iota(jnp.int32, (blk.bm,), 0)
        row_ok = rows < hi
        xt = _load_rows(x_ref, idx_ref, rows, row_ok, kcols, din, gathered=gathered, interpret=interpret)
        dyt = acc.masked_load(dy_ref, (rows[:, None], ncols), row_ok[:, None] & (ncols < dout), 0,
                              interpret=interpret)
        return part + jnp.dot(xt.T, dyt, preferred_element_type=jnp.float32)

    part = compat.fori_loop(0, (hi - lo + blk.bm - 1) // blk.bm, body, jnp.zeros((blk.bk, blk.bn), jnp.float32))
    kk = kb * blk.bk + jax.lax.broadcasted_iota(jnp.int32, (blk.bk, 1), 0)
    acc.masked_store(dw_ref, (t, kk, ncols), part, (kk < din) & (ncols < dout), interpret=interpret)


def _pallas_forward(x, w, tiles: Tiles, gather_idx, num_rows, interpret, out_dtype):
    din, dout = w.shape[1], w.shape[2]
    if num_rows == 0 or x.shape[0] == 0:  # no program to launch (a grid of none reads a [0, din] block)
        return jnp.zeros((num_rows, dout), out_dtype)
    blk = matmul_block(din, dout)
    gathered = gather_idx is not None
    idx = gather_idx if gathered else jnp.zeros((1,), jnp.int32)
    kern = functools.partial(_fwd_kernel, blk=blk, din=din, dout=dout, num_rows=num_rows, gathered=gathered,
                             interpret=interpret)
    return compat.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct((num_rows, dout), out_dtype),
        grid=(_cdiv(num_rows, blk.bm), _cdiv(dout, blk.bn)), interpret=interpret, num_warps=4, num_stages=2,
        name="gnn_typed_matmul",
    )(x, idx.astype(jnp.int32), w, *tiles)


def _pallas_dw(x, dy, offsets, gather_idx, w_shape, w_dtype, interpret):
    if x.shape[0] == 0 or dy.shape[0] == 0:
        return jnp.zeros(w_shape, w_dtype)
    num_types, din, dout = w_shape
    blk = matmul_block(din, dout)
    gathered = gather_idx is not None
    idx = gather_idx if gathered else jnp.zeros((1,), jnp.int32)
    kern = functools.partial(_dw_kernel, blk=blk, din=din, dout=dout, gathered=gathered, interpret=interpret)
    return compat.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct(w_shape, w_dtype),
        grid=(num_types, _cdiv(din, blk.bk), _cdiv(dout, blk.bn)), interpret=interpret, num_warps=4,
        num_stages=2, name="gnn_typed_matmul_dw",
    )(x, idx.astype(jnp.int32), dy, offsets)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _typed_matmul_pallas(x, w, tiles, gather_idx, num_rows, interpret):
    dtype = jnp.result_type(x.dtype, w.dtype)
    return _pallas_forward(x, w, tiles, gather_idx, num_rows, interpret, dtype)


def _tm_fwd(x, w, tiles, gather_idx, num_rows, interpret):
    return _typed_matmul_pallas(x, w, tiles, gather_idx, num_rows, interpret), (x, w, tiles, gather_idx)


def _tm_bwd(num_rows, interpret, res, g):
    x, w, tiles, gather_idx = res
    dx_rows = _pallas_forward(g, jnp.swapaxes(w, 1, 2), tiles, None, num_rows, interpret, jnp.float32)
    if gather_idx is None:
        dx = dx_rows.astype(x.dtype)
    else:
        dx = jnp.zeros(x.shape, jnp.float32).at[gather_idx].add(dx_rows).astype(x.dtype)
    dw = _pallas_dw(x, g, tiles.offsets, gather_idx, w.shape, w.dtype, interpret)
    return dx, dw, None, None


_typed_matmul_pallas.defvjp(_tm_fwd, _tm_bwd)


def typed_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, gather_idx: jax.Array | None = None,
                 impl: str = "auto", interpret: bool = False) -> jax.Array:
    """``[S, dout]``: ``rows[s] @ w[type(s)]`` with ``rows = x[gather_idx]`` (or ``x``), sorted by type.

    Args:
      x: ``[N, din]`` float32/bfloat16.
      w: ``[T, din, dout]``.
      group_sizes: int32[T], rows per type (sum <= S; the remaining rows give 0); numpy (known on the host):
        the kernel's tile bookkeeping is computed there, none in the program.
      gather_idx: optional int32[S] row ids into ``x``.
      impl: "pallas" | "ragged_dot" | "auto" (:func:`auto_impl`, see :data:`AUTO_IMPL_REASON`).
      interpret: Pallas interpreter (only for impl="pallas").
    """
    impl = auto_impl(jnp.result_type(x.dtype, w.dtype)) if impl == "auto" else impl
    num_rows = x.shape[0] if gather_idx is None else gather_idx.shape[0]
    if impl == "pallas":
        gi = None if gather_idx is None else jnp.asarray(gather_idx, jnp.int32)
        static = isinstance(group_sizes, np.ndarray)
        tiles = _tiles(group_sizes.astype(np.int32) if static else jnp.asarray(group_sizes, jnp.int32), num_rows)
        return _typed_matmul_pallas(x, w, Tiles(*map(jnp.asarray, tiles)), gi, num_rows, interpret)
    group_sizes = jnp.asarray(group_sizes, jnp.int32)
    if impl == "ragged_dot":
        rows = x if gather_idx is None else x[gather_idx]
        dtype = jnp.result_type(x.dtype, w.dtype)
        # Accumulate in float32 at least, and in the inputs' own type when it is wider (float64, complex).
        acc = jnp.promote_types(dtype, jnp.float32)
        return compat.ragged_dot(rows, w, group_sizes, preferred_element_type=acc).astype(dtype)
    raise ValueError(f"impl must be 'pallas', 'ragged_dot' or 'auto', got {impl!r}")


def typed_matmul_reference(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *,
                           gather_idx: jax.Array | None = None) -> jax.Array:
    """Pure-jnp reference: per-row type via ``searchsorted`` and a per-type loop (no [S, din, dout])."""
    rows = (x if gather_idx is None else x[gather_idx]).astype(jnp.float32)
    offsets = _offsets(jnp.asarray(group_sizes, jnp.int32))
    r = jnp.arange(rows.shape[0], dtype=jnp.int32)
    types = jnp.searchsorted(offsets[1:], r, side="right")
    out = jnp.zeros((rows.shape[0], w.shape[2]), jnp.float32)
    for t in range(w.shape[0]):
        out = out + jnp.where((types == t)[:, None], rows @ w[t].astype(jnp.float32), 0.0)
    return out.astype(jnp.result_type(x.dtype, w.dtype))
