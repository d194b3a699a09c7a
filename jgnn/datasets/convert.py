"""Converters from common graph formats to ``jraph.GraphsTuple`` (single graph, int32 indices).

* :func:`from_edge_index` -- PyTorch Geometric style ``edge_index`` [2, E] (row 0 = senders);
* :func:`from_scipy` -- a square scipy sparse adjacency (COO/CSR/...; row index = sender);
* :func:`from_networkx` -- a networkx (Di/Multi)Graph; undirected edges become two directed edges;
* :func:`from_pyg` -- a PyTorch Geometric ``Data`` (or a ``Batch`` of several graphs);
* :func:`from_pyg_hetero` -- a PyTorch Geometric ``HeteroData``, as a :class:`jgnn.hetero.HeteroGraph`.

Every converter validates its input and raises ``TypeError``/``ValueError`` naming the bad field.
The returned graphs hold NumPy arrays: ``senders``/``receivers`` int32 [E], ``n_node`` = [N],
``n_edge`` = [E] (int32), ``globals = None``. scipy, networkx and torch are imported lazily.
"""
from __future__ import annotations

import jax
import jraph
import numpy as np

from jgnn.datasets.types import make_graph

_INT32_MAX = np.iinfo(np.int32).max


def _check_leading_dim(tree, size: int, field: str) -> None:
    """Every array leaf of ``tree`` must have leading dimension ``size``."""
    if tree is None:
        return
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shape = np.shape(leaf)
        where = field + jax.tree_util.keystr(path)
        if len(shape) == 0 or shape[0] != size:
            raise ValueError(f"{where} must have leading dimension {size}, got shape {shape}")


def check_indices(ids: np.ndarray, num_nodes: int, field: str) -> np.ndarray:
    """Validate a 1-D integer index array against ``[0, num_nodes)``; return it as int32."""
    ids = np.asarray(ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{field} must have an integer dtype, got {ids.dtype}")
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0:
            raise ValueError(f"{field} contains negative node id {lo}")
        if hi >= num_nodes:
            raise ValueError(f"{field} contains node id {hi} >= num_nodes={num_nodes}")
    return ids.astype(np.int32, copy=False)


def from_edge_index(
    edge_index,
    num_nodes: int | None = None,
    *,
    nodes=None,
    edges=None,
) -> jraph.GraphsTuple:
    """Build a graph from a PyG style ``edge_index`` (edge ``i`` is ``edge_index[:, i]``).

    Args:
      edge_index: integer array [2, E]; row 0 holds senders (sources), row 1 receivers.
      num_nodes: ``N``. Defaults to the leading dimension of ``nodes`` (any leaf) if given,
        else ``edge_index.max() + 1`` (0 for an empty ``edge_index``).
      nodes: optional node data (array or pytree of arrays with leading dimension ``N``).
      edges: optional edge data (array or pytree of arrays with leading dimension ``E``).

    Raises:
      TypeError: ``edge_index`` is not integer typed.
      ValueError: wrong shape, negative ids, ids ``>= num_nodes``, ``num_nodes`` out of int32
        range, or a ``nodes``/``edges`` leaf with the wrong leading dimension.
    """
    edge_index = np.asarray(edge_index)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got shape {edge_index.shape}")
    if edge_index.dtype == np.bool_ or not np.issubdtype(edge_index.dtype, np.integer):
        raise TypeError(f"edge_index must have an integer dtype, got {edge_index.dtype}")
    if num_nodes is None:
        leaves = jax.tree_util.tree_leaves(nodes)
        if leaves and np.ndim(leaves[0]) > 0:
            num_nodes = int(np.shape(leaves[0])[0])
        else:
            num_nodes = int(edge_index.max()) + 1 if edge_index.size else 0
    num_nodes = int(num_nodes)
    if num_nodes < 0 or num_nodes > _INT32_MAX:
        raise ValueError(f"num_nodes must be in [0, 2**31 - 1], got {num_nodes}")
    senders = check_indices(edge_index[0], num_nodes, "edge_index[0] (senders)")
    receivers = check_indices(edge_index[1], num_nodes, "edge_index[1] (receivers)")
    _check_leading_dim(nodes, num_nodes, "nodes")
    _check_leading_dim(edges, senders.shape[0], "edges")
    return make_graph(senders, receivers, num_nodes, nodes=nodes, edges=edges)


def from_scipy(matrix, *, nodes=None, weight_key: str | None = None) -> jraph.GraphsTuple:
    """Build a graph from a square scipy sparse adjacency matrix.

    Every stored entry ``(i, j)`` (explicit zeros included, duplicates kept) becomes an edge
    ``i -> j`` (row = sender, column = receiver). Edge order is the COO order of
    ``matrix.tocoo()`` (row-major for CSR input).

    Args:
      matrix: ``scipy.sparse`` matrix or array of shape [N, N].
      nodes: optional node data with leading dimension ``N``.
      weight_key: if given, ``edges = {weight_key: float32 [E]}`` holds the stored values;
        otherwise ``edges = None``.
    """
    import scipy.sparse as sp

    if not sp.issparse(matrix):
        raise TypeError(f"matrix must be a scipy.sparse matrix, got {type(matrix).__name__}")
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"matrix must be a square [N, N] adjacency, got shape {matrix.shape}")
    num_nodes = int(matrix.shape[0])
    if num_nodes > _INT32_MAX:
        raise ValueError(f"matrix has {num_nodes} nodes, more than int32 can index")
    coo = matrix.tocoo()
    senders = check_indices(coo.row, num_nodes, "matrix row indices (senders)")
    receivers = check_indices(coo.col, num_nodes, "matrix column indices (receivers)")
    _check_leading_dim(nodes, num_nodes, "nodes")
    edges = None if weight_key is None else {weight_key: np.asarray(coo.data, dtype=np.float32)}
    return make_graph(senders, receivers, num_nodes, nodes=nodes, edges=edges)


def _stack_attr(values: list, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    elif arr.dtype == np.int64:
        arr = arr.astype(np.int32)
    elif arr.dtype == object:
        raise ValueError(f"{what} values do not stack into a rectangular numeric array")
    return arr


def from_networkx(g, *, node_attrs=(), edge_attrs=()) -> jraph.GraphsTuple:
    """Build a graph from a networkx graph.

    Node ``k`` of the result is the ``k``-th node of ``g.nodes`` (iteration order). Directed
    graphs keep their edges in ``g.edges`` order; undirected graphs are converted with
    ``g.to_directed()`` (each edge ``{u, v}`` becomes ``u -> v`` and ``v -> u``; a self-loop stays
    one edge). Parallel edges of multigraphs are kept.

    Args:
      g: a ``networkx.Graph``/``DiGraph``/``MultiGraph``/``MultiDiGraph``.
      node_attrs: names of node attributes to stack into ``nodes = {name: [N, ...]}``
        (``None`` when empty). float64 values become float32, int64 become int32.
      edge_attrs: names of edge attributes to stack into ``edges = {name: [E, ...]}``.

    Raises:
      TypeError: ``g`` is not a networkx graph.
      ValueError: a requested attribute is missing on some node/edge.
    """
    import networkx as nx

    if not isinstance(g, nx.Graph):
        raise TypeError(f"g must be a networkx graph, got {type(g).__name__}")
    if isinstance(node_attrs, str) or isinstance(edge_attrs, str):
        raise TypeError("node_attrs and edge_attrs must be sequences of attribute names, not str")
    order = list(g.nodes)
    index = {n: i for i, n in enumerate(order)}
    dg = g if g.is_directed() else g.to_directed(as_view=True)
    edge_list = list(dg.edges(data=True))
    senders = np.fromiter((index[u] for u, _, _ in edge_list), dtype=np.int64, count=len(edge_list))
    receivers = np.fromiter((index[v] for _, v, _ in edge_list), dtype=np.int64, count=len(edge_list))

    nodes = None
    if node_attrs:
        nodes = {}
        for name in node_attrs:
            vals = []
            for n in order:
                data = g.nodes[n]
                if name not in data:
                    raise ValueError(f"node attribute {name!r} is missing on node {n!r}")
                vals.append(data[name])
            nodes[name] = _stack_attr(vals, f"node attribute {name!r}")
    edges = None
    if edge_attrs:
        edges = {}
        for name in edge_attrs:
            vals = []
            for u, v, data in edge_list:
                if name not in data:
                    raise ValueError(f"edge attribute {name!r} is missing on edge ({u!r}, {v!r})")
                vals.append(data[name])
            edges[name] = _stack_attr(vals, f"edge attribute {name!r}")
    if len(order) > _INT32_MAX:
        raise ValueError(f"g has {len(order)} nodes, more than int32 can index")
    return make_graph(senders, receivers, len(order), nodes=nodes, edges=edges)


def _numpy(tensor, what: str) -> np.ndarray:
    """A torch tensor (or array-like) as NumPy: float64 -> float32, int64 -> int32 for the jgnn conventions."""
    arr = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    if arr.dtype == np.int64 and what != "edge_index":
        arr = arr.astype(np.int32)
    return arr


def _named_fields(store, names) -> dict | None:
    """The named, present entries of a feature store (a PyG ``Data``, a DGL ``ndata``/``edata``) as NumPy."""
    out = {k: _numpy(store[k], k) for k in names if k in store and store[k] is not None}
    return out or None


def from_pyg(data, *, node_attrs=("x",), edge_attrs=("edge_attr",)) -> jraph.GraphsTuple:
    """Build a graph from a PyTorch Geometric ``Data``, or a ``Batch`` of graphs (then ``n_node``/``n_edge`` [G]).

    ``nodes`` is ``data.x`` as float32 [N, F] when ``node_attrs == ("x",)`` (``None`` without ``x``), else a
    dict of the named node attributes; ``edges`` likewise from ``edge_attrs``. A ``Batch`` (``data.ptr`` set)
    keeps its graphs: its edges must be grouped by graph, as ``Batch.from_data_list`` makes them.
    """
    if not hasattr(data, "edge_index"):
        raise TypeError(f"data must be a torch_geometric Data, got {type(data).__name__}")
    num_nodes = int(data.num_nodes)
    nodes = _named_fields(data, node_attrs)
    edges = _named_fields(data, edge_attrs)
    if tuple(node_attrs) == ("x",) and nodes is not None:
        nodes = nodes["x"]
    if tuple(edge_attrs) == ("edge_attr",) and edges is not None:
        edges = edges["edge_attr"]
    graph = from_edge_index(_numpy(data.edge_index, "edge_index"), num_nodes, nodes=nodes, edges=edges)
    ptr = getattr(data, "ptr", None)
    if ptr is None:
        return graph
    ptr = _numpy(ptr, "edge_index").astype(np.int64)
    node_graph = np.repeat(np.arange(ptr.shape[0] - 1), np.diff(ptr))
    edge_graph = node_graph[graph.senders]
    if np.any(np.diff(edge_graph) < 0):
        raise ValueError("from_pyg: the batch's edges are not grouped by graph")
    n_edge = np.bincount(edge_graph, minlength=ptr.shape[0] - 1)
    return graph._replace(n_node=np.diff(ptr).astype(np.int32), n_edge=n_edge.astype(np.int32))


def from_pyg_hetero(data):
    """Build a :class:`jgnn.hetero.HeteroGraph` from a PyTorch Geometric ``HeteroData``.

    Node and edge types keep ``data.node_types`` / ``data.edge_types`` order (so ``to_typed_graph`` gives the
    type ids of PyG's ``to_homogeneous``); ``x`` of each node type and ``edge_attr`` of each edge type become the
    features (float32).
    """
    from jgnn.hetero import HeteroGraph

    if not hasattr(data, "node_types") or not hasattr(data, "edge_types"):
        raise TypeError(f"data must be a torch_geometric HeteroData, got {type(data).__name__}")
    num_nodes = {t: int(data[t].num_nodes) for t in data.node_types}
    edge_index = {tuple(et): _numpy(data[et].edge_index, "edge_index") for et in data.edge_types}
    node_features = {t: _numpy(data[t].x, "x") for t in data.node_types if getattr(data[t], "x", None) is not None}
    edge_features = {tuple(et): _numpy(data[et].edge_attr, "edge_attr") for et in data.edge_types
                     if getattr(data[et], "edge_attr", None) is not None}
    return HeteroGraph(num_nodes, edge_index, node_features, edge_features)


def _single(fields, names):
    """One requested name: its array itself (as `from_pyg` gives ``x``); several: the dict."""
    return fields[names[0]] if fields is not None and len(names) == 1 else fields


def from_dgl(g, *, node_attrs=("feat",), edge_attrs=("feat",)) -> jraph.GraphsTuple:
    """Build a graph from a homogeneous DGL graph, or a batch of them (``dgl.batch``: ``n_node``/``n_edge`` [G]).

    Edges keep DGL's edge-id order (``g.edges(order="eid")``). ``nodes`` is ``g.ndata["feat"]`` [N, F] with the
    default ``node_attrs`` (``None`` without it), else a dict of the named ``g.ndata`` entries; ``edges``
    likewise from ``g.edata``. Float64 becomes float32 and int64 features int32. DGL need not be installed:
    ``g`` is read through its public API (``num_nodes``, ``edges``, ``ndata``, ``edata``, ``batch_num_nodes``).
    """
    if not all(hasattr(g, a) for a in ("edges", "ndata", "edata", "num_nodes")):
        raise TypeError(f"g must be a DGLGraph, got {type(g).__name__}")
    if len(getattr(g, "ntypes", ("_N",))) != 1 or len(getattr(g, "canonical_etypes", ((None,) * 3,))) != 1:
        raise ValueError("from_dgl: g is heterogeneous (several node or edge types); use from_dgl_hetero")
    src, dst = (_numpy(a, "edge_index") for a in g.edges(order="eid"))
    node_attrs, edge_attrs = tuple(node_attrs), tuple(edge_attrs)
    graph = from_edge_index(np.stack([src, dst]), int(g.num_nodes()),
                            nodes=_single(_named_fields(g.ndata, node_attrs), node_attrs),
                            edges=_single(_named_fields(g.edata, edge_attrs), edge_attrs))
    if int(getattr(g, "batch_size", 1)) == 1:
        return graph
    n_node = _numpy(g.batch_num_nodes(), "n_node").astype(np.int32)
    n_edge = _numpy(g.batch_num_edges(), "n_edge").astype(np.int32)
    edge_graph = np.repeat(np.arange(n_node.shape[0]), n_node)[graph.senders]
    if np.any(np.diff(edge_graph) < 0) or not np.array_equal(np.bincount(edge_graph, minlength=n_node.shape[0]),
                                                             n_edge):
        raise ValueError("from_dgl: the batch's edges are not grouped by graph as batch_num_edges() says")
    return graph._replace(n_node=n_node, n_edge=n_edge)


def from_dgl_hetero(g, *, node_attr: str = "feat", edge_attr: str = "feat"):
    """Build a :class:`jgnn.hetero.HeteroGraph` from a heterogeneous DGL graph.

    Node types keep ``g.ntypes`` order and edge types ``g.canonical_etypes`` order (``(src, relation, dst)``,
    the HeteroGraph keys); ``node_attr`` of each node type and ``edge_attr`` of each edge type become the
    features. Read through DGL's public API, as `from_dgl`.
    """
    from jgnn.hetero import HeteroGraph

    if not hasattr(g, "ntypes") or not hasattr(g, "canonical_etypes"):
        raise TypeError(f"g must be a DGLGraph, got {type(g).__name__}")
    num_nodes = {t: int(g.num_nodes(t)) for t in g.ntypes}
    edge_index = {tuple(et): np.stack([_numpy(a, "edge_index") for a in g.edges(etype=tuple(et), order="eid")])
                  for et in g.canonical_etypes}
    node_features = {t: _numpy(g.nodes[t].data[node_attr], node_attr) for t in g.ntypes
                     if node_attr in g.nodes[t].data}
    edge_features = {tuple(et): _numpy(g.edges[tuple(et)].data[edge_attr], edge_attr) for et in g.canonical_etypes
                     if edge_attr in g.edges[tuple(et)].data}
    return HeteroGraph(num_nodes, edge_index, node_features, edge_features)
