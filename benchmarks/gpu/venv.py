"""Build, or reuse, a Python 3.12 virtualenv with one JAX release, its CUDA 13 plugin and jgnn's dependencies.

    python3 benchmarks/gpu/venv.py VERSION     # prints the virtualenv's python on stdout

Standard library only: it runs before any virtualenv exists. JAX 0.11 and later need Python 3.12, which the
project's own virtualenv (3.11, JAX 0.10.2) is not. Everything lives under ``$JGNN_GPU_CHECK_CACHE``
(default ``~/.cache/jgnn/gpu-check``), outside the checkout, so a fresh clone (CI) reuses it:
* ``wheels/``: every wheel ever downloaded; installs are offline from here, and only a miss downloads
  (``pip download``), so the second JAX version fetches only its own jax, jaxlib, plugin and pjrt;
* ``venv-VERSION/``: the virtualenv, rebuilt only when its requirement list changes.

jgnn itself is not installed: the check runs from the checkout (``python -m ...`` from the repository root).
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("JGNN_GPU_CHECK_CACHE", pathlib.Path.home() / ".cache" / "jgnn" / "gpu-check"))
WHEELS = CACHE / "wheels"
PYTHON = (3, 12)
# Beyond pyproject's dependencies: the CUDA 13 PJRT plugin (no NVIDIA libraries: nothing runs on a GPU here)
# and what the CUDA lowering tests need (tests/conftest.py imports hypothesis).
EXTRA = ("jax-cuda13-plugin=={v}", "jax-cuda13-pjrt=={v}", "pytest>=8", "pytest-timeout>=2", "hypothesis>=6.100")
_JAX = re.compile(r"^(jax|jaxlib)\s*([<>=!~].*)?$")


def _log(msg: str) -> None:
    print(f"gpu-check venv: {msg}", file=sys.stderr, flush=True)


def _is_python312(exe: str) -> bool:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and tuple(map(int, out.stdout.split())) == PYTHON


def find_python() -> str:
    """A Python 3.12: ``$GPU_CHECK_PYTHON``, ``python3.12`` on PATH, or one that pyenv installed."""
    candidates = [os.environ.get("GPU_CHECK_PYTHON"), shutil.which("python3.12")]
    pyenv_roots = [os.environ.get("PYENV_ROOT"), str(pathlib.Path.home() / ".pyenv")]
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        pyenv_roots.insert(0, out.stdout.strip() if out.returncode == 0 else None)
    for root in filter(None, pyenv_roots):
        candidates += sorted(glob.glob(f"{root}/versions/3.12*/bin/python3.12"), reverse=True)
    for exe in filter(None, candidates):
        if _is_python312(exe):
            return exe
    raise SystemExit("gpu-check needs a Python 3.12 interpreter (JAX 0.11+ wheels need Python >= 3.12) and found "
                     "none: not $GPU_CHECK_PYTHON, python3.12 on PATH, nor pyenv's versions/3.12*. Install one "
                     "(e.g. `pyenv install 3.12`) or set GPU_CHECK_PYTHON=/path/to/python3.12.")


def requirements(version: str) -> list[str]:
    """pyproject's dependencies with jax and jaxlib pinned to ``version``, plus `EXTRA`."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    if not re.fullmatch(r"\d+(\.\d+)+", version):
        raise SystemExit(f"gpu-check venv: {version!r} is not a JAX release number such as 0.12.0.1")
    pinned = [f"{m.group(1)}=={version}" if (m := _JAX.match(d.replace(" ", ""))) else d for d in deps]
    return pinned + [e.format(v=version) for e in EXTRA]


def _pip(python: pathlib.Path, *args: str) -> bool:
    # stdout carries the answer (the interpreter's path), so pip talks on stderr
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args]
    return subprocess.run(cmd, stdout=sys.stderr).returncode == 0


def ensure(version: str) -> pathlib.Path:
    """The virtualenv's python for JAX ``version``, built if missing or stale."""
    reqs = requirements(version)
    venv = CACHE / f"venv-{version}"
    python, stamp = venv / "bin" / "python", venv / ".jgnn-requirements"
    if stamp.is_file() and stamp.read_text() == "\n".join(reqs) and _is_python312(str(python)):
        return python
    _log(f"building {venv} for JAX {version}")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([find_python(), "-m", "venv", str(venv)], check=True, stdout=sys.stderr)
    WHEELS.mkdir(parents=True, exist_ok=True)
    offline = ("install", "--no-index", "--find-links", str(WHEELS), *reqs)
    if not _pip(python, *offline):
        _log(f"downloading what {WHEELS} lacks")
        if not _pip(python, "download", "--only-binary=:all:", "-d", str(WHEELS), *reqs) or not _pip(python, *offline):
            raise SystemExit(f"gpu-check venv: could not install {' '.join(reqs)}")
    stamp.write_text("\n".join(reqs))
    return python


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1].strip())
    print(ensure(sys.argv[1]))
