"""One set of initial weights for every system: the `jgnn` module's parameters (flax ``init``, seeded) are the
canonical tree; these functions map it to the jraph modules' tree and to PyG ``state_dict`` entries.

PyG keeps ``Linear.weight`` as ``[out, in]`` (jgnn's ``kernel`` transposed), GAT's attention vectors as
``[1, H, C]``, HGT's K/Q/V per node type as one ``[3F, F]`` ``kqv_lin`` and its relation matrices as
``HeteroLinear`` weights indexed ``head * R + relation``.
"""
from __future__ import annotations

import numpy as np


def _np(a) -> np.ndarray:
    return np.asarray(a, np.float32)


def jraph_params(kind: str, params: dict) -> dict:
    """The `models.JraphGATModel` / `models.JraphGCNModel` tree holding ``params`` (a `models.GAT` / `GCN`
    tree)."""
    p = params["params"]
    if kind == "gat":
        layer = lambda q: {"att_src": q["att_src"][None], "att_dst": q["att_dst"][None],
                           "Dense_0": {"kernel": q["kernel"]}, "bias": q["bias"]}
        return {"params": {f"JraphGAT_{i}": layer(p[f"GATConv_{i}"]) for i in range(2)}}
    if kind == "gcn":
        layer = lambda q: {"Dense_0": {"kernel": q["kernel"]}, "bias": q["bias"]}
        return {"params": {f"JraphGCN_{i}": layer(p[f"GCNConv_{i}"]) for i in range(2)}}
    raise ValueError(f"jraph has no {kind} model")


def _gat(q) -> dict:
    return {"lin.weight": _np(q["kernel"]).T, "att_src": _np(q["att_src"])[None], "att_dst": _np(q["att_dst"])[None],
            "bias": _np(q["bias"])}


def _gcn(q) -> dict:
    return {"lin.weight": _np(q["kernel"]).T, "bias": _np(q["bias"])}


def _rgcn(q) -> dict:
    return {"weight": _np(q["kernel"]), "root": _np(q["root"]), "bias": _np(q["bias"])}


def _hgt(q, node_types: list[str], edge_types: list[tuple[str, str, str]]) -> dict:
    out = {}
    for t, nt in enumerate(node_types):
        kqv = [_np(q[f"{a}_kernel"][t]) for a in "kqv"]
        out[f"kqv_lin.lins.{nt}.weight"] = np.concatenate(kqv, 1).T
        out[f"kqv_lin.lins.{nt}.bias"] = np.concatenate([_np(q[f"{a}_bias"][t]) for a in "kqv"])
        out[f"out_lin.lins.{nt}.weight"] = _np(q["a_kernel"][t]).T
        out[f"out_lin.lins.{nt}.bias"] = _np(q["a_bias"][t])
        out[f"skip.{nt}"] = _np(q["skip"][t : t + 1])
    for name, key in (("att_relation", "k_rel"), ("msg_relation", "v_rel")):
        w = _np(q[name])  # [R, H, d, d] -> [H * R, d, d]
        out[f"{key}.weight"] = w.transpose(1, 0, 2, 3).reshape((-1,) + w.shape[2:])
    for r, et in enumerate(edge_types):
        out[f"p_rel.{'__'.join(et)}"] = _np(q["relation_prior"][r])[None]
    return out


def pyg_state(kind: str, params: dict, **names) -> dict[str, np.ndarray]:
    """``state_dict`` entries of the PyG ``ModuleList`` mirroring ``kind`` (layer ``i`` is ``"{i}."``).

    HGT needs ``node_types`` and ``edge_types`` (PyG's metadata, relation ``r`` is ``edge_types[r]``)."""
    p = params["params"]
    prefixed = lambda i, d: {f"{i}.{k}": v for k, v in d.items()}
    if kind == "hgt":
        out = {**prefixed(0, _hgt(p["HGTConv_0"], **names)), **prefixed(1, _hgt(p["HGTConv_1"], **names))}
        return out | {"2.weight": _np(p["Dense_0"]["kernel"]).T, "2.bias": _np(p["Dense_0"]["bias"])}
    layer_name, convert = {"gat": ("GATConv", _gat), "gcn": ("GCNConv", _gcn), "rgcn": ("RGCNConv", _rgcn)}[kind]
    return {k: v for i in range(2) for k, v in prefixed(i, convert(p[f"{layer_name}_{i}"])).items()}
