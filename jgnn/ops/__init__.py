"""jgnn's graph primitives: each a JAX primitive with abstract eval, JVP, transpose, batching and lowering rules
registered side by side, and its facts in `jgnn.facts`.

* `gather`: broadcast rows along a graph index (node rows to edges, graph rows to nodes);
* `segment`: reduce rows by a graph index (sum, mean, max, min);
* `segment_softmax`: normalise edge scores over each node's incoming edges;
* `edge_op`: a fused gather → per-edge function → reduction (`EdgeSpec`), with its lowerings.
"""

from jgnn.ops.edge_op import EdgeSpec, Reduce, edge_op_p
from jgnn.ops.gather import gather, gather_p
from jgnn.ops.segment import segment, segment_p
from jgnn.ops.softmax import segment_softmax, segment_softmax_p

__all__ = ["EdgeSpec", "Reduce", "edge_op_p", "gather", "gather_p", "segment", "segment_p",
           "segment_softmax", "segment_softmax_p"]
