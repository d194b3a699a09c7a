"""Link prediction kit: negative sampling, filtered ranking, metrics and edge splits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgnn import datasets as D
from jgnn import linkpred

POSITIVES = np.asarray([[0, 3, 1], [2, 0, 4], [5, 1, 5], [1, 2, 0]], np.int32)


@pytest.mark.parametrize("corrupt", ["both", "head", "tail"])
def test_uniform_negatives(corrupt):
    neg = jax.jit(lambda k, p: linkpred.uniform_negatives(k, p, 6, 500, corrupt=corrupt))(jax.random.key(0),
                                                                                         POSITIVES)
    neg = np.asarray(neg)
    assert neg.shape == (4, 500, 3) and neg.dtype == np.int32
    assert (neg[..., 1] == POSITIVES[:, None, 1]).all()  # the relation is never touched
    head_kept = neg[..., 0] == POSITIVES[:, None, 0]
    tail_kept = neg[..., 2] == POSITIVES[:, None, 2]
    assert (head_kept | tail_kept).all()  # at most one end is replaced
    if corrupt == "both":
        assert not head_kept.all() and not tail_kept.all()
        return
    assert (tail_kept if corrupt == "head" else head_kept).all()
    replaced = neg[..., 0] if corrupt == "head" else neg[..., 2]
    assert replaced.min() >= 0 and replaced.max() < 6
    counts = np.bincount(replaced.ravel(), minlength=6)
    assert counts.min() > 0.8 * 2000 / 6  # 2,000 seeded uniform draws over 6 entities: none is starved


def test_degree_negatives_follow_degree_power():
    degrees = np.asarray([0, 1, 4, 9, 16], np.float32)
    neg = linkpred.degree_negatives(jax.random.key(1), jnp.asarray(POSITIVES[:, [0, 2]]), degrees, 20000,
                                    power=0.5, corrupt="tail")
    tails = np.asarray(neg[..., 1]).ravel()
    freq = np.bincount(tails, minlength=5) / tails.size
    want = np.sqrt(degrees) / np.sqrt(degrees).sum()  # 0, 0.1, 0.2, 0.3, 0.4
    assert freq[0] == 0.0  # a node of degree 0 is never drawn
    np.testing.assert_allclose(freq, want, atol=0.01)  # 80,000 seeded draws: the error is ~0.002


def test_degree_negatives_run_under_jit():
    """The same draws under ``jit`` as eagerly (degrees and positives traced; K, power and mode static)."""
    degrees = jnp.asarray([0, 1, 4, 9, 16], jnp.float32)
    positives = jnp.asarray(POSITIVES[:, [0, 2]])
    draw = lambda key, pos, deg: linkpred.degree_negatives(key, pos, deg, 7, power=0.75, corrupt="both")
    eager = draw(jax.random.key(3), positives, degrees)
    np.testing.assert_array_equal(jax.jit(draw)(jax.random.key(3), positives, degrees), eager)
    assert eager.shape == (positives.shape[0], 7, 2)


def test_corrupt_mode_error():
    with pytest.raises(ValueError, match="corrupt"):
        linkpred.uniform_negatives(jax.random.key(0), POSITIVES, 6, 2, corrupt="middle")


def test_known_answers_lookup():
    triples = np.asarray([[0, 0, 1], [0, 0, 2], [0, 1, 3], [2, 0, 1], [0, 0, 2]])  # one duplicate
    known = linkpred.KnownAnswers(triples)
    assert known.max_answers == 2
    got = known.lookup(np.asarray([[0, 0, 9], [0, 1, 9], [1, 0, 9], [2, 0, 9], [0, 7, 9]]))
    assert got.tolist() == [[1, 2], [3, -1], [-1, -1], [1, -1], [-1, -1]]
    with pytest.raises(ValueError, match="width=1"):
        known.lookup(np.asarray([[0, 0, 1]]), width=1)


def brute_force_rank(scores, target, known, tie_weight):
    competitors = [e for e in range(len(scores)) if e not in set(known) | {target}]
    ahead = sum(scores[e] > scores[target] for e in competitors)
    tied = sum(scores[e] == scores[target] for e in competitors)
    return 1 + ahead + tie_weight * tied


@pytest.mark.parametrize("ties,weight", [("optimistic", 0.0), ("average", 0.5), ("pessimistic", 1.0)])
def test_filtered_ranks_match_brute_force(ties, weight):
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, (30, 12)).astype(np.float32)  # small integers: many ties
    targets = rng.integers(0, 12, 30)
    known = rng.integers(-1, 12, (30, 4))
    got = np.asarray(jax.jit(lambda s, t, k: linkpred.filtered_ranks(s, t, k, ties=ties))(scores, targets, known))
    want = [brute_force_rank(scores[i], targets[i], [k for k in known[i] if k >= 0], weight) for i in range(30)]
    np.testing.assert_allclose(got, want)


def test_metrics():
    ranks = np.asarray([1.0, 2.0, 4.0, 10.5])
    assert linkpred.mean_reciprocal_rank(ranks) == pytest.approx((1 + 0.5 + 0.25 + 1 / 10.5) / 4)
    assert linkpred.hits_at(ranks, 1) == 0.25 and linkpred.hits_at(ranks, 3) == 0.5
    assert linkpred.hits_at(ranks, 10) == 0.75


def test_rank_queries_filtered_vs_raw():
    """A scorer that prefers every known answer equally: filtering lifts each test answer to rank 1."""
    triples = np.asarray([[0, 0, 1], [0, 0, 2], [1, 0, 2], [2, 1, 0]])
    with_inv = linkpred.with_inverses(triples, 2)
    assert with_inv[4:].tolist() == [[1, 2, 0], [2, 2, 0], [2, 2, 1], [0, 3, 2]]
    known = linkpred.KnownAnswers(with_inv)
    truth = np.zeros((3, 4, 3), np.float32)
    truth[with_inv[:, 0], with_inv[:, 1], with_inv[:, 2]] = 1.0
    score_fn = lambda h, r: jnp.asarray(truth)[h, r]
    ranks = linkpred.rank_queries(score_fn, with_inv, known, batch_size=3)
    assert ranks.tolist() == [1.0] * 8
    raw = linkpred.rank_queries(score_fn, with_inv, linkpred.KnownAnswers(np.zeros((0, 3), np.int64)),
                                batch_size=3)
    assert raw[0] == 1.5 and raw[1] == 1.5  # (0, 0, ?) has two true answers: tied, half counted


def test_split_edges_cora(data_dir):
    cora = D.load_planetoid("cora", root=data_dir)
    split = linkpred.split_edges(cora.graph, valid_fraction=0.05, test_fraction=0.1, seed=0)
    pairs = cora.num_edges // 2  # Cora stores each undirected edge both ways
    assert split.valid.shape == (round(0.05 * pairs), 2) and split.test.shape == (round(0.1 * pairs), 2)
    assert split.train.shape[0] + split.valid.shape[0] + split.test.shape[0] == pairs
    held = {tuple(p) for p in np.concatenate([split.valid, split.test]).tolist()}
    assert len(held) == split.valid.shape[0] + split.test.shape[0]
    g = split.graph
    kept = {(min(s, r), max(s, r)) for s, r in zip(g.senders.tolist(), g.receivers.tolist(), strict=True)}
    assert not kept & held and g.senders.shape[0] == 2 * split.train.shape[0] and g.n_edge.tolist() == [
        g.senders.shape[0]]
    all_pairs = {(min(s, r), max(s, r)) for s, r in zip(cora.graph.senders.tolist(), cora.graph.receivers.tolist(),
                                                         strict=True)}
    for neg in (split.valid_negatives, split.test_negatives):
        assert neg.shape == (split.valid.shape[0] if neg is split.valid_negatives else split.test.shape[0], 2)
        assert not {(min(s, r), max(s, r)) for s, r in neg.tolist()} & all_pairs
        assert (neg[:, 0] != neg[:, 1]).all()
    again = linkpred.split_edges(cora.graph, valid_fraction=0.05, test_fraction=0.1, seed=0)
    np.testing.assert_array_equal(again.test, split.test)
    np.testing.assert_array_equal(again.test_negatives, split.test_negatives)
    np.testing.assert_array_equal(g.nodes, cora.graph.nodes)


def test_split_edges_errors(data_dir):
    cora = D.load_planetoid("cora", root=data_dir)
    with pytest.raises(ValueError, match="fraction"):
        linkpred.split_edges(cora.graph, valid_fraction=0.6, test_fraction=0.5, seed=0)
