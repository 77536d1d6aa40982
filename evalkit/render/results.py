"""What a render's steps hand each other: :class:`BackendTask` (one backend's jobs still to
render, given to an executor), :class:`JobResult` (one rendered or failed job, from an executor
to the driver) and :class:`RenderSummary` (one run's counts, what ``render_suite`` returns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalkit.formats.suite import Job
from evalkit.render.backend import BackendSpec
from evalkit.render.renderers import WrittenClip


@dataclass
class JobResult:
    job: Job
    frames: np.ndarray | None
    fps: object
    error: str | None
    timing: dict = field(default_factory=dict)
    #: set by executors that encode elsewhere: clip/preview bytes and frames/width/height
    encoded: dict | None = None
    #: extra keys for the job's manifest record (a cluster executor: node, attempts)
    extra: dict = field(default_factory=dict)
    #: the fingerprint of the environment that rendered it (None: the driver's own)
    fingerprint: dict | None = None
    #: files the renderer wrote itself, streaming (``frames`` is None): moved into place
    written: WrittenClip | None = None


@dataclass
class BackendTask:
    """All the jobs one backend still has to render."""

    spec: BackendSpec
    jobs: list[Job]
    seed_offset: int = 0
    #: where renderers keep a job's temporary files (the run folder's WORK_DIR; None: the
    #: system's temporary folder)
    work_dir: Path | None = None
    #: False: ``spec`` only says where adopted renders were made; the executor applies the
    #: defaults (cpu) instead
    apply: bool = True
    #: how the summary names the run (its label; None: the spec)
    name: str | None = None
    #: the run's lossless format (:data:`evalkit.lossless.LOSSLESS_FORMATS`): executors that
    #: encode elsewhere (Ray) write the clip in it
    lossless: str = "ffv1"


@dataclass
class RenderSummary:
    backend: str
    path: Path
    done: int
    failed: int
    skipped: int
    failures: dict[str, str]
