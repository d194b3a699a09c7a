"""Which dtype a kernel computes in and which it returns.

* Floating results (any floating operand): compute in float64 if an operand is float64, else float32
  (bfloat16/float16 operands are widened on load); outputs have the operands' result dtype.
* Integer results (every operand a signed integer): compute in int32 (int64 if an operand is int64), exactly;
  only reductions that stay integral (sum, max, min) and gather_compute accept them.
* Anything else (complex, unsigned or boolean results) raises ``TypeError``.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np


def result_dtype(arrays: Sequence) -> np.dtype:
    return np.dtype(jnp.result_type(*(x.dtype for x in arrays)))


def compute_dtype(arrays: Sequence, *, integers: bool, what: str, result=None) -> np.dtype:
    """Compute dtype of a kernel over ``arrays``; ``integers``: whether integer results are exact there.

    ``result``: the dtype the kernel returns, when the caller knows it: a floating result computed from integer
    operands (edge types, counts) is computed in floating point, which holds integers exactly up to 2**24
    (float32) or 2**53 (float64, chosen when an operand is 64-bit).
    """
    dtypes = [np.dtype(x.dtype) for x in arrays]
    if any(jnp.issubdtype(d, jnp.complexfloating) for d in dtypes):
        raise TypeError(f"{what}: complex operands are not supported (got {[d.name for d in dtypes]})")
    if result is None or not jnp.issubdtype(result, jnp.floating):
        result = result_dtype(arrays)
    if jnp.issubdtype(result, jnp.floating):
        # Without a floating operand, the integers are carried exactly: 64-bit ones (or a float64 result) need f64.
        integral = not any(jnp.issubdtype(d, jnp.floating) for d in dtypes)
        wide = np.dtype(jnp.float64) in dtypes or integral and (
            np.dtype(result) == np.dtype(jnp.float64) or any(d.itemsize == 8 for d in dtypes))
        return np.dtype(jnp.float64 if wide else jnp.float32)
    if not jnp.issubdtype(result, jnp.signedinteger):
        raise TypeError(f"{what}: operands of result dtype {result.name} are not supported; cast them to a "
                        f"signed integer or floating dtype")
    if not integers:
        raise TypeError(f"{what} needs a floating operand (integer result dtype {result.name} would be inexact)")
    return np.dtype(jnp.int64 if np.dtype(jnp.int64) in dtypes else jnp.int32)


def check_edge_fn_output(out_dtype, compute: np.dtype, what: str) -> None:
    """An integer kernel must not see ``edge_fn`` make floats: casting them back would truncate silently."""
    if jnp.issubdtype(compute, jnp.integer) and not jnp.issubdtype(out_dtype, jnp.integer):
        raise TypeError(f"{what}: edge_fn returns {np.dtype(out_dtype).name} on integer operands; pass a "
                        f"floating operand (or cast one) so the kernel computes in floating point")
