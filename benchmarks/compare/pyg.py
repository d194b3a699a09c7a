"""The PyTorch Geometric system: the same models as `benchmarks.compare.models`, loaded with the same initial
weights, trained with ``torch.optim.Adam`` on the CPU with a fixed intra-op thread count.

Memory (``memory_metric = "torch_profiler"``): the bytes of the tensors alive when a step starts (parameters,
Adam state, inputs; gradients were released by ``zero_grad(set_to_none=True)``) plus the peak of the bytes the
step allocates, read from the PyTorch profiler's memory events (``profile_memory=True``, one separate step,
not timed). This is the CPU allocator's view of tensors, as XLA's buffer assignment is JAX's.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np

from benchmarks.compare import weights
from benchmarks.compare.data import Problem
from benchmarks.compare.models import GAT_HEADS, GAT_HIDDEN, GCN_HIDDEN, HGT_HEADS, HGT_HIDDEN, RGCN_HIDDEN
from benchmarks.compare.runner import LEARNING_RATE, Runner


def _torch():
    import torch
    import torch_geometric  # noqa: F401 - fail here, naming the missing package

    return torch


def _layers(kind: str, p: Problem, pyg):
    """``(modules, forward(modules, inputs) -> logits, inputs)`` of ``kind`` on ``p``."""
    torch = _torch()
    edge_index = torch.as_tensor(np.stack([p.senders, p.receivers]).astype(np.int64))
    x = None if p.x is None else torch.as_tensor(p.x)
    f_in = p.num_features
    if kind == "gat":
        mods = [pyg.GATConv(f_in, GAT_HIDDEN, heads=GAT_HEADS), pyg.GATConv(GAT_HIDDEN * GAT_HEADS, p.num_classes,
                                                                        heads=1, concat=False)]
        return mods, lambda m, i: m[1](torch.nn.functional.elu(m[0](i[0], i[1])), i[1]), (x, edge_index)
    if kind == "gcn":
        mods = [pyg.GCNConv(f_in, GCN_HIDDEN), pyg.GCNConv(GCN_HIDDEN, p.num_classes)]
        return mods, lambda m, i: m[1](torch.relu(m[0](i[0], i[1])), i[1]), (x, edge_index)
    if kind == "rgcn":  # featureless: x=None makes the first layer embed node ids
        # FastRGCNConv: what PyG's examples/rgcn.py uses on AIFB and MUTAG ("trade memory for faster
        # computation"); RGCNConv loops over the relations (about 40x slower here, on 90 relations)
        r = p.num_relations
        mods = [pyg.FastRGCNConv(p.num_nodes, RGCN_HIDDEN, r), pyg.FastRGCNConv(RGCN_HIDDEN, p.num_classes, r)]
        edge_type = torch.as_tensor(p.edge_type.astype(np.int64))
        return mods, lambda m, i: m[1](torch.relu(m[0](None, i[0], i[1])), i[0], i[1]), (edge_index, edge_type)
    if kind == "hgt":
        return _hgt(p, pyg, torch)
    raise ValueError(f"no PyG model for {kind!r}")


def metadata(p: Problem) -> tuple[list[str], list[tuple[str, str, str]]]:
    """PyG's (node types, edge types): relation ``r`` is ``(f"t{src}", f"r{r}", f"t{dst}")``."""
    return ([f"t{t}" for t in range(p.num_node_types)],
            [(f"t{s}", f"r{r}", f"t{d}") for r, (s, d) in enumerate(p.schema.tolist())])


def _hgt(p: Problem, pyg, torch):
    node_types, edge_types = metadata(p)
    off = p.type_offsets(p.node_type, p.num_node_types)
    e_off = p.type_offsets(p.edge_type, p.num_relations)
    x_dict = {nt: torch.as_tensor(p.x[off[t]:off[t + 1]]) for t, nt in enumerate(node_types)}
    edge_index_dict = {}
    for r, et in enumerate(edge_types):
        s, d = p.schema[r]
        src, dst = p.senders[e_off[r]:e_off[r + 1]] - off[s], p.receivers[e_off[r]:e_off[r + 1]] - off[d]
        edge_index_dict[et] = torch.as_tensor(np.stack([src, dst]).astype(np.int64))
    meta = (node_types, edge_types)
    mods = [pyg.HGTConv(p.num_features, HGT_HIDDEN, meta, heads=HGT_HEADS),
            pyg.HGTConv(HGT_HIDDEN, HGT_HIDDEN, meta, heads=HGT_HEADS), torch.nn.Linear(HGT_HIDDEN, p.num_classes)]

    def forward(m, inputs):
        h, ei = inputs
        h = m[1](m[0](h, ei), ei)
        return m[2](torch.cat([h[nt] for nt in node_types]))

    return mods, forward, (x_dict, edge_index_dict)


def tensor_bytes(tree) -> int:
    torch = _torch()
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def profiled_peak(fn) -> int:
    """Peak bytes allocated (and not yet freed) during ``fn()``, from the profiler's memory events."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    del torch
    peaks = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return int(max(peaks, default=0))


def build(kind: str, problem: Problem, params: dict, *, train: bool, threads: int) -> Runner:
    """The PyG runner of ``kind`` with ``threads`` intra-op threads (set again before each round's calls)."""
    torch = _torch()
    import torch_geometric.nn as pyg

    t0 = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(0)  # PyG's own init is overwritten below; seeded anyway
    mods, forward, inputs = _layers(kind, problem, pyg)
    model = torch.nn.ModuleList(mods)
    names = dict(zip(("node_types", "edge_types"), metadata(problem), strict=True)) if kind == "hgt" else {}
    state = {k: torch.as_tensor(np.ascontiguousarray(v)) for k, v in weights.pyg_state(kind, params, **names).items()}
    model.load_state_dict(state, strict=True)
    labels = torch.as_tensor(problem.labels.astype(np.int64))
    index = torch.as_tensor(problem.train_idx.astype(np.int64))
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    prep_s = time.perf_counter() - t0
    cross_entropy = torch.nn.functional.cross_entropy

    if train:
        model.train()

        def call():
            opt.zero_grad(set_to_none=True)
            loss = cross_entropy(forward(model, inputs)[index], labels[index])
            loss.backward()
            opt.step()
            return float(loss.detach())
    else:
        model.eval()

        def call():
            with torch.inference_mode():
                forward(model, inputs)

    enter = lambda: torch.set_num_threads(threads)
    t1 = time.perf_counter()
    losses = [call()] if train else []
    first_run_s = time.perf_counter() - t1
    if train:
        losses.append(call())
    else:
        with torch.inference_mode():
            logits = forward(model, inputs)
            losses.append(float(cross_entropy(logits[index], labels[index])))
    resident = tensor_bytes([list(model.parameters()), opt.state_dict()["state"], inputs, labels, index])
    peak = profiled_peak(call)
    info = {"trace_s": 0.0, "compile_s": 0.0, "first_run_s": first_run_s, "first_call_s": first_run_s,
            "prep_s": prep_s, "losses": losses, "memory_bytes": resident + peak, "temp_bytes": peak,
            "memory_metric": "torch_profiler", "threads": threads}
    if not train:
        info["logits"] = logits.numpy()
    return Runner(f"pyg{threads}", call, enter, info)
