"""``import`` renderer: adopt renders made elsewhere into a run folder.

Option ``dir``: a folder holding, for each job, ``<name>.<ext>`` (a video: mkv, nut, mp4, webm,
avi, mov) or ``<name>/`` (a folder of frames), where ``<name>`` is the job id **of the seed
actually rendered**: the job's own id in a run without ``--seed-offset``, and in a
``--seed-offset N`` run (a seed floor) the id the same clip, prompt and params have with seed
``seed + N`` (:func:`import_name`; ``evalkit suite validate --jobs --seed-offset N`` lists
them). The adopted clip is decoded and stored losslessly like any render, in the run's format
(``render --lossless``: FFV1 ``.mkv`` by default, UT Video ``.nut``), so everything downstream
treats it alike; the job's manifest record gets ``adopted_from`` (the file's path and sha256). A job with
no file fails with a message naming the exact path looked for.

The renderer only copies frames in: the backend spec of such a run says where the files were
rendered (it is not applied here), the run's fingerprint is the one adopted with ``render
--fingerprint`` (``evalkit fingerprint --json`` on the render machine), and the manifest makes
no claim about how the starting noise was drawn (``renderer.noise`` is null).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from evalkit import video
from evalkit.formats.suite import job_id
from evalkit.fsutil import sha256_file
from evalkit.render.renderers.base import JobError, RenderRequest, Renderer, RendererError

NOISE_NOTE = ("not known: the clips were rendered elsewhere and adopted as files; the run's "
              "fingerprint is the one adopted with --fingerprint")


def import_name(job, seed: int) -> str:
    """The file name (without extension) the import renderer looks for: the job id of the seed
    actually rendered (``job.id`` itself when ``seed`` is the job's own seed)."""
    return job.id if seed == job.seed else job_id(job.clip, job.prompt, seed, dict(job.params))


def folder_sha256(folder: Path) -> str:
    """sha256 of a frame folder: over its sorted file names, each with its own sha256."""
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h.update(f"{p.name}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


class ImportRenderer(Renderer):
    name = "import"
    version = "2"
    options_help = {"dir": "folder of <job id>.<video ext> files or <job id>/ frame folders "
                           "(a --seed-offset N run: the job id of seed + N)"}
    adopts_renders = True

    def __init__(self, **options):
        super().__init__(**options)
        if not self.options.get("dir"):
            raise RendererError("renderer 'import': option 'dir' is required "
                                "(--renderer-opt dir=FOLDER)")
        self.dir = Path(self.options["dir"])
        if not self.dir.is_dir():
            raise RendererError(f"{self.dir}: not a folder (renderer 'import', option dir)")

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version,
                "options": {"dir": str(self.dir.resolve())}, "noise": None,
                "noise_note": NOISE_NOTE}

    def render(self, request: RenderRequest) -> np.ndarray:
        jid = request.job.id
        name = import_name(request.job, request.seed)
        candidates = [p for p in self.dir.glob(f"{name}.*") if p.suffix.lower() in video.VIDEO_EXTS]
        folder = self.dir / name
        if folder.is_dir():
            candidates.append(folder)
        seed = "" if name == jid else f" at seed {request.seed} (seed {request.job.seed} + offset)"
        if not candidates:
            raise JobError(f"no render for job {jid}{seed}: expected {self.dir / name}.mkv "
                           f"(or another video extension, or a frame folder {self.dir / name}/)")
        if len(candidates) > 1:
            raise JobError(f"{self.dir}: several renders for job {jid}{seed}: "
                           f"{', '.join(sorted(p.name for p in candidates))}")
        from evalkit.render.renderers.command import read_expected

        src = candidates[0]
        frames = read_expected(src, what=f"import of job {jid}", frames=len(request.source))
        request.record["adopted_from"] = {
            "path": str(src.resolve()), "kind": "frames" if src.is_dir() else "video",
            "sha256": folder_sha256(src) if src.is_dir() else sha256_file(src)}
        return frames
