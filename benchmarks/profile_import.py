#!/usr/bin/env python
"""Where an import's seconds go (issue 48 item 2): the three parts of adopting one file, each
timed alone on the farm's files, one file and all of them at once (threads):

- ``decode``: the farm file read to RGB frames (:class:`evalkit.video.ClipReader`, as an
  import reads it);
- ``lossless``: those frames written as the run's lossless clip (UT Video, one encoder:
  :func:`evalkit.video.write_lossless`, what :func:`evalkit.render.clipwriter.write_streamed`
  runs);
- ``browser``: the browser copy (:func:`evalkit.video.write_browser`, x264 CRF 12 veryfast).

The frames are decoded once into memory first, so the encoders are timed without decoding.

    python benchmarks/profile_import.py FARM_DIR [--files 8] [--frames 240]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("farm", type=Path)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--frames", type=int, default=240)
    a = ap.parse_args(argv)
    from evalkit.video import ClipReader, usable_cores, write_browser, write_lossless

    files = sorted(p for p in a.farm.iterdir() if p.is_file() or p.is_symlink())[: a.files]
    print(f"{len(files)} files of {a.farm}, {usable_cores()} usable cores", flush=True)

    def decode(p):
        return np.stack([f for _, f in zip(range(a.frames), ClipReader(p))])

    t = time.perf_counter()
    frames = [decode(files[0])]
    one = time.perf_counter() - t
    t = time.perf_counter()
    with ThreadPoolExecutor(len(files)) as pool:
        frames = list(pool.map(decode, files))
    allf = time.perf_counter() - t
    n = sum(len(f) for f in frames)
    fps = ClipReader(files[0]).info.fps
    print(
        f"decode    one file {one:6.2f} s ({len(frames[0]) / one:5.0f} fps)   "
        f"all {len(files)} at once {allf:6.2f} s ({n / allf:5.0f} fps)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, write, ext in (
            ("lossless", lambda p, f: write_lossless(p, f, fps, codec="utvideo"), ".nut"),
            ("browser", lambda p, f: write_browser(p, f, fps), ".mp4"),
        ):
            t = time.perf_counter()
            write(tmp / f"one{ext}", frames[0])
            one = time.perf_counter() - t
            t = time.perf_counter()
            with ThreadPoolExecutor(len(files)) as pool:
                list(pool.map(lambda i: write(tmp / f"{i}{ext}", frames[i]), range(len(files))))
            allf = time.perf_counter() - t
            print(
                f"{name:9s} one file {one:6.2f} s ({len(frames[0]) / one:5.0f} fps)   "
                f"all {len(files)} at once {allf:6.2f} s ({n / allf:5.0f} fps)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
