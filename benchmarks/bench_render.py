"""Harness overhead of `evalkit render` against calling the pipeline directly.

Side by side in one process, alternating (direct, harness, direct, harness...) so that machine
noise hits both alike; prints per-repeat wall times, medians and the overhead ratio.

    python benchmarks/bench_render.py                         # canary suite, canary pipeline, cpu
    python benchmarks/bench_render.py --backend cuda,dtype=bf16
    python benchmarks/bench_render.py --suite datasets/smoke/suite.yaml \\
        --model PATH --pipeline-class evalkit.testing.tiny_v2v:TinyVideoToVideoPipeline
    python benchmarks/bench_render.py --fake-gpu 0.08 --lossless utvideo   # no pipeline at all
    python benchmarks/bench_render.py --backend cuda --writer-processes 0 1 auto   # writers:
                                                   # threads vs processes, side by side
    python benchmarks/bench_render.py --backend cuda --writes overlap batch auto   # quiet phases
    python benchmarks/bench_render.py --backend cuda --writes overlap auto --encoders pyav ffmpeg
    python benchmarks/bench_render.py --fake-gpu 0.15 --fake-python 0.02 --writes overlap batch auto

"direct" = load the pipeline once, then per job: decode the source clip, call the pipeline
exactly as the diffusers renderer does, convert to uint8. "harness" = `render_suite` into a fresh
folder with the same loaded-once pipeline: the same work plus backend set-up, progress bars,
lossless clip + H.264 preview writing, sha256 and manifest updates.

Two overheads are printed: against the direct loop's wall time (which decodes every source on
the critical path; the harness decodes the next job's source while the current one renders), and
against the pipeline's own time (the sum of the render calls of the direct loop: issue #16's
target, at most 10%).

``--fake-gpu SECONDS``: instead of a pipeline, a renderer that waits SECONDS per job in
``time.sleep`` (which lets go of the GIL, as a GPU's kernels do) and returns the source flipped
upside down, so the harness's own cost around a GIL-free pipeline shows on a CPU-only machine.
``--fake-python SECONDS`` adds that much pure-Python work per job, spread over 12 steps between
the sleeps, like a diffusion loop launching kernels (it holds the GIL: writer threads that want
it slow the pipeline down, as they would on a GPU). The harness treats a fake-GPU run as a GPU
run where evalkit tells them apart (``driver.use_processes``: its writers where a GPU render's
would be, threads unless ``procwrite.DEVICE_DEFAULT`` or ``--writer-processes 1``; its
``EVALKIT_RENDER_WRITES`` default, ``auto``, as a GPU render's: ``driver.on_device``).

``--writer-processes 0 1 auto``: each repeat runs the harness once per value, with
``EVALKIT_WRITER_PROCESSES`` set to it (0: the writers on threads of the rendering process, 1:
in worker processes, ``evalkit/render/procwrite.py``, every job, the first ones waiting for
the workers to start; auto: unset, evalkit's own choice: threads, or, if
``procwrite.DEVICE_DEFAULT`` is on, processes when a device renders, the jobs done before they
have started written on threads), and reports each; default: auto.

``--encoders pyav ffmpeg``: likewise with ``EVALKIT_RENDER_ENCODER`` (pyav: PyAV's encoders
on threads of this process; ffmpeg: each file by an FFmpeg program a thread feeds through a
pipe, ``evalkit/render/ffwrite.py``). ``raw``, a diagnostic: ``ffmpeg`` with each file's
encoding replaced by a dump of the frames' bytes in one write (what the calls cost beside the
harness's own Python alone; the files are not playable).

``--writes overlap batch auto``: likewise with ``EVALKIT_RENDER_WRITES``
(``evalkit/render/quiet.py``; overlap: the next source decoded and the finished jobs written
beside the pipeline calls; batch: quiet phases, the jobs in windows, the window's sources
decoded before it and its results written in one burst after it, nothing beside the calls;
auto: batch while the calls are short, overlap once their mean reaches
``quiet.LONG_CALL_SECONDS``); default: unset (evalkit's own choice: auto on a device, the fake
GPU included, overlap on the CPU). With both options, one harness run per pair of values. In
batch mode "before the first call" includes decoding the first window's sources, "between
calls" the bursts.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: denoising steps of the fake pipeline (the canary suite's ``steps``)
FAKE_STEPS = 12


def fake_gpu_renderer(seconds: float, python_seconds: float = 0.0):
    """A renderer that stands in for a GPU pipeline (see the module's docstring)."""
    import numpy as np

    from evalkit.render.renderers import Renderer

    class FakeGpu(Renderer):
        name = "fake-gpu"
        version = "1"

        def render(self, request):
            for step in range(FAKE_STEPS):
                end = time.perf_counter() + python_seconds / FAKE_STEPS
                while time.perf_counter() < end:     # Python work, GIL held
                    pass
                time.sleep(seconds / FAKE_STEPS)     # device work, GIL released
                request.progress(step + 1, FAKE_STEPS)
            return np.ascontiguousarray(request.source[:, ::-1])

    return FakeGpu()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default=str(ROOT / "datasets" / "canary" / "suite.yaml"))
    p.add_argument("--backend", default="cpu,dtype=fp32")
    p.add_argument("--renderer", default="canary")
    p.add_argument("--model", default=None)
    p.add_argument("--pipeline-class", default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", nargs="*", default=None)
    p.add_argument("--lossless", nargs="+", choices=("default", "ffv1", "utvideo"), default=None,
                   help="the runs' lossless format, one harness run per value each repeat "
                        "(default: not given, evalkit's own choice: UT Video on a device)")
    p.add_argument("--trace", action="store_true",
                   help="print a timeline of each harness run's bursts in the last repeat "
                        "(benchmarks/render_trace.py)")
    p.add_argument("--fake-gpu", type=float, default=None, metavar="SECONDS",
                   help="no pipeline: sleep SECONDS per job (GIL released), return the source "
                        "flipped")
    p.add_argument("--fake-python", type=float, default=0.0, metavar="SECONDS",
                   help="with --fake-gpu: pure-Python work per job (GIL held), in 12 steps")
    p.add_argument("--no-progress", action="store_true", help="harness without progress bars")
    p.add_argument("--writer-processes", nargs="+", choices=("0", "1", "auto"), default=None,
                   help="EVALKIT_WRITER_PROCESSES for the harness runs, one run per value "
                        "each repeat (auto: unset, evalkit's own choice; the default)")
    p.add_argument("--writes", nargs="+", choices=("overlap", "batch", "auto"), default=None,
                   help="EVALKIT_RENDER_WRITES for the harness runs, one run per value each "
                        "repeat (default: unset, evalkit's own choice)")
    p.add_argument("--encoders", nargs="+", choices=("pyav", "ffmpeg", "raw", "gentle"),
                   default=None,
                   help="EVALKIT_RENDER_ENCODER for the harness runs, one run per value each "
                        "repeat (pyav: in this process; ffmpeg: FFmpeg programs fed through "
                        "pipes; default: unset, pyav)")
    a = p.parse_args()
    if a.writes:
        import evalkit

        try:
            from evalkit.render.quiet import MODES
        except ImportError:
            MODES = ()
        missing = [w for w in a.writes if w not in MODES]
        if missing:
            print(f"--writes: the evalkit imported ({evalkit.__file__}) has no "
                  f"EVALKIT_RENDER_WRITES={missing[0]}; run with PYTHONPATH=<this checkout>",
                  file=sys.stderr)
            return 2

    import torch

    from evalkit.render.backend import apply_backend, parse_spec
    from evalkit.render.driver import LocalExecutor, SourceCache, check_output, render_suite, select_jobs
    from evalkit.render.renderers import RenderRequest, get_renderer
    from evalkit.formats.suite import load_suite

    options = {}
    if a.model:
        options["model"] = a.model
    if a.pipeline_class:
        options["pipeline_class"] = a.pipeline_class
    renderer_name = "diffusers" if a.model and a.renderer == "canary" else a.renderer
    suite = load_suite(a.suite)
    jobs = select_jobs(suite, a.jobs)
    spec = parse_spec(a.backend)
    import evalkit.render.driver as driver

    if a.fake_gpu is not None:
        renderer = fake_gpu_renderer(a.fake_gpu, a.fake_python)
        if hasattr(driver, "use_processes"):       # the writers of a GPU render
            from evalkit.render import procwrite

            def as_on_a_gpu(tasks) -> bool:
                forced = procwrite.forced()
                if forced is not None:
                    return forced
                return procwrite.DEVICE_DEFAULT and os.name == "posix"

            driver.use_processes = as_on_a_gpu
        if hasattr(driver, "on_device"):           # EVALKIT_RENDER_WRITES: a GPU render's default
            driver.on_device = lambda runs: True
        renderer_name = f"fake-gpu ({a.fake_gpu} s asleep + {a.fake_python} s of Python a job)"
    else:
        renderer = get_renderer(renderer_name, options)

    class LoadedOnce(LocalExecutor):
        """The harness's executor, reusing the pipeline loaded for the direct runs."""

        def run(self, rend, task, sources, progress):
            with apply_backend(task.spec) as runtime:
                yield from self.render_jobs(rend, runtime, task.jobs, sources, task.seed_offset,
                                            progress)

    with apply_backend(spec) as runtime:
        renderer.load(runtime)

    def direct() -> tuple[float, float]:
        """(wall time, the pipeline's own time: its render calls)"""
        own = 0.0
        t0 = time.perf_counter()
        with apply_backend(spec):
            sources = SourceCache(suite)
            for job in jobs:
                frames, fps, path = sources.get(job.clip)
                t1 = time.perf_counter()
                out = renderer.render(RenderRequest(job, frames, fps, job.seed, path))
                if runtime.device.type == "cuda":
                    torch.cuda.synchronize()
                own += time.perf_counter() - t1
                check_output(out, frames, renderer)
        return time.perf_counter() - t0, own

    calls: list[tuple[float, float]] = []      # the harness's pipeline calls: (start, end)
    render = renderer.render

    def timed_render(request):
        t = time.perf_counter()
        try:
            return render(request)
        finally:
            calls.append((t, time.perf_counter()))

    trace = None
    traced_lines: list[str] = []        # the last traced harness run's timeline
    if a.trace:
        from render_trace import Trace

        trace = Trace()

    def harness(lossless: str | None = None, traced: bool = False) -> tuple[float, dict]:
        """(wall time, where the time outside the pipeline calls went)"""
        calls.clear()
        renderer.render = timed_render
        if traced:
            trace.on()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                [summary] = render_suite(a.suite, [a.backend], tmp, renderer=renderer,
                                         jobs=a.jobs, executor=LoadedOnce(),
                                         progress=not a.no_progress,
                                         lossless=None if lossless == "default" else lossless)
                elapsed = time.perf_counter() - t0
                made = _clips_format(summary.path)
        finally:
            del renderer.render
            if traced:
                trace.off()
        if traced:
            traced_lines[:] = trace.report(t0, t0 + elapsed, calls)
        if summary.failed:
            raise SystemExit(f"harness run failed: {summary.failures}")
        gaps = [b[0] - a_[1] for a_, b in zip(calls, calls[1:])]
        if lossless == "default":
            print(f"    (--lossless not given: the run's clips are {made})", file=sys.stderr)
        return elapsed, {"calls": sum(e - b for b, e in calls), "head": calls[0][0] - t0,
                         "gaps": sum(gaps), "max_gap": max(gaps, default=0.0),
                         "tail": t0 + elapsed - calls[-1][1]}

    # (EVALKIT_RENDER_WRITES, EVALKIT_WRITER_PROCESSES, EVALKIT_RENDER_ENCODER, --lossless)
    # of each harness run, None: unset
    settings = [(w, None if v == "auto" else v, e, f) for w in a.writes or [None]
                for v in a.writer_processes or ["auto"] for e in a.encoders or [None]
                for f in a.lossless or [None]]

    def harness_with(value, traced: bool = False):
        for name, v in zip(("EVALKIT_RENDER_WRITES", "EVALKIT_WRITER_PROCESSES",
                            "EVALKIT_RENDER_ENCODER"), value):
            if v is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = "ffmpeg" if v in ("raw", "gentle") else v
        with _swapped(value[2]):
            return harness(value[3], traced)

    def named(value) -> str:
        writes, procs, enc, lossless = value
        writers = {None: "evalkit render (auto)", "0": "writers: threads (0)",
                   "1": "writers: processes (1)"}[procs]
        name = writers if writes is None else (
            f"writes {writes}" + (f", {writers}" if a.writer_processes else ""))
        return name + (f", encoder {enc}" if enc else "") + (f", {lossless}" if lossless else "")

    direct()  # warm-up (first-call allocations, kernels)
    d, own = [], []
    h = {v: [] for v in settings}
    parts = {v: [] for v in settings}
    for i in range(a.repeats):
        wall, pipe = direct()
        d.append(wall)
        own.append(pipe)
        line = f"repeat {i + 1}: direct {d[-1]:.3f} s (pipeline {own[-1]:.3f} s)"
        for value in settings:
            wall, where = harness_with(value, traced=trace is not None and i == a.repeats - 1)
            h[value].append(wall)
            parts[value].append(where)
            line += (f"\n  {named(value)}: {wall:.3f} s (pipeline {where['calls']:.3f}, before "
                     f"the first call {where['head']:.3f}, between calls {where['gaps']:.3f} (at "
                     f"most {where['max_gap']:.3f}), after the last {where['tail']:.3f})")
            if traced_lines:
                line += "".join(f"\n    {t}" for t in traced_lines)
                traced_lines.clear()
        print(line, file=sys.stderr)
    md, mo = statistics.median(d), statistics.median(own)
    n = len(jobs)
    print(f"suite {suite.name}, {n} jobs, backend {spec.spec}, renderer {renderer_name}, "
          f"lossless {' / '.join(a.lossless) if a.lossless else 'unset'}")
    print(f"pipeline's own time   : median {mo:.3f} s  ({mo / n:.3f} s/job)")
    print(f"direct pipeline calls : median {md:.3f} s  ({md / n:.3f} s/job, sources decoded "
          "in line)")
    for value in settings:
        mh = statistics.median(h[value])
        print(f"{named(value)}: median {mh:.3f} s  ({mh / n:.3f} s/job)")
        print(f"  harness overhead: {100 * (mh - md) / md:+.2f}% of the direct loop's wall time "
              f"(ratio {mh / md:.4f}); {mh - mo:+.3f} s = {100 * (mh - mo) / mo:+.2f}% of the "
              f"pipeline's own time ({(mh - mo) / n:+.4f} s/job)")
        med = {k: statistics.median(p[k] for p in parts[value]) for k in parts[value][0]}
        print(f"  harness's time, median: pipeline calls {med['calls']:.3f} s, before the first "
              f"call {med['head']:.3f} s (set-up and the first source), between calls "
              f"{med['gaps']:.3f} s (at most {med['max_gap']:.3f} s), after the last call "
              f"{med['tail']:.3f} s (its clip, preview and manifest)")
    writes(suite, jobs)
    return 0


def _clips_format(run) -> str:
    """The lossless format a run's manifest records (``ffv1`` when it names none)."""
    import json

    doc = json.loads((Path(run) / "manifest.json").read_text())
    return (doc.get("lossless") or {}).get("codec", "ffv1")


@contextlib.contextmanager
def _swapped(encoder: str | None):
    """The experiments of ``--encoders`` on top of FFmpeg programs, swapped in for one harness
    run. ``raw`` (a diagnostic): each file's encoding replaced by :func:`_raw_dump`. ``gentle``:
    programs with one codec thread each, at niceness 19, one file at a time beside the calls
    (``driver.encoder_threads``: 1), sources decoded by one-threaded programs too: what the
    calls lose beside a light, steady load."""
    import evalkit.render.driver as driver
    from evalkit.render import ffwrite

    with contextlib.ExitStack() as stack:
        if encoder == "raw":
            stack.enter_context(mock.patch.object(ffwrite, "write_lossless", _raw_dump))
            stack.enter_context(mock.patch.object(ffwrite, "write_browser", _raw_dump))
        elif encoder == "gentle":
            class OneThread(ffwrite.ProgramWriter):
                def __init__(self, threads: int = 1):
                    super().__init__(1)

            read = ffwrite.read_exact
            stack.enter_context(mock.patch.object(ffwrite, "ProgramWriter", OneThread))
            stack.enter_context(mock.patch.object(ffwrite, "read_exact",
                                                  lambda path, threads=0: read(path, 1)))
            stack.enter_context(mock.patch.object(driver, "encoder_threads", lambda: 1))
            stack.enter_context(mock.patch.dict(os.environ, {"EVALKIT_FFMPEG_NICE": "19"}))
        yield


def _raw_dump(path, frames, fps, *args, codec: str = "ffv1", **kw) -> int:
    """``--encoders raw`` (a diagnostic): the frames' bytes dumped into the file in one write,
    no encoding, so what is left beside the calls is the harness's own Python."""
    import numpy as np

    from evalkit.fsutil import atomic_path
    from evalkit.video import browser_target, lossless_target

    path = lossless_target(path, codec)[1] if str(path).endswith((".mkv", ".nut")) \
        else browser_target(path)
    frames = np.ascontiguousarray(frames)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(memoryview(frames).cast("B"))
    return len(frames)


def writes(suite, jobs) -> None:
    """What the last job's writing costs alone (nothing else running): its lossless clip by one
    encoder and (this evalkit has it) in parts at once, and its browser copy; median of 5."""
    import concurrent.futures

    from evalkit.render.driver import SourceCache
    from evalkit.video import write_browser, write_lossless

    try:
        from evalkit.render.clipwriter import write_lossless_parts
        from evalkit.render.driver import clip_parts
    except ImportError:
        write_lossless_parts = None
    sources = SourceCache(suite)
    frames, fps, _ = sources.get(jobs[-1].clip)
    frames = np.ascontiguousarray(frames[:, ::-1])
    sources.close()

    def best(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    with tempfile.TemporaryDirectory() as tmp:
        for codec, ext in (("ffv1", ".mkv"), ("utvideo", ".nut")):
            one = best(lambda: write_lossless(f"{tmp}/c{ext}", frames, fps, codec=codec))
            line = f"the last job's {codec} clip alone: one encoder {one:.3f} s"
            if write_lossless_parts is not None and clip_parts() > 1:
                n = clip_parts()
                with concurrent.futures.ThreadPoolExecutor(n) as pool:
                    at_once = best(lambda: write_lossless_parts(f"{tmp}/p{ext}", frames, fps,
                                                                codec=codec, pool=pool, parts=n))
                line += f", {n} parts at once {at_once:.3f} s"
            print(line)
        print(f"the last job's browser copy alone: "
              f"{best(lambda: write_browser(f'{tmp}/b.mp4', frames, fps)):.3f} s")
        try:
            from evalkit.render import ffwrite

            ffwrite.ffmpeg_exe()
        except Exception:  # noqa: BLE001 - an older tree, or no FFmpeg program here
            return
        print(f"by FFmpeg programs (ffwrite): the ffv1 clip alone "
              f"{best(lambda: ffwrite.write_lossless(f'{tmp}/f.mkv', frames, fps)):.3f} s, the "
              f"browser copy alone "
              f"{best(lambda: ffwrite.write_browser(f'{tmp}/f.mp4', frames, fps)):.3f} s")
        # a burst as a batch render's: every job's clip and copy at once on burst_threads()
        from evalkit.render.driver import burst_threads

        everything = [np.ascontiguousarray(sources_frames[::-1]) for sources_frames in
                      [frames] * len(jobs)]
        n = burst_threads()
        for name, clip, copy in (("PyAV on threads", write_lossless, write_browser),
                                 ("FFmpeg programs", ffwrite.write_lossless,
                                  ffwrite.write_browser)):
            def burst():
                with concurrent.futures.ThreadPoolExecutor(n) as pool:
                    fs = [pool.submit(clip, f"{tmp}/burst{i}.mkv", f, fps)
                          for i, f in enumerate(everything)]
                    fs += [pool.submit(copy, f"{tmp}/burst{i}.mp4", f, fps)
                           for i, f in enumerate(everything)]
                    for f in fs:
                        f.result()
            print(f"a burst of {len(everything)} clips and {len(everything)} browser copies "
                  f"on {n} threads, {name}: {best(burst):.3f} s")


if __name__ == "__main__":
    sys.exit(main())
