"""Which ops act row by row on a leading axis, and so commute with gathering rows.

An op is *row-wise* for a set of its inputs (the "batched" ones, whose axis 0 is a graph axis: nodes, edges or
a mailbox) when output row ``i`` depends only on row ``i`` of those inputs and on the unbatched inputs. That
is the legality condition of broadcast reordering (``f(h[src]) == f(h)[src]``), of mailbox lowering and of
fusion. The rules are a table keyed by primitive name; a primitive that is not in the table is not row-wise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jgnn.ir import Op

ELEMENTWISE = frozenset("""
abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp conj convert_element_type copy copy_p cos cosh
digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma log log1p
logistic lt max min mul name ne neg nextafter not or pow real reduce_precision rem round rsqrt select_n sign sin
sinh sqrt square stop_gradient sub tan tanh xor shift_left shift_right_logical shift_right_arithmetic
population_count clz
""".split())

REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split())
CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())


Axes = Sequence["int | None"]


def _common(axes: Axes) -> int | None:
    present = {a for a in axes if a is not None}
    return present.pop() if len(present) == 1 else None


def _elementwise(op: Op, axes: Axes) -> int | None:
    # Unbatched operands must broadcast trivially: scalars, or the same rank (constant along the row axis).
    out_rank = op.outputs[0].ndim
    if not all(a.ndim in (0, out_rank) for a in op.inputs):
        return None
    return _common(axes)


def _broadcast_in_dim(op: Op, axes: Axes) -> int | None:
    (a,) = axes
    return op.params["broadcast_dimensions"][a]


def _reduction(op: Op, axes: Axes) -> int | None:
    (a,) = axes[:1]
    reduced = op.params["axes"]
    return None if a in reduced else a - sum(r < a for r in reduced)


def _cumulative(op: Op, axes: Axes) -> int | None:
    return None if op.params["axis"] == axes[0] else axes[0]


def _dot_general(op: Op, axes: Axes) -> int | None:
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    a, b = axes
    lhs, rhs = op.inputs
    lhs_free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rhs_free = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    if a is not None and b is not None:  # rows paired: both row axes are the same batch dim
        return list(lb).index(a) if a in lb and b in rb and list(lb).index(a) == list(rb).index(b) else None
    if a is not None:
        return len(lb) + lhs_free.index(a) if a in lhs_free else None
    return len(lb) + len(lhs_free) + rhs_free.index(b) if b in rhs_free else None


def _reshape(op: Op, axes: Axes) -> int | None:
    (a,) = axes[:1]
    x = op.inputs[0]
    new = tuple(op.params["new_sizes"])
    keeps = op.params.get("dimensions") is None and len(new) > a and new[:a + 1] == x.shape[:a + 1]
    return a if keeps else None


def _transpose(op: Op, axes: Axes) -> int | None:
    return list(op.params["permutation"]).index(axes[0])


def _concatenate(op: Op, axes: Axes) -> int | None:
    # Unbatched pieces are constant columns shared by every row (e.g. the zero starts of a batched slice).
    a = _common(axes)
    return None if a is None or op.params["dimension"] == a else a


def _squeeze(op: Op, axes: Axes) -> int | None:
    a, dims = axes[0], op.params["dimensions"]
    return None if a in dims else a - sum(d < a for d in dims)


def _slice(op: Op, axes: Axes) -> int | None:
    a, x = axes[0], op.inputs[0]
    strides = op.params.get("strides") or (1,) * x.ndim
    full = op.params["start_indices"][a] == 0 and op.params["limit_indices"][a] == x.shape[a] and strides[a] == 1
    return a if full else None


def _pad(op: Op, axes: Axes) -> int | None:
    a = axes[0]
    return a if axes[1] is None and tuple(op.params["padding_config"][a]) == (0, 0, 0) else None


def _gather(op: Op, axes: Axes) -> int | None:
    # Only the per-row form, where every row reads its own row: x[e, i[e]].
    dn = op.params["dimension_numbers"]
    per_row = tuple(getattr(dn, "operand_batching_dims", ())) == (0,) and tuple(
        getattr(dn, "start_indices_batching_dims", ())) == (0,)
    return 0 if per_row and all(a in (0, None) for a in axes) else None


def _custom_call(op: Op, axes: Axes) -> int | None:
    # A custom_jvp/vjp function (jax.nn.relu, jax.nn.gelu, ...) is row-wise if its body is.
    if op.body is None:
        return None
    from jgnn.residency import body_out_axis  # local import: residency builds on this table
    return body_out_axis(op.body, axes)


RULES: dict[str, Callable[[Op, Axes], int | None]] = {
    **{name: _elementwise for name in ELEMENTWISE},
    **{name: _reduction for name in REDUCTIONS},
    **{name: _cumulative for name in CUMULATIVE},
    "broadcast_in_dim": _broadcast_in_dim,
    "dot_general": _dot_general,
    "reshape": _reshape,
    "transpose": _transpose,
    "concatenate": _concatenate,
    "squeeze": _squeeze,
    "slice": _slice,
    "pad": _pad,
    "gather": _gather,
    "custom_jvp_call": _custom_call,
    "custom_vjp_call": _custom_call,
    "custom_vjp_call_jaxpr": _custom_call,
}

# Params that hold the length of the row axis, which change when an op is re-run on fewer rows.
ROW_LENGTH_PARAMS = {"broadcast_in_dim": "shape", "reshape": "new_sizes", "slice": "limit_indices"}


def out_axis(op: Op, axes: Axes) -> int | None:
    """Where the row axis lands in ``op``'s outputs, given where it is in each input (None: not batched).

    Returns None when ``op`` is not row-wise: some output row depends on more than one input row.
    """
    rule = RULES.get(op.name)
    if rule is None or all(a is None for a in axes):
        return None
    if any(a is not None and (x.ndim == 0 or a >= x.ndim) for a, x in zip(axes, op.inputs, strict=True)):
        return None
    return rule(op, axes)


def is_rowwise(op: Op, batched: Sequence[bool]) -> bool:
    """True when ``op`` maps row i of its batched inputs (row axis 0) to row i of its outputs (axis 0)."""
    return out_axis(op, [0 if b else None for b in batched]) == 0
