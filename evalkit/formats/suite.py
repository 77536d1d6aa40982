"""Suite files: a YAML list of source clips, prompts, seeds and renderer parameters -> jobs.

Format (``schema_version: 1``)::

    schema_version: 1
    name: canary                    # [A-Za-z0-9_.-]+
    description: "..."              # optional
    renderer: canary                # optional default renderer
    clips:                          # paths relative to the YAML file
      - {id: astronaut_pan, path: clips/astronaut_pan.mkv, description: "..."}
    params: {strength: 0.6, steps: 12, guidance: 4.0}   # shared renderer parameters (scalars)
    # either the product of clips x prompts x seeds ...
    prompts: ["watercolor", "pencil sketch"]
    seeds: [0, 1]
    # ... or an explicit list (not both); a job's params merge over the shared ones
    jobs:
      - {clip: astronaut_pan, prompt: watercolor, seed: 0, params: {strength: 0.5}}

The rules (types, patterns, known keys) are those of :class:`evalkit.formats.models.SuiteFile`;
docs/formats.md has its field tables.

A job's id is ``<clip>-<prompt slug>-s<seed>-<hash>`` where hash is the first 8 hex digits of
the sha256 of the canonical JSON of (clip id, prompt, seed, params): stable across runs,
machines and backends, and different whenever anything that changes the output differs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evalkit.errors import SchemaVersionError, SuiteError, VideoError
from evalkit.formats.models import SUITE_SCHEMA_VERSION as SCHEMA_VERSION
from evalkit.formats.models import SuiteFile, first_problem, found, version_problem
from evalkit.formats.yaml_load import problem as yaml_problem
from evalkit.formats.yaml_load import safe_load


class SuiteVersionError(SuiteError, SchemaVersionError):
    """A suite file of a schema version this evalkit cannot read."""


@dataclass(frozen=True)
class Clip:
    id: str
    path: Path
    description: str = ""


@dataclass(frozen=True)
class Job:
    id: str
    clip: str
    prompt: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "clip": self.clip,
            "prompt": self.prompt,
            "seed": self.seed,
            "params": dict(self.params),
        }


@dataclass(frozen=True)
class Suite:
    path: Path
    name: str
    description: str
    renderer: str | None
    clips: dict[str, Clip]
    jobs: list[Job]
    sha256: str  # of the YAML file's bytes

    def job(self, job_id: str) -> Job:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def summary(self) -> dict:
        """What a run manifest records about its suite."""
        return {
            "name": self.name,
            "path": str(self.path),
            "sha256": self.sha256,
            "clips": {c.id: str(c.path) for c in self.clips.values()},
            "jobs": len(self.jobs),
        }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:32] or "x"


def job_id(clip: str, prompt: str, seed: int, params: dict) -> str:
    canon = json.dumps(
        {"clip": clip, "prompt": prompt, "seed": seed, "params": params},
        sort_keys=True,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(canon.encode()).hexdigest()[:8]
    return f"{clip}-{_slug(prompt)}-s{seed}-{digest}"


def load_suite(path, *, check_clips: bool = False) -> Suite:
    """Parse and validate a suite file (:class:`~evalkit.formats.models.SuiteFile`); with
    ``check_clips``, decode every clip as well."""
    path = Path(path)
    if not path.is_file():
        raise SuiteError(path, None, "file not found" if not path.exists() else "not a file")
    raw = path.read_bytes()
    if not raw.strip():
        raise SuiteError(path, None, "empty file (expected a YAML mapping)")
    try:
        doc = safe_load(raw)
    except yaml.YAMLError as e:
        raise SuiteError(path, None, yaml_problem(e)) from None
    if not isinstance(doc, dict):
        raise SuiteError(path, None, f"expected a YAML mapping at the top level, found {found(doc)}")
    problem = version_problem(doc, SCHEMA_VERSION)
    if problem:
        raise SuiteVersionError(path, "schema_version", problem)
    try:
        model = SuiteFile.model_validate(doc, context={"base": path.parent})
    except ValidationError as e:
        raise SuiteError(path, *first_problem(e)) from None

    clips = {c.id: Clip(c.id, (path.parent / c.path).resolve(), c.description) for c in model.clips}
    shared = dict(model.params or {})
    if model.jobs is not None:
        jobs = []
        for item in model.jobs:
            params = {**shared, **(item.params or {})}
            jobs.append(
                Job(
                    job_id(item.clip, item.prompt, item.seed, params),
                    item.clip,
                    item.prompt,
                    item.seed,
                    params,
                )
            )
        seen: dict[str, int] = {}
        for i, j in enumerate(jobs):
            if j.id in seen:
                raise SuiteError(
                    path, f"jobs[{i}]", f"duplicate of jobs[{seen[j.id]}] (same clip, prompt, seed, params)"
                )
            seen[j.id] = i
    else:  # the model has checked that prompts and seeds are there, without duplicates
        jobs = [
            Job(job_id(clip, prompt, seed, shared), clip, prompt, seed, dict(shared))
            for clip in clips
            for prompt in model.prompts
            for seed in model.seeds
        ]

    suite = Suite(
        path.resolve(),
        model.name,
        model.description,
        model.renderer,
        clips,
        jobs,
        hashlib.sha256(raw).hexdigest(),
    )
    if check_clips:
        check_suite_clips(suite)
    return suite


def check_suite_clips(suite: Suite) -> dict[str, dict]:
    """Decode every clip of the suite; return {clip id: {width, height, fps, frames}}."""
    from evalkit.video import ClipReader

    out = {}
    for i, clip in enumerate(suite.clips.values()):
        try:
            reader = ClipReader(clip.path)
            n = reader.count_frames()
            info = reader.info
        except VideoError as e:
            raise SuiteError(suite.path, f"clips[{i}].path", e.problem + f" ({clip.path})") from None
        out[clip.id] = {"width": info.width, "height": info.height, "fps": str(info.fps), "frames": n}
    return out


def write_previews(suite: Suite, out_dir, *, progress: bool = True) -> list[Path]:
    """Write a browser copy (H.264 mp4) of every source clip into ``out_dir``."""
    from tqdm import tqdm

    from evalkit.video import ClipReader, write_browser

    out_dir = Path(out_dir)
    written = []
    for clip in tqdm(list(suite.clips.values()), desc="previews", unit="clip", disable=not progress):
        reader = ClipReader(clip.path)
        dest = out_dir / f"{clip.id}.mp4"
        write_browser(dest, reader, reader.info.fps)
        written.append(dest)
    return written
