"""Link prediction kit: negative sampling, edge splits, and filtered ranking metrics (MRR, Hits@k).

Edges and triples are int arrays whose first column is the source (head) and last column the destination
(tail): ``[B, 2]`` pairs ``(sender, receiver)`` or ``[B, 3]`` triples ``(head, relation, tail)``.

* :func:`uniform_negatives` and :func:`degree_negatives` corrupt the head or the tail of each positive with a
  random entity; both are pure functions of a ``jax.random`` key, so they run under ``jit``. They do not
  filter out corruptions that happen to be true edges (the usual practice for training).
* :func:`split_edges` makes a seeded train/valid/test split of a graph's edges (PyG's ``RandomLinkSplit``
  style) with a message-passing graph of the training edges only.
* :class:`KnownAnswers` indexes all true triples so that :func:`filtered_ranks` can rank each test answer
  against the entities that are *not* known answers to the same query (the "filtered" setting of Bordes et al.
  2013, used by the R-GCN paper). Head queries ``(?, r, t)`` are asked as tail queries of the inverse relation,
  ``(t, r + R, ?)``; :func:`with_inverses` builds them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import jraph
import numpy as np

__all__ = [
    "EdgeSplit", "KnownAnswers", "degree_negatives", "filtered_ranks", "hits_at", "mean_reciprocal_rank",
    "rank_queries", "split_edges", "uniform_negatives", "with_inverses",
]

_CORRUPT = {"head": (1.0,), "tail": (0.0,), "both": (0.5,)}


def _corrupt(key, positives: jax.Array, entities: jax.Array, corrupt: str) -> jax.Array:
    """[B, K, C]: ``positives`` [B, C] repeated K times with the head or the tail replaced by ``entities`` [B, K]."""
    if corrupt not in _CORRUPT:
        raise ValueError(f"corrupt must be one of {sorted(_CORRUPT)}, got {corrupt!r}")
    (p_head,) = _CORRUPT[corrupt]
    head = jax.random.bernoulli(key, p_head, entities.shape)
    out = jnp.broadcast_to(positives[:, None, :], entities.shape + positives.shape[-1:])
    out = out.at[..., 0].set(jnp.where(head, entities, out[..., 0]))
    return out.at[..., -1].set(jnp.where(head, out[..., -1], entities))


def uniform_negatives(key: jax.Array, positives: jax.Array, num_nodes: int, num_negatives: int = 1, *,
                      corrupt: str = "both") -> jax.Array:
    """Negatives by replacing the head or tail of each positive with a uniformly drawn entity.

    Args:
      key: a ``jax.random`` key.
      positives: int [B, 2] edges or [B, 3] triples.
      num_nodes: entities are drawn from ``[0, num_nodes)``.
      num_negatives: ``K`` negatives per positive.
      corrupt: ``"both"`` (head or tail with probability 1/2 each, per negative), ``"head"`` or ``"tail"``.

    Returns:
      int [B, K, C] (same dtype and width as ``positives``).
    """
    k_ent, k_side = jax.random.split(key)
    entities = jax.random.randint(k_ent, (positives.shape[0], num_negatives), 0, num_nodes, positives.dtype)
    return _corrupt(k_side, positives, entities, corrupt)


def degree_negatives(key: jax.Array, positives: jax.Array, degrees: jax.Array, num_negatives: int = 1, *,
                     power: float = 0.75, corrupt: str = "both") -> jax.Array:
    """Negatives whose replacement entity is drawn with probability proportional to ``degree ** power``.

    ``power = 0.75`` is word2vec's unigram smoothing; ``power = 1`` samples by degree, ``0`` uniformly over the
    nodes of non-zero degree. Nodes of degree 0 are never drawn (for ``power > 0``). Sampling is by inverse
    CDF (``searchsorted``), so memory is ``O(N + B K)``, never ``O(B K N)``.

    Args:
      key: a ``jax.random`` key.
      positives: int [B, 2] or [B, 3].
      degrees: float or int [N] node degrees (e.g. from :func:`numpy.bincount` of the training edges).
      num_negatives: ``K``.
      power: exponent applied to the degrees.
      corrupt: as in :func:`uniform_negatives`.

    Returns:
      int [B, K, C].
    """
    k_ent, k_side = jax.random.split(key)
    degrees = jnp.asarray(degrees, jnp.float32)
    weight = jnp.where(degrees > 0, degrees ** power, 0.0)
    cdf = jnp.cumsum(weight)
    u = jax.random.uniform(k_ent, (positives.shape[0], num_negatives), jnp.float32) * cdf[-1]
    entities = jnp.minimum(jnp.searchsorted(cdf, u, side="right"), degrees.shape[0] - 1)
    return _corrupt(k_side, positives, entities.astype(positives.dtype), corrupt)


def with_inverses(triples: np.ndarray, num_relations: int) -> np.ndarray:
    """[2B, 3]: the triples, then their inverses ``(t, r + R, h)`` (head queries become tail queries)."""
    triples = np.asarray(triples)
    inverse = np.stack([triples[:, 2], triples[:, 1] + num_relations, triples[:, 0]], axis=1)
    return np.concatenate([triples, inverse]).astype(triples.dtype)


class KnownAnswers:
    """All true tails of each query ``(head, relation)`` of a set of triples, for filtered ranking.

    Built on the host from every known triple (train, valid and test, usually with :func:`with_inverses`).
    ``lookup(queries)`` returns them padded into an int32 [B, K] array (``-1`` for padding), which
    :func:`filtered_ranks` takes under ``jit``.
    """

    def __init__(self, triples: np.ndarray | Sequence[np.ndarray]):
        if not isinstance(triples, np.ndarray):
            triples = np.concatenate([np.asarray(t).reshape(-1, 3) for t in triples])
        triples = np.unique(np.asarray(triples, np.int64).reshape(-1, 3), axis=0)  # sorted by (h, r, t)
        self._tails = triples[:, 2].astype(np.int32)
        self._num_rel = int(triples[:, 1].max(initial=0)) + 1
        keys = triples[:, 0] * self._num_rel + triples[:, 1]  # sorted, since the triples are
        self._keys, self._starts, self._counts = np.unique(keys, return_index=True, return_counts=True)
        self.max_answers = int(self._counts.max(initial=0))

    def lookup(self, queries: np.ndarray, width: int | None = None) -> np.ndarray:
        """int32 [B, K]: the known tails of each ``(head, relation)`` row of ``queries`` [B, >=2], ``-1``-padded.

        ``K`` is ``width`` (default: the largest answer count of the batch); queries with more answers raise.
        """
        queries = np.asarray(queries, np.int64)
        keys = np.where(queries[:, 1] < self._num_rel, queries[:, 0] * self._num_rel + queries[:, 1], -1)
        pos = np.minimum(np.searchsorted(self._keys, keys), max(self._keys.shape[0] - 1, 0))
        found = self._keys[pos] == keys if self._keys.shape[0] else np.zeros(keys.shape, bool)
        counts = np.where(found, self._counts[pos] if found.any() else 0, 0)
        k = int(counts.max(initial=0)) if width is None else int(width)
        if counts.max(initial=0) > k:
            raise ValueError(f"a query has {int(counts.max())} known answers, more than width={k}")
        out = np.full((queries.shape[0], max(k, 1)), -1, np.int32)
        rows = np.repeat(np.arange(queries.shape[0]), counts)
        cols = np.arange(rows.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
        if rows.size:
            out[rows, cols] = self._tails[np.repeat(self._starts[pos], counts) + cols]
        return out


_TIES = {"optimistic": 0.0, "average": 0.5, "pessimistic": 1.0}


def filtered_ranks(scores: jax.Array, targets: jax.Array, known: jax.Array, *, ties: str = "average") -> jax.Array:
    """Filtered rank of each target among all entities (1 = best), jittable.

    Args:
      scores: float [B, N], higher is better.
      targets: int [B], the true answer of each query.
      known: int [B, K] known answers to filter out (``-1`` = padding); the target itself may be among them.
      ties: how entities scoring exactly the target's score count: ``"optimistic"`` (none ahead),
        ``"pessimistic"`` (all ahead) or ``"average"`` (half, the expected rank under random tie breaking).

    Returns:
      float32 [B] ranks: ``1 + #{filtered e: s_e > s_target} + w * #{filtered e != target: s_e == s_target}``.
    """
    if ties not in _TIES:
        raise ValueError(f"ties must be one of {sorted(_TIES)}, got {ties!r}")
    b, n = scores.shape
    target_score = jnp.take_along_axis(scores, targets[:, None], axis=1)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], known.shape)
    cols = jnp.where(known < 0, n, known)  # padding goes out of range and is dropped
    filtered = jnp.zeros((b, n), bool).at[rows, cols].set(True, mode="drop")
    filtered = filtered.at[jnp.arange(b), targets].set(True)  # the target is not its own competitor
    ahead = jnp.sum((scores > target_score) & ~filtered, axis=1)
    tied = jnp.sum((scores == target_score) & ~filtered, axis=1)
    return (1.0 + ahead + _TIES[ties] * tied).astype(jnp.float32)


# one jitted function for every `rank_queries` call: a lambda per call would be traced and compiled again each time
_jitted_ranks = jax.jit(filtered_ranks, static_argnames="ties")


def mean_reciprocal_rank(ranks) -> float:
    """Mean of ``1 / rank``."""
    return float(np.mean(1.0 / np.asarray(ranks, np.float64)))


def hits_at(ranks, k: int) -> float:
    """Fraction of ranks ``<= k``."""
    return float(np.mean(np.asarray(ranks) <= k))


def rank_queries(score_fn: Callable[[jax.Array, jax.Array], jax.Array], triples: np.ndarray, known: KnownAnswers,
                 *, batch_size: int = 1024, ties: str = "average") -> np.ndarray:
    """Filtered ranks of the tails of ``triples`` [B, 3] (add :func:`with_inverses` for head queries too).

    ``score_fn(heads [b], relations [b]) -> [b, N]`` scores every entity as the tail; it is called on batches of
    ``batch_size`` (the last batch padded by repeating its first row, so a jitted ``score_fn`` compiles once).
    Returns float32 [B] ranks.
    """
    triples = np.asarray(triples)
    width = known.max_answers
    out = []
    for start in range(0, triples.shape[0], batch_size):
        chunk = triples[start:start + batch_size]
        real = chunk.shape[0]
        if real < batch_size:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch_size - real, axis=0)])
        scores = score_fn(jnp.asarray(chunk[:, 0]), jnp.asarray(chunk[:, 1]))
        ranks = _jitted_ranks(scores, jnp.asarray(chunk[:, 2]), jnp.asarray(known.lookup(chunk, width)), ties=ties)
        out.append(np.asarray(ranks)[:real])
    return np.concatenate(out) if out else np.zeros(0, np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class EdgeSplit:
    """A train/valid/test split of a graph's edges.

    Attributes:
      graph: the message-passing graph: the input graph with only the training edges (both directions when
        the split was ``undirected``); nodes and ``n_node`` unchanged; edge features follow their edges.
      train, valid, test: int32 [M, 2] positive edges ``(sender, receiver)`` (one direction per undirected edge).
      valid_negatives, test_negatives: int32 [M, 2] node pairs that are not edges of the input graph (in either
        direction when undirected), as many as the positives, drawn uniformly.
    """

    graph: jraph.GraphsTuple
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    valid_negatives: np.ndarray
    test_negatives: np.ndarray


def _sample_non_edges(rng, num_nodes: int, count: int, forbidden: set, undirected: bool) -> np.ndarray:
    out: list[tuple[int, int]] = []
    seen = set()
    while len(out) < count:
        cand = rng.integers(0, num_nodes, (2 * (count - len(out)) + 16, 2))
        for s, r in cand.tolist():
            key = (min(s, r), max(s, r)) if undirected else (s, r)
            if s == r or key in forbidden or key in seen:
                continue
            seen.add(key)
            out.append((s, r))
            if len(out) == count:
                break
    return np.asarray(out, np.int32).reshape(-1, 2)


def split_edges(graph: jraph.GraphsTuple, *, valid_fraction: float = 0.05, test_fraction: float = 0.1,
                seed: int, undirected: bool = True) -> EdgeSplit:
    """Split the edges of a single graph into train/valid/test positives plus sampled negatives (host, seeded).

    With ``undirected`` each pair ``{u, v}`` (stored in one or both directions) is one edge: it is split as a
    whole, and the training graph keeps every stored direction of the training pairs (both, for a graph stored
    symmetrically, as the Planetoid files are). Self-loops stay in the training graph and are never held out.
    Raises ``ValueError`` when a fraction is out of range, the graph is a batch of several graphs, or it has too
    few node pairs for the negatives.
    """
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(f"need 0 <= valid_fraction, test_fraction and their sum < 1, got {valid_fraction}, "
                         f"{test_fraction}")
    graph = jax.device_get(graph)
    if np.shape(graph.n_node)[0] != 1:
        raise ValueError(f"split_edges takes a single graph, got {np.shape(graph.n_node)[0]} graphs")
    senders, receivers = np.asarray(graph.senders, np.int64), np.asarray(graph.receivers, np.int64)
    n = int(np.sum(graph.n_node))
    loops = senders == receivers
    if undirected:
        pairs = np.unique(np.stack([np.minimum(senders, receivers), np.maximum(senders, receivers)], 1)[~loops], axis=0)
    else:
        pairs = np.unique(np.stack([senders, receivers], 1)[~loops], axis=0)
    rng = np.random.default_rng(seed)
    order = rng.permutation(pairs.shape[0])
    n_valid, n_test = int(round(valid_fraction * pairs.shape[0])), int(round(test_fraction * pairs.shape[0]))
    valid, test = pairs[order[:n_valid]], pairs[order[n_valid:n_valid + n_test]]
    train = pairs[np.sort(order[n_valid + n_test:])]
    held = {tuple(p) for p in np.concatenate([valid, test]).tolist()}
    key = np.stack([np.minimum(senders, receivers), np.maximum(senders, receivers)], 1) if undirected else np.stack(
        [senders, receivers], 1)
    keep = np.asarray([tuple(k) not in held for k in key.tolist()], bool) | loops
    forbidden = {tuple(p) for p in pairs.tolist()}
    possible = n * (n - 1) // (2 if undirected else 1) - len(forbidden)
    if possible < n_valid + n_test:
        raise ValueError(f"the graph has only {possible} non-adjacent node pairs for {n_valid + n_test} negatives")
    negatives = _sample_non_edges(rng, n, n_valid + n_test, forbidden, undirected)
    edges = jax.tree_util.tree_map(lambda a: np.asarray(a)[keep], graph.edges)
    train_graph = graph._replace(senders=senders[keep].astype(np.int32), receivers=receivers[keep].astype(np.int32),
                                 edges=edges, n_edge=np.asarray([int(keep.sum())], np.int32))
    as32 = lambda a: np.asarray(a, np.int32).reshape(-1, 2)
    return EdgeSplit(train_graph, as32(train), as32(valid), as32(test), negatives[:n_valid], negatives[n_valid:])
