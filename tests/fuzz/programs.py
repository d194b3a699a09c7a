"""Programs for the fuzzer: Python source that defines ``model(backend, inputs, params)``.

A program is generated as source text, so the same text runs in the fuzzer and prints in the reproducer.
``model`` takes a backend name, the input pytree (``{"graph": GraphsTuple, ...extras}``) and a dict of float
parameters, and returns a pytree of arrays. Message-passing programs build ``jgnn.message_passing(phi, rho,
psi, backend=backend)``; raw jraph programs wrap a plain function in ``jgnn.compile(fn, backend=backend)``.

`Emitter` builds a per-edge or per-node function body one value at a time, tracking each value's per-item
shape and kind (float or int), so every emitted program is valid by construction. The op tables below list
what it may emit; `strategies` draws from them.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap

from tests.fuzz.graphs import Signature

HEADER = "import jax\nimport jax.numpy as jnp\nimport jraph\n\nimport jgnn\n"


@dataclasses.dataclass(frozen=True)
class Program:
    """Source defining ``model(backend, inputs, params)``, what it reads and the params it needs.

    ``features`` are tags naming what the program contains (``"typed_weight"``, ``"softmax"``, ...); failure
    signatures use them. ``complex_ok`` says whether every op supports complex dtypes.
    """

    family: str
    source: str
    signature: Signature
    params: tuple[tuple[str, tuple[int, ...]], ...]
    features: frozenset = frozenset()
    complex_ok: bool = False
    takes_layout: bool = False

    def __repr__(self) -> str:  # hypothesis prints failing examples: keep it short (the reproducer has the source)
        return (f"Program({self.family!r}, params={dict(self.params)}, features={sorted(self.features)}, "
                f"source_lines={self.source.count(chr(10))})")

    def _repr_pretty_(self, printer, cycle) -> None:  # hypothesis's printer: use the short repr
        printer.text(repr(self))

    def load(self):
        """``model`` from the source (executed in a fresh namespace)."""
        namespace: dict = {}
        exec(compile(HEADER + self.source, f"<fuzz program {abs(hash(self.source)):x}>", "exec"), namespace)
        return namespace["model"]


@dataclasses.dataclass(frozen=True)
class Val:
    """A value inside a per-item function: its name, per-item shape and kind ("f" float, "i" int)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "f"

    @property
    def size(self) -> int:
        return math.prod(self.shape)


# Elementwise ops: name -> (template, complex-safe). Unary templates take {x}; binary ones {a} and {b}.
UNARY = {
    "tanh": ("jnp.tanh({x})", True),
    "exp": ("jnp.exp({x})", True),
    "log": ("jnp.log({x})", True),
    "log1p_abs": ("jnp.log1p(jnp.abs({x}))", False),
    "abs": ("jnp.abs({x})", False),
    "relu": ("jax.nn.relu({x})", False),
    "leaky_relu": ("jax.nn.leaky_relu({x}, 0.2)", False),
    "sigmoid": ("jax.nn.sigmoid({x})", False),
    "square": ("{x} * {x}", True),
    "plus_one": ("{x} + 1.0", True),
    "half": ("{x} * 0.5", True),
}
BINARY = {
    "add": ("{a} + {b}", True),
    "sub": ("{a} - {b}", True),
    "mul": ("{a} * {b}", True),
    "maximum": ("jnp.maximum({a}, {b})", False),
    "where": ("jnp.where({a} > 0, {a}, {b})", False),
}
# Mailbox reductions of one message leaf in rho: name -> (template over mailbox value m, complex-safe).
REDUCE = {
    "sum": ("jgnn.sum({m})", True),
    "mean": ("jgnn.mean({m})", True),
    "max": ("jgnn.max({m})", False),
    "min": ("jgnn.min({m})", False),
    "sum_tanh": ("jgnn.sum(jnp.tanh({m}))", True),
    "range": ("jgnn.max({m}) - jgnn.min({m})", False),
    "normalised": ("jgnn.sum({m}) / (1.0 + jgnn.sum(jnp.abs({m})))", False),
    "mean_by_degree": ("jgnn.sum({m}) / jnp.maximum(jgnn.sum(jnp.ones_like({m}[:, :1])), 1.0)", True),
}
# Softmax-weighted sums of a value leaf v [deg, H, D] by logits l [deg, H]: name -> template.
ATTENTION = {
    "softmax": "jgnn.sum(jgnn.softmax({l})[..., None] * {v})",
    "softmax_scaled": "jgnn.sum(jgnn.softmax({l} * 0.5)[..., None] * {v})",
    "softmax_of_softmax": "jgnn.sum(jgnn.softmax(jgnn.softmax({l}))[..., None] * {v})",
    "softmax_plus_max": "jgnn.sum(jgnn.softmax({l})[..., None] * {v}) + jgnn.max({v})",
}


class Emitter:
    """Accumulates the lines of one function body; hands out fresh names and parameter shapes."""

    def __init__(self, prefix: str, params: dict[str, tuple[int, ...]]):
        self.prefix = prefix
        self.lines: list[str] = []
        self.params = params  # shared with the other emitters of the same program
        self.count = 0
        self.features: set[str] = set()

    def fresh(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count}"

    def param(self, shape: tuple[int, ...]) -> str:
        name = f"W{len(self.params)}"
        self.params[name] = tuple(shape)
        return f'P["{name}"]'

    def let(self, expr: str, shape: tuple[int, ...], kind: str = "f") -> Val:
        v = Val(self.fresh(), tuple(shape), kind)
        self.lines.append(f"{v.name} = {expr}")
        return v

    # ---- ops on per-item values ----------------------------------------------------------------------------

    def linear(self, x: Val, width: int) -> Val:
        self.features.add("matmul")
        return self.let(f"{self.flat(x)} @ {self.param((x.size, width))}", (width,))

    def typed_linear(self, x: Val, t: Val, types: int, width: int) -> Val:
        self.features.add("typed_weight")
        return self.let(f"{self.flat(x)} @ {self.param((types, x.size, width))}[{t.name}]", (width,))

    def flat(self, x: Val) -> str:
        return x.name if len(x.shape) == 1 else f"{x.name}.reshape({x.size})"

    def unary(self, op: str, x: Val) -> Val:
        self.features.add(op)
        return self.let(UNARY[op][0].format(x=x.name), x.shape)

    def binary(self, op: str, a: Val, b: Val) -> Val:
        self.features.add(op)
        return self.let(BINARY[op][0].format(a=a.name, b=b.name), broadcast(a.shape, b.shape))

    def concat(self, a: Val, b: Val) -> Val:
        self.features.add("concat")
        return self.let(f"jnp.concatenate([{self.flat(a)}, {self.flat(b)}])", (a.size + b.size,))

    def split(self, x: Val) -> Val:
        self.features.add("split")
        return self.let(f"jnp.split({self.flat(x)}, 2)[1]", (x.size // 2,))

    def heads(self, x: Val, h: int) -> Val:
        self.features.add("heads")
        return self.let(f"{x.name}.reshape({h}, {x.size // h})", (h, x.size // h))

    def stack(self, a: Val, b: Val) -> Val:
        self.features.add("stack")
        return self.let(f"jnp.stack([{a.name}, {b.name}])", (2,) + a.shape)

    def head_logit(self, z: Val) -> Val:
        """[H, D] -> [H]: per-head dot product with an attention vector (GAT's a^T z)."""
        self.features.add("head_logit")
        return self.let(f"jnp.sum({z.name} * {self.param(z.shape)}, -1)", z.shape[:1])

    def int_combine(self, a: Val, b: Val, b_count: int) -> Val:
        """Integer arithmetic on types: a * b_count + b indexes a weight with types_a * b_count rows."""
        self.features.add("int_arith")
        return self.let(f"{a.name} * {b_count} + {b.name}", (), "i")

    def int_to_float(self, t: Val, like: Val) -> Val:
        self.features.add("int_arith")
        return self.let(f"{like.name} * ({t.name} + 1).astype({like.name}.dtype)", like.shape)

    def big_int_message(self, t: Val) -> Val:
        """An int32 message above 2**24 (exact in int32, not in float32)."""
        self.features.add("int_message")
        return self.let(f"{t.name} * 16777217 + 3", (), "i")

    def dropout(self, x: Val, key_expr: str, feature: str) -> Val:
        """Inverted dropout with a closed-over key or per-edge raw key data (float32 uniform draws)."""
        self.features.add(feature)
        keep = f"(jax.random.uniform({key_expr}, {x.shape}, jnp.float32) < 0.75)"
        return self.let(f"jnp.where({keep}, {x.name} / 0.75, 0.0)", x.shape)

    def mask(self, logit: Val, flag: str) -> Val:
        """A −1e9 mask driven by an edge feature (GAT-style padding masks)."""
        self.features.add("mask_1e9")
        return self.let(f"jnp.where({flag} > 0, {logit.name}, -1e9)", logit.shape)


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for x, y in zip((1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b, strict=True):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def function(name: str, args: str, body: list[str], ret: str) -> str:
    lines = body + [f"return {ret}"]
    return f"def {name}({args}):\n" + textwrap.indent("\n".join(lines), "    ") + "\n"


def dict_expr(items: dict[str, str]) -> str:
    return "{" + ", ".join(f'"{k}": {v}' for k, v in items.items()) + "}"
