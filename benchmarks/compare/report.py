"""The comparison's Markdown tables and PNG chart (matplotlib, Agg)."""
from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEM_ORDER = ("jgnn", "hand", "jraph", "pyg2", "pyg1")
LABELS = {"jgnn": "jgnn", "hand": "hand", "jraph": "jraph", "pyg2": "PyG 2 threads", "pyg1": "PyG 1 thread"}


def _cases(rows: list[dict]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(r["case"], {})[r["system"]] = r
    return out


def _ms(r: dict | None) -> str:
    if r is None:
        return "–"
    if r["status"] != "ok":
        return "error"
    t = r.get("time_ms")
    return "–" if t is None else f"{t:,.0f}" if t >= 100 else f"{t:.3g}"


def _mib(r: dict | None) -> str:
    return "–" if r is None or r.get("memory_bytes") is None else f"{r['memory_bytes'] / 2**20:,.0f}"


def _x(v) -> str:
    return "" if v is None else f"{v:.2f}×"


def _load(r: dict) -> str:
    lb, la = r.get("load_before"), r.get("load_after")
    return "" if lb is None else f"{lb[0]:.1f} → {la[0]:.1f}"


def summary_table(rows: list[dict]) -> list[str]:
    lines = ["| model / data (N / E) | mode | jgnn ms | hand | jraph | PyG 2 thr. | PyG 1 thr. | jgnn ÷ best peer "
             "| ÷ hand | ÷ PyG | MiB jgnn / hand / jraph / PyG 2 | MiB ÷ smallest peer | first call s jgnn / hand "
             "| load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for by_sys in _cases(rows).values():
        r0, j = next(iter(by_sys.values())), by_sys.get("jgnn", {})
        first = lambda s: "–" if by_sys.get(s, {}).get("first_call_s") is None else f"{by_sys[s]['first_call_s']:.1f}"
        best = f" ({LABELS[j['best_peer']]})" if j.get("best_peer") else ""
        cells = [f"{r0['model'].upper()} / {r0['dataset']} ({r0['num_nodes']:,} / {r0['num_edges']:,})", r0["mode"],
                 *(_ms(by_sys.get(s)) for s in SYSTEM_ORDER), _x(j.get("time_vs_best_peer")) + best,
                 _x(j.get("time_vs_hand")), _x(j.get("time_vs_pyg")),
                 " / ".join(_mib(by_sys.get(s)) for s in ("jgnn", "hand", "jraph", "pyg2")),
                 _x(j.get("memory_vs_smallest_peer")), f"{first('jgnn')} / {first('hand')}", _load(r0)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def detail_table(rows: list[dict]) -> list[str]:
    lines = ["| case | system | status | min / median / max ms | calls × rounds | trace s | compile s | first run s "
             "| prep s | memory MiB | temp MiB | memory metric | first-step loss | 2nd-step loss | rel. diff vs hand |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, fmt="{:.2f}": "" if v is None else fmt.format(v)
    for r in rows:
        losses = r.get("losses") or [None, None]
        t = "" if r.get("time_ms") is None else f"{r['time_min_ms']:.3g} / {r['time_ms']:.3g} / {r['time_max_ms']:.3g}"
        lines.append(
            f"| {r['case']} | {r['system']} | {r['status'][:120].replace('|', '/')} | {t} "
            f"| {f(r.get('calls_per_round'), '{}')} × {f(r.get('rounds'), '{}')} | {f(r.get('trace_s'))} "
            f"| {f(r.get('compile_s'))} | {f(r.get('first_run_s'), '{:.3f}')} | {f(r.get('prep_s'))} "
            f"| {f(None if r.get('memory_bytes') is None else r['memory_bytes'] / 2**20, '{:.1f}')} "
            f"| {f(None if r.get('temp_bytes') is None else r['temp_bytes'] / 2**20, '{:.1f}')} "
            f"| {r.get('memory_metric', '')} | {f(losses[0], '{:.7g}')} "
            f"| {f(losses[1] if len(losses) > 1 else None, '{:.7g}')} "
            f"| {', '.join(f'{k} {v:.1e}' for k, v in (r.get('rel_error') or {}).items())} |")
    return lines


def markdown(meta: dict, rows: list[dict]) -> str:
    v = meta["versions"]
    sources = dict.fromkeys(f"- {r['dataset']}: {r['source']}" for r in rows if r.get("source"))
    lines = [
        f"# CPU comparison: jgnn against hand-written JAX, jraph and PyG ({meta['date']})", "",
        *([f"**Note.** {meta['note']}", ""] if meta.get("note") else []),
        f"- command: `{meta['command']}`",
        f"- git commit `{meta['git_commit']}`; {meta['cpu']} ({meta['num_cpus']} cores); "
        f"jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}, optax {v['optax']}, jraph {v['jraph']}, "
        f"torch {v['torch']}, torch_geometric {v['torch_geometric']} ({meta['pyg_extensions']})",
        f"- `uptime` before: {meta['uptime_before']}; after: {meta['uptime_after']}; cases finished: "
        f"{meta.get('cases_done', 'all')}",
        f"- method: one full-batch step per call ({meta['train_step']}); every system starts from the same weights "
        f"and its results must agree with hand's (relative differences at most: first-step loss "
        f"{meta['rtol']['first']:g}, second-step loss {meta['rtol']['second']:g}, inference logits "
        f"{meta['rtol']['logits']:g}; else the row is an error); {meta['rounds']} interleaved rounds, all systems in "
        f"each round, the order rotated by one each round; each round times enough calls to last about "
        f"{meta['target_s']} s and keeps their median; the table "
        f"gives the median over rounds (min and max below). Every case runs in its own process"
        f"{'' if meta['isolate'] else ' (not here: --no-isolate)'}.",
        "- first call: trace and lower (jgnn's rewrites happen here) + XLA compile + the first step; PyG: its first "
        "step. prep: host preprocessing once per graph (jgnn: `GraphLayout.from_graph`; PyG: tensors and weights).",
        f"- memory: {meta['memory_metric']}",
        "- ratios: jgnn's median over the best (fastest) peer, over hand, and over the faster PyG thread count; "
        "memory over the smallest peer. Below 1 is better for jgnn.",
        "", "## Summary", "", *summary_table(rows), "", "## Every row", "", *detail_table(rows), "",
        "## Data", "", *sources, "",
    ]
    return "\n".join(lines)


def chart(rows: list[dict], path: pathlib.Path, title: str) -> None:
    """Step time and memory of every system relative to hand, per case (log scale; bars span min–max)."""
    cases = [c for c, s in _cases(rows).items() if "hand" in s and s["hand"]["status"] == "ok"]
    by = _cases(rows)
    fig, axes = plt.subplots(1, 2, figsize=(15, 0.55 * len(cases) + 2.5), sharey=True)
    width = 0.8 / len(SYSTEM_ORDER)
    colors = dict(zip(SYSTEM_ORDER, ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:gray"), strict=True))
    for ax, (key, label) in zip(axes, (("time_ms", "step time ÷ hand (median; min–max)"),
                                       ("memory_bytes", "memory ÷ hand")), strict=True):
        for k, system in enumerate(SYSTEM_ORDER):
            ys, vals, lo, hi = [], [], [], []
            for i, case in enumerate(cases):
                r, h = by[case].get(system), by[case]["hand"]
                if r is None or r["status"] != "ok" or r.get(key) is None:
                    continue
                ys.append(i + (k - 2) * width)
                vals.append(r[key] / h[key])
                if key == "time_ms":
                    lo.append(vals[-1] - r["time_min_ms"] / h["time_ms"])
                    hi.append(r["time_max_ms"] / h["time_ms"] - vals[-1])
            ax.barh(ys, vals, height=width, color=colors[system], label=LABELS[system],
                    xerr=[lo, hi] if key == "time_ms" and vals else None, error_kw={"lw": 0.6})
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(range(len(cases)))
    axes[0].set_yticklabels(cases, fontsize=8)
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
