"""Shared plumbing of the training examples: progress bar, compile report, memory, curves, JSON line."""

from __future__ import annotations

import json
import os
import pathlib
import time

import jax
import numpy as np


def temp_bytes(step, *args) -> int | None:
    """XLA's temporary-buffer size of the compiled ``step`` (``None`` when the backend does not report it)."""
    try:
        analysis = jax.jit(step).lower(*args).compile().memory_analysis()
    except Exception:  # noqa: BLE001 - memory analysis is best effort
        return None
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def memory_comparison(step_for, backend: str, *args) -> dict | None:
    """XLA temp memory of one jitted train step, jgnn's against the reference program's, as measured.

    ``step_for(b)`` builds the step for backend ``b``; it is called with ``backend`` and ``"reference"``.
    Returns ``{"jgnn_temp_mib", "reference_temp_mib", "change_percent"}`` with ``change_percent =
    100 * (jgnn - reference) / reference``: negative when jgnn needs less, positive when it needs more (it can:
    see examples/README.md). ``None`` when XLA reports no memory analysis.
    """
    auto, reference = temp_bytes(step_for(backend), *args), temp_bytes(step_for("reference"), *args)
    if auto is None or reference is None:
        return None
    change = 100.0 * (auto - reference) / reference if reference else 0.0
    return {"jgnn_temp_mib": round(auto / 2**20, 2), "reference_temp_mib": round(reference / 2**20, 2),
            "change_percent": round(change, 1)}


def memory_line(memory: dict | None, backend: str) -> str:
    """One line that says what was measured: more, less or the same memory, never a 'saving' that is not one."""
    if memory is None:
        return "memory: XLA did not report a memory analysis on this platform"
    change = memory["change_percent"]
    verdict = (f"{-change:.1f}% less than the reference" if change < 0 else
               f"{change:.1f}% more than the reference" if change > 0 else "the same as the reference")
    return (f"memory (XLA temp buffers of one jitted train step): backend={backend} {memory['jgnn_temp_mib']:.2f} "
            f"MiB, reference {memory['reference_temp_mib']:.2f} MiB: {verdict}")


def save_curves(history: dict[str, list[float]], out_dir: str, stem: str, title: str) -> pathlib.Path:
    """Write the training curves (loss on the left axis, accuracies on the right) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    file = path / f"{stem}.png"
    fig, ax = plt.subplots(figsize=(7, 4))
    epochs = np.arange(1, len(history["loss"]) + 1)
    ax.plot(epochs, history["loss"], color="tab:red", label="train loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    for key, color in (("train_acc", "tab:blue"), ("val_acc", "tab:green"), ("test_acc", "tab:purple")):
        if history.get(key):
            ax2.plot(epochs, history[key], color=color, label=key.replace("_", " "))
    ax2.set_ylabel("accuracy")
    ax2.set_ylim(0, 1)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="center right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(file, dpi=100)
    plt.close(fig)
    return file


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def final_json(**fields) -> None:
    """The last stdout line: one JSON object (the tests and `accuracy.py` parse it)."""
    print(json.dumps(fields), flush=True)


def default_out_dir() -> str:
    return os.environ.get("JGNN_EXAMPLES_OUT", "out")
