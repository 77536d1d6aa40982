#!/usr/bin/env python
"""The lossless formats of run clips side by side (``render --lossless``): FFV1 in ``.mkv``
against UT Video in ``.nut``, on the same real-scale frames (``datasets/make_scale.py``, the
canary's shots filmed at 1280x720; made into ``--work`` when missing).

For each format: encoding (:func:`evalkit.video.write_lossless`, frames already in memory:
frames/s and CPU ms per frame, as ``render`` writes a clip), file size, and decoding three ways:
our :class:`evalkit.video.ClipReader` (FFmpeg's own threads, as ``compare`` reads), the same
with one thread, and a plain PyAV decode (``av.open``, ``decode``, ``to_ndarray("rgb24")``,
PyAV's default threading), each checked frame for frame against the frames written. Ratios
UT Video / FFV1 are printed.

    python benchmarks/bench_lossless.py --frames 48 --clips 2 --out benchmarks/results/lossless_cpu2.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "datasets"))


def _clock():
    return time.perf_counter(), time.process_time()


def _since(t) -> tuple[float, float]:
    return time.perf_counter() - t[0], time.process_time() - t[1]


def decode_plain(path: Path):
    """A plain PyAV decode: no thread settings of ours."""
    import av

    with av.open(str(path)) as c:
        for f in c.decode(c.streams.video[0]):
            yield f.to_ndarray(format="rgb24")


def measure(frames, fmt: str, folder: Path, repeats: int) -> dict:
    import numpy as np

    from evalkit.video import ClipReader, lossless_format, write_lossless

    path = folder / f"clip{lossless_format(fmt).ext}"
    n = len(frames)
    best = None
    for _ in range(repeats):
        t = _clock()
        write_lossless(path, frames, 24, codec=fmt)
        w, c = _since(t)
        best = (w, c) if best is None or w < best[0] else best
    out = {
        "codec": fmt,
        "frames": n,
        "width": frames.shape[2],
        "height": frames.shape[1],
        "encode_frames_per_s": round(n / best[0], 1),
        "encode_cpu_ms_per_frame": round(best[1] / n * 1000, 1),
        "bytes": path.stat().st_size,
    }
    ways = {
        "reader": lambda: ClipReader(path),
        "reader_1_thread": lambda: ClipReader(path, threads=1),
        "plain_pyav": lambda: decode_plain(path),
    }
    for name, make in ways.items():
        best = None
        for _ in range(repeats):
            t = _clock()
            got = list(make())
            w, c = _since(t)
            best = (w, c) if best is None or w < best[0] else best
            assert len(got) == n and all(np.array_equal(a, b) for a, b in zip(got, frames)), (
                f"{fmt} {name}: frames read back differ from those written"
            )
        out[f"decode_{name}_frames_per_s"] = round(n / best[0], 1)
        out[f"decode_{name}_cpu_ms_per_frame"] = round(best[1] / n * 1000, 1)
    out["exact"] = True
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=48, help="frames per clip")
    ap.add_argument("--clips", type=int, default=2, help="clips (the canary's shots, in order)")
    ap.add_argument("--suite", default="scale720", choices=["scale720", "scale1080"])
    ap.add_argument("--repeats", type=int, default=2, help="best of this many")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_lossless")
    ap.add_argument("--out", type=Path, default=None, help="JSON results")
    a = ap.parse_args(argv)

    import make_scale

    from evalkit.video import LOSSLESS_FORMATS, ClipReader

    clips = list(make_scale.CLIPS[: a.clips])
    folder = a.work / a.suite / "clips"
    missing = [
        c
        for c in clips
        if not (folder / f"{c}.mkv").is_file()
        or ClipReader(folder / f"{c}.mkv").info.frames_estimate != a.frames
    ]
    if missing:
        make_scale.generate(a.suite, a.work, frames=a.frames, clips=missing)
    print(
        f"{a.suite}: {len(clips)} clips x {a.frames} frames; {os.cpu_count()} CPUs; best of {a.repeats}",
        flush=True,
    )
    results = []
    for cid in clips:
        frames = ClipReader(folder / f"{cid}.mkv").read()
        rows = {}
        with tempfile.TemporaryDirectory(dir=a.work) as tmp:
            for fmt in LOSSLESS_FORMATS:
                r = measure(frames, fmt, Path(tmp), a.repeats)
                r["clip"] = cid
                rows[fmt] = r
                results.append(r)
                print(
                    f"  {cid:<22} {fmt:<8} {r['width']}x{r['height']} | encode "
                    f"{r['encode_frames_per_s']:>6.1f} frames/s ({r['encode_cpu_ms_per_frame']:.0f} "
                    f"ms CPU/frame) | {r['bytes'] / 1e6:6.1f} MB | decode: reader "
                    f"{r['decode_reader_frames_per_s']:>6.1f} frames/s "
                    f"({r['decode_reader_cpu_ms_per_frame']:.1f} ms CPU/frame), 1 thread "
                    f"{r['decode_reader_1_thread_frames_per_s']:>6.1f}, plain PyAV "
                    f"{r['decode_plain_pyav_frames_per_s']:>6.1f} | exact",
                    flush=True,
                )
        f, u = rows["ffv1"], rows["utvideo"]
        print(
            f"    utvideo / ffv1: size {u['bytes'] / f['bytes']:.2f}x, encode "
            f"{u['encode_frames_per_s'] / f['encode_frames_per_s']:.2f}x frames/s, decode "
            f"{u['decode_reader_frames_per_s'] / f['decode_reader_frames_per_s']:.2f}x frames/s "
            f"(CPU per frame {f['decode_reader_cpu_ms_per_frame'] / u['decode_reader_cpu_ms_per_frame']:.2f}x "
            f"less); utvideo reader / plain PyAV: "
            f"{u['decode_reader_frames_per_s'] / u['decode_plain_pyav_frames_per_s']:.2f}x",
            flush=True,
        )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"cpus": os.cpu_count(), "suite": a.suite, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
