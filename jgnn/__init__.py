"""jgnn: a JAX functional compiler for graph neural networks.

Write per-edge and per-node functions with `message_passing` (or plain jraph code), and jgnn infers where
every value lives on the graph, rewrites the program (broadcast reordering, linear splitting, fusion into
Pallas kernels, recomputation under ``grad``) and tells you why with `explain`.
"""

from jgnn import datasets, nn, ops
from jgnn.compiler import BACKENDS, Compiled, PlanCache, compile, explain
from jgnn.graph import validate
from jgnn.layout import GraphLayout, LayoutMismatchError
from jgnn.mailbox import UnsupportedMailboxOp, max, mean, min, softmax, sum
from jgnn.message_passing import MessagePassing, message_passing
from jgnn.report import Pass, Reason, Report

__all__ = [
    "BACKENDS", "Compiled", "GraphLayout", "LayoutMismatchError", "MessagePassing", "Pass", "PlanCache", "Reason",
    "Report", "UnsupportedMailboxOp", "compile", "datasets", "explain", "max", "mean", "message_passing", "min",
    "nn", "ops", "softmax", "sum", "validate",
]
__version__ = "0.2.0"
