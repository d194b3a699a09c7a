"""Static tile and schedule parameters, chosen from shapes only (so host-built and traced CSRs agree).

Triton needs power-of-two tensor sizes, so trailing dimensions are padded to ``next_pow2``. One chunk is a
``[block, *tile]`` register tile: ``block`` CSR slots, each with its operands' tiles. Wide features are split
across programs (a second grid axis) so that a slot's tile stays at most ``FEATURE_BLOCK`` elements for the
lane-wise gather kernels; attention splits its heads the same way. Values are educated defaults pending GPU
tuning.
"""
from __future__ import annotations

import math
from typing import NamedTuple

#: Longest serial walk of one segment, in chunks: rows longer than ``segment_slots`` are cut into pieces that run
#: in different programs and are combined afterwards. Small graphs get shorter segments (down to
#: ``MIN_SEGMENT_CHUNKS``, which keeps the partials' traffic near 1/8 of the edges'): their total work spread
#: over the GPU's resident programs is a few chunks each, so a long segment would be the whole critical path.
MAX_SEGMENT_CHUNKS = 32
MIN_SEGMENT_CHUNKS = 8
#: Programs resident at once on the target GPU (8 four-warp programs on each of an H100's 132 SMs).
RESIDENT_PROGRAMS = 1056
#: Programs the main grid should have at least (two per SM of a 132-SM H100): rows are packed several to a
#: program only as long as this many programs remain.
MIN_PROGRAMS = 264
#: The chunk size the lane rule assumes (the block of every tile up to 128 elements per slot).
REFERENCE_BLOCK = 32
#: Most elements of the split axis one program handles per slot (gather kernels: feature lanes).
FEATURE_BLOCK = 128


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


class EdgeBlock(NamedTuple):
    block_edges: int  # slots per chunk (power of two)
    num_warps: int
    num_stages: int


# (max padded tile elements per slot, config); the first row whose bound is >= the slot's elements wins.
_EDGE_TABLE: tuple[tuple[int, EdgeBlock], ...] = (
    (8, EdgeBlock(64, 2, 2)),
    (128, EdgeBlock(32, 4, 2)),
    (256, EdgeBlock(16, 4, 2)),
    (1024, EdgeBlock(4, 4, 1)),
    (1 << 30, EdgeBlock(2, 8, 1)),
)


def edge_block(elements: int) -> EdgeBlock:
    """Config for a chunked walk whose per-slot tile has ``elements`` padded elements."""
    return next(cfg for bound, cfg in _EDGE_TABLE if elements <= bound)


def segment_lanes(num_rows: int) -> int:
    """Slots each segment gets per chunk: ``block / lanes`` segments share one chunk.

    Few lanes per segment waste few masked lanes (a row of degree 3 fills 3 of 4 lanes, not 3 of 32) but pack
    more rows into a program; the smallest power of two that still leaves ``MIN_PROGRAMS`` programs wins.
    """
    need = math.ceil(MIN_PROGRAMS * REFERENCE_BLOCK / max(num_rows, 1))
    return min(next_pow2(need), REFERENCE_BLOCK)


def segment_slots(num_rows: int, nnz: int) -> int:
    """Most slots of one segment: enough chunks of ``segment_lanes`` slots that the walk's chunks, spread over
    ``RESIDENT_PROGRAMS``, fit in one segment, clamped to [``MIN_SEGMENT_CHUNKS``, ``MAX_SEGMENT_CHUNKS``]."""
    lanes = segment_lanes(num_rows)
    chunks = next_pow2(math.ceil(nnz / (lanes * RESIDENT_PROGRAMS)))
    return lanes * min(max(chunks, MIN_SEGMENT_CHUNKS), MAX_SEGMENT_CHUNKS)


def split_block(size: int, per_element: int, budget: int = FEATURE_BLOCK) -> int:
    """Power-of-two block of a split axis of padded ``size`` whose ``block * per_element`` fits ``budget``."""
    block = next_pow2(size)
    while block > 1 and block * per_element > budget:
        block //= 2
    return block
