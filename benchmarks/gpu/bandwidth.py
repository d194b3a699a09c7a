"""Bandwidth probe for a GPU session: what the memory operations that graph kernels are made of reach.

    python -m benchmarks.gpu.bandwidth [--rows 1048576] [--out FILE.json]

On the attached GPU (or CPU if none): the copy bandwidth (``x + 1``), and for each width and dtype a row
gather ``x[idx]`` (4 random indices per row) and a sorted ``segment_sum`` of the gathered rows back to the
nodes, the two halves of a gather -> reduce. Each figure is bytes moved (every array read and written once)
over the median of the timed calls; ``fraction_of_copy`` compares it with the copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import measure

WIDTHS = (1, 8, 64, 602)
DTYPES = ("float32", "bfloat16")
FANOUT = 4  # gathered rows per node
MAX_BYTES = 1 << 30  # per feature array


def _gbps(nbytes: int, fn, args, repeats: int) -> float:
    ms = statistics.median(measure.time_jax(jax.jit(fn), args, warmup=2, repeats=repeats))
    return nbytes / (ms / 1e3) / 1e9


def probe(rows: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    out = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__,
           "copy_gbps": measure.copy_bandwidth(nbytes=512 << 20, repeats=repeats) / 1e9, "rows": []}
    for width, dtype in ((w, d) for w in WIDTHS for d in DTYPES):
        item = jnp.dtype(dtype).itemsize
        n = min(rows, MAX_BYTES // (width * item))
        e = FANOUT * n
        x = jnp.asarray(rng.normal(size=(n, width)), dtype)
        idx = jnp.asarray(rng.integers(0, n, e), jnp.int32)
        seg = jnp.asarray(np.sort(rng.integers(0, n, e)), jnp.int32)
        msgs = x[idx]
        gather = _gbps(e * 4 + 2 * e * width * item, lambda x, i: x[i], (x, idx), repeats)
        scatter = _gbps(e * 4 + (e + n) * width * item,
                        lambda m, s: jax.ops.segment_sum(m, s, n, indices_are_sorted=True), (msgs, seg), repeats)
        out["rows"].append({"width": width, "dtype": dtype, "nodes": n, "edges": e, "gather_gbps": gather,
                            "segment_sum_gbps": scatter, "gather_fraction_of_copy": gather / out["copy_gbps"],
                            "segment_sum_fraction_of_copy": scatter / out["copy_gbps"]})
        del x, idx, seg, msgs
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1 << 20)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    result = probe(args.rows, args.repeats)
    print(f"{result['device']}: copy {result['copy_gbps']:.1f} GB/s")
    for r in result["rows"]:
        print(f"  width {r['width']:>4} {r['dtype']:>8}: gather {r['gather_gbps']:7.1f} GB/s "
              f"({r['gather_fraction_of_copy']:.2f} of copy), segment_sum {r['segment_sum_gbps']:7.1f} GB/s "
              f"({r['segment_sum_fraction_of_copy']:.2f})")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
