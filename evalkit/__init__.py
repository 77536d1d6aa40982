"""evalkit: render, measure and human-evaluate generative video across hardware backends.

Public surface (see the README for the command line):

- :mod:`evalkit.video`: read clips as uint8 RGB frames, write lossless and browser copies
- :mod:`evalkit.lossless`: the lossless formats of run clips (FFV1 ``.mkv``, UT Video ``.nut``)
- :mod:`evalkit.formats.suite`: suite YAML files to jobs with stable ids
- :mod:`evalkit.formats.run`: run folders (manifest.json, clips/, preview/), atomic and resumable
- :mod:`evalkit.render.backend`: environment fingerprint and the backends usable here
- :mod:`evalkit.errors`: the exception hierarchy (user errors exit with code 2)
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
