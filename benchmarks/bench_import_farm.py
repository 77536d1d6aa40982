"""``evalkit import`` of a render farm's files (issue 48 item 2): 8 clips x 240 frames at 720p
(the scale720 suite's first clips made by datasets/make_scale.py), each "render" an H.264 MP4
of its clip (x264, as a farm delivers them) or a copy of the FFV1 clip (``--renders ffv1``); the
suite's sources are those H.264 files (``--sources h264``, the default: footage as users have
it) or make_scale's FFV1 clips.

Each import runs in a fresh process per code tree (``--tree NAME=PATH``, alternated within each
repeat), into a new run folder; the child counts the frames decoded per file (every pass of
:class:`evalkit.video.ClipReader` over a video), split into the suite's sources and the
imported renders, and times ``import_files`` as a whole.

    python benchmarks/bench_import_farm.py --work /tmp/farm --tree before=/tmp/before \\
        --tree after=. --repeats 2 --out benchmarks/results/import_farm_cpu2.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from collections import Counter
from pathlib import Path
from evalkit import video
decoded = Counter()
orig = video.ClipReader._decode_video
def counted(self):
    for f in orig(self):
        decoded[str(Path(self.path).resolve())] += 1
        yield f
video.ClipReader._decode_video = counted
from evalkit.render.importing import import_files
suite, folder, out, lossless = sys.argv[1:5]
t = time.perf_counter()
import_files(suite, folder, out, label="farm", lossless=lossless, progress=False)
wall = time.perf_counter() - t
src = sum(n for p, n in decoded.items() if "/clips/" in p)
ren = sum(n for p, n in decoded.items() if "/clips/" not in p)
print(json.dumps({"import_s": round(wall, 2), "source_frames_decoded": src,
                  "render_frames_decoded": ren, "files": len(decoded)}))
"""


def make_farm(work: Path, clips: int, frames: int, renders: str, sources: str = "ffv1") -> tuple[Path, Path]:
    """The suite (its first ``clips`` clips; ``sources="h264"``: the same suite whose sources
    are H.264 MP4s) and a folder of one render per job."""
    import yaml

    sys.path.insert(0, str(ROOT / "datasets"))
    import make_scale

    from evalkit.video import ClipReader, write_browser

    suite_dir = work / "scale720"
    doc = yaml.safe_load((ROOT / "datasets" / "scale720" / "suite.yaml").read_text())
    ids = [c["id"] for c in doc["clips"]][:clips]
    doc["clips"] = [c for c in doc["clips"] if c["id"] in ids]
    doc["jobs"] = [j for j in doc["jobs"] if j["clip"] in ids]
    suite_dir.mkdir(parents=True, exist_ok=True)
    (suite_dir / "suite.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if not all((suite_dir / "clips" / f"{c}.mkv").is_file() for c in ids):
        t = time.perf_counter()
        make_scale.generate("scale720", work, workers=os.cpu_count(), frames=frames, clips=ids)
        print(f"sources made in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    from evalkit.formats.suite import load_suite

    suite = load_suite(suite_dir / "suite.yaml")
    folder = work / "renders" / f"{renders}-{clips}x{frames}"
    if not folder.is_dir():
        tmp = folder.with_name(folder.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t = time.perf_counter()
        for job in suite.jobs:
            src = suite.clips[job.clip].path
            if renders == "ffv1":
                shutil.copyfile(src, tmp / f"{job.id}.mkv")
            else:
                r = ClipReader(src)
                write_browser(tmp / f"{job.id}.mp4", iter(r), r.info.fps)
        tmp.rename(folder)
        print(f"renders ({renders}) made in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    if sources == "h264":
        # the same suite with H.264 sources (each job's H.264 file, hard-linked): the sources a
        # user's own footage often is, which an import only counts
        h_dir = work / "scale720-h264"
        (h_dir / "clips").mkdir(parents=True, exist_ok=True)
        for c in doc["clips"]:
            c["path"] = f"clips/{c['id']}.mp4"
        (h_dir / "suite.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        h264 = make_farm(work, clips, frames, "h264", "ffv1")[1]
        for job in suite.jobs:
            dst = h_dir / "clips" / f"{job.clip}.mp4"
            if not dst.exists():
                os.link(h264 / f"{job.id}.mp4", dst)
        return h_dir / "suite.yaml", folder
    return suite_dir / "suite.yaml", folder


def count_only(suite: Path, a) -> int:
    from evalkit.formats.suite import load_suite
    from evalkit.video import ClipReader

    lines = [f"# {' '.join(sys.argv)}", f"# load average at start {os.getloadavg()[0]:.2f}"]
    for clip in load_suite(suite).clips.values():
        t = {"decoded": [], "packets": []}
        for _ in range(a.repeats):
            for how in ("decoded", "packets"):
                r = ClipReader(clip.path)
                s = time.perf_counter()
                n = r.count_frames() if how == "decoded" else r.count_packets()
                t[how].append(time.perf_counter() - s)
        md, mp = statistics.median(t["decoded"]), statistics.median(t["packets"])
        lines.append(
            f"{clip.id} ({clip.path.suffix}, {n} frames): decoded {md:.2f} s, packets "
            f"{mp:.3f} s ({md / mp:.0f}x)"
        )
        print(lines[-1], flush=True)
    lines.append(f"# load average at end {os.getloadavg()[0]:.2f}")
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="farm and runs (kept for reruns)")
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument("--frames", type=int, default=240)
    ap.add_argument("--renders", choices=("h264", "ffv1"), default="h264")
    ap.add_argument(
        "--sources",
        choices=("ffv1", "h264"),
        default="h264",
        help="the suite's source clips: FFV1 (make_scale's) or H.264 MP4s",
    )
    ap.add_argument("--lossless", choices=("ffv1", "utvideo"), default="utvideo")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--count",
        action="store_true",
        help="only time counting each source's frames: by decoding (before) and "
        "by packets (ClipReader.count_packets), alternated, this tree",
    )
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    suite, folder = make_farm(a.work, a.clips, a.frames, a.renders, a.sources)
    if a.count:
        return count_only(suite, a)
    trees = [(n, Path(p).resolve()) for n, p in (t.split("=", 1) for t in a.tree)]
    lines = [
        f"# {' '.join(sys.argv)}",
        f"# {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}; "
        f"{a.clips} clips x {a.frames} frames 1280x720, sources {a.sources}, renders "
        f"{a.renders}, run clips "
        f"{a.lossless}; one fresh process per import",
    ]
    res: dict = {n: [] for n, _ in trees}
    for rep in range(a.repeats):
        for name, tree in trees if rep % 2 == 0 else trees[::-1]:
            out = a.work / "runs" / f"{name}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            env = {**os.environ, "PYTHONPATH": str(tree), "GRADIO_ANALYTICS_ENABLED": "False"}
            s = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-c", CHILD, str(suite), str(folder), str(out), a.lossless],
                env=env,
                cwd=a.work,
                capture_output=True,
                text=True,
                timeout=3600,
            )  # cwd: not a checkout (`-c` puts it first on sys.path)
            whole = time.perf_counter() - s
            if p.returncode != 0:
                raise SystemExit(f"{name}: import failed:\n{p.stderr[-3000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["process_s"] = round(whole, 2)
            res[name].append(r)
            line = f"repeat {rep + 1} {name}: " + ", ".join(f"{k} {v}" for k, v in r.items())
            print(line, flush=True)
            lines.append(line)
            shutil.rmtree(out, ignore_errors=True)
    lines.append(f"# load average at end {os.getloadavg()[0]:.2f}")
    med = {n: statistics.median(r["process_s"] for r in rs) for n, rs in res.items()}
    names = list(med)
    lines.append("median whole process: " + ", ".join(f"{n} {med[n]:.1f} s" for n in names))
    if len(names) == 2:
        lines.append(f"ratio {names[1]} / {names[0]}: {med[names[1]] / med[names[0]]:.2f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
