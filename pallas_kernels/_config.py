"""Block configurations chosen from the (padded) feature width.

Triton needs power-of-two tensor sizes, so widths are padded to ``next_pow2``. The edge chunk size keeps
one ``[block_edges, width]`` float32 tile around 4K elements (registers, not shared memory): wide features
get short chunks, narrow features long ones. Values are educated defaults pending GPU tuning.
"""
from __future__ import annotations

from typing import NamedTuple


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


class EdgeBlock(NamedTuple):
    block_edges: int  # edges per inner-loop chunk (power of two)
    num_warps: int
    num_stages: int


# (max padded tile width per edge, config); first row whose bound is >= the width wins.
_EDGE_TABLE: tuple[tuple[int, EdgeBlock], ...] = (
    (8, EdgeBlock(64, 2, 2)),
    (64, EdgeBlock(32, 4, 2)),
    (256, EdgeBlock(16, 4, 2)),
    (1024, EdgeBlock(4, 4, 1)),
    (1 << 30, EdgeBlock(2, 8, 1)),
)


def edge_block(width: int) -> EdgeBlock:
    """Config for an edge-chunked row walk whose per-edge tile has ``width`` padded elements."""
    for bound, cfg in _EDGE_TABLE:
        if width <= bound:
            return cfg
    raise AssertionError("unreachable")
