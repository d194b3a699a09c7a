"""Hierarchical neighbourhoods (`jgnn.neighborhood`): compiled equals reference on random levels with padding and
empty groups, dense levels agree with their ragged form and with a per-group loop, and explain's level records."""

from __future__ import annotations

import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from checks import assert_close, check_against_reference, x64

import jgnn
from jgnn.report import Pass, Reason

BACKENDS = ["xla", "pallas_interpret"]


def _graph(x):
    empty = jnp.zeros((0,), jnp.int32)
    return jraph.GraphsTuple(nodes=x, edges=None, senders=empty, receivers=empty, n_node=jnp.asarray([x.shape[0]]),
                             n_edge=jnp.asarray([0]), globals=None)


def _ragged(rng, rows_below, groups, members, *, empty_groups=3):
    """A ragged level over ``rows_below`` rows whose last ``empty_groups`` groups get no member, with ~20%
    padding (padded members point at real rows and real groups: only the mask drops them)."""
    return jgnn.ragged_level(rng.integers(0, rows_below, members), rng.integers(0, groups - empty_groups, members),
                             groups, mask=rng.random(members) > 0.2,
                             features=jnp.asarray(rng.random((members, 1)), jnp.float32))


def _dense(rng, rows_below, groups, k):
    mask = rng.random((groups, k)) > 0.3
    mask[0] = False  # one group made of padding only: it aggregates to 0
    return jgnn.dense_level(rng.integers(0, rows_below, (groups, k)), mask=mask)


def _rho(kind):
    if kind == "softmax":
        return lambda mb, g: jgnn.sum(jgnn.softmax(jnp.sum(mb, -1, keepdims=True)) * mb)
    return lambda mb, g: getattr(jgnn, kind)(mb)


def _layer(kinds, backend, dtype=jnp.float32):
    def apply(x, W):
        aggs = [jgnn.Aggregation(phi=lambda m, g, f: jnp.tanh(m @ W) * (1.0 + f if f is not None else 1.0),
                                 rho=_rho(kinds[0]))]
        aggs += [jgnn.Aggregation(phi=lambda m, g, f: jnp.sin(m) + 0.5 * m, rho=_rho(k)) for k in kinds[1:]]
        return aggs
    return apply


def _hierarchy(rng, n, shape):
    """Levels bottom-up: ``shape`` is a list of ("ragged", groups, members) / ("dense", groups, k)."""
    levels, below = [], n
    for kind, groups, size in shape:
        levels.append(_ragged(rng, below, groups, size) if kind == "ragged" else _dense(rng, below, groups, size))
        below = groups
    return jgnn.Neighborhood(tuple(levels))


SHAPES = {
    "ragged-dense": [("ragged", 45, 160), ("dense", 15, 3)],  # MAGNN's instances → metapaths → node
    "dense-ragged-dense": [("dense", 50, 3), ("ragged", 24, 70), ("dense", 12, 2)],
    "ragged-ragged": [("ragged", 30, 120), ("ragged", 15, 40)],
}


def _run(nbhd, kinds, backend, x, W):
    out = jgnn.hierarchical(_layer(kinds, backend)(x, W), backend=backend)(_graph(x), nbhd)
    return out.nodes


KINDS = [("sum", "mean", "max"), ("softmax", "max", "mean"), ("mean", "softmax", "min")]
# Fast tier: each shape with one rotation of the reductions (every reduction at a ragged and at a dense level);
# the rest of the cross product is slow.
CASES = [pytest.param(shape, kinds, marks=() if i == j else pytest.mark.slow)
         for i, shape in enumerate(sorted(SHAPES)) for j, kinds in enumerate(KINDS)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("shape", "kinds"), CASES)
def test_compiled_equals_reference_f32(backend, shape, kinds):
    rng = np.random.default_rng(len(shape) * 7 + len(kinds[0]))
    nbhd = _hierarchy(rng, 20, SHAPES[shape])
    kinds = kinds[:len(nbhd.levels)]
    x = jnp.asarray(rng.normal(size=(20, 6)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(6, 6)) * 0.5, jnp.float32)
    check_against_reference(lambda x, W: _run(nbhd, kinds, backend, x, W),
                            lambda x, W: _run(nbhd, kinds, "reference", x, W), x, W, terms=8, jvp=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kinds", [("sum", "max", "mean"), ("softmax", "mean", "max")])
def test_compiled_equals_reference_f64(backend, kinds):
    rng = np.random.default_rng(11)
    with x64():
        nbhd = _hierarchy(rng, 20, SHAPES["dense-ragged-dense"])
        x = jnp.asarray(rng.normal(size=(20, 5)), jnp.float64)
        W = jnp.asarray(rng.normal(size=(5, 5)) * 0.5, jnp.float64)
        check_against_reference(lambda x, W: _run(nbhd, kinds, backend, x, W),
                                lambda x, W: _run(nbhd, kinds, "reference", x, W), x, W, dtype=np.float64,
                                terms=8, jvp=False)


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "softmax"])
def test_dense_level_equals_its_ragged_form_and_a_loop(kind):
    """The dense lowering (reshape + masked reductions) against the segment lowering of the same members, and
    sum/mean/max/min against a per-group loop over the unmasked members."""
    rng = np.random.default_rng(3)
    g, k, n = 9, 4, 13
    members = rng.integers(0, n, (g, k))
    mask = rng.random((g, k)) > 0.3
    mask[2] = False
    x = jnp.asarray(rng.normal(size=(n, 3)), jnp.float32)
    dense = jgnn.Neighborhood((jgnn.dense_level(members, mask=mask),))
    ragged = jgnn.Neighborhood((jgnn.ragged_level(members.reshape(-1), np.repeat(np.arange(g), k), g,
                                                  mask=mask.reshape(-1)),))
    agg = [jgnn.Aggregation(rho=_rho(kind))]
    got = jgnn.aggregate(x, dense, agg)
    assert_close(got, jgnn.aggregate(x, ragged, agg), what=kind)
    if kind == "softmax":
        return
    xs = np.asarray(x)
    loop = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind]
    want = np.stack([loop(xs[members[i][mask[i]]], 0) if mask[i].any() else np.zeros(3) for i in range(g)])
    assert_close(got, want.astype(np.float32), what=kind)


def test_explain_records_each_level_and_fuses_each_ragged_level():
    rng = np.random.default_rng(5)
    nbhd = _hierarchy(rng, 20, [("ragged", 30, 110), ("ragged", 15, 41), ("dense", 5, 3)])
    x = jnp.asarray(rng.normal(size=(20, 6)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(6, 6)), jnp.float32)
    layer = jgnn.hierarchical(_layer(("mean", "softmax", "sum"), "xla")(x, W), backend="xla")
    report = jgnn.explain(layer, _graph(x), nbhd)
    levels = {(d.code, d.get("level")): d for d in report.decisions if d.get("level") is not None}
    assert levels[(Reason.LEVEL_SEGMENT, 0)].by == Pass.LOWERING
    assert levels[(Reason.LEVEL_SEGMENT, 1)].get("members") == 41
    assert levels[(Reason.LEVEL_DENSE, 2)].get("fanout") == 3
    assert levels[(Reason.LEVEL_FUSED, 0)].applied and levels[(Reason.LEVEL_FUSED, 1)].applied
    fused = {d.get("edges"): d.code for d in report.decisions if d.by == Pass.FUSE and d.get("edges")}
    assert fused == {110: Reason.FUSED_REDUCE, 41: Reason.FUSED_ATTENTION}
    assert sum(e.primitive == "jgnn_segment" for e in report.equations) == 2  # none for the dense level
    assert len(report.kernels) == 2


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="groups"):
        jgnn.ragged_level(np.arange(4), np.arange(3), 5)
    with pytest.raises(ValueError, match="members"):
        jgnn.dense_level(np.arange(4))
    with pytest.raises(ValueError, match="mask"):
        jgnn.dense_level(np.zeros((2, 3), int), mask=np.ones((3, 2), bool))
    nbhd = jgnn.Neighborhood((jgnn.dense_level(np.zeros((2, 3), int)),))
    with pytest.raises(ValueError, match="aggregations"):
        jgnn.aggregate(jnp.ones((4, 2)), nbhd, [])
    with pytest.raises(TypeError, match="Aggregation"):
        jgnn.hierarchical([lambda mb, g: mb])
