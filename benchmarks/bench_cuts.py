"""Renders cut without re-encoding, read by evalkit against what a player shows.

Each source codec of ``tests/cuts.py`` (H.264 closed and open GOP, HEVC, MPEG-4 Part 2, VP9,
MJPEG, AV1, ProRes; 72 numbered frames, GOPs of 12) is cut by imageio-ffmpeg's ffmpeg with
``-c copy``: input seeking ``-ss`` at several points (on, between and just before key frames),
``-t``, both, into MP4/MOV (an edit list) and Matroska, and trimmed at a packet with
``-copyinkf`` (a clip that starts off a key frame). What a player shows is ffmpeg's decode
(``-fps_mode passthrough``). Each code tree (``--tree NAME=PATH``, a fresh process each) reads
every file: ``count_packets``, the declared count (``info.frames``), and ``read`` (the frames'
SHA-256 against the player's; 10-bit ProRes is compared by count, our rounding to 8 bits differs
from ffmpeg's truncation). Then the cost on a 720p H.264 clip (480 frames, B-frames, GOP 48),
whole and cut: ``info`` and ``count_packets``, best of 5.

    python benchmarks/bench_cuts.py --work /tmp/cuts --tree before=/tmp/before --tree after=. \\
        --out benchmarks/results/cuts_cpu2.txt
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import cuts  # noqa: E402  (tests/cuts.py: the cuts and the player)

SOURCES = {
    **cuts.SOURCES,
    "x265b": ("mp4", "libx265", {"x265-params": "log-level=none:keyint=12:bframes=4:b-pyramid=1"}, "yuv420p"),
    "av1": ("mp4", "libsvtav1", {"g": "12"}, "yuv420p"),
    "prores": ("mov", "prores_ks", {}, "yuv422p10le"),
}
STARTS = [None, 0.3, 0.5, 1.0, 1.3, 1.45, 2.1]
LENGTHS = [None, 0.6]

CHILD = r"""
import hashlib, json, sys, time
from evalkit import video
from evalkit.errors import VideoError
out = {}
for path in sys.argv[1:]:
    r = {}
    for how in ("count_packets", "info", "read"):
        try:
            if how == "info":
                r[how] = video.ClipReader(path).info.frames
            elif how == "read":
                frames = video.ClipReader(path).read()
                r[how] = [len(frames), hashlib.sha256(frames.tobytes()).hexdigest()]
            else:
                r[how] = video.ClipReader(path).count_packets()
        except VideoError as e:
            r[how] = "error: " + str(e).split(": ", 1)[1]
    out[path] = r
print(json.dumps(out))
"""

TIMING = r"""
import json, sys, time
from evalkit import video
out = {}
for path in sys.argv[1:]:
    for how in ("info", "count_packets"):
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            r = video.ClipReader(path)
            r.info if how == "info" else r.count_packets()
            best = min(best, time.perf_counter() - t)
        out[f"{path}:{how}"] = round(best * 1e3, 1)
print(json.dumps(out))
"""


def make_cuts(work: Path) -> dict[Path, tuple[str, str]]:
    """Every cut: ``{file: (source name, cut)}``."""
    global SOURCES
    cuts.SOURCES = SOURCES  # cuts.encode reads its table
    files = {}
    for name in SOURCES:
        if not cuts.available(name):
            print(f"{name}: no {SOURCES[name][1]} encoder in this PyAV, left out", file=sys.stderr)
            continue
        fmt = SOURCES[name][0]
        src = cuts.encode(work / f"src_{name}.{fmt}", name)
        for ext in (fmt if fmt == "mp4" else "mov", "mkv"):
            for ss in STARTS:
                for t in LENGTHS:
                    if ss is None and t is None:
                        continue
                    out = work / f"{name}_ss{ss}_t{t}.{ext}"
                    cuts.cut(src, out, ss, t)
                    files[out] = (name, f"{ext} -ss {ss} -t {t}")
            out = work / f"{name}_trim1.3.{ext}"
            cuts.trim(src, out, 1.3)
            files[out] = (name, f"{ext} trim 1.3 -copyinkf")
    return files


def player(path: Path, name: str) -> list:
    frames = cuts.player_frames(path)
    digest = hashlib.sha256(frames.tobytes()).hexdigest() if name != "prores" else None
    return [len(frames), digest]


def run_tree(tree: Path, script: str, paths: list[Path]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "GRADIO_ANALYTICS_ENABLED": "False"}
    cp = subprocess.run(
        [sys.executable, "-c", script, *map(str, paths)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(cp.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of an evalkit checkout")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    trees = dict(t.split("=", 1) for t in a.tree)
    files = make_cuts(a.work)
    shown = {p: player(p, name) for p, (name, _) in files.items()}
    lines = [
        f"{len(files)} files cut from {len({n for n, _ in files.values()})} sources; player = ffmpeg decode"
    ]
    for tname, tree in trees.items():
        got = run_tree(Path(tree).resolve(), CHILD, list(files))
        per = collections.defaultdict(collections.Counter)
        bad = []
        for p, (name, how) in files.items():
            r, (n, digest) = got[str(p)], shown[p]
            c = per[name]
            c["files"] += 1
            read = r["read"]
            if isinstance(read, str):
                c["read refused"] += 1
                bad.append(f"  {p.name}: read {read} (player {n} frames)")
            elif read[0] != n or (digest and read[1] != digest):
                c["read differs"] += 1
                bad.append(f"  {p.name}: read {read[0]} frames, player {n} (or other frames)")
            if r["count_packets"] != n:
                c["count wrong" if isinstance(r["count_packets"], int) else "count refused"] += 1
                bad.append(f"  {p.name}: count_packets {r['count_packets']} (player {n})")
            if r["info"] not in (None, n):
                c["declared wrong"] += 1
            c["declared"] += r["info"] is not None
        lines.append(f"\n== tree {tname} ({tree})")
        keys = [
            "files",
            "read refused",
            "read differs",
            "count wrong",
            "count refused",
            "declared wrong",
            "declared",
        ]
        lines.append(f"{'source':10s} " + " ".join(f"{k:>14s}" for k in keys))
        total = collections.Counter()
        for name, c in per.items():
            total.update(c)
            lines.append(f"{name:10s} " + " ".join(f"{c[k]:14d}" for k in keys))
        lines.append(f"{'all':10s} " + " ".join(f"{total[k]:14d}" for k in keys))
        lines += bad[:12] + ([f"  ... {len(bad) - 12} more"] if len(bad) > 12 else [])
    big = cuts_720p(a.work)
    lines.append("\n== cost on a 720p H.264 clip, 480 frames (ms, best of 5)")
    for tname, tree in trees.items():
        t = run_tree(Path(tree).resolve(), TIMING, big)
        lines.append(f"{tname:8s} " + "  ".join(f"{Path(k).name}={v}" for k, v in t.items()))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(a.out)
    return 0


def cuts_720p(work: Path) -> list[Path]:
    import av
    import numpy as np

    src = work / "720p.mp4"
    if not src.exists():
        rng = np.random.default_rng(0)
        base = rng.integers(0, 256, (90, 160, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
        with av.open(str(src), "w") as c:
            s = c.add_stream("libx264", rate=24)
            s.width, s.height, s.pix_fmt = 1280, 720, "yuv420p"
            s.options = {"preset": "ultrafast", "bf": "3", "g": "48"}
            for i in range(480):
                for p in s.encode(av.VideoFrame.from_ndarray(np.roll(base, 4 * i, axis=1), format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
    return [src, cuts.cut(src, work / "720p_cut1.3.mp4", 1.3)]


if __name__ == "__main__":
    sys.exit(main())
