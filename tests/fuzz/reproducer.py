"""Standalone reproducers: a short Python script that rebuilds a failing case and shows the mismatch.

The script holds the program's source, the inputs and parameters as literals (small arrays as lists, large ones
as compressed bytes), and the same seeded cotangents and tangents as the checker. It needs only jax, jraph,
numpy and jgnn.
"""

from __future__ import annotations

import base64
import pickle
import textwrap
import zlib

import jax
import jraph
import ml_dtypes
import numpy as np

from tests.fuzz.checker import Failure, make_params
from tests.fuzz.graphs import build_inputs
from tests.fuzz.programs import HEADER

_SMALL = 96  # arrays with more elements are printed as compressed bytes


def _dtype_expr(dtype) -> str:
    return "jnp.bfloat16" if dtype == ml_dtypes.bfloat16 else f"np.{np.dtype(dtype).name}"


def _scalar(v) -> str:
    if isinstance(v, complex | np.complexfloating):
        return f"complex({_scalar(v.real)}, {_scalar(v.imag)})"
    if isinstance(v, float | np.floating):
        v = float(v)
        return "nan" if np.isnan(v) else ("inf" if v == np.inf else ("-inf" if v == -np.inf else repr(v)))
    return repr(int(v))


def array_literal(x) -> str:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return f"jax.random.wrap_key_data({array_literal(np.asarray(jax.random.key_data(x)))})"
    x = np.asarray(x)
    dt = _dtype_expr(x.dtype)
    if x.size > _SMALL:
        blob = base64.b64encode(zlib.compress(np.ascontiguousarray(x).tobytes(), 9)).decode()
        wrapped = "\n".join(textwrap.wrap(blob, 100))
        return f'unpack("""{wrapped}""", {dt}, {x.shape})'
    if x.size == 0:  # a nested list cannot say the shape of an empty array ([] is (0,), not (0, F))
        return f"np.zeros({x.shape}, {dt})"
    if x.dtype == ml_dtypes.bfloat16:
        return f"np.array({_nested(x.astype(np.float32))}, np.float32).astype({dt})"
    return f"np.array({_nested(x)}, {dt})"


def _nested(x: np.ndarray) -> str:
    if x.ndim == 0:
        return _scalar(x.item())
    return "[" + ", ".join(_nested(v) for v in x) + "]"


def tree_literal(tree, indent: int = 0) -> str:
    if tree is None:
        return "None"
    if isinstance(tree, jraph.GraphsTuple):
        fields = ",\n".join(f"    {f}={tree_literal(getattr(tree, f), indent + 4)}" for f in tree._fields)
        return "jraph.GraphsTuple(\n" + fields + ")"
    if isinstance(tree, dict):
        items = ",\n".join(f'    "{k}": {tree_literal(v, indent + 4)}' for k, v in tree.items())
        return "{\n" + items + "}"
    return array_literal(tree)


RUNNER = '''
def unpack(blob, dtype, shape):
    return np.frombuffer(zlib.decompress(base64.b64decode(blob)), dtype).reshape(shape).copy()


def split(inputs):
    """The differentiable float leaves, the other array leaves (ids: traced too, as the fuzzer traces them, so
    that out-of-range ids reach the program under jit as they do there), and the function that rebuilds
    ``inputs`` from both."""
    leaves, treedef = jax.tree_util.tree_flatten(inputs)
    is_float = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves]
    is_array = [isinstance(x, np.ndarray) for x in leaves]
    floats = [x for x, f in zip(leaves, is_float) if f]
    others = [x for x, f, a in zip(leaves, is_float, is_array) if a and not f]

    def rebuild(fl, ot):
        fi, oi = iter(fl), iter(ot)
        return jax.tree_util.tree_unflatten(
            treedef, [next(fi) if f else next(oi) if a else x for x, f, a in zip(leaves, is_float, is_array)])
    return floats, others, rebuild


def normal(rng, shape, dtype):
    x = rng.normal(size=shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        x = x + 1j * rng.normal(size=shape)
    return np.asarray(x).astype(dtype)


def run(backend):
    """Forward outputs, gradients of sum(out * cotangent) and JVP tangents, as the fuzzer computes them."""
    floats, others, rebuild = split(inputs)
    f = lambda fl, p, ot: model(backend, rebuild(fl, ot), p)
    shapes = jax.eval_shape(lambda fl, p, ot: model("reference", rebuild(fl, ot), p), floats, params, others)
    rng = np.random.default_rng([SEED, 3])
    ct = jax.tree_util.tree_map(lambda s: normal(rng, s.shape, s.dtype) if jnp.issubdtype(s.dtype, jnp.inexact)
                                else np.zeros(s.shape, jax.dtypes.float0), shapes)
    rng = np.random.default_rng([SEED, 2])
    tangents = ([normal(rng, np.shape(x), np.asarray(x).dtype) for x in floats],
                {k: normal(rng, np.shape(v), v.dtype) for k, v in params.items()})
    if MODE == "forward":
        return {"forward": jax.jit(f)(floats, params, others)}
    if MODE == "vmap":  # two stacked parameter sets
        stacked = jax.tree_util.tree_map(lambda p: np.stack([p, p[::-1]]), params)
        return {"vmap": jax.jit(lambda p, ot: jax.vmap(lambda q: f(floats, q, ot), axis_size=2)(p))(stacked, others)}
    if MODE == "shard_map":
        mesh, spec = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), jax.sharding.PartitionSpec()
        return {"shard_map": jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec))(floats, params,
                                                                                                   others)}
    if MODE == "hvp":  # forward over reverse, along the tangents
        grad = lambda fl, p, ot: jax.vjp(lambda a, b: f(a, b, ot), fl, p)[1](ct)
        return {"hvp": jax.jit(lambda fl, p, t, ot: jax.jvp(lambda a, b: grad(a, b, ot), (fl, p), t)[1])(
            floats, params, tangents, others)}
    if MODE == "jvp":
        out, tangent = jax.jit(lambda fl, p, t, ot: jax.jvp(lambda a, b: f(a, b, ot), (fl, p), t))(
            floats, params, tangents, others)
        return {"forward": out, "jvp": tangent}
    pullback = lambda fl, p, c, ot: (lambda o, pull: (o, pull(c)))(*jax.vjp(lambda a, b: f(a, b, ot), fl, p))
    out, grads = jax.jit(pullback)(floats, params, ct, others)
    return {"forward": out, "grad": grads}


def show(ref, got):
    for part in ref:
        refs, _ = jax.tree_util.tree_flatten_with_path(ref[part])
        for (path, r), g in zip(refs, jax.tree_util.tree_leaves(got[part])):
            if np.asarray(r).dtype == jax.dtypes.float0:  # tangents of integer outputs
                continue
            r, g = np.asarray(r).astype(np.complex128), np.asarray(g).astype(np.complex128)
            nan = int((np.isnan(r) != np.isnan(g)).sum())
            inf = int((np.isinf(r) != np.isinf(g)).sum())
            ok = np.isfinite(r) & np.isfinite(g)
            err = float(np.abs(np.where(ok, r - g, 0)).max(initial=0))
            scale = float(np.abs(r)[ok].max(initial=0))
            print(f"{part:8s}{jax.tree_util.keystr(path):24s} max|got-ref| {err:.3g} (max|ref| {scale:.3g}), "
                  f"NaN positions differing: {nan}, inf positions differing: {inf}")


ref = run("reference")
got = run(BACKEND)  # raises here if the backend crashes
show(ref, got)
'''


# The training step on backend "pallas", lowered for CUDA with no GPU (the checker's `check_cuda_lowering`).
CUDA_LOWERING = '''
from pallas_kernels import compat

floats, others, rebuild = split(inputs)
f = lambda fl, p: model("pallas", rebuild(fl, others), p)
shapes = jax.eval_shape(lambda fl, p: model("reference", rebuild(fl, others), p), floats, params)
ct = jax.tree_util.tree_map(lambda s: np.ones(s.shape, s.dtype) if jnp.issubdtype(s.dtype, jnp.inexact)
                            else np.zeros(s.shape, jax.dtypes.float0), shapes)
compat.export_cuda_mlir(lambda fl, p, c: jax.vjp(f, fl, p)[1](c), floats, params, ct)  # raises here
print("the step lowers for CUDA")
'''


def reproducer(failure: Failure) -> str:
    """A standalone script that rebuilds ``failure.case`` and runs reference and backend side by side."""
    case = failure.case
    dtype = ml_dtypes.bfloat16 if case.dtype == "bfloat16" else np.dtype(case.dtype)
    built = build_inputs(case.program.signature, case.graph, case.values, dtype)
    inputs = dict(built.inputs)
    layout = inputs.pop("layout", None)
    params = make_params(case.program, dtype, case.values.seed)
    mode = {"grad": "vjp", "forward": "vjp", "jvp": "jvp", "cuda_lowering": "vjp"}.get(failure.mode, failure.mode)
    x64 = case.dtype in ("float64", "complex128")
    doc = (f'"""jgnn fuzz reproducer: {failure.kind} ({failure.mode}) on backend {failure.backend!r}, '
           f"dtype {case.dtype}.\n\n" + "\n".join(textwrap.wrap(f"{failure.where} {failure.detail}", 110))
           + f'\n\nGraph: {case.graph}\nValues: {case.values}\n"""\n')
    lines = [doc, "import base64", "import zlib", "", "import numpy as np", HEADER.strip()]
    if x64:
        lines.append('jax.config.update("jax_enable_x64", True)')
    lines += ["nan, inf = np.nan, np.inf", f"BACKEND, MODE, SEED = {failure.backend!r}, {mode!r}, "
              f"{case.values.seed}", "", case.program.source.strip(), RUNNER.split("\n\nref = run")[0], "",
              f"inputs = {tree_literal(inputs)}"]
    if layout is not None:
        lines.insert(lines.index(HEADER.strip()) + 1, "import jgnn.layout")
        lines.append('inputs["layout"] = jgnn.layout.GraphLayout.from_graph(inputs["graph"])')  # as graphs.py
    lines.append(f"params = {tree_literal(params)}")
    if failure.mode == "explain":
        lines.append('print(jgnn.explain(lambda i, p: model("reference", i, p), inputs, params))')
    elif failure.mode == "cuda_lowering":
        lines += ["", CUDA_LOWERING.strip()]
    else:
        lines += ["", "ref = run" + RUNNER.split("\n\nref = run")[1]]
    return "\n".join(lines) + "\n"


def batch_reproducer(batch, failure: Failure) -> str:
    """A script that replays the whole check of ``batch`` (`checker.check_batch`), for a failure that names no
    backend or part: the checking process died (`campaign.process_crash`). Run it from the repository root."""
    blob = base64.b64encode(zlib.compress(pickle.dumps(batch))).decode()
    return (f'"""jgnn fuzz reproducer: {failure.detail}.\n\n{batch!r}\n"""\n'
            "import base64\nimport pickle\nimport zlib\n\nfrom tests.fuzz import checker\n\n"
            f'batch = pickle.loads(zlib.decompress(base64.b64decode("{blob}")))\n'
            "print(checker.check_batch(batch))\n")
