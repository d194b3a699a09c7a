"""Where data set files are looked for, and how missing ones are downloaded.

Search order used by every loader (first hit wins):

1. an explicit ``root=`` directory passed to the loader;
2. ``$JGNN_DATA_DIR`` (when set);
3. the repository's sibling ``../shared/data`` directory (``<repo>/../shared/data``);
4. the download cache :func:`data_dir` (``$JGNN_DATA_DIR`` or ``~/.cache/jgnn``), into which the
   loader then tries to download the canonical source files with :func:`download`.

Without network access a failed download raises :class:`DatasetUnavailableError`, naming the
file, the URL and every directory that was searched.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence

ENV_VAR = "JGNN_DATA_DIR"


class DatasetUnavailableError(OSError):
    """A data set file is neither on disk nor downloadable (e.g. no network)."""


def data_dir() -> pathlib.Path:
    """The download cache: ``$JGNN_DATA_DIR`` if set, else ``~/.cache/jgnn`` (not created here)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path("~/.cache/jgnn").expanduser()


def shared_data_dir() -> pathlib.Path:
    """The repository's sibling ``../shared/data`` directory (it may not exist)."""
    return pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def search_dirs(root: str | os.PathLike | None = None) -> list[pathlib.Path]:
    """Directories searched for data files, in order, without duplicates.

    ``root`` (if given), ``$JGNN_DATA_DIR`` (if set), :func:`shared_data_dir`, :func:`data_dir`.
    Directories that do not exist are kept in the list (they are reported in error messages).
    """
    candidates: list[pathlib.Path] = []
    if root is not None:
        candidates.append(pathlib.Path(root).expanduser())
    env = os.environ.get(ENV_VAR)
    if env:
        candidates.append(pathlib.Path(env).expanduser())
    candidates.append(shared_data_dir())
    candidates.append(data_dir())
    out: list[pathlib.Path] = []
    for c in candidates:
        if c not in out:
            out.append(c)
    return out


def find_file(relpaths: str | Sequence[str], dirs: Iterable[pathlib.Path]) -> pathlib.Path | None:
    """Return the first ``dir / relpath`` that is an existing file (dirs outer, relpaths inner)."""
    if isinstance(relpaths, str):
        relpaths = [relpaths]
    for d in dirs:
        for rel in relpaths:
            p = pathlib.Path(d) / rel
            if p.is_file():
                return p
    return None


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    searched: Iterable[os.PathLike] = (),
    timeout: float = 60.0,
) -> pathlib.Path:
    """Download ``url`` to ``dest`` atomically (via a temporary file); return ``dest``.

    If ``dest`` already exists it is returned untouched. On any network or file error raises
    :class:`DatasetUnavailableError` whose message names the file, the URL and the directories
    in ``searched`` (the places the caller looked before trying to download).
    """
    dest = pathlib.Path(dest)
    if dest.is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout) as response:
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f:
                    shutil.copyfileobj(response, f)
                os.replace(tmp, dest)
            except BaseException:
                pathlib.Path(tmp).unlink(missing_ok=True)
                raise
    except (urllib.error.URLError, OSError, ValueError) as err:
        dirs = ", ".join(str(d) for d in searched) or "(none)"
        raise DatasetUnavailableError(
            f"data file {dest.name!r} is not available: it was not found in the searched "
            f"directories [{dirs}] and downloading it from {url} to {dest} failed ({err}). "
            f"Without network access, place the file in one of those directories or set "
            f"${ENV_VAR}."
        ) from err
    return dest


def fetch(
    relpath: str,
    url: str,
    root: str | os.PathLike | None = None,
    *,
    allow_download: bool = True,
) -> pathlib.Path:
    """Find ``relpath`` in :func:`search_dirs` or download ``url`` to ``data_dir() / relpath``."""
    dirs = search_dirs(root)
    found = find_file(relpath, dirs)
    if found is not None:
        return found
    if not allow_download:
        raise DatasetUnavailableError(
            f"data file {relpath!r} not found in [{', '.join(map(str, dirs))}] and downloading "
            f"from {url} is disabled (allow_download=False)."
        )
    return download(url, data_dir() / relpath, searched=dirs)
