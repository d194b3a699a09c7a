"""Mailbox reductions and the lowering of a per-node ``rho`` to whole-graph JAX code.

``rho(mailbox, node)`` is written for one node: each mailbox leaf has a ragged leading axis (one row per
incoming edge). The only operations across that axis are `sum`, `mean`, `max`, `min` (node-shaped results)
and `softmax` (mailbox-shaped). Anything else may be applied row by row.

`lower_rho` traces rho once with a one-row mailbox, then evaluates that trace over the whole graph with one
loop over its ops. Each value is either mailbox-valued (one row per edge: ``[E, 1, ...]``), node-valued
(``[N, ...]``) or a constant. Ops on mailbox values run once per edge (node operands are gathered by
``receivers``), ops on node values once per node, and the reductions become segment ops over ``receivers``.
The result is exactly the program a jraph user would write, which is jgnn's reference.

Empty mailboxes (nodes without in-edges) reduce to 0 for every reduction, as in PyG and DGL; `max`/`min`
do not return the ``-inf``/``+inf`` that ``jax.ops.segment_max`` gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.interpreters import mlir

from jgnn import facts, ir
from jgnn.ops.gather import gather
from jgnn.ops.segment import segment
from jgnn.ops.softmax import segment_softmax
from jgnn.roles import Index


class UnsupportedMailboxOp(TypeError):
    """Raised when rho combines mailbox rows with anything but the mailbox reductions."""


mailbox_reduce_p = jcore.Primitive("jgnn_mailbox_reduce")


def _abstract_eval(x, *, kind):
    if x.ndim == 0:
        raise UnsupportedMailboxOp(f"jgnn.{kind} expects a mailbox value (with the ragged leading axis)")
    shape = x.shape if kind == "softmax" else x.shape[1:]
    return jax.core.ShapedArray(shape, x.dtype)


def _outside_rho(*args, kind):
    raise UnsupportedMailboxOp(f"jgnn.{kind} reduces a mailbox and can only be used inside rho")


mailbox_reduce_p.def_abstract_eval(_abstract_eval)
mailbox_reduce_p.def_impl(_outside_rho)
mlir.register_lowering(mailbox_reduce_p, lambda ctx, *a, kind: _outside_rho(kind=kind))


def _reducer(kind: str) -> Callable[[Any], Any]:
    def reduce(mailbox):
        return jax.tree_util.tree_map(lambda x: mailbox_reduce_p.bind(x, kind=kind), mailbox)

    reduce.__name__ = kind
    reduce.__doc__ = f"Mailbox {kind} across incoming edges (inside rho only; empty mailboxes give 0)."
    return reduce


sum = _reducer("sum")  # noqa: A001 - the public names mirror jnp's
mean = _reducer("mean")
max = _reducer("max")  # noqa: A001
min = _reducer("min")  # noqa: A001
softmax = _reducer("softmax")
softmax.__doc__ = "Softmax across a node's incoming edges (inside rho only); returns mailbox-shaped values."


def segment_reduce(kind: str, x, receivers, num_nodes: int):
    """Whole-graph form of one mailbox reduction; ``x`` is ``[E, ...]``, the result ``[N, ...]`` (softmax:
    ``[E, ...]``)."""
    if kind == "softmax":
        return segment_softmax(x, receivers, num_segments=num_nodes, index=Index.DST)
    return segment(x, receivers, kind=kind, num_segments=num_nodes, index=Index.DST, empty="zero")


EDGE, NODE, CONST = "edge", "node", "const"


def lower_rho(rho: Callable, messages, node, receivers, num_nodes: int):
    """Evaluate the per-node ``rho(mailbox, node)`` for every node at once (see module docstring)."""
    per_node = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), node)

    def trace(rows: int):
        mb = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct((rows,) + m.shape[1:], m.dtype), messages)
        return jax.make_jaxpr(rho, return_shape=True)(mb, per_node)

    closed, out_shape = trace(1)
    if _literals(closed.jaxpr) != _literals(trace(2)[0].jaxpr):
        raise UnsupportedMailboxOp("rho used the mailbox's length (e.g. jgnn.sum(mb) / mb.shape[0]); a node's "
                                   "number of messages is not static: use jgnn.mean, or jgnn.sum of "
                                   "jnp.ones_like(mb[:, :1]) for the degree")
    traced = ir.from_closed_jaxpr(closed)
    program = traced.program
    msg_leaves = [m[:, None] for m in jax.tree_util.tree_leaves(messages)]
    kinds: dict[int, str] = {}
    env: dict[int, Any] = {}
    node_leaves = jax.tree_util.tree_leaves(node)
    in_kinds = [EDGE] * len(msg_leaves) + [NODE] * len(node_leaves) + [CONST] * len(traced.consts)
    for v, x, k in zip(program.inputs, msg_leaves + node_leaves + traced.consts, in_kinds, strict=True):
        env[v.id], kinds[v.id] = x, k

    def read(a):
        return (a.value, CONST) if isinstance(a, ir.Const) else (env[a.id], kinds[a.id])

    for op in program.ops:
        vals, ks = zip(*map(read, op.inputs), strict=True) if op.inputs else ((), ())
        if op.prim is mailbox_reduce_p:
            outs, kind = _lower_reduction(op, vals[0], ks[0], receivers, num_nodes)
        else:
            outs, kind = _lower_rowwise(op, vals, ks, receivers)
        for v, x in zip(op.outputs, outs, strict=True):
            env[v.id], kinds[v.id] = x, kind
    results = []
    for a, shape in zip(program.outputs, jax.tree_util.tree_leaves(out_shape), strict=True):
        x, k = read(a)
        if k == EDGE:
            raise UnsupportedMailboxOp("rho must reduce the mailbox: one of its outputs still has one row per "
                                       "edge (apply jgnn.sum/mean/max/min to it)")
        results.append(x if k == NODE else jnp.broadcast_to(x, (num_nodes,) + shape.shape))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), results)


def _literals(jaxpr) -> list:
    """The literal values a jaxpr computes with, in order (sub-jaxprs included)."""
    found = []
    for eqn in jaxpr.eqns:
        found += [np.asarray(v.val).tolist() for v in eqn.invars if isinstance(v, jcore.Literal)]
        for p in eqn.params.values():
            sub = getattr(p, "jaxpr", p)
            if isinstance(sub, jcore.Jaxpr):
                found += _literals(sub)
    return found


def _lower_reduction(op: ir.Op, x, kind_in: str, receivers, num_nodes: int):
    kind = op.params["kind"]
    if kind_in == CONST and jnp.ndim(x) >= 1 and jnp.shape(x)[0] == 1:
        # The same value in every row of the one-row mailbox rho was traced with: one per edge.
        x = jnp.broadcast_to(x, (receivers.shape[0],) + jnp.shape(x))
        kind_in = EDGE
    if kind_in != EDGE:
        raise UnsupportedMailboxOp(f"jgnn.{kind} was applied to a value that does not come from the mailbox")
    rows = x[:, 0]  # drop the one-row mailbox axis: [E, ...]
    out = segment_reduce(kind, rows, receivers, num_nodes)
    return ([out[:, None]], EDGE) if kind == "softmax" else ([out], NODE)


def _lower_rowwise(op: ir.Op, vals, ks, receivers):
    if EDGE in ks:
        # The mailbox axis must stay the leading axis: then each per-edge evaluation is one mailbox row.
        if facts.row_axis(op, [0 if k == EDGE else None for k in ks]) != 0:
            raise UnsupportedMailboxOp(
                f"rho applies `{op.name}` across the mailbox axis; only jgnn.sum/mean/max/min/softmax may "
                f"combine a node's incoming messages")
        vals = [gather(v, receivers, index=Index.DST) if k == NODE else v for v, k in zip(vals, ks, strict=True)]
        kind = EDGE
    elif NODE in ks:
        kind = NODE
    else:
        return op.run(*vals), CONST
    in_axes = [None if k == CONST else 0 for k in ks]
    return jax.vmap(op.run, in_axes=in_axes)(*vals), kind
