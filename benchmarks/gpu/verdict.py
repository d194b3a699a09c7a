"""What fails the check, and the two reports: a JSON file for programs and Markdown tables for people.

A record is one (case, target) compile. Failure codes:

* ``lowering_error``, ``compile_error``, ``ptxas_error``: that stage raised (the record keeps the message);
* ``no_ptx``: XLA compiled a Triton call whose PTX the ptxas wrapper never saw (the check could not look);
* ``no_kernel``: a kernel configuration lowered without any Triton call;
* ``spill``: a kernel spills registers to local memory (``spill_stores + spill_loads > 0``);
* ``missing_kernel``: a layer's training step calls an expected kernel fewer times than `layers.EXPECTED_KERNELS`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Failure:
    code: str
    case: str
    target: str
    kernel: str | None = None
    detail: object = None


def failures(record: dict) -> list[Failure]:
    """The failures of one record (see the module doc for the codes)."""
    case, target = record["case"], record["target"]
    if record["error_code"]:
        return [Failure(record["error_code"], case, target, detail=record["error"])]
    out = [Failure("spill", case, target, k["name"],
                   {"spill_stores": k["spill_stores"], "spill_loads": k["spill_loads"], "registers": k["registers"]})
           for k in record["kernels"] if k["spill_stores"] or k["spill_loads"]]
    if record["kind"] == "kernel" and not record["triton_calls"]:
        out.append(Failure("no_kernel", case, target, detail="no Triton call in the lowered step"))
    if record.get("missing"):
        out.append(Failure("missing_kernel", case, target, detail=record["missing"]))
    return out


def summary(records: list[dict], fails: list[Failure]) -> dict:
    """Per target: configurations compiled, errors by code, kernels, spills, layers that miss kernels."""
    out = {}
    for target in sorted({r["target"] for r in records}):
        mine = [r for r in records if r["target"] == target]
        kernels = [k for r in mine for k in r["kernels"]]
        spilling = [k for k in kernels if k["spill_stores"] or k["spill_loads"]]
        out[target] = {
            "configurations": len(mine),
            "compiled": sum(not r["error_code"] for r in mine),
            "errors": dict(Counter(r["error_code"] for r in mine if r["error_code"])),
            "kernels": len(kernels),
            "spilling_kernels": len(spilling),
            "spill_bytes_max": max((k["spill_stores"] + k["spill_loads"] for k in spilling), default=0),
            "layers_missing_kernels": sorted(f.case for f in fails
                                             if f.target == target and f.code == "missing_kernel"),
            "failures": dict(Counter(f.code for f in fails if f.target == target)),
        }
    return out


def same_ptx(records: list[dict]) -> dict:
    """Of the kernels compiled for more than one target (same case and kernel name), how many got the same PTX."""
    by_kernel: dict[tuple[str, str], dict[str, str]] = {}
    for r in records:
        for k in r["kernels"]:
            by_kernel.setdefault((r["case"], k["name"]), {})[r["target"]] = k["ptx_sha"]
    shared = [set(v.values()) for v in by_kernel.values() if len(v) > 1]
    return {"kernels": len(shared), "identical": sum(len(s) == 1 for s in shared)}


def report(meta: dict, records: list[dict]) -> dict:
    fails = [f for r in records for f in failures(r)]
    return {"meta": meta, "summary": summary(records, fails), "ptx_across_targets": same_ptx(records),
            "failures": [asdict(f) for f in fails], "records": records}


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _brief(detail) -> str:
    if isinstance(detail, str):
        lines = [line for line in detail.splitlines() if line.strip()]
        return (lines[-1] if lines else "")[:160].replace("|", "/")
    return str(detail).replace("|", "/")


def _calls(names: list[str]) -> str:
    return ", ".join(f"{n}×{c}" for n, c in sorted(Counter(names).items())) or "none"


def markdown(rep: dict) -> str:
    meta, records = rep["meta"], rep["records"]
    lines = [f"# gpu-check: JAX {meta['jax']}, {meta['ptxas']}, tier {meta['tier']}", ""]
    s = rep["summary"]
    lines += _table(["target", "configurations", "compiled", "errors", "kernels", "spilling kernels",
                     "max spill B", "layers missing kernels"],
                    [[t, v["configurations"], v["compiled"], v["errors"] or 0, v["kernels"], v["spilling_kernels"],
                      v["spill_bytes_max"], ", ".join(v["layers_missing_kernels"]) or "none"] for t, v in s.items()])
    same = rep["ptx_across_targets"]
    lines += ["", f"Same PTX on every target: {same['identical']} of the {same['kernels']} kernels compiled for "
              "several.", "",
              f"## Failures ({len(rep['failures'])})", ""]
    lines += _table(["code", "case", "target", "kernel", "detail"],
                    [[f["code"], f["case"], f["target"], f["kernel"] or "", _brief(f["detail"])]
                     for f in rep["failures"]])
    lines += ["", "## Layers (training step: value_and_grad in parameters and features)", ""]
    lines += _table(["layer", "target", "Triton calls", "expected", "missing"],
                    [[r["case"], r["target"], _calls(r["triton_calls"]), _calls_expected(r["params"]["expected"]),
                      r["error_code"] or (_calls_missing(r["missing"]) if r["missing"] else "")]
                     for r in records if r["kind"] == "layer"])
    lines += ["", "## Kernels (ptxas -v; shared = dynamic from XLA's launch + static)", ""]
    lines += _table(["case", "target", "kernel", "registers", "spill stores B", "spill loads B", "stack B",
                     "shared B", "threads", "compile s"],
                    [[r["case"], r["target"], k["name"], k["registers"], k["spill_stores"], k["spill_loads"],
                      k["stack_frame"], _shared(k), k["threads"] if k["threads"] is not None else "?",
                      f"{r['seconds']:.1f}"] for r in records for k in r["kernels"]])
    return "\n".join(lines) + "\n"


def _calls_expected(expected: dict) -> str:
    return ", ".join(f"{p}*≥{n}" for p, n in expected.items()) or "-"


def _calls_missing(missing: dict) -> str:
    return ", ".join(f"{p}* {v['found']}/{v['expected']}" for p, v in missing.items())


def _shared(k: dict) -> str:
    dynamic = "?" if k["dynamic_shared"] is None else k["dynamic_shared"]
    return f"{dynamic}+{k['static_shared']}"


def progress_line(record: dict) -> str:
    """One line per compile for the console: the case, and each kernel's registers, spills and shared memory."""
    head = f"{record['target']} {record['case']} {record['seconds']:.1f}s"
    if record["error_code"]:
        return f"{head} {record['error_code'].upper()}: {_brief(record['error'])}"
    parts = [f"{k['name']} {k['registers']}r spill {k['spill_stores']}/{k['spill_loads']}B smem {_shared(k)}B"
             for k in record["kernels"]]
    if record["kind"] == "layer":
        parts = [f"calls: {_calls(record['triton_calls'])}"] + (
            [f"MISSING {_calls_missing(record['missing'])}"] if record["missing"] else [])
    return head + " | " + " | ".join(parts)
