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

from evalkit.errors import SuiteError, VideoError

SCHEMA_VERSION = 1
_TOP_KEYS = {"schema_version", "name", "description", "renderer", "clips", "params",
             "prompts", "seeds", "jobs"}
_CLIP_KEYS = {"id", "path", "description"}
_JOB_KEYS = {"clip", "prompt", "seed", "params"}
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SCALARS = (str, int, float, bool)


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
        return {"id": self.id, "clip": self.clip, "prompt": self.prompt, "seed": self.seed,
                "params": dict(self.params)}


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
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256,
                "clips": {c.id: str(c.path) for c in self.clips.values()},
                "jobs": len(self.jobs)}


def _type_name(v) -> str:
    return "null" if v is None else type(v).__name__


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:32] or "x"


def job_id(clip: str, prompt: str, seed: int, params: dict) -> str:
    canon = json.dumps({"clip": clip, "prompt": prompt, "seed": seed, "params": params},
                       sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canon.encode()).hexdigest()[:8]
    return f"{clip}-{_slug(prompt)}-s{seed}-{digest}"


class _Checker:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, field_name, problem):
        raise SuiteError(self.path, field_name, problem)

    def expect(self, value, types, field_name, what):
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            self.fail(field_name, f"expected {what}, found bool {value!r}")
        if not isinstance(value, types):
            self.fail(field_name, f"expected {what}, found {_type_name(value)} {value!r}")
        return value

    def keys(self, mapping, allowed, field_name):
        for k in mapping:
            if k not in allowed:
                where = f"{field_name}." if field_name else ""
                self.fail(f"{where}{k}", f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def params(self, value, field_name) -> dict:
        self.expect(value, dict, field_name, "a mapping of parameter names to scalars")
        for k, v in value.items():
            self.expect(k, str, field_name, "string keys")
            if not isinstance(v, _SCALARS):
                self.fail(f"{field_name}.{k}", f"expected a scalar (string, number or bool), "
                          f"found {_type_name(v)}")
        return dict(value)

    def seed(self, value, field_name) -> int:
        self.expect(value, int, field_name, "an integer seed")
        if not 0 <= value < 2**63:
            self.fail(field_name, f"expected a seed in [0, 2**63), found {value}")
        return value

    def prompt(self, value, field_name) -> str:
        self.expect(value, str, field_name, "a prompt string")
        if not value.strip():
            self.fail(field_name, "expected a non-empty prompt, found an empty string")
        return value


def load_suite(path, *, check_clips: bool = False) -> Suite:
    """Parse and validate a suite file; with ``check_clips``, decode every clip as well."""
    path = Path(path)
    if not path.is_file():
        raise SuiteError(path, None, "file not found" if not path.exists() else "not a file")
    raw = path.read_bytes()
    if not raw.strip():
        raise SuiteError(path, None, "empty file (expected a YAML mapping)")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SuiteError(path, None, f"invalid YAML{where}: {problem}") from None
    c = _Checker(path)
    c.expect(doc, dict, None, "a YAML mapping at the top level")
    c.keys(doc, _TOP_KEYS, "")
    version = doc.get("schema_version")
    if version is None:
        c.fail("schema_version", f"missing (expected {SCHEMA_VERSION})")
    c.expect(version, int, "schema_version", "an integer")
    if version != SCHEMA_VERSION:
        c.fail("schema_version", f"unsupported version {version} (this evalkit reads {SCHEMA_VERSION})")
    name = doc.get("name")
    if name is None:
        c.fail("name", "missing (expected the suite's name)")
    c.expect(name, str, "name", "a string")
    if not _ID_RE.match(name):
        c.fail("name", f"expected letters, digits, '_', '.', '-', found {name!r}")
    description = c.expect(doc.get("description", ""), str, "description", "a string")
    renderer = doc.get("renderer")
    if renderer is not None:
        c.expect(renderer, str, "renderer", "a renderer name")

    clips_raw = doc.get("clips")
    if clips_raw is None:
        c.fail("clips", "missing (expected a list of {id, path})")
    c.expect(clips_raw, list, "clips", "a list of {id, path}")
    if not clips_raw:
        c.fail("clips", "expected at least one clip, found an empty list")
    clips: dict[str, Clip] = {}
    for i, item in enumerate(clips_raw):
        f = f"clips[{i}]"
        c.expect(item, dict, f, "a mapping with id and path")
        c.keys(item, _CLIP_KEYS, f)
        for req in ("id", "path"):
            if req not in item:
                c.fail(f"{f}.{req}", "missing")
        cid = c.expect(item["id"], str, f"{f}.id", "a string id")
        if not _ID_RE.match(cid):
            c.fail(f"{f}.id", f"expected letters, digits, '_', '.', '-', found {cid!r}")
        if cid in clips:
            c.fail(f"{f}.id", f"duplicate clip id {cid!r}")
        rel = c.expect(item["path"], str, f"{f}.path", "a path string")
        clip_path = (path.parent / rel).resolve()
        if not clip_path.exists():
            c.fail(f"{f}.path", f"clip not found: {clip_path}")
        clips[cid] = Clip(cid, clip_path, c.expect(item.get("description", ""), str,
                                                   f"{f}.description", "a string"))

    shared = c.params(doc.get("params", {}) or {}, "params")
    has_product = "prompts" in doc or "seeds" in doc
    if has_product and "jobs" in doc:
        c.fail("jobs", "give either 'jobs' or 'prompts' and 'seeds', not both")
    jobs: list[Job] = []
    if "jobs" in doc:
        jobs_raw = c.expect(doc["jobs"], list, "jobs", "a list of {clip, prompt, seed}")
        for i, item in enumerate(jobs_raw):
            f = f"jobs[{i}]"
            c.expect(item, dict, f, "a mapping with clip, prompt and seed")
            c.keys(item, _JOB_KEYS, f)
            for req in ("clip", "prompt", "seed"):
                if req not in item:
                    c.fail(f"{f}.{req}", "missing")
            clip = c.expect(item["clip"], str, f"{f}.clip", "a clip id")
            if clip not in clips:
                c.fail(f"{f}.clip", f"unknown clip {clip!r} (clips: {', '.join(clips)})")
            params = {**shared, **c.params(item.get("params", {}) or {}, f"{f}.params")}
            prompt = c.prompt(item["prompt"], f"{f}.prompt")
            seed = c.seed(item["seed"], f"{f}.seed")
            jobs.append(Job(job_id(clip, prompt, seed, params), clip, prompt, seed, params))
    else:
        for req in ("prompts", "seeds"):
            if req not in doc:
                c.fail(req, "missing (give 'prompts' and 'seeds', or an explicit 'jobs' list)")
        prompts = c.expect(doc["prompts"], list, "prompts", "a list of prompt strings")
        seeds = c.expect(doc["seeds"], list, "seeds", "a list of integer seeds")
        if not prompts:
            c.fail("prompts", "expected at least one prompt, found an empty list")
        if not seeds:
            c.fail("seeds", "expected at least one seed, found an empty list")
        prompts = [c.prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        seeds = [c.seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)]
        for clip in clips:
            for prompt in prompts:
                for seed in seeds:
                    jobs.append(Job(job_id(clip, prompt, seed, shared), clip, prompt, seed,
                                    dict(shared)))
    if not jobs:
        c.fail("jobs", "expected at least one job, found none")
    seen: dict[str, int] = {}
    for i, j in enumerate(jobs):
        if j.id in seen:
            c.fail(f"jobs[{i}]", f"duplicate of jobs[{seen[j.id]}] (same clip, prompt, seed, params)")
        seen[j.id] = i

    suite = Suite(path.resolve(), name, description, renderer, clips, jobs,
                  hashlib.sha256(raw).hexdigest())
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
        out[clip.id] = {"width": info.width, "height": info.height, "fps": str(info.fps),
                        "frames": n}
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
