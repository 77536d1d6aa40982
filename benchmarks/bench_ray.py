"""Per-job overhead of the Ray executor against the local executor, side by side.

Both executors render the same jobs through `render_suite` into fresh folders, alternating
(local, ray, local, ray...) so that machine noise hits both alike. For each run the time of every
result's arrival at the driver is recorded, which splits a run into

- start-up: from the call to the first result (Ray: actor start, imports, renderer load, first
  job; local: renderer load and first job), and
- steady state: (last result - first result) / (jobs - 1), the per-job cost once running,
  including everything the driver does per job (Ray: the round trip, clip and preview bytes
  through the object store, writing them, sha256, manifest).

The Ray side uses one local Ray instance on loopback (started once, not timed in the runs but
reported), one worker with as many CPUs (threads) as the local process uses, so the two sides
have the same parallelism; `--ray-workers 2` shows what a second worker does on this machine.

    python benchmarks/bench_ray.py                       # fake renderer (inverts frames): pure overhead
    python benchmarks/bench_ray.py --workload canary     # the canary suite on the CPU (slow)
    python benchmarks/bench_ray.py --manifest-jobs 10000 # also: cost of one manifest save at 10k jobs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_fake_suite(folder: Path, n_prompts: int, n_seeds: int) -> Path:
    clips = ROOT / "datasets" / "smoke" / "clips"
    p = folder / "suite.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: bench
        clips:
          - {{id: pan, path: {clips / "astronaut_pan.mkv"}}}
          - {{id: obj, path: {clips / "hubble_object.mkv"}}}
        prompts: {json.dumps([f"p{i}" for i in range(n_prompts)])}
        seeds: {json.dumps(list(range(n_seeds)))}
    """)
    )
    return p


class Timed:
    """Wraps an executor: records when each result reaches the driver."""

    def __init__(self, inner):
        self.inner, self.name, self.times = inner, inner.name, []

    def check(self, specs):
        return self.inner.check(specs)

    def fingerprint(self, spec):
        return self.inner.fingerprint(spec)

    def run_all(self, *a):
        for item in self.inner.run_all(*a):
            self.times.append(time.perf_counter())
            yield item


def one_run(suite, backend, renderer, options, executor) -> dict:
    from evalkit.render.driver import render_suite

    timed = Timed(executor)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        [s] = render_suite(
            suite, [backend], tmp, renderer=renderer, options=options, executor=timed, progress=False
        )
        total = time.perf_counter() - t0
    if s.failed:
        raise SystemExit(f"{executor.name}: jobs failed: {s.failures}")
    t = timed.times
    return {"total": total, "startup": t[0] - t0, "per_job": (t[-1] - t[0]) / (len(t) - 1), "jobs": len(t)}


def manifest_save_seconds(n: int) -> float:
    """One atomic manifest save of a run with n jobs (the driver does one per finished job)."""
    from evalkit.formats.run import RunDir
    from evalkit.formats.suite import Job

    class FakeSuite:
        name = "bench"

        def summary(self):
            return {"name": "bench", "jobs": n}

    jobs = [
        Job(
            f"clip{i % 50}-prompt-s{i}-{i:08x}",
            f"clip{i % 50}",
            "a prompt",
            i,
            {"strength": 0.6, "steps": 12},
        )
        for i in range(n)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(
            Path(tmp) / "r",
            suite=FakeSuite(),
            renderer={"name": "x"},
            backend={"spec": "cuda"},
            fingerprint={"host": "h"},
            jobs=jobs,
        )
        for rec in run.jobs:  # done records look like this
            rec.update(
                status="done",
                timing={"seconds": 0.05, "peak_rss_bytes": 1 << 30},
                output={
                    "path": f"clips/{rec['id']}.mkv",
                    "sha256": "0" * 64,
                    "frames": 24,
                    "width": 256,
                    "height": 256,
                    "fps": "24",
                },
                preview=f"preview/{rec['id']}.mp4",
                finished="2026-01-01T00:00:00+00:00",
                node={
                    "id": "f" * 56,
                    "host": "node-17",
                    "ip": "10.0.0.17",
                    "worker_pid": 12345,
                    "gpus": ["3"],
                    "worker": "cuda#3",
                },
                attempts=1,
            )
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            run.save()
            times.append(time.perf_counter() - t0)
        size = (Path(tmp) / "r" / "manifest.json").stat().st_size
    print(
        f"manifest with {n} jobs: {size / 1e6:.1f} MB, one save median "
        f"{statistics.median(times) * 1000:.0f} ms"
    )
    return statistics.median(times)


def driver_write_seconds(n: int) -> float:
    """What the driver does per Ray result, alone: write a canary-size job's encoded clip and
    preview (24 frames, 256x256; encoded once here) into a run folder, sha256, record it (the
    manifest save itself is deferred, see manifest_save_seconds)."""
    import numpy as np

    from evalkit.formats.run import RunDir
    from evalkit.formats.suite import Job
    from evalkit.video import read_frames, write_browser, write_lossless

    frames, fps = read_frames(
        ROOT / "datasets" / "canary" / "clips" / sorted(os.listdir(ROOT / "datasets" / "canary" / "clips"))[0]
    )
    frames = np.ascontiguousarray(255 - frames)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        enc = []
        for _ in range(5):  # what a worker adds per job: encoding both files
            t0 = time.perf_counter()
            write_lossless(tmp / "c.mkv", frames, fps)
            write_browser(tmp / "p.mp4", frames, fps)
            enc.append(time.perf_counter() - t0)
        clip, prev = (tmp / "c.mkv").read_bytes(), (tmp / "p.mp4").read_bytes()
        print(
            f"worker per job: encode lossless clip + preview (24 x 256x256): "
            f"{statistics.median(enc) * 1000:.0f} ms"
        )

        class FakeSuite:
            name = "bench"

            def summary(self):
                return {"name": "bench"}

        jobs = [Job(f"job{i:05d}", "c", "p", i, {}) for i in range(n)]
        run = RunDir.create(
            tmp / "r",
            suite=FakeSuite(),
            renderer={"name": "x"},
            backend={"spec": "cuda"},
            fingerprint={},
            jobs=jobs,
        )
        t0 = time.perf_counter()
        for j in jobs:
            run.record_done_encoded(
                j.id, clip, prev, frames=len(frames), width=256, height=256, fps=fps, save=False
            )
        per = (time.perf_counter() - t0) / n
    print(
        f"driver per result (canary-size clip {len(clip) / 1e6:.2f} MB + preview "
        f"{len(prev) / 1e6:.2f} MB: write, fsync, sha256, record): {per * 1000:.1f} ms"
    )
    return per


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=("fake", "canary"), default="fake")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray-workers", type=int, default=1)
    p.add_argument("--prompts", type=int, default=8, help="fake workload: prompts x 2 seeds x 2 clips")
    p.add_argument("--manifest-jobs", type=int, default=0)
    p.add_argument(
        "--driver-writes",
        type=int,
        default=0,
        help="also: time N driver-side result writes of a canary-size clip",
    )
    a = p.parse_args()

    import torch

    from evalkit.executor.ray import RayExecutor, import_ray
    from evalkit.render.local_executor import LocalExecutor

    threads = torch.get_num_threads()
    tmpdir = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    if a.workload == "fake":
        suite = make_fake_suite(tmpdir, a.prompts, 2)
        renderer, options = "evalkit.testing.renderers:Invert", {}
    else:
        suite = ROOT / "datasets" / "canary" / "suite.yaml"
        renderer, options = "canary", {}

    ray = import_ray(local=True)
    t0 = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=max(threads * a.ray_workers, os.cpu_count() or 1),
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
    )
    ray_init = time.perf_counter() - t0
    ray_ex = RayExecutor(max_workers=a.ray_workers, cpus_per_worker=threads)

    loc, rr = [], []
    for i in range(a.repeats):
        loc.append(one_run(suite, a.backend, renderer, options, LocalExecutor()))
        rr.append(one_run(suite, a.backend, renderer, options, ray_ex))
        print(
            f"repeat {i + 1}: local {loc[-1]['total']:.2f} s (start {loc[-1]['startup']:.2f}, "
            f"{loc[-1]['per_job'] * 1000:.1f} ms/job)  ray {rr[-1]['total']:.2f} s (start "
            f"{rr[-1]['startup']:.2f}, {rr[-1]['per_job'] * 1000:.1f} ms/job)",
            file=sys.stderr,
        )
    ray.shutdown()

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    n = loc[0]["jobs"]
    print(
        f"workload {a.workload}: {n} jobs, backend {a.backend}, {threads} threads per side, "
        f"{a.ray_workers} Ray worker(s), median of {a.repeats}"
    )
    print(f"ray.init (local instance, once)   : {ray_init:.2f} s")
    for key, label in (
        ("startup", "start-up to first result"),
        ("per_job", "steady state per job"),
        ("total", "whole render_suite"),
    ):
        lv, rv = med(loc, key), med(rr, key)
        unit, scale = ("ms", 1000) if key == "per_job" else ("s", 1)
        print(
            f"{label:<33}: local {lv * scale:8.2f} {unit}  ray {rv * scale:8.2f} {unit}  "
            f"ratio {rv / lv:6.2f}x  difference {(rv - lv) * scale:+.2f} {unit}"
        )
    if a.manifest_jobs:
        manifest_save_seconds(a.manifest_jobs)
    if a.driver_writes:
        driver_write_seconds(a.driver_writes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
