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
from jgnn import layout as layout_lib
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
    """A layer ``graph -> graph`` built from phi, rho and psi; make one with `jgnn.message_passing`.

    Attributes are the arguments of `jgnn.message_passing`. The layer is immutable and keeps one `jgnn.Compiled`
    (with its plan statistics) per instance.
    """

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

    def reference(self, graph: jraph.GraphsTuple, loop_edges=None, *, self_loops: bool = False) -> jraph.GraphsTuple:
        """The uncompiled whole-graph program: the oracle for every rewrite and kernel. With ``self_loops``, one
        edge ``i -> i`` per node is appended first (`jgnn.layout.append_loops`, with ``loop_edges`` as their
        features); the result keeps ``graph``'s own edges."""
        original = graph
        if self_loops:
            graph = layout_lib.append_loops(graph, loop_edges)
        elif loop_edges is not None:
            raise ValueError("message_passing: loop_edges given without self_loops=True")
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
        return original._replace(nodes=new_nodes)

    @property
    def compiled(self) -> Compiled:
        # Compiled keeps the per-signature plan cache, so keep one per layer.
        cache = self.__dict__.get("_compiled")
        if cache is None:
            cache = Compiled(self.reference, backend=self.backend, remat=self.remat)
            object.__setattr__(self, "_compiled", cache)
        return cache

    def __call__(self, graph: jraph.GraphsTuple, *, layout=None, self_loops: bool = False,
                 loop_edges=None) -> jraph.GraphsTuple:
        """Run the layer: ``graph`` (nodes ``[N, ...]``, senders/receivers int32 ``[E]``) -> the graph with new
        ``nodes`` (see `jgnn.message_passing`). ``layout``: a `jgnn.GraphLayout` of ``graph`` (built with
        ``self_loops=True`` when ``self_loops``) or ``None``.

        ``self_loops``: propagate over ``graph``'s edges plus one ``i -> i`` per node (PyG's ``add_self_loops``),
        appended inside the compiled program, so the compiler sees that every node sends and receives an edge
        (no unread-row mask, and a ``self_loops`` layout matches); ``loop_edges``: the loops' edge features, a
        pytree like ``graph.edges`` with ``[N, ...]`` leaves (required exactly when ``graph.edges`` is not None).
        """
        graph_lib.validate(graph)
        if self.compiled.backend == "reference":
            return self.reference(graph, loop_edges, self_loops=self_loops)
        return self.compiled(graph, loop_edges, self_loops=self_loops, layout=layout)


def message_passing(phi: Callable, rho: Callable | None = None, psi: Callable | None = None, *,
                    backend: str = "auto", remat: Any = "auto") -> MessagePassing:
    """Build a GNN layer ``graph -> graph`` from a per-edge ``phi``, a per-node ``rho`` and a per-node ``psi``.

    Each function is written for ONE edge or ONE node, and jgnn maps it over the graph. Below, a graph has ``N``
    nodes, ``E`` edges and ``G`` graphs; ``graph.nodes`` is an array or pytree whose leaves are ``[N, ...]``, and
    "the node's row" is that pytree with the leading axis indexed away (a leaf ``[N, F]`` is seen as ``[F]``).

    Args:
      phi: ``phi(src, dst, edge) -> message``. ``src``/``dst``: the rows of ``graph.nodes`` of the edge's sender
        and receiver; ``edge``: its row of ``graph.edges`` (``None`` when the graph has no edge features). The
        message is any pytree of arrays. Declare a fourth parameter, ``phi(src, dst, edge, globals)``, to also
        receive the row of ``graph.globals`` (leaves ``[G, ...]``) of the edge's graph.
      rho: ``rho(mailbox, node) -> aggregate``. ``mailbox``: the messages sent to the node, the message pytree
        with each leaf ``[deg, ...]`` where ``deg`` is the node's in-degree (ragged: not a static number, and
        possibly 0); ``node``: the node's row. Rows of the mailbox may be combined only with `jgnn.sum`,
        `jgnn.mean`, `jgnn.max`, `jgnn.min` (``[deg, ...] -> [...]``; 0 for an empty mailbox) and `jgnn.softmax`
        (``[deg, ...] -> [deg, ...]``, over the ``deg`` axis); element-wise ops and ops on the trailing axes
        apply row by row. Anything else, including ``mailbox.shape[0]``, raises `jgnn.UnsupportedMailboxOp`.
        ``None``: the sum of the messages, leaf by leaf.
      psi: ``psi(node, aggregate) -> new_node``: the node's row and rho's result; returns the node's new row (any
        pytree). Declare a third parameter, ``psi(node, aggregate, globals)``, to also receive its graph's row of
        ``graph.globals``. ``None``: the aggregate itself.
      backend: ``"auto"``, ``"xla"``, ``"pallas"``, ``"pallas_interpret"`` or ``"reference"`` (see
        `jgnn.compile`). An unknown name raises ``ValueError`` here, not at the first call.
      remat: what a training step keeps for the backward pass: ``"auto"``, ``"edges"``, ``"none"`` or a
        ``jax.checkpoint`` policy (see `jgnn.compile`).

    Returns:
      A `MessagePassing` layer, called as ``layer(graph, *, layout=None, self_loops=False, loop_edges=None)
      -> graph``. ``graph`` is a `jraph.GraphsTuple` with int32 ``senders``/``receivers`` ``[E]`` and
      ``n_node``/``n_edge`` ``[G]`` (checked by `jgnn.validate`); ``layout`` is an optional `jgnn.GraphLayout`
      of that graph; ``self_loops`` adds one edge ``i -> i`` per node first (``loop_edges``: their features,
      see `MessagePassing.__call__`). The result is
      the graph with ``nodes`` replaced by psi's rows stacked to ``[N, ...]`` leaves, every other field
      unchanged; on a typed graph, ``nodes["type"]`` is carried over when psi returns a dict without it. The
      layer works under ``jit``, ``grad``, ``jvp`` and ``vmap``. ``layer.reference(graph)`` runs the uncompiled
      program, and ``jgnn.explain(layer, graph)`` says what the compiler did to it.

    Example (a GCN-style mean of transformed neighbours; ``W`` ``[F, F']`` is an argument, so it can be traced)::

        def mean_layer(W):
            phi = lambda src, dst, edge: src @ W          # [F] -> [F']
            rho = lambda mailbox, node: jgnn.mean(mailbox)  # [deg, F'] -> [F']
            return jgnn.message_passing(phi, rho)

        out = jax.jit(lambda W, g: mean_layer(W)(g))(W, graph)   # out.nodes: [N, F']
    """
    return MessagePassing(phi, rho, psi, backend=backend, remat=remat)
