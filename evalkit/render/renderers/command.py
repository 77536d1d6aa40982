"""``command`` renderer: run an external program per job, for stacks that cannot be imported.

Contract. For every job evalkit makes an empty work folder (under the run folder's ``.work/``,
removed after the job and, if evalkit was killed, by the next render) and runs::

    CMD... JOB_JSON          (option cmd, split like a shell would; no shell is involved)

with the environment variables ``EVALKIT_JOB`` (the same JSON file), ``EVALKIT_INPUT`` (the
source clip, lossless ``.mkv``), ``EVALKIT_INPUT_FRAMES`` (a folder of the source frames as
``00000.png``...) and ``EVALKIT_OUTPUT_DIR`` (an empty folder). The JSON holds ``id``,
``clip``, ``prompt``, ``seed`` (the effective seed), ``params``, ``backend`` (the spec and its
keys), ``fps``, ``frames``, ``width``, ``height``, ``input``, ``input_frames`` and
``output_dir``. The program writes its result into the output folder as ONE video file
(``.mkv``, ``.mp4``, ``.webm``, ``.avi``, ``.mov``) or as image files (``.png``...,
in natural sort order), and exits with 0. A non-zero exit or a timeout (option ``timeout``,
seconds) fails that job with the last lines of the program's stderr; a result with another
frame count or frame size than the source's (``frames``, ``width`` x ``height``) fails it too,
found from the container's header or the image count where they say, else as soon as one
frame too many is decoded; the other jobs go on.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from evalkit import video
from evalkit.render.renderers.base import (
    JobError,
    Renderer,
    RendererError,
    RenderRequest,
    WrittenClip,
    iter_expected,
    write_job_files,
)


class CommandRenderer(Renderer):
    name = "command"
    version = "1"
    streams_clips = True
    options_help = {
        "cmd": "the program and its arguments (the job JSON path is appended)",
        "timeout": "seconds before a job is stopped (default: none)",
    }

    def __init__(self, **options):
        super().__init__(**options)
        if not self.options.get("cmd"):
            raise RendererError(
                "renderer 'command': option 'cmd' is required (--renderer-opt cmd='python my_render.py')"
            )
        self.argv = shlex.split(str(self.options["cmd"]))
        try:
            self.timeout = float(self.options["timeout"]) if self.options.get("timeout") else None
        except ValueError:
            self.timeout = -1.0
        if self.timeout is not None and not 0 < self.timeout < float("inf"):
            raise RendererError(
                f"renderer 'command': option timeout: expected seconds (a "
                f"positive number), found {self.options['timeout']!r}"
            )

    def render(self, request: RenderRequest) -> WrittenClip:
        """Run the program on one job. The source is streamed to its input files and its
        output streamed into the run's files (:func:`evalkit.render.clipwriter.write_streamed`),
        a window of frames at a time: memory does not grow with the clip's length."""
        work = request.work_dir
        if work is not None:
            Path(work).mkdir(parents=True, exist_ok=True)
        n, h, w = request.source.shape[:3]
        with tempfile.TemporaryDirectory(
            prefix="cmd-" if work else "evalkit-cmd-", dir=work, ignore_cleanup_errors=True
        ) as tmp:
            tmp = Path(tmp).resolve()  # the program runs in it: absolute paths only
            src, frames_dir = tmp / "input.mkv", tmp / "input_frames"
            write_inputs(request, src, frames_dir)
            out_dir = tmp / "output"
            out_dir.mkdir()
            job = {
                **request.job.to_dict(),
                "seed": request.seed,
                "backend": self.runtime.spec.to_dict() if self.runtime else None,
                "fps": str(request.fps),
                "frames": n,
                "width": w,
                "height": h,
                "input": str(src),
                "input_frames": str(frames_dir),
                "output_dir": str(out_dir),
            }
            job_json = tmp / "job.json"
            job_json.write_text(json.dumps(job, indent=2))
            env = {
                **os.environ,
                "EVALKIT_JOB": str(job_json),
                "EVALKIT_INPUT": str(src),
                "EVALKIT_INPUT_FRAMES": str(frames_dir),
                "EVALKIT_OUTPUT_DIR": str(out_dir),
            }
            try:
                proc = subprocess.run(
                    [*self.argv, str(job_json)],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                )
            except FileNotFoundError:
                raise RendererError(f"renderer 'command': program not found: {self.argv[0]!r}") from None
            except subprocess.TimeoutExpired:
                raise JobError(f"command timed out after {self.timeout:g} s") from None
            if proc.returncode != 0:
                tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no stderr"
                raise JobError(f"command exited with {proc.returncode}: {tail}")
            chunks = iter_expected(
                output_path(out_dir, what="command output"), what="command output", frames=n, size=(w, h)
            )
            return write_job_files(chunks, request, n, prefix="command", short="command output:")


def write_inputs(request: RenderRequest, clip: Path, frames_dir: Path, chunk: int = 16) -> None:
    """The source as the program reads it: a lossless ``.mkv`` and ``00000.png``... frames,
    written a chunk at a time from ``request.source_path`` (or from ``request.source``'s
    frames when it has no path)."""
    from PIL import Image

    frames_dir.mkdir()
    if request.source_path is not None:
        chunks = video.ClipReader(request.source_path).chunks(chunk)
    else:
        chunks = (request.source[i : i + chunk] for i in range(0, len(request.source), chunk))

    def frames():
        i = 0
        for c in chunks:
            for f in c:
                Image.fromarray(f).save(frames_dir / f"{i:05d}.png", compress_level=1)
                i += 1
                yield f

    video.write_lossless(clip, frames(), request.fps)


def output_path(folder: Path, *, what: str) -> Path:
    """The program's result in ``folder``: its one video file, or the folder itself when it
    holds image files (a JobError naming ``what`` for anything else)."""
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    videos = [p for p in entries if p.suffix.lower() in video.VIDEO_EXTS]
    images = [p for p in entries if p.suffix.lower() in video.IMAGE_EXTS]
    if len(videos) == 1 and not images:
        return videos[0]
    if images and not videos:
        return folder
    raise JobError(
        f"{what}: expected one video file or image frames in the output folder, "
        f"found {sorted(p.name for p in entries) or 'nothing'}"
    )


def read_expected(
    path: Path, *, what: str, frames: int | None = None, size: tuple[int, int] | None = None, fps=None
) -> np.ndarray:
    """A clip that must have ``frames`` frames of ``size`` (width, height) (and, a video,
    ``fps`` frames a second) -> (N, H, W, 3) uint8 (the checks of :func:`iter_expected`)."""
    return np.concatenate(list(iter_expected(path, what=what, frames=frames, size=size, fps=fps)))
