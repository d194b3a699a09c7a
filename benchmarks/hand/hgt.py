"""HGT (2 layers, 64 wide, 4 heads, then a linear classifier) by hand; parameters as
`benchmarks.compare.models.HGT`.

Node types are contiguous blocks and edges are sorted by relation (as PyG's heterogeneous dicts keep them),
so every typed transform is one GEMM per type on a static slice, and each relation's ``W_att``/``W_msg``
transform runs on the rows of its source type before the per-edge gather.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from benchmarks.hand.segment import attend


class Inputs(NamedTuple):
    """``x`` float ``[N, F]``; ``local_src`` int32 ``[E]``: each edge's sender as an id within its node type;
    ``receivers`` int32 ``[E]`` (global ids)."""

    x: jax.Array
    local_src: jax.Array
    receivers: jax.Array


class Static(NamedTuple):
    """Host facts: ``node_offsets`` (``T + 1``), ``edge_offsets`` (``R + 1``), ``schema`` ((src, dst) type
    per relation), ``heads``."""

    node_offsets: tuple[int, ...]
    edge_offsets: tuple[int, ...]
    schema: tuple[tuple[int, int], ...]
    heads: int


def per_type(x, w, b, offsets):
    """``x[rows of t] @ w[t] + b[t]`` for every type ``t``: ``[N, F] -> [N, out]``."""
    blocks = zip(offsets[:-1], offsets[1:], strict=True)
    return jnp.concatenate([x[lo:hi] @ w[t] + b[t] for t, (lo, hi) in enumerate(blocks)])


def layer(p, x, inputs: Inputs, st: Static):
    n, f = x.shape[0], p["a_kernel"].shape[-1]
    heads, off = st.heads, st.node_offsets
    d = f // heads
    k, q, v = (per_type(x, p[f"{a}_kernel"], p[f"{a}_bias"], off).reshape(n, heads, d) for a in "kqv")
    logits, values = [], []
    for r, (src_t, _) in enumerate(st.schema):
        lo, hi = st.edge_offsets[r], st.edge_offsets[r + 1]
        src = inputs.local_src[lo:hi]
        k_rel = jnp.einsum("nhd,hde->nhe", k[off[src_t]:off[src_t + 1]], p["att_relation"][r])
        v_rel = jnp.einsum("nhd,hde->nhe", v[off[src_t]:off[src_t + 1]], p["msg_relation"][r])
        scores = jnp.sum(k_rel[src] * q[inputs.receivers[lo:hi]], -1)
        logits.append(scores * (p["relation_prior"][r] / math.sqrt(d)))
        values.append(v_rel[src])
    agg = attend(jnp.concatenate(logits), jnp.concatenate(values), inputs.receivers, n).reshape(n, f)
    out = per_type(jax.nn.gelu(agg, approximate=False), p["a_kernel"], p["a_bias"], off)
    gate = jnp.repeat(jax.nn.sigmoid(p["skip"]), jnp.diff(jnp.asarray(off)), total_repeat_length=n)[:, None]
    return gate * out + (1.0 - gate) * x  # every type's input width equals the output width: skip everywhere


def forward(params, inputs: Inputs, st: Static):
    """Logits ``[N, C]``."""
    h = layer(params["HGTConv_0"], inputs.x, inputs, st)
    h = layer(params["HGTConv_1"], h, inputs, st)
    return h @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]

