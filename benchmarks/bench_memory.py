"""Peak resident memory of whole commands against the clip's length: ``render -r import``,
``metrics A B``, ``compare`` (its report included) and ``study create`` (a preference study of
the report's clip), each run as a process of its own (the
sum of the resident sets of the process and its children, polled by psutil every 20 ms), on
procedural 1280x720 FFV1 clips of two lengths, for this tree and a baseline tree side by side.

    python benchmarks/bench_memory.py                         # 240 and 1440 frames, against main
    python benchmarks/bench_memory.py --frames 120 480 --baseline 35d4eb1
    python benchmarks/bench_memory.py --baseline none         # this tree only

The baseline is checked out with ``git worktree add --detach`` into a temporary folder (removed
at the end) and run from there (``PYTHONPATH`` set to that tree). The clips: a smooth noise
texture (noise at 1/8 resolution, enlarged) panning 3 px a frame, so FFV1 files stay small; run
B is run A with a brightness offset of 2 code values on one colour and a 1 px shift, so every
metric has something to measure. ``metrics`` and ``compare`` run with ``--no-temporal`` only
where asked (``--no-temporal``): the temporal metrics' flow dominates a CPU run's time;
``--cheap`` replaces LPIPS's network by a stand-in and ``--stub-compare`` zeroes SSIM too (for
full-resolution clips of 1,440 frames on a 2-core CPU; see :data:`CHEAP`). The commands run in
order (import a, import b, metrics, compare, study create): ``--only`` picks some, by the
start of their names (``--only "import a"``); compare needs both imports, study create compare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GB = 1024**3


def frames_of(n: int, width: int, height: int, *, variant: int = 0):
    """The procedural clip: frame by frame (never the whole clip in memory)."""
    import numpy as np

    rng = np.random.default_rng(36)
    tex = rng.integers(0, 256, (height // 8 + 2, (width + 3 * n) // 8 + 2, 3), dtype=np.uint8)
    big = np.repeat(np.repeat(tex, 8, axis=0), 8, axis=1)
    for t in range(n):
        f = big[:height, 3 * t : 3 * t + width]
        if variant:
            f = np.roll(f, variant, axis=1).copy()
            f[..., 0] = np.clip(f[..., 0].astype(np.int16) + 2 * variant, 0, 255)
        yield np.ascontiguousarray(f)


def make_set(folder: Path, n: int, width: int, height: int) -> dict:
    """A suite of one clip (``n`` frames) with one job, and the job's render by farms A and B."""
    from evalkit.formats.suite import load_suite
    from evalkit.testing.suites import write_suite
    from evalkit.video import write_lossless

    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "source.mkv"
    if not src.exists():
        write_lossless(src, frames_of(n, width, height), 24)
    suite = write_suite(folder, src, prompts=("memory",), seeds=(0,))
    job = load_suite(suite).jobs[0]
    farms = {}
    for label, variant in (("a", 0), ("b", 1)):
        d = folder / f"farm_{label}"
        d.mkdir(exist_ok=True)
        clip = d / f"{job.id}.mkv"
        if not clip.exists():
            write_lossless(clip, frames_of(n, width, height, variant=variant), 24)
        farms[label] = d
    return {"suite": suite, "farms": farms, "job": job.id}


def peak_rss(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float, int, str]:
    """``(peak RSS of the process tree in bytes, seconds, exit code, stderr tail)``."""
    import psutil

    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]
    err = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    proc = psutil.Process(p.pid)
    while p.poll() is None:
        try:
            total = proc.memory_info().rss
            for c in proc.children(recursive=True):
                try:
                    total += c.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], total)
        except psutil.Error:
            pass
        time.sleep(0.02)
    reader.join()
    tail = (err[0] if err else b"").decode(errors="replace").strip().splitlines()[-3:]
    return peak[0], time.perf_counter() - t0, p.returncode, " | ".join(tail)


#: ``--cheap``: the command run with LPIPS's network replaced by a stand-in (each frame's mean,
#: no trunk), so that full-resolution clips of 1,440 frames are measured on a 2-core CPU in
#: minutes; PSNR, SSIM, exactness (and the temporal metrics' flows, unless --no-temporal) run
#: as ever. A benchmark's variant set in its own process (docs/architecture.md).
CHEAP = """import sys, torch
import evalkit.metrics.stream


class Cheap:
    def fused(self):
        return False

    def features(self, x, normalised=True):
        return [x.float().mean(dim=(1, 2, 3), keepdim=True)]

    def distance(self, fa, fb, normalised=True):
        return (fa[0] - fb[0]).abs().flatten()


evalkit.metrics.stream.get_model = lambda net, device: Cheap()
if STUB:
    evalkit.metrics.stream.ssim_kernel = lambda a, b, **kw: torch.zeros(a.shape[0], device=a.device)
from evalkit.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: ``--stub-compare``: SSIM zeroed as well (:data:`CHEAP`): ``compare`` only makes the report
#: ``study create`` reads (decoding both runs, PSNR and exactness left), its figures of no use
STUB = CHEAP.replace("if STUB:", "if True:")
CHEAP = CHEAP.replace("if STUB:", "if False:")


def commands(
    tree: Path,
    s: dict,
    work: Path,
    no_temporal: bool,
    cheap: bool = False,
    stub: bool = False,
    device: str = "cpu",
) -> list[tuple[str, list[str]]]:
    py = [sys.executable, "-m", "evalkit"]
    metric_py = [sys.executable, "-c", STUB if stub else CHEAP] if cheap or stub else py
    runs = work / "runs"
    # metrics reads the farms' files (FFV1 like the runs' clips): it needs no import first
    clip = lambda label: s["farms"][label] / f"{s['job']}.mkv"  # noqa: E731
    out = [
        (
            f"import {label}",
            py
            + [
                "render",
                str(s["suite"]),
                "-r",
                "import",
                "--renderer-opt",
                f"dir={s['farms'][label]}",
                "--label",
                label,
                "--out",
                str(runs),
                "--quiet",
            ],
        )
        for label in ("a", "b")
    ]
    flags = ["--device", device, "--quiet"] + (["--no-temporal"] if no_temporal else [])
    out.append(
        (
            "metrics A B",
            metric_py
            + ["metrics", str(clip("a")), str(clip("b")), "--csv", str(work / "frames.csv")]
            + flags,
        )
    )
    out.append(
        (
            "compare" + (" (stub)" if stub else ""),
            metric_py + ["compare", str(runs / "a"), str(runs / "b"), "--out", str(work / "report")] + flags,
        )
    )
    # the study of the report's one clip: preference (2 test streams, 9 catch versions of 2,
    # two tiles side by side), every stream encoded and its delivery measured
    out.append(
        (
            "study create",
            py
            + [
                "study",
                "create",
                str(work / "report"),
                "--db",
                str(work / "study.sqlite"),
                "--protocol",
                "preference",
                "--allow-masking",
            ],
        )
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="+", default=[240, 1440])
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--baseline", default="main", help="git ref of the baseline tree, or none")
    ap.add_argument("--keep", type=Path, help="keep the clips in this folder (reused next time)")
    ap.add_argument("--no-temporal", action="store_true", help="metrics and compare --no-temporal")
    ap.add_argument(
        "--only", nargs="*", help="commands to run (import, metrics, compare, study; study needs compare)"
    )
    ap.add_argument(
        "--cheap", action="store_true", help="metrics and compare with LPIPS's network replaced (see CHEAP)"
    )
    ap.add_argument(
        "--stub-compare",
        action="store_true",
        help="metrics and compare with SSIM zeroed too: only a report for study create (see STUB)",
    )
    ap.add_argument("--device", default="cpu", help="metrics' and compare's --device")
    args = ap.parse_args()
    width, height = map(int, args.size.split("x"))
    data = args.keep or Path(tempfile.mkdtemp(prefix="bench_memory_"))
    trees = {"after": ROOT}
    base_dir = None
    if args.baseline != "none":
        base_dir = Path(tempfile.mkdtemp(prefix="bench_memory_base_")) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_dir), args.baseline],
            check=True,
        )
        trees = {"before": base_dir, "after": ROOT}
    rows = []
    try:
        print(
            f"# {width}x{height} FFV1, frames {args.frames}, {os.cpu_count()} cores, "
            f"baseline {args.baseline}"
            + (", --no-temporal" if args.no_temporal else "")
            + (", --cheap (LPIPS's network a stand-in)" if args.cheap else "")
            + (", --stub-compare (SSIM zeroed too)" if args.stub_compare else ""),
            flush=True,
        )
        for n in args.frames:
            t = time.perf_counter()
            s = make_set(data / f"{width}x{height}_{n}", n, width, height)
            print(f"# {n} frames: clips ready in {time.perf_counter() - t:.1f} s", flush=True)
            for name, tree in trees.items():
                work = Path(tempfile.mkdtemp(prefix=f"bench_memory_{name}_"))
                path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
                env = {**os.environ, "PYTHONPATH": path, "GRADIO_ANALYTICS_ENABLED": "False"}
                try:
                    for what, cmd in commands(
                        tree, s, work, args.no_temporal, args.cheap, args.stub_compare, args.device
                    ):
                        if args.only and not any(what.startswith(o) for o in args.only):
                            continue
                        peak, secs, rc, err = peak_rss(cmd, env, tree)
                        rows.append((n, what, name, peak, secs, rc))
                        print(
                            f"{n:5d} {what:12s} {name:6s} peak {peak / GB:6.2f} GB "
                            f"{secs:6.1f} s rc {rc}" + (f"  {err}" if rc else ""),
                            flush=True,
                        )
                finally:
                    shutil.rmtree(work, ignore_errors=True)
        print("\n# peak RSS (GB), process and children together")
        names = list(trees)
        print(
            f"{'frames':>6} {'command':12s} "
            + " ".join(f"{k:>7s}" for k in names)
            + ("   ratio" if len(names) == 2 else "")
        )
        for n in args.frames:
            for what in dict.fromkeys(r[1] for r in rows if r[0] == n):
                got = {r[2]: r[3] for r in rows if r[0] == n and r[1] == what}
                line = f"{n:6d} {what:12s} " + " ".join(f"{got.get(k, 0) / GB:7.2f}" for k in names)
                if len(names) == 2 and got.get("after"):
                    line += f"  {got.get('before', 0) / got['after']:6.2f}x"
                print(line)
        if len(args.frames) > 1:
            lo, hi = min(args.frames), max(args.frames)
            print(f"\n# growth {lo} -> {hi} frames (GB), per command and tree")
            for what in dict.fromkeys(r[1] for r in rows):
                for k in names:
                    a = [r[3] for r in rows if r[0] == lo and r[1] == what and r[2] == k]
                    b = [r[3] for r in rows if r[0] == hi and r[1] == what and r[2] == k]
                    if a and b:
                        print(
                            f"{what:12s} {k:6s} {a[0] / GB:6.2f} -> {b[0] / GB:6.2f} "
                            f"({(b[0] - a[0]) / GB:+.2f})"
                        )
    finally:
        if base_dir is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_dir)], check=False
            )
        if args.keep is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
