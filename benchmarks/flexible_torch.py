"""The torch / PyG system of `benchmarks.flexible`: each flexible-neighbourhood model as a PyG user writes it.

* JK-Net: PyG's own ``torch_geometric.nn.models.GCN(..., jk="cat")`` (``GCNConv`` layers, ReLU after each,
  ``JumpingKnowledge("cat")``, a final ``Linear``), as `jgnn.nn.JKNet` mirrors it;
* PinSage, P-GNN and MAGNN (no PyG layer): ``torch.nn.Linear`` layers and edge-list gathers
  (``index_select``) with ``torch_geometric.utils.scatter`` / ``softmax``, the DGL-example style; P-GNN's
  layer is the authors' dense ``[N, K]`` gather.

Every module loads the jgnn model's Flax parameters (a Flax ``kernel`` ``[in, out]`` is a torch ``weight``
``[out, in]``) and reads the same inputs and neighbourhood arrays. `measure` checks the forward output against
jgnn's before it times anything, then times one train step (forward, loss, backward; no optimizer, as the JAX
steps) with ``THREADS`` intra-op threads and measures its memory as `benchmarks.compare.pyg` does.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GCN
from torch_geometric.utils import scatter, softmax

from benchmarks.compare.pyg import profiled_peak, tensor_bytes
from benchmarks.measure import time_torch

THREADS = 2


def tensor(a, dtype=None) -> torch.Tensor:
    """A torch copy of a JAX / NumPy array (indices as int64, PyG's index dtype)."""
    a = np.array(a)
    if np.issubdtype(a.dtype, np.integer):
        dtype = dtype or torch.int64
    return torch.as_tensor(a, dtype=dtype)


def _linear(dense) -> dict[str, np.ndarray]:
    """A Flax Dense's ``{kernel, bias}`` as torch ``Linear`` state (``weight`` is the kernel transposed)."""
    out = {"weight": np.asarray(dense["kernel"], np.float32).T}
    if "bias" in dense:
        out["bias"] = np.asarray(dense["bias"], np.float32)
    return out


def _load(module: torch.nn.Module, state: dict[str, np.ndarray]) -> torch.nn.Module:
    module.load_state_dict({k: torch.as_tensor(np.array(v, np.float32)) for k, v in state.items()}, strict=True)
    return module


def _prefixed(prefix: str, state: dict) -> dict:
    return {f"{prefix}.{k}": v for k, v in state.items()}


# ---- JK-Net: PyG's GCN with jk="cat" ------------------------------------------------------------------------

def jknet(params, num_features: int, hidden: int, num_classes: int, num_layers: int = 2) -> torch.nn.Module:
    """``GCN(F, hidden, num_layers, num_classes, jk="cat")`` holding `jgnn.nn.JKNet`'s ``params``; called as
    ``model(x, edge_index)``."""
    model = GCN(num_features, hidden, num_layers=num_layers, out_channels=num_classes, jk="cat")
    state = {}
    for i in range(num_layers):
        conv = params[f"conv{i}"]
        state |= {f"convs.{i}.lin.weight": np.asarray(conv["kernel"]).T, f"convs.{i}.bias": np.asarray(conv["bias"])}
    return _load(model, state | _prefixed("lin", _linear(params["lin"])))


# ---- PinSage: DGL's WeightedSAGEConv over the random-walk neighbours as an edge list ------------------------

class PinSageConv(torch.nn.Module):
    def __init__(self, in_features: int, hidden: int, features: int):
        super().__init__()
        self.Q = torch.nn.Linear(in_features, hidden)
        self.W = torch.nn.Linear(in_features + hidden, features)

    def forward(self, h, src, dst, importance):
        msg = torch.relu(self.Q(h)).index_select(0, src) * importance  # [M, H]
        agg = scatter(msg, dst, dim=0, dim_size=h.shape[0], reduce="sum")
        z = torch.relu(self.W(torch.cat([h, agg], -1)))
        norm = z.norm(2, -1, keepdim=True)
        return z / torch.where(norm == 0, torch.ones_like(norm), norm)


class PinSage(torch.nn.Module):
    """``num_layers`` `PinSageConv` of width ``hidden`` and a ``Linear``; called as ``model(x, src, dst,
    importance)`` with the neighbourhood as edges ``src -> dst`` weighted by ``importance`` ``[M, 1]``."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, num_layers: int = 2):
        super().__init__()
        dims = [in_features] + [hidden] * num_layers
        self.convs = torch.nn.ModuleList(PinSageConv(dims[i], hidden, hidden) for i in range(num_layers))
        self.lin = torch.nn.Linear(hidden, num_classes)

    def forward(self, x, src, dst, importance):
        h = x
        for conv in self.convs:
            h = conv(h, src, dst, importance)
        return self.lin(h)


def pinsage(params, in_features: int, hidden: int, num_classes: int, num_layers: int = 2) -> PinSage:
    state = _prefixed("lin", _linear(params["lin"]))
    for i in range(num_layers):
        p = params[f"conv{i}"]
        for name in ("Q", "W"):
            state |= _prefixed(f"convs.{i}.{name}", _linear({"kernel": p[f"{name}_kernel"], "bias": p[f"{name}_bias"]}))
    return _load(PinSage(in_features, hidden, num_classes, num_layers), state)


# ---- P-GNN: the authors' PGNN_layer (dense [N, K] anchors) ---------------------------------------------------

class PGNNConv(torch.nn.Module):
    def __init__(self, in_features: int, features: int):
        super().__init__()
        self.hidden = torch.nn.Linear(2 * in_features, features)
        self.position = torch.nn.Linear(features, 1, bias=False)

    def forward(self, h, anchors, s):
        n, k = anchors.shape
        near = h.index_select(0, anchors.reshape(-1)).reshape(n, k, -1) * s.unsqueeze(-1)
        own = h.unsqueeze(1).expand(-1, k, -1)
        msg = torch.relu(self.hidden(torch.cat([near, own], -1)))  # [N, K, F]
        return self.position(msg).squeeze(-1), msg.mean(1)


class PGNN(torch.nn.Module):
    """A ``Linear`` pre-layer and ``num_layers`` `PGNNConv`; the last position-aware output, L2-normalised.
    Called as ``model(x, anchors [N, K], s [N, K])``."""

    def __init__(self, in_features: int, hidden: int, num_layers: int = 2):
        super().__init__()
        self.pre = torch.nn.Linear(in_features, hidden)
        self.convs = torch.nn.ModuleList(PGNNConv(hidden, hidden) for _ in range(num_layers))

    def forward(self, x, anchors, s):
        h = self.pre(x)
        position = None
        for conv in self.convs:
            position, h = conv(h, anchors, s)
        return F.normalize(position, p=2.0, dim=-1)


def pgnn(params, in_features: int, hidden: int, num_layers: int = 2) -> PGNN:
    state = _prefixed("pre", _linear(params["pre"]))
    for i in range(num_layers):
        p = params[f"conv{i}"]
        state |= _prefixed(f"convs.{i}.hidden", _linear({"kernel": p["hidden_kernel"], "bias": p["hidden_bias"]}))
        state |= _prefixed(f"convs.{i}.position", _linear({"kernel": p["position_kernel"]}))
    return _load(PGNN(in_features, hidden, num_layers), state)


# ---- MAGNN: the rotation encoder and both attentions with gathers, scatter and PyG's segment softmax ---------

class MAGNN(torch.nn.Module):
    """`jgnn.nn.MAGNN` (rotation encoder): called as ``model(features, inst_nodes, inst_of, coef, inst,
    group, metapath_of)`` with level 0 as edges node ``inst_nodes`` -> instance ``inst_of`` (relation
    coefficients ``coef``), level 1 as edges instance ``inst`` -> group ``group = p * N + v`` of metapath
    ``metapath_of``."""

    def __init__(self, features: dict, num_nodes: dict, hidden: int, num_classes: int, num_relations: int,
                 num_metapaths: int, num_instances: int, attention_dim: int = 128):
        super().__init__()
        self.types = list(num_nodes)
        self.hidden, self.num_p, self.num_instances = hidden, num_metapaths, num_instances
        self.num_targets = num_nodes[self.types[0]]  # the target type comes first in the node table
        self.project = torch.nn.ModuleDict({t: torch.nn.Linear(features[t].shape[1], hidden)
                                            for t in self.types if features.get(t) is not None})
        self.embed = torch.nn.ParameterDict({t: torch.nn.Parameter(torch.empty(num_nodes[t], hidden))
                                             for t in self.types if features.get(t) is None})
        self.relation_angles = torch.nn.Parameter(torch.empty(num_relations, hidden // 2))
        self.intra_attention = torch.nn.Parameter(torch.empty(num_metapaths, 2 * hidden))
        self.inter_M = torch.nn.Linear(hidden, attention_dim)
        self.inter_q = torch.nn.Parameter(torch.empty(attention_dim, 1))
        self.classifier = torch.nn.Linear(hidden, num_classes)

    def forward(self, features, inst_nodes, inst_of, coef, inst, group, metapath_of):
        x = torch.cat([self.project[t](features[t]) if t in self.project else self.embed[t] for t in self.types])
        n, p, half = self.num_targets, self.num_p, self.hidden // 2
        # level 0: rotate each instance node by its position's relation angles, mean per instance
        angle = coef @ self.relation_angles
        re, im = x.index_select(0, inst_nodes).split(half, -1)
        cos, sin = torch.cos(angle), torch.sin(angle)
        rotated = torch.cat([re * cos - im * sin, re * sin + im * cos], -1)
        instance = scatter(rotated, inst_of, dim=0, dim_size=self.num_instances, reduce="mean")
        # level 1: intra-metapath attention of target v over its instances of metapath p (group p * N + v)
        a = self.intra_attention.index_select(0, metapath_of)
        h_inst = instance.index_select(0, inst)
        target = x[:n].index_select(0, group % n)
        score = F.leaky_relu((a[:, :self.hidden] * target).sum(-1) + (a[:, self.hidden:] * h_inst).sum(-1), 0.2)
        alpha = softmax(score, group, num_nodes=p * n)
        per_metapath = F.elu(scatter(alpha.unsqueeze(-1) * h_inst, group, dim=0, dim_size=p * n, reduce="sum"))
        # level 2: inter-metapath attention
        beta = torch.softmax((torch.tanh(self.inter_M(per_metapath)) @ self.inter_q).reshape(p, n).mean(1), 0)
        h = torch.einsum("p,pnd->nd", beta, per_metapath.reshape(p, n, -1))
        return self.classifier(h)


def magnn(params, features: dict, num_nodes: dict, hidden: int, num_classes: int, num_relations: int,
          num_metapaths: int, num_instances: int) -> MAGNN:
    model = MAGNN(features, num_nodes, hidden, num_classes, num_relations, num_metapaths, num_instances,
                  attention_dim=params["inter_q"].shape[0])
    state = {"relation_angles": params["relation_angles"], "intra_attention": params["intra_attention"],
             "inter_q": params["inter_q"]} | _prefixed("inter_M", _linear(params["inter_M"])) \
        | _prefixed("classifier", _linear(params["classifier"]))
    for t in num_nodes:
        state |= _prefixed(f"project.{t}", _linear(params[f"project_{t}"])) if f"project_{t}" in params \
            else {f"embed.{t}": params[f"embed_{t}"]}
    return _load(model, {k: np.asarray(v, np.float32) for k, v in state.items()})


# ---- measurement --------------------------------------------------------------------------------------------

def cross_entropy(labels: torch.Tensor) -> Callable:
    return lambda logits: F.cross_entropy(logits, labels)


def measure(model: torch.nn.Module, inputs: tuple, loss_of: Callable, *, check: Callable[[np.ndarray], float],
            repeat: int, extra=()) -> dict:
    """Check ``model(*inputs)`` with ``check`` (raises on disagreement, returns the max abs difference), then time
    one train step (``zero_grad``, forward, ``loss_of``, backward): the median of ``repeat`` after two warm-ups.

    Memory, as `benchmarks.compare.pyg`: the bytes of the tensors alive when a step starts (parameters, inputs,
    ``extra`` such as labels; gradients released) plus the peak the step allocates (its gradients included),
    from the PyTorch profiler's memory events on one further, untimed step."""
    torch.set_num_threads(THREADS)
    model.eval()  # no dropout, as the JAX steps (deterministic)
    with torch.no_grad():
        diff = check(model(*inputs).numpy())

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_of(model(*inputs))
        loss.backward()
        return loss

    seconds = statistics.median(time_torch(step, warmup=2, repeats=repeat)) / 1e3
    model.zero_grad(set_to_none=True)
    resident = tensor_bytes([list(model.parameters()), list(inputs), list(extra)])
    peak = profiled_peak(step)
    return {"seconds": seconds, "memory_bytes": resident + peak, "max_abs_diff": diff, "threads": THREADS}
