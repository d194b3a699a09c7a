"""Graph data sets for jgnn: real-data loaders, synthetic generators and format converters.

Loaders: Planetoid (node classification), AIFB/MUTAG (entity classification), KG link prediction sets,
TUDataset graph classification (:func:`load_tu`), heterogeneous DBLP (:func:`load_hetero_dblp`, a
:class:`jgnn.hetero.HeteroGraph`) and OGB directories. Converters: PyG ``edge_index``, scipy, networkx, PyG
``Data``/``Batch`` (:func:`from_pyg`) and ``HeteroData`` (:func:`from_pyg_hetero`), DGL graphs (:func:`from_dgl`,
:func:`from_dgl_hetero`).

Every loader returns host (NumPy) arrays inside a single-graph ``jraph.GraphsTuple`` with int32
``senders``/``receivers``; see :mod:`jgnn.datasets.types` for the containers and conventions and
:mod:`jgnn.datasets.cache` for where files are looked for (``root=``, ``$JGNN_DATA_DIR``,
``<repo>/../shared/data``, then a download into ``~/.cache/jgnn``).
"""
from jgnn.datasets.cache import DatasetUnavailableError, data_dir, download, search_dirs
from jgnn.datasets.convert import (
    from_dgl,
    from_dgl_hetero,
    from_edge_index,
    from_networkx,
    from_pyg,
    from_pyg_hetero,
    from_scipy,
)
from jgnn.datasets.hetero import HeteroNodeClassificationDataset, load_hetero_dblp
from jgnn.datasets.ogb import load_ogb_directory
from jgnn.datasets.planetoid import load_planetoid, parse_planetoid_raw, read_node_classification_npz
from jgnn.datasets.relational import (
    add_inverse_and_self_loops,
    load_entities,
    load_link_prediction,
    parse_entities_raw,
    parse_ntriples,
    read_triples_archive,
    read_triples_directory,
)
from jgnn.datasets.synthetic import (
    PRESETS,
    GraphStats,
    power_law_graph,
    rmat_edges,
    synthetic_from_preset,
    typed_graph,
)
from jgnn.datasets.tu import load_tu, one_hot_degree, parse_tu_directory
from jgnn.datasets.types import (
    EntityClassificationDataset,
    GraphClassificationDataset,
    LinkPredictionDataset,
    NodeClassificationDataset,
    TypedGraph,
)

__all__ = [
    "PRESETS",
    "DatasetUnavailableError",
    "EntityClassificationDataset",
    "GraphClassificationDataset",
    "GraphStats",
    "HeteroNodeClassificationDataset",
    "LinkPredictionDataset",
    "NodeClassificationDataset",
    "TypedGraph",
    "add_inverse_and_self_loops",
    "data_dir",
    "download",
    "from_edge_index",
    "from_networkx",
    "from_dgl",
    "from_dgl_hetero",
    "from_pyg",
    "from_pyg_hetero",
    "from_scipy",
    "load_entities",
    "load_hetero_dblp",
    "load_link_prediction",
    "load_ogb_directory",
    "load_planetoid",
    "load_tu",
    "one_hot_degree",
    "parse_entities_raw",
    "parse_ntriples",
    "parse_planetoid_raw",
    "parse_tu_directory",
    "power_law_graph",
    "read_node_classification_npz",
    "read_triples_archive",
    "read_triples_directory",
    "rmat_edges",
    "search_dirs",
    "synthetic_from_preset",
    "typed_graph",
]
