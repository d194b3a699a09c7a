"""The per-layer cost model: do cut edges send halo source rows, or partial aggregates per destination?

FlexGraph's two ways to cross a cut: (a) the receiver's part reads the sender's row (``halo`` rows × the input
width) and aggregates locally; (b) the sender's part aggregates its edges into each remote destination and sends
one partial row per (sender part, destination) pair (× the aggregate width, plus two statistics per head for a
softmax). The cheaper one in bytes wins; the choice is a `StrategyChoice` with a `Reason` code.
"""

from __future__ import annotations

import dataclasses

from jgnn.distributed.halo import PartitionedGraph
from jgnn.report import Reason

SOURCE, PARTIAL = "source", "partial"


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """``strategy``: ``"source"`` or ``"partial"`` (what runs); ``code``: why; ``source_bytes``/
    ``partial_bytes``: the bytes per step each would move over all parts (one direction, forward)."""

    layer: str
    strategy: str
    code: Reason
    source_bytes: int
    partial_bytes: int


def choose(pg: PartitionedGraph, *, layer: str, in_width: int, out_width: int, itemsize: int = 4,
           softmax_heads: int = 0, partials_supported: bool = False) -> StrategyChoice:
    """Pick the cheaper crossing for a layer reading ``in_width`` columns per sender and reducing into
    ``out_width`` columns per destination (``softmax_heads``: heads whose max and sum travel too).
    ``partials_supported``: whether the layer runs through `jgnn.distributed.aggregate` (an opaque layer does
    not, and sends source rows whatever the cost)."""
    source = sum(pg.stats.halo) * in_width * itemsize
    partial = sum(pg.remote_destinations) * (out_width + 2 * softmax_heads) * itemsize
    if partial < source and partials_supported:
        code, strategy = Reason.SEND_PARTIAL_AGGREGATES, PARTIAL
    elif partial < source:
        code, strategy = Reason.PARTIALS_NEED_AGGREGATE, SOURCE
    else:
        code, strategy = Reason.SEND_SOURCE_ROWS, SOURCE
    return StrategyChoice(layer, strategy, code, source, partial)
