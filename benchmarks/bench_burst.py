"""Bursts of a quiet render (``EVALKIT_RENDER_WRITES=batch``/``auto``) by FFmpeg programs, with
each program's codec threads set, side by side: what ``-threads`` a burst's programs should get.

A burst does one of two things on the cores at once: decodes the next window's sources (each by
``ffwrite.read_exact``), or writes the window's results (each job's lossless clip and browser
copy, by ``ffwrite.write_lossless`` / ``write_browser``), one program per file on
``driver.burst_threads()`` threads. Each setting of ``--threads`` (0: FFmpeg's choice, today's)
runs the same burst, alternating, ``--repeats`` rounds; medians and ratios against threads 0.

    PYTHONPATH=. python benchmarks/bench_burst.py                   # canary suite, 8 jobs
    PYTHONPATH=. python benchmarks/bench_burst.py --threads 0 1 2 4 --repeats 7
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default=str(ROOT / "datasets" / "canary" / "suite.yaml"))
    p.add_argument("--threads", nargs="+", type=int, default=[0, 1, 2, 4])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()

    from evalkit.formats.suite import load_suite
    from evalkit.render import ffwrite
    from evalkit.render.driver import burst_threads

    suite = load_suite(a.suite)
    paths = [c.path for c in suite.clips.values()]
    n = burst_threads()
    print(f"{len(paths)} sources, burst on {n} threads, FFmpeg {ffwrite.ffmpeg_exe()}")
    got = [ffwrite.read_exact(p) for p in paths]
    if any(g is None for g in got):
        print("a source is not exact RGB for FFmpeg programs: nothing to measure")
        return 1
    results = [(np.ascontiguousarray(f[:, ::-1]), fps) for f, fps in got]

    def decode(t: int) -> None:
        with ThreadPoolExecutor(n) as pool:
            for r in [pool.submit(ffwrite.read_exact, p, t) for p in paths]:
                assert r.result() is not None

    def write(t: int, codec: str, tmp: str) -> None:
        ext = ".mkv" if codec == "ffv1" else ".nut"
        with ThreadPoolExecutor(n) as pool:
            fs = [pool.submit(ffwrite.write_lossless, f"{tmp}/c{i}{ext}", f, fps, codec=codec,
                              threads=t) for i, (f, fps) in enumerate(results)]
            fs += [pool.submit(ffwrite.write_browser, f"{tmp}/b{i}.mp4", f, fps, threads=t)
                   for i, (f, fps) in enumerate(results)]
            for f in fs:
                f.result()

    def alone(t: int, tmp: str) -> tuple[float, float, float]:
        f, fps = results[0]
        t0 = time.perf_counter()
        ffwrite.read_exact(paths[0], t)
        t1 = time.perf_counter()
        ffwrite.write_lossless(f"{tmp}/a.nut", f, fps, codec="utvideo", threads=t)
        t2 = time.perf_counter()
        ffwrite.write_browser(f"{tmp}/a.mp4", f, fps, threads=t)
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    parts = ("decode", "write ffv1", "write utvideo", "one decode", "one utvideo", "one browser")
    times = {(t, k): [] for t in a.threads for k in parts}
    with tempfile.TemporaryDirectory() as tmp:
        for t in a.threads:                     # warm-up: the program's pages, the files
            decode(t)
        for r in range(a.repeats):
            for t in a.threads:
                for k, fn in (("decode", lambda: decode(t)),
                              ("write ffv1", lambda: write(t, "ffv1", tmp)),
                              ("write utvideo", lambda: write(t, "utvideo", tmp))):
                    t0 = time.perf_counter()
                    fn()
                    times[(t, k)].append(time.perf_counter() - t0)
                for k, v in zip(parts[3:], alone(t, tmp)):
                    times[(t, k)].append(v)
            print(f"round {r + 1}: " + ", ".join(
                f"t{t} {k} {times[(t, k)][-1]:.3f}" for t in a.threads for k in parts[:3]),
                file=sys.stderr)
    base = a.threads[0]
    print(f"medians of {a.repeats} rounds, seconds (ratio against threads {base}):")
    print("threads | " + " | ".join(parts))
    for t in a.threads:
        cells = []
        for k in parts:
            m = statistics.median(times[(t, k)])
            cells.append(f"{m:.3f} ({m / statistics.median(times[(base, k)]):.2f})")
        print(f"{t} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
