"""Fingerprint files: the environment of the machine that renders, saved where it renders
(``evalkit fingerprint -b SPEC --json > fp.json``) and adopted by a run made elsewhere
(``evalkit render ... --fingerprint fp.json``).

Format (``schema_version: 1``; :class:`~evalkit.formats.models.FingerprintFile`)::

    {"schema_version": 1, "evalkit_version": "...", "created": "...",
     "backend": {"spec": "cuda,dtype=bf16", "device": "cuda", "dtype": "bf16", ...},
     "fingerprint": {"host": "...", "device_name": "AMD Instinct MI325X", "driver": "...", ...}}

``fingerprint`` is exactly what ``evalkit render`` records as a run's fingerprint on that
machine and backend; ``backend`` is optional (a file written by hand may hold only a few
fingerprint keys).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from evalkit.errors import InputFileError, SchemaVersionError
from evalkit.formats.models import (
    FINGERPRINT_SCHEMA_VERSION,
    FingerprintFile,
    first_problem,
    found,
    json_problem,
    version_problem,
)
from evalkit.fsutil import sha256_file

WRITE_HINT = "write it on the render machine with: evalkit fingerprint -b SPEC --json > FILE"


def read_fingerprint_file(path) -> dict:
    """Load and check a fingerprint file; return ``{"path", "sha256", "content"}`` (``content``:
    the file's JSON as it is). Errors name the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(
            path, ("not found" if not path.exists() else "not a file") + f" (--fingerprint: {WRITE_HINT})"
        )
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InputFileError(path, f"not valid JSON ({json_problem(e)}); {WRITE_HINT}") from None
    if not isinstance(doc, dict):
        raise InputFileError(path, f"expected a JSON object, found {found(doc)}; {WRITE_HINT}")
    problem = version_problem(doc, FINGERPRINT_SCHEMA_VERSION)
    if problem:
        raise SchemaVersionError(path, f"field 'schema_version': {problem}")
    try:
        FingerprintFile.model_validate(doc)
    except ValidationError as e:
        field, problem = first_problem(e)
        raise InputFileError(path, f"field '{field}': {problem}" if field else problem) from None
    return {"path": str(path.resolve()), "sha256": sha256_file(path), "content": doc}
