"""``python -m benchmarks.compare.loop_ids [CASE] [--rounds N]``: jgnn's step with the self-loop ids a layer
appends emitted as XLA ``concatenate`` (`jgnn.emit` off) and as ``dynamic_update_slice``s (`jgnn.emit`, the
default), against the hand-written program; forward and training step, interleaved rounds, medians in ms.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from benchmarks.compare import cases, systems
from benchmarks.compare.profile import compiled_step
from jgnn import emit


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("case", nargs="?", default="gcn/amazon_computers/train")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    case = next(c for c in cases.CPU + cases.QUICK if c.key == args.case)
    problem = case.load()
    params = systems.initial_params(case.model, problem)
    rules, calls, logits = dict(emit.RULES), {}, {}
    try:
        for variant, system in (("concatenate", "jgnn"), ("update_slices", "jgnn"), ("hand", "hand")):
            emit.RULES.clear()
            emit.RULES.update(rules if variant == "update_slices" else {})
            jax.clear_caches()  # compile afresh under these rules
            for mode in ("forward", "step"):
                _, calls[(variant, mode)] = compiled_step(system, case, problem, params, train=mode == "step")
                if mode == "forward":
                    logits[variant] = np.asarray(calls[(variant, mode)]())
    finally:
        emit.RULES.clear()
        emit.RULES.update(rules)
    print(f"max |logits difference| concatenate vs update_slices: "
          f"{float(np.abs(logits['concatenate'] - logits['update_slices']).max()):.1e}")
    times = {k: [] for k in calls}
    keys = list(calls)
    for i in range(args.rounds):  # interleaved, the order rotated each round
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            t0 = time.perf_counter()
            calls[k]()
            times[k].append((time.perf_counter() - t0) * 1e3)
    for (variant, mode), ms in times.items():
        print(f"{variant:14s} {mode:8s} median {np.median(ms):7.1f}  min {np.min(ms):7.1f}  max {np.max(ms):7.1f} ms")


if __name__ == "__main__":
    main()
