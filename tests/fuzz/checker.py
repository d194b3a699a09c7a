"""The differential checker: run one `Batch` on every backend and compare with the reference.

For each case, every backend runs one jitted function of ``model(backend, inputs, params)`` that returns

* ``forward``: the outputs;
* ``grad``: the gradients of ``sum(out · cotangent)`` (a seeded random cotangent) with respect to every float
  input leaf and every parameter (``jax.vjp``);
* ``jvp``: the output tangents along seeded random input and parameter tangents (``jax.jvp``).

When that function fails, vjp and jvp (and forward alone) run apart, so the failure is pinned to the part that
causes it. Compiled functions are cached per (program, backend, mode): the cases of a batch reuse them. Each
part is compared leaf by leaf with the reference (`tolerances`); the float64 oracle runs only when a backend is
not within rounding of the reference.

A failure is one of `KINDS`: a backend crash (any exception, except a named jgnn error where the reference
raises one too), a reference that rejects a valid program, NaN/inf positions that differ from the reference,
values outside the tolerance, or a fallback in `jgnn.explain`'s report (every generated program is meant to
be fully supported).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import traceback

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jgnn
from tests.fuzz import rounded, tolerances
from tests.fuzz.graphs import build_inputs, is_float
from tests.fuzz.strategies import Batch, Case

BACKENDS = ("xla", "pallas_interpret")
_PACKAGE_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jgnn, __import__("pallas_kernels")))


@dataclasses.dataclass(frozen=True)
class Failure:
    """One way a case went wrong. ``where`` locates it: the raising jgnn frame, or the output leaf and row."""

    case: Case
    backend: str
    mode: str  # "forward", "grad", "jvp", "hvp", "vmap", "shard_map", "explain", "program" or "cuda_lowering"
    kind: str  # see KINDS
    detail: str
    where: str = ""

    def signature(self) -> tuple:
        """What identifies the bug: the kind, mode, backend and location (crashes) or dtype (values)."""
        loc = self.where if self.kind in ("crash", "rejects", "reference_rejects", "reference_crash") else ""
        return (self.kind, self.mode, self.backend, loc, self.case.dtype)


KINDS = {
    "crash": "the backend raised where the reference did not (or raised an unnamed error)",
    "rejects": "the backend raised a named jgnn error for a case the reference accepts",
    "reference_rejects": "the reference rejected a valid program",
    "reference_crash": "the reference raised an unnamed error",
    "nonfinite": "NaN/inf positions differ from the reference",
    "value": "finite values outside the tolerance",
    "fallback": "jgnn.explain reports a fallback region",
}


# ---- running -----------------------------------------------------------------------------------------------

def _jgnn_errors() -> tuple[type, ...]:
    return tuple(v for v in vars(jgnn).values() if isinstance(v, type) and issubclass(v, BaseException))


def is_named_error(exc: BaseException) -> bool:
    """A jgnn exception class, or a ValueError/TypeError with a message that a jgnn ``raise`` statement raised.

    Errors that jgnn merely passes through (numpy, JAX) are crashes, even when jgnn's frame is the last one.
    """
    if isinstance(exc, _jgnn_errors()):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return type(exc) in (ValueError, TypeError) and bool(str(exc)) and bool(frames) and \
        frames[-1].filename.startswith(_PACKAGE_DIRS[:1]) and (frames[-1].line or "").lstrip().startswith("raise")


def crash_site(exc: BaseException) -> str:
    """The innermost jgnn or pallas_kernels frame of the traceback (file:function), else the exception type."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(_PACKAGE_DIRS)]
    if not frames:
        return type(exc).__name__
    f = frames[-1]
    return f"{os.path.relpath(f.filename, os.path.dirname(_PACKAGE_DIRS[0].rstrip(os.sep)))}:{f.name}"


@functools.lru_cache(maxsize=256)
def _model(source_program):
    return source_program.load()


def _rebuild(treedef, mask, floats, others):
    fl, ol = iter(floats), iter(others)
    return jax.tree_util.tree_unflatten(treedef, [next(fl) if m else next(ol) for m in mask])


@functools.lru_cache(maxsize=96)
def _compiled(program, backend: str, mode: str):
    """The jitted ``vjp``, ``jvp`` or ``forward`` function of one program on one backend."""
    model = _model(program)

    def forward(treedef, mask, floats, others, params):
        return model(backend, _rebuild(treedef, mask, floats, others), params)

    def vjp(treedef, mask, floats, others, params, cotangent):
        out, pull = jax.vjp(lambda f, p: forward(treedef, mask, f, others, p), floats, params)
        return out, pull(cotangent)

    def jvp(treedef, mask, floats, others, params, tangents):
        return jax.jvp(lambda f, p: forward(treedef, mask, f, others, p), (floats, params), tangents)

    def vjp_by_jvp(treedef, mask, floats, others, params, cotangent):
        """The gradient as ``ctᵀ J`` with ``J`` built by forward mode (see `FORWARD_MODE_GRAD_FLAGS`).

        A complex input is differentiated along its real and imaginary parts (``J_re``, ``J_im``), and its
        gradient is ``Re(ct·J_re) − i Re(ct·J_im)``: JAX's reverse-mode convention, the conjugate of the real
        Jacobian's transpose applied to ``conj(ct)`` (``ct·c`` for ``z ↦ c z``, ``conj(ct)`` for ``z ↦ conj(z)``)."""
        inexact = lambda tree: [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
        is_complex = lambda x: jnp.issubdtype(x.dtype, jnp.complexfloating)  # noqa: E731
        primals = (floats, params)
        re = jax.tree_util.tree_map(lambda x: x.real if is_complex(x) else x, primals)
        im = jax.tree_util.tree_map(lambda x: x.imag if is_complex(x) else jnp.zeros_like(x), primals)

        def f(re, im):
            fl, p = jax.tree_util.tree_map(lambda x, a, b: a + 1j * b if is_complex(x) else a, primals, re, im)
            return inexact(forward(treedef, mask, fl, others, p))
        if any(map(is_complex, jax.tree_util.tree_leaves(primals))):
            jac = jax.jacfwd(f, argnums=(0, 1))(re, im)  # per output leaf: (d/d re, d/d im), each of primals
            jac_re, jac_im = [j[0] for j in jac], [j[1] for j in jac]
        else:
            jac_re, jac_im = jax.jacfwd(f)(re, im), None
        cts = inexact(cotangent)
        dot = lambda js: sum(jnp.tensordot(ct, j, axes=ct.ndim) for ct, j in zip(cts, js, strict=True))  # noqa: E731

        def pull(k):
            a = jax.tree_util.tree_map(lambda *js: dot(js), *[j[k] for j in jac_re])
            if jac_im is None:
                return a
            b = jax.tree_util.tree_map(lambda *js: dot(js), *[j[k] for j in jac_im])
            return jax.tree_util.tree_map(lambda x, ga, gb: (ga.real - 1j * gb.real if is_complex(x) else ga.real)
                                          .astype(x.dtype), primals[k], a, b)
        return forward(treedef, mask, floats, others, params), (pull(0), pull(1))

    def both(treedef, mask, floats, others, params, cotangent, tangents):
        out, grads = vjp(treedef, mask, floats, others, params, cotangent)
        return out, grads, jvp(treedef, mask, floats, others, params, tangents)[1]

    def hvp(treedef, mask, floats, others, params, cotangent, tangents):
        """Forward over reverse: the tangent, along ``tangents``, of the gradient of ``sum(out · cotangent)``."""
        return jax.jvp(lambda f, p: vjp(treedef, mask, f, others, p, cotangent)[1], (floats, params), tangents)[1]

    def hvp_by_jvp(treedef, mask, floats, others, params, cotangent, tangents):
        """`hvp` over the forward-mode gradient (see `FORWARD_MODE_GRAD_FLAGS`)."""
        return jax.jvp(lambda f, p: vjp_by_jvp(treedef, mask, f, others, p, cotangent)[1], (floats, params),
                       tangents)[1]

    def vmap(treedef, mask, floats, others, params):
        """The layer mapped over a leading axis of two stacked parameter sets (a program without parameters maps
        over nothing: ``axis_size`` says how many)."""
        return jax.vmap(lambda p: forward(treedef, mask, floats, others, p), axis_size=2)(params)

    def shard_map(treedef, mask, floats, others, params):
        """The layer inside shard_map over a one-device mesh (replicated in and out)."""
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
        spec = jax.sharding.PartitionSpec()
        return jax.shard_map(lambda f, o, p: forward(treedef, mask, f, o, p), mesh=mesh, in_specs=spec,
                             out_specs=spec)(floats, others, params)

    fns = {"forward": forward, "vjp": vjp, "jvp": jvp, "both": both, "vmap": vmap, "shard_map": shard_map,
           "vjp_by_jvp": vjp_by_jvp, "hvp": hvp, "hvp_by_jvp": hvp_by_jvp}
    return jax.jit(fns[mode], static_argnums=(0, 1))


@dataclasses.dataclass
class Operands:
    """A case's concrete operands, split into differentiable floats and the rest."""

    treedef: object
    mask: tuple[bool, ...]
    floats: tuple
    others: tuple
    params: dict
    cotangent: object = None
    tangents: tuple = ()

    def cast(self, dtype: str) -> Operands:
        conv = lambda x: np.asarray(x, dtype) if is_float(x) and np.asarray(x).dtype != np.dtype(jax.dtypes.float0) \
            else x
        tree = jax.tree_util.tree_map
        return dataclasses.replace(self, floats=tree(conv, self.floats), params=tree(conv, self.params),
                                   cotangent=tree(conv, self.cotangent), tangents=tree(conv, self.tangents))


def _random_like(rng, shape, dtype):
    x = rng.normal(size=shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        x = x + 1j * rng.normal(size=shape)
    return np.asarray(x).astype(dtype)


def make_params(program, dtype: str, seed: int) -> dict:
    """Parameters ~ N(0, 1/fan_in), seeded by the case's value seed."""
    rng = np.random.default_rng([seed, 1])
    return {name: _random_like(rng, shape, dtype) / np.sqrt(shape[-2] if len(shape) >= 2 else 1).astype(
        np.float32).astype(dtype) for name, shape in program.params}


def operands(case: Case) -> Operands:
    built = build_inputs(case.program.signature, case.graph, case.values, np.dtype(dtype_of(case.dtype)))
    leaves, treedef = jax.tree_util.tree_flatten(built.inputs)
    mask = tuple(bool(is_float(x)) and _is_array(x) for x in leaves)
    floats = tuple(x for x, m in zip(leaves, mask, strict=True) if m)
    others = tuple(x for x, m in zip(leaves, mask, strict=True) if not m)
    params = make_params(case.program, dtype_of(case.dtype), case.values.seed)
    rng = np.random.default_rng([case.values.seed, 2])
    tangents = (tuple(_random_like(rng, np.shape(x), np.asarray(x).dtype) for x in floats),
                {k: _random_like(rng, np.shape(v), v.dtype) for k, v in params.items()})
    return Operands(treedef, mask, floats, others, params, None, tangents)


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray | np.generic | jax.Array)


def dtype_of(name: str):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def with_cotangent(ops: Operands, out_shapes, seed: int) -> Operands:
    rng = np.random.default_rng([seed, 3])
    ct = jax.tree_util.tree_map(
        lambda s: np.zeros(s.shape, jax.dtypes.float0) if not jnp.issubdtype(s.dtype, jnp.inexact)
        else _random_like(rng, s.shape, s.dtype), out_shapes)
    return dataclasses.replace(ops, cotangent=ct)


def x64(dtype: str):
    return jax.enable_x64(True) if dtype in ("float64", "complex128") else contextlib.nullcontext()


_CRASHES: dict = {}  # (program, backend, mode, abstract args) -> exception: a trace that failed fails again


def _mode_args(ops: Operands, mode: str) -> tuple:
    """The traced arguments of ``_compiled(..., mode)`` after its two static ones."""
    both = (ops.cotangent, ops.tangents)
    return (ops.floats, ops.others, ops.params) + {
        "vjp": (ops.cotangent,), "vjp_by_jvp": (ops.cotangent,), "jvp": (ops.tangents,), "both": both,
        "hvp": both, "hvp_by_jvp": both}.get(mode, ())


def run(program, backend: str, mode: str, ops: Operands, dtype: str):
    """(result, None) or (None, exception); results are numpy."""
    fn = _compiled(program, backend, mode)
    args = (ops.treedef, ops.mask) + _mode_args(ops, mode)
    shapes = tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in jax.tree_util.tree_leaves(args[2:]))
    key = (program, backend, mode, dtype, jax.config.jax_disable_jit, ops.treedef, shapes)  # eager runs apart
    if key in _CRASHES:
        return None, _CRASHES[key]
    try:
        with x64(dtype):
            out = fn(*args)
            return jax.tree_util.tree_map(np.asarray, jax.device_get(out)), None
    except Exception as exc:  # every crash is data for the checker
        if len(_CRASHES) > 512:
            _CRASHES.clear()
        _CRASHES[key] = exc
        return None, exc


def out_shapes(program, ops: Operands, dtype: str):
    """The reference's output shapes (traced, so index checks see tracers as under jit)."""
    with x64(dtype):
        return jax.eval_shape(lambda f, o, p: _model(program)("reference", _rebuild(ops.treedef, ops.mask, f, o), p),
                              ops.floats, ops.others, ops.params)


# ---- comparing ---------------------------------------------------------------------------------------------

def _as_real(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if np.iscomplexobj(x):
        return np.stack([x.real, x.imag], -1).astype(np.float64)
    return x.astype(np.float64) if is_float(x) else x


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(1, -1) if x.ndim == 0 else x.reshape(x.shape[0], int(np.prod(x.shape[1:])))


def _row_max(x: np.ndarray, where: np.ndarray) -> np.ndarray:
    return _rows(np.where(where, x, 0)).max(1, initial=0)


def _in_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (a complex dtype's components to its real one) and back to float64."""
    real = {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)
    with np.errstate(over="ignore"):
        return x.astype(ml_dtypes.finfo(real).dtype).astype(np.float64)


# How NaN/±inf positions must agree (`tolerances`): exactly (forward values), as non-finite positions (derivatives:
# NaN and ±inf may swap), or not at all (a forward-mode reference gradient: `FORWARD_MODE_GRAD_FLAGS`).
NONFINITE = {"exact": (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)),
             "positions": (("non-finite", lambda x: ~np.isfinite(x)),),
             "finite_only": ()}


def compare_leaf(ref, got, dtype: str, oracle_leaf, nonfinite: str = "exact",
                 floor: float = 0.0, rounded_leaf=None, spread_leaf=None,
                 range_edge=None) -> tuple[str, str] | None:
    """None if ``got`` matches ``ref`` (see `tolerances`); else (kind, detail).

    ``oracle_leaf()`` gives the float64 oracle of this leaf; it is asked for only when ``got`` is not within
    plain rounding of the reference, since agreeing with the reference is always a pass. ``rounded_leaf()``
    gives the rounded oracle (`tests.fuzz.rounded`), asked for where the reference overflowed to NaN and
    ``got`` has ±inf, and where ``got`` fails otherwise: its error counts as the reference's (XLA keeps excess
    precision between fused ops, so a jitted 16-bit reference can be far nearer the truth than its program rounded
    op by op, which a backend that rounds a node-level product before summing it equals). ``spread_leaf()``
    gives how far the reference's own value moves when the parameters move by a few ulps (`Oracle.spread`), asked
    for only where ``got`` fails otherwise: it counts as the reference's error.
    ``range_edge()`` says whether the program is at the range edge (`tolerances.at_range_edge`), asked for only
    where one side is finite and the other not, or one side NaN and the other not.
    ``nonfinite``: a key of `NONFINITE`. ``floor``: the least scale of a row (`compare_trees`).
    """
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return "value", f"shape/dtype {got.shape} {got.dtype}, reference {ref.shape} {ref.dtype}"
    if not is_float(ref):
        if ref.dtype == np.dtype(jax.dtypes.float0) or np.array_equal(ref, got):
            return None
        bad = tuple(np.argwhere(ref != got)[0])
        return "value", f"integer mismatch at {bad}: {got[bad]} vs reference {ref[bad]}"
    r, b = _as_real(ref), _as_real(got)
    # Overflow is the association's choice at the range edge: one side finite and the other not, or the
    # reference's inf − inf NaN where the backend overflowed one way only (campaign 20261400: a float16 gradient
    # NaN in the reference, +inf in jgnn, −39,420 in float64).
    unlike = (np.isfinite(r) != np.isfinite(b)) | (np.isnan(r) != np.isnan(b))
    if unlike.any() and range_edge is not None and range_edge():
        edge = unlike & np.isfinite(_as_real(oracle_leaf()))
        r, b = np.where(edge, 0, r), np.where(edge, 0, b)
    # Where the reference overflowed and float64 did not, the oracle stands in for it: as is where the backend is
    # finite. Where the reference's inf − inf made NaN and the backend has an inf (a float16 sum that the
    # reference accumulates in float16 and the backend in float32), that inf is right if the true value is past
    # the dtype's range with its sign, or if the program overflows there with every operation rounded once (the
    # rounded oracle: a float16 mean whose sum overflows, though the mean itself fits).
    overflowed = ~np.isfinite(r) & (np.isfinite(b) | (np.isnan(r) & np.isinf(b)))
    if overflowed.any():
        o = _as_real(oracle_leaf())
        overflowed &= np.isfinite(o)
        stand_in = _in_dtype(o, dtype)
        swapped = overflowed & np.isinf(b)
        q = rounded_leaf() if swapped.any() and rounded_leaf is not None else None
        if q is not None:
            stand_in = np.where(swapped & (_as_real(q) == b), b, stand_in)
        r = np.where(overflowed, np.where(np.isfinite(b), o, stand_in), r)
    for name, test in NONFINITE[nonfinite]:
        diff = test(r) != test(b)
        if diff.any():
            at = tuple(np.argwhere(diff)[0])
            return "nonfinite", (f"{name} at {int(diff.sum())} positions differs, e.g. {at}: got {b[at]}, "
                                 f"reference {r[at]}")
    finite = np.isfinite(r) & np.isfinite(b)
    r, b = np.where(finite, r, 0), np.where(finite, b, 0)
    scale_r = np.maximum(_row_max(np.abs(r), finite), floor)
    if (_row_max(np.abs(b - r), finite) <= tolerances.allowed(dtype, np.zeros(1), scale_r)).all():
        return None
    o = _as_real(oracle_leaf())
    o = np.where(np.isfinite(o), o, r)
    err_b, err_r = _row_max(np.abs(b - o), finite), _row_max(np.abs(r - o), finite)
    scale = np.maximum(_row_max(np.abs(o), finite), floor)
    limit = tolerances.allowed(dtype, err_r, scale)
    bad = np.flatnonzero(err_b > limit)
    if len(bad) and spread_leaf is not None and (spread := spread_leaf()) is not None:
        err_r = np.maximum(err_r, spread)
        limit = tolerances.allowed(dtype, err_r, scale)
        bad = np.flatnonzero(err_b > limit)
    if len(bad) and rounded_leaf is not None and (q := rounded_leaf()) is not None:
        q = _as_real(np.asarray(q))
        q = np.where(np.isfinite(q), q, o)
        limit = tolerances.allowed(dtype, np.maximum(err_r, _row_max(np.abs(q - o), finite)), scale)
        bad = np.flatnonzero(err_b > limit)
    if not len(bad):
        return None
    row = int(bad[np.argmax((err_b - limit)[bad])])
    col = int(np.argmax(_rows(np.where(finite, np.abs(b - o), 0))[row]))
    return "value", (f"row {row}: max |got - oracle| = {err_b[row]:.3g} > allowed {limit[row]:.3g} "
                     f"(reference error {err_r[row]:.3g}, scale {scale[row]:.3g}); e.g. got "
                     f"{_rows(b)[row, col]:.6g}, reference {_rows(r)[row, col]:.6g}, oracle {_rows(o)[row, col]:.6g}")


def compare_trees(ref, got, dtype: str, oracle_tree, nonfinite: str = "exact",
                  part_fraction: float = 0.0, least_scale: float = 0.0,
                  rounded_tree=None, spread_tree=None, range_edge=None) -> tuple[str, str, str] | None:
    """The first mismatching leaf: (kind, leaf path, detail), or None. ``oracle_tree()`` and ``rounded_tree()``
    (the rounded oracle, `compare_leaf`) are lazy.

    ``part_fraction``: every row's scale is at least this fraction of the largest finite |value| in the whole
    tree (`tolerances.part_fraction`), or ``least_scale`` (`tolerances.least_scale`) where that is 0.
    """
    paths, treedef = jax.tree_util.tree_flatten_with_path(ref)
    floor = part_fraction * _largest(ref)
    floor = floor or least_scale  # only a part without a nonzero finite entry has no scale of its own
    got_leaves = treedef.flatten_up_to(got)
    for i, ((path, r), g) in enumerate(zip(paths, got_leaves, strict=True)):
        rounded = None if rounded_tree is None else lambda i=i: _leaf(rounded_tree(), treedef, i)
        spread = None if spread_tree is None else lambda i=i: _leaf(spread_tree(), treedef, i)
        res = compare_leaf(r, g, dtype, lambda i=i: treedef.flatten_up_to(oracle_tree())[i], nonfinite, floor,
                           rounded, spread, range_edge)
        if res:
            return res[0], jax.tree_util.keystr(path), res[1]
    return None


def _leaf(tree, treedef, i: int):
    return None if tree is None else treedef.flatten_up_to(tree)[i]


class Oracle:
    """The reference run in float64 (complex128), and the rounded oracle (`tests.fuzz.rounded`): each computed on
    first use and shared by every backend."""

    def __init__(self, program, ops: Operands, dtype: str, ref: dict, grad_by_jvp: bool, seed: int = 0,
                 magnitude: str = "normal"):
        self.program, self.ops, self.dtype, self.ref = program, ops, tolerances.ORACLE_DTYPE[dtype], ref
        self.case_dtype = dtype
        self.parts = ref if self.dtype == dtype else None
        self.grad_by_jvp = grad_by_jvp
        self.rounded_parts: dict = {}
        self.eager_parts: dict | None = None
        self.spread_parts: dict = {}
        self.range_edges: dict = {}
        self.ops_seed, self.magnitude = seed, magnitude

    def part(self, name: str):
        if self.parts is None:
            self.parts = reference_parts(self.program, self.ops.cast(self.dtype), self.dtype, self.grad_by_jvp)[0]
        return self.parts.get(name, self.ref[name])  # no oracle for a part: the reference itself

    def eager(self, name: str):
        """The reference's part run op by op (`jax.disable_jit`), or None where that fails: a second opinion.

        Jitted, XLA may compute one value twice, rounded differently: on a one-edge row with a softmax score near
        3e18, ``s − max`` came out 3.2e10 and −5.5e11 instead of 0 (the score recomputed inside the subtraction,
        its last product unrounded, against a max of the rounded score), ``exp`` of that is inf, and
        a one-edge row's weight is NaN where the program says 1 (campaign 20261127, `repro_13`). Op by op, every
        value is computed once, as the program is written."""
        if self.eager_parts is None:
            try:
                with jax.disable_jit():
                    self.eager_parts = reference_parts(self.program, self.ops, self.case_dtype, self.grad_by_jvp)[0]
            except Exception:  # noqa: BLE001 - no second opinion: the jitted reference decides alone
                self.eager_parts = {}
        return self.eager_parts.get(name)

    def spread(self, name: str):
        """Per leaf of the derivative part ``name``, the largest change of the reference's value (a scalar, the
        max over the leaf) when every parameter moves by up to `SPREAD_ULPS` ulps, over `SPREAD_DRAWS` seeded draws;
        None where that fails or for a forward part.

        A max's derivative goes to the edge attaining it. Where two edges' messages are within rounding of each
        other (the ``near_ties`` pattern under a chain of matmuls), which one attains it depends on the order of
        the additions, and a rewrite that reassociates the chain (``linear_split``) may pick the other: a forward
        value within rounding, a derivative O(1) apart (FINDINGS-2714b3a, class f). Both are derivatives of a
        correctly rounded forward pass. So the backend may be as far from the reference as the reference itself
        moves when its inputs move by a few ulps. The parameters move, not the features: edges tied because they
        read equal rows (duplicates) stay tied, and their split gradient is still compared. Only for unit-scale
        values (at huge magnitudes every derivative is this sensitive, and the pinned cases there must stay
        strict), and by ulps of float32 (float64 for float64): a bfloat16 or float16 parameter does not move."""
        if name not in DERIVATIVES or not self.ops.params or self.magnitude != "normal":
            return None
        if name not in self.spread_parts:
            base = self.ref[name]
            leaves, treedef = jax.tree_util.tree_flatten(base)
            most = [np.zeros((), np.float64) for _ in leaves]
            mode = self._mode(name)
            eps = float(np.finfo(np.float64 if self.case_dtype in ("float64", "complex128") else np.float32).eps)
            for draw in range(SPREAD_DRAWS):
                rng = np.random.default_rng([self.ops_seed, 4, draw])
                params = {k: (np.asarray(v) * (1 + SPREAD_ULPS * eps * rng.uniform(-1, 1, np.shape(v)))
                              ).astype(np.asarray(v).dtype) for k, v in self.ops.params.items()}
                out, exc = run(self.program, "reference", mode, dataclasses.replace(self.ops, params=params),
                               self.case_dtype)
                if exc is not None:
                    self.spread_parts[name] = None
                    return None
                pick = dict(PARTS[self.MODE_OF_PART[name]])[name]  # vjp_by_jvp gives vjp's structure
                for i, (b, p) in enumerate(zip(leaves, treedef.flatten_up_to(pick(out)), strict=True)):
                    if is_float(np.asarray(b)) and np.asarray(b).dtype != np.dtype(jax.dtypes.float0):
                        d = np.abs(_as_real(p) - _as_real(b))
                        most[i] = np.maximum(most[i], d[np.isfinite(d)].max(initial=0))
            self.spread_parts[name] = treedef.unflatten(most)
        return self.spread_parts[name]

    # The reference function (a `PARTS` mode) that gives each part.
    MODE_OF_PART = {"forward": "forward", "grad": "vjp", "jvp": "jvp"}

    def _mode(self, name: str) -> str:
        """The `_compiled` mode that gives part ``name``: the gradient by forward mode where ids leave [0, n)
        (`FORWARD_MODE_GRAD_FLAGS`), with the same result structure as vjp's."""
        return "vjp_by_jvp" if name == "grad" and self.grad_by_jvp else self.MODE_OF_PART[name]

    def _reference_call(self, name: str) -> tuple:
        """(the jitted reference function giving part ``name``, then its traced arguments)."""
        mode = self._mode(name)
        fn = functools.partial(_compiled(self.program, "reference", mode), self.ops.treedef, self.ops.mask)
        return (fn, *_mode_args(self.ops, mode))

    def range_edge(self, name: str) -> bool:
        """Whether the program giving part ``name`` is at the range edge (`tolerances.at_range_edge`): its
        operations computed one by one in float64 on the case's inputs (`rounded.largest`); False where that
        fails."""
        if name not in self.range_edges:
            try:
                with x64(self.case_dtype):
                    largest = rounded.largest(*self._reference_call(name))
            except Exception:  # noqa: BLE001 - unknown: compared exactly
                largest = 0.0
            self.range_edges[name] = tolerances.at_range_edge(largest, self.case_dtype)
        return self.range_edges[name]

    def rounded(self, name: str):
        if name not in self.rounded_parts:
            pick = dict(PARTS[self.MODE_OF_PART[name]])[name]
            try:
                with x64(self.case_dtype):
                    out = jax.tree_util.tree_map(np.asarray, pick(rounded.evaluate(*self._reference_call(name))))
            except Exception:  # noqa: BLE001 - no rounded oracle for this program: the float64 one decides
                out = None
            self.rounded_parts[name] = out
        return self.rounded_parts[name]


# Each mode's result splits into named parts, each compared on its own: the failure's mode is the part's name.
PARTS = {"both": (("forward", lambda r: r[0]), ("grad", lambda r: r[1]), ("jvp", lambda r: r[2])),
         "vjp": (("forward", lambda r: r[0]), ("grad", lambda r: r[1])),
         "jvp": (("forward", lambda r: r[0]), ("jvp", lambda r: r[1])),
         "forward": (("forward", lambda r: r),)}
DERIVATIVES = frozenset({"grad", "jvp"})
# Graphs whose ids leave [0, n): jnp indexing clamps such a read (x[ids] is a PROMISE_IN_BOUNDS gather), but
# JAX's reverse mode drops its cotangent (the scatter that transposes it drops out-of-range rows), so the
# reference's `jax.vjp` disagrees with its own `jax.jvp` and with finite differences. Negative ids: jnp indexing
# wraps the read, jax.ops.segment_* drops the edge, so an edge's value can be computed and never used (jraph's
# softmax subtracts the wrapped row's max, which excludes the edge: exp overflows); reverse mode multiplies its
# zero cotangent by that infinite partial (0 · inf = NaN, in float64 too), forward mode drops it (campaign
# 20261124: 180 jraph GAT cases, jgnn equal to ``ctᵀ J``). jgnn's gradients are the derivative of the forward pass;
# for these graphs the reference gradient is ``ctᵀ J`` by forward mode. A Jacobian has NaN where reverse mode never
# forms a product (inf · 0 inside ``J``), so only finite positions are compared.
FORWARD_MODE_GRAD_FLAGS = frozenset({"out_of_range", "negative"})
PART_OF_MODE = {"vjp": "grad", "jvp": "jvp", "forward": "forward", "vmap": "vmap", "shard_map": "shard_map",
                "hvp": "hvp"}


# ---- one case ----------------------------------------------------------------------------------------------

def check_case(case: Case, backends=BACKENDS, reassociated: bool = False) -> list[Failure]:
    """``reassociated``: the plan reassociates a product chain (`REASSOCIATING`); with scattered ±inf inputs,
    outputs the reference makes NaN are then not compared and carry no cotangent (`tainted_outputs`)."""
    program, dtype = case.program, case.dtype
    ops = operands(case)
    try:
        shapes = out_shapes(program, ops, dtype)
    except Exception as exc:
        return [_reference_failure(case, "program", exc)]
    ops = with_cotangent(ops, shapes, case.values.seed)
    tainted = tainted_outputs(case, ops, reassociated)
    ops = _untainted_cotangent(ops, tainted)
    grad_by_jvp = _grad_by_jvp(case)
    ref, errors = reference_parts(program, ops, dtype, grad_by_jvp)
    failures = [_reference_failure(case, PART_OF_MODE[mode], exc) for mode, exc in errors.items()]
    rejected = {mode for mode, exc in errors.items() if is_named_error(exc)}
    oracle = Oracle(program, ops, dtype, ref, grad_by_jvp, case.values.seed, case.values.magnitude)
    for backend in backends:
        failures += _check_backend(case, backend, ops, ref, oracle, rejected, tainted)
    return failures


# Rewrites that reassociate a product chain: ``(x @ A) @ B -> x @ (A @ B)`` (`linear_reorder`, typed or not) and
# ``segment(x[src]) @ W -> segment(x[src] @ W)``. With ±inf among finite features the reference's inner product
# holds +inf and -inf, so its outer one makes ``inf - inf = NaN`` where the reassociated one gives ±inf, and a max
# downstream drops -inf but propagates NaN (campaign 20261126: 118 of 1,500 cases). jgnn documents reassociation
# as exact for finite inputs only: outputs the reference makes NaN in such a case are not compared, and a
# zero cotangent there keeps the gradients of every other output checked (a max over NaN passes no gradient in the
# reference, a max over ±inf selects an edge in jgnn).
REASSOCIATING = frozenset({jgnn.Reason.REASSOCIATED, jgnn.Reason.MATMUL_BEFORE_REDUCTION})


def reassociates(report) -> bool:
    return any(d.applied and d.code in REASSOCIATING for d in report.decisions)


def tainted_outputs(case: Case, ops: Operands, reassociated: bool):
    """Per output leaf, where the reference's forward value is NaN (``inf - inf`` inside a product chain), for a
    reassociated case with scattered ±inf inputs (`REASSOCIATING`); None for every other case. An empty row's
    ±inf identity is not tainted: it is compared exactly."""
    if not (reassociated and _scattered_inf(case)):
        return None
    forward, exc = run(case.program, "reference", "forward", ops, case.dtype)
    if exc is not None:
        return None
    return jax.tree_util.tree_map(_nan_positions, forward)


def _scattered_inf(case: Case) -> bool:
    return bool(SCATTERED_INF_PATTERNS & {p.kind for p in case.values.patterns})


def _nan_positions(x):
    """Where ``x`` is NaN (a complex number with a NaN part counts), in ``x``'s shape."""
    x = np.asarray(x)
    return np.isnan(x) if is_float(x) else np.zeros(np.shape(x), bool)


def _untainted_cotangent(ops: Operands, tainted) -> Operands:
    """``ops`` with a zero cotangent at the tainted outputs (`tainted_outputs`; None: unchanged)."""
    if tainted is None:
        return ops
    return dataclasses.replace(ops, cotangent=jax.tree_util.tree_map(
        lambda c, t: c if c.dtype == jax.dtypes.float0 else np.where(t, np.zeros((), c.dtype), c),
        ops.cotangent, tainted))


def _untainted(value, ref, tainted):
    """``value`` with the reference's values where an output is tainted (`tainted_outputs`)."""
    if tainted is None:
        return value
    return jax.tree_util.tree_map(lambda v, r, t: np.where(t, r, v) if is_float(np.asarray(v)) else v,
                                  value, ref, tainted)


def run_all(program, backend: str, ops: Operands, dtype: str) -> tuple[dict, dict]:
    """Every part (forward, grad, jvp) that runs, and the exception of each mode that does not.

    One jitted function computes all parts; only when it fails do vjp and jvp run apart (and forward alone if
    vjp fails), so a failure is attributed to the mode that causes it.
    """
    result, exc = run(program, backend, "both", ops, dtype)
    if exc is None:
        return {part: pick(result) for part, pick in PARTS["both"]}, {}
    parts, errors = {}, {}
    for mode in ("vjp", "jvp"):
        result, exc = run(program, backend, mode, ops, dtype)
        if exc is not None:
            errors[mode] = exc
            continue
        for part, pick in PARTS[mode]:
            parts.setdefault(part, pick(result))
    if "forward" not in parts:
        result, exc = run(program, backend, "forward", ops, dtype)
        if exc is not None:
            errors["forward"] = exc
        else:
            parts["forward"] = result
    return parts, errors


def reference_parts(program, ops: Operands, dtype: str, grad_by_jvp: bool) -> tuple[dict, dict]:
    """`run_all` of the reference; with ``grad_by_jvp`` its gradient by forward mode (`FORWARD_MODE_GRAD_FLAGS`)."""
    parts, errors = run_all(program, "reference", ops, dtype)
    if grad_by_jvp and "grad" in parts:
        result, exc = run(program, "reference", "vjp_by_jvp", ops, dtype)
        if exc is not None:
            errors["vjp"] = exc
        else:
            parts[REVERSE_MODE_GRAD], parts["grad"] = parts["grad"], result[1]
    return parts, errors


# `Oracle.spread`: how far the parameters move (in ulps of the dtype) and how many times.
SPREAD_ULPS = 64
SPREAD_DRAWS = 4


# The part under which `reference_parts` keeps the reference's reverse-mode gradient where its gradient is by
# forward mode (`FORWARD_MODE_GRAD_FLAGS`): a second reference answer, not a part of its own. The two are compiled
# apart, so their forward passes may round differently: at features near 1e19 a float32 sum of products that a
# ``tanh`` reads came out with one sign in the reference's forward-mode program and the other in its (and
# jgnn's) reverse-mode one, and a ``W`` gradient of 0.9 in one was −1.7 in the other (campaign 20261201).
REVERSE_MODE_GRAD = "grad_by_reverse_mode"


def _reference_failure(case, part, exc) -> Failure:
    kind = "reference_rejects" if is_named_error(exc) else "reference_crash"
    return Failure(case, "reference", part, kind, _one_line(exc), crash_site(exc))


def _check_backend(case: Case, backend: str, ops: Operands, ref: dict, oracle: Oracle,
                   rejected: set, tainted=None) -> list[Failure]:
    """Run vjp and jvp (and forward alone if vjp crashes); compare each part that the reference has.

    A named jgnn error in a mode where the reference raised one too is no failure. With ``tainted`` outputs
    (`tainted_outputs`), neither those outputs nor the gradient where the reference's is NaN are compared: the
    zeroed cotangent still meets the tainted forward's NaN in the reference's backward (``0 · NaN``; campaign
    20261700, a tanh after a reassociated chain)."""
    got, errors = run_all(case.program, backend, ops, case.dtype)
    failures = [_crash(case, backend, PART_OF_MODE[mode], exc) for mode, exc in errors.items()
                if not (mode in rejected and is_named_error(exc))]
    for part, value in got.items():
        if part in ref:
            if part in ("forward", "jvp"):
                value = _untainted(value, ref[part], tainted)
            elif tainted is not None:  # a tainted forward's NaN reaches the reference's gradient as 0 · NaN
                value = _untainted(value, ref[part], jax.tree_util.tree_map(_nan_positions, ref[part]))
            nonfinite, fraction, least = _derivative_rules(case, part, oracle.grad_by_jvp, ref.get("forward"))
            compare = functools.partial(compare_trees, got=value, dtype=case.dtype,
                                        oracle_tree=lambda part=part: oracle.part(part), nonfinite=nonfinite,
                                        part_fraction=fraction, least_scale=least,
                                        rounded_tree=lambda part=part: oracle.rounded(part),
                                        spread_tree=lambda part=part: oracle.spread(part),
                                        range_edge=lambda part=part: oracle.range_edge(part))
            res = compare(ref[part])
            if res is not None and (eager := oracle.eager(part)) is not None and compare(eager) is None:
                res = None  # as the program computes it op by op (`Oracle.eager`)
            if res is not None and part == "grad" and REVERSE_MODE_GRAD in ref and \
                    compare(ref[REVERSE_MODE_GRAD]) is None:
                res = None  # the reference's own reverse-mode gradient (`REVERSE_MODE_GRAD`)
            if res is not None:
                kind, where, detail = res
                failures.append(Failure(case, backend, part, kind, detail, where))
    return failures


# Patterns that put ±inf among finite features: a product chain reassociated by `linear_reorder` turns the
# reference's ``(x @ A) @ B = inf − inf = NaN`` into ``x @ (A @ B) = ±inf`` (campaign 20261124), so forward values
# of such cases may swap NaN and ±inf, as derivatives may. The -inf masks of whole neighbourhoods stay exact.
SCATTERED_INF_PATTERNS = frozenset({"posinf", "neginf"})


def _derivative_rules(case: Case, part: str, grad_by_jvp: bool, forward=None) -> tuple[str, float, float]:
    """How a part's non-finite positions must agree (a `NONFINITE` key), and its rows' least scale, as a fraction
    of the whole part (`tolerances.part_fraction`) and absolute (`tolerances.least_scale`): forward values
    exactly (by position with scattered ±inf inputs); derivatives by position, or at finite positions only for a
    gradient whose reference is by forward mode."""
    if part not in DERIVATIVES:
        return ("positions" if _scattered_inf(case) else "exact"), 0.0, 0.0
    nonfinite = "finite_only" if part == "grad" and grad_by_jvp else "positions"
    magnitude = case.values.magnitude
    return nonfinite, tolerances.part_fraction(case.dtype, magnitude), tolerances.least_scale(magnitude,
                                                                                               _largest(forward))


def _largest(tree) -> float:
    """The largest finite |value| of a tree's float leaves; 0 for None."""
    leaves = [_as_real(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree) if is_float(np.asarray(x))]
    return max((float(np.abs(x)[np.isfinite(x)].max(initial=0)) for x in leaves), default=0.0)


def _grad_by_jvp(case: Case) -> bool:
    return bool(FORWARD_MODE_GRAD_FLAGS & set(case.graph.flags))


def _crash(case, backend, part, exc) -> Failure:
    return Failure(case, backend, part, "rejects" if is_named_error(exc) else "crash", _one_line(exc),
                   crash_site(exc))


def check_transform(case: Case, transform: str, backends=BACKENDS, reassociated: bool = False) -> list[Failure]:
    """One transform of the layer against the reference's: the forward pass under ``vmap`` (over two stacked
    parameter sets) or ``shard_map``, or ``hvp``, the second derivative (forward over reverse) along the case's
    tangents of the gradient of ``sum(out · cotangent)``; it is compared as a derivative (`_derivative_rules`).
    """
    ops = operands(case)
    if transform == "vmap":
        ops = dataclasses.replace(ops, params=jax.tree_util.tree_map(lambda p: np.stack([p, p[::-1]]), ops.params))
    nonfinite, fraction, least, ref_mode = "exact", 0.0, 0.0, transform
    tainted_forward = False
    if transform == "hvp":
        try:
            ops = with_cotangent(ops, out_shapes(case.program, ops, case.dtype), case.values.seed)
        except Exception as exc:
            return [_reference_failure(case, "program", exc)]
        ops = _untainted_cotangent(ops, tainted_outputs(case, ops, reassociated))
        grad_by_jvp = _grad_by_jvp(case)
        nonfinite, fraction, least = _derivative_rules(case, "grad", grad_by_jvp)
        ref_mode = "hvp_by_jvp" if grad_by_jvp else "hvp"
    else:  # a forward pass: its own NaN reference values are the tainted outputs
        tainted_forward = reassociated and _scattered_inf(case)
    ref, exc = run(case.program, "reference", ref_mode, ops, case.dtype)
    if exc is not None:
        return [_reference_failure(case, transform, exc)]
    failures = []
    for backend in backends:
        got, exc = run(case.program, backend, transform, ops, case.dtype)
        if exc is not None:
            failures.append(_crash(case, backend, transform, exc))
            continue
        if tainted_forward:
            got = _untainted(got, ref, jax.tree_util.tree_map(_nan_positions, ref))
        res = compare_trees(ref, got, case.dtype, lambda: ref, nonfinite, fraction, least)
        if res is not None and (eager := _eager_transform(case, ref_mode, ops)) is not None and \
                compare_trees(eager, got, case.dtype, lambda: eager, nonfinite, fraction, least) is None:
            res = None  # as the program computes it op by op (`Oracle.eager`)
        if res is not None:
            failures.append(Failure(case, backend, transform, res[0], res[2], res[1]))
    return failures


def _eager_transform(case: Case, mode: str, ops: Operands):
    """The reference's ``mode`` run op by op (`jax.disable_jit`), or None where that fails: the second opinion
    `Oracle.eager` gives the parts, for a transform (campaign 20261128: under ``vmap`` the jitted reference made
    NaN of the one-edge rows that `destination_softmax_reference_recomputes` pins)."""
    with jax.disable_jit():
        out, exc = run(case.program, "reference", mode, ops, case.dtype)
    return None if exc is not None else out


# Fallbacks that are known and open (the answer is the reference's; only the speed is lost), by reason code:
# the program features that explain them. Rows gathered by an index array passed as its own argument are not
# known to line up with the graph's edges, so combining them with edge data (`x[idx] @ W[edge_type]`) mixes rows
# (issue 12, class (q), second half). Every other fallback is a failure.
# Per-edge key data (`jax.random.uniform(edge["key"], ...)`) has no residency rule for the random primitives
# (`random_wrap`, `random_bits`) yet, so its region stays as traced.
KNOWN_FALLBACKS = {jgnn.Reason.MIXES_ROWS: frozenset({"gather_idx_arg"}),
                   jgnn.Reason.UNKNOWN_PRIMITIVE: frozenset({"edge_key"})}


def check_explain(case: Case) -> tuple[list[Failure], jgnn.Report | None]:
    """The reference program, compiled and explained, must have no fallback region but the `KNOWN_FALLBACKS`.
    Returns the failures and the report (None if explain crashed)."""
    model = _model(case.program)
    built = build_inputs(case.program.signature, case.graph, case.values, np.dtype(dtype_of(case.dtype)))
    params = make_params(case.program, dtype_of(case.dtype), case.values.seed)
    try:
        with x64(case.dtype):
            report = jgnn.explain(lambda inputs, p: model("reference", inputs, p), built.inputs, params)
    except Exception as exc:
        return [Failure(case, "xla", "explain", "crash", _one_line(exc), crash_site(exc))], None
    fallbacks = [f for f in report.fallbacks if not case.program.features & KNOWN_FALLBACKS.get(f.code, frozenset())]
    if fallbacks:
        return [Failure(case, "xla", "explain", "fallback", f"{len(report.fallbacks)} fallback region(s): "
                        + "; ".join(repr(f) for f in fallbacks)[:300])], report
    return [], report


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:240] if text else ''}"


# ---- one batch ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class BatchResult:
    cases: int
    failures: list[Failure]


@dataclasses.dataclass(frozen=True)
class Target:
    """While shrinking one bug: check only what can reproduce it, and stop as soon as it does."""

    kind: str
    part: str
    backend: str

    @classmethod
    def of(cls, f: Failure) -> Target:
        return cls(f.kind, f.mode, f.backend)

    def matches(self, f: Failure) -> bool:
        return (f.kind, f.mode, f.backend) == (self.kind, self.part, self.backend)


def check_cuda_lowering(case: Case) -> list[Failure]:
    """The ``pallas`` backend's training step (its ``vjp``) lowers for CUDA, with no GPU (`jax.export`). The
    interpreter runs ops that Pallas' Triton lowering rejects (a ``slice``, a wide ``concatenate``), so only this
    check, or a GPU, finds them. A case the reference cannot run, or whose step raises a named jgnn error, is
    not checked."""
    from pallas_kernels import compat as pk_compat

    program, dtype = case.program, case.dtype
    ops = operands(case)
    try:
        ops = with_cotangent(ops, out_shapes(program, ops, dtype), case.values.seed)
    except Exception:  # noqa: BLE001 - the reference's own failure is check_case's to report
        return []
    step = functools.partial(_compiled(program, "pallas", "vjp"), ops.treedef, ops.mask)
    try:
        with x64(dtype):
            pk_compat.export_cuda_mlir(step, ops.floats, ops.others, ops.params, ops.cotangent)
    except Exception as exc:  # noqa: BLE001 - every lowering failure is data for the checker
        if is_named_error(exc):
            return []
        return [Failure(case, "pallas", "cuda_lowering", "crash", f"{type(exc).__name__}: {exc}"[:500],
                        crash_site(exc))]
    return []


def check_batch(batch: Batch, *, stop_at_first: bool = False, target: Target | None = None) -> BatchResult:
    """Check every case of a batch (the explain report, every case, then the transform).

    With ``stop_at_first``, return after the first failing case. With a ``target``, run only the checks that
    can give that failure (its backend, its part) and return once it is found; other failures are dropped.
    """
    backends = BACKENDS if target is None else tuple(b for b in BACKENDS if b == target.backend)
    wanted = target.matches if target else (lambda f: True)
    stop = stop_at_first or target is not None
    failures: list[Failure] = []
    cases = batch.cases()
    done = 0
    with _unfiltered_tracebacks():
        explained, report = check_explain(cases[0])  # one program per batch: its plan's rewrites
        reassociated = report is not None and reassociates(report)
        if target is None or target.part == "explain":
            failures += [f for f in explained if wanted(f)]
        for case in cases:
            if failures and stop:
                break
            if target is None or target.part not in ("explain", "vmap", "shard_map"):
                failures += [f for f in check_case(case, backends, reassociated) if wanted(f)]
            done += 1
        if batch.transform and (target is None or target.part == batch.transform) and not (failures and stop):
            failures += [f for f in check_transform(cases[0], batch.transform, backends, reassociated)
                         if wanted(f)]
        if (target is None or target.part == "cuda_lowering") and not (failures and stop):
            failures += [f for f in check_cuda_lowering(cases[0]) if wanted(f)]  # one program per batch
    return BatchResult(done, failures)


@contextlib.contextmanager
def _unfiltered_tracebacks():
    """Keep JAX-internal frames, so `is_named_error` sees who really raised."""
    old = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    try:
        yield
    finally:
        jax.config.update("jax_traceback_filtering", old)
