"""A measured system: its first call (trace, compile, first run) and a zero-argument step to time.

A `Runner` hides the framework: JAX runners call one compiled executable (parameters and Adam state donated and
fed back, as a training loop does); PyTorch runners call a Python step. ``enter`` runs before a runner's calls in
each round (PyG sets its thread count there).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

LEARNING_RATE = 0.01


@dataclasses.dataclass
class Runner:
    """``call()`` runs one step to completion and returns its loss (``None`` for inference). ``info`` holds
    the first-call times (s), memory (bytes) and the losses of the first two steps."""

    system: str
    call: Callable[[], float | None]
    enter: Callable[[], None] = lambda: None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def cross_entropy(logits, labels, index):
    """Mean softmax cross-entropy of ``logits[index]`` against ``labels[index]`` (works on JAX and NumPy)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[index], labels[index]).mean()


def xla_memory(compiled) -> dict[str, int]:
    """XLA's buffer assignment: ``memory_bytes`` = arguments + outputs + temp - aliased (donated) bytes."""
    m = compiled.memory_analysis()
    arg, out, tmp = int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.temp_size_in_bytes)
    alias = int(m.alias_size_in_bytes)
    return {"memory_bytes": arg + out + tmp - alias, "temp_bytes": tmp, "argument_bytes": arg, "output_bytes": out,
            "alias_bytes": alias, "memory_metric": "xla"}


def step(forward: Callable, params, labels, index, *, train: bool):
    """``(fn, state, donate)``: the function to jit (a training step ``fn(params, opt_state, *consts) -> (params,
    opt_state, loss)``, or the forward), its leading arguments ``state`` and their ``donate_argnums``."""
    if not train:
        return forward, [params], ()
    opt = optax.adam(LEARNING_RATE)

    def fn(p, opt_state, *args):
        loss, grads = jax.value_and_grad(lambda q: cross_entropy(forward(q, *args), labels, index))(p)
        updates, opt_state = opt.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    return fn, [params, opt.init(params)], (0, 1)


def jax_runner(system: str, forward: Callable, params, consts: tuple, labels, index, *, train: bool) -> Runner:
    """Compile and run once ``forward(params, *consts) -> logits [N, C]``: a training step (forward,
    backward, Adam) when ``train``, else the forward alone.

    ``info``: ``trace_s`` (tracing and lowering, where jgnn rewrites), ``compile_s`` (XLA), ``first_run_s``,
    the XLA memory figures and ``losses`` (the first two steps' loss; inference: the cross-entropy of its
    logits, computed on the host, and the ``logits`` themselves)."""
    labels, index = jax.device_put(labels), jax.device_put(index)
    fn, state, donate = step(forward, params, labels, index, train=train)
    t0 = time.perf_counter()
    lowered = jax.jit(fn, donate_argnums=donate).lower(*state, *consts)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    losses = []

    def call():
        out = jax.block_until_ready(compiled(*state, *consts))
        if not train:
            return None
        state[:] = out[:2]
        return float(out[2])

    losses.append(call() if train else None)
    t3 = time.perf_counter()
    info = {"trace_s": t1 - t0, "compile_s": t2 - t1, "first_run_s": t3 - t2, "first_call_s": t3 - t0,
            **xla_memory(compiled)}
    if train:
        losses.append(call())
    else:
        info["logits"] = np.asarray(compiled(*state, *consts))
        losses = [float(cross_entropy(info["logits"], np.asarray(labels), np.asarray(index)))]
    return Runner(system, call, info=info | {"losses": losses})
