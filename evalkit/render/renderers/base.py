"""The renderer protocol: load once for a backend, then render jobs into frames.

A renderer is a class constructed with its options (``--renderer-opt key=value``), then::

    renderer.load(runtime)                      # once per backend (evalkit.render.backend.Runtime)
    frames = renderer.render(request)           # once per job -> (N, H, W, 3) uint8
    renderer.unload()

``RenderRequest`` carries the job, its source frames (uint8 RGB), the frame rate, the
effective seed and a progress callback. Starting noise must be drawn on the CPU from
``request.generator()`` (a seeded ``torch.Generator('cpu')``) and only then moved to the
device, so that every backend starts from identical noise.

Renderers are found by name (``diffusers``, ``command``, ``import``, ``canary``) or by an
import path ``package.module:ClassName``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from evalkit.errors import UserError, VideoError

NOISE_POLICY = (
    "starting noise drawn on the CPU from torch.Generator('cpu').manual_seed(seed), then moved to the device"
)


class RendererError(UserError):
    """A renderer is unknown, misconfigured, or given options it does not take."""


class JobError(Exception):
    """A single job failed (bad output, missing input...); recorded, the others go on."""


@dataclass
class RenderRequest:
    job: Any  # evalkit.formats.suite.Job
    source: np.ndarray  # (N, H, W, 3) uint8
    fps: Any  # fractions.Fraction
    seed: int  # the job's seed plus any --seed-offset
    source_path: Any = None  # pathlib.Path of the source clip
    progress: Callable[[int, int], None] = field(default=lambda done, total: None)
    #: a folder for the job's temporary files: the run folder's ``.work/`` (emptied by the next
    #: render, so a killed render leaves nothing behind); None: the system's temporary folder
    work_dir: Any = None
    #: extra keys for the job's manifest record, filled in by the renderer (the ``import``
    #: renderer: where the adopted file came from and its sha256)
    record: dict = field(default_factory=dict)
    #: the run's lossless format (a renderer that writes its clip itself, :class:`WrittenClip`)
    lossless: str = "ffv1"

    def generator(self):
        import torch

        return torch.Generator("cpu").manual_seed(self.seed)


@dataclass
class WrittenClip:
    """What a renderer returns instead of frames when it has written the job's files itself,
    streaming (``import`` and ``command``: a clip of any length in a window of frames): the
    lossless clip (in :attr:`RenderRequest.lossless`) and browser copy as the driver's writers
    write them, in ``request.work_dir``; the driver moves them into the run folder."""

    clip: Any  # pathlib.Path, on the run folder's file system
    preview: Any  # pathlib.Path
    frames: int
    height: int
    width: int
    sha256: str  # the clip file's


def write_job_files(chunks, request: "RenderRequest", frames: int, *, prefix: str, short: str) -> WrittenClip:
    """A renderer's own files for ``request``'s job, streamed from ``chunks`` (``(n, H, W, 3)``
    uint8 arrays: :func:`evalkit.render.clipwriter.write_streamed`) into a new folder of
    ``request.work_dir``: the lossless clip in the run's format and the browser copy. Fewer
    than ``frames`` frames: neither file is kept and a :class:`JobError` says
    ``"{short} N frames, expected M (the source clip's count)"``."""
    import tempfile
    from pathlib import Path

    from evalkit.render.clipwriter import write_streamed
    from evalkit.video import lossless_format

    work = Path(request.work_dir) if request.work_dir is not None else None
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
    jid = request.job.id
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}-{jid[:40]}-", dir=work))
    clip = folder / f"{jid}{lossless_format(request.lossless).ext}"
    preview = folder / f"{jid}.mp4"
    got, fh, fw, sha = write_streamed(chunks, clip, preview, request.fps, codec=request.lossless)
    if got != frames:
        for f in (clip, preview):
            f.unlink(missing_ok=True)
        raise JobError(f"{short} {got} frames, expected {frames} (the source clip's count)")
    return WrittenClip(clip, preview, got, fh, fw, sha)


class Renderer:
    """Base class; subclasses set ``name`` and ``version`` and implement ``render``."""

    name = "base"
    version = "0"
    #: option name -> help text; anything else given with --renderer-opt is an error
    options_help: dict[str, str] = {}
    #: whether render() output must have as many frames as the source
    same_frame_count = True
    #: True: the renderer adopts renders made elsewhere (``import``): the backend spec only
    #: says where they were made; it is neither checked nor applied here
    adopts_renders = False
    #: True: the renderer reads the source clip itself from ``request.source_path`` and writes
    #: its files itself (:class:`WrittenClip`), so the driver hands it the source's shape only
    #: (memory: a window of frames, whatever the clip's length)
    streams_clips = False

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.options_help))
        if unknown:
            valid = ", ".join(sorted(self.options_help)) or "none"
            raise RendererError(
                f"renderer {self.name!r}: unknown option {unknown[0]!r} (valid options: {valid})"
            )
        self.options = options
        self.runtime = None

    def describe(self) -> dict:
        """What the manifest records about the renderer."""
        return {
            "name": self.name,
            "version": self.version,
            "options": dict(self.options),
            "noise": NOISE_POLICY,
        }

    def check_jobs(self, suite, jobs) -> None:
        """Called once before any backend loads: raise a UserError for jobs this renderer
        cannot take (a frame count or size its model refuses); default: nothing to check."""

    def check_done(self, run, jobs, seed_offset: int) -> None:
        """Called for the jobs a resumed run has done already, before anything renders: raise a
        UserError where they no longer hold (an imported file changed); default: nothing."""

    def job_info(self) -> dict:
        """Extra keys for the last rendered job's manifest record (e.g. what computed
        attention); default: none."""
        return {}

    def load(self, runtime) -> None:
        self.runtime = runtime

    def render(self, request: RenderRequest) -> np.ndarray:
        raise NotImplementedError

    def unload(self) -> None:
        self.runtime = None


def import_object(target: str, what: str):
    """Resolve ``package.module:attr``; errors name ``what`` (e.g. "renderer 'x'")."""
    import importlib

    module_name, sep, attr = str(target).partition(":")
    if not sep or not module_name or not attr:
        raise RendererError(f"{what}: expected an import path package.module:Name, found {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RendererError(f"{what}: cannot import module {module_name!r} ({e})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RendererError(f"{what}: module {module_name!r} has no attribute {attr!r}") from None


def to_uint8_frames(frames, *, what: str = "output") -> np.ndarray:
    """Normalise a pipeline's output to (N, H, W, 3) uint8.

    Accepts uint8 arrays, float arrays in [0, 1], torch tensors, PIL images, or lists of them.
    NaN/inf or values outside [0, 1] (floats) are errors naming the frame.
    """
    if hasattr(frames, "detach"):  # torch tensor
        frames = frames.detach().float().cpu().numpy()
    if isinstance(frames, (list, tuple)):
        if not frames:
            raise JobError(f"{what}: no frames")
        frames = np.stack([np.asarray(f) for f in frames])
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise JobError(f"{what}: expected frames of shape (N, H, W, 3), found {frames.shape}")
    if frames.dtype == np.uint8:
        return np.ascontiguousarray(frames)
    if not np.issubdtype(frames.dtype, np.floating):
        raise JobError(f"{what}: expected uint8 or float frames in [0, 1], found {frames.dtype}")
    bad = ~np.isfinite(frames).reshape(len(frames), -1).all(axis=1)
    if bad.any():
        raise JobError(f"{what}: frame {int(np.argmax(bad))} holds NaN or infinite values")
    lo, hi = float(frames.min()), float(frames.max())
    if lo < -1e-3 or hi > 1 + 1e-3:
        raise JobError(f"{what}: expected float frames in [0, 1], found values in [{lo:.3g}, {hi:.3g}]")
    return np.ascontiguousarray(np.round(np.clip(frames, 0, 1) * 255).astype(np.uint8))


def iter_expected(
    path: Path,
    *,
    what: str,
    frames: int | None = None,
    size: tuple[int, int] | None = None,
    fps=None,
    chunk: int = 16,
) -> Iterator[np.ndarray]:
    """A renderer's output clip (or an adopted file) checked as it is read: ``frames`` frames
    of ``size`` (width, height) and, a video, ``fps`` frames a second, in ``(n, H, W, 3)``
    chunks of at most ``chunk`` frames, read as they are consumed (memory: a chunk and the
    decoder's window, whatever the clip's length). A wrong size, rate or declared frame count
    (the container's header, the number of images) fails before anything is decoded; decoding
    stops at the first frame too many (a JobError naming ``what``). Fewer frames than
    ``frames`` are the caller's to check (:func:`write_job_files` does)."""
    from fractions import Fraction

    from evalkit.video import ClipReader

    try:
        reader = ClipReader(path)
        info = reader.info
        if size is not None and (info.width, info.height) != tuple(size):
            raise JobError(
                f"{what}: frames are {info.width}x{info.height}, expected "
                f"{size[0]}x{size[1]} (the source clip's size)"
            )
        if fps is not None and abs(info.fps / Fraction(fps) - 1) > Fraction(1, 10000):
            raise JobError(
                f"{what}: {float(info.fps):g} frames/s, expected "
                f"{float(Fraction(fps)):g} (the source clip's rate)"
            )
        if frames is not None and info.frames and info.frames != frames:
            raise JobError(f"{what}: {info.frames} frames, expected {frames} (the source clip's count)")
        n = 0
        for c in reader.chunks(chunk):
            if frames is not None and n + len(c) > frames:
                raise JobError(
                    f"{what}: more than {frames} frames, expected {frames} (the source clip's count)"
                )
            n += len(c)
            yield c
    except VideoError as e:
        raise JobError(f"{what}: {e}") from None
