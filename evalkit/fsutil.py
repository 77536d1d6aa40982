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
import errno
import hashlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
from importlib.resources import files
from pathlib import Path

from evalkit.errors import WriteError

_TEMP_FLAGS = (
    os.O_RDWR
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


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


#: errnos of a write refused for want of room: the disk or the quota is full, or the file is
#: over the process's size limit (``ulimit -f``)
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def no_room(e: BaseException) -> bool:
    """Whether ``e`` (or what it was raised from) is a write refused for want of room."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            return True
        e = e.__cause__ or e.__context__
    return False


#: errnos of a place that cannot be written at all: a read-only file system, no permission
NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def storage_error(e: BaseException, db: str | None = None) -> str | None:
    """The one line for a failure of the storage under the command (None: something else): a
    write refused for want of room or on a read-only file system or without permission (an
    OSError, or SQLite's own error, anywhere in the exception's chain; ``db``: the study
    database the command was given, named in the line)."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            where = str(seen.filename or "a file")
            name = where.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(".") and ".tmp-" in name:  # an atomic write's temporary:
                where = where.rstrip("/").rsplit("/", 1)[0] or "."  # its folder is the place
            if no_room(seen):
                return f"{where}: could not be written ({seen.strerror}); make room and run the command again"
            if seen.errno in NOT_WRITABLE:
                return (
                    f"{where}: cannot be written ({seen.strerror}); write somewhere "
                    "writable (what the command wrote before this is kept)"
                )
        text = str(seen).lower()
        if type(seen).__module__.startswith(("sqlite3", "sqlalchemy")):
            named = f"--db {db}: " if db else ""
            if "readonly database" in text or "read-only" in text:
                return (
                    f"{named}the study database cannot be written (read-only: its file or its "
                    "folder); copy it somewhere writable"
                )
            if "database or disk is full" in text or "disk i/o error" in text:
                return (
                    f"{named}the study database could not be written (no space left on its disk, "
                    "or a disk I/O error); make room and run the command again"
                )
        seen = seen.__cause__ or seen.__context__
    return None


def _reason(e: BaseException) -> str:
    while e is not None:
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            return e.strerror or os.strerror(e.errno)
        e = e.__cause__ or e.__context__
    return "no room"


def hold(fd: int) -> None:
    """Mark the temporary file open as ``fd`` as in use (an flock, released when ``fd`` is
    closed or the process dies): :func:`remove_stale_temporaries` leaves it alone."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)


_swept: set = set()


def remove_stale_temporaries(folder: os.PathLike | str, pattern: str = ".tmp-*") -> int:
    """Remove the temporary files (``pattern``) a killed process left in ``folder``: those no
    live process holds (:func:`hold`). Once per folder and process (a folder of many files is
    listed once). Returns how many were removed."""
    import fcntl

    folder = Path(folder)
    key = str(folder.resolve())
    if key in _swept or not folder.is_dir():
        return 0
    _swept.add(key)
    n = 0
    for p in folder.glob(pattern):
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # gone meanwhile, or a link: not ours
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # being written
            os.close(fd)
            continue
        try:
            p.unlink(missing_ok=True)
            n += 1
        finally:
            os.close(fd)
    return n


@contextlib.contextmanager
def atomic_path(path: os.PathLike | str, suffix: str | None = None):
    """Yield a temporary path next to ``path``; on success rename it over ``path``.

    On any exception (KeyboardInterrupt included) the temporary file is removed and ``path``
    is left untouched. ``suffix`` keeps the extension (codecs pick formats by it). A write
    refused for want of room (:data:`NO_ROOM`) is a :class:`~evalkit.errors.WriteError`
    naming ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = mkstemp(prefix=f".tmp-{path.stem}-", suffix=suffix or path.suffix, dir=path.parent)
    except OSError as e:
        if no_room(e):
            raise _write_error(path, e) from e
        raise
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        crash_point()
        os.replace(tmp, path)
        crash_point()
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if no_room(e) and not isinstance(e, WriteError):
            raise _write_error(path, e) from e
        raise


def _write_error(path: Path, e: BaseException) -> WriteError:
    kept = f"the {path.name} there is kept as it was" if path.exists() else f"no {path.name} was written"
    return WriteError(path, _reason(e), kept)


def atomic_write_bytes(path: os.PathLike | str, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: os.PathLike | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: os.PathLike | str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


# -- crash tests -----------------------------------------------------------------------------

#: ``EVALKIT_KILL_AT=N`` (crash tests only): the process SIGKILLs itself at its Nth crash point.
#: Each atomic file write has two (its temporary file complete; renamed into place) and
#: :func:`atomic_dir` has its own, so a kill lands at a reproducible moment without timing.
KILL_AT_ENV = "EVALKIT_KILL_AT"
_crash_points = 0


def crash_point() -> None:
    """Count a crash point; SIGKILL this process when ``$EVALKIT_KILL_AT`` is reached."""
    global _crash_points
    at = os.environ.get(KILL_AT_ENV)
    if not at:
        return
    _crash_points += 1
    if _crash_points >= int(at):
        os.kill(os.getpid(), signal.SIGKILL)


# -- whole folders -------------------------------------------------------------------------------


def _lock_dir(path: Path, *, wait: bool):
    """An fd of folder ``path`` holding an exclusive flock (None: another process holds it)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system
    or filesystem cannot (the caller renames in two steps)."""
    import ctypes
    import errno
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def dir_leftovers(path: os.PathLike | str) -> list[Path]:
    """The temporary folders :func:`atomic_dir` leaves next to ``path`` when killed."""
    import glob

    path = Path(path)
    name = glob.escape(path.name)
    return sorted([*path.parent.glob(f".{name}.tmp-*"), *path.parent.glob(f".{name}.old-*")])


def cleanup_dir_leftovers(path: os.PathLike | str) -> None:
    """Tidy what a killed :func:`atomic_dir` left next to ``path``: where ``path`` itself is
    gone (killed between its two renames) the old folder set aside goes back in place; every
    other leftover is removed, except a temporary folder another process is still writing."""
    path = Path(path).resolve()  # a link followed; "." or "x/.." named by its own name
    olds = [p for p in dir_leftovers(path) if p.name.startswith(f".{path.name}.old-")]
    if olds and not os.path.lexists(path):
        os.rename(olds.pop(), path)
    for p in dir_leftovers(path):
        if not p.is_dir() or p.is_symlink():
            p.unlink(missing_ok=True)
            continue
        try:
            fd = _lock_dir(p, wait=False)
        except FileNotFoundError:  # removed meanwhile (by another process's cleanup)
            continue
        if fd is None:  # being written by another process
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_dir(path: os.PathLike | str):
    """Yield a new empty folder next to ``path`` (``.NAME.tmp-XXXX``, same filesystem); on
    success it takes the place of ``path`` whole, in one rename, and the old folder is removed.

    On any exception the temporary folder is removed and ``path`` is left as it was. A kill at
    any moment leaves ``path`` complete, old or new: the two folders are exchanged in one step
    where Linux allows it (``renameat2``), else the old one is renamed aside, the new one in, and
    a kill between the two is undone by :func:`cleanup_dir_leftovers`, which runs first.
    ``path`` is a folder or absent; a symbolic link to a folder is followed.
    """
    path = Path(path).resolve()  # a link followed; "." or "x/.." named by its own name
    path.parent.mkdir(parents=True, exist_ok=True)
    cleanup_dir_leftovers(path)
    for _ in range(1000):
        tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(6)}"
        try:
            tmp.mkdir()
        except FileExistsError:
            continue
        # locked, so that another process's cleanup leaves it alone; one that took the lock
        # first (between the mkdir and here) has removed it: then try another name
        try:
            fd = _lock_dir(tmp, wait=True)
        except FileNotFoundError:
            continue
        try:
            if os.path.samestat(os.stat(tmp), os.fstat(fd)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    else:
        raise FileExistsError(f"{path.parent}: no unused temporary folder name found")
    try:
        try:
            yield tmp
            _fsync_dir(tmp)
            crash_point()
            if not path.exists():
                os.rename(tmp, path)
            elif _exchange(tmp, path):
                crash_point()
                shutil.rmtree(tmp, ignore_errors=True)  # the old folder, under tmp's name now
            else:
                old = path.parent / f".{path.name}.old-{secrets.token_hex(6)}"
                os.rename(path, old)
                try:
                    crash_point()
                    os.rename(tmp, path)
                except BaseException:
                    os.rename(old, path)
                    raise
                crash_point()
                shutil.rmtree(old, ignore_errors=True)
            _fsync_dir(path.parent)
        except BaseException as e:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            if no_room(e):  # named by its place in the folder, not the temporary's
                name = Path(getattr(e, "path", None) or getattr(e, "filename", None) or tmp)
                where = path / name.relative_to(tmp) if name.is_relative_to(tmp) else path
                raise WriteError(
                    where,
                    _reason(e),
                    f"{path} is kept as it was" if path.exists() else f"no {path.name} was made",
                ) from e
            raise
    finally:
        os.close(fd)


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
        raise RuntimeError(
            f"evalkit is not installed as plain files, so its {name} folder "
            "cannot be used (install the wheel with pip)"
        )
    return installed


def canary_model_dir() -> Path:
    """The shipped canary pipeline folder (diffusers ``save_pretrained`` layout)."""
    return _shipped("models/canary", "model_index.json")


def datasets_dir() -> Path:
    """The folder of the bundled suites (``smoke/suite.yaml``, ``canary/suite.yaml``, ...)."""
    return _shipped("datasets", "smoke/suite.yaml")


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _neutral(line: str) -> str:
    if line.startswith(FORMULA_PREFIXES):
        try:
            float(line)
        except ValueError:
            return "'" + line
    return line


def csv_cell(v):
    """One cell as written: ``None`` empty; a text that a spreadsheet would run as a formula
    (it starts with ``= + - @``, a tab or a carriage return, and is not a number) gets a leading
    ``'``, as OWASP's "CSV Injection" page recommends, and so does each line of it after a line
    break (``\r``, ``\n``: a reader that splits lines first must meet no formula either);
    numbers and other text unchanged."""
    if v is None:
        return ""
    if isinstance(v, str):
        v = _neutral(v)
        if "\r" in v or "\n" in v:
            parts = re.split(r"(\r\n|\r|\n)", v)  # lines, with their breaks between
            v = "".join(p if i % 2 else _neutral(p) for i, p in enumerate(parts))
    return v


def csv_text(header, rows, *, lineterminator: str = "\n") -> str:
    """CSV text: the ``header`` row, then ``rows`` (iterables of cells). Cells pass through
    :func:`csv_cell` (``None`` empty, formula-like text neutralised); every other cell is
    written as :mod:`csv` writes it (``str``; bools as True/False, floats at full precision,
    ``inf``/``nan`` as such): callers map other conventions first. A cell holding a carriage
    return or a line feed is quoted whatever ``lineterminator`` is (:mod:`csv` quotes only the
    characters of its own line terminator: with ``\n``, a lone ``\r`` went out bare, and a
    reader started a new row there)."""
    import csv
    import io

    buf = io.StringIO()
    # "\r\n": both characters make a cell quoted; each row's own ending is then swapped for
    # the one asked for
    w = csv.writer(buf, lineterminator="\r\n")
    out = []
    for row in itertools.chain([header], rows):
        buf.seek(0)
        buf.truncate()
        w.writerow([csv_cell(v) for v in row])
        out.append(buf.getvalue()[:-2] + lineterminator)
    return "".join(out)


def write_csv(path: os.PathLike | str, header, rows, *, lineterminator: str = "\n") -> None:
    """Write :func:`csv_text` of ``header`` and ``rows`` to ``path`` atomically (UTF-8)."""
    atomic_write_text(path, csv_text(header, rows, lineterminator=lineterminator))


def file_kind(path: Path) -> str:
    """What a path that is neither a regular file nor a folder is, in words."""
    import stat

    mode = path.stat().st_mode
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "a special file"
