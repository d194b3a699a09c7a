"""The CUDA toolchain XLA compiles with, and what ``ptxas -v`` says about each kernel XLA assembles.

XLA's GPU compiler writes each kernel's PTX to a temporary file, runs ``ptxas`` on it and deletes it; with a
compile-only device its ``--xla_dump_to`` dump has the HLO and the thunk sequence (launch sizes, dynamic shared
memory) but no PTX. So XLA is pointed (``xla_gpu_cuda_data_dir``) at a copy of the CUDA directory whose
``bin/ptxas`` is a small script: it runs the real ``ptxas`` with XLA's own arguments plus ``-v``, and keeps the
PTX and that report in ``$JGNN_PTX_LOG``. The figures are thus those of the very assembly XLA ran.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
from dataclasses import dataclass

PTX_LOG_ENV = "JGNN_PTX_LOG"
REAL_PTXAS_ENV = "JGNN_REAL_PTXAS"

# Runs the real ptxas with -v on XLA's arguments; keeps the PTX (the first existing file argument that is not
# -o's) and the report in $JGNN_PTX_LOG, and hands XLA the report on stderr, as ptxas itself would.
_WRAPPER = """#!/bin/sh
# Written by benchmarks/gpu/toolchain.py: keep the PTX that XLA assembles and ptxas's -v report on it.
prev= ; in=
for a in "$@"; do
  if [ "$prev" != "-o" ] && [ -z "$in" ] && [ -f "$a" ]; then in=$a; fi
  prev=$a
done
if [ -z "$in" ] || [ -z "${JGNN_PTX_LOG:-}" ]; then exec "$JGNN_REAL_PTXAS" "$@"; fi
stem="$JGNN_PTX_LOG/$(date +%s%N)-$$"
cp "$in" "$stem.ptx" || exit 1
"$JGNN_REAL_PTXAS" -v "$@" >"$stem.log" 2>&1
rc=$?
cat "$stem.log" >&2
exit $rc
"""


@dataclass(frozen=True)
class Toolchain:
    cuda_root: pathlib.Path  # holds bin/ptxas and nvvm/libdevice
    ptxas: pathlib.Path
    version: str  # ptxas's "release X.Y, VX.Y.Z" line


def _candidate_roots() -> list[pathlib.Path]:
    roots = [os.environ.get(k) for k in ("JGNN_CUDA_ROOT", "CUDA_HOME", "CUDA_PATH")]
    on_path = shutil.which("ptxas")
    if on_path:
        roots.append(str(pathlib.Path(on_path).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    return [pathlib.Path(r) for r in dict.fromkeys(r for r in roots if r)]


def find_toolchain() -> Toolchain:
    """The first CUDA root with both ``bin/ptxas`` and ``nvvm/libdevice``; a clear error naming those tried."""
    tried = _candidate_roots()
    for root in tried:
        ptxas = root / "bin" / "ptxas"
        if ptxas.is_file() and any((root / "nvvm" / "libdevice").glob("libdevice*.bc")):
            out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, check=True).stdout
            release = next((line.strip() for line in out.splitlines() if "release" in line), out.strip())
            return Toolchain(root, ptxas, release)
    raise FileNotFoundError(
        "no CUDA toolchain with bin/ptxas and nvvm/libdevice found (tried "
        + ", ".join(str(r) for r in tried) + "); set JGNN_CUDA_ROOT to the CUDA directory")


def install_wrapper(tc: Toolchain, where: pathlib.Path) -> pathlib.Path:
    """A CUDA directory under ``where`` whose ``bin/ptxas`` keeps PTX; pass it as ``xla_gpu_cuda_data_dir``.

    Sets ``$JGNN_REAL_PTXAS`` for the wrapper (XLA's subprocesses inherit the environment).
    """
    root = where / "cuda"
    (root / "bin").mkdir(parents=True, exist_ok=True)
    for tool in (tc.cuda_root / "bin").iterdir():  # nvlink, fatbinary, ... as they are
        if tool.name != "ptxas" and not (root / "bin" / tool.name).exists():
            (root / "bin" / tool.name).symlink_to(tool)
    if not (root / "nvvm").exists():
        (root / "nvvm").symlink_to(tc.cuda_root / "nvvm")
    wrapper = root / "bin" / "ptxas"
    wrapper.write_text(_WRAPPER)
    wrapper.chmod(0o755)
    os.environ[REAL_PTXAS_ENV] = str(tc.ptxas)
    return root


@dataclass(frozen=True)
class KernelResources:
    """One entry function as ``ptxas -v`` reports it. Sizes in bytes."""

    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_shared: int
    barriers: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_verbose(text: str) -> list[KernelResources]:
    """The entry functions in ``ptxas -v`` output. Absent lines mean 0 (ptxas omits zero frames and smem)."""
    fields: dict[str, dict[str, int]] = {}
    entries: list[str] = []
    current = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            entries.append(current)
        elif m := _PROPERTIES.search(line):
            current = m.group(1)
        if current is None:
            continue
        f = fields.setdefault(current, {})
        if m := _FRAME.search(line):
            f["stack_frame"], f["spill_stores"], f["spill_loads"] = map(int, m.groups())
        if m := _USED.search(line):
            f["registers"] = int(m.group(1))
        if m := _BARRIERS.search(line):
            f["barriers"] = int(m.group(1))
        if m := _SMEM.search(line):
            f["static_shared"] = int(m.group(1))
    keys = ("registers", "spill_stores", "spill_loads", "stack_frame", "static_shared", "barriers")
    return [KernelResources(name, **{k: fields.get(name, {}).get(k, 0) for k in keys}) for name in entries]


def report(ptx: pathlib.Path) -> list[KernelResources]:
    """The ``ptxas -v`` report the wrapper kept beside ``ptx``."""
    log = ptx.with_suffix(".log")
    if not log.is_file():
        raise FileNotFoundError(f"no ptxas report beside {ptx.name}")
    return parse_verbose(log.read_text())


def ptx_entries(ptx: pathlib.Path) -> list[str]:
    return re.findall(r"^\.visible \.entry (\w+)\(", ptx.read_text(), re.MULTILINE)
