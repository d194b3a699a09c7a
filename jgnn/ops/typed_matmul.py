"""``typed_matmul``: ``y[r] = x[r] @ W[types[r]]`` for every row, without building ``[rows, d_in, d_out]`` (Hector).

``x`` is ``[R, *heads, d_in]``, ``table`` is ``[T, *heads, d_in, d_out]``, ``types`` is ``[R]`` (clamped into
``[0, T)``, as the gather it replaces clamped them). Implementations (``impl``):

* ``sorted_blocks``: rows sorted by type, each type's rows padded to whole blocks of ``block`` rows, one batched
  GEMM over the blocks (one weight per block): the per-row FLOPs plus at most ``T·block`` padding rows, at GEMM
  speed. The default of the XLA backend. (Not ``jax.lax.ragged_dot``: on CPU it multiplies every row by every
  type's weights, so a NaN in another type's matrix reaches the row, which the reference never does);
* ``static_groups``: rows already in runs of one type at offsets known on the host (a `GraphLayout`'s typed
  pairs): a GEMM per run on static slices, or for many runs ``sorted_blocks`` with slots computed on the host;
  no sort in the program;
* ``pallas``: `pallas_kernels.typed_matmul`; with static runs (``groups``), each run is one of its groups, no
  sort either. Its engine (`pallas_engine`, named in `explain`) is the Triton kernel for 16- and 32-bit floats,
  ``ragged_dot`` for float64, XLA's per-row products for per-head tables and ``sorted_blocks`` for complex types.

The reference (the semantics) is the per-row product with the gathered weights. Derivatives are those of the
chosen implementation (``jax.jvp`` of it; JAX transposes its ops), so no hand-written VJP.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.interpreters import ad, batching, mlir

from jgnn import compat, facts
from jgnn.facts import Info
from jgnn.ops import edge_op as eo
from jgnn.report import Reason
from jgnn.roles import Movement

IMPLS = ("sorted_blocks", "static_groups", "pallas", "pallas_interpret", "reference")

typed_matmul_p = jcore.Primitive("jgnn_typed_matmul")


def _bind(*args, **params):
    return typed_matmul_p.bind(*compat.match_vma(args), **params)


def typed_matmul(x, table, types, *, impl: str, block: int = 128, groups: tuple = ()):
    """``groups`` (for ``impl="static_groups"``): the static ``(type, first row, end row)`` runs of ``types``."""
    return _bind(x, table, types, impl=impl, block=int(block), groups=tuple(groups))


def _heads(x) -> int:
    return x.ndim - 2


def reference(x, table, types, **_):
    w = table[jnp.clip(types, 0, table.shape[0] - 1)]  # [R, *heads, d_in, d_out]
    h = _heads(x)
    batch = tuple(range(h + 1))
    return jax.lax.dot_general(x, w, (((h + 1,), (h + 1,)), (batch, batch)),
                               preferred_element_type=jnp.result_type(x, table)).astype(jnp.result_type(x, table))


# Up to this many types, a row's rank among the rows of its type is a running count over ``[R, T]`` flags
# (measured on CPU: 0.5 ms for 20,000 rows of 3 types, against 3.4 ms for a stable argsort); beyond, a sort.
COUNTING_TYPES = 16
COUNTING_ELEMENTS = 1 << 26  # and while the [R, T] counts stay under 256 MiB: a sort's memory is O(R)


def _rank_within_type(types, groups: int):
    """For each row, how many earlier rows have its type (rows keep their order within a type)."""
    if groups <= COUNTING_TYPES and types.shape[0] * groups <= COUNTING_ELEMENTS:
        flags = (types[:, None] == jnp.arange(groups, dtype=types.dtype)).astype(jnp.int32)
        return jnp.take_along_axis(jnp.cumsum(flags, axis=0), types[:, None], axis=1)[:, 0] - 1
    order = jnp.argsort(types, stable=True)
    counts = jnp.bincount(types, length=groups).astype(jnp.int32)
    first = jnp.cumsum(counts) - counts
    ranks = jnp.arange(types.shape[0], dtype=jnp.int32) - first[types[order]]
    return jnp.zeros_like(ranks).at[order].set(ranks, unique_indices=True)


def sorted_blocks(x, table, types, *, block: int, **_):
    """See module docstring: rows of one type packed into whole blocks, one GEMM per block.

    Each row goes straight to its slot (its type's first block plus its rank within the type) and its product
    comes straight back from there: no permutation of the rows and no un-permutation of the results.
    """
    rows, groups = x.shape[0], table.shape[0]
    if rows == 0:
        return reference(x, table, types)
    types = jnp.clip(types, 0, groups - 1).astype(jnp.int32)
    counts = jnp.bincount(types, length=groups).astype(jnp.int32)
    padded = (counts + block - 1) // block * block
    ends = jnp.cumsum(padded).astype(jnp.int32)
    position = (ends - padded)[types] + _rank_within_type(types, groups)
    capacity = -(-(rows + groups * (block - 1)) // block) * block  # static bound on the padded rows
    block_start = jnp.arange(capacity // block, dtype=jnp.int32) * block
    block_type = jnp.minimum(jnp.sum(block_start[:, None] >= ends[None, :], axis=1), groups - 1)
    return _blocked_matmul(x, table, position, block_type, block)


# Up to this many runs, one GEMM per run on a static slice; beyond, the blocked GEMM with host-computed slots.
# Measured on CPU: HGT's 6 relations train in 665 ms / 690 MiB with slices and 733 ms / 740 MiB blocked (hand:
# 531-581 ms, 600 MiB); RGCN's 90 relations on AIFB take 7.2 s to compile with slices and 2.0 s blocked.
FEW_GROUPS = 16


def static_groups(x, table, types, *, groups: tuple, block: int, **_):
    """Rows already in runs of one type at static offsets (a `GraphLayout`'s typed pairs, or the nodes of a graph
    sorted by type): one GEMM per run of a split for a few runs (`FEW_GROUPS`), else `sorted_blocks` with each
    row's slot known on the host. No sort in the program either way. ``types`` is not read: the layout that gave
    ``groups`` was checked against the graph."""
    rows = x.shape[0]
    _check_runs(groups, rows)
    if len(groups) > FEW_GROUPS:
        position, block_type = _static_slots(groups, rows, block, table.shape[0])
        return _blocked_matmul(x, table, position, block_type, block)
    dtype = jnp.result_type(x, table)
    h = _heads(x)
    pieces = []
    # One split, not a slice per run: its transpose is one concatenation, where slices' are a zero-padded array
    # per run, summed (3 passes over the rows' cotangent instead of 1 for HGT's 3 node types).
    runs = jax.lax.split(x, [hi - lo for _, lo, hi in groups], axis=0)
    weights = jax.lax.split(table, [1] * table.shape[0], axis=0)  # the same for the table's cotangent
    for (t, _, _), rows_t in zip(groups, runs, strict=True):
        w = weights[_clamped(t, table.shape[0])][0]  # [*heads, d_in, d_out]
        y = jax.lax.dot_general(rows_t, w, (((h + 1,), (h,)), (tuple(range(1, h + 1)), tuple(range(h)))),
                                preferred_element_type=dtype)  # [*heads, rows, d_out]
        pieces.append(jnp.moveaxis(y, h, 0))
    return jnp.concatenate(pieces).astype(dtype)


def _clamped(t: int, num_types: int) -> int:
    """A static run's type clamped into ``[0, T)``, as the gather it replaces clamped it."""
    return min(max(t, 0), num_types - 1)


def _check_runs(groups: tuple, rows: int) -> None:
    """``groups`` are ``(type, first row, end row)`` runs that follow each other from row 0 to ``rows``."""
    ends = [0] + [hi for _, _, hi in groups]
    if not groups or [lo for _, lo, _ in groups] != ends[:-1] or ends[-1] != rows:
        raise ValueError(f"typed_matmul: static groups {groups} do not cover the {rows} rows in order")


@functools.lru_cache(maxsize=64)
def _static_slots(groups: tuple, rows: int, block: int, num_types: int):
    """(slot of each row, type of each block) as numpy: each run padded to whole blocks."""
    position, block_type, start = np.empty(rows, np.int32), [], 0
    for t, lo, hi in groups:
        count = -(-(hi - lo) // block)
        position[lo:hi] = start + np.arange(hi - lo)
        block_type.extend([_clamped(t, num_types)] * count)
        start += count * block
    return position, np.asarray(block_type, np.int32)


def _blocked_matmul(x, table, position, block_type, block: int):
    """Each row to its slot (``position``: distinct), one GEMM per block of ``block`` slots with the weights of
    ``block_type``, each row's product back from its slot. Both moves are marked unique, so their transposes
    (the backward) are plain gathers and scatters too."""
    dtype = jnp.result_type(x, table)
    capacity = int(np.shape(block_type)[0]) * block
    packed = jnp.zeros((capacity,) + x.shape[1:], x.dtype).at[position].set(x, unique_indices=True)
    xb = packed.reshape((capacity // block, block) + x.shape[1:])
    h = _heads(x)
    # [nb, B, *heads, d_in] x [nb, *heads, d_in, d_out] -> [nb, *heads, B, d_out]
    yb = jax.lax.dot_general(xb, table[block_type], (((h + 2,), (h + 1,)), ((0,) + tuple(range(2, h + 2)),
                                                                             tuple(range(h + 1)))),
                             preferred_element_type=dtype)
    yb = jnp.moveaxis(yb, 1 + h, 1)  # [nb, B, *heads, d_out]
    return jnp.take(yb.reshape((capacity,) + yb.shape[2:]), position, axis=0, unique_indices=True).astype(dtype)


#: The engines a Pallas backend runs a typed matmul on: the ``impl`` handed to `pallas_kernels.typed_matmul`, or
#: the XLA implementation that runs where no static runs are known (with them, `static_groups`), and the report's
#: reason code.
PALLAS_ENGINES: dict[str, tuple[str | Callable, Reason]] = {
    "triton_kernel": ("pallas", Reason.TYPED_MATMUL_KERNEL),
    "ragged_dot": ("ragged_dot", Reason.TYPED_MATMUL_RAGGED_DOT),  # for real types the kernel does not take
    "reference": (reference, Reason.TYPED_MATMUL_PER_HEAD),  # per-head tables: the kernel multiplies 2-D rows only
    # complex: JAX 0.10.2 segfaults serialising ragged_dot of complex64 lowered for CUDA (fuzz campaign 20261128)
    "xla_blocks": (sorted_blocks, Reason.TYPED_MATMUL_XLA_DTYPE),
}


def pallas_engine(x, table) -> str:
    """The engine (a key of `PALLAS_ENGINES`) a Pallas backend runs ``x @ table[types]`` on; ``x`` and
    ``table`` are arrays or avals. The lowering and `explain` both ask here, so the report is what runs."""
    import pallas_kernels as pk

    if _heads(x):
        return "reference"
    dtype = jnp.result_type(x.dtype, table.dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "xla_blocks"
    impl = pk.auto_impl(dtype)
    return next(engine for engine, (kernel_impl, _) in PALLAS_ENGINES.items() if kernel_impl == impl)


def report_lowering(impl: str, x, table, groups: tuple = ()) -> tuple[str, Reason]:
    """(lowering, reason) of a typed matmul of ``impl`` (with static runs ``groups``) in `explain`: on the Pallas
    backends, the engine."""
    if impl not in eo.INTERPRET:
        return impl, Reason.GROUPED_MATMUL
    engine = pallas_engine(x, table)
    if callable(PALLAS_ENGINES[engine][0]) and groups:
        return "static_groups", PALLAS_ENGINES[engine][1]
    return engine, PALLAS_ENGINES[engine][1]


def _pallas(x, table, types, *, backend: str, block: int, groups: tuple = (), **_):
    """The engine of `pallas_engine`. With ``groups`` (static runs of one type, as `static_groups` takes them)
    each run is one group of the kernel, with its type's weights: no sort, and the kernel's tile bookkeeping is
    computed on the host. Without, each row moves to its slot among its type's rows and back. Tables the
    kernel does not take (per head) run as `static_groups` where the runs are known, else per row."""
    import pallas_kernels as pk

    kernel_impl = PALLAS_ENGINES[pallas_engine(x, table)][0]
    num_types, dtype = table.shape[0], jnp.result_type(x, table)
    if callable(kernel_impl):  # an XLA implementation: one GEMM per run where the runs are known
        xla = static_groups if groups else kernel_impl
        return xla(x, table, types, groups=groups, block=block)
    interpret = eo.INTERPRET[backend]
    if groups:
        _check_runs(groups, x.shape[0])
        run_types = np.asarray([_clamped(t, num_types) for t, _, _ in groups], np.int32)
        sizes = np.asarray([hi - lo for _, lo, hi in groups], np.int32)
        return pk.typed_matmul(x, table[run_types], sizes, impl=kernel_impl, interpret=interpret).astype(dtype)
    # each row to its slot among its type's rows and back, as `sorted_blocks` does: no sort for a few types, one
    # for many (not a sort and the sort of its inverse)
    types = jnp.clip(types, 0, num_types - 1)
    sizes = jnp.bincount(types, length=num_types).astype(jnp.int32)
    position = (jnp.cumsum(sizes) - sizes)[types] + _rank_within_type(types, num_types)
    packed = jnp.zeros_like(x).at[position].set(x, unique_indices=True)
    ys = pk.typed_matmul(packed, table, sizes, impl=kernel_impl, interpret=interpret)
    return jnp.take(ys, position, axis=0, unique_indices=True).astype(dtype)


IMPL = {"sorted_blocks": sorted_blocks, "static_groups": static_groups, "reference": reference,
        "pallas": functools.partial(_pallas, backend="pallas"),
        "pallas_interpret": functools.partial(_pallas, backend="pallas_interpret")}


def run(x, table, types, *, impl: str, block: int, groups: tuple = ()):
    return IMPL[impl](x, table, types, block=block, groups=groups)


def _abstract_eval(x, table, types, *, impl, block, groups):
    if table.ndim != x.ndim + 1 or types.shape != x.shape[:1]:
        raise ValueError(f"typed_matmul: x {x.shape}, table {table.shape}, types {types.shape}")
    shape = x.shape[:-1] + (table.shape[-1],)
    return compat.shaped_like(shape, jnp.result_type(x.dtype, table.dtype), [x, table, types])


def _jvp(primals, tangents, *, impl, block, groups):
    """Bilinear in (x, table): each moving operand's term is the op itself with that operand's tangent. Forward
    mode therefore runs the op's own implementation (a Triton kernel with a custom VJP cannot be pushed through
    ``jax.jvp``), and reverse mode transposes each term (`_transpose`)."""
    x, table, types = primals
    params = dict(impl=impl, block=block, groups=groups)
    out = _bind(x, table, types, **params)
    terms = [_bind(*[t if j == k else a for j, a in enumerate((x, table))], types, **params)
             for k, t in enumerate(tangents[:2]) if type(t) is not ad.Zero]
    if not terms:
        return out, compat.zero_tangent(out)
    return out, functools.reduce(jnp.add, terms)


# Where the Pallas backends' typed matmul (the Triton kernel; ragged_dot for wider types) cannot go, the XLA blocked
# GEMMs stand in: under vmap (no batching rule for either) and for the table's cotangent (the kernel's own dW runs
# inside a custom VJP, which forward mode cannot push through: a Hessian-vector product of a layer would fail).
_XLA_TWIN = {"pallas": "sorted_blocks", "pallas_interpret": "sorted_blocks"}


def _twin(impl: str, groups: tuple) -> str:
    """The XLA implementation standing in for ``impl``: with static runs, the one that needs no sort."""
    return "static_groups" if groups and impl in _XLA_TWIN else _XLA_TWIN.get(impl, impl)


def _transpose(ct, x, table, types, *, impl, block, groups):
    """The cotangent of the one linear operand (the other is a primal). For ``x``: the op itself with the table's
    last two axes swapped, so every order of derivative keeps running the op's rules. For ``table``: the
    pullback of an implementation that JAX differentiates in every mode (`_XLA_TWIN`)."""
    assert not ad.is_undefined_primal(types)
    (k,) = [j for j, a in enumerate((x, table)) if ad.is_undefined_primal(a)]
    aval = (x, table)[k].aval
    if type(ct) is ad.Zero:
        return [ad.Zero(aval) if j == k else None for j in range(3)]
    if k == 0:
        d = _bind(ct, jnp.swapaxes(table, -1, -2), types, impl=impl, block=block, groups=groups)
        return [d.astype(aval.dtype), None, None]
    dw = lambda t: run(x, t, types, impl=_twin(impl, groups), block=block, groups=groups)
    zero = compat.vary_like([jnp.zeros(aval.shape, aval.dtype)], [x, ct])[0]  # inside shard_map: as the table
    (d,) = jax.vjp(dw, zero)[1](ct)
    return [None, d, None]


def _batch(args, dims, *, impl, block, groups):
    impl = _twin(impl, groups)
    moved = [batching.bdim_at_front(a, d, next(np.shape(b)[e] for b, e in zip(args, dims, strict=True)
                                               if e is not compat.not_mapped))
             if d is not compat.not_mapped else a for a, d in zip(args, dims, strict=True)]
    axes = [0 if d is not compat.not_mapped else None for d in dims]
    return jax.vmap(functools.partial(run, impl=impl, block=block, groups=groups), in_axes=axes)(*moved), 0


def _residency(op, infos, ctx):
    x, _, types = infos
    return [Info(types.residency if facts.graph_resident(types) else x.residency, graph=types.graph,
                 edges=types.edges)], Movement.DENSE


def _cost(op) -> float:
    x, table = op.inputs[:2]
    return 2.0 * int(np.prod(x.shape, dtype=np.int64)) * table.shape[-1]


typed_matmul_p.def_abstract_eval(_abstract_eval)
typed_matmul_p.def_impl(jax.jit(run, static_argnames=("impl", "block", "groups")))
mlir.register_lowering(typed_matmul_p, compat.local_lowering(run, multiple_results=False))
ad.primitive_jvps[typed_matmul_p] = _jvp
ad.primitive_transposes[typed_matmul_p] = _transpose
batching.primitive_batchers[typed_matmul_p] = _batch
facts.register(typed_matmul_p, facts.Facts(residency=_residency, cost=_cost))
