"""Run folders: one per (suite, backend). The format every later step reads.

Layout::

    RUN/
      manifest.json        schema_version, suite, renderer, backend, fingerprint, jobs[]
      clips/<job>.mkv      lossless render (FFV1, exact RGB); .nut with UT Video
      preview/<job>.mp4    browser copy (H.264 yuv420p)

The manifest's ``lossless`` (``{"codec": "utvideo", "ext": ".nut"}``) names the clips' format
(:data:`evalkit.lossless.LOSSLESS_FORMATS`, ``render --lossless``); a manifest without it is FFV1
in ``.mkv``, as every run was before there was a choice. A resumed run keeps its format.

Crash safety: a clip is written to a temporary file and renamed into place, then its preview,
then the manifest (also atomically) records it as ``done`` with the clip's sha256. A crash at
any point leaves the job ``pending`` or ``done`` with a verified file, never a half-written clip
marked done; resuming re-renders whatever is not verifiably done.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Callable, Iterable

from pydantic import ValidationError

from evalkit import __version__
from evalkit.errors import InputFileError, SchemaVersionError, UserError
from evalkit.formats.models import (
    LABEL_PATTERN,
    LABEL_RULE,
    MANIFEST_SCHEMA_VERSION,
    STATUSES,
    ManifestFile,
    first_problem,
    json_problem,
)
from evalkit.fsutil import atomic_write_json, sha256_file

MANIFEST = "manifest.json"


def check_label(label: str, *, what: str = "--label") -> str:
    """A run's label names its folder: 1-64 letters, digits, ``_ . + -``, starting with a
    letter or digit (so never ``.``, ``..``, a path or a hidden name)."""
    import re

    if not isinstance(label, str) or not re.fullmatch(LABEL_PATTERN, label):
        raise UserError(
            f"{what}: expected a run label of {LABEL_RULE} (it names the run folder), found {label!r}"
        )
    return label


def run_name(manifest: dict) -> str:
    """How reports and studies name a run: its label, else its backend spec."""
    return manifest.get("label") or str((manifest.get("backend") or {}).get("spec"))


def run_lossless(manifest: dict) -> str:
    """The lossless format (codec name) of a run's clips: its manifest's ``lossless.codec``,
    ``ffv1`` when absent."""
    from evalkit.lossless import run_format

    return run_format(manifest).name


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_manifest(path: Path) -> dict:
    """Load and check a manifest.json (schema version first, then
    :class:`~evalkit.formats.models.ManifestFile`); return it as it is on disk."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    if not path.is_file():
        raise InputFileError(path, "not found (expected a run folder's manifest.json)")
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise InputFileError(path, f"not valid JSON ({json_problem(e)})") from None
    if not isinstance(doc, dict):
        raise InputFileError(path, f"expected a JSON object, found {type(doc).__name__}")
    version = doc.get("schema_version")
    if version != MANIFEST_SCHEMA_VERSION or isinstance(version, bool):
        raise SchemaVersionError(
            path,
            f"manifest schema_version {version!r} is not supported "
            f"(this evalkit reads {MANIFEST_SCHEMA_VERSION})",
        )
    try:
        ManifestFile.model_validate(doc)
    except ValidationError as e:
        field, problem = first_problem(e)
        raise InputFileError(path, f"field '{field}': {problem}" if field else problem) from None
    return doc


def clip_files(path) -> Callable[[str], Path]:
    """``job id -> its lossless clip`` in the run folder ``path``: :meth:`RunDir.clip_file` of
    its manifest (checked as :func:`read_manifest` checks it). A folder without a manifest
    (clips only): ``clips/<job>.mkv``, or another format's file where only that exists."""
    from evalkit.lossless import LOSSLESS_FORMATS

    path = Path(path)
    if (path / MANIFEST).is_file():
        return RunDir.open(path).clip_file

    def guess(job_id: str) -> Path:
        paths = [path / "clips" / f"{job_id}{f.ext}" for f in LOSSLESS_FORMATS.values()]
        return next((p for p in paths if p.is_file()), paths[0])

    return guess


class RunDir:
    """A run folder on disk; every change is saved atomically."""

    def __init__(self, path: Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest
        self._index = {j["id"]: j for j in manifest["jobs"]}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def open(cls, path) -> "RunDir":
        path = Path(path)
        return cls(path, read_manifest(path / MANIFEST))

    @classmethod
    def create(
        cls,
        path,
        *,
        suite,
        renderer: dict,
        backend: dict,
        fingerprint: dict,
        jobs: Iterable | None = None,
        notes: dict | None = None,
        label: str | None = None,
        adopted: dict | None = None,
        lossless: str | None = None,
        new_lossless: str | None = None,
    ) -> "RunDir":
        """Create a run folder, or reopen it to resume when it was made for the same suite,
        renderer, backend and label (new jobs are added as pending). ``label`` names the run
        (``render --label``); ``adopted`` records what came from elsewhere (an adopted
        fingerprint, imported files); both are left out of the manifest when None.
        ``lossless``: the clips' format (:data:`evalkit.lossless.LOSSLESS_FORMATS`; None:
        ``new_lossless`` for a new run, ``ffv1`` when that is None too, the recorded one for a
        resumed run, which keeps its format: asking for another is a :class:`UserError`)."""
        from evalkit.lossless import DEFAULT_LOSSLESS, lossless_format

        path = Path(path)
        jobs = list(suite.jobs if jobs is None else jobs)
        if lossless is not None:
            try:
                lossless_format(lossless)
            except ValueError as e:
                raise UserError(f"--lossless: {str(e).removeprefix('codec: ')}") from None
        if (path / MANIFEST).exists():
            run = cls.open(path)
            run._check_same(suite, renderer, backend, label)
            have = run_lossless(run.manifest)
            if lossless is not None and lossless != have:
                raise UserError(
                    f"{path}: this run's clips are {have} "
                    f"({lossless_format(have).ext}), --lossless {lossless} asks for "
                    f"{lossless}; a resumed run keeps its format: resume without "
                    "--lossless, or choose another --out folder"
                )
            for job in jobs:
                if job.id not in run._index:
                    run._add_job(job)
            run.manifest["fingerprint"] = fingerprint
            if adopted is not None:
                run.manifest["adopted"] = dict(adopted)
            run.save()
            return run
        if path.exists() and not path.is_dir():
            raise InputFileError(path, "exists and is not a folder")
        manifest = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "evalkit_version": __version__,
            "created": _now(),
            "updated": _now(),
            "suite": suite.summary(),
            "renderer": dict(renderer),
            "backend": dict(backend),
            "fingerprint": dict(fingerprint),
            "notes": dict(notes or {}),
            "jobs": [],
        }
        if label is not None:
            manifest["label"] = label
        if adopted is not None:
            manifest["adopted"] = dict(adopted)
        fmt = lossless_format(lossless or new_lossless or DEFAULT_LOSSLESS)
        manifest["lossless"] = {"codec": fmt.name, "ext": fmt.ext}
        run = cls(path, manifest)
        for job in jobs:
            run._add_job(job)
        (path / "clips").mkdir(parents=True, exist_ok=True)
        (path / "preview").mkdir(parents=True, exist_ok=True)
        run.save()
        return run

    def _check_same(self, suite, renderer, backend, label=None) -> None:
        m = self.manifest
        diffs = []
        if m.get("label") != label:
            diffs.append(f"label {m.get('label')!r} != {label!r}")
        if m["suite"].get("name") != suite.name:
            diffs.append(f"suite {m['suite'].get('name')!r} != {suite.name!r}")
        if m["renderer"].get("name") != renderer.get("name"):
            diffs.append(f"renderer {m['renderer'].get('name')!r} != {renderer.get('name')!r}")
        old_model, new_model = m["renderer"].get("model_sha256"), renderer.get("model_sha256")
        if old_model and new_model and old_model != new_model:
            diffs.append(
                f"model {m['renderer'].get('model')!r} has other contents now "
                f"(model_sha256 {old_model[:12]} != {new_model[:12]})"
            )
        if m["backend"].get("spec") != backend.get("spec"):
            diffs.append(f"backend {m['backend'].get('spec')!r} != {backend.get('spec')!r}")
        if diffs:
            raise UserError(
                f"{self.path}: already holds a different run ({'; '.join(diffs)}); "
                "choose another --out folder"
            )

    def _add_job(self, job) -> None:
        rec = {
            **job.to_dict(),
            "status": "pending",
            "error": None,
            "timing": {},
            "output": None,
            "preview": None,
        }
        self.manifest["jobs"].append(rec)
        self._index[job.id] = rec

    # -- paths and state -------------------------------------------------------------------
    @property
    def jobs(self) -> list[dict]:
        return self.manifest["jobs"]

    def job(self, job_id: str) -> dict:
        try:
            return self._index[job_id]
        except KeyError:
            raise UserError(f"{self.path}: no job {job_id!r} in this run") from None

    @property
    def lossless(self) -> str:
        """The lossless format (codec name) of this run's clips (absent from the manifest:
        ``ffv1``)."""
        return run_lossless(self.manifest)

    def clip_path(self, job_id: str) -> Path:
        """Where a job's lossless clip goes: ``clips/<job><ext>`` (``.mkv`` for FFV1, ``.nut``
        for UT Video; a done job's own record, ``output.path``, says where it is)."""
        from evalkit.lossless import lossless_format

        return self.path / "clips" / f"{job_id}{lossless_format(self.lossless).ext}"

    def clip_file(self, job_id: str) -> Path:
        """Where a job's lossless clip is: a done job's own record (``output.path``), else where
        it goes (:meth:`clip_path`; also for a job this run does not hold)."""
        rec = self._index.get(job_id)
        if rec is not None and rec.get("status") == "done" and rec.get("output"):
            return self.path / rec["output"]["path"]
        return self.clip_path(job_id)

    def preview_path(self, job_id: str) -> Path:
        return self.path / "preview" / f"{job_id}.mp4"

    def is_done(self, job_id: str, *, verify: bool = True) -> bool:
        """Done, with its clip present and (``verify``) matching the recorded sha256."""
        rec = self.job(job_id)
        if rec["status"] != "done" or not rec.get("output"):
            return False
        clip = self.path / rec["output"]["path"]
        if not clip.is_file():
            return False
        return not verify or sha256_file(clip) == rec["output"]["sha256"]

    def cleanup_temporary(self) -> int:
        """Remove temporary files a killed process left behind (never a finished clip)."""
        n = 0
        for sub in ("clips", "preview", "."):
            folder = self.path / sub
            for p in folder.glob(".tmp-*") if folder.is_dir() else ():
                p.unlink(missing_ok=True)
                n += 1
        return n

    def save(self) -> None:
        self.manifest["updated"] = _now()
        atomic_write_json(self.path / MANIFEST, self.manifest)

    # -- recording results -----------------------------------------------------------------
    def record_done(
        self,
        job_id: str,
        frames,
        fps,
        *,
        timing: dict | None = None,
        extra: dict | None = None,
        preview: bool = True,
        written: bool = False,
        sha256: str | None = None,
    ) -> dict:
        """Write a job's frames (lossless clip, then browser preview) and mark it done.

        ``frames``: (N, H, W, 3) uint8 array or a sequence of (H, W, 3) frames.
        ``written``: the caller has already written both files (atomically, with the
        :mod:`evalkit.video` writers, e.g. side by side in threads): only mark the job done;
        ``sha256``: the clip's, hashed by that writer right after writing it (None: hashed here).
        """
        import numpy as np

        from evalkit.video import write_browser, write_lossless

        rec = self.job(job_id)
        frames = np.asarray(frames)
        clip = self.clip_path(job_id)
        if written:
            n = len(frames)
        else:
            n = write_lossless(clip, frames, fps, codec=self.lossless)
            if preview:
                write_browser(self.preview_path(job_id), frames, fps)
        rec.update(
            status="done",
            error=None,
            timing=dict(timing or {}),
            output={
                "path": f"clips/{clip.name}",
                "sha256": sha256 if written and sha256 else sha256_file(clip),
                "frames": n,
                "width": int(frames.shape[2]),
                "height": int(frames.shape[1]),
                "fps": str(fps),
            },
            preview=f"preview/{job_id}.mp4" if preview else None,
            finished=_now(),
        )
        if extra:
            rec.update(extra)
        self.save()
        return rec

    def record_done_encoded(
        self,
        job_id: str,
        clip_bytes: bytes,
        preview_bytes: bytes | None,
        *,
        frames: int,
        width: int,
        height: int,
        fps,
        timing: dict | None = None,
        extra: dict | None = None,
        save: bool = True,
    ) -> dict:
        """Like :meth:`record_done`, for a clip (and preview) already encoded elsewhere (a
        cluster worker, with the same :mod:`evalkit.video` writers): the bytes are written
        atomically, clip first, then preview, then the manifest (``save=False``: the caller saves
        it soon; until then a crash leaves the job pending, to be rendered again). The clip must
        be in the run's lossless format (:attr:`lossless`)."""
        from evalkit.fsutil import atomic_write_bytes
        from evalkit.lossless import lossless_format

        rec = self.job(job_id)
        clip = self.clip_path(job_id)
        magic = lossless_format(self.lossless).magic
        if bytes(clip_bytes[: len(magic)]) != magic:
            raise ValueError(
                f"clip_bytes of job {job_id}: expected a {self.lossless} clip (this "
                f"run's lossless format), found other bytes"
            )
        atomic_write_bytes(clip, clip_bytes)
        if preview_bytes is not None:
            atomic_write_bytes(self.preview_path(job_id), preview_bytes)
        rec.update(
            status="done",
            error=None,
            timing=dict(timing or {}),
            output={
                "path": f"clips/{clip.name}",
                "sha256": sha256_file(clip),
                "frames": int(frames),
                "width": int(width),
                "height": int(height),
                "fps": str(fps),
            },
            preview=f"preview/{job_id}.mp4" if preview_bytes is not None else None,
            finished=_now(),
        )
        if extra:
            rec.update(extra)
        if save:
            self.save()
        return rec

    def record_failed(
        self, job_id: str, error: str, *, timing: dict | None = None, extra: dict | None = None
    ) -> dict:
        rec = self.job(job_id)
        rec.update(
            status="failed",
            error=str(error),
            timing=dict(timing or {}),
            output=None,
            preview=None,
            finished=_now(),
        )
        if extra:
            rec.update(extra)
        self.save()
        return rec

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for j in self.jobs:
            out[j["status"]] = out.get(j["status"], 0) + 1
        return out
