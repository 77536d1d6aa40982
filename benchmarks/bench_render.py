"""Harness overhead of `evalkit render` against calling the pipeline directly.

Side by side in one process, alternating (direct, harness, direct, harness...) so that machine
noise hits both alike; prints per-repeat wall times, medians and the overhead ratio.

    python benchmarks/bench_render.py                         # canary suite, canary pipeline, cpu
    python benchmarks/bench_render.py --backend cuda,dtype=bf16
    python benchmarks/bench_render.py --suite datasets/smoke/suite.yaml \\
        --model PATH --pipeline-class evalkit.testing.tiny_v2v:TinyVideoToVideoPipeline

"direct" = load the pipeline once, then per job: decode the source clip, call the pipeline
exactly as the diffusers renderer does, convert to uint8. "harness" = `render_suite` into a fresh
folder with the same loaded-once pipeline: the same work plus backend set-up, progress bars,
lossless clip + H.264 preview writing, sha256 and manifest updates.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default=str(ROOT / "datasets" / "canary" / "suite.yaml"))
    p.add_argument("--backend", default="cpu,dtype=fp32")
    p.add_argument("--renderer", default="canary")
    p.add_argument("--model", default=None)
    p.add_argument("--pipeline-class", default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", nargs="*", default=None)
    a = p.parse_args()

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
    renderer = get_renderer(renderer_name, options)

    class LoadedOnce(LocalExecutor):
        """The harness's executor, reusing the pipeline loaded for the direct runs."""

        def run(self, rend, task, sources, progress):
            with apply_backend(task.spec) as runtime:
                yield from self.render_jobs(rend, runtime, task.jobs, sources, task.seed_offset,
                                            progress)

    with apply_backend(spec) as runtime:
        renderer.load(runtime)

    def direct() -> float:
        t0 = time.perf_counter()
        with apply_backend(spec):
            sources = SourceCache(suite)
            for job in jobs:
                frames, fps, path = sources.get(job.clip)
                out = renderer.render(RenderRequest(job, frames, fps, job.seed, path))
                if runtime.device.type == "cuda":
                    torch.cuda.synchronize()
                check_output(out, frames, renderer)
        return time.perf_counter() - t0

    def harness() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            [summary] = render_suite(a.suite, [a.backend], tmp, renderer=renderer, jobs=a.jobs,
                                     executor=LoadedOnce(), progress=True)
            elapsed = time.perf_counter() - t0
            if summary.failed:
                raise SystemExit(f"harness run failed: {summary.failures}")
            return elapsed

    direct()  # warm-up (first-call allocations, kernels)
    d, h = [], []
    for i in range(a.repeats):
        d.append(direct())
        h.append(harness())
        print(f"repeat {i + 1}: direct {d[-1]:.3f} s  harness {h[-1]:.3f} s", file=sys.stderr)
    md, mh = statistics.median(d), statistics.median(h)
    print(f"suite {suite.name}, {len(jobs)} jobs, backend {spec.spec}, renderer {renderer_name}")
    print(f"direct pipeline calls : median {md:.3f} s  ({md / len(jobs):.3f} s/job)")
    print(f"evalkit render        : median {mh:.3f} s  ({mh / len(jobs):.3f} s/job)")
    print(f"harness overhead      : {100 * (mh - md) / md:+.2f}% of wall time (ratio {mh / md:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
