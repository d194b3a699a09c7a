"""The benchmark table: suites -> (model, dataset, mode) cases, and the systems measured for each.

Everything the runner does is driven by :data:`SUITES`, :data:`MODELS` and :func:`cases`; the smoke test
builds its list of expected rows from the same table.
"""
from __future__ import annotations

import dataclasses

# ---- models -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A stack of ``layers`` convolutions of one ``kind`` with ReLU between them.

    Hidden layers have ``hidden`` features per head and ``heads`` heads (concatenated). The last layer of a
    multi-layer model outputs the data set's class count with one head; a one-layer model (Hector) maps
    ``in_dim`` -> ``hidden``.
    """

    kind: str  # gcn | gat | rgcn | rgat | hgt
    layers: int
    hidden: int
    heads: int = 1
    in_dim: int | None = None  # typed graphs have no input features: random [N, in_dim] ones are used

    @property
    def typed(self) -> bool:
        return self.kind in ("rgcn", "rgat", "hgt")


MODELS: dict[str, ModelSpec] = {
    "gcn": ModelSpec("gcn", layers=2, hidden=64),
    "gat": ModelSpec("gat", layers=2, hidden=64, heads=1),
    "gat-128x1": ModelSpec("gat", layers=2, hidden=128, heads=1),
    "gat-64x4": ModelSpec("gat", layers=2, hidden=64, heads=4),
    "rgcn": ModelSpec("rgcn", layers=1, hidden=64, in_dim=64),
    "rgat": ModelSpec("rgat", layers=1, hidden=64, heads=1, in_dim=64),
    "hgt": ModelSpec("hgt", layers=1, hidden=64, heads=1, in_dim=64),
    # Seastar / R-GCN entity classification: 2 layers, 16 hidden (Schlichtkrull et al.).
    "rgcn-2x16": ModelSpec("rgcn", layers=2, hidden=16, in_dim=64),
}

# Fused kernels of the micro suite (`pallas_kernels.<module>.<name>`), at these feature widths.
KERNELS = ("gather_reduce", "attention_aggregate", "gather_compute", "typed_matmul")
MICRO_DIMS = (64, 128, 602)

# ---- systems ----------------------------------------------------------------------------------------------

# jgnn_xla: jgnn's XLA backend beside its Pallas one on a GPU (on a CPU the jgnn row is that backend already), to
# show per row whether the kernels pay (2026-11-27: on AIFB-sized graphs they did not).
JAX_SYSTEMS = ("jgnn", "jgnn_xla", "reference")
#: the system every ratio is taken against, per suite kind
BASELINE = {"model": "reference", "micro": "xla"}
#: PyG classes mirrored per model kind (GPU only); jraph models exist only for GCN and GAT
PYG_KINDS = ("gcn", "gat", "rgcn", "hgt")
JRAPH_KINDS = ("gcn", "gat")


def model_systems(kind: str) -> tuple[str, ...]:
    systems = list(JAX_SYSTEMS)
    if kind in JRAPH_KINDS:
        systems.append("jraph")
    if kind in PYG_KINDS:
        systems.append("pyg")
    return tuple(systems)


def micro_systems(kernel: str) -> tuple[str, ...]:
    extra = ("ragged_dot",) if kernel == "typed_matmul" else ()
    return ("pallas", "xla", *extra, "byte_floor")


# ---- suites -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    models: tuple[str, ...]
    datasets: tuple[str, ...]
    modes: tuple[str, ...]
    paper: str
    gpu_only_datasets: tuple[str, ...] = ()


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("graphiler", ("gcn", "gat"), ("pubmed", "ppi", "ogbn-arxiv", "reddit"), ("inference",),
              "Graphiler (MLSys'22) Table 2 data, Fig. 7-8 inference speedup and memory"),
        Suite("ugcg", ("gat-128x1", "gat-64x4"), ("cora", "pubmed", "reddit"), ("training",),
              "UGCG memory and time figures (GAT training)"),
        Suite("hector", ("rgcn", "rgat", "hgt"),
              ("aifb", "mutag", "bgs", "ogbn-biokg", "am", "fb15k", "ogbn-mag", "wikikg2"),
              ("training", "inference"),
              "Hector (ASPLOS'24) Table 3 data and its training / inference speedup figures",
              gpu_only_datasets=("ogbn-mag", "wikikg2")),
        Suite("seastar", ("rgcn-2x16",), ("aifb", "mutag", "bgs"), ("training",),
              "Seastar (EuroSys'21) R-GCN table"),
        Suite("micro", KERNELS, tuple(f"ogbn-arxiv/d={d}" for d in MICRO_DIMS), ("forward",),
              "kernel vs byte floor and vs the XLA segment-op version (no paper counterpart)"),
    )
}


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    model: str
    dataset: str
    mode: str
    systems: tuple[str, ...]
    gpu_only: bool = False

    @property
    def micro(self) -> bool:
        return self.suite == "micro"


def cases(names: list[str] | tuple[str, ...]) -> list[Case]:
    """Every case of the named suites (``"all"`` expands to all of them), in table order."""
    if "all" in names:
        names = list(SUITES)
    out = []
    for name in names:
        if name not in SUITES:
            raise ValueError(f"unknown suite {name!r}; expected one of {sorted(SUITES)} or 'all'")
        s = SUITES[name]
        for dataset in s.datasets:  # data set outermost: consecutive cases share one graph
            for model in s.models:
                systems = micro_systems(model) if name == "micro" else model_systems(MODELS[model].kind)
                for mode in s.modes:
                    out.append(Case(name, model, dataset, mode, systems, dataset in s.gpu_only_datasets))
    return out


def expected_rows(names) -> list[tuple[str, str, str, str, str]]:
    """``(suite, model, dataset, system, mode)`` of every row a run of ``names`` must produce."""
    return [(c.suite, c.model, c.dataset, sys, c.mode) for c in cases(names) for sys in c.systems]


# ---- sizes ------------------------------------------------------------------------------------------------

#: ``--quick`` caps: presets are scaled down uniformly until both hold (typed graphs get smaller caps
#: because the reference program materializes per-edge weight matrices).
QUICK_CAPS = {"homogeneous": (2_000, 10_000), "typed": (1_000, 2_000)}


def quick_scale(num_nodes: int, num_edges: int, typed: bool) -> float:
    max_n, max_e = QUICK_CAPS["typed" if typed else "homogeneous"]
    return min(1.0, max_n / max(num_nodes, 1), max_e / max(num_edges, 1))
