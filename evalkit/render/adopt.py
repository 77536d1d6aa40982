"""Runs that carry their own identity: a label and the fingerprint of the machine that really
rendered them.

- :func:`machine_fingerprint` is what ``evalkit fingerprint -b SPEC --json`` prints on a render
  machine: the fingerprint ``evalkit render`` records there for that backend, in a file
  (:mod:`evalkit.formats.fingerprint`) that ``render --fingerprint`` adopts elsewhere.
- :func:`plan_identity` decides, for one ``render`` command, each run's backend spec, label,
  fingerprint and the manifest's ``adopted`` record (the driver names its folder:
  :func:`evalkit.render.driver.run_folder_name`).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from evalkit.errors import InputFileError, UserError
from evalkit.formats.fingerprint import read_fingerprint_file
from evalkit.formats.models import FINGERPRINT_SCHEMA_VERSION
from evalkit.formats.run import check_label
from evalkit.render.backend import BackendSpec, BackendSpecError, apply_backend, fingerprint, parse_spec

#: a run of adopted files with no --fingerprint: its machine is not known
UNKNOWN_FINGERPRINT = {
    "unknown": "rendered elsewhere and adopted without --fingerprint "
    "(evalkit fingerprint --json on the render machine writes one)"
}


def machine_fingerprint(spec: str | None = None) -> dict:
    """The fingerprint file's content for this machine: with ``spec``, exactly the fingerprint
    ``evalkit render -b SPEC`` records here (the spec applied while it is taken)."""
    from evalkit import __version__

    doc = {
        "schema_version": FINGERPRINT_SCHEMA_VERSION,
        "evalkit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "backend": None,
    }
    if spec is None:
        doc["fingerprint"] = fingerprint()
    else:
        parsed = parse_spec(spec)
        with apply_backend(parsed):
            doc["fingerprint"] = fingerprint(parsed)
        doc["backend"] = parsed.to_dict()
    return doc


@dataclass
class RunIdentity:
    """One run of a render command: what is applied, what is recorded, where it goes."""

    spec: BackendSpec | None  # the backend spec (None: not known, an import without one)
    label: str | None
    fingerprint: dict | None  # adopted or unknown; None: the executor's (rendered here)
    adopted: dict | None  # the manifest's ``adopted`` record (None: nothing adopted)
    apply: bool  # False: the spec only says where the renders were made

    @property
    def name(self) -> str:
        return self.label or (self.spec.spec if self.spec else "?")

    def backend_record(self) -> dict:
        return self.spec.to_dict() if self.spec else {"spec": None}


def _fingerprint_spec(fp: dict) -> BackendSpec | None:
    backend = fp["content"].get("backend")
    if not backend or backend.get("spec") is None:
        return None
    try:
        return parse_spec(backend["spec"])
    except BackendSpecError as e:
        raise InputFileError(fp["path"], f"field 'backend.spec': {e}") from None


def plan_identity(
    backends: list[str], *, renderer, label: str | None, fingerprint_file, executor_name: str
) -> list[RunIdentity]:
    """Each run's identity, checked before anything is written. ``renderer``: the renderer
    instance (one that ``adopts_renders`` has its spec recorded, not applied)."""
    adopts = bool(renderer.adopts_renders)
    if label is not None:
        check_label(label)
    fp = read_fingerprint_file(fingerprint_file) if fingerprint_file is not None else None
    if (fp or adopts) and executor_name != "local":
        what = "--fingerprint" if fp else f"renderer {renderer.name!r}"
        raise UserError(
            f"{what}: only with --executor local (a Ray run records the fingerprint "
            "of each node that renders)"
            if fp
            else f"{what}: adopts files made elsewhere; it runs with --executor local"
        )
    specs = [b if isinstance(b, BackendSpec) else parse_spec(b) for b in backends]  # parsed once
    for flag, given in (("--label", label), ("--fingerprint", fp)):
        if given is not None and len(specs) > 1:
            raise UserError(f"{flag}: names one run; give at most one --backend with it, found {len(specs)}")
    fp_spec = _fingerprint_spec(fp) if fp else None
    if fp_spec is not None and specs and fp_spec.spec != specs[0].spec:
        raise InputFileError(
            fp["path"],
            f"field 'backend.spec': {fp_spec.spec!r} differs from "
            f"--backend {specs[0].spec!r} (the fingerprint was taken for another "
            "backend)",
        )
    backend_from = "--backend" if specs else None
    if not specs and adopts:
        if fp_spec is not None:
            specs, backend_from = [fp_spec], "fingerprint file"
        elif label is None:
            raise UserError(
                f"--label: renderer {renderer.name!r} needs a name for the run: "
                "--label NAME (or -b SPEC, the backend the files were rendered on)"
            )
        else:
            specs = [None]
    if not specs:
        raise UserError("--backend: give at least one backend spec, e.g. --backend cpu,dtype=fp32")
    if len({s.spec if s else None for s in specs}) != len(specs):
        raise UserError("--backend: the same backend is given twice")
    out = []
    for spec in specs:
        adopted = None
        if fp is not None or adopts:
            adopted = {"fingerprint_file": fp, "backend_from": backend_from}
            if adopts:
                adopted["dir"] = renderer.describe().get("options", {}).get("dir")
        fingerprint_ = fp["content"]["fingerprint"] if fp else (UNKNOWN_FINGERPRINT if adopts else None)
        out.append(
            RunIdentity(spec, label, dict(fingerprint_) if fingerprint_ else None, adopted, apply=not adopts)
        )
    return out
