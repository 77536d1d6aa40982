"""Files: atomic writes, hashing, and where the data shipped with evalkit lives.

Atomic writes: write to a temporary file in the same folder, fsync, then rename. A crash or
Ctrl-C at any point leaves either the old file or the new one, never half of one. The files get
the mode a plain ``open(path, "w")`` would give them (``0o666`` less the umask: 0644 under the
usual umask 022), not ``tempfile.mkstemp``'s private 0600, so that run folders, reports and study
media can be read by the rest of a team; folders are made with ``mkdir``'s default (0755 under
umask 022).

Shipped data: the canary pipeline folder and the bundled suites are ``models/canary/`` and
``datasets/`` at the repository root. A wheel (or a non-editable ``pip install .``) carries the
same folders, copied as they are, as package data: ``evalkit/models/canary/`` and
``evalkit/datasets/`` (see ``[tool.setuptools]`` in ``pyproject.toml``).
:func:`canary_model_dir` and :func:`datasets_dir` return real filesystem paths: the copy inside
the installed package when there is one, else the repository checkout (an editable install, or
the source tree on ``sys.path``).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from importlib.resources import files
from pathlib import Path

_TEMP_FLAGS = (os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def mkstemp(*, dir: os.PathLike | str, prefix: str = ".tmp-", suffix: str = "") -> tuple[int, str]:
    """``tempfile.mkstemp`` for output files: a new file with a unique name in ``dir``, opened
    for reading and writing, returned as ``(fd, path)``; created exclusively like mkstemp's, but
    with mode ``0o666`` less the umask (what ``open()`` gives a new file) instead of 0600."""
    for _ in range(1000):
        path = os.path.join(os.fspath(dir), f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(path, _TEMP_FLAGS, 0o666), os.path.abspath(path)
        except FileExistsError:
            continue
    raise FileExistsError(f"{dir}: no unused temporary file name found")


@contextlib.contextmanager
def atomic_path(path: os.PathLike | str, suffix: str | None = None):
    """Yield a temporary path next to ``path``; on success rename it over ``path``.

    On any exception (KeyboardInterrupt included) the temporary file is removed and ``path``
    is left untouched. ``suffix`` keeps the extension (codecs pick formats by it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp(prefix=f".tmp-{path.stem}-", suffix=suffix or path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(path: os.PathLike | str, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: os.PathLike | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: os.PathLike | str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def sha256_file(path: os.PathLike | str) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- shipped data ----------------------------------------------------------------------------

#: The repository root when evalkit runs from a checkout (``<root>/evalkit/fsutil.py``).
CHECKOUT = Path(__file__).resolve().parents[1]


def _shipped(name: str, marker: str) -> Path:
    """``<installed evalkit>/<name>`` if it holds ``marker``, else ``<checkout>/<name>`` if that
    does; otherwise the installed location (callers report it as missing)."""
    installed = files("evalkit") / name
    # A wheel unpacks to the filesystem, so this is a pathlib.Path; a zipped evalkit (a zipapp,
    # an egg) would give another Traversable, and diffusers needs a folder on disk.
    installed = installed if isinstance(installed, Path) else None
    if installed is not None and (installed / marker).is_file():
        return installed
    checkout = CHECKOUT / name
    if (checkout / marker).is_file():
        return checkout
    if installed is None:
        raise RuntimeError(f"evalkit is not installed as plain files, so its {name} folder "
                           "cannot be used (install the wheel with pip)")
    return installed


def canary_model_dir() -> Path:
    """The shipped canary pipeline folder (diffusers ``save_pretrained`` layout)."""
    return _shipped("models/canary", "model_index.json")


def datasets_dir() -> Path:
    """The folder of the bundled suites (``smoke/suite.yaml``, ``canary/suite.yaml``, ...)."""
    return _shipped("datasets", "smoke/suite.yaml")


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """One cell as written: ``None`` empty; a text that a spreadsheet would run as a formula
    (it starts with ``= + - @``, a tab or a carriage return, and is not a number) gets a leading
    ``'``, as OWASP's "CSV Injection" page recommends; numbers and other text unchanged."""
    if v is None:
        return ""
    if isinstance(v, str) and v.startswith(FORMULA_PREFIXES):
        try:
            float(v)
        except ValueError:
            return "'" + v
    return v


def csv_text(header, rows, *, lineterminator: str = "\n") -> str:
    """CSV text: the ``header`` row, then ``rows`` (iterables of cells). Cells pass through
    :func:`csv_cell` (``None`` empty, formula-like text neutralised); every other cell is
    written as :mod:`csv` writes it (``str``; bools as True/False, floats at full precision,
    ``inf``/``nan`` as such): callers map other conventions first."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator=lineterminator)
    w.writerow([csv_cell(v) for v in header])
    for row in rows:
        w.writerow([csv_cell(v) for v in row])
    return buf.getvalue()


def write_csv(path: os.PathLike | str, header, rows, *, lineterminator: str = "\n") -> None:
    """Write :func:`csv_text` of ``header`` and ``rows`` to ``path`` atomically (UTF-8)."""
    atomic_write_text(path, csv_text(header, rows, lineterminator=lineterminator))
