#!/usr/bin/env python
"""As the user waits: the commands a user types at real scale, each timed as a whole process
(interpreter start-up, imports, model loads, the work, the report), cold and warm.

The suite is ``scale720`` (8 clips x 240 frames at 1280x720; ``--frames``/``--clips``/``--tiny``
make it smaller to try the script on a small machine). Two "farms" are made from it: farm A
holds the suite's own lossless clips under their job ids, farm B an H.264 copy of each (CRF 12,
yuv420p: a backend whose difference nobody sees), the way renders arrive from a cluster. Then,
each step a fresh ``python -m evalkit ...`` process, wall clock and peak resident memory of the
process (``os.wait4``):

- ``start-up``: ``evalkit --help`` (the interpreter and the CLI, nothing else);
- ``import A``/``import B``: ``evalkit render -r import`` of each farm into a run folder;
- ``compare cold``: ``evalkit compare`` (the full set: LPIPS, SSIM, PSNR, tLP, tOF, flicker)
  with empty Triton and TorchInductor caches, what a user's first compare on a machine meets;
- ``compare warm`` (twice): the same, caches kept;
- ``compare --no-temporal``: fidelity metrics only, warm;
- ``gate``: ``evalkit gate REPORT --gate FILE`` on the saved report.

``--baseline TREE`` runs every step under another checkout too (``PYTHONPATH``), alternating
which tree goes first, and prints ours / baseline per step. Raw lines (JSON) go to
``OUT/wait.jsonl``; the table to stdout.

    # on the GPU machine (16 cores): the figures in benchmarks/README.md, "As the user waits"
    python benchmarks/bench_wait.py --out OUT --device cuda
    # a try on the 2-core CPU
    python benchmarks/bench_wait.py --out /tmp/w --device cpu --tiny 4 --frames 24 --clips 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "datasets"))


def timed(tree: Path, argv: list[str], *, env_extra: dict | None = None, cwd: Path) -> dict:
    """``python -m evalkit ARGV`` under ``tree``'s code: wall seconds, peak RSS (GB), exit code."""
    path = os.pathsep.join([str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, "PYTHONPATH": path, "GRADIO_ANALYTICS_ENABLED": "False", **(env_extra or {})}
    log = cwd / ".timed.log"
    with open(log, "w+") as f:
        t = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-m", "evalkit", *argv],
            env=env,
            cwd=str(cwd),
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
        )
        _, status, usage = os.wait4(p.pid, 0)  # not p.wait(): wait4 gives this child's rusage
        wall = time.perf_counter() - t
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        f.seek(0)
        text = f.read()
    rss = usage.ru_maxrss / 1e6  # kilobytes on Linux
    return {
        "argv": argv,
        "wall_s": round(wall, 2),
        "peak_rss_gb": round(rss, 2),
        "rc": rc,
        "tail": text[-600:] if rc != 0 else "",
    }


def make_farms(work: Path, *, frames: int, clips: int, workers: int, shrink: int) -> None:
    """The suite (generated), farm A (its lossless clips named by job id) and farm B (H.264)."""
    import make_scale
    import yaml

    from evalkit.formats.suite import load_suite
    from evalkit.video import BrowserEncoding, ClipReader, write_browser

    if shrink > 1:
        for k, v in list(make_scale.SUITES.items()):
            make_scale.SUITES[k] = make_scale.ScaleSpec(
                v.width // shrink, v.height // shrink, v.frames, v.fps, v.subframes
            )
    doc = yaml.safe_load((ROOT / "datasets" / "scale720" / "suite.yaml").read_text())
    ids = [c["id"] for c in doc["clips"]][:clips]
    doc["clips"] = [c for c in doc["clips"] if c["id"] in ids]
    doc["jobs"] = [j for j in doc["jobs"] if j["clip"] in ids]
    folder = work / "scale720"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    t = time.perf_counter()
    make_scale.generate("scale720", work, workers=workers, frames=frames, clips=ids)
    suite = load_suite(folder / "suite.yaml")
    farm_a, farm_b = work / "farm_a", work / "farm_b"
    farm_a.mkdir(exist_ok=True)
    farm_b.mkdir(exist_ok=True)
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        src = folder / "clips" / f"{job.clip}.mkv"
        a = farm_a / f"{job.id}.mkv"
        if not a.exists():
            a.symlink_to(src.resolve())
        info = ClipReader(src).info
        write_browser(farm_b / f"{job.id}.mp4", iter(ClipReader(src)), info.fps, BrowserEncoding(crf=12))

    with ThreadPoolExecutor(max(1, min(len(suite.jobs), workers))) as pool:
        list(pool.map(one, suite.jobs))
    print(
        f"suite and farms: {len(suite.jobs)} jobs x {frames} frames in {time.perf_counter() - t:.1f} s",
        flush=True,
    )


GATE = """lpips: {mean: {max: 0.05}, worst: {max: 0.2}}
psnr: {mean: {min: 30}}
"""


def steps(suite: Path, farm_a: Path, farm_b: Path, work: Path, device: str) -> list:
    """(name, argv maker(tag), env maker(tag)): ``tag`` names the tree, so each tree has its
    own run folders, reports and caches."""

    def runs(tag):
        return work / f"runs-{tag}"

    def caches(tag, fresh=False):
        c = work / f"cache-{tag}"
        if fresh and c.exists():
            shutil.rmtree(c)
        return {"TRITON_CACHE_DIR": str(c / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(c / "inductor")}

    def compare(tag, *extra, out="report"):
        return [
            "compare",
            str(runs(tag) / "farmA"),
            str(runs(tag) / "farmB"),
            "--out",
            str(work / f"{out}-{tag}"),
            "--device",
            device,
            "--quiet",
            *extra,
        ]

    return [
        ("start-up (evalkit --help)", lambda tag: ["--help"], lambda tag: {}),
        (
            "import A",
            lambda tag: [
                "render",
                str(suite),
                "-r",
                "import",
                "-O",
                f"dir={farm_a}",
                "--label",
                "farmA",
                "--out",
                str(runs(tag)),
                "--quiet",
            ],
            lambda tag: {},
        ),
        (
            "import B",
            lambda tag: [
                "render",
                str(suite),
                "-r",
                "import",
                "-O",
                f"dir={farm_b}",
                "--label",
                "farmB",
                "--out",
                str(runs(tag)),
                "--quiet",
            ],
            lambda tag: {},
        ),
        ("compare cold (empty kernel caches)", lambda tag: compare(tag), lambda tag: caches(tag, fresh=True)),
        ("compare warm", lambda tag: compare(tag), lambda tag: caches(tag)),
        ("compare warm again", lambda tag: compare(tag), lambda tag: caches(tag)),
        (
            "compare --no-temporal",
            lambda tag: compare(tag, "--no-temporal", out="fid"),
            lambda tag: caches(tag),
        ),
        (
            "gate (saved report)",
            lambda tag: ["gate", str(work / f"report-{tag}"), "--gate", str(work / "gate.yaml")],
            lambda tag: {},
        ),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/bench_wait")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=240)
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument("--tiny", type=int, default=1, help="divide the frame size by this")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--baseline", default=None, help="another checkout, measured step by step")
    ap.add_argument(
        "--stage",
        choices=["all", "farms", "steps"],
        default="all",
        help="farms: only make the suite and farms in --work; steps: only time the "
        "steps on the farms a 'farms' stage left there",
    )
    a = ap.parse_args(argv)
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    if a.stage != "steps":
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        (work / "gate.yaml").write_text(GATE)
        make_farms(work, frames=a.frames, clips=a.clips, workers=a.workers, shrink=a.tiny)
        if a.stage == "farms":
            return 0
        # the steps from a fresh, small process: a child's peak RSS (wait4) starts from its
        # parent's high-water mark at fork, and making the farms took gigabytes here
        given, args = list(sys.argv[1:] if argv is None else argv), []
        for i, x in enumerate(given):
            if not (x == "--stage" or x.startswith("--stage=") or (i and given[i - 1] == "--stage")):
                args.append(x)
        return subprocess.call([sys.executable, str(Path(__file__).resolve()), *args, "--stage", "steps"])
    suite, farm_a, farm_b = work / "scale720" / "suite.yaml", work / "farm_a", work / "farm_b"
    for tag in ("ours", "baseline"):
        shutil.rmtree(work / f"runs-{tag}", ignore_errors=True)
    import platform

    print(f"host: {platform.node()} {os.cpu_count()} cores, python {platform.python_version()}", flush=True)
    n_pairs = a.frames * a.clips
    trees = [("ours", ROOT)] + ([("baseline", Path(a.baseline).resolve())] if a.baseline else [])
    log = open(out / "wait.jsonl", "w")
    rows = []
    for i, (name, argv_of, env_of) in enumerate(steps(suite, farm_a, farm_b, work, a.device)):
        order = trees if i % 2 == 0 else trees[::-1]
        got = {}
        for tag, tree in order:
            r = timed(tree, argv_of(tag), env_extra=env_of(tag), cwd=work)
            r.update(step=name, tree=tag, pairs=n_pairs)
            log.write(json.dumps(r) + "\n")
            log.flush()
            got[tag] = r
            print(
                f"{name:38s} {tag:8s} {r['wall_s']:8.2f} s  {r['peak_rss_gb']:5.2f} GB  "
                f"rc {r['rc']}" + (f"\n  {r['tail']}" if r["tail"] else ""),
                flush=True,
            )
        rows.append((name, got))
    print(f"\n{a.clips} jobs x {a.frames} frames ({n_pairs} pairs), device {a.device}")
    head = "| step | ours: wall s | peak RSS GB | per pair or frame |"
    if a.baseline:
        head += " baseline: wall s | ours / baseline |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for name, got in rows:
        o = got["ours"]
        rate = f"{n_pairs / o['wall_s']:.0f}/s" if name.startswith(("compare", "import")) else ""
        line = f"| {name} | {o['wall_s']:.2f} | {o['peak_rss_gb']:.2f} | {rate} |"
        if a.baseline:
            b = got["baseline"]
            line += f" {b['wall_s']:.2f} | {o['wall_s'] / b['wall_s']:.2f} |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
