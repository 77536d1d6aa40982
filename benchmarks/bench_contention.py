"""The canary pipeline's own calls while other processes load the CPU.

    PYTHONPATH=. python benchmarks/bench_contention.py                     # cuda if available
    PYTHONPATH=. python benchmarks/bench_contention.py --backend cpu --repeats 1 --quick \\
        --jobs astronaut_pan --max-frames 4                                # smoke check

Why: inside ``evalkit render`` the canary's pipeline calls take 1.5-1.9 s against 1.0-1.35 s
in a direct loop on one H200 (benchmarks/README.md, "Render overhead"), whether the writers run
on threads or in worker processes. This loads the canary renderer once under
:func:`evalkit.render.backend.apply_backend`, as ``bench_render.py`` does, and times only the
render calls of the suite's jobs (sources decoded beforehand; on CUDA synchronised after each
call), median of ``--repeats`` loops, under each condition in turn:

idle; torch threads 1; N/2 and N processes spinning in a busy loop (N: the CPU cores this
process may use); N at nice 19; N with torch threads 1 in this process; 2 encoder processes
(the first job's frames written by :func:`evalkit.video.write_lossless` and
:func:`evalkit.video.write_browser` in a loop, 4 threads each, as a render's writers do); the
same at nice 19; the same with torch threads 1; idle again (the drift of the machine).
``--quick``: idle, N busy, 2 encoders, idle again.

What it showed (benchmarks/results/render_contention_h200.txt, 16 cores): a launch-bound
pipeline (small kernels, one Python thread launching them) slows with any CPU load on the
machine, niced or not: idle 1.35 s, 8 busy processes 1.88 s, 16 busy 2.20 s (nice 19: 2.06 s),
2 encoder processes 1.91 s (nice 19: 1.64 s), torch threads 1 beside them 1.57 s. The busy
processes share no GIL and no GPU with the pipeline, and at nice 19 they get almost no CPU time
when it wants a core, yet it still slows: what they take from its launching thread is not CPU
time alone (wake-up latency, shared caches and cores' clocks are candidates; not measured apart).

The loading processes are started with ``spawn``, killed and joined when each condition ends
(also on errors, Ctrl-C or SIGTERM); the encoders write into a temporary folder removed at the end.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: threads of each encoder process (a lossless clip and a browser copy at once, twice over)
ENCODER_THREADS = 4


def spin(nice: int) -> None:
    """A busy loop at niceness ``nice`` (a child process's target)."""
    os.nice(nice)
    while True:
        pass


def encode_loop(nice: int, frames, folder: str) -> None:
    """``frames`` written as lossless clips and browser copies in a loop, ENCODER_THREADS at a
    time, at niceness ``nice`` (a child process's target)."""
    from evalkit.video import write_browser, write_lossless

    os.nice(nice)
    d = tempfile.mkdtemp(dir=folder)
    with ThreadPoolExecutor(ENCODER_THREADS) as pool:
        i = 0
        while True:
            fs = [pool.submit(write_lossless, f"{d}/a{i % ENCODER_THREADS}.mkv", frames, 24),
                  pool.submit(write_browser, f"{d}/b{i % ENCODER_THREADS}.mp4", frames, 24)]
            for f in fs:
                f.result()
            i += 1


def conditions(n: int, frames, folder: str, quick: bool = False):
    """(label, [(target, args) of each loading process], torch threads or None) in order."""
    def busy_n(k: int) -> str:
        return f"{k} busy process{'' if k == 1 else 'es'}"

    busy, niced = (spin, (0,)), (spin, (19,))
    enc, enc_niced = (encode_loop, (0, frames, folder)), (encode_loop, (19, frames, folder))
    every = [
        ("idle", [], None),
        ("torch threads 1", [], 1),
        (busy_n(n // 2), [busy] * (n // 2), None),
        (busy_n(n), [busy] * n, None),
        (f"{busy_n(n)} nice 19", [niced] * n, None),
        (f"{busy_n(n)}, torch threads 1", [busy] * n, 1),
        (f"2 encoder processes ({ENCODER_THREADS} threads each)", [enc] * 2, None),
        ("2 encoder processes nice 19", [enc_niced] * 2, None),
        ("2 encoder processes, torch threads 1", [enc] * 2, 1),
        ("idle again", [], None),
    ]
    if quick:
        keep = {"idle", busy_n(n), f"2 encoder processes ({ENCODER_THREADS} threads each)",
                "idle again"}
        every = [c for c in every if c[0] in keep]
    return every


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="backend spec (default: cuda if available, else cpu)")
    p.add_argument("--suite", default=str(ROOT / "datasets" / "canary" / "suite.yaml"))
    p.add_argument("--renderer", default="canary")
    p.add_argument("--jobs", nargs="*", default=None, help="job ids (default: all of the suite)")
    p.add_argument("--max-frames", type=int, default=0, help="cut each source to this many frames")
    p.add_argument("--repeats", type=int, default=3, help="loops of the jobs per condition (median)")
    p.add_argument("--warmup", type=int, default=2, help="loops before the first condition")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between starting the "
                   "loading processes and timing")
    p.add_argument("--quick", action="store_true", help="idle, N busy, 2 encoders, idle again only")
    p.add_argument("--out", type=Path, default=None, help="also write what is printed to this file")
    a = p.parse_args(argv)

    from evalkit.formats.suite import load_suite
    from evalkit.render.backend import apply_backend, parse_spec
    from evalkit.render.driver import SourceCache, select_jobs
    from evalkit.render.renderers import RenderRequest, get_renderer

    out = open(a.out, "w") if a.out else None

    def say(line: str) -> None:
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    suite = load_suite(a.suite)
    jobs = select_jobs(suite, a.jobs)
    spec = parse_spec(a.backend)
    renderer = get_renderer(a.renderer, {})
    with apply_backend(spec) as runtime:
        renderer.load(runtime)
    sources = SourceCache(suite)
    data = {}
    for job in jobs:
        frames, fps, path = sources.get(job.clip)
        data[job.clip] = (frames[:a.max_frames] if a.max_frames else frames, fps, path)
    sources.close()
    on_cuda = runtime.device.type == "cuda"

    def loop() -> float:
        """Seconds in the render calls of one loop over the jobs."""
        t = 0.0
        with apply_backend(spec):
            for job in jobs:
                frames, fps, path = data[job.clip]
                t0 = time.perf_counter()
                renderer.render(RenderRequest(job, frames, fps, job.seed, path))
                if on_cuda:
                    torch.cuda.synchronize()
                t += time.perf_counter() - t0
        return t

    def stop(signum, frame):
        raise SystemExit(128 + signum)             # so the loading processes are killed (finally)

    signal.signal(signal.SIGTERM, stop)
    for _ in range(a.warmup):
        loop()
    n = len(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    say(f"bench_contention | suite {suite.name}, {len(jobs)} jobs, backend {spec.spec}, renderer "
        f"{a.renderer} | cores {n}, torch threads {torch.get_num_threads()} | median of {a.repeats} | "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
        first = data[jobs[0].clip][0]
        for label, procs, threads in conditions(n, first, folder, a.quick):
            ps = [ctx.Process(target=f, args=args, daemon=True) for f, args in procs]
            old = torch.get_num_threads()
            try:
                for proc in ps:
                    proc.start()
                if threads:
                    torch.set_num_threads(threads)
                if ps:
                    time.sleep(a.settle)
                ts = [loop() for _ in range(a.repeats)]
            finally:
                torch.set_num_threads(old)
                for proc in ps:
                    if proc.pid is not None:
                        proc.kill()
                for proc in ps:
                    if proc.pid is not None:
                        proc.join()
            say(f"{label:44s} pipeline {statistics.median(ts):.3f} s  ({', '.join(f'{t:.3f}' for t in ts)})")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
