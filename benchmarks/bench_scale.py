#!/usr/bin/env python
"""Real scale, side by side against a baseline tree (today's code) in one run, ratios printed.

Every measurement runs in its own process with ``PYTHONPATH`` set to the tree it measures
(``--new``: this checkout by default; ``--baseline``: another checkout, e.g. main's), so the two
codes never share an import.

``compare --lossless utvideo`` makes UT Video copies of both runs (the same frames, ``render
--lossless utvideo``'s format) besides the FFV1 ones: the baseline tree (which reads FFV1 runs
only) is measured on the FFV1 pair, ours on both; each row says which.

    # on a GPU machine: two real-scale runs (scale720 suite, 8 jobs x 240 frames; run B is run
    # A plus seeded noise), `evalkit compare` of them with each tree; then scale1080
    python benchmarks/bench_scale.py compare --baseline /path/to/main --out OUT
    # both trees on the same UT Video runs, row by row, alternating (session 10's figures)
    python benchmarks/bench_scale.py ab --baseline /path/to/main --rows lpips gpuflow --out OUT
    # the 2-core CPU: `study create` of a 20-clip 720p study, wall time and peak memory
    python benchmarks/bench_scale.py study --baseline /work/main --out OUT

``compare`` times ``evalkit compare``'s library call (``compare_runs``) in three parts, as
the process sees them: start-up (imports, run folders, LPIPS model: up to the first frame
read), the measurement (from the first frame read to the last record: decoding included) and
the report (CSV, JSON, plots, HTML); plus peak resident memory and peak GPU memory. The
baseline measures ``--baseline-jobs`` jobs of the runs (its pairs/s does not depend on how
many: it measures one job after the other), ours all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -- one measurement, in the measured tree's process ------------------------------------------


def _child_compare(args) -> dict:
    try:  # the command's first step (trees that have it)
        from evalkit.bytecode import ensure

        ensure()
    except ImportError:
        pass
    import evalkit
    import evalkit.compare.pairing as P
    import evalkit.compare.run as R

    tree = Path.cwd().resolve()
    if not Path(evalkit.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"bench_scale: evalkit imported from {evalkit.__file__}, not from {tree}")

    t0 = time.perf_counter()
    spans: dict = {"measure": [], "report": []}
    measure, write_report = P.LocalCompareSession.measure, R.write_report

    def timed_measure(self, pairs, **kw):
        t = time.perf_counter()
        out = measure(self, pairs, **kw)
        spans["measure"].append((time.perf_counter() - t, sum(len(m.records) for m in out)))
        return out

    def timed_report(*a, **kw):
        t = time.perf_counter()
        out = write_report(*a, **kw)
        spans["report"].append(time.perf_counter() - t)
        return out

    P.LocalCompareSession.measure = timed_measure
    R.write_report = timed_report
    if hasattr(P.LocalCompareSession, "_warm_up"):
        # start-up work done inside measure() while the first clips decode: counted as start-up
        warm_up = P.LocalCompareSession._warm_up
        spans["warm"] = []

        def timed_warm_up(self, *a, **kw):
            t = time.perf_counter()
            warm_up(self, *a, **kw)
            spans["warm"].append(time.perf_counter() - t)

        P.LocalCompareSession._warm_up = timed_warm_up
    workers_hwm: list = []
    try:  # decoder worker processes (trees that have them)
        import evalkit.procdecode as PD

        pool_close = PD.DecoderPool.close

        def close_and_measure(self):
            workers_hwm.extend(peak_rss_gb(w.process.pid) for w in list(self._all))
            pool_close(self)

        PD.DecoderPool.close = close_and_measure
    except ImportError:
        pass
    sampler = PssSampler()
    from evalkit.compare.options import MetricOptions

    options = MetricOptions(temporal=not args.no_temporal, flow=args.flow or "dis")
    res = R.compare_runs(args.a, args.b, args.report, device=args.device, progress=False, metrics=options)
    total = time.perf_counter() - t0
    sampler.stop()
    warm = sum(spans.get("warm", []))
    seconds = sum(s for s, _ in spans["measure"]) - warm
    pairs = sum(n for _, n in spans["measure"])
    report = sum(spans["report"])
    out = {
        "pairs": pairs,
        "jobs": len(res.measures),
        "measure_s": round(seconds, 3),
        "pairs_per_s": round(pairs / seconds, 1),
        "startup_s": round(total - seconds - report, 3),
        "report_s": round(report, 3),
        "total_s": round(total, 3),
        "warm_up_s": round(warm, 3),
        "peak_rss_gb": peak_rss_gb(),
        "lpips_mean": res.summary["aggregates"]["lpips"]["mean"],
    }
    if sampler.peak:
        out["peak_pss_gb"] = round(sampler.peak / 2**30, 2)
    if workers_hwm:
        out["decoders"] = len(workers_hwm)
        out["decoders_peak_rss_gb"] = round(sum(workers_hwm), 2)
    try:
        import torch

        if torch.cuda.is_available():
            out["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    except ImportError:
        pass
    return out


def _child_decode(args) -> dict:
    """Decoding alone, the way ``compare`` decodes (this tree's :class:`ClipReader` chunks in
    :class:`Prefetch` threads, both clips of a job at once, the next job's pair started one
    job ahead): frames/s of the run folders ``a`` and ``b``, first ``--jobs`` jobs; then one
    clip of ``b`` alone; with ``--hash``, SHA-256 of every decoded frame of the first job."""
    import hashlib

    from evalkit.compare.clips import prefetch_depth
    from evalkit.video import ClipReader, Prefetch

    clips = [
        (pa, Path(args.b) / "clips" / pa.name)
        for pa in sorted((Path(args.a) / "clips").iterdir())
        if pa.suffix in (".mkv", ".nut")
    ][: args.jobs]
    depth = prefetch_depth(16)

    def start(pair):
        return [Prefetch(ClipReader(p).chunks(16), depth) for p in pair]

    t = time.perf_counter()
    n, ahead = 0, start(clips[0])
    for i in range(len(clips)):
        cur, ahead = ahead, (start(clips[i + 1]) if i + 1 < len(clips) else None)
        for xa, xb in zip(*cur):
            n += len(xa) + len(xb)
    both = time.perf_counter() - t
    t = time.perf_counter()
    one = sum(len(c) for c in Prefetch(ClipReader(clips[0][1]).chunks(16), depth))
    alone = time.perf_counter() - t
    out = {
        "jobs": len(clips),
        "frames": n,
        "frames_per_s": round(n / both, 1),
        "pairs_per_s": round(n / 2 / both, 1),
        "one_b_clip_frames_per_s": round(one / alone, 1),
        "peak_rss_gb": peak_rss_gb(),
    }
    if args.hash:
        h = hashlib.sha256()
        for p in clips[0]:
            for c in ClipReader(p).chunks(16):
                h.update(c.tobytes())
        out["sha256_job0"] = h.hexdigest()[:16]
    return out


def _child_study(args) -> dict:
    from evalkit.study import create_study

    t0 = time.perf_counter()
    r = create_study(args.report, args.db, protocol=args.protocol, raters_planned=40, allow_masking=True)
    wall = time.perf_counter() - t0
    media = Path(r["media"])
    return {
        "clips": r["clips"],
        "catch_versions": r["catch_versions"],
        "wall_s": round(wall, 2),
        "peak_rss_gb": peak_rss_gb(),
        "media_files": len(list(media.glob("*.mp4"))),
        "media_mb": round(sum(p.stat().st_size for p in media.glob("*.mp4")) / 1e6, 1),
    }


class PssSampler:
    """The memory of this process and its children (decoder workers) together, sampled every
    ``every`` s in a thread: the peak of the sum of their proportional set sizes (``Pss`` of
    ``/proc/PID/smaps_rollup``: a shared page counts once in all, split between its users), in
    bytes. 0 where /proc has no smaps_rollup."""

    def __init__(self, every: float = 0.25):
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    @staticmethod
    def _pss(pid) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self, every: float) -> None:
        me = os.getpid()
        while not self._stop.wait(every):
            try:
                kids = Path(f"/proc/{me}/task/{me}/children").read_text().split()
            except OSError:
                kids = []
            self.peak = max(self.peak, self._pss(me) + sum(self._pss(k) for k in kids))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def peak_rss_gb(pid: int | str = "self") -> float:
    """A process's own peak resident memory (``VmHWM``), GB; this one's by default. Not
    ``getrusage``'s ``ru_maxrss``: Linux carries that across fork and exec, so a child started
    by a parent holding 5 GB reported 5 GB whatever it used itself. Shared memory a process
    has touched counts in its figure (decoder workers and compare count their ring twice)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    if pid != "self":
        return float("nan")
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def run_in(
    tree: Path, *argv, timeout: float = 900, env_extra: dict | None = None, script: Path | None = None
) -> dict:
    """Run this script's (or ``script``'s) ``_child`` command under ``tree``'s code
    (``env_extra``: settings of that process alone); its JSON result (its last line)."""
    path = os.pathsep.join([str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {
        **os.environ,
        **(env_extra or {}),
        "PYTHONPATH": path,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONWARNINGS": "ignore",
    }
    p = subprocess.run(
        [sys.executable, str(Path(script or __file__).resolve()), "_child", *map(str, argv)],
        env=env,
        cwd=str(tree),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if p.returncode != 0:
        raise RuntimeError(f"{tree}: {' '.join(map(str, argv))} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- making the runs ---------------------------------------------------------------------------

#: ``--tiny``: frame sizes divided by this (to try the script on a small CPU machine)
SHRINK = 1


def _make_scale():
    sys.path.insert(0, str(ROOT / "datasets"))
    import make_scale

    if SHRINK > 1 and not getattr(make_scale, "_shrunk", False):
        make_scale._shrunk = True
        for k, v in list(make_scale.SUITES.items()):
            make_scale.SUITES[k] = make_scale.ScaleSpec(
                v.width // SHRINK, v.height // SHRINK, v.frames, v.fps, v.subframes
            )
    return make_scale


def make_runs(
    suite_name: str,
    root: Path,
    *,
    frames: int,
    clips: int,
    workers: int,
    subsets: dict[str, int],
    lossless: str = "ffv1",
) -> dict[str, Path]:
    """Generate ``clips`` clips of a real-scale suite into ``root`` (a suite file naming just
    them), then run folders: ``a`` holds the clips themselves, ``b`` the clips plus seeded
    noise (every pixel +-0..2 code values), ``a<k>``/``b<k>`` the same with only the first k
    jobs done (``subsets``). Returns the run folders. They are FFV1 runs (what every tree
    reads); ``lossless="utvideo"`` adds ``<name>@utvideo`` of each: the same frames in UT Video
    (``render --lossless utvideo``), converted from the FFV1 clips."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import yaml

    make_scale = _make_scale()

    from evalkit.formats.run import RunDir
    from evalkit.formats.suite import load_suite
    from evalkit.video import ClipReader, lossless_format, write_lossless

    doc = yaml.safe_load((ROOT / "datasets" / suite_name / "suite.yaml").read_text())
    ids = [c["id"] for c in doc["clips"]][:clips]
    doc["clips"] = [c for c in doc["clips"] if c["id"] in ids]
    doc["jobs"] = [j for j in doc["jobs"] if j["clip"] in ids]
    folder = root / suite_name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    t = time.perf_counter()
    make_scale.generate(suite_name, root, workers=workers, frames=frames, clips=ids)
    gen_s = time.perf_counter() - t

    def noisy(cid: str) -> Path:
        src = folder / "clips" / f"{cid}.mkv"
        dst = root / "noisy" / f"{cid}.mkv"
        dst.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(16)

        def frames_b():
            for chunk in ClipReader(src).chunks(8):
                noise = rng.integers(-2, 3, chunk.shape, dtype=np.int16)
                yield from np.clip(chunk + noise, 0, 255).astype(np.uint8)

        write_lossless(dst, frames_b(), ClipReader(src).info.fps)
        return dst

    t = time.perf_counter()
    with ThreadPoolExecutor(min(len(ids), workers)) as pool:
        list(pool.map(noisy, ids))
    noise_s = time.perf_counter() - t
    formats = [("ffv1", "", {"a": folder / "clips", "b": root / "noisy"})]
    convert_s = 0.0
    if lossless != "ffv1":
        fmt = lossless_format(lossless)
        dst = {"a": root / lossless / "a", "b": root / lossless / "b"}

        def convert(item) -> None:
            side, cid = item
            src = formats[0][2][side] / f"{cid}.mkv"
            dst[side].mkdir(parents=True, exist_ok=True)
            write_lossless(
                dst[side] / f"{cid}{fmt.ext}", iter(ClipReader(src)), ClipReader(src).info.fps, codec=lossless
            )

        t = time.perf_counter()
        with ThreadPoolExecutor(min(2 * len(ids), workers)) as pool:
            list(pool.map(convert, [(side, cid) for side in dst for cid in ids]))
        convert_s = time.perf_counter() - t
        formats.append((lossless, f"@{lossless}", dst))
    suite = load_suite(folder / "suite.yaml")
    runs = {}
    for codec, suffix, sources in formats:
        ext = lossless_format(codec).ext
        for side, src in sources.items():
            for name, k in [(side, len(suite.jobs))] + [(f"{side}{k}", k) for k in subsets.values()]:
                name += suffix
                run = RunDir.create(
                    root / "runs" / name,
                    suite=suite,
                    renderer={"name": "import", "version": "1", "options": {}},
                    backend={"spec": "import"},
                    fingerprint={"host": "bench"},
                    lossless=codec,
                )
                for job in suite.jobs[:k]:
                    p = src / f"{job.clip}{ext}"
                    info = ClipReader(p).info
                    run.record_done_encoded(
                        job.id,
                        p.read_bytes(),
                        None,
                        frames=frames,
                        width=info.width,
                        height=info.height,
                        fps=info.fps,
                    )
                runs[name] = run.path
    print(
        f"[{suite_name}] {len(ids)} clips x {frames} frames generated in {gen_s:.1f} s "
        f"(noisy copies {noise_s:.1f} s, {workers} processes"
        + (f"; {lossless} copies {convert_s:.1f} s" if convert_s else "")
        + ")",
        flush=True,
    )
    return runs


# -- commands ----------------------------------------------------------------------------------


def _line(name: str, r: dict) -> str:
    extra = f", GPU {r['peak_gpu_gb']} GB" if "peak_gpu_gb" in r else ""
    if "decoders" in r:
        extra += f", {r['decoders']} decoder processes {r['decoders_peak_rss_gb']} GB in all"
    if "peak_pss_gb" in r:
        extra += f"; all processes together (PSS, sampled) {r['peak_pss_gb']} GB"
    return (
        f"  {name:<34} {r['pairs']:>5} pairs in {r['measure_s']:>7.2f} s = "
        f"{r['pairs_per_s']:>6.1f} pairs/s | start-up {r['startup_s']:.2f} s"
        f"{' (warm-up %.2f s)' % r['warm_up_s'] if r.get('warm_up_s') else ''}, report "
        f"{r['report_s']:.2f} s | peak RSS {r['peak_rss_gb']} GB{extra} | "
        f"LPIPS mean {r['lpips_mean']:.5f}"
    )


def cmd_compare(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    results: dict = {}
    trees = {"baseline": Path(a.baseline), "ours": Path(a.new)}
    if a.flow_tree:
        trees["ours+gpuflow"] = Path(a.flow_tree)
    sets = [("scale720", a.frames, a.jobs, a.baseline_jobs)]
    if a.hd_jobs:
        sets.append(("scale1080", a.frames, a.hd_jobs, a.hd_baseline_jobs))
    for suite, frames, jobs, base_jobs in sets:
        runs = make_runs(
            suite,
            work / suite,
            frames=frames,
            clips=jobs,
            workers=a.workers,
            subsets={"base": base_jobs} if base_jobs else {},
            lossless=a.lossless,
        )
        # the baseline (today's main) reads FFV1 runs only: it runs on the FFV1 pair; ours on
        # the FFV1 pair and, with --lossless utvideo, on the same frames in UT Video too
        formats = ["ffv1"] + ([a.lossless] if a.lossless != "ffv1" else [])
        print(
            f"[{suite}] evalkit compare, {jobs} jobs (baseline {base_jobs}) x {frames} frames, "
            f"device {a.device}; lossless runs: baseline ffv1, ours {' and '.join(formats)}",
            flush=True,
        )
        if a.decode:
            variants = [("baseline", "ffv1")] + [("ours", f) for f in formats]
            for tree, fmt in variants:
                k = base_jobs if tree == "baseline" and base_jobs else jobs
                sfx = "" if fmt == "ffv1" else f"@{fmt}"
                name = tree + ("" if fmt == "ffv1" else f" {fmt}")
                try:
                    r = run_in(
                        trees[tree],
                        "decode",
                        runs["a" + sfx],
                        runs["b" + sfx],
                        "--jobs",
                        k,
                        "--hash",
                        timeout=a.child_timeout,
                    )
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"  {name}: decode: FAILED {str(e)[-800:]}", flush=True)
                    continue
                results[f"{suite} | decode | {name}"] = r
                print(
                    f"  decode only [{tree}, {fmt}] {r['jobs']} jobs, {r['frames']} frames (A "
                    f"and B): {r['frames_per_s']} frames/s = {r['pairs_per_s']} pairs/s | one B "
                    f"clip alone {r['one_b_clip_frames_per_s']} frames/s | peak RSS "
                    f"{r['peak_rss_gb']} GB | job 0 frames sha256 {r['sha256_job0']}",
                    flush=True,
                )
            base = results.get(f"{suite} | decode | baseline")
            for fmt in formats:
                d = results.get(f"{suite} | decode | ours" + ("" if fmt == "ffv1" else f" {fmt}"))
                if base and d:
                    print(
                        f"    ratio ours ({fmt}) / baseline (ffv1): "
                        f"{d['frames_per_s'] / base['frames_per_s']:.2f}x frames/s; decoded "
                        f"frames identical: {base['sha256_job0'] == d['sha256_job0']}",
                        flush=True,
                    )
        plan = [
            ("LPIPS+SSIM+PSNR", ["--no-temporal"], "baseline", True),
            ("LPIPS+SSIM+PSNR", ["--no-temporal"], "ours", False),
            ("full set, CPU flow (DIS fast)", [], "baseline", True),
            ("full set, CPU flow (DIS fast)", [], "ours", False),
        ]
        if a.only_lpips:
            plan = plan[:2]
        if "ours+gpuflow" in trees:
            plan.append(("full set, GPU flow (--flow torch)", ["--flow", "torch"], "ours+gpuflow", False))
        plan = [
            (what, opts, tree, base, fmt)
            for what, opts, tree, base in plan
            # the GPU-flow row on the fastest-decoding format only (its FFV1 rate is the
            # decoder's, shown by the rows above)
            for fmt in (
                ["ffv1"] if tree == "baseline" else formats[-1:] if tree == "ours+gpuflow" else formats
            )
        ]
        for what, opts, tree, base, fmt in plan:
            if base and not base_jobs:
                continue
            sfx = "" if fmt == "ffv1" else f"@{fmt}"
            ra, rb = (
                (runs[f"a{base_jobs}"], runs[f"b{base_jobs}"]) if base else (runs["a" + sfx], runs["b" + sfx])
            )
            key = f"{suite} | {what} | {tree}" + ("" if fmt == "ffv1" else f" {fmt}")
            try:
                r = run_in(
                    trees[tree],
                    "compare",
                    ra,
                    rb,
                    work
                    / "reports"
                    / key.replace(" ", "_")
                    .replace("|", "")
                    .replace("+", "")
                    .replace("(", "")
                    .replace(")", ""),
                    "--device",
                    a.device,
                    *opts,
                    timeout=a.child_timeout,
                )
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"  {tree}: {what}: FAILED {str(e)[-800:]}", flush=True)
                continue
            results[key] = r
            print(_line(f"{what} [{tree}, {fmt}]", r), flush=True)
            if tree != "baseline":
                b = results.get(
                    f"{suite} | {what.replace(', GPU flow (--flow torch)', ', CPU flow (DIS fast)')} | baseline"
                )
                if b:
                    print(
                        f"    ratio ours ({fmt}) / baseline (ffv1): "
                        f"{r['pairs_per_s'] / b['pairs_per_s']:.2f}x pairs/s",
                        flush=True,
                    )
            (out / "compare.json").write_text(json.dumps(results, indent=1))
    return results


#: ``ab``'s rows: name -> compare options
AB_ROWS = {
    "lpips": ("LPIPS+SSIM+PSNR", ["--no-temporal"]),
    "gpuflow": ("full set, GPU flow", ["--flow", "torch"]),
    "cpuflow": ("full set, CPU flow (DIS fast)", ["--flow", "dis"]),
}


def cmd_ab(a) -> dict:
    """Both trees on the same runs, row by row, alternating which goes first (baseline, ours,
    then ours, baseline, ...), each ``--repeats`` times; best pairs/s of each and the ratio."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    trees = {"baseline": (Path(a.baseline).resolve(), {}), "ours": (Path(a.new).resolve(), {})}
    for extra in a.also or []:  # ours again, under other settings
        bad = [kv for kv in extra.split(",") if "=" not in kv]
        if bad:
            print(f"--also: {bad[0]!r} in {extra!r}: expected VAR=VALUE[,VAR=VALUE]", file=sys.stderr)
            raise SystemExit(2)
        trees[f"ours:{extra}"] = (Path(a.new).resolve(), dict(kv.split("=", 1) for kv in extra.split(",")))
    results: dict = {}
    sfx = "" if a.lossless == "ffv1" else f"@{a.lossless}"
    for suite, jobs in (("scale720", a.jobs), ("scale1080", a.hd_jobs)):
        if not jobs:
            continue
        t = time.perf_counter()
        runs = make_runs(
            suite,
            Path(a.work) / suite,
            frames=a.frames,
            clips=jobs,
            workers=a.workers,
            subsets={},
            lossless=a.lossless,
        )
        print(
            f"[{suite}] {jobs} jobs x {a.frames} frames ({a.lossless}) made in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )
        for row in a.rows:
            what, opts = AB_ROWS[row]
            best: dict = {}
            for i in range(a.repeats):
                for tree in list(trees) if i % 2 == 0 else list(trees)[::-1]:
                    key = f"{suite} | {what} | {tree} | {i}"
                    try:
                        r = run_in(
                            trees[tree][0],
                            "compare",
                            runs["a" + sfx],
                            runs["b" + sfx],
                            Path(a.work) / "reports" / f"{suite}-{row}-{list(trees).index(tree)}-{i}",
                            "--device",
                            a.device,
                            *opts,
                            timeout=a.child_timeout,
                            env_extra=trees[tree][1],
                        )
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        print(f"  {what} [{tree}]: FAILED {str(e)[-800:]}", flush=True)
                        continue
                    results[key] = r
                    best[tree] = max(best.get(tree, 0.0), r["pairs_per_s"])
                    print(_line(f"{what} [{tree}]", r), flush=True)
            for name in best:
                if name != "baseline" and "baseline" in best:
                    print(
                        f"    {suite} {what}: {name} / baseline {best[name] / best['baseline']:.2f}x "
                        f"pairs/s (best of {a.repeats} each)",
                        flush=True,
                    )
            (out / "ab.json").write_text(json.dumps(results, indent=1))
    return results


def make_study_report(root: Path, *, clips: int, frames: int, workers: int, sources: int = 8) -> Path:
    """A compare report folder holding what ``study create`` reads (summary.json with the two
    runs and ``clips`` compared jobs) over real-scale 720p clips: run A = the suite's clips
    (``frames`` frames), run B = them plus seeded noise; 8 clips, so jobs repeat clips with
    B's noise seeded per job (``sources``: how many of the 8 clips are made)."""
    import numpy as np

    from evalkit.video import ClipReader, write_lossless

    make_scale = _make_scale()
    paths = make_scale.generate(
        "scale720", root / "src", workers=workers, frames=frames, clips=make_scale.CLIPS[:sources]
    )
    for side in ("a", "b"):
        (root / "runs" / side / "clips").mkdir(parents=True, exist_ok=True)
    jobs = []
    for i in range(clips):
        src = paths[i % len(paths)]
        job = f"{src.stem}-{i}"
        frames_a = ClipReader(src).read()
        rng = np.random.default_rng(i)
        frames_b = np.clip(frames_a + rng.integers(-3, 4, frames_a.shape, dtype=np.int16), 0, 255).astype(
            np.uint8
        )
        write_lossless(root / "runs" / "a" / "clips" / f"{job}.mkv", frames_a, 24)
        write_lossless(root / "runs" / "b" / "clips" / f"{job}.mkv", frames_b, 24)
        jobs.append(job)
    report = root / "report"
    report.mkdir(exist_ok=True)
    (report / "summary.json").write_text(
        json.dumps(
            {
                "runs": {"a": {"path": str(root / "runs" / "a")}, "b": {"path": str(root / "runs" / "b")}},
                "jobs": {"compared": jobs},
            }
        )
    )
    return report


def cmd_study(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    t = time.perf_counter()
    report = make_study_report(work, clips=a.clips, frames=a.frames, workers=a.workers, sources=a.sources)
    print(
        f"study input: {a.clips} clips of 1280x720 x {a.frames} frames from {a.sources} "
        f"sources (made in "
        f"{time.perf_counter() - t:.0f} s); protocol {a.protocol}; {os.cpu_count()} CPUs",
        flush=True,
    )
    results = {}
    order = ["baseline", "ours"] * a.repeats
    for i, tree in enumerate(order):
        path = Path(a.baseline) if tree == "baseline" else Path(a.new)
        r = run_in(
            path, "study", report, work / f"study-{i}-{tree}.db", "--protocol", a.protocol, timeout=3600
        )
        results.setdefault(tree, []).append(r)
        print(
            f"  {tree:<9} wall {r['wall_s']:>7.1f} s | peak RSS {r['peak_rss_gb']:.2f} GB | "
            f"{r['clips']} clips, {r['catch_versions']} catch versions, {r['media_files']} "
            f"files, {r['media_mb']} MB",
            flush=True,
        )
    best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in results.items()}
    print(
        f"  ratio baseline / ours wall time (best of {a.repeats}): "
        f"{best['baseline']['wall_s'] / best['ours']['wall_s']:.2f}x; peak RSS ours / baseline: "
        f"{best['ours']['peak_rss_gb'] / best['baseline']['peak_rss_gb']:.2f}x",
        flush=True,
    )
    (out / "study.json").write_text(json.dumps(results, indent=1))
    return results


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        c = argparse.ArgumentParser()
        c.add_argument("what", choices=["compare", "study", "decode"])
        c.add_argument("a")
        c.add_argument("b")
        c.add_argument("report", nargs="?")
        c.add_argument("--device", default="cuda")
        c.add_argument("--no-temporal", action="store_true")
        c.add_argument("--flow", default=None)
        c.add_argument("--protocol", default="preference")
        c.add_argument("--jobs", type=int, default=8)
        c.add_argument("--hash", action="store_true")
        args = c.parse_args(argv[1:])
        if args.what == "decode":
            print(json.dumps(_child_decode(args)))
            return 0
        if args.what == "study":
            args.report, args.db = args.a, args.b
            print(json.dumps(_child_study(args)))
        else:
            print(json.dumps(_child_compare(args)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--baseline", required=True, help="checkout of today's code (e.g. main)")
    c.add_argument("--new", default=str(ROOT), help="checkout measured as ours (default: this one)")
    c.add_argument(
        "--flow-tree",
        default=None,
        help="checkout with the GPU flow (--flow torch) for the full set on the GPU",
    )
    c.add_argument("--out", required=True)
    c.add_argument("--work", default="/tmp/bench_scale")
    c.add_argument("--device", default="cuda")
    c.add_argument("--frames", type=int, default=240)
    c.add_argument("--jobs", type=int, default=8)
    c.add_argument("--baseline-jobs", type=int, default=3)
    c.add_argument("--hd-jobs", type=int, default=2, help="1920x1080 jobs (0: none)")
    c.add_argument("--hd-baseline-jobs", type=int, default=0)
    c.add_argument("--child-timeout", type=float, default=240)
    c.add_argument(
        "--decode",
        action="store_true",
        help="also decoding alone (each tree's reader, as compare decodes), frames/s",
    )
    c.add_argument("--only-lpips", action="store_true", help="LPIPS+SSIM+PSNR only (no full set)")
    c.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    c.add_argument(
        "--lossless",
        choices=["ffv1", "utvideo"],
        default="ffv1",
        help="utvideo: also UT Video copies of both runs (render --lossless "
        "utvideo), measured by ours beside the FFV1 pair (the baseline reads "
        "FFV1 only)",
    )
    b = sub.add_parser("ab", help="two trees on the same runs, row by row, alternating")
    b.add_argument("--baseline", required=True, help="checkout of today's code (e.g. main)")
    b.add_argument("--new", default=str(ROOT), help="checkout measured as ours (default: this one)")
    b.add_argument("--out", required=True)
    b.add_argument("--work", default="/tmp/bench_scale_ab")
    b.add_argument("--device", default="cuda")
    b.add_argument("--frames", type=int, default=240)
    b.add_argument("--jobs", type=int, default=8, help="1280x720 jobs (0: none)")
    b.add_argument("--hd-jobs", type=int, default=0, help="1920x1080 jobs (0: none)")
    b.add_argument("--rows", nargs="+", choices=list(AB_ROWS), default=["lpips", "gpuflow"])
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument(
        "--also",
        nargs="*",
        metavar="VAR=V[,VAR=V]",
        help="also ours with these environment settings (e.g. EVALKIT_TRITON=0)",
    )
    b.add_argument("--child-timeout", type=float, default=240)
    b.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    b.add_argument(
        "--lossless",
        choices=["ffv1", "utvideo"],
        default="utvideo",
        help="the runs both trees read (default utvideo: FFV1 runs are decode-bound "
        "near 85 pairs/s at 720p on 16 cores)",
    )
    s = sub.add_parser("study")
    s.add_argument("--baseline", required=True)
    s.add_argument("--new", default=str(ROOT))
    s.add_argument("--out", required=True)
    s.add_argument("--work", default="/tmp/bench_scale_study")
    s.add_argument("--clips", type=int, default=20)
    s.add_argument("--frames", type=int, default=48)
    s.add_argument("--sources", type=int, default=8, help="source clips made (jobs repeat them)")
    s.add_argument("--protocol", default="preference")
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    for p in (c, b, s):
        p.add_argument(
            "--tiny",
            type=int,
            default=1,
            metavar="N",
            help="frame sizes divided by N (a quick try on a small machine)",
        )
    a = ap.parse_args(argv)
    global SHRINK
    SHRINK = a.tiny
    print(
        f"bench_scale {a.cmd}: baseline {a.baseline}, ours {a.new}; host {os.uname().nodename}, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        flush=True,
    )
    {"compare": cmd_compare, "ab": cmd_ab, "study": cmd_study}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
