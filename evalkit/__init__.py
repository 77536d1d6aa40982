"""evalkit: render, measure and human-evaluate generative video across hardware backends.

Public surface (see the README for the command line):

- :mod:`evalkit.video`: read clips as uint8 RGB frames, write lossless and browser copies
- :mod:`evalkit.lossless`: the lossless formats of run clips (FFV1 ``.mkv``, UT Video ``.nut``)
- :mod:`evalkit.formats.suite`: suite YAML files to jobs with stable ids
- :mod:`evalkit.formats.run`: run folders (manifest.json, clips/, preview/), atomic and resumable
- :mod:`evalkit.render.backend`: environment fingerprint and the backends usable here
- :mod:`evalkit.errors`: the exception hierarchy (user errors exit with code 2)
- :mod:`evalkit.metrics`: the metric engine (pure functions over frames; the folder ``metrics/``)
- :mod:`evalkit.app`: the web layer of ``evalkit serve`` (the folder ``app/``)

``evalkit.metrics`` and ``evalkit.app`` live in the repository's top-level folders ``metrics/``
and ``app/``. A wheel (and setuptools' editable install) maps them into this package
(pyproject.toml's ``package-dir``). A checkout run without an install (``PYTHONPATH=.``: a
second worktree, a copy on another machine) has no such mapping, and an editable install of
another checkout in the same environment would answer for it; so when this package sits in a
checkout (``../pyproject.toml`` beside ``../metrics/__init__.py``, no ``evalkit/metrics/``), a
finder placed first on ``sys.meta_path`` maps exactly those two names to the folders of this
checkout. It answers no other name, and it is not installed from a wheel.
"""
import os as _os
import sys as _sys
from importlib.util import spec_from_file_location as _spec_from_file_location

from .errors import (
    EvalkitError,
    InputFileError,
    InternalError,
    SchemaVersionError,
    SuiteError,
    UserError,
    VideoError,
    WeightsError,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "EvalkitError",
    "UserError",
    "InputFileError",
    "VideoError",
    "SuiteError",
    "SchemaVersionError",
    "WeightsError",
    "InternalError",
]


class _CheckoutFolders:
    """A meta path finder: ``evalkit.metrics`` and ``evalkit.app`` from this checkout's folders."""

    def __init__(self, folders: dict[str, str]):
        self.folders = folders

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return _spec_from_file_location(fullname, _os.path.join(folder, "__init__.py"),
                                        submodule_search_locations=[folder])


def _checkout_folders() -> dict[str, str]:
    """``{"evalkit.metrics": "<checkout>/metrics", ...}`` when this package is in a checkout."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    if not _os.path.isfile(_os.path.join(root, "pyproject.toml")):
        return {}
    return {f"{__name__}.{name}": _os.path.join(root, name) for name in ("metrics", "app")
            if not _os.path.isdir(_os.path.join(here, name))
            and _os.path.isfile(_os.path.join(root, name, "__init__.py"))}


def _install_checkout_finder() -> None:
    folders = _checkout_folders()
    if folders:   # first, so that no other install's mapping answers (a reload replaces it)
        _sys.meta_path[:] = [f for f in _sys.meta_path if type(f).__name__ != "_CheckoutFolders"]
        _sys.meta_path.insert(0, _CheckoutFolders(folders))


_install_checkout_finder()
