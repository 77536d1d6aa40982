#!/usr/bin/env python
"""Generate the real-scale suites on demand: ``scale720`` (1280x720) and ``scale1080``
(1920x1080), 8 clips of 240 frames (10 s at 24 fps) each. Not committed (1.5 to 3.5 GB of
lossless clips): the suite and gate files are, the clips are made here into
``datasets/<suite>/clips/`` (git-ignored) or under ``--out``.

The clips are those of the canary suite (:mod:`make_clips`: the same eight photographs, camera
moves, hand-held shake and moving cut-out, same seeds) filmed by a 16:9 camera: the frame covers
the same width of the print, the move takes 10 s instead of 1, and each frame integrates 3
sub-frame renders across the 180-degree shutter (5 for the canary: a tenth of the motion per
frame needs less). Rendering is split into parts of :data:`PART` frames computed in worker
processes (the pixels do not depend on the split); each clip is written (FFV1, lossless) by its
own thread while its parts arrive.

Usage::

    python datasets/make_scale.py                     # scale720 into datasets/scale720/clips/
    python datasets/make_scale.py --suite scale1080 --workers 16
    python datasets/make_scale.py --out /tmp/s --frames 48 --clips astronaut_pan coffee_zoom
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import make_clips  # noqa: E402  (also puts the repository on the path)

from evalkit.video import write_lossless  # noqa: E402

#: frames per task of the worker processes
PART = 24


@dataclass(frozen=True)
class ScaleSpec:
    width: int
    height: int
    frames: int
    fps: int
    subframes: int = 3


SUITES = {
    "scale720": ScaleSpec(1280, 720, 240, 24),
    "scale1080": ScaleSpec(1920, 1080, 240, 24),
}
#: the clips of both suites (the canary's shots)
CLIPS = tuple(make_clips.SHOTS)


def _part(clip_id: str, spec: ScaleSpec, first: int, count: int):
    import cv2

    cv2.setNumThreads(1)
    stats: dict = {}
    frames = make_clips.render_clip(
        clip_id,
        spec.width,
        spec.frames,
        spec.fps,
        stats,
        height=spec.height,
        subframes=spec.subframes,
        first=first,
        count=count,
    )
    return frames, stats["border_frac"]


def clip_frames(pool: ProcessPoolExecutor, clip_id: str, spec: ScaleSpec, border: list | None = None):
    """The frames of one clip in order, rendered part by part in ``pool`` (all parts are
    submitted at once; frames are yielded as their part arrives)."""
    futures = [
        pool.submit(_part, clip_id, spec, first, min(PART, spec.frames - first))
        for first in range(0, spec.frames, PART)
    ]
    for f in futures:
        frames, frac = f.result()
        if border is not None:
            border.append(frac)
        yield from frames


def generate(
    suite: str,
    root: Path | None = None,
    *,
    workers: int | None = None,
    frames: int | None = None,
    clips=None,
    verbose: bool = False,
) -> list[Path]:
    """Render the clips of ``suite`` into ``root/<suite>/clips/<id>.mkv`` (default root:
    ``datasets/``). ``frames``: fewer frames (a shorter clip, the same move sped up)."""
    spec = SUITES[suite]
    if frames:
        spec = ScaleSpec(spec.width, spec.height, int(frames), spec.fps, spec.subframes)
    clips = list(clips or CLIPS)
    unknown = [c for c in clips if c not in CLIPS]
    if unknown:
        raise SystemExit(f"--clips: unknown clip ids {unknown} (expected some of {list(CLIPS)})")
    folder = Path(root or HERE) / suite / "clips"
    workers = workers or os.cpu_count() or 1
    paths = [folder / f"{c}.mkv" for c in clips]
    errors: list[BaseException] = []
    t0 = time.perf_counter()
    # spawn, not fork: a forked child of a process with threads (a test runner, torch's or
    # Playwright's) can inherit a held lock and hang before it runs a part
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(int).result()  # workers start now, before the writer threads exist

        def write(cid: str, path: Path) -> None:
            border: list = []
            try:
                n = write_lossless(path, clip_frames(pool, cid, spec, border), spec.fps)
            except BaseException as e:  # raised below, in the calling thread
                errors.append(e)
                return
            if verbose:
                frac = max(border)
                warn = "  WARNING: frame border shows" if frac > 0.002 else ""
                print(
                    f"{suite}/{cid}: {n}x{spec.width}x{spec.height} @ {spec.fps} fps, "
                    f"{path.stat().st_size / 1e6:.0f} MB, border {frac:.2%}, "
                    f"{time.perf_counter() - t0:.0f} s{warn}",
                    flush=True,
                )

        threads = [threading.Thread(target=write, args=(c, p)) for c, p in zip(clips, paths)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default="scale720")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="root folder: clips go to OUT/<suite>/clips/ (default: datasets/)",
    )
    ap.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    ap.add_argument(
        "--frames", type=int, default=None, help="frames per clip (default 240; fewer for a quick try)"
    )
    ap.add_argument("--clips", nargs="+", default=None, metavar="ID", help="only these clips")
    args = ap.parse_args(argv)
    generate(args.suite, args.out, workers=args.workers, frames=args.frames, clips=args.clips, verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
