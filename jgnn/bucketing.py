"""Shape bucketing for compiled functions: pad every graph argument up to a bucket, cut the outputs back.

Padding follows ``jraph.pad_with_graphs``: one padding graph takes the spare nodes and edges, and its edges only
join its own nodes, so a row-wise or per-graph result on the real nodes, edges and graphs does not change. The
outputs are cut back by where the analysis says their rows live (nodes, edges or graphs of which argument); an
output with no such axis (a sum over all nodes, say) would include the padding, so bucketing refuses it with an
error naming it. Only graphs whose arrays are concrete are padded: under ``jit`` shapes are fixed already.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jraph
import numpy as np

from jgnn.batching import Bucket, pad_to_bucket
from jgnn.roles import Residency


def _pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


class Pow2:
    """The bucket of next powers of two above the real sizes (plus the padding node and graph)."""

    def __call__(self, n: int, e: int, g: int) -> Sequence[Bucket]:
        return [Bucket(_pow2(n + 1), _pow2(max(e, 1)), _pow2(g + 1))]


def resolve(buckets):
    """``None``, ``"pow2"``, a callable ``(n, e, g) -> buckets`` or a sequence of `Bucket`s."""
    if buckets is None or callable(buckets):
        return buckets
    if buckets == "pow2":
        return Pow2()
    if isinstance(buckets, Sequence) and buckets and all(isinstance(b, Bucket) for b in buckets):
        fixed = tuple(sorted(buckets))
        return lambda n, e, g: fixed
    raise ValueError(f"buckets must be None, 'pow2', a callable or a sequence of jgnn.batching.Bucket, got {buckets!r}")


def _concrete(graph: jraph.GraphsTuple) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(graph))


def pad_arguments(tree, buckets):
    """(padded tree, real sizes per graph argument), or None when some graph argument is traced."""
    top, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, jraph.GraphsTuple))
    graphs = [x for x in top if isinstance(x, jraph.GraphsTuple)]
    if not graphs or not all(map(_concrete, graphs)):
        return None
    sizes, out = [], []
    for x in top:
        if isinstance(x, jraph.GraphsTuple):
            n, e, g = int(np.sum(x.n_node)), int(np.sum(x.n_edge)), int(np.shape(x.n_node)[0])
            sizes.append((n, e, g))
            x = pad_to_bucket(x, buckets(n, e, g))
        out.append(x)
    return jax.tree_util.tree_unflatten(treedef, out), sizes


def unpad(out, plan, sizes):
    """Cut each output leaf back to its real rows (see module docstring)."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    cut = []
    for i, (leaf, (residency, graph, passthrough)) in enumerate(zip(leaves, plan.out_rows, strict=True)):
        n, e, g = sizes[graph] if graph < len(sizes) else sizes[0]
        rows = {Residency.NODE: n, Residency.EDGE: e, Residency.GRAPH: g}.get(residency)
        if rows is None:
            if not passthrough:
                raise ValueError(f"buckets: output {i} has no row per node, edge or graph ({residency.value}); "
                                 "padding could change it, so compile this function without buckets")
            cut.append(leaf)
            continue
        cut.append(leaf[:rows])
    return jax.tree_util.tree_unflatten(treedef, cut)
