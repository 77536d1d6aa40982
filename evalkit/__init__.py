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
and ``app/``; ``evalkit/metrics`` and ``evalkit/app`` are symbolic links to them, so a checkout
imports them as ordinary subpackages (``PYTHONPATH=.``, an editable install, static tools) and a
wheel carries them as ``evalkit/metrics/`` and ``evalkit/app/`` (pyproject.toml's
``package-dir``).
"""

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
