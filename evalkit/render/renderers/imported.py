"""``import`` renderer: adopt renders made elsewhere into a run folder.

Option ``dir``: a folder holding, for each job, ``<name>.<ext>`` (a video: mkv, nut, mp4, webm,
avi, mov) or ``<name>/`` (a folder of frames), where ``<name>`` is the job id **of the seed
actually rendered**: the job's own id in a run without ``--seed-offset``, and in a
``--seed-offset N`` run (a seed floor) the id the same clip, prompt and params have with seed
``seed + N`` (:func:`import_name`; ``evalkit suite validate --jobs --seed-offset N`` lists
them). The adopted clip is decoded and stored losslessly like any render, in the run's format
(``render --lossless``: FFV1 ``.mkv`` by default, UT Video ``.nut``), so everything downstream
treats it alike; the job's manifest record gets ``adopted_from`` (the file's path and sha256). A job with
no file fails with a message naming the exact path looked for; so does one whose file has
another frame size, frame count or (a video) frame rate than the source clip, naming the file.
A resumed import checks the jobs it has done: a file of other content (sha256) for one is
refused with one line (:meth:`ImportRenderer.check_done`), never kept silently.

The renderer only copies frames in: the backend spec of such a run says where the files were
rendered (it is not applied here), the run's fingerprint is the one adopted with ``render
--fingerprint`` (``evalkit fingerprint --json`` on the render machine), and the manifest makes
no claim about how the starting noise was drawn (``renderer.noise`` is null).
"""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path

from evalkit import video
from evalkit.errors import UserError
from evalkit.formats.suite import job_id
from evalkit.fsutil import sha256_file
from evalkit.render.renderers.base import (
    JobError,
    Renderer,
    RendererError,
    RenderRequest,
    WrittenClip,
    write_job_files,
)

NOISE_NOTE = (
    "not known: the clips were rendered elsewhere and adopted as files; the run's "
    "fingerprint is the one adopted with --fingerprint"
)


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
    options_help = {
        "dir": "folder of <job id>.<video ext> files or <job id>/ frame folders "
        "(a --seed-offset N run: the job id of seed + N)"
    }
    adopts_renders = True
    streams_clips = True

    def __init__(self, **options):
        super().__init__(**options)
        if not self.options.get("dir"):
            raise RendererError("renderer 'import': option 'dir' is required (--renderer-opt dir=FOLDER)")
        self.dir = Path(self.options["dir"])
        if not self.dir.is_dir():
            raise RendererError(f"{self.dir}: not a folder (renderer 'import', option dir)")

    def describe(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "options": {"dir": str(self.dir.resolve())},
            "noise": None,
            "noise_note": NOISE_NOTE,
        }

    def _find(self, job, seed: int) -> Path:
        """The one render of ``job`` at ``seed`` in the folder (a JobError when none or several)."""
        jid = job.id
        name = import_name(job, seed)
        candidates = render_files(self.dir, name)
        at = "" if name == jid else f" at seed {seed} (seed {job.seed} + offset)"
        if not candidates:
            raise JobError(
                f"no render for job {jid}{at}: expected {self.dir / name}.mkv "
                f"(or another video extension, or a frame folder {self.dir / name}/)"
            )
        if len(candidates) > 1:
            raise JobError(
                f"{self.dir}: several renders for job {jid}{at}: "
                f"{', '.join(sorted(p.name for p in candidates))}"
            )
        return candidates[0]

    @staticmethod
    def _adopted(src: Path) -> dict:
        return {
            "path": str(src.resolve()),
            "kind": "frames" if src.is_dir() else "video",
            "sha256": folder_sha256(src) if src.is_dir() else sha256_file(src),
        }

    def check_done(self, run, jobs, seed_offset: int) -> None:
        """Jobs of ``run`` already imported: a UserError when the folder now holds a render of
        other content for one (by sha256, at the same path or another), whose old frames a
        resumed import would otherwise keep without a word. The same content from another
        folder is the same render: nothing to do."""
        for job in jobs:
            old = run.job(job.id).get("adopted_from")
            try:
                src = self._find(job, job.seed + seed_offset)
            except JobError:
                continue  # nothing here for it: the done job stays as it is
            if not old or not (src.is_file() or src.is_dir()):
                continue
            new = self._adopted(src)
            if new["sha256"] != old.get("sha256"):
                raise UserError(
                    f"{run.path / 'manifest.json'}: job {job.id} was imported from "
                    f"{old.get('path')} (sha256 {str(old.get('sha256'))[:12]}...), {new['path']} "
                    f"has other content (sha256 {new['sha256'][:12]}...): to import it, render "
                    "into another --out folder (this run stays as it is)"
                )

    def render(self, request: RenderRequest) -> WrittenClip:
        """Decode the adopted file chunk by chunk, each chunk handed to the lossless and the
        browser encoders at once (:func:`evalkit.render.clipwriter.write_streamed`): memory is
        a window of frames, not the clip (the source clip is not decoded into memory either:
        only its size, rate and frame count are needed, :class:`evalkit.render.sources.SourceCache`)."""

        from evalkit.render.renderers.base import iter_expected

        jid = request.job.id
        src = self._find(request.job, request.seed)
        if not (src.is_file() or src.is_dir()):
            raise JobError(f"import of job {jid}: {src}: not a regular file or folder")
        n, h, w = request.source.shape[:3]
        what = f"import of job {jid} ({src})"
        clear = video.transparency(src)
        if clear is not None:  # read as RGB, the alpha would be dropped without a word
            raise JobError(
                f"{what}: {clear} is transparent (an alpha channel below full); "
                "frames are compared as RGB and the alpha would be dropped: flatten "
                "the clip onto its background first (e.g. ffmpeg's overlay filter)"
            )
        chunks = iter_expected(
            src, what=what, frames=n, size=(w, h), fps=None if src.is_dir() else request.fps
        )
        written = write_job_files(
            chunks, request, n, prefix="import", short=f"renderer {self.name!r} returned"
        )
        request.record["adopted_from"] = self._adopted(src)
        return written


def render_files(folder: Path, stem: str) -> list[Path]:
    """The renders named ``stem`` in ``folder``: ``stem.<video extension>`` files
    (:data:`evalkit.video.VIDEO_EXTS`) and a frame folder ``stem/``."""
    out = [p for p in folder.glob(f"{glob.escape(stem)}.*") if p.suffix.lower() in video.VIDEO_EXTS]
    if (folder / stem).is_dir():
        out.append(folder / stem)
    return out
