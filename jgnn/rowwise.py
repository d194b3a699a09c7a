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
logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round rsqrt select_n sign sin
sinh sqrt square stop_gradient sub tan tanh xor shift_left shift_right_logical shift_right_arithmetic
population_count clz
""".split())

REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split())
CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())


def _batched_inputs(op: Op, batched: Sequence[bool]):
    return [a for a, b in zip(op.inputs, batched, strict=True) if b]


def _elementwise(op: Op, batched) -> bool:
    # Unbatched operands must broadcast trivially: scalars, or the same rank (all rows share the value).
    out_rank = op.outputs[0].ndim
    return all(a.ndim in (0, out_rank) for a in op.inputs)


def _broadcast_in_dim(op: Op, batched) -> bool:
    dims = op.params["broadcast_dimensions"]
    return op.inputs[0].ndim > 0 and dims[0] == 0


def _reduction(op: Op, batched) -> bool:
    return 0 not in op.params["axes"]


def _argminmax(op: Op, batched) -> bool:
    return 0 not in op.params["axes"]


def _cumulative(op: Op, batched) -> bool:
    return op.params["axis"] != 0


def _dot_general(op: Op, batched) -> bool:
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    lhs_b, rhs_b = batched
    if lhs_b and rhs_b:  # both batched: a per-row batched matmul, rows paired on batch dim 0
        return tuple(lb[:1]) == (0,) and tuple(rb[:1]) == (0,)
    if lhs_b:  # the output's leading axes are the batch dims, then lhs free dims
        return not lb and 0 not in lc
    return False  # only rhs batched: its rows would land after the lhs free dims


def _reshape(op: Op, batched) -> bool:
    (x,) = op.inputs[:1]
    new = op.params["new_sizes"]
    return op.params.get("dimensions") is None and x.ndim > 0 and len(new) > 0 and new[0] == x.shape[0]


def _transpose(op: Op, batched) -> bool:
    return op.params["permutation"][0] == 0


def _concatenate(op: Op, batched) -> bool:
    # Unbatched pieces are constant columns shared by every row (e.g. the zero starts of a batched slice).
    return op.params["dimension"] != 0


def _squeeze(op: Op, batched) -> bool:
    return 0 not in op.params["dimensions"]


def _slice(op: Op, batched) -> bool:
    x = op.inputs[0]
    strides = op.params.get("strides") or (1,) * x.ndim
    return op.params["start_indices"][0] == 0 and op.params["limit_indices"][0] == x.shape[0] and strides[0] == 1


def _pad(op: Op, batched) -> bool:
    lo, hi, interior = op.params["padding_config"][0]
    return batched[0] and not batched[1] and (lo, hi, interior) == (0, 0, 0)


def _custom_call(op: Op, batched) -> bool:
    # A custom_jvp/vjp function (jax.nn.relu, jax.nn.gelu, ...) is row-wise if its body is.
    if op.body is None:
        return False
    from jgnn.residency import body_is_rowwise  # local import: residency builds on this table
    return body_is_rowwise(op.body, batched)


RULES: dict[str, Callable[[Op, Sequence[bool]], bool]] = {
    **{name: _elementwise for name in ELEMENTWISE},
    **{name: _reduction for name in REDUCTIONS if not name.startswith("arg")},
    "argmax": _argminmax,
    "argmin": _argminmax,
    **{name: _cumulative for name in CUMULATIVE},
    "broadcast_in_dim": _broadcast_in_dim,
    "dot_general": _dot_general,
    "reshape": _reshape,
    "transpose": _transpose,
    "concatenate": _concatenate,
    "squeeze": _squeeze,
    "slice": _slice,
    "pad": _pad,
    "custom_jvp_call": _custom_call,
    "custom_vjp_call": _custom_call,
    "custom_vjp_call_jaxpr": _custom_call,
}


def is_rowwise(op: Op, batched: Sequence[bool]) -> bool:
    """True when ``op`` maps row i of its batched inputs to row i of every output."""
    rule = RULES.get(op.name)
    if rule is None or not any(batched):
        return False
    if any(b and a.ndim == 0 for a, b in zip(op.inputs, batched, strict=True)):
        return False
    return rule(op, batched)


def is_elementwise(op: Op) -> bool:
    return op.name in ELEMENTWISE
