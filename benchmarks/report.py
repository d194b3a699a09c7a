"""Markdown tables and PNG bar charts (matplotlib, Agg) of a results file."""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks import suites  # noqa: E402


def _num(v, fmt: str = "{:.3g}") -> str:
    return "" if v is None else fmt.format(v)


def _mb(v) -> str:
    return "" if v is None else f"{v / 2**20:.1f}"


MODEL_COLUMNS = [
    ("model", lambda r: r["model"]), ("dataset", lambda r: r["dataset"]), ("mode", lambda r: r["mode"]),
    ("system", lambda r: r["system"]), ("status", lambda r: r["status"]),
    ("N", lambda r: _num(r.get("num_nodes"), "{}")), ("E", lambda r: _num(r.get("num_edges"), "{}")),
    ("time ms", lambda r: _num(r.get("time_ms"))),
    ("speedup", lambda r: _num(r.get("speedup_vs_reference"), "{:.2f}x")),
    ("memory MiB", lambda r: _mb(r.get("memory_bytes"))),
    ("memory ratio", lambda r: _num(r.get("memory_ratio_vs_reference"), "{:.2f}")),
    ("temp MiB", lambda r: _mb(r.get("temp_bytes"))),
    ("GFLOP", lambda r: _num(None if r.get("flops") is None else r["flops"] / 1e9)),
    ("FLOP ratio", lambda r: _num(r.get("flops_ratio_vs_reference"), "{:.2f}")),
]
MICRO_COLUMNS = [
    ("kernel", lambda r: r["model"]), ("dataset", lambda r: r["dataset"]), ("system", lambda r: r["system"]),
    ("status", lambda r: r["status"]), ("time ms", lambda r: _num(r.get("time_ms"))),
    ("floor MiB", lambda r: _mb(r.get("floor_bytes"))),
    ("of floor", lambda r: _num(r.get("fraction_of_floor"), "{:.2f}")),
    ("vs xla", lambda r: _num(r.get("speedup_vs_reference"), "{:.2f}x")),
    ("GB/s", lambda r: _num(r.get("achieved_gbps"))),
    ("temp MiB", lambda r: _mb(r.get("temp_bytes"))),
]


def markdown(meta: dict, rows: list[dict]) -> str:
    v = meta.get("versions", {})
    lines = [
        f"# Benchmark results ({meta.get('device')}, {meta.get('device_kind')})", "",
        f"- date: {meta.get('date')}; git commit: `{meta.get('git_commit')}`",
        f"- jax {meta.get('jax')}, jaxlib {meta.get('jaxlib')}, torch {meta.get('torch')}, "
        f"torch_geometric {v.get('torch_geometric')}",
        f"- quick: {meta.get('quick')}; timed runs per row: {meta.get('repeats')} (median reported, "
        f"{meta.get('warmup')} warm-up runs excluded); jgnn backend: `{meta.get('jgnn_backend')}`",
        f"- measured copy bandwidth: {meta.get('copy_bandwidth_gbps', 0):.1f} GB/s",
        f"- memory: {meta.get('memory_metric')}",
        "- ratios are against the `reference` backend (micro suite: against the `xla` segment-op version)", "",
    ]
    for suite in dict.fromkeys(r["suite"] for r in rows):
        cols = MICRO_COLUMNS if suite == "micro" else MODEL_COLUMNS
        lines += [f"## {suite}", "", f"{suites.SUITES[suite].paper}", ""]
        lines.append("| " + " | ".join(c for c, _ in cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for r in rows:
            if r["suite"] == suite:
                cells = [str(f(r)).replace("|", "\\|") for _, f in cols]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_markdown(meta: dict, rows: list[dict], path: pathlib.Path) -> None:
    pathlib.Path(path).write_text(markdown(meta, rows))


def write_chart(meta: dict, rows: list[dict], suite: str, path: pathlib.Path) -> None:
    """Two bar charts: speedup and memory ratio vs the baseline, one bar group per (model, dataset, mode)."""
    base = suites.BASELINE["micro" if suite == "micro" else "model"]
    metrics = [("speedup_vs_reference", f"speedup vs {base}"),
               ("memory_ratio_vs_reference" if suite != "micro" else "fraction_of_floor",
                f"memory ratio vs {base}" if suite != "micro" else "fraction of byte floor")]
    keys = [k for k, _ in metrics]
    # Only groups with something measured get a slot (GPU-only rows on a CPU run would be empty columns).
    groups = list(dict.fromkeys((r["model"], r["dataset"], r["mode"]) for r in rows
                                if any(r.get(k) for k in keys)))
    groups = groups or list(dict.fromkeys((r["model"], r["dataset"], r["mode"]) for r in rows))
    systems = [s for s in dict.fromkeys(r["system"] for r in rows) if s != "byte_floor"]
    width_in = min(24.0, max(6.0, 0.35 * len(groups) * max(len(systems) - 1, 1)))
    fig, axes = plt.subplots(2, 1, figsize=(width_in, 7), squeeze=False)
    for ax, (key, label) in zip(axes[:, 0], metrics, strict=True):
        # the baseline is 1 by definition, except against the byte floor
        names = systems if key == "fraction_of_floor" else [s for s in systems if s != base]
        width = 0.8 / max(len(names), 1)
        any_bar = False
        for j, system in enumerate(names):
            xs, ys = [], []
            for i, g in enumerate(groups):
                r = next((r for r in rows if (r["model"], r["dataset"], r["mode"]) == g and r["system"] == system),
                         None)
                if r is not None and r.get(key):
                    xs.append(i + (j - (len(names) - 1) / 2) * width)
                    ys.append(r[key])
            if xs:
                ax.bar(xs, ys, width, label=system)
                any_bar = True
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")  # ratios: 2x faster and 2x slower sit symmetrically around 1
        ax.set_ylabel(label + " (log)")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(["\n".join(g) for g in groups], fontsize=7, rotation=90)
        if any_bar:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no measured rows", transform=ax.transAxes, ha="center")
    fig.suptitle(f"{suite} ({meta.get('device')}, {'quick' if meta.get('quick') else 'full'}): "
                 f"{suites.SUITES[suite].paper}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
