"""The local executor (:class:`LocalExecutor`): a render's jobs turned into frames in this
process, one backend after the other, the pipeline loaded once per backend; and the checks of a
renderer's output (:func:`check_output`, :func:`check_written`).

The executor interface (also :class:`evalkit.executor.ray.RayExecutor`'s): ``name``,
``decodes_sources`` (whether the driver's :class:`evalkit.render.sources.SourceCache` decodes
the sources in this process), ``check(specs)`` (can these backends run?),
``fingerprint(spec)`` (the environment that will render, or None when the workers report it
with each result), ``run_all(renderer, tasks, sources, progress)`` yielding ``(task,
JobResult)`` in any order, and ``close()``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
import traceback
from pathlib import Path
from typing import Iterator

import numpy as np

from evalkit.concurrency import ordered_map
from evalkit.errors import UserError
from evalkit.render.backend import BackendSpec, Runtime, apply_backend, check_available, fingerprint
from evalkit.render.progress import Progress
from evalkit.render.renderers import JobError, Renderer, RenderRequest, WrittenClip
from evalkit.render.results import BackendTask, JobResult
from evalkit.render.sources import SourceCache


def failure_text(e: BaseException) -> str:
    """A failure in one line: the exception and where it was raised (a job's error)."""
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {e} (at {Path(tb.filename).name}:{tb.lineno})"


def adopt_workers() -> int:
    """Jobs an import (``-r import``) adopts at once: a quarter of the cores, 1 to 8 (each
    decodes its file and encodes two, with codec threads of its own)."""
    return max(1, min(8, (os.cpu_count() or 1) // 4))


class LocalExecutor:
    """Render in this process: per backend, load the renderer once, then every job in turn."""

    name = "local"
    #: the jobs' sources are decoded in this process (by the driver's :class:`SourceCache`), so
    #: the driver may start decoding the first one while it sets the runs up
    decodes_sources = True

    def check(self, specs: list[BackendSpec]) -> None:
        for spec in specs:
            check_available(spec)

    def fingerprint(self, spec: BackendSpec) -> dict:
        with apply_backend(spec):
            return fingerprint(spec)

    def run_all(
        self, renderer: Renderer, tasks: list[BackendTask], sources: "SourceCache", progress: Progress
    ) -> Iterator[tuple[BackendTask, JobResult]]:
        """One backend after the other, in this process."""
        for task in tasks:
            if task.jobs:
                for result in self.run(renderer, task, sources, progress):
                    yield task, result

    def close(self) -> None:
        pass

    def run(
        self, renderer: Renderer, task: BackendTask, sources: "SourceCache", progress: Progress
    ) -> Iterator[JobResult]:
        import torch

        # a spec that is only recorded (an import) changes none of torch's settings (turning
        # deterministic algorithms on imports TorchInductor: 4 s of a short command's start-up)
        with (
            apply_backend(task.spec)
            if task.apply
            else contextlib.nullcontext(Runtime(BackendSpec(), torch.device("cpu"), torch.float32, False))
        ) as runtime:
            renderer.load(runtime)
            try:
                yield from self.render_jobs(
                    renderer,
                    runtime,
                    task.jobs,
                    sources,
                    task.seed_offset,
                    progress,
                    work_dir=task.work_dir,
                    lossless=task.lossless,
                )
            finally:
                renderer.unload()
                if runtime.device.type == "cuda":
                    torch.cuda.empty_cache()

    @classmethod
    def render_jobs(
        cls,
        renderer,
        runtime,
        jobs,
        sources,
        seed_offset,
        progress,
        work_dir: Path | None = None,
        lossless: str = "ffv1",
    ) -> Iterator[JobResult]:
        """Render ``jobs`` one after the other, each next job's source decoded meanwhile."""
        jobs = list(jobs)
        if renderer.adopts_renders:
            # adopted files: decoding and encoding only, no device calls: several at once
            yield from ordered_map(
                lambda job: cls.render_job(
                    renderer,
                    runtime,
                    job,
                    sources,
                    seed_offset,
                    progress,
                    work_dir=work_dir,
                    lossless=lossless,
                ),
                jobs,
                adopt_workers(),
                name="evalkit-adopt",
            )
            return
        for i, job in enumerate(jobs):
            yield cls.render_job(
                renderer,
                runtime,
                job,
                sources,
                seed_offset,
                progress,
                work_dir=work_dir,
                lossless=lossless,
                next_clip=jobs[i + 1].clip if i + 1 < len(jobs) else None,
            )

    @staticmethod
    def render_job(
        renderer,
        runtime,
        job,
        sources,
        seed_offset,
        progress,
        work_dir: Path | None = None,
        next_clip: str | None = None,
        lossless: str = "ffv1",
    ) -> JobResult:
        """Render one job (``next_clip``: the next job's clip, decoded while this one renders;
        ``lossless``: the run's format, for a renderer that writes its files itself)."""
        import torch

        frames_in, fps, path = sources.get(job.clip)
        if next_clip is not None:
            sources.prefetch(next_clip)
        cuda = runtime.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(runtime.device)
            torch.cuda.reset_peak_memory_stats(runtime.device)
        update = progress.start_job(f"{job.clip} {job.prompt}")
        t0 = time.perf_counter()
        error = frames = written = None
        request = RenderRequest(
            job=job,
            source=frames_in,
            fps=fps,
            seed=job.seed + seed_offset,
            source_path=path,
            progress=update,
            work_dir=work_dir,
            lossless=lossless,
        )
        try:
            out = renderer.render(request)
            if cuda:
                torch.cuda.synchronize(runtime.device)
            if isinstance(out, WrittenClip):
                written = check_written(out, frames_in, renderer)
            else:
                frames = check_output(out, frames_in, renderer)
        except JobError as e:
            error = str(e)
        except torch.cuda.OutOfMemoryError as e:
            error = f"out of device memory: {str(e).splitlines()[0]}"
            if cuda:
                torch.cuda.empty_cache()
        except (KeyboardInterrupt, SystemExit):
            raise
        except UserError as e:
            error = str(e)
        except Exception as e:  # a renderer's bug or a pipeline failure: recorded, others go on
            error = failure_text(e)
        seconds = time.perf_counter() - t0
        info = renderer.job_info()
        timing = {
            "seconds": round(seconds, 4),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        if cuda:
            timing["peak_device_memory_bytes"] = int(torch.cuda.max_memory_allocated(runtime.device))
        progress.end_job(error is None)
        return JobResult(job, frames, fps, error, timing, extra={**info, **request.record}, written=written)


def check_written(out: WrittenClip, source: np.ndarray, renderer: Renderer) -> WrittenClip:
    """A renderer's own files (:class:`WrittenClip`) must hold the source's frame count."""
    if renderer.same_frame_count and out.frames != len(source):
        raise JobError(
            f"renderer {renderer.name!r} returned {out.frames} frames, "
            f"expected {len(source)} (the source clip's count)"
        )
    return out


def check_output(out, source: np.ndarray, renderer: Renderer) -> np.ndarray:
    """A renderer's output must be (N, H, W, 3) uint8 with the source's frame count."""
    if not isinstance(out, np.ndarray):
        raise JobError(
            f"renderer {renderer.name!r} returned {type(out).__name__}, "
            "expected a numpy array (N, H, W, 3) uint8"
        )
    if out.ndim != 4 or out.shape[-1] != 3:
        raise JobError(f"renderer {renderer.name!r} returned shape {out.shape}, expected (N, H, W, 3)")
    if out.dtype != np.uint8:
        raise JobError(f"renderer {renderer.name!r} returned dtype {out.dtype}, expected uint8")
    if renderer.same_frame_count and len(out) != len(source):
        raise JobError(
            f"renderer {renderer.name!r} returned {len(out)} frames, "
            f"expected {len(source)} (the source clip's count)"
        )
    if out.shape[1] < 2 or out.shape[2] < 2:
        raise JobError(f"renderer {renderer.name!r} returned {out.shape[2]}x{out.shape[1]} frames")
    return np.ascontiguousarray(out)
