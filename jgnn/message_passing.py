"""`message_passing(phi, rho, psi)`: a GNN layer from per-edge and per-node functions.

* ``phi(src, dst, edge) -> message`` is written for one edge: ``src``/``dst`` are its endpoints' node
  feature pytrees, ``edge`` its edge feature pytree (``None`` when the graph has no edge features).
* ``rho(mailbox, node) -> aggregate`` is written for one node: each mailbox leaf has a ragged leading axis
  with one row per incoming edge. Combine rows only with `jgnn.sum`/`mean`/`max`/`min`/`softmax`.
* ``psi(node, aggregate) -> new_node`` is written for one node.

Graph-level values (``graph.globals``, one row per graph) reach phi and psi as an extra last argument:
declare ``phi(src, dst, edge, globals)`` or ``psi(node, aggregate, globals)`` and each edge or node receives
the row of the graph it belongs to (the arity decides; 3- and 2-argument forms never see globals).

Heterogeneous graphs keep an int32 ``"type"`` entry in ``nodes`` and in ``edges``; phi and psi read it like
any feature (``W[edge["type"]] @ src["h"]``). When psi returns a dict without ``"type"``, the input node
types are carried over, so stacked typed layers keep working.

The layer's *reference program* is the straightforward whole-graph code a jraph user writes: gather node
features to edges, ``vmap(phi)``, segment reductions over ``receivers``, ``vmap(psi)``, written with jgnn's graph
primitives (`jgnn.ops`), so the compiler reads the structure instead of rediscovering it. Other backends compile
that program with `jgnn.compile`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import jraph

from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.compiler import Compiled
from jgnn.ops.gather import gather
from jgnn.roles import Index


def _positional_arity(fn: Callable) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return -1
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return -1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


def _rows_per_item(graph: jraph.GraphsTuple, counts, total: int, index: Index):
    """Each item's graph row of ``globals``: gathered by the graph id of each node or edge."""
    ids = jnp.repeat(jnp.arange(counts.shape[0], dtype=jnp.int32), counts, total_repeat_length=total)
    return jax.tree_util.tree_map(lambda g: gather(g, ids, index=index), graph.globals)


def default_psi(node, aggregate):
    return aggregate


@dataclasses.dataclass(frozen=True)
class MessagePassing:
    """A layer ``graph -> graph`` built from phi, rho and psi (see module docstring)."""

    phi: Callable
    rho: Callable | None = None
    psi: Callable | None = None
    backend: str = "auto"
    remat: Any = "auto"

    def __post_init__(self):
        from jgnn import remat as remat_lib
        from jgnn.compiler import resolve_backend

        resolve_backend(self.backend)  # a bad option fails here, not at the first call
        remat_lib.resolve(self.remat)
        for name in ("phi", "rho", "psi"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"message_passing: {name} must be callable, got {type(fn).__name__}")

    def reference(self, graph: jraph.GraphsTuple) -> jraph.GraphsTuple:
        """The uncompiled whole-graph program: the oracle for every rewrite and kernel."""
        n, e = graph_lib.num_nodes(graph), graph_lib.num_edges(graph)
        take = lambda idx, index: jax.tree_util.tree_map(lambda x: gather(x, idx, index=index), graph.nodes)
        phi_args = [take(graph.senders, Index.SRC), take(graph.receivers, Index.DST), graph.edges]
        if _positional_arity(self.phi) == 4:
            phi_args.append(_rows_per_item(graph, graph.n_edge, e, Index.EDGE_GRAPH))
        messages = jax.vmap(self.phi)(*phi_args)
        if self.rho is None:
            aggregate = jax.tree_util.tree_map(
                lambda m: mailbox.segment_reduce("sum", m, graph.receivers, n), messages)
        else:
            aggregate = mailbox.lower_rho(self.rho, messages, graph.nodes, graph.receivers, n)
        psi = self.psi or default_psi
        psi_args = [graph.nodes, aggregate]
        if _positional_arity(psi) == 3:
            psi_args.append(_rows_per_item(graph, graph.n_node, n, Index.NODE_GRAPH))
        new_nodes = jax.vmap(psi)(*psi_args)
        types = graph_lib.node_types(graph)
        if types is not None and isinstance(new_nodes, Mapping) and graph_lib.TYPE_KEY not in new_nodes:
            new_nodes = {**new_nodes, graph_lib.TYPE_KEY: types}
        return graph._replace(nodes=new_nodes)

    @property
    def compiled(self) -> Compiled:
        # Compiled keeps the per-signature plan cache, so keep one per layer.
        cache = self.__dict__.get("_compiled")
        if cache is None:
            cache = Compiled(self.reference, backend=self.backend, remat=self.remat)
            object.__setattr__(self, "_compiled", cache)
        return cache

    def __call__(self, graph: jraph.GraphsTuple, *, layout=None) -> jraph.GraphsTuple:
        graph_lib.validate(graph)
        if self.compiled.backend == "reference":
            return self.reference(graph)
        return self.compiled(graph, layout=layout)


def message_passing(phi: Callable, rho: Callable | None = None, psi: Callable | None = None, *,
                    backend: str = "auto", remat: Any = "auto") -> MessagePassing:
    """Build a layer from per-edge ``phi``, per-node ``rho`` and ``psi`` (defaults: sum, identity)."""
    return MessagePassing(phi, rho, psi, backend=backend, remat=remat)
