"""Graph conventions and input validation for `jraph.GraphsTuple`s.

Conventions (the same as jraph's):

* ``nodes`` / ``edges`` are arrays or pytrees of arrays whose leading axis is the node / edge axis.
* Edge ``i`` goes ``senders[i] -> receivers[i]``; messages flow to the receiver.
* Heterogeneous graphs carry an int32 ``"type"`` entry in the ``nodes`` dict and in the ``edges`` dict.
* ``globals`` has one row per graph of the batch (leading axis ``len(n_node)``).
* Padding follows ``jraph.pad_with_graphs``: the last graph is the padding graph and its edges only touch
  its own nodes, so padding never changes the result on real nodes.

`validate` checks everything it can whenever the values are concrete. Under ``jax.jit`` the index arrays are
tracers and cannot be inspected; then jgnn follows jraph's semantics: gathers are clamped into range and
segment reductions drop out-of-range indices (``FILL_OR_DROP``). Wrap a call in ``jax.experimental.checkify``
with ``checkify.index_checks`` to get the same errors inside ``jit``.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import jraph
import numpy as np

TYPE_KEY = "type"


def _is_concrete(x) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def _leading_dims(tree) -> set[int]:
    return {int(np.shape(leaf)[0]) for leaf in jax.tree_util.tree_leaves(tree) if np.ndim(leaf) > 0}


def num_nodes(graph: jraph.GraphsTuple) -> int:
    """Static node count: the leading dim of the node features, else ``sum(n_node)`` when concrete."""
    dims = _leading_dims(graph.nodes)
    if dims:
        return dims.pop()
    if _is_concrete(graph.n_node):
        return int(np.sum(np.asarray(graph.n_node)))
    raise ValueError("graph.nodes is empty and graph.n_node is traced: the number of nodes is not static")


def num_edges(graph: jraph.GraphsTuple) -> int:
    """Static edge count: the length of ``senders``."""
    return int(np.shape(graph.senders)[0])


def node_types(graph: jraph.GraphsTuple):
    return graph.nodes.get(TYPE_KEY) if isinstance(graph.nodes, Mapping) else None


def edge_types(graph: jraph.GraphsTuple):
    return graph.edges.get(TYPE_KEY) if isinstance(graph.edges, Mapping) else None


def _check_index_array(name: str, idx, bound: int) -> None:
    if idx is None:
        raise ValueError(f"graph.{name} is None")
    dtype = jnp.result_type(idx)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"graph.{name} must have an integer dtype, got {dtype}")
    if np.ndim(idx) != 1:
        raise ValueError(f"graph.{name} must be 1-D, got shape {np.shape(idx)}")
    if _is_concrete(idx) and np.size(idx):
        arr = np.asarray(idx)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= bound:
            bad = int(np.flatnonzero((arr < 0) | (arr >= bound))[0])
            raise ValueError(
                f"graph.{name}[{bad}] = {int(arr[bad])} is out of range [0, {bound}) "
                f"(min {lo}, max {hi})"
            )


def validate(graph: jraph.GraphsTuple, *, typed: bool = False,
             num_node_types: int | None = None, num_edge_types: int | None = None) -> jraph.GraphsTuple:
    """Check a GraphsTuple and return it unchanged.

    Raises ``TypeError`` for wrong dtypes and ``ValueError`` for wrong shapes or values, naming the field.
    Value checks (index ranges, ``n_node``/``n_edge`` sums) run only on concrete arrays; shapes and dtypes are
    checked always. With ``typed=True`` the ``"type"`` entries of ``nodes`` and ``edges`` are required.
    """
    if not isinstance(graph, jraph.GraphsTuple):
        raise TypeError(f"expected a jraph.GraphsTuple, got {type(graph).__name__}")
    for name in ("n_node", "n_edge"):
        arr = getattr(graph, name)
        if arr is None or np.ndim(arr) != 1:
            raise ValueError(f"graph.{name} must be a 1-D array with one entry per graph")
        if not jnp.issubdtype(jnp.result_type(arr), jnp.integer):
            raise TypeError(f"graph.{name} must have an integer dtype, got {jnp.result_type(arr)}")
    n, e = num_nodes(graph), num_edges(graph)
    _check_index_array("senders", graph.senders, n)
    _check_index_array("receivers", graph.receivers, n)
    if np.shape(graph.receivers) != np.shape(graph.senders):
        raise ValueError(f"graph.senders {np.shape(graph.senders)} and graph.receivers "
                         f"{np.shape(graph.receivers)} differ in shape")
    node_dims, edge_dims = _leading_dims(graph.nodes), _leading_dims(graph.edges)
    if len(node_dims) > 1 or (node_dims and node_dims != {n}):
        raise ValueError(f"graph.nodes leaves have leading dims {sorted(node_dims)}; expected all {n}")
    if edge_dims and edge_dims != {e}:
        raise ValueError(f"graph.edges leaves have leading dims {sorted(edge_dims)}; expected all {e} "
                         f"(= len(senders))")
    if graph.globals is not None:
        g_dims = _leading_dims(graph.globals)
        if g_dims and g_dims != {int(np.shape(graph.n_node)[0])}:
            raise ValueError(f"graph.globals leaves have leading dims {sorted(g_dims)}; expected one row per "
                             f"graph ({np.shape(graph.n_node)[0]})")
    for name, total in (("n_node", n), ("n_edge", e)):
        arr = getattr(graph, name)
        if _is_concrete(arr) and int(np.sum(np.asarray(arr))) != total:
            raise ValueError(f"sum(graph.{name}) = {int(np.sum(np.asarray(arr)))} but the arrays hold {total}")
    for where, types, count in (("nodes", node_types(graph), num_node_types),
                                ("edges", edge_types(graph), num_edge_types)):
        if types is None:
            if typed:
                got = "is None" if getattr(graph, where) is None else 'has no "type" entry'
                raise ValueError(f'typed model: graph.{where} {got}; it must be a dict with an int32 "type" entry')
            continue
        if count is not None:
            _check_index_array(f'{where}["type"]', types, count)
        elif not jnp.issubdtype(jnp.result_type(types), jnp.integer):
            raise TypeError(f'graph.{where}["type"] must have an integer dtype, got {jnp.result_type(types)}')
    return graph

