"""Exceptions raised by evalkit.

The hierarchy::

    EvalkitError                  base of everything evalkit raises on purpose
    ├── UserError                 bad input from the user: the CLI prints one line, exit code 2
    │   ├── InputFileError        a file or folder is missing, empty, unreadable or malformed
    │   │   └── VideoError        a clip cannot be decoded (truncated, no frames, mixed sizes...)
    │   ├── SuiteError            a suite YAML is invalid (names file, field, expected, found)
    │   ├── SchemaVersionError    a file written by another evalkit version we cannot read
    │   ├── WriteError            a file could not be written (disk full, quota, file size limit)
    │   └── WeightsError          LPIPS weights missing or corrupt in the cache; names the set-up command
    └── InternalError             a bug; the CLI prints it with a traceback hint (exit 1)

Every message is one line and names the file or field, what was expected and what was found.
"""

from __future__ import annotations

import os

__all__ = [
    "EvalkitError",
    "UserError",
    "InputFileError",
    "VideoError",
    "SuiteError",
    "SchemaVersionError",
    "WriteError",
    "WeightsError",
    "InternalError",
]


class EvalkitError(Exception):
    """Base class of all deliberate evalkit errors."""

    exit_code = 1


class UserError(EvalkitError):
    """The user's input is wrong; the command line reports it in one line and exits with 2."""

    exit_code = 2


class InputFileError(UserError):
    """A file or folder the user named is missing, empty, unreadable or malformed."""

    def __init__(self, path: os.PathLike | str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class VideoError(InputFileError):
    """A clip cannot be read as video frames."""


class SuiteError(InputFileError):
    """A suite file is invalid. ``field`` is a dotted path such as ``clips[2].path``."""

    def __init__(self, path: os.PathLike | str, field: str | None, problem: str):
        self.field = field
        where = f"field '{field}': " if field else ""
        super().__init__(path, where + problem)


class SchemaVersionError(InputFileError):
    """A file carries a schema version this evalkit cannot read."""


class WriteError(UserError):
    """A file could not be written for want of room (disk full, quota, file size limit): the
    write was atomic, so what was there before is whole; the message says so."""

    def __init__(self, path: os.PathLike | str, reason: str, kept: str):
        self.path = str(path)
        super().__init__(
            f"{self.path}: could not be written ({reason}); {kept}, nothing was "
            "lost: make room and run the command again"
        )


class WeightsError(UserError):
    """LPIPS weights are missing or corrupt; the message names the set-up command."""


class InternalError(EvalkitError):
    """Something that should not happen; a bug to report."""
