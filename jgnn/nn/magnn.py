"""MAGNN (Fu et al., 2020): metapath instances, aggregated within each instance, each metapath, then across them.

NeighborSelection is `metapath_neighborhood` (on the host, once: MAGNN's instances do not change between
epochs): for every target node and metapath, up to ``samples`` instances drawn by walks along the metapath,
duplicates removed. It returns a three-level `jgnn.Neighborhood` over one node table of all types:

* level 0, ragged: instance ← its nodes (3 or 5 of them), each with its position's relation coefficients;
* level 1, ragged: (metapath, target) ← its instances (a varying number);
* level 2, dense: target ← its ``P`` metapaths (fan-out ``P``).

`MAGNN` encodes instances with the mean or the relational rotation encoder (level 0, one fused op: gather,
rotation, mean), attends over the instances of each metapath with the target's own row (level 1: intra-metapath
attention) and over the metapaths (level 2: inter-metapath attention, a dense reduction over ``P``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jgnn import mailbox, neighborhood
from jgnn.nn import _utils

ENCODERS = ("mean", "rotation")


def _adjacency(num_src: int, edges: np.ndarray):
    order = np.argsort(edges[0], kind="stable")
    starts = np.searchsorted(edges[0][order], np.arange(num_src + 1))
    return starts, edges[1][order]


def _relation(edge_index, src: str, dst: str):
    """The edge type from ``src`` to ``dst`` and whether it is the canonical direction of its undirected pair (the
    alphabetically first of the two types as source): its rotation is ``+θ``, the reverse ``-θ``."""
    for key in edge_index:
        if key[0] == src and key[2] == dst:
            return key, min(src, dst) == src, tuple(sorted((src, dst)))
    raise ValueError(f"no edge type from {src!r} to {dst!r}")


def metapath_neighborhood(graph, target: str, metapaths: Sequence[Sequence[str]], *, samples: int = 8,
                          seed: int = 0) -> tuple[neighborhood.Neighborhood, dict]:
    """MAGNN's NeighborSelection over a `jgnn.hetero.HeteroGraph` (see module docstring).

    Args:
      graph: a HeteroGraph (``num_nodes`` per type, ``edge_index`` per ``(src, rel, dst)``).
      target: the node type being classified; each metapath starts and ends at it.
      metapaths: node-type sequences, e.g. ``("author", "paper", "author")``.
      samples: walks drawn per (target node, metapath); duplicates are kept once.
      seed: the numpy seed of the walks.

    Returns:
      ``(neighborhood, info)``: the three levels over the node table ``concat(types in graph.num_nodes order)``,
      and ``info`` with ``offsets`` (per type, its first row), ``relations`` (the undirected relation pairs, the
      order of the coefficient columns) and ``instances`` (per metapath, how many were kept).
    """
    types = list(graph.num_nodes)
    offsets, total = {}, 0
    for t in types:
        offsets[t], total = total, total + graph.num_nodes[t]
    rng = np.random.default_rng(seed)
    steps = lambda mp: zip(mp[:-1], mp[1:], strict=True)
    relations = sorted({_relation(graph.edge_index, a, b)[2] for mp in metapaths for a, b in steps(mp)})
    num_targets = graph.num_nodes[target]
    level0_members, level0_groups, coefs, level1_groups, kept = [], [], [], [], []
    instance = 0
    for p, mp in enumerate(metapaths):
        if mp[0] != target or mp[-1] != target:
            raise ValueError(f"metapath {mp} must start and end at {target!r}")
        walk = np.repeat(np.arange(num_targets), samples)[:, None]
        ok = np.ones(walk.shape[0], bool)
        coef = np.zeros((len(mp), len(relations)), np.float32)
        for i, (a, b) in enumerate(steps(mp)):
            key, forward, pair = _relation(graph.edge_index, a, b)
            starts, targets = _adjacency(graph.num_nodes[a], graph.edge_index[key])
            here = walk[:, -1]
            deg = starts[here + 1] - starts[here]
            ok &= deg > 0
            pick = starts[here] + np.floor(rng.random(here.shape[0]) * np.maximum(deg, 1)).astype(np.int64)
            nxt = targets[np.minimum(pick, max(len(targets) - 1, 0))]
            walk = np.concatenate([walk, np.where(deg > 0, nxt, 0)[:, None]], 1)
            coef[i + 1:, relations.index(pair)] += 1.0 if forward else -1.0  # cumulative rotation at each position
        walk = np.unique(walk[ok], axis=0)  # sorted by target: one group's instances are contiguous
        global_ids = walk + np.asarray([offsets[t] for t in mp])[None, :]
        n_inst, length = walk.shape
        level0_members.append(global_ids.reshape(-1))
        level0_groups.append(np.repeat(np.arange(instance, instance + n_inst), length))
        coefs.append(np.tile(coef, (n_inst, 1)))
        level1_groups.append(p * num_targets + walk[:, 0])
        kept.append(n_inst)
        instance += n_inst
    num_p = len(metapaths)
    level0 = neighborhood.ragged_level(np.concatenate(level0_members), np.concatenate(level0_groups), instance,
                                       features={"coef": jnp.asarray(np.concatenate(coefs))})
    metapath_of = np.repeat(np.arange(num_p), kept)
    level1 = neighborhood.ragged_level(np.arange(instance), np.concatenate(level1_groups), num_p * num_targets,
                                       features={"metapath": jnp.asarray(np.eye(num_p, dtype=np.float32)[metapath_of])})
    level2 = neighborhood.dense_level(np.arange(num_p * num_targets).reshape(num_p, num_targets).T)
    info = {"offsets": offsets, "relations": relations, "instances": dict(zip(map("".join, (
        [t[0].upper() for t in mp] for mp in metapaths)), kept, strict=True))}
    return neighborhood.Neighborhood((level0, level1, level2)), info


def _rotate(x, angle):
    """``x`` ``[2D]`` as ``D`` complex numbers (real half, imaginary half) rotated by ``angle`` ``[D]``."""
    re, im = jnp.split(x, 2)
    c, s = jnp.cos(angle), jnp.sin(angle)
    return jnp.concatenate([re * c - im * s, re * s + im * c])


class MAGNN(_utils.CheckedOptions, nn.Module):
    """MAGNN for node classification (one layer, as the paper's DBLP model): per-type linear projections to
    ``hidden`` (types without features get a learned embedding), the instance encoder (``"mean"`` or
    ``"rotation"``: each node rotated by its position's relation angles, then the mean), intra-metapath attention
    ``softmax_u LeakyReLU(a_P · [h_v ‖ h_{P(v,u)}])`` then ELU, inter-metapath attention
    ``softmax_P mean_v q · tanh(M h_P^v + b)``, and a linear classifier.

    Called as ``model(features, neighborhood) -> [N_target, out_features]``: ``features`` a dict of ``[N_t, F_t]``
    arrays per type (or None for a featureless type) in the node table's order, ``neighborhood`` from
    `metapath_neighborhood`. Parameters are created in ``param_dtype``; the computation runs in ``dtype`` (None:
    the promoted dtype of the features and parameters).
    """

    hidden: int
    out_features: int
    num_nodes: dict
    num_relations: int
    encoder: str = "rotation"
    attention_dim: int = 128
    dropout: float = 0.5
    dtype: Any = None
    param_dtype: Any = jnp.float32
    backend: str = "auto"
    remat: Any = "auto"

    @nn.compact
    def __call__(self, features: dict, nbhd: neighborhood.Neighborhood, *, deterministic: bool = True):
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        parts, dtypes, pdtype = [], _utils.dtypes(self), self.param_dtype
        for t, n in self.num_nodes.items():
            x = features.get(t)
            parts.append(nn.Dense(self.hidden, **dtypes, name=f"project_{t}")(x) if x is not None else
                         self.param(f"embed_{t}", nn.initializers.normal(1.0), (n, self.hidden), pdtype))
        x = nn.Dropout(self.dropout, deterministic=deterministic)(jnp.concatenate(_utils.promote(self.dtype, *parts)))
        level0, level1, level2 = nbhd.levels
        num_p = level2.fanout
        num_targets = level2.num_groups
        theta = self.param("relation_angles", nn.initializers.uniform(np.pi), (self.num_relations, self.hidden // 2),
                           pdtype)
        attn = self.param("intra_attention", nn.initializers.glorot_uniform(), (num_p, 2 * self.hidden), pdtype)
        x, theta, attn = _utils.promote(self.dtype, x, theta, attn)
        rotation = self.encoder == "rotation"

        def encode(member, group, f):
            return _rotate(member, f["coef"].astype(theta.dtype) @ theta) if rotation else member

        def intra_phi(member, group, f):
            a = f["metapath"].astype(attn.dtype) @ attn  # this metapath's attention vector [2 * hidden]
            score = jax.nn.leaky_relu(jnp.sum(a[:self.hidden] * group) + jnp.sum(a[self.hidden:] * member), 0.2)
            return {"h": member, "s": score[None]}

        def intra_rho(mb, group):
            return jax.nn.elu(mailbox.sum(mailbox.softmax(mb["s"]) * mb["h"]))

        layer = neighborhood.hierarchical(
            [neighborhood.Aggregation(phi=encode, rho=lambda mb, g: mailbox.mean(mb)),
             neighborhood.Aggregation(phi=intra_phi, rho=intra_rho)], backend=self.backend, remat=self.remat)
        targets = x[:num_targets]  # the target type comes first in the node table
        table = jnp.tile(targets, (num_p, 1))  # group p * N + v sees target v's row
        graph = _node_graph(x)
        per_metapath = layer(graph, neighborhood.Neighborhood((level0, level1)), (None, table)).nodes
        # Inter-metapath attention: one score per metapath, from every target's representation of it.
        proj = jnp.tanh(nn.Dense(self.attention_dim, **dtypes, name="inter_M")(per_metapath))
        q = self.param("inter_q", nn.initializers.glorot_uniform(), (self.attention_dim, 1), pdtype)
        proj, q = _utils.promote(self.dtype, proj, q)
        score = jnp.mean((proj @ q).reshape(num_p, num_targets), 1)  # [P]
        member_scores = jnp.broadcast_to(score[None, :, None], (num_targets, num_p, 1))
        top = neighborhood.Neighborhood((neighborhood.dense_level(
            level2.graph.senders.reshape(num_targets, num_p), features={"s": member_scores}),))
        h = neighborhood.aggregate(per_metapath, top, [neighborhood.Aggregation(
            phi=lambda m, g, f: {"h": m, "s": f["s"]},
            rho=lambda mb, g: mailbox.sum(mailbox.softmax(mb["s"]) * mb["h"]))])
        h = nn.Dropout(self.dropout, deterministic=deterministic)(h)
        return nn.Dense(self.out_features, **dtypes, name="classifier")(h)


def _node_graph(x):
    import jraph

    empty = jnp.zeros((0,), jnp.int32)
    return jraph.GraphsTuple(nodes=x, edges=None, senders=empty, receivers=empty,
                             n_node=jnp.asarray([x.shape[0]]), n_edge=jnp.asarray([0]), globals=None)
