"""Harness overhead of `evalkit render` against calling the pipeline directly.

Side by side in one process, alternating (direct, harness, direct, harness...) so that machine
noise hits both alike; prints per-repeat wall times, medians and the overhead ratio.

    python benchmarks/bench_render.py                         # canary suite, canary pipeline, cpu
    python benchmarks/bench_render.py --backend cuda,dtype=bf16
    python benchmarks/bench_render.py --suite datasets/smoke/suite.yaml \\
        --model PATH --pipeline-class evalkit.testing.tiny_v2v:TinyVideoToVideoPipeline
    python benchmarks/bench_render.py --fake-gpu 0.08 --lossless utvideo   # no pipeline at all

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
it slow the pipeline down, as they would on a GPU). A fake-GPU run is treated as a GPU run where
evalkit tells them apart (``driver.on_device``: its runs' clips are UT Video).

The writer modes measured in sessions 9-16 (writer processes, quiet windows, FFmpeg programs)
were removed by issue 37; their raw output stays in ``results/``, and
``bench_render_scale.py`` measures the one path against an older tree at real scale.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
                while time.perf_counter() < end:  # Python work, GIL held
                    pass
                time.sleep(seconds / FAKE_STEPS)  # device work, GIL released
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
    p.add_argument(
        "--lossless",
        nargs="+",
        choices=("default", "ffv1", "utvideo"),
        default=None,
        help="the runs' lossless format, one harness run per value each repeat "
        "(default: not given, evalkit's own choice: UT Video on a device)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="print a timeline of each harness run's bursts in the last repeat (benchmarks/render_trace.py)",
    )
    p.add_argument(
        "--fake-gpu",
        type=float,
        default=None,
        metavar="SECONDS",
        help="no pipeline: sleep SECONDS per job (GIL released), return the source flipped",
    )
    p.add_argument(
        "--fake-python",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --fake-gpu: pure-Python work per job (GIL held), in 12 steps",
    )
    p.add_argument("--no-progress", action="store_true", help="harness without progress bars")
    a = p.parse_args()

    import torch

    from evalkit.formats.suite import load_suite
    from evalkit.render.backend import apply_backend, parse_spec
    from evalkit.render.driver import render_suite, select_jobs
    from evalkit.render.local_executor import LocalExecutor, check_output
    from evalkit.render.renderers import RenderRequest, get_renderer
    from evalkit.render.sources import SourceCache

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
        driver.on_device = lambda runs: True  # a GPU render's defaults (UT Video clips)
        renderer_name = f"fake-gpu ({a.fake_gpu} s asleep + {a.fake_python} s of Python a job)"
    else:
        renderer = get_renderer(renderer_name, options)

    class LoadedOnce(LocalExecutor):
        """The harness's executor, reusing the pipeline loaded for the direct runs."""

        def run(self, rend, task, sources, progress):
            with apply_backend(task.spec) as runtime:
                yield from self.render_jobs(rend, runtime, task.jobs, sources, task.seed_offset, progress)

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

    calls: list[tuple[float, float]] = []  # the harness's pipeline calls: (start, end)
    render = renderer.render

    def timed_render(request):
        t = time.perf_counter()
        try:
            return render(request)
        finally:
            calls.append((t, time.perf_counter()))

    trace = None
    traced_lines: list[str] = []  # the last traced harness run's timeline
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
                [summary] = render_suite(
                    a.suite,
                    [a.backend],
                    tmp,
                    renderer=renderer,
                    jobs=a.jobs,
                    executor=LoadedOnce(),
                    progress=not a.no_progress,
                    lossless=None if lossless == "default" else lossless,
                )
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
        return elapsed, {
            "calls": sum(e - b for b, e in calls),
            "head": calls[0][0] - t0,
            "gaps": sum(gaps),
            "max_gap": max(gaps, default=0.0),
            "tail": t0 + elapsed - calls[-1][1],
        }

    settings = list(a.lossless or [None])  # --lossless of each harness run

    def named(lossless) -> str:
        return "evalkit render" + (f", {lossless}" if lossless else "")

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
            wall, where = harness(value, traced=trace is not None and i == a.repeats - 1)
            h[value].append(wall)
            parts[value].append(where)
            line += (
                f"\n  {named(value)}: {wall:.3f} s (pipeline {where['calls']:.3f}, before "
                f"the first call {where['head']:.3f}, between calls {where['gaps']:.3f} (at "
                f"most {where['max_gap']:.3f}), after the last {where['tail']:.3f})"
            )
            if traced_lines:
                line += "".join(f"\n    {t}" for t in traced_lines)
                traced_lines.clear()
        print(line, file=sys.stderr)
    md, mo = statistics.median(d), statistics.median(own)
    n = len(jobs)
    print(
        f"suite {suite.name}, {n} jobs, backend {spec.spec}, renderer {renderer_name}, "
        f"lossless {' / '.join(a.lossless) if a.lossless else 'unset'}"
    )
    print(f"pipeline's own time   : median {mo:.3f} s  ({mo / n:.3f} s/job)")
    print(f"direct pipeline calls : median {md:.3f} s  ({md / n:.3f} s/job, sources decoded in line)")
    for value in settings:
        mh = statistics.median(h[value])
        print(f"{named(value)}: median {mh:.3f} s  ({mh / n:.3f} s/job)")
        print(
            f"  harness overhead: {100 * (mh - md) / md:+.2f}% of the direct loop's wall time "
            f"(ratio {mh / md:.4f}); {mh - mo:+.3f} s = {100 * (mh - mo) / mo:+.2f}% of the "
            f"pipeline's own time ({(mh - mo) / n:+.4f} s/job)"
        )
        med = {k: statistics.median(p[k] for p in parts[value]) for k in parts[value][0]}
        print(
            f"  harness's time, median: pipeline calls {med['calls']:.3f} s, before the first "
            f"call {med['head']:.3f} s (set-up and the first source), between calls "
            f"{med['gaps']:.3f} s (at most {med['max_gap']:.3f} s), after the last call "
            f"{med['tail']:.3f} s (its clip, preview and manifest)"
        )
    writes(suite, jobs)
    return 0


def _clips_format(run) -> str:
    """The lossless format a run's manifest records (``ffv1`` when it names none)."""
    import json

    doc = json.loads((Path(run) / "manifest.json").read_text())
    return (doc.get("lossless") or {}).get("codec", "ffv1")


def writes(suite, jobs) -> None:
    """What the last job's writing costs alone (nothing else running): its lossless clip by one
    encoder and (this evalkit has it) in parts at once, and its browser copy; median of 5."""
    import concurrent.futures

    from evalkit.render.sources import SourceCache
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
                    at_once = best(
                        lambda: write_lossless_parts(
                            f"{tmp}/p{ext}", frames, fps, codec=codec, pool=pool, parts=n
                        )
                    )
                line += f", {n} parts at once {at_once:.3f} s"
            print(line)
        print(
            f"the last job's browser copy alone: "
            f"{best(lambda: write_browser(f'{tmp}/b.mp4', frames, fps)):.3f} s"
        )


if __name__ == "__main__":
    sys.exit(main())
