"""Fixed costs of a quiet render's burst on this machine: an FFmpeg program's start (alone and
16 at once), a 1.5 MB file written with and without fsync (alone and 16 at once), the canary's
8 sources decoded at once by programs started directly and through ``ffwrite.read_exact``.
Session 16 on the H200: benchmarks/results/burst_probe_h200_s16.txt.

    PYTHONPATH=. python benchmarks/probe_burst.py
"""
from __future__ import annotations

import glob
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evalkit.render import ffwrite
from evalkit.video import ClipReader

ROOT = Path(__file__).resolve().parents[1]


def med(fn, n: int = 7) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def at_once(cmds) -> None:
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for c in cmds]
    for p in procs:
        p.wait()


def main() -> None:
    ff = ffwrite.ffmpeg_exe()
    clips = sorted(glob.glob(str(ROOT / "datasets" / "canary" / "clips" / "*.mkv")))
    print(f"program start (-version), one: {med(lambda: at_once([[ff, '-version']])):.4f} s")
    print(f"16 program starts at once: {med(lambda: at_once([[ff, '-version']] * 16)):.4f} s")
    data = os.urandom(1_500_000)
    for where in ("/tmp", os.getcwd()):
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            def one(sync: bool, name: str = "x") -> None:
                p = os.path.join(tmp, name)
                with open(p, "wb") as f:
                    f.write(data)
                    if sync:
                        os.fsync(f.fileno())
                os.replace(p, p + ".done")

            def sixteen() -> None:
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(lambda i: one(True, f"f{i}"), range(16)))

            print(f"1.5 MB file in {where}: write {med(lambda: one(False)):.4f} s, write+fsync "
                  f"{med(lambda: one(True)):.4f} s; 16 with fsync at once {med(sixteen):.4f} s")
    for t in ("0", "1", "4"):
        def cmd(c: str) -> list[str]:
            return [ff, "-nostdin", "-loglevel", "error", "-threads", t, "-i", c, "-f",
                    "rawvideo", "-pix_fmt", "rgb24", "-y", "/dev/null"]
        print(f"8 decodes from Popen at once, threads {t}: "
              f"{med(lambda: at_once([cmd(c) for c in clips])):.4f} s; one: "
              f"{med(lambda: at_once([cmd(clips[0])])):.4f} s")

    def via(t: int) -> None:
        with ThreadPoolExecutor(16) as pool:
            assert all(r is not None for r in pool.map(lambda c: ffwrite.read_exact(c, t), clips))
    for t in (0, 4):
        print(f"8 decodes by read_exact on 16 threads, threads {t}: {med(lambda: via(t)):.4f} s")
    print(f"ClipReader(path).info: {med(lambda: ClipReader(clips[0]).info):.4f} s")


if __name__ == "__main__":
    main()
