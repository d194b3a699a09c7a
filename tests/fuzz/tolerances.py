"""The fuzzer's tolerance table: what counts as "the same answer" per dtype.

For forward values, NaN and ±inf positions of the backend must equal the reference's exactly (same dtype, same
program). For gradients and JVP tangents the *non-finite* positions must be equal, but NaN and ±inf may swap:
the linear rewrites distribute sums over products (the gradient of ``(h @ W)[src]`` sums the cotangents per
node before multiplying by ``h``), so an infinite input times cotangents ``0`` and ``c`` is ``inf·0 + inf·c =
NaN`` in the reference and ``inf·(0 + c) = inf`` after the rewrite.

Where the reference is NaN or ±inf but the float64 oracle is finite (the reference overflowed in its own dtype,
e.g. an inf − inf of two 1e38 terms), a finite backend value is compared with the oracle instead. Where the
reference is NaN there and the backend ±inf, the oracle rounded to the dtype stands in: the backend passes when the
true value lies past the dtype's range with that sign (a float16 sum the backend accumulates in float32, which
overflows once, where the reference's float16 partial sums overflowed both ways), or when the program with every
operation rounded once to its dtype overflows there with that sign (`rounded`: a float16 mean whose sum does not
fit, though the mean does). Forward values of cases with
scattered ±inf inputs may swap NaN and ±inf (`checker.SCATTERED_INF_PATTERNS`). In a program at the range edge (one of
its operations, computed in float64, comes within `RANGE_HEADROOM` of the dtype's largest number or passes it:
`at_range_edge`), a position that is finite on one side and not on the other is not compared where the float64
oracle is finite: whether a sum overflows depends on its association, a fused softmax sums before it divides,
and an overflow inside the program reaches outputs of any size through the layers after it. This is the one
place where jgnn's overflow may differ from the reference's; NaN and inf that come from the inputs (the oracle
is not finite there), and every program whose values stay 2^11 below the range, are compared exactly.

At positions where both are finite, values are compared row by row (the leading axis: one node, edge or
parameter slice). With ``r`` the reference and ``b`` the backend, a row passes when it is within rounding of
the reference:

    max|b − r|  ≤  RTOL[dtype] · S(r)  +  FLOOR[dtype]

Otherwise it is compared against an *oracle* ``o``, the reference program run in float64 (complex128) on the
same inputs upcast, and passes when

    max|b − o|  ≤  K_REF · E(r − o)  +  RTOL[dtype] · S(o)  +  FLOOR[dtype]

``S(x)`` is the row's largest |x|, but at least ``LEAF_FRACTION`` of the largest in the whole output leaf: a row
that is ~0 because its terms cancel still carries the rounding error of those terms, which are about as large
as the other rows. ``E(r − o)`` is the reference's own error on the row, but at least ``LEAF_FRACTION`` of its
largest error in the leaf, for the same reason. That term lets a backend be as far from the truth as the
reference itself is, several times over: a bf16/f16 reference that sums 1,000 in-edges in its own precision is
far from the truth, and a backend that accumulates in float32 must not be blamed for disagreeing with it.
RTOL is a few ulps of the result in the dtype; FLOOR, twice the smallest normal number, absorbs subnormals
that one side flushes to zero.
A float64 case has no better oracle, so ``o = r`` and only the RTOL term applies. Integer outputs must be
equal exactly.

A part that fails all of this against the jitted reference is compared once more, by the same rules, with the
reference run op by op (`checker.Oracle.eager`): jitted, XLA may recompute one value rounded differently (a
softmax score inside ``s − max``, against the max of the rounded score), and at large magnitudes ``exp`` of the
difference is inf. A gradient by forward mode (ids out of range) may also match the reference's reverse-mode
one (`checker.REVERSE_MODE_GRAD`).

A part that still fails may be as far from the oracle as the rounded oracle is (`rounded`: the program with
every operation rounded once to its dtype): jitted, XLA keeps excess precision between the ops it fuses, so a
bfloat16 reference that sums per-edge products it never rounds can be far nearer float64 than its own program,
which a backend that rounds a node-level product before the sum equals (campaign 20261600).

A derivative of unit-scale values that still fails gets one more allowance: ``E(r − o)`` becomes at least how
far the reference's own derivative moves, anywhere in the leaf, when the parameters move by up to 64 float32
ulps (`checker.Oracle.spread`). A max's derivative jumps where two edges' messages are within rounding of each
other, and a reassociated chain picks the other edge: where the reference does not move, nothing is allowed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

K_REF = 8.0
LEAF_FRACTION = 0.01

# dtype -> RTOL. bf16 has 8 significant bits (eps 2^-7), f16 11 (eps 2^-10), f32 24 (eps 2^-23), f64 53.
# RTOL is 4 eps for bf16 and f16, whose oracle term dominates anyway; 250 eps for f32 and 1e-10 for f64, which
# leave room for reassociated sums of 1,000 terms with some cancellation (f64 cases have no oracle term).
RTOL = {
    "float64": 1e-10,
    "complex128": 1e-10,
    "float32": 3e-5,
    "complex64": 3e-5,
    "float16": 4e-3,
    "bfloat16": 3e-2,
}
def _finfo(name: str):
    """``finfo`` of a dtype name; a complex dtype's of its parts."""
    return ml_dtypes.finfo(name.replace("complex128", "float64").replace("complex64", "float32"))


FLOOR = {name: 2 * float(_finfo(name).tiny) for name in RTOL}

# The dtype the oracle runs in; float64 cases are their own oracle.
ORACLE_DTYPE = {"float32": "float64", "bfloat16": "float64", "float16": "float64", "float64": "float64",
                "complex64": "complex128", "complex128": "complex128"}


def part_fraction(dtype: str, magnitude: str) -> float:
    """A derivative row's scale is at least this fraction of the largest |value| in the whole gradient (tangent).

    A gradient that is zero in exact arithmetic (a softmax logit term that is constant over a neighbourhood) is
    rounding noise of terms as large as the other rows: `LEAF_FRACTION` of them. With inputs near sqrt(max), a
    reassociated sum absorbs small terms (2.5 + 1e154 − 1e154 = 0 where the reference computes 2.5 + (1e154 −
    1e154)), and in bf16/f16 such noise is large: there a row's error is relative to the whole part.
    """
    return 1.0 if magnitude == "huge" or dtype in ("float16", "bfloat16") else LEAF_FRACTION


def least_scale(magnitude: str, forward_scale: float = 0.0) -> float:
    """A derivative row's scale is at least this much: 1 for unit-scale values (``normal``), whose derivatives sum
    products of about that size. Where every finite entry of the reference's gradient is exactly 0 (its terms
    cancel, the other entries are ±inf), the part gives no scale, and a backend's rounding noise of those terms
    (5e-17 in float64) would be compared with 0. Other magnitudes have no such unit: there the terms are products
    of a cotangent and a value as large as the forward outputs, ``forward_scale`` (the largest finite |output| of
    the reference). A softmax row with one finite score has weight 1 and a score derivative ``p − 1·p = 0``; a
    kernel that recomputes the weight as 1 − 2^-24 leaves 2^-24·|p| (campaign 20261128: 8e11 at outputs of 3e19).
    """
    return 1.0 if magnitude == "normal" else forward_scale


# A program at the range edge computes some value within this factor of the dtype's largest number. A fused softmax
# sums ``exp(s − m) v`` over up to a hub's 1,050 in-edges before it divides, as every fused attention does, and a
# reassociated product chain or gradient sums per node before it multiplies: an intermediate up to the in-degree
# times a value of the reference's overflows where the reference's association does not, and the reverse.
RANGE_HEADROOM = 2.0 ** 11


def at_range_edge(largest: float, dtype: str) -> bool:
    """Whether a program whose largest intermediate magnitude is ``largest`` (`rounded.largest`) sits at the range
    edge of ``dtype`` (`RANGE_HEADROOM`)."""
    return largest >= float(_finfo(dtype).max) / RANGE_HEADROOM


def _at_least_fraction(rows: np.ndarray) -> np.ndarray:
    return np.maximum(rows, LEAF_FRACTION * rows.max(initial=0))


def allowed(dtype: str, ref_err: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Allowed error per row, from the reference's per-row error and the per-row max |value| (one leaf)."""
    return K_REF * _at_least_fraction(ref_err) + RTOL[dtype] * _at_least_fraction(scale) + FLOOR[dtype]
