"""Does writing a render's files slow the thread that feeds the device? Writers on threads
against writers in worker processes, side by side in one run.

A foreground thread launches small torch ops on ``--device`` (a diffusers pipeline's thread
does little else: each op is a kernel launch; on ``cpu`` the ops themselves run there), and
optionally a pure-Python loop, while the render's own writers (``evalkit.render``'s: the
lossless clip by :class:`evalkit.render.clipwriter.ClipWriter`, in ``--parts`` at once, and the
H.264 browser copy by :func:`evalkit.video.write_browser`) write canary-sized jobs back to
back, ``WRITE_AHEAD`` jobs in flight as in a render:

- ``threads``: on encoder threads of this process (a CPU render's writers);
- ``processes``: in :class:`evalkit.render.procwrite.WriterPool` workers, the frames copied
  into shared memory on an encoder thread (a device render's writers);
- ``decoding`` (unless ``--no-decode``): no writers, but a thread decoding a canary source
  clip again and again as the render's source prefetch does (``driver.SourceCache``, a
  :class:`evalkit.video.ClipReader` on a thread of the rendering process): does decoding hold
  the GIL too?

Rounds alternate idle / threads / processes so that machine noise hits all alike; printed per
round: the foreground's rate, the writers' jobs/s; at the end, medians and the ratios against
idle. Session 9's first measurement (H200, a hand-made script, PyAV 18.1): CUDA launches at
0.50x idle beside writer threads, 1.17x beside another process's writers.

    python benchmarks/bench_writer_gil.py --device cuda              # the H200
    python benchmarks/bench_writer_gil.py --device cpu --seconds 3   # the 2-core CPU
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def job_frames(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """A canary-like job: a textured frame panning (the encoders' work depends on content)."""
    r = np.random.default_rng(seed)
    base = r.integers(0, 256, (h, w, 3), np.uint8)
    base = ((base.astype(np.uint16) + np.roll(base, 1, 0) + np.roll(base, 1, 1)) // 3)
    return np.stack([np.roll(base.astype(np.uint8), 3 * i, axis=1) for i in range(n)])


class Writers:
    """The render's writers, writing the same job again and again until :meth:`stop`."""

    def __init__(self, mode: str, frames: np.ndarray, folder: Path, codec: str, parts: int):
        from evalkit.lossless import lossless_format
        from evalkit.render.clipwriter import ClipWriter
        from evalkit.render.driver import WRITE_AHEAD, encoder_threads
        from evalkit.render.procwrite import WriterPool

        self.mode, self.frames, self.folder, self.codec = mode, frames, folder, codec
        self.ext = lossless_format(codec).ext
        self.ahead = WRITE_AHEAD
        self.encoders = ThreadPoolExecutor(encoder_threads(), thread_name_prefix="bench-encode")
        self.clips = ClipWriter(parts, WRITE_AHEAD)
        self.procs = None
        if mode == "processes":
            self.procs = WriterPool(parts, wait=True)
            self.procs.start(2 * WRITE_AHEAD)
            self._one(0)                    # booted and warm before the clock starts
        self.jobs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-writers")

    def _submit(self, i: int) -> list:
        from evalkit.video import write_browser

        clip = self.folder / f"{self.mode}{i % 4}{self.ext}"
        preview = self.folder / f"{self.mode}{i % 4}.mp4"
        if self.procs is not None:
            return self.procs.submit(self.encoders, clip, preview, self.frames, 24, self.codec)
        return [self.encoders.submit(self.clips.write, clip, self.frames, 24, self.codec),
                self.encoders.submit(write_browser, preview, self.frames, 24)]

    def _one(self, i: int) -> None:
        for f in self._submit(i):
            f.result()

    def _loop(self) -> None:
        pending, i = [], 0
        while not self._stop.is_set():
            while len(pending) >= self.ahead:
                for f in pending.pop(0):
                    f.result()
                self.jobs += 1
            pending.append(self._submit(i))
            i += 1
        for files in pending:
            for f in files:
                f.result()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.encoders.shutdown(wait=True)
        self.clips.close()
        if self.procs is not None:
            self.procs.close()


class Decoding:
    """A thread decoding ``path`` again and again, as the render's source prefetch does."""

    def __init__(self, path: Path):
        self.path, self.jobs = path, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-decode")

    def _loop(self) -> None:
        from evalkit.video import ClipReader

        while not self._stop.is_set():
            ClipReader(self.path).read()
            self.jobs += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def launches(x, seconds: float, cuda: bool) -> float:
    """Small torch ops launched back to back for ``seconds``: ops per second."""
    import torch

    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            x.add_(1.0)
            x.mul_(0.5)
        if cuda:
            torch.cuda.synchronize()
        n += 200
    return n / seconds


def python_loop(seconds: float) -> float:
    """Pure-Python work (the GIL held throughout): additions per second."""
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        s = 0
        for i in range(1000):
            s += i
        n += 1000
    return n / seconds


def main() -> int:
    from evalkit.render.driver import clip_parts

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="the backend spec the foreground's ops run "
                   "on (cpu, cuda, ...)")
    p.add_argument("--seconds", type=float, default=4.0, help="each measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--frames", type=int, default=24, help="frames a job (canary: 24)")
    p.add_argument("--size", default="256x256", help="WxH (canary: 256x256)")
    p.add_argument("--codec", default="ffv1", help="the lossless format (ffv1, utvideo)")
    p.add_argument("--parts", type=int, default=None,
                   help="parts a clip is encoded in at once (default: a render's, clip_parts())")
    p.add_argument("--no-python", action="store_true", help="skip the pure-Python foreground")
    p.add_argument("--no-decode", action="store_true",
                   help="skip the source-decoding thread condition")
    p.add_argument("--source", default=str(Path(__file__).resolve().parents[1] / "datasets"
                                           / "canary" / "clips" / "astronaut_pan.mkv"),
                   help="the clip the decoding condition decodes (default: a canary source)")
    a = p.parse_args()

    import torch

    from evalkit.render.backend import apply_backend, parse_spec

    w, h = (int(v) for v in a.size.lower().split("x"))
    frames = job_frames(a.frames, h, w)
    parts = a.parts or clip_parts()
    spec = parse_spec(a.device)
    with apply_backend(spec) as runtime, tempfile.TemporaryDirectory() as tmp:
        cuda = runtime.device.type == "cuda"
        x = torch.zeros(4096, device=runtime.device)
        launches(x, 1.0, cuda)                              # warm-up
        grounds = {"torch ops": lambda: launches(x, a.seconds, cuda)}
        if not a.no_python:
            grounds["pure Python"] = lambda: python_loop(a.seconds)
        print(f"device {spec.spec}, job {a.frames} frames {w}x{h}, {a.codec} in {parts} part(s) "
              f"+ H.264 preview, {a.seconds} s a measurement, {a.rounds} rounds", flush=True)
        rates: dict = {}
        modes = ("idle", "threads", "processes") + (() if a.no_decode else ("decoding",))
        for r in range(a.rounds):
            for name, fg in grounds.items():
                for mode in modes:
                    writers = None
                    if mode == "decoding":
                        writers = Decoding(Path(a.source))
                        writers.start()
                        time.sleep(0.5)
                    elif mode != "idle":
                        writers = Writers(mode, frames, Path(tmp), a.codec, parts)
                        writers.start()
                        time.sleep(0.5)                     # writers in their stride
                    jobs0 = writers.jobs if writers else 0
                    t0 = time.perf_counter()
                    rate = fg()
                    dt = time.perf_counter() - t0
                    jps = (writers.jobs - jobs0) / dt if writers else 0.0
                    if writers:
                        writers.stop()
                    rates.setdefault((name, mode), []).append((rate, jps))
                    what = "clips/s" if mode == "decoding" else "jobs/s"
                    print(f"round {r + 1}: {name:11s} writers {mode:9s}: {rate:14,.0f}/s"
                          + (f"  ({mode} {jps:5.1f} {what})" if writers else ""), flush=True)
        print("medians, against idle:")
        for name in grounds:
            idle = statistics.median(v[0] for v in rates[(name, "idle")])
            for mode in modes:
                med = statistics.median(v[0] for v in rates[(name, mode)])
                jps = statistics.median(v[1] for v in rates[(name, mode)])
                what = "source decoded" if mode == "decoding" else "writers"
                unit = "clips/s" if mode == "decoding" else "jobs/s"
                extra = f", {what} {jps:.1f} {unit}" if mode != "idle" else ""
                print(f"  {name:11s} writers {mode:9s}: {med:14,.0f}/s = {med / idle:.2f}x idle"
                      f"{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
