"""The rows of the CPU comparison: (model, data set, mode), the data loader, and the systems measured.

``cpu`` is issue 18's table, its GAT scaling rows and its inference rows, plus real-data extras; ``quick`` is
one tiny case per (model, mode) for CI (its numbers are not results).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from benchmarks.compare import data

JAX_SYSTEMS = ("jgnn", "hand")
PYG_THREADS = (2, 1)
ALL_SYSTEMS = (*JAX_SYSTEMS, "jraph", *(f"pyg{t}" for t in PYG_THREADS))


@dataclasses.dataclass(frozen=True)
class Case:
    model: str  # gat | gcn | rgcn | hgt
    dataset: str
    mode: str  # train | infer
    load: Callable[[], data.Problem]
    group: str = "table"  # table | scaling | inference | extra | quick

    @property
    def key(self) -> str:
        return f"{self.model}/{self.dataset}/{self.mode}"

    @property
    def systems(self) -> tuple[str, ...]:
        jraph = ("jraph",) if self.model in ("gat", "gcn") else ()
        return JAX_SYSTEMS + jraph + tuple(f"pyg{t}" for t in PYG_THREADS)

    def select(self, only: tuple[str, ...] | None) -> tuple[str, ...]:
        """This case's systems that are in ``only`` (all of them when ``only`` is ``None``)."""
        return self.systems if only is None else tuple(s for s in self.systems if s in only)


def _cached(fn, *args, **kw):
    return functools.lru_cache(maxsize=1)(functools.partial(fn, *args, **kw))


cora = _cached(data.planetoid, "cora")
pubmed = _cached(data.planetoid, "pubmed")
rmat_10k = _cached(data.rmat, 10_000, 100_000)
rmat_100k = _cached(data.rmat, 100_000, 1_000_000)
rmat_300k = _cached(data.rmat, 300_000, 3_000_000)
aifb = _cached(data.aifb)
typed_20k = _cached(data.hetero, 20_000, 200_000)
amazon_computers = _cached(data.amazon, "amazon_computers")
amazon_photo = _cached(data.amazon, "amazon_photo")

CPU: tuple[Case, ...] = (
    Case("gat", "cora", "train", cora),
    Case("gat", "pubmed", "train", pubmed),
    Case("gat", "rmat-100k", "train", rmat_100k),
    Case("gcn", "rmat-100k", "train", rmat_100k),
    Case("rgcn", "aifb", "train", aifb),
    Case("hgt", "typed-20k", "train", typed_20k),
    Case("gat", "rmat-10k", "train", rmat_10k, "scaling"),
    Case("gat", "rmat-300k", "train", rmat_300k, "scaling"),
    Case("gat", "rmat-100k", "infer", rmat_100k, "inference"),
    Case("rgcn", "aifb", "infer", aifb, "inference"),
    Case("hgt", "typed-20k", "infer", typed_20k, "inference"),
    Case("gcn", "amazon_computers", "train", amazon_computers, "extra"),
    Case("gat", "amazon_photo", "train", amazon_photo, "extra"),
)

tiny_rmat = _cached(data.rmat, 600, 4_000, features=16, classes=4)
#: two relations keep the hand-written HGT's compile short (CI); the full rows use six
tiny_typed = _cached(data.hetero, 600, 3_000, features=64, classes=4, schema=data.HETERO_SCHEMA[:2])
tiny_relational = _cached(lambda: dataclasses.replace(tiny_typed(), x=None, node_type=None, num_node_types=1,
                                                    schema=None, name="typed-600-featureless"))

#: one tiny case per model; inference runs the same runners without the backward, so one inference case covers it
QUICK: tuple[Case, ...] = (
    Case("gat", "rmat-600", "train", tiny_rmat, "quick"),
    Case("gcn", "rmat-600", "train", tiny_rmat, "quick"),
    Case("rgcn", "typed-600", "train", tiny_relational, "quick"),
    Case("hgt", "typed-600", "train", tiny_typed, "quick"),
    Case("gat", "rmat-600", "infer", tiny_rmat, "quick"),
)

SUITES = {"cpu": CPU, "quick": QUICK}


def select(suite: str, only: str | None = None) -> tuple[Case, ...]:
    """The cases of ``suite``, optionally only those whose key contains ``only`` (e.g. ``"hgt"``)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; expected one of {sorted(SUITES)}")
    chosen = tuple(c for c in SUITES[suite] if only is None or only in c.key)
    if not chosen:
        raise ValueError(f"no case of suite {suite!r} matches {only!r}: {[c.key for c in SUITES[suite]]}")
    return chosen
