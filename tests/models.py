"""Reference GNN layers written with `jgnn.message_passing`, shared by the core, optimizer and kernel tests.

Each ``make_*`` returns ``(phi, rho, psi, params)`` built from fresh random weights, plus a per-node numpy
oracle (`loop_oracle`) that evaluates the same per-edge function with an explicit loop over each node's
incoming edges: no gathers, no segment ops, no jgnn.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jgnn


def _w(rng, *shape, scale=None):
    scale = scale or 1.0 / np.sqrt(shape[-2] if len(shape) > 1 else 1)
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def make_gat(rng, d_in, heads=3, d_head=4, naive=False):
    """Multi-head GAT. ``naive`` writes attention as concat-then-linear, the way users often do."""
    W = _w(rng, d_in, heads * d_head)
    a = _w(rng, heads, 2 * d_head, scale=0.5)

    def phi(s, d, e):
        zs = (s["h"] @ W).reshape(heads, d_head)
        zd = (d["h"] @ W).reshape(heads, d_head)
        if naive:
            logits = jnp.einsum("hk,hk->h", jnp.concatenate([zs, zd], -1), a)
        else:
            logits = jnp.sum(zs * a[:, :d_head], -1) + jnp.sum(zd * a[:, d_head:], -1)
        return {"z": zs, "e": jax.nn.leaky_relu(logits, 0.2)}

    def rho(mb, node):
        alpha = jgnn.softmax(mb["e"])
        return jgnn.sum(alpha[..., None] * mb["z"])

    def psi(node, agg):
        return {"h": jax.nn.elu(agg.reshape(-1))}

    def edge_value(s, d, e):  # for the oracle: (weight logit, value) per edge
        out = phi(s, d, e)
        return out["e"], out["z"]

    return phi, rho, psi, edge_value


def make_gcn(rng, d_in, d_out=5):
    W = _w(rng, d_in, d_out)

    def phi(s, d, e):
        return {"m": (s["h"] @ W) * s["c"] * d["c"]}

    def psi(node, agg):
        return {"h": jax.nn.relu(agg["m"]), "c": node["c"]}

    return phi, None, psi


def make_rgcn(rng, d_in, d_out=6, relations=3):
    W = _w(rng, relations, d_in, d_out)
    W0 = _w(rng, d_in, d_out)

    def phi(s, d, e):
        return {"m": s["h"] @ W[e["type"]]}

    def rho(mb, node):
        return jgnn.mean(mb["m"])

    def psi(node, agg):
        return {"h": agg + node["h"] @ W0}

    return phi, rho, psi


def make_edgeconv(rng, d_in, d_hidden=5, d_out=4, reduce="max", ties=False):
    """EdgeConv: ``reduce`` over ``mlp([x_i, x_j - x_i])``. ``ties`` uses ``relu(x_j - x_i)`` instead, whose
    many exact zeros tie for the max."""
    W1, W2 = _w(rng, 2 * d_in, d_hidden), _w(rng, d_hidden, d_out)

    def phi(s, d, e):
        if ties:
            return {"m": jax.nn.relu(s["h"] - d["h"])}
        return {"m": jax.nn.relu(jnp.concatenate([d["h"], s["h"] - d["h"]]) @ W1) @ W2}

    def rho(mb, node):
        return {"h": getattr(jgnn, reduce)(mb["m"])}

    return phi, rho, None


def make_hgt(rng, d_in, heads=2, d_head=3, node_types=2, edge_types=3):
    """HGT-style typed attention: typed K/Q/V, per-relation attention and message matrices, priors."""
    d = heads * d_head
    Wk, Wq, Wv = (_w(rng, node_types, d_in, d) for _ in range(3))
    Watt, Wmsg = _w(rng, edge_types, heads, d_head, d_head), _w(rng, edge_types, heads, d_head, d_head)
    mu = jnp.asarray(rng.uniform(0.5, 1.5, size=(edge_types, heads)), jnp.float32)

    def phi(s, dd, e):
        k = (s["h"] @ Wk[s["type"]]).reshape(heads, d_head)
        q = (dd["h"] @ Wq[dd["type"]]).reshape(heads, d_head)
        v = (s["h"] @ Wv[s["type"]]).reshape(heads, d_head)
        kr = jnp.einsum("hi,hij->hj", k, Watt[e["type"]])
        score = jnp.sum(kr * q, -1) * mu[e["type"]] / np.sqrt(d_head)
        return {"score": score, "msg": jnp.einsum("hi,hij->hj", v, Wmsg[e["type"]])}

    def rho(mb, node):
        alpha = jgnn.softmax(mb["score"])
        return jgnn.sum(alpha[..., None] * mb["msg"])

    def psi(node, agg):
        return {"h": jax.nn.gelu(agg.reshape(-1))}

    return phi, rho, psi


def node_rows(graph, idx):
    return jax.tree_util.tree_map(lambda x: x[idx], graph.nodes)


def edge_row(graph, i):
    return None if graph.edges is None else jax.tree_util.tree_map(lambda x: x[i], graph.edges)


def loop_oracle(graph, phi, reduce_fn):
    """For each node v: ``reduce_fn([phi(src, dst, edge) for edges into v])`` with plain Python loops."""
    senders, receivers = np.asarray(graph.senders), np.asarray(graph.receivers)
    n = int(np.sum(graph.n_node))
    out = []
    for v in range(n):
        msgs = [phi(node_rows(graph, int(senders[i])), node_rows(graph, v), edge_row(graph, i))
                for i in np.flatnonzero(receivers == v)]
        out.append(reduce_fn(msgs, node_rows(graph, v)))
    return out


def softmax_sum(msgs, node, shape):
    """Attention aggregation of (logit [H], value [H, D]) pairs; 0 for an empty mailbox."""
    if not msgs:
        return np.zeros(shape, np.float32)
    logits = np.stack([np.asarray(m[0]) for m in msgs])
    values = np.stack([np.asarray(m[1]) for m in msgs])
    w = np.exp(logits - logits.max(0))
    w = w / w.sum(0)
    return (w[..., None] * values).sum(0)
