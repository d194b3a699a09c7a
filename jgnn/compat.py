"""JAX version shims for jgnn (0.10.x here, 0.11.x on the GPU machine). Keep every version check here.

Pallas-specific shims live in `pallas_kernels.compat`, since that package may not import jgnn.
"""

from __future__ import annotations

from typing import Any


def bind_primitive(prim: Any, params: dict, args) -> Any:
    """Bind ``prim`` as ``jax.core.eval_jaxpr`` does.

    ``get_bind_params`` returned ``(subfuns, params)`` before JAX 0.10 and returns params with the subfuns
    folded in since.
    """
    bound = prim.get_bind_params(params)
    if isinstance(bound, tuple) and len(bound) == 2 and isinstance(bound[1], dict):
        subfuns, bound = bound
        return prim.bind(*subfuns, *args, **bound)
    return prim.bind(*args, **bound)
