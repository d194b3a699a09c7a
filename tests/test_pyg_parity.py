"""PyG parity: every `jgnn.nn` layer with a PyG counterpart gives PyG's output with weights copied from PyG.

Every PyG parameter is first redrawn at random (PyG zero-initialises biases, so copying them would test
nothing), then copied into the jgnn layer. The graphs are batches of several graphs with existing self-loops
(one duplicated), duplicate edges and isolated nodes. Needs ``torch`` and ``torch-geometric``
(``pip install torch==2.13.0 torch-geometric``, CPU wheels); skipped without them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as fnn
import jax.numpy as jnp
import jraph
import numpy as np
import pytest

try:
    import torch
    import torch_geometric.nn as pyg
except ImportError:  # one clear reason for the whole module
    pytest.skip("PyG parity needs torch and torch-geometric: pip install torch==2.13.0 torch-geometric",
                allow_module_level=True)

from jgnn import nn as jnn

pytestmark = pytest.mark.pyg

RTOL = ATOL = 1e-5  # float32
D_IN, D_EDGE, R = 4, 3, 3
SIZES = (6, 1, 7, 5)  # several graphs; the 1-node graph has only self-loops


# ---------------------------------------------------------------------------------------------------------
# data


@dataclasses.dataclass(frozen=True)
class Data:
    x: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    n_node: np.ndarray
    n_edge: np.ndarray
    weight: np.ndarray
    attr: np.ndarray
    types: np.ndarray
    x_dst: np.ndarray  # bipartite destination features (with senders < len(x), receivers < len(x_dst))
    receivers_bip: np.ndarray
    attr_wide: np.ndarray  # edge features as wide as the nodes (GINE without edge_dim)


def make_data(seed: int = 0) -> Data:
    """A batch of ``SIZES`` graphs: random edges among all but each graph's last node (isolated), a duplicated
    self-loop on each graph's first node, another random loop or two and a duplicated edge."""
    rng = np.random.default_rng(seed)
    senders, receivers, n_edge, start = [], [], [], 0
    for size in SIZES:
        live = max(size - 1, 1)
        m = 3 * size + 3
        s, r = rng.integers(0, live, m), rng.integers(0, live, m)
        s[:2] = r[:2] = 0  # a duplicated existing self-loop
        s[-1], r[-1] = s[2], r[2]  # a duplicated edge
        senders.append(s + start)
        receivers.append(r + start)
        n_edge.append(m)
        start += size
    senders, receivers = np.concatenate(senders), np.concatenate(receivers)
    n, e = start, senders.shape[0]
    n_dst = n - 4
    receivers_bip = rng.integers(0, n_dst, e)
    receivers_bip[:2] = senders[:2]  # "loops" i -> i across the two node sets
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    return Data(x=f32(n, D_IN), senders=senders.astype(np.int32), receivers=receivers.astype(np.int32),
                n_node=np.asarray(SIZES, np.int32), n_edge=np.asarray(n_edge, np.int32),
                weight=rng.uniform(0.5, 2.0, e).astype(np.float32), attr=f32(e, D_EDGE),
                types=rng.integers(0, R, e).astype(np.int32), x_dst=f32(n_dst, D_IN + 1),
                receivers_bip=receivers_bip.astype(np.int32), attr_wide=f32(e, D_IN))


def graph(d: Data, nodes=None, edges=None, receivers=None) -> jraph.GraphsTuple:
    nodes = jnp.asarray(d.x) if nodes is None else nodes
    receivers = d.receivers if receivers is None else receivers
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=jnp.asarray(d.senders),
                             receivers=jnp.asarray(receivers), n_node=jnp.asarray(d.n_node),
                             n_edge=jnp.asarray(d.n_edge), globals=None)


T = torch.tensor
edge_index = lambda d, receivers=None: T(np.stack([d.senders, d.receivers if receivers is None else receivers]))

# input kind -> (jgnn graph, torch call); every torch call is ``layer(*args)``
INPUTS: dict[str, tuple[Callable, Callable]] = {
    "x": (lambda d: graph(d), lambda m, d: m(T(d.x), edge_index(d))),
    "x_weight": (lambda d: graph(d, edges=jnp.asarray(d.weight)), lambda m, d: m(T(d.x), edge_index(d), T(d.weight))),
    "x_attr": (lambda d: graph(d, edges=jnp.asarray(d.attr)), lambda m, d: m(T(d.x), edge_index(d), T(d.attr))),
    "bipartite": (lambda d: graph(d, nodes=(jnp.asarray(d.x), jnp.asarray(d.x_dst)), receivers=d.receivers_bip),
                  lambda m, d: m((T(d.x), T(d.x_dst)), edge_index(d, d.receivers_bip))),
    "bipartite_attr": (lambda d: graph(d, nodes=(jnp.asarray(d.x), jnp.asarray(d.x_dst)), edges=jnp.asarray(d.attr),
                                       receivers=d.receivers_bip),
                       lambda m, d: m((T(d.x), T(d.x_dst)), edge_index(d, d.receivers_bip), T(d.attr))),
    "x_attr_wide": (lambda d: graph(d, edges=jnp.asarray(d.attr_wide)),
                    lambda m, d: m(T(d.x), edge_index(d), T(d.attr_wide))),
    # GIN, GINE and EdgeConv add or subtract x_dst and x_src: equal widths
    "bipartite_equal": (lambda d: graph(d, nodes=(jnp.asarray(d.x), jnp.asarray(d.x_dst[:, :D_IN])),
                                        receivers=d.receivers_bip),
                        lambda m, d: m((T(d.x), T(d.x_dst[:, :D_IN])), edge_index(d, d.receivers_bip))),
    "bipartite_equal_attr": (lambda d: graph(d, nodes=(jnp.asarray(d.x), jnp.asarray(d.x_dst[:, :D_IN])),
                                             edges=jnp.asarray(d.attr), receivers=d.receivers_bip),
                             lambda m, d: m((T(d.x), T(d.x_dst[:, :D_IN])), edge_index(d, d.receivers_bip),
                                            T(d.attr))),
    "typed": (lambda d: graph(d, edges={"type": jnp.asarray(d.types)}),
              lambda m, d: m(T(d.x), edge_index(d), T(d.types).long())),
    "typed_attr": (lambda d: graph(d, edges={"type": jnp.asarray(d.types), "h": jnp.asarray(d.attr)}),
                   lambda m, d: m(T(d.x), edge_index(d), T(d.types).long(), T(d.attr))),
    "typed_ids": (lambda d: graph(d, nodes=jnp.arange(d.x.shape[0], dtype=jnp.int32),
                                  edges={"type": jnp.asarray(d.types)}),
                  lambda m, d: m(None, edge_index(d), T(d.types).long())),
    "typed_bipartite": (lambda d: graph(d, nodes=(jnp.asarray(d.x), jnp.asarray(d.x_dst)),
                                        edges={"type": jnp.asarray(d.types)}, receivers=d.receivers_bip),
                        lambda m, d: m((T(d.x), T(d.x_dst)), edge_index(d, d.receivers_bip), T(d.types).long())),
}


# ---------------------------------------------------------------------------------------------------------
# weight copies: PyG module -> jgnn params


def j(t):
    return jnp.asarray(t.detach().numpy())


def dense(lin):
    """A PyG ``Linear`` as flax ``Dense`` params."""
    return {"kernel": j(lin.weight).T, **({"bias": j(lin.bias)} if lin.bias is not None else {})}


def optional(**entries):
    return {k: v for k, v in entries.items() if v is not None}


def kernel(lin):
    return None if lin is None else j(lin.weight).T


def gcn_params(t):
    return optional(kernel=kernel(t.lin), bias=None if t.bias is None else j(t.bias))


def gat_params(t):
    return optional(kernel=kernel(t.lin), kernel_src=kernel(t.lin_src), kernel_dst=kernel(t.lin_dst),
                    att_src=j(t.att_src[0]), att_dst=j(t.att_dst[0]), kernel_edge=kernel(t.lin_edge),
                    att_edge=None if t.att_edge is None else j(t.att_edge[0]), residual=kernel(t.res),
                    bias=None if t.bias is None else j(t.bias))


def gatv2_params(t):
    bias = lambda lin: None if lin.bias is None else j(lin.bias)
    return optional(kernel_src=kernel(t.lin_l), bias_src=bias(t.lin_l),
                    kernel_dst=None if t.share_weights else kernel(t.lin_r),
                    bias_dst=None if t.share_weights else bias(t.lin_r), att=j(t.att[0]),
                    kernel_edge=kernel(t.lin_edge), residual=kernel(t.res),
                    bias=None if t.bias is None else j(t.bias))


def sage_params(t):
    return optional(kernel_neighbors=kernel(t.lin_l), bias=None if t.lin_l.bias is None else j(t.lin_l.bias),
                    kernel_root=kernel(t.lin_r) if t.root_weight else None,
                    project=dense(t.lin) if t.project else None)


def graph_conv_params(t):
    return optional(kernel_rel=kernel(t.lin_rel), bias=j(t.lin_rel.bias), kernel_root=kernel(t.lin_root))


def mlp_params(seq):
    """A torch ``Sequential(Linear, ReLU, Linear)`` as flax ``Sequential([Dense, relu, Dense])`` params."""
    return {"layers_0": dense(seq[0]), "layers_2": dense(seq[2])}


def gin_params(t):
    lin = getattr(t, "lin", None)  # GINE's edge map
    return optional(mlp=mlp_params(t.nn), eps=j(t.eps)[0] if isinstance(t.eps, torch.nn.Parameter) else None,
                    edge_kernel=kernel(lin), edge_bias=None if lin is None else j(lin.bias))


def edge_conv_params(t):
    return {"mlp": mlp_params(t.nn)}


def transformer_params(t):
    return optional(query=dense(t.lin_query), key=dense(t.lin_key), value=dense(t.lin_value),
                    skip=dense(t.lin_skip) if t.root_weight else None, kernel_edge=kernel(t.lin_edge),
                    beta=kernel(t.lin_beta))


def cheb_params(t):
    return optional(kernel=jnp.stack([kernel(lin) for lin in t.lins]), bias=None if t.bias is None else j(t.bias))


def pna_params(t):
    def towers(nns):  # PyG's per-tower Sequential(Linear, act, Linear, ...), stacked over towers
        linears = [[m for m in nn_ if hasattr(m, "weight")] for nn_ in nns]
        out = {}
        for i in range(len(linears[0])):
            out[f"kernel_{i}"] = jnp.stack([kernel(lins[i]) for lins in linears])
            out[f"bias_{i}"] = jnp.stack([j(lins[i].bias) for lins in linears])
        return out

    aggr = t.aggr_module
    norm = isinstance(aggr.avg_deg_lin, torch.nn.Parameter)
    return optional(pre=towers(t.pre_nns), post=towers(t.post_nns), lin=dense(t.lin),
                    edge_encoder=dense(t.edge_encoder) if t.edge_dim is not None else None,
                    avg_deg_lin=j(aggr.avg_deg_lin)[0] if norm else None,
                    avg_deg_log=j(aggr.avg_deg_log)[0] if norm else None)


def rgcn_params(t):
    weights = {"bases": j(t.weight), "comp": j(t.comp)} if t.num_bases is not None else \
        {"blocks": j(t.weight)} if t.num_blocks is not None else {"kernel": j(t.weight)}
    return optional(**weights, root=None if t.root is None else j(t.root), bias=None if t.bias is None else j(t.bias))


def rgat_params(t):
    weights = {"bases": j(t.basis), "comp": j(t.att)} if t.num_bases is not None else \
        {"blocks": j(t.weight)} if t.num_blocks is not None else {"kernel": j(t.weight)}
    mod = {}
    if t.mod == "additive":
        mod = {"w": j(t.w)}
    elif t.mod == "scaled":
        mod = {"l1": j(t.l1[0]), "b1": j(t.b1[0]), "l2": j(t.l2), "b2": j(t.b2[0])}
    return optional(**weights, **mod, query=j(t.q), key=j(t.k), kernel_edge=kernel(t.lin_edge),
                    att_edge=None if t.e is None else j(t.e), bias=None if t.bias is None else j(t.bias))


# ---------------------------------------------------------------------------------------------------------
# cases


@dataclasses.dataclass(frozen=True)
class Case:
    torch_layer: Callable[[], torch.nn.Module]
    jgnn_layer: Callable[[], fnn.Module]
    params: Callable
    inputs: str = "x"
    attention: bool = False  # also compare return_attention_weights


def mlp(d_in, d_out=3):
    return torch.nn.Sequential(torch.nn.Linear(d_in, 5), torch.nn.ReLU(), torch.nn.Linear(5, d_out))


FLAX_MLP = lambda: fnn.Sequential([fnn.Dense(5), fnn.relu, fnn.Dense(3)])
DEG = (1, 3, 4, 2, 1)
PNA_FULL = dict(aggregators=("mean", "min", "max", "std", "var", "sum"),
                scalers=("identity", "amplification", "attenuation", "linear", "inverse_linear"))

CASES: dict[str, Case] = {
    # GCN: default, weights (loops keep their weight), improved, no loops, no normalisation
    "gcn": Case(lambda: pyg.GCNConv(D_IN, 3), lambda: jnn.GCNConv(3), gcn_params),
    "gcn_weight": Case(lambda: pyg.GCNConv(D_IN, 3), lambda: jnn.GCNConv(3), gcn_params, "x_weight"),
    "gcn_improved": Case(lambda: pyg.GCNConv(D_IN, 3, improved=True), lambda: jnn.GCNConv(3, improved=True),
                         gcn_params, "x_weight"),
    "gcn_no_loops": Case(lambda: pyg.GCNConv(D_IN, 3, add_self_loops=False, bias=False),
                         lambda: jnn.GCNConv(3, add_self_loops=False, use_bias=False), gcn_params, "x_weight"),
    "gcn_no_norm": Case(lambda: pyg.GCNConv(D_IN, 3, normalize=False), lambda: jnn.GCNConv(3, normalize=False),
                        gcn_params, "x_weight"),
    # GAT
    "gat": Case(lambda: pyg.GATConv(D_IN, 3), lambda: jnn.GATConv(3), gat_params, attention=True),
    "gat_heads_mean_residual": Case(lambda: pyg.GATConv(D_IN, 3, heads=2, concat=False, residual=True),
                                    lambda: jnn.GATConv(3, 2, concat=False, residual=True), gat_params),
    "gat_edge_mean": Case(lambda: pyg.GATConv(D_IN, 3, heads=2, edge_dim=D_EDGE),
                          lambda: jnn.GATConv(3, 2, edge_dim=D_EDGE), gat_params, "x_attr", attention=True),
    "gat_edge_max": Case(lambda: pyg.GATConv(D_IN, 3, edge_dim=D_EDGE, fill_value="max"),
                         lambda: jnn.GATConv(3, edge_dim=D_EDGE, fill_value="max"), gat_params, "x_attr"),
    "gat_edge_min": Case(lambda: pyg.GATConv(D_IN, 3, edge_dim=D_EDGE, fill_value="min"),
                         lambda: jnn.GATConv(3, edge_dim=D_EDGE, fill_value="min"), gat_params, "x_attr"),
    "gat_edge_add": Case(lambda: pyg.GATConv(D_IN, 3, edge_dim=D_EDGE, fill_value="add"),
                         lambda: jnn.GATConv(3, edge_dim=D_EDGE, fill_value="add"), gat_params, "x_attr"),
    "gat_edge_const": Case(lambda: pyg.GATConv(D_IN, 3, edge_dim=D_EDGE, fill_value=0.5),
                           lambda: jnn.GATConv(3, edge_dim=D_EDGE, fill_value=0.5), gat_params, "x_attr"),
    "gat_no_loops": Case(lambda: pyg.GATConv(D_IN, 3, heads=2, add_self_loops=False, bias=False),
                         lambda: jnn.GATConv(3, 2, add_self_loops=False, use_bias=False), gat_params),
    "gat_bipartite": Case(lambda: pyg.GATConv((D_IN, D_IN + 1), 3, heads=2, edge_dim=D_EDGE, residual=True),
                          lambda: jnn.GATConv(3, 2, edge_dim=D_EDGE, residual=True), gat_params, "bipartite_attr",
                          attention=True),
    # GATv2
    "gatv2": Case(lambda: pyg.GATv2Conv(D_IN, 3), lambda: jnn.GATv2Conv(3), gatv2_params, attention=True),
    "gatv2_share_residual": Case(lambda: pyg.GATv2Conv(D_IN, 3, heads=2, share_weights=True, residual=True),
                                 lambda: jnn.GATv2Conv(3, 2, share_weights=True, residual=True), gatv2_params),
    "gatv2_edge": Case(lambda: pyg.GATv2Conv(D_IN, 3, heads=2, concat=False, edge_dim=D_EDGE, fill_value="max"),
                       lambda: jnn.GATv2Conv(3, 2, concat=False, edge_dim=D_EDGE, fill_value="max"), gatv2_params,
                       "x_attr"),
    "gatv2_no_loops_no_bias": Case(lambda: pyg.GATv2Conv(D_IN, 3, add_self_loops=False, bias=False),
                                   lambda: jnn.GATv2Conv(3, add_self_loops=False, use_bias=False), gatv2_params),
    "gatv2_bipartite": Case(lambda: pyg.GATv2Conv((D_IN, D_IN + 1), 3, heads=2, edge_dim=D_EDGE),
                            lambda: jnn.GATv2Conv(3, 2, edge_dim=D_EDGE), gatv2_params, "bipartite_attr",
                            attention=True),
    # SAGE
    "sage": Case(lambda: pyg.SAGEConv(D_IN, 3), lambda: jnn.SAGEConv(3), sage_params),
    "sage_max_normalize": Case(lambda: pyg.SAGEConv(D_IN, 3, aggr="max", normalize=True),
                               lambda: jnn.SAGEConv(3, aggr="max", normalize=True), sage_params),
    "sage_project_sum": Case(lambda: pyg.SAGEConv(D_IN, 3, aggr="sum", project=True, root_weight=False),
                             lambda: jnn.SAGEConv(3, aggr="sum", project=True, root_weight=False), sage_params),
    "sage_min_no_bias": Case(lambda: pyg.SAGEConv(D_IN, 3, aggr="min", bias=False),
                             lambda: jnn.SAGEConv(3, aggr="min", use_bias=False), sage_params),
    "sage_bipartite": Case(lambda: pyg.SAGEConv((D_IN, D_IN + 1), 3), lambda: jnn.SAGEConv(3), sage_params,
                           "bipartite"),
    # GraphConv
    "graph_conv": Case(lambda: pyg.GraphConv(D_IN, 3), lambda: jnn.GraphConv(3), graph_conv_params),
    "graph_conv_weight_mean": Case(lambda: pyg.GraphConv(D_IN, 3, aggr="mean"), lambda: jnn.GraphConv(3, aggr="mean"),
                                   graph_conv_params, "x_weight"),
    "graph_conv_max": Case(lambda: pyg.GraphConv(D_IN, 3, aggr="max"), lambda: jnn.GraphConv(3, aggr="max"),
                           graph_conv_params, "x_weight"),
    "graph_conv_bipartite": Case(lambda: pyg.GraphConv((D_IN, D_IN + 1), 3), lambda: jnn.GraphConv(3),
                                 graph_conv_params, "bipartite"),
    # GIN, GINE, EdgeConv
    "gin": Case(lambda: pyg.GINConv(mlp(D_IN)), lambda: jnn.GINConv(FLAX_MLP()), gin_params),
    "gin_train_eps": Case(lambda: pyg.GINConv(mlp(D_IN), eps=0.3, train_eps=True),
                          lambda: jnn.GINConv(FLAX_MLP(), eps=0.3, train_eps=True), gin_params),
    "gine_edge_dim": Case(lambda: pyg.GINEConv(mlp(D_IN), eps=0.1, edge_dim=D_EDGE),
                          lambda: jnn.GINEConv(FLAX_MLP(), eps=0.1, edge_dim=D_EDGE), gin_params, "x_attr"),
    "gin_bipartite": Case(lambda: pyg.GINConv(mlp(D_IN), eps=0.2), lambda: jnn.GINConv(FLAX_MLP(), eps=0.2),
                          gin_params, "bipartite_equal"),
    "gine": Case(lambda: pyg.GINEConv(mlp(D_IN)), lambda: jnn.GINEConv(FLAX_MLP()), gin_params, "x_attr_wide"),
    "gine_bipartite": Case(lambda: pyg.GINEConv(mlp(D_IN), train_eps=True, edge_dim=D_EDGE),
                           lambda: jnn.GINEConv(FLAX_MLP(), train_eps=True, edge_dim=D_EDGE), gin_params,
                           "bipartite_equal_attr"),
    "edge_conv": Case(lambda: pyg.EdgeConv(mlp(2 * D_IN)), lambda: jnn.EdgeConv(FLAX_MLP()), edge_conv_params),
    "edge_conv_bipartite": Case(lambda: pyg.EdgeConv(mlp(2 * D_IN)), lambda: jnn.EdgeConv(FLAX_MLP()),
                                edge_conv_params, "bipartite_equal"),
    "edge_conv_mean": Case(lambda: pyg.EdgeConv(mlp(2 * D_IN), aggr="mean"),
                           lambda: jnn.EdgeConv(FLAX_MLP(), aggr="mean"), edge_conv_params),
    "edge_conv_add": Case(lambda: pyg.EdgeConv(mlp(2 * D_IN), aggr="add"),
                          lambda: jnn.EdgeConv(FLAX_MLP(), aggr="add"), edge_conv_params),
    # TransformerConv
    "transformer": Case(lambda: pyg.TransformerConv(D_IN, 3), lambda: jnn.TransformerConv(3), transformer_params,
                        attention=True),
    "transformer_edge": Case(lambda: pyg.TransformerConv(D_IN, 3, heads=2, edge_dim=D_EDGE),
                             lambda: jnn.TransformerConv(3, 2, edge_dim=D_EDGE), transformer_params, "x_attr"),
    "transformer_beta_mean": Case(lambda: pyg.TransformerConv(D_IN, 3, heads=2, concat=False, beta=True),
                                  lambda: jnn.TransformerConv(3, 2, concat=False, beta=True), transformer_params),
    "transformer_no_root": Case(lambda: pyg.TransformerConv(D_IN, 3, heads=2, root_weight=False, bias=False),
                                lambda: jnn.TransformerConv(3, 2, root_weight=False, use_bias=False),
                                transformer_params),
    "transformer_bipartite": Case(lambda: pyg.TransformerConv((D_IN, D_IN + 1), 3, heads=2, edge_dim=D_EDGE),
                                  lambda: jnn.TransformerConv(3, 2, edge_dim=D_EDGE), transformer_params,
                                  "bipartite_attr", attention=True),
    # ChebConv
    "cheb": Case(lambda: pyg.ChebConv(D_IN, 3, K=3), lambda: jnn.ChebConv(3, K=3), cheb_params),
    "cheb_rw_weight": Case(lambda: pyg.ChebConv(D_IN, 3, K=3, normalization="rw"),
                           lambda: jnn.ChebConv(3, K=3, normalization="rw"), cheb_params, "x_weight"),
    "cheb_none_weight": Case(lambda: pyg.ChebConv(D_IN, 3, K=4, normalization=None),
                             lambda: jnn.ChebConv(3, K=4, normalization=None), cheb_params, "x_weight"),
    "cheb_k1": Case(lambda: pyg.ChebConv(D_IN, 3, K=1, bias=False), lambda: jnn.ChebConv(3, K=1, use_bias=False),
                    cheb_params),
    # APPNP (no parameters)
    "appnp": Case(lambda: pyg.APPNP(K=3, alpha=0.2), lambda: jnn.APPNP(3, 0.2), lambda t: {}),
    "appnp_weight": Case(lambda: pyg.APPNP(K=2, alpha=0.1), lambda: jnn.APPNP(2, 0.1), lambda t: {}, "x_weight"),
    "appnp_no_loops": Case(lambda: pyg.APPNP(K=2, alpha=0.1, add_self_loops=False),
                           lambda: jnn.APPNP(2, 0.1, add_self_loops=False), lambda t: {}, "x_weight"),
    "appnp_no_norm": Case(lambda: pyg.APPNP(K=2, alpha=0.1, normalize=False),
                          lambda: jnn.APPNP(2, 0.1, normalize=False), lambda t: {}, "x_weight"),
    # PNA
    "pna": Case(lambda: pyg.PNAConv(D_IN, 6, deg=T(DEG), **{k: list(v) for k, v in PNA_FULL.items()}),
                lambda: jnn.PNAConv(6, deg=DEG, **PNA_FULL), pna_params),
    "pna_towers_edge": Case(lambda: pyg.PNAConv(D_IN, 6, ["mean", "max"], ["identity", "linear"], deg=T(DEG),
                                                edge_dim=D_EDGE, towers=2, pre_layers=2, post_layers=2),
                            lambda: jnn.PNAConv(6, ("mean", "max"), ("identity", "linear"), DEG, edge_dim=D_EDGE,
                                                towers=2, pre_layers=2, post_layers=2), pna_params, "x_attr"),
    "pna_divide_train_norm": Case(lambda: pyg.PNAConv(D_IN, 6, ["sum", "std"], ["amplification"], deg=T(DEG),
                                                      towers=2, divide_input=True, train_norm=True),
                                  lambda: jnn.PNAConv(6, ("sum", "std"), ("amplification",), DEG, towers=2,
                                                      divide_input=True, train_norm=True), pna_params),
    # RGCN
    "rgcn": Case(lambda: pyg.RGCNConv(D_IN, 5, R), lambda: jnn.RGCNConv(5, R), rgcn_params, "typed"),
    "rgcn_bases": Case(lambda: pyg.RGCNConv(D_IN, 5, R, num_bases=2), lambda: jnn.RGCNConv(5, R, num_bases=2),
                       rgcn_params, "typed"),
    "rgcn_blocks_add": Case(lambda: pyg.RGCNConv(D_IN, 6, R, num_blocks=2, aggr="add"),
                            lambda: jnn.RGCNConv(6, R, num_blocks=2, aggr="add"), rgcn_params, "typed"),
    "rgcn_max": Case(lambda: pyg.RGCNConv(D_IN, 5, R, aggr="max"), lambda: jnn.RGCNConv(5, R, aggr="max"),
                     rgcn_params, "typed"),
    "rgcn_min_no_root": Case(lambda: pyg.RGCNConv(D_IN, 5, R, aggr="min", root_weight=False, num_bases=2),
                             lambda: jnn.RGCNConv(5, R, aggr="min", root_weight=False, num_bases=2), rgcn_params,
                             "typed"),
    "rgcn_ids": Case(lambda: pyg.RGCNConv(sum(SIZES), 5, R, num_bases=2),
                     lambda: jnn.RGCNConv(5, R, num_bases=2, input_dim=sum(SIZES)), rgcn_params, "typed_ids"),
    "rgcn_bipartite": Case(lambda: pyg.RGCNConv((D_IN, D_IN + 1), 5, R), lambda: jnn.RGCNConv(5, R), rgcn_params,
                           "typed_bipartite"),
    # RGAT
    "rgat": Case(lambda: pyg.RGATConv(D_IN, 3, R), lambda: jnn.RGATConv(3, R), rgat_params, "typed", True),
    "rgat_heads": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2), lambda: jnn.RGATConv(3, R, 2), rgat_params,
                       "typed", True),
    "rgat_heads_mean_bases": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, concat=False, num_bases=2),
                                  lambda: jnn.RGATConv(3, R, 2, concat=False, num_bases=2), rgat_params, "typed"),
    "rgat_blocks": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, num_blocks=2),
                        lambda: jnn.RGATConv(3, R, 2, num_blocks=2), rgat_params, "typed"),
    "rgat_within": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, attention_mechanism="within-relation"),
                        lambda: jnn.RGATConv(3, R, 2, attention_mechanism="within-relation"), rgat_params,
                        "typed", True),
    "rgat_multiplicative": Case(
        lambda: pyg.RGATConv(D_IN, 3, R, heads=2, dim=2, attention_mode="multiplicative-self-attention"),
        lambda: jnn.RGATConv(3, R, 2, dim=2, attention_mode="multiplicative-self-attention"), rgat_params,
        "typed", True),
    "rgat_multiplicative_within_mean": Case(
        lambda: pyg.RGATConv(D_IN, 3, R, heads=2, dim=2, concat=False, attention_mechanism="within-relation",
                             attention_mode="multiplicative-self-attention"),
        lambda: jnn.RGATConv(3, R, 2, dim=2, concat=False, attention_mechanism="within-relation",
                             attention_mode="multiplicative-self-attention"), rgat_params, "typed"),
    "rgat_mod_additive": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, mod="additive"),
                              lambda: jnn.RGATConv(3, R, 2, mod="additive"), rgat_params, "typed"),
    "rgat_mod_scaled": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, mod="scaled"),
                            lambda: jnn.RGATConv(3, R, 2, mod="scaled"), rgat_params, "typed"),
    "rgat_mod_f_additive": Case(lambda: pyg.RGATConv(D_IN, 3, R, mod="f-additive"),
                                lambda: jnn.RGATConv(3, R, mod="f-additive"), rgat_params, "typed"),
    "rgat_mod_f_scaled": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, mod="f-scaled"),
                              lambda: jnn.RGATConv(3, R, 2, mod="f-scaled"), rgat_params, "typed"),
    "rgat_edge": Case(lambda: pyg.RGATConv(D_IN, 3, R, heads=2, edge_dim=D_EDGE),
                      lambda: jnn.RGATConv(3, R, 2, edge_dim=D_EDGE), rgat_params, "typed_attr"),
    "rgat_edge_multiplicative_additive": Case(
        lambda: pyg.RGATConv(D_IN, 3, R, edge_dim=D_EDGE, dim=2, mod="additive",
                             attention_mode="multiplicative-self-attention"),
        lambda: jnn.RGATConv(3, R, edge_dim=D_EDGE, dim=2, mod="additive",
                             attention_mode="multiplicative-self-attention"), rgat_params, "typed_attr"),
}


def randomized(factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The PyG layer with every parameter redrawn (seeded), so nothing copied is trivially 0 or 1 (buffers, such
    as a fixed GIN epsilon, keep their values). PNA's learnable degree averages stay positive."""
    torch.manual_seed(0)
    layer = factory()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            draw = torch.randn(p.shape, generator=gen) * 0.5
            p.copy_(draw.abs() + 0.5 if "avg_deg" in name else draw)
    return layer.eval()


def sorted_attention(senders, receivers, weights):
    """Attention rows ``[receiver, sender, weights...]`` in a canonical order (edge orders differ)."""
    rows = np.column_stack([receivers, senders, weights.reshape(weights.shape[0], -1)])
    return rows[np.lexsort(rows.T[::-1])]


def assert_attention_matches(att, edge_index, alpha):
    senders, receivers, weights = (np.asarray(a) for a in att)
    weights = weights.reshape(weights.shape[0], -1)
    masked = (senders == receivers) & np.all(weights == 0, axis=1)  # replaced existing self-loops
    ours = sorted_attention(senders[~masked], receivers[~masked], weights[~masked])
    theirs = sorted_attention(edge_index[0].numpy(), edge_index[1].numpy(), alpha.detach().numpy())
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def data():
    return make_data()


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_pyg(name, data):
    case = CASES[name]
    make_graph, torch_call = INPUTS[case.inputs]
    theirs = randomized(case.torch_layer)
    module = case.jgnn_layer().clone(backend="xla")
    variables = {"params": case.params(theirs)}
    g = make_graph(data)
    if case.attention:
        out, att = module.apply(variables, g, return_attention_weights=True)
        expected, (edge_index, alpha) = torch_call(lambda *a: theirs(*a, return_attention_weights=True), data)
        assert_attention_matches(att, edge_index, alpha)
    else:
        out, expected = module.apply(variables, g), torch_call(theirs, data)
    ours = out.nodes["h"] if isinstance(out.nodes, dict) else out.nodes
    expected = expected.detach().numpy()
    assert ours.shape == expected.shape
    assert np.abs(expected).max() > 1e-3  # the comparison is not between zeros
    np.testing.assert_allclose(ours, expected, rtol=RTOL, atol=ATOL)


def test_every_option_case_copies_every_parameter(data):
    """The copied parameters are exactly the jgnn layer's (nothing left at its own init, nothing extra)."""
    import jax

    for name, case in CASES.items():
        g = INPUTS[case.inputs][0](data)
        module = case.jgnn_layer().clone(backend="reference")
        shapes = jax.tree_util.tree_map(np.shape, module.init(jax.random.PRNGKey(0), g).get("params", {}))
        copied = jax.tree_util.tree_map(np.shape, case.params(randomized(case.torch_layer)))
        assert shapes == copied, name


# ---------------------------------------------------------------------------------------------------------
# HGT: typed graphs whose edge types fix their endpoint node types, as PyG's HeteroData


NODE_TYPES, HGT_F, HGT_HEADS = 3, 6, 2
RELATIONS = ((0, 1), (1, 0), (2, 1), (1, 1))  # (source type, destination type) per edge type


def hgt_data(seed: int, widths: dict[int, int] | None):
    """A typed graph and its PyG ``(x_dict, edge_index_dict, metadata)``; type-1 nodes have a duplicated
    edge and a self-loop (relation 3 joins type 1 to itself); the last node of each type has no in-edges."""
    rng = np.random.default_rng(seed)
    n = 20
    node_type = np.concatenate([np.arange(NODE_TYPES), rng.integers(0, NODE_TYPES, n - NODE_TYPES)])
    senders, receivers, types = [], [], []
    for rel, (st, dt) in enumerate(RELATIONS):
        src, dst = np.flatnonzero(node_type == st), np.flatnonzero(node_type == dt)
        s, r = rng.choice(src, 8), rng.choice(dst[:-1], 8)
        if st == dt:
            s[0] = r[0] = dst[0]
        s[-1], r[-1] = s[1], r[1]
        senders.append(s), receivers.append(r), types.append(np.full(8, rel))
    s, r, et = (np.concatenate(a) for a in (senders, receivers, types))
    width = max(widths.values()) if widths else HGT_F
    x = rng.normal(size=(n, width)).astype(np.float32)
    g = jraph.GraphsTuple(nodes={"h": jnp.asarray(x), "type": jnp.asarray(node_type, jnp.int32)},
                          edges={"type": jnp.asarray(et, jnp.int32)}, senders=jnp.asarray(s, jnp.int32),
                          receivers=jnp.asarray(r, jnp.int32), n_node=jnp.asarray([n]),
                          n_edge=jnp.asarray([s.shape[0]]), globals=None)
    names = [f"n{i}" for i in range(NODE_TYPES)]
    edge_types = [(names[a], f"r{i}", names[b]) for i, (a, b) in enumerate(RELATIONS)]
    local = np.zeros(n, np.int64)
    for t in range(NODE_TYPES):
        local[node_type == t] = np.arange(np.sum(node_type == t))
    x_dict = {names[t]: T(x[node_type == t][:, :(widths[t] if widths else width)]) for t in range(NODE_TYPES)}
    ei_dict = {edge_types[i]: T(np.stack([local[s[et == i]], local[r[et == i]]])) for i in range(len(RELATIONS))}
    return g, node_type, x_dict, ei_dict, (names, edge_types)


def hgt_params(t, names, edge_types, per_type: bool):
    f, e, d = HGT_F, len(edge_types), HGT_F // HGT_HEADS
    p = {}
    for i, kind in enumerate("kqv"):  # PyG's kqv_lin outputs [K | Q | V]
        kernels = [j(t.kqv_lin.lins[nm].weight)[i * f:(i + 1) * f].T for nm in names]
        if per_type:
            p.update({f"{kind}_kernel_{k}": w for k, w in enumerate(kernels)})
        else:
            p[f"{kind}_kernel"] = jnp.stack(kernels)
        p[f"{kind}_bias"] = jnp.stack([j(t.kqv_lin.lins[nm].bias)[i * f:(i + 1) * f] for nm in names])
    p["att_relation"] = j(t.k_rel.weight).reshape(HGT_HEADS, e, d, d).transpose(1, 0, 2, 3)  # row h * E + e
    p["msg_relation"] = j(t.v_rel.weight).reshape(HGT_HEADS, e, d, d).transpose(1, 0, 2, 3)
    p["relation_prior"] = jnp.stack([j(t.p_rel["__".join(et)])[0] for et in edge_types])
    p["a_kernel"] = jnp.stack([j(t.out_lin.lins[nm].weight).T for nm in names])
    p["a_bias"] = jnp.stack([j(t.out_lin.lins[nm].bias) for nm in names])
    p["skip"] = jnp.stack([j(t.skip[nm])[0] for nm in names])
    return p


@pytest.mark.parametrize("widths", [None, {0: 4, 1: HGT_F, 2: 5}], ids=["shared_width", "per_type_in_channels"])
def test_hgt_matches_pyg(widths):
    g, node_type, x_dict, ei_dict, metadata = hgt_data(3, widths)
    in_channels = {k: v.shape[1] for k, v in x_dict.items()} if widths else HGT_F
    theirs = randomized(lambda: pyg.HGTConv(in_channels, HGT_F, metadata, heads=HGT_HEADS))
    expected = theirs(x_dict, ei_dict)
    module = jnn.HGTConv(HGT_F, HGT_HEADS, NODE_TYPES, len(RELATIONS), in_features=widths, backend="xla")
    ours = np.asarray(module.apply({"params": hgt_params(theirs, *metadata, widths is not None)}, g).nodes["h"])
    compared = 0
    for t, name in enumerate(metadata[0]):
        if name in expected:  # PyG returns only node types that receive edges
            np.testing.assert_allclose(ours[node_type == t], expected[name].detach().numpy(), rtol=RTOL, atol=ATOL)
            compared += 1
    assert compared == 2
