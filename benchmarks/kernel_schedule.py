"""Kernel schedules before and after segment scheduling, on CPU: programs, serial chunks on the longest program,
masked-lane fraction, barriers and bytes per edge, for Cora, a zipf graph with a ~23k in-degree hub and an
ogbn-arxiv-sized R-MAT graph.

"before" is the schedule of the row-per-program kernels (commit 6464ad4), computed from their code: one program
per destination row, ``block`` slots per chunk from their width table, one cross-warp reduction per chunk
(4 bar.sync in gather_reduce, 10 in attention, read from their PTX in issue 14). "after" is
:func:`pallas_kernels.describe.describe_schedule` on the CSR the builders make today. Neither runs a kernel.

    JGNN_DATA_DIR=/work/shared/data python -m benchmarks.kernel_schedule
"""
from __future__ import annotations

import math
import os
import pathlib

import numpy as np

import pallas_kernels as pk
from jgnn.datasets.synthetic import rmat_edges
from pallas_kernels._config import next_pow2
from pallas_kernels.describe import describe_schedule

# The row-per-program kernels' block table: (max padded tile elements per slot, slots per chunk).
OLD_BLOCKS = ((8, 64), (64, 32), (256, 16), (1024, 4), (1 << 30, 2))
OLD_BARRIERS_PER_CHUNK = {"gather_reduce": 4, "attention": 10}

# (label, kernel, describe_schedule shapes, padded tile elements per slot of the old kernel)
KERNELS = (
    ("gather_reduce F=1", "gather_reduce", dict(col=[(1,)], row=[(1,)]), 1),
    ("gather_reduce F=64", "gather_reduce", dict(col=[(64,)], row=[(64,)]), 64),
    ("gather_reduce F=602", "gather_reduce", dict(col=[(602,)], row=[(602,)]), 1024),
    ("attention 8x8", "attention", dict(col=[(8, 8), (8,)], row=[(8,)], heads=8, value_dim=8), 64),
)


def graphs(data_dir: pathlib.Path):
    cora = np.load(data_dir / "cora.npz")
    yield "Cora", cora["senders"], cora["receivers"], int(cora["num_nodes"])
    rng = np.random.default_rng(0)
    n, e = 5000, 60000
    yield "zipf (5k nodes, 60k edges)", rng.integers(0, n, e), np.minimum(rng.zipf(1.5, e), n - 10) - 1, n
    s, r = rmat_edges(169343, 1166243, np.random.default_rng(0))
    yield "R-MAT (ogbn-arxiv size)", s, r, 169343


def _elements(shapes) -> int:
    return sum(math.prod(t) for t in shapes)


def before(deg: np.ndarray, kernel: str, elements: int, shapes: dict) -> dict:
    block = next(b for bound, b in OLD_BLOCKS if elements <= bound)
    chunks = -(-deg // block)
    edges = int(deg.sum())
    out = shapes["heads"] * shapes["value_dim"] if kernel == "attention" else shapes["col"][0][0]
    # per slot: col and edge ids, col operand rows; per row: indptr twice, row_order, row operands, the output
    requested = edges * (8 + 4 * _elements(shapes["col"])) + deg.size * (12 + 4 * (_elements(shapes["row"]) + out))
    return dict(programs=deg.size, serial=int(chunks.max()), masked=1 - edges / (block * chunks.sum()),
                barriers=OLD_BARRIERS_PER_CHUNK[kernel] * chunks.sum() / edges, bytes=requested / edges)


def main() -> None:
    data_dir = pathlib.Path(os.environ.get("JGNN_DATA_DIR", "../shared/data"))
    print("| graph | kernel | programs | serial chunks (longest program) | masked-lane fraction | barriers / edge "
          "| bytes / edge (minimum) |")
    print("|---|---|---|---|---|---|---|")
    for name, s, r, n in graphs(data_dir):
        fwd, _ = pk.build_csr_numpy(s, r, n)
        deg = np.diff(np.asarray(fwd.indptr))
        name = f"{name}: N={n}, E={deg.sum()}, max in-degree {deg.max()}"
        for label, kernel, shapes, elements in KERNELS:
            old = before(deg, kernel, next_pow2(elements), shapes)
            new = describe_schedule(fwd, kernel=kernel, **shapes)
            combine = f" + {new.combine_programs} combine" if new.combine_programs else ""
            serial = f" (combine {new.combine_chunks})" if new.combine_programs else ""
            print(f"| {name} | {label} | {old['programs']} → {new.programs}{combine} | {old['serial']} → "
                  f"{new.serial_chunks}{serial} | {old['masked']:.3f} → {new.masked_lane_fraction:.3f} | "
                  f"{old['barriers']:.3f} → {new.barriers_per_edge:.3f} | {old['bytes']:.1f} → "
                  f"{new.bytes_per_edge:.1f} ({new.min_bytes_per_edge:.1f}) |")
            name = ""


if __name__ == "__main__":
    main()
