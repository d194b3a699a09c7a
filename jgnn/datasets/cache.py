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
from collections.abc import Iterable, Mapping, Sequence

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


def _missing_dirs(directory: pathlib.Path) -> list[pathlib.Path]:
    """``directory`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for d in (directory, *directory.parents):
        if d.exists():
            break
        missing.append(d)
    return missing


def _remove_empty(dirs: Iterable[pathlib.Path]) -> None:
    """Remove the directories a failed download created (deepest first), stopping at a non-empty one."""
    for d in dirs:
        try:
            d.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return


def _unavailable(name: str, url: str, dest: pathlib.Path, searched: Iterable[os.PathLike], err) -> Exception:
    dirs = ", ".join(str(d) for d in searched) or "(none)"
    return DatasetUnavailableError(
        f"data file {name!r} is not available: it was not found in the searched "
        f"directories [{dirs}] and downloading it from {url} to {dest} failed ({err}). "
        f"Without network access, place the file in one of those directories or set "
        f"${ENV_VAR}."
    )


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
    in ``searched`` (the places the caller looked before trying to download). A failed download
    leaves nothing behind: no partial file and none of the directories it created.
    """
    dest = pathlib.Path(dest)
    if dest.is_file():
        return dest
    created = _missing_dirs(dest.parent)
    searched = list(searched)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f:
                    shutil.copyfileobj(response, f)
                os.replace(tmp, dest)
            except BaseException:
                pathlib.Path(tmp).unlink(missing_ok=True)
                raise
    except (urllib.error.URLError, OSError, ValueError) as err:
        _remove_empty(created)
        raise _unavailable(dest.name, url, dest, searched, err) from err
    return dest


def download_all(
    files: Mapping[str, str],
    directory: str | os.PathLike,
    *,
    searched: Iterable[os.PathLike] = (),
    timeout: float = 60.0,
) -> pathlib.Path:
    """Download every ``{file name: url}`` of ``files`` into ``directory``, all or nothing; return it.

    Files already in ``directory`` are kept. The others are downloaded into a hidden staging directory
    beside it and moved in only once all of them arrived, so a failure (for example no network) leaves no
    half-filled ``directory`` and no directory that did not exist before.
    """
    directory = pathlib.Path(directory)
    todo = {name: url for name, url in files.items() if not (directory / name).is_file()}
    if not todo:
        return directory
    created = _missing_dirs(directory)
    searched = list(searched)
    staging, ok, name = None, False, next(iter(todo))
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.", suffix=".part"))
        for name, url in todo.items():
            try:
                download(url, staging / name, timeout=timeout)
            except DatasetUnavailableError as err:  # name the real destination, not the staging directory
                raise _unavailable(name, url, directory / name, searched, err.__cause__) from err.__cause__
        directory.mkdir(exist_ok=True)
        for name in todo:
            os.replace(staging / name, directory / name)
        ok = True
    except DatasetUnavailableError:
        raise
    except OSError as err:
        raise _unavailable(name, todo[name], directory / name, searched, err) from err
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not ok:
            _remove_empty(created)
    return directory


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
