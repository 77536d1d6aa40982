"""Memory of compare's decoding: the four clip readers of a compare (both clips of the pair being
measured, both of the next pair decoding ahead) with a slow consumer, so every ring and queue
fills; peak memory of this process and its decoder processes together (PSS, sampled).

    python benchmarks/bench_decode_memory.py                      # 1920x1080, processes and threads
    python benchmarks/bench_decode_memory.py --size 1280x720 --chunk 16

Decoder memory does not depend on the device that measures, so this runs on any machine; the
chunk is what ``evalkit.metrics.stream.auto_chunk`` picks on a GPU without temporal metrics (7 at 1080p,
16 at 720p). Rows: worker processes (``evalkit.procdecode``) and threads (``Prefetch``), with
the depth ``compare`` uses now and the 32 frames ahead it used before (``--ahead-frames``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_clip(path: Path, width: int, height: int, frames: int) -> None:
    """A UT Video clip of moving gradients plus noise (every frame differs)."""
    import numpy as np

    from evalkit.video import write_lossless

    rng = np.random.default_rng(8)
    y, x = np.mgrid[0:height, 0:width]

    def gen():
        for t in range(frames):
            base = np.stack([(x + 7 * t) % 256, (y + 3 * t) % 256, (x + y + t) % 256], -1)
            yield np.clip(base + rng.integers(-3, 4, base.shape), 0, 255).astype(np.uint8)

    write_lossless(path, gen(), 24, codec="utvideo")


def measure(paths, chunk: int, mode: str, ahead_frames: int | None, threads: int) -> dict:
    from bench_scale import PssSampler

    from evalkit.compare.clips import prefetch_depth
    from evalkit.procdecode import DecoderPool, prefetch_chunks

    h, w = _size(paths[0])
    depth = (
        prefetch_depth(chunk, ahead_frames) if ahead_frames else prefetch_depth(chunk, frame_bytes=h * w * 3)
    )
    pool = DecoderPool(threads) if mode == "processes" else None
    if pool is not None:
        pool.start(4)
    sampler = PssSampler(0.1)
    t = time.perf_counter()
    try:
        readers = [prefetch_chunks(p, chunk, depth, threads=threads, pool=pool) for p in paths]
        now = readers[:2]  # readers[2:]: the next pair, decoding ahead
        n = 0
        for ca, cb in zip(*now):
            n += len(ca)
            time.sleep(0.02 * chunk)  # a slow consumer: rings and queues fill
        for r in readers:
            r.close()
    finally:
        if pool is not None:
            pool.close()
        sampler.stop()
    return {
        "frames": n,
        "depth": depth,
        "peak_pss_gb": round(sampler.peak / 2**30, 2),
        "seconds": round(time.perf_counter() - t, 1),
    }


def _size(path):
    from evalkit.video import ClipReader

    info = ClipReader(path).info
    return info.height, info.width


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1920x1080")
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--chunk", type=int, default=7)
    p.add_argument("--threads", type=int, default=8, help="decoding threads per reader")
    a = p.parse_args()
    width, height = map(int, a.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        t = time.perf_counter()
        for k in range(4):
            path = Path(tmp) / f"c{k}.nut"
            make_clip(path, width, height, a.frames)
            paths.append(path)
        print(
            f"4 clips of {a.frames} frames at {a.size} made in {time.perf_counter() - t:.1f} s; "
            f"chunk {a.chunk}, {a.threads} decoding threads per reader, {os.cpu_count()} CPUs",
            flush=True,
        )
        import subprocess

        for mode in ("processes", "threads"):
            for ahead in (32, None):
                # each row in a fresh process: peak memory is per process
                code = (
                    f"import sys, json; sys.path[:0] = {[str(ROOT), str(ROOT / 'benchmarks')]!r}; "
                    "from bench_decode_memory import measure; "
                    f"print(json.dumps(measure({[str(x) for x in paths]!r}, {a.chunk}, "
                    f"{mode!r}, {ahead!r}, {a.threads})))"
                )
                out = (
                    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                    .stdout.strip()
                    .splitlines()[-1]
                )
                import json

                r = json.loads(out)
                label = "32 frames ahead (before)" if ahead else "compare's depth now"
                print(
                    f"  {mode:<9} {label:<26} depth {r['depth']:>2} chunks: peak PSS, all "
                    f"processes {r['peak_pss_gb']:.2f} GB ({r['frames']} frames in {r['seconds']} s)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
