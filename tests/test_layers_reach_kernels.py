"""Layers that reach the Pallas kernels (issue 14): interpret-mode forward, gradient and JVP vs the reference
backend, and the kernel records that say so."""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import x64
from graph_cases import random_graph

import jgnn
from jgnn import Reason, mailbox
from jgnn.layout import GraphLayout
from jgnn.ops import lowering

SEED = 20261124
TOL = {jnp.float32: dict(rtol=2e-5, atol=2e-5), jnp.float64: dict(rtol=1e-12, atol=1e-12)}


def lowered_choices(monkeypatch, fn, *args) -> list[tuple[str, bool, str, Reason]]:
    """(reduction, hits, impl, reason) of every edge op on a kernel backend that lowering ``jax.jit(fn)``
    decides, derived ops (JVPs, transposes) included: `explain` reports the forward program's ops only."""
    seen = []

    def record(spec, avals, decide=lowering.decide):
        choice = decide(spec, avals)
        if spec.backend != "xla":
            seen.append((spec.reduce.value, spec.hits, choice.impl, choice.code))
        return choice

    monkeypatch.setattr(lowering, "decide", record)
    jax.jit(fn).lower(*args)
    return seen


def _extremum_layer(kind: str, w, backend: str):
    """An EdgeConv-like layer: per-edge message from both endpoints, max or min over the mailbox."""

    def phi(src, dst, edge):
        return {"m": jnp.tanh(src["h"] - dst["h"]) * w + src["h"]}

    def rho(mb, node):
        return {"m": getattr(mailbox, kind)(mb["m"])}

    return jgnn.message_passing(phi, rho, lambda node, agg: {"h": agg["m"]}, backend=backend)


@pytest.mark.parametrize("dtype", [jnp.float32, pytest.param(jnp.float64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_on_kernel_match_reference_with_ties(kind, dtype, monkeypatch):
    """Duplicate edges give exact ties (the reference splits their gradient evenly); isolated nodes give empty
    rows (0); a NaN feature propagates to its rows in the forward and the gradient."""
    with x64() if dtype == jnp.float64 else contextlib.nullcontext():
        rng = np.random.default_rng(SEED)
        graph = random_graph(rng, 12, 40, 5, isolated=2, hub=9, duplicates=6, dtype=dtype)
        h = graph.nodes["h"].at[3, 1].set(jnp.nan)
        w = jnp.asarray(rng.normal(size=(5,)), dtype)
        kernel, reference = (_extremum_layer(kind, w, b) for b in ("pallas_interpret", "reference"))
        layout = GraphLayout.from_graph(graph)
        records = jgnn.explain(kernel, graph, layout=layout).kernels
        assert [(k.lowering, k.code) for k in records] == [("kernel", Reason.LOWER_KERNEL)]

        def run(layer, x):
            return layer(graph._replace(nodes={"h": x}), layout=layout).nodes["h"]

        tol = TOL[dtype]
        np.testing.assert_allclose(run(kernel, h), run(reference, h), **tol)
        np.testing.assert_array_equal(np.isnan(run(kernel, h)), np.isnan(run(reference, h)))
        loss = lambda x, layer: jnp.sum(jnp.sin(run(layer, x)) * jnp.arange(5, dtype=dtype))
        np.testing.assert_allclose(jax.grad(loss)(h, kernel), jax.grad(loss)(h, reference), **tol)
        finite = graph.nodes["h"]
        np.testing.assert_allclose(jax.grad(loss)(finite, kernel), jax.grad(loss)(finite, reference), **tol)
        t = jnp.asarray(rng.normal(size=finite.shape), dtype)
        (_, jk), (_, jr) = (jax.jvp(lambda x, f=f: run(f, x), (finite,), (t,)) for f in (kernel, reference))
        np.testing.assert_allclose(jk, jr, **tol)
        # the training step's ops, the max/min with its tie mask and the transpose, all on kernels
        choices = lowered_choices(monkeypatch, lambda x: jax.grad(loss)(x, kernel), finite)
        assert (kind, True, "kernel", Reason.LOWER_KERNEL) in choices
        assert {(impl, code) for *_, impl, code in choices} == {("kernel", Reason.LOWER_KERNEL)}, choices


def _attention_layer(name: str, backend: str, features: int = 4, heads: int = 2, **options):
    import jgnn.nn as gnn

    cls = {"gat": gnn.GATConv, "gatv2": gnn.GATv2Conv}[name]
    return cls(features, num_heads=heads, backend=backend, **options)


def _layer_loss(module, variables, graph, layout, **apply):
    # jitted, as a training step is
    @jax.jit
    def loss(x):
        out = module.apply(variables, graph._replace(nodes={"h": x}), layout=layout, **apply).nodes["h"]
        return jnp.sum(jnp.sin(out) * jnp.arange(out.shape[-1], dtype=out.dtype))

    return loss


@pytest.mark.parametrize("dtype,sizes", [(jnp.float32, (4, 2)), (jnp.float32, (8, 1)),
                                         pytest.param(jnp.float64, (4, 2), marks=pytest.mark.slow),
                                         pytest.param(jnp.float32, (3, 3), marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["gat", pytest.param("gatv2", marks=pytest.mark.slow)])
def test_attention_layers_with_self_loops_match_reference(name, dtype, sizes, monkeypatch):
    """GAT/GATv2 with their appended self-loops (a per-edge bool that masks existing loops, a per-row scalar in
    the attention tiles), with one head too (its ``[1]`` attention vectors crashed the kernel; its backward's
    scalar-per-edge sums run on the per-head kernels with one head), on duplicate
    edges (tied scores), isolated nodes and a hub: interpret-mode forward and
    gradient equal the reference; the forward attention runs on the kernel, and so does the backward
    (`SoftmaxRowDot`, `SoftmaxVjp` on the per-head kernels) when every size is a power of two."""
    with x64() if dtype == jnp.float64 else contextlib.nullcontext():
        rng = np.random.default_rng(SEED)
        graph = random_graph(rng, 14, 50, 5, isolated=2, hub=10, duplicates=6, dtype=dtype)
        graph = graph._replace(senders=graph.senders.at[:3].set(graph.receivers[:3]))  # existing self-loops
        layout = GraphLayout.from_graph(graph, self_loops=True)
        kernel, reference = (_attention_layer(name, b, *sizes) for b in ("pallas_interpret", "reference"))
        variables = reference.init(jax.random.key(0), graph, layout=layout)
        variables = jax.tree.map(lambda p: p.astype(dtype), variables)
        tol = TOL[dtype]
        h = graph.nodes["h"]
        fk, fr = (_layer_loss(m, variables, graph, layout) for m in (kernel, reference))
        np.testing.assert_allclose(fk(h), fr(h), **tol)
        np.testing.assert_allclose(jax.grad(fk)(h), jax.grad(fr)(h), **tol)
        choices = lowered_choices(monkeypatch, jax.grad(fk), h)
        assert ("softmax", False, "kernel", Reason.LOWER_KERNEL) in choices
        backward = {(impl, code) for reduce, _, impl, code in choices if reduce == "sum"}
        # 3 heads of 3 need padded tiles, which the per-head kernels do not take
        want = ("segment", Reason.NOT_ZERO_PADDING_SAFE) if sizes == (3, 3) else ("kernel", Reason.LOWER_KERNEL)
        # a shared parameter's cotangent (a sum over all edges) stays on XLA
        assert want in backward and backward <= {want, ("segment", Reason.NOT_LANEWISE)}, backward


@pytest.mark.parametrize("name", ["gat", "gatv2"])
def test_attention_layers_with_self_loops_lower_for_cuda(name):
    """The attention tiles of a per-row scalar lower to Triton (no static slice or reduce_or there). The layer's
    inner call matches the self-loop layout (its graph argument already holds the loops), so its kernels walk the
    layout's CSRs: the training step sorts nothing."""
    from pallas_kernels import compat

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 14, 50, 5, isolated=2, hub=10)
    layout = GraphLayout.from_graph(graph, self_loops=True)
    module = _attention_layer(name, "pallas")
    variables = _attention_layer(name, "reference").init(jax.random.key(0), graph, layout=layout)
    step = jax.value_and_grad(_layer_loss(module, variables, graph, layout))
    mlir = compat.export_cuda_mlir(step, graph.nodes["h"])
    assert compat.TRITON_CUSTOM_CALL in mlir
    assert "stablehlo.sort" not in mlir
    kernels = jgnn.explain(module, variables, graph, layout=layout).kernels
    assert kernels and {k.get("csr") for k in kernels} == {Reason.CSR_FROM_LAYOUT}


@pytest.mark.parametrize("name, backend, code, kernel_ops, ops", [
    ("gat", "pallas", Reason.BACKWARD_ON_KERNELS, 5, 5),
    ("gatv2", "pallas", Reason.BACKWARD_MIXED_LOWERINGS, 5, 6),
    ("gat", "xla", Reason.BACKWARD_ON_XLA, 0, 5),
])
def test_explain_reports_where_the_attention_backward_runs(name, backend, code, kernel_ops, ops):
    """The backward of a fused attention is several derived ops (the ties' pivot, row sums, their centred sums, one
    pullback per operand group), which run on one lowering (`attention_tangent._alike`); `explain` reports it with the
    forward's record, for gradients in every argument of the explained function. GATv2's shared attention vector's
    pullback (a sum over all edges) has no kernel, so its whole backward runs on XLA: the CUDA lowering of its
    training step calls the forward kernel only, GAT's its backward kernels too. The constant per-head operand of
    GAT's scores is never differentiated (not counted)."""
    from benchmarks.gpu.deviceless import triton_call_names
    from pallas_kernels import compat

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 14, 50, 5, isolated=2, hub=10)
    layout = GraphLayout.from_graph(graph, self_loops=True)
    module = _attention_layer(name, backend)
    variables = _attention_layer(name, "reference").init(jax.random.key(0), graph, layout=layout)
    [record] = jgnn.explain(module, variables, graph, layout=layout).kernels
    assert (record.op, record.get("backward_code")) == ("attention", code)
    assert (record.get("backward_kernel_ops"), record.get("backward_ops")) == (kernel_ops, ops)
    assert record.get("backward") == ("kernel" if code == Reason.BACKWARD_ON_KERNELS else "xla")
    if backend == "pallas":  # a training step: gradients in the parameters and the features, as explained

        def loss(params, x):
            return jnp.sum(module.apply(params, graph._replace(nodes={"h": x}), layout=layout).nodes["h"] ** 2)

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        calls = triton_call_names(compat.export_cuda_mlir(step, variables, graph.nodes["h"]))
        backward_calls = [c for c in calls if not c.startswith("gnn_attention")]
        assert len(backward_calls) == (ops if record.get("backward") == "kernel" else 0), calls


@pytest.mark.parametrize("name", ["rgat", pytest.param("hgt", marks=pytest.mark.slow)])
def test_typed_attention_layers_on_kernels_match_reference(name, monkeypatch):
    """RGAT (values reshaped from flat per-relation rows inside the edge function) and HGT on duplicate edges,
    isolated nodes and a hub: forward and gradient on pallas_interpret equal the reference, with the forward
    attention and every backward op of the attention on kernels. (float32 only: in float64 the typed matmul's
    Pallas path differs from the reference by float32 rounding, before any attention.)"""
    dtype = jnp.float32
    import jgnn.nn as gnn

    with x64() if dtype == jnp.float64 else contextlib.nullcontext():
        rng = np.random.default_rng(SEED)
        graph = random_graph(rng, 14, 50, 8, node_types=2, edge_types=3, isolated=2, hub=10, duplicates=6,
                             dtype=dtype)
        # host types: the layers range-check concrete types with numpy
        graph = graph._replace(nodes={k: np.asarray(v) if k == "type" else v for k, v in graph.nodes.items()},
                               edges={"type": np.asarray(graph.edges["type"])})
        make = {"rgat": lambda b: gnn.RGATConv(4, 3, num_heads=2, backend=b),
                "hgt": lambda b: gnn.HGTConv(8, 2, 2, 3, backend=b)}[name]
        kernel, reference = make("pallas_interpret"), make("reference")
        variables = jax.tree.map(lambda p: p.astype(dtype), reference.init(jax.random.key(0), graph))

        def loss_of(module):
            @jax.jit
            def loss(x):
                out = module.apply(variables, graph._replace(nodes={**graph.nodes, "h": x})).nodes["h"]
                return jnp.sum(jnp.sin(out) * jnp.arange(out.shape[-1], dtype=out.dtype))

            return loss

        fk, fr = loss_of(kernel), loss_of(reference)
        h, tol = graph.nodes["h"], TOL[dtype]
        np.testing.assert_allclose(fk(h), fr(h), **tol)
        np.testing.assert_allclose(jax.grad(fk)(h), jax.grad(fr)(h), **tol)
        choices = lowered_choices(monkeypatch, jax.grad(fk), h)
        assert ("softmax", False, "kernel", Reason.LOWER_KERNEL) in choices
        attention_backward = {(impl, code) for reduce, _, impl, code in choices if reduce in ("sum", "none")}
        assert ("kernel", Reason.LOWER_KERNEL) in attention_backward
        assert ("segment", Reason.NOT_ZERO_PADDING_SAFE) not in attention_backward


@pytest.mark.slow
def test_gat_attention_dropout_on_kernels_matches_reference(monkeypatch):
    """Attention dropout is a counter hash of (seed, edge id, head) in the reference program itself
    (`pallas_kernels.edge_dropout_keep`), so the kernels, which load the int32 ids and seed exactly and evaluate
    the same hash, give the reference's mask bit for bit: forward and gradient equal, and every attention op,
    forward and backward, is on a kernel."""
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 14, 50, 5, isolated=2, hub=10, duplicates=6)
    layout = GraphLayout.from_graph(graph, self_loops=True)
    kernel, reference = (_attention_layer("gat", b, attention_dropout=0.4) for b in ("pallas_interpret",
                                                                                       "reference"))
    variables = reference.init(jax.random.key(0), graph, layout=layout)
    apply = dict(deterministic=False, rngs={"dropout": jax.random.key(7)})
    fk, fr = (_layer_loss(m, variables, graph, layout, **apply) for m in (kernel, reference))
    h, tol = graph.nodes["h"], TOL[jnp.float32]
    no_drop = _layer_loss(reference, variables, graph, layout)
    assert not np.allclose(fr(h), no_drop(h), **tol)  # the mask drops something
    np.testing.assert_allclose(fk(h), fr(h), **tol)
    np.testing.assert_allclose(jax.grad(fk)(h), jax.grad(fr)(h), **tol)
    choices = lowered_choices(monkeypatch, jax.grad(fk), h)
    assert ("softmax", False, "kernel", Reason.LOWER_KERNEL) in choices
    assert {(impl, code) for reduce, _, impl, code in choices if reduce == "sum"} == {("kernel", Reason.LOWER_KERNEL)}


def _eqns(jaxpr):
    """Every equation of ``jaxpr``, sub-jaxprs included."""
    from jax._src import core

    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield eqn
        for sub in core.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def test_ops_without_a_triton_rule_stay_on_xla_and_the_step_lowers_for_cuda(monkeypatch):
    """A message built by concatenating a node feature with the globals, and a per-head message of stacked
    copies (a fuzz case that crashed an H100: Pallas' Triton lowering concatenates only two ``[..., 1]``
    operands and has no ``slice``). The per-head kernels would run it; the interpreter runs anything. Those ops
    stay on XLA with ``NOT_IN_TRITON``, the others keep their kernels, the training step lowers for CUDA, and
    the values and gradients equal the reference's."""
    from pallas_kernels import compat as pk_compat

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 9, 30, 1, isolated=1, duplicates=3, globals_dim=3)
    w = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)

    def layer(backend):
        def phi(src, dst, edge, glob):
            wide = jnp.concatenate([src["h"], glob])
            both = jnp.concatenate([glob, jnp.stack([src["h"], src["h"]]).reshape(2)])
            return {"both": both, "wide": wide}

        def rho(mb, node):
            return {"a": jgnn.sum(mb["both"]) / (1.0 + jgnn.sum(jnp.abs(mb["both"]))),
                    "b": jgnn.sum(mb["wide"] * node["h"][0])}

        def psi(node, agg):
            return {"h": jnp.tanh(jnp.concatenate([agg["a"], agg["b"][:0]]) @ w) + node["h"][0]}

        return jgnn.message_passing(phi, rho, psi, backend=backend)

    def loss(backend):
        def f(h, g):
            out = layer(backend)(graph._replace(nodes={"h": h}, globals=g)).nodes["h"]
            return jnp.sum(jnp.sin(out) * jnp.arange(out.shape[-1], dtype=out.dtype))
        return f

    h, g = graph.nodes["h"], graph.globals
    grad = lambda backend: jax.grad(loss(backend), argnums=(0, 1))
    for a, b in zip(jax.tree.leaves(grad("pallas_interpret")(h, g)), jax.tree.leaves(grad("reference")(h, g)),
                    strict=True):
        np.testing.assert_allclose(a, b, **TOL[jnp.float32])
    choices = lowered_choices(monkeypatch, grad("pallas_interpret"), h, g)
    assert ("sum", False, "segment", Reason.NOT_IN_TRITON) in {c[:4] for c in choices}, choices
    assert ("kernel", Reason.LOWER_KERNEL) in {c[2:] for c in choices}, choices
    pk_compat.export_cuda_mlir(grad("pallas"), h, g)  # raised NotImplementedError before


def test_sixteen_bit_math_runs_in_float32_on_the_kernels(monkeypatch):
    """On float16, Pallas' Triton lowering has no ``tanh`` or ``div`` (an H100 failed to compile the kernel): the
    edge function runs each rounding op in float32 and rounds once, which is IEEE float16 arithmetic for the
    division. Every ``tanh`` and ``div`` of the functions the kernels run, derivatives included, takes float32
    operands, and the forward and gradient equal the reference's to float16 accuracy."""
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 12, 40, 8, isolated=2, hub=6, duplicates=3, dtype=jnp.float16)
    w = jnp.asarray(rng.normal(size=(8,)), jnp.float16)

    def run(backend, h):
        def phi(src, dst, edge):
            return {"m": jnp.tanh(src["h"] - dst["h"]) / (1.0 + jnp.abs(dst["h"])) * w}
        out = jgnn.message_passing(phi, lambda mb, node: {"h": jgnn.sum(mb["m"])}, None, backend=backend)
        return out(graph._replace(nodes={"h": h})).nodes["h"]

    loss = lambda h, backend: jnp.sum(run(backend, h).astype(jnp.float32) * jnp.arange(8, dtype=jnp.float32))
    h = graph.nodes["h"]
    tol = dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.float32(run("pallas_interpret", h)), np.float32(run("reference", h)), **tol)
    np.testing.assert_allclose(np.float32(jax.grad(loss)(h, "pallas_interpret")),
                               np.float32(jax.grad(loss)(h, "reference")), **tol)

    kernel_fns = []

    def record(spec, avals, decide=lowering.decide):
        choice = decide(spec, avals)
        if choice.impl == "kernel":
            rows = [jax.ShapeDtypeStruct(a.shape if g.name == "SHARED" else (8,) + a.shape[1:], a.dtype)
                    for a, g in zip(avals, spec.groups, strict=True)]
            kernel_fns.append(jax.make_jaxpr(lambda *xs, spec=spec: spec.fn.apply(list(xs)))(*rows))
        return choice

    monkeypatch.setattr(lowering, "decide", record)
    jax.jit(jax.grad(loss), static_argnums=1).lower(h, "pallas_interpret")
    assert len(kernel_fns) >= 2, "the forward and the backward run on kernels"
    math = [(e.primitive.name, [str(v.aval.dtype) for v in e.invars]) for j in kernel_fns for e in _eqns(j)
            if e.primitive.name in ("tanh", "div")]
    assert {name for name, _ in math} == {"tanh", "div"}, math
    assert all(set(dtypes) == {"float32"} for _, dtypes in math), math


def test_a_derivatives_dead_tangents_never_reach_a_triton_kernel():
    """``jax.linearize`` of an attention layer over width-3 features: attention's backward runs on the per-head
    kernel, whose edge function (a JVP) built the zero tangent of a ``[B, 1, 3]`` message it then dropped. An H100
    rejected the module (Triton verifies that every value has a power-of-two size before it drops dead code); the
    interpreter ran it. The kernels drop dead ops first, the export's size check passes, the per-head kernel is
    still there, and the tangents equal the reference's."""
    from pallas_kernels import compat as pk_compat

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 7, 20, 3, isolated=1, duplicates=2)

    def layer(backend):
        def phi(s, d, e):
            return {"m": jnp.tanh(s["h"] * d["h"]), "logit": jnp.sum(s["h"], keepdims=True)}

        def rho(mb, node):
            return {"h": jgnn.sum(jgnn.softmax(mb["logit"]) * mb["m"]) + jgnn.max(mb["m"])}

        return jgnn.message_passing(phi, rho, None, backend=backend)

    f = lambda backend: lambda h: layer(backend)(graph._replace(nodes={"h": h})).nodes["h"]
    h = graph.nodes["h"]
    tangent = lambda backend: lambda x, t: jax.linearize(f(backend), x)[1](t)
    t = jnp.asarray(rng.normal(size=h.shape), h.dtype)
    np.testing.assert_allclose(jax.jit(tangent("pallas_interpret"))(h, t), tangent("reference")(h, t),
                               **TOL[jnp.float32])
    text = pk_compat.export_cuda_mlir(tangent("pallas"), h, t)  # raised ValueError (a (64, 1, 3) broadcast)
    assert "gnn_head_reduce_sum" in text


def test_the_cuda_export_rejects_a_kernel_value_of_odd_size():
    """The check that stands in for Triton's verifier: a kernel with a live ``[8, 3]`` value fails the export with
    a ValueError naming the kernel (the interpreter runs it)."""
    from jax.experimental import pallas as pl

    from pallas_kernels import compat as pk_compat

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + jnp.sum(jnp.ones((8, 3), x_ref.dtype))

    call = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), name="odd",
                                    compiler_params=pk_compat.triton_compiler_params())(x)
    with pytest.raises(ValueError, match="power of two"):
        pk_compat.export_cuda_mlir(call, jnp.zeros((8, 4), jnp.float32))


def test_without_dead_code_keeps_what_a_function_computes():
    """The pass that runs on every Triton kernel body (and so only on a GPU): pytrees in and out, closed-over
    arrays, a custom-JVP callee and a dead odd-sized value. The outputs are the function's, the dead value is gone,
    and derivatives through it are the function's too."""
    from pallas_kernels import compat as pk_compat

    scale = jnp.arange(4.0)

    def body(tiles, ctx):
        a, b = tiles
        jnp.broadcast_to(a[:, :1], (2, 3)) * 2.0  # dead, and of a size Triton rejects
        return {"y": jax.nn.relu(a * scale + b), "z": (ctx["k"] * a.sum(),)}

    args = ((jnp.linspace(-1.0, 1.0, 8).reshape(2, 4), jnp.ones((2, 4))), {"k": jnp.float32(3.0)})
    pruned = pk_compat.without_dead_code(body)
    jax.tree.map(np.testing.assert_array_equal, pruned(*args), body(*args))
    assert pk_compat.odd_sized_value(jax.make_jaxpr(body)(*args)) is not None
    assert pk_compat.odd_sized_value(jax.make_jaxpr(pruned)(*args)) is None
    g = lambda f: jax.grad(lambda t: jnp.sum(f((t, args[0][1]), args[1])["y"]))(args[0][0])
    np.testing.assert_array_equal(g(pruned), g(body))


def test_a_complex_typed_matmul_on_the_pallas_backend_lowers_for_cuda_on_xla_gemms():
    """complex64 ``x @ W[type]`` on the Pallas backend: neither the Triton kernel nor ragged_dot (JAX 0.10.2
    segfaulted serialising ragged_dot of complex64 lowered for CUDA: fuzz campaign 20261128, chunk 20261131) runs
    it; XLA's blocked GEMMs do, `explain` says so, and the training step exports for CUDA."""
    from pallas_kernels import compat

    rng = np.random.default_rng(SEED)
    n, e = 6, 12
    x = jnp.asarray(rng.normal(size=(n, 4)) + 1j * rng.normal(size=(n, 4)), jnp.complex64)
    w = jnp.asarray(rng.normal(size=(3, 4, 4)) + 1j * rng.normal(size=(3, 4, 4)), jnp.complex64)
    graph = random_graph(rng, n, e, 4, node_types=3)._replace(edges=None)

    def phi(s, d, edge):
        return s["h"] @ w[s["type"]]

    layer, ref = (jgnn.message_passing(phi, lambda mb, node: jgnn.sum(jnp.tanh(mb)), None, backend=b)
                  for b in ("pallas", "reference"))
    run = lambda f, h: f(graph._replace(nodes={"h": h, "type": graph.nodes["type"]})).nodes  # noqa: E731
    step = lambda h, ct: jax.vjp(lambda h: run(layer, h), h)[1](ct)  # noqa: E731
    mlir = compat.export_cuda_mlir(step, x, x)
    assert not re.search(r"\b\w+\.ragged_dot\b", mlir)  # no (stable|c)hlo.ragged_dot op
    records = [k for k in jgnn.explain(layer, graph._replace(nodes={"h": x, "type": graph.nodes["type"]})).kernels
               if k.op == "typed_matmul"]
    assert [(k.lowering, k.code) for k in records] == [("xla_blocks", Reason.TYPED_MATMUL_XLA_DTYPE)]
    interpret = jgnn.message_passing(phi, lambda mb, node: jgnn.sum(jnp.tanh(mb)), None, backend="pallas_interpret")
    np.testing.assert_allclose(run(interpret, x), run(ref, x), rtol=1e-5, atol=1e-5)
