#!/usr/bin/env python
"""Quality, speed and backend-sensitivity figures of the shipped canary pipeline.

Subcommands (each prints a table and writes JSON with ``--out``)::

    python benchmarks/bench_canary.py quality      [--backend cpu] [--clips suite|all]
    python benchmarks/bench_canary.py speed        [--backend cuda,dtype=bf16]
    python benchmarks/bench_canary.py sensitivity  [-b cpu,dtype=bf16 ...] [--reference cpu]
    python benchmarks/bench_canary.py gpu          # on a CUDA machine: all three, GPU backends

Every render goes through the code ``evalkit render`` runs: the backend spec is parsed and
applied by :mod:`evalkit.render.backend` (dtype, TF32, deterministic algorithms, attention,
``torch.compile``), the pipeline is loaded and called by the ``canary`` renderer, and each job
is rendered by the local executor (:meth:`LocalExecutor.run` / ``render_job``: job params,
CPU-drawn noise, output checks). Only the run folder is left out (the lossless clip and its
hash, which do not change the frames). Backends are therefore named by their spec
(``cuda,dtype=fp32`` is strict fp32: TF32 off; ``cuda,dtype=fp32,tf32=on`` allows TF32), and no
code here sets a device, a dtype or a numeric flag of its own (tests/test_benchmarks_paths.py
checks that). Distances are computed by the metric engine that ``evalkit compare`` uses
(``evalkit.metrics.stream.PairEvaluator``: LPIPS-alex, SSIM on luma, PSNR, exactness; float32 with TF32
off) and aggregated by ``evalkit.compare.aggregate``.

Quality is measured on data training never saw: the eight photographs the bundled clips are
made of (two 256x256 views each: the centre square, and a 2x zoom on it), each rendered as a
one-frame video, and the canary suite's clips (24 frames, 256x256). Every render uses the
suite's parameters (strength 0.6, 12 steps, guidance 4.0, seed 0). Per style:

- ``lpips_ratio`` = mean LPIPS-alex(output, classical target) / mean LPIPS(source, target);
  target <= 0.7;
- ``grad_ratio`` = mean gradient magnitude (Sobel on luma) of outputs / of targets; >= 0.7;
- ``warp_ratio`` (clips) = warping error of the canary / of the classical operator applied
  frame by frame; <= 2. Warping error: optical flow (OpenCV DIS, medium) on the *source*
  frames from frame t to t-1, frame t-1 of the output warped onto frame t, mean absolute
  difference (RGB in [0, 1]) over pixels whose forward-backward flow is consistent.

Sensitivity renders every job of ``datasets/canary/suite.yaml`` on the reference backend
(``--reference``, default ``cpu``: CPU fp32) and on each ``--backend``, then each of them a
second time (``--rerender``, on by default: a fresh pipeline load, after all the others), and
optionally with the seed offset 1 on one backend (``--seed-floor SPEC``: the noise floor that
``evalkit compare --floor`` divides by). Reported per pair: mean, p95 and worst LPIPS over all
frames, the worst job's mean LPIPS, mean SSIM, mean PSNR (over frames that differ: identical
frames have infinite PSNR), identical frames and jobs, and the LPIPS ratio to the seed floor.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "datasets/canary/suite.yaml"

HELD_OUT = [
    ("astronaut", "skimage.data", "astronaut.png"),
    ("coffee", "skimage.data", "coffee.png"),
    ("chelsea", "skimage.data", "chelsea.png"),
    ("rocket", "skimage.data", "rocket.jpg"),
    ("camera", "skimage.data", "camera.png"),
    ("hubble", "skimage.data", "hubble_deep_field.jpg"),
    ("china", "sklearn.datasets", "images/china.jpg"),
    ("flower", "sklearn.datasets", "images/flower.jpg"),
]
#: the canary suite's parameters, by the job-param names the renderer takes
PARAMS = dict(strength=0.6, steps=12, guidance=4.0)
#: the backends of ``gpu``'s sensitivity run, against ``cpu`` (CPU fp32)
GPU_SENSITIVITY = [
    "cuda,dtype=fp32",
    "cuda,dtype=fp32,tf32=on",
    "cuda,dtype=fp16",
    "cuda,dtype=bf16",
    "cuda,dtype=bf16,compile=on",
]


# -- rendering through the product's backend machinery -------------------------------------


class FrameSource:
    """What the executor reads source frames from (``get(clip) -> (frames, fps, path)``), for
    frames already in memory: photo views, or clips cut to ``max_frames`` for a smoke run."""

    def __init__(self, frames: dict[str, np.ndarray], fps=Fraction(24)):
        self.frames, self.fps = frames, fps

    def get(self, clip_id: str):
        return self.frames[clip_id], self.fps, None


def suite_sources(suite, max_frames: int = 0):
    """The executor's source cache of ``evalkit render`` (PyAV); without PyAV (a bare GPU
    machine), the same lossless FFV1 clips decoded by OpenCV's FFmpeg, which gives identical
    frames."""
    import importlib.util

    if importlib.util.find_spec("av") is not None and not max_frames:
        from evalkit.render.sources import SourceCache

        return SourceCache(suite)
    frames = {}
    for cid, clip in suite.clips.items():
        f = decode_clip(clip.path)
        frames[cid] = f[:max_frames] if max_frames else f
    return FrameSource(frames)


def canary_renderer(model: str):
    from evalkit.render.renderers import get_renderer

    return get_renderer("canary", {"model": str(model)})


def quiet_progress(total: int = 0):
    from evalkit.render.progress import Progress

    return Progress(total, enabled=False)


@contextlib.contextmanager
def backend_session(spec_text: str, model: str):
    """Apply a backend spec and load the canary renderer on it, as ``evalkit render`` does for
    each backend; yields ``render(job, sources, seed_offset=0) -> JobResult``."""
    from evalkit.render.backend import apply_backend, parse_spec
    from evalkit.render.local_executor import LocalExecutor

    renderer = canary_renderer(model)
    with apply_backend(parse_spec(spec_text)) as runtime:
        renderer.load(runtime)
        progress = quiet_progress()
        try:

            def render(job, sources, seed_offset: int = 0):
                res = LocalExecutor.render_job(renderer, runtime, job, sources, seed_offset, progress)
                if res.error is not None:
                    raise RuntimeError(f"{spec_text}: job {job.id}: {res.error}")
                return res

            render.runtime = runtime
            yield render
        finally:
            renderer.unload()


def render_jobs(spec_text: str, model: str, jobs, sources, seed_offset: int = 0) -> dict:
    """One backend's pass over ``jobs``, exactly as ``evalkit render``'s local executor runs it
    (apply the spec, load the renderer once, render each job, unload); frames by job id."""
    from evalkit.render.backend import parse_spec
    from evalkit.render.local_executor import LocalExecutor
    from evalkit.render.results import BackendTask

    task = BackendTask(parse_spec(spec_text), list(jobs), seed_offset)
    out = {}
    for res in LocalExecutor().run(canary_renderer(model), task, sources, quiet_progress(len(jobs))):
        if res.error is not None:
            raise RuntimeError(f"{spec_text}: job {res.job.id}: {res.error}")
        out[res.job.id] = res
    return out


def backend_fingerprint(spec_text: str) -> dict:
    """The environment fingerprint a run folder of this backend records."""
    from evalkit.render.backend import parse_spec
    from evalkit.render.local_executor import LocalExecutor

    return LocalExecutor().fingerprint(parse_spec(spec_text))


def view_job(name: str, style: str, seed: int = 0):
    from evalkit.formats.suite import Job

    return Job(id=f"{name}-{style}", clip=name, prompt=style, seed=seed, params=dict(PARAMS))


def metric_device(name: str | None = None):
    """The device ``evalkit compare`` measures on (``--metrics-device``; default: a GPU if any)."""
    from evalkit.metrics._common import resolve_device

    return resolve_device(name)


def use_lpips_weights(path: str | None) -> None:
    """Point the metric engine at an alex LPIPS safetensors file instead of the evalkit cache
    (a GPU machine where ``evalkit setup`` never ran): a temporary ``$EVALKIT_CACHE_DIR`` holding
    it with its checksum. Nothing to do without ``path``."""
    if not path:
        return
    from evalkit.metrics import weights

    cache = Path(tempfile.mkdtemp(prefix="canary_lpips_"))
    folder = cache / "lpips" / weights.LPIPS_VERSION
    folder.mkdir(parents=True)
    shutil.copyfile(path, folder / "alex.safetensors")
    digest = hashlib.sha256((folder / "alex.safetensors").read_bytes()).hexdigest()
    (folder / "checksums.json").write_text(json.dumps({"files": {"alex.safetensors": digest}}))
    os.environ[weights.CACHE_ENV] = str(cache)


class Lpips:
    """Per-frame LPIPS-alex of (N, H, W, 3) uint8 arrays, by the metric engine's model."""

    def __init__(self, device=None):
        from evalkit.metrics.perceptual import get_model

        self.model = get_model("alex", metric_device(device))

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = []
        for i in range(0, len(a), 16):
            x = np.ascontiguousarray(a[i : i + 16].transpose(0, 3, 1, 2))
            y = np.ascontiguousarray(b[i : i + 16].transpose(0, 3, 1, 2))
            out.append(self.model(x, y).cpu().numpy())
        return np.concatenate(out)


def grad_mag(frames: np.ndarray) -> float:
    import cv2

    vals = []
    for f in frames:
        g = cv2.cvtColor(f, cv2.COLOR_RGB2GRAY).astype(np.float32) / 255.0
        gx = cv2.Sobel(g, cv2.CV_32F, 1, 0, ksize=3)
        gy = cv2.Sobel(g, cv2.CV_32F, 0, 1, ksize=3)
        vals.append(float(np.sqrt(gx * gx + gy * gy).mean()))
    return float(np.mean(vals))


def source_flows(src: np.ndarray):
    """For t >= 1: (flow t->t-1, consistency mask) from the source frames."""
    import cv2

    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)
    gray = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in src]
    h, w = gray[0].shape
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    res = []
    for t in range(1, len(gray)):
        bwd = dis.calc(gray[t], gray[t - 1], None)  # cur -> prev
        fwd = dis.calc(gray[t - 1], gray[t], None)  # prev -> cur
        mx, my = gx + bwd[..., 0], gy + bwd[..., 1]
        fwd_at = cv2.remap(fwd, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        err = np.square(bwd + fwd_at).sum(-1)
        mag = np.square(bwd).sum(-1) + np.square(fwd_at).sum(-1)
        inside = (mx >= 0) & (mx <= w - 1) & (my >= 0) & (my <= h - 1)
        mask = (err < 0.01 * mag + 0.5) & inside
        res.append((mx, my, mask))
    return res


def warp_error(out: np.ndarray, flows) -> float:
    import cv2

    errs = []
    for t, (mx, my, mask) in enumerate(flows, start=1):
        prev = cv2.remap(
            out[t - 1].astype(np.float32) / 255.0, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        )
        d = np.abs(out[t].astype(np.float32) / 255.0 - prev).mean(-1)
        errs.append(float(d[mask].mean()) if mask.any() else 0.0)
    return float(np.mean(errs))


def photo_views(size: int = 256) -> dict[str, np.ndarray]:
    import importlib.util

    import cv2

    spec = importlib.util.spec_from_file_location("canary_train", REPO / "tools" / "canary_train.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    find_photo, load_rgb = tool.find_photo, tool.load_rgb

    views = {}
    for name, module, rel in HELD_OUT:
        img = load_rgb(find_photo(module, rel))
        h, w = img.shape[:2]
        s = min(h, w)
        sq = img[(h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
        views[f"{name}_full"] = cv2.resize(sq, (size, size), interpolation=cv2.INTER_AREA)
        q = s // 4
        zoom = sq[q : q + s // 2, q : q + s // 2]
        views[f"{name}_zoom"] = cv2.resize(zoom, (size, size), interpolation=cv2.INTER_AREA)
    return views


def load_canary_suite(path=SUITE):
    from evalkit.formats.suite import load_suite

    return load_suite(path, check_clips=False)


def decode_clip(path) -> np.ndarray:
    import importlib.util

    if importlib.util.find_spec("av") is None:
        # no PyAV (the GPU machine): OpenCV's FFmpeg decodes these FFV1 clips identically
        import cv2

        cap, frames = cv2.VideoCapture(str(path)), []
        while True:
            ok, f = cap.read()
            if not ok:
                break
            frames.append(cv2.cvtColor(f, cv2.COLOR_BGR2RGB))
        if not frames:
            raise RuntimeError(f"{path}: no frames decoded")
        return np.stack(frames)
    from evalkit.video import ClipReader

    return ClipReader(str(path)).read()


# -- quality -------------------------------------------------------------------------------


def cmd_quality(args) -> dict:
    from evalkit.canary.styles import STYLES, apply_style_frames

    lp = Lpips(args.metrics_device)
    views = photo_views()
    if args.max_views:
        views = dict(list(views.items())[: args.max_views])
    suite = load_canary_suite()
    if args.clips == "all":
        clip_jobs = [(c, s) for c in suite.clips for s in STYLES]
    else:
        clip_jobs = [(j.clip, j.prompt) for j in suite.jobs]
    if args.max_clips:
        clip_jobs = clip_jobs[: args.max_clips]
    per_style = {
        s: dict(
            photo_out=[],
            photo_src=[],
            grad_out=[],
            grad_tgt=[],
            clip_out=[],
            clip_src=[],
            warp_canary=[],
            warp_classical=[],
        )
        for s in STYLES
    }
    t0 = time.time()
    src_views = np.stack(list(views.values()))
    photos = FrameSource({name: v[None] for name, v in views.items()})
    clips = suite_sources(suite, args.max_frames)
    with backend_session(args.backend, args.model) as render:
        for style in STYLES:
            tgt = apply_style_frames(style, src_views)
            out = np.stack([render(view_job(name, style), photos).frames[0] for name in views])
            r = per_style[style]
            r["photo_out"] += lp(out, tgt).tolist()
            r["photo_src"] += lp(src_views, tgt).tolist()
            r["grad_out"].append(grad_mag(out))
            r["grad_tgt"].append(grad_mag(tgt))
            print(f"[{time.time() - t0:6.1f}s] photos {style}", flush=True)
        flows_cache = {}
        for clip_id, style in clip_jobs:
            src = clips.get(clip_id)[0]
            if clip_id not in flows_cache:
                flows_cache[clip_id] = source_flows(src)
            tgt = apply_style_frames(style, src)
            out = render(view_job(clip_id, style), clips).frames
            r = per_style[style]
            r["clip_out"].append(float(lp(out, tgt).mean()))
            r["clip_src"].append(float(lp(src, tgt).mean()))
            r["grad_out"].append(grad_mag(out))
            r["grad_tgt"].append(grad_mag(tgt))
            r["warp_canary"].append(warp_error(out, flows_cache[clip_id]))
            r["warp_classical"].append(warp_error(tgt, flows_cache[clip_id]))
            print(f"[{time.time() - t0:6.1f}s] clip {clip_id} {style}", flush=True)
    rows = {}
    for style, r in per_style.items():
        lo = np.mean(r["photo_out"] + r["clip_out"])
        ls = np.mean(r["photo_src"] + r["clip_src"])
        row = dict(
            lpips_out=round(float(lo), 4),
            lpips_src=round(float(ls), 4),
            lpips_ratio=round(float(lo / ls), 3),
            lpips_ratio_photos=round(float(np.mean(r["photo_out"]) / np.mean(r["photo_src"])), 3),
            grad_ratio=round(float(np.mean(r["grad_out"]) / np.mean(r["grad_tgt"])), 3),
        )
        if r["clip_out"]:
            row["lpips_ratio_clips"] = round(float(np.mean(r["clip_out"]) / np.mean(r["clip_src"])), 3)
            row["warp_canary"] = round(float(np.mean(r["warp_canary"])), 4)
            row["warp_classical"] = round(float(np.mean(r["warp_classical"])), 4)
            row["warp_ratio"] = round(row["warp_canary"] / max(row["warp_classical"], 1e-9), 3)
        row["pass"] = bool(
            row["lpips_ratio"] <= 0.7 and row["grad_ratio"] >= 0.7 and row.get("warp_ratio", 0) <= 2.0
        )
        rows[style] = row
    print(f"backend {args.backend}")
    print(f"{'style':22s} {'LPIPS out':>9s} {'src':>6s} {'ratio':>6s} {'grad':>6s} {'warp':>6s} pass")
    for s, r in rows.items():
        print(
            f"{s:22s} {r['lpips_out']:9.4f} {r['lpips_src']:6.4f} {r['lpips_ratio']:6.3f} "
            f"{r['grad_ratio']:6.3f} {r.get('warp_ratio', float('nan')):6.3f} {r['pass']}"
        )
    return dict(
        backend=args.backend,
        params=PARAMS,
        photos=list(views),
        clip_jobs=clip_jobs,
        styles=rows,
        seconds=round(time.time() - t0, 1),
    )


# -- speed ---------------------------------------------------------------------------------


def cmd_speed(args) -> dict:
    """Seconds per render of one clip, as the executor times it (synchronised on a GPU)."""
    import torch

    suite = load_canary_suite()
    sources = suite_sources(suite, args.max_frames)
    frames = sources.get(args.clip)[0]
    job = view_job(args.clip, args.prompt)
    with backend_session(args.backend, args.model) as render:
        render(job, sources)  # warm-up (and, with compile=on, the compilation)
        times = [render(job, sources).timing["seconds"] for _ in range(args.repeats)]
        device = render.runtime.device
    res = dict(
        backend=args.backend,
        clip=args.clip,
        frames=list(frames.shape),
        params=PARAMS,
        seconds=[round(x, 4) for x in times],
        median_s=round(statistics.median(times), 4),
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        device_name=(torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()),
    )
    print(json.dumps(res))
    return res


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


# -- sensitivity ---------------------------------------------------------------------------


def distances(ev, a: dict, b: dict, jobs) -> dict:
    """Per-frame records of the metric engine (as ``evalkit compare`` streams a pair of clips)
    over every job, and their aggregates."""
    from evalkit.compare.aggregate import aggregate
    from evalkit.metrics.stream import stream_pair

    per_job, records = {}, []
    for job in jobs:
        ev.reset()
        recs = list(stream_pair(iter(a[job.id]), iter(b[job.id]), evaluator=ev))
        records += recs
        per_job[job.id] = dict(
            lpips=float(np.mean([r["lpips"] for r in recs])),
            identical=bool(np.array_equal(a[job.id], b[job.id])),
        )
    aggs = {k: aggregate([r.get(k) for r in records], k) for k in ("lpips", "ssim", "psnr")}
    return dict(
        jobs=len(per_job),
        frames=len(records),
        identical_frames=sum(bool(r["identical"]) for r in records),
        identical_jobs=sum(v["identical"] for v in per_job.values()),
        lpips_worst_job=max(v["lpips"] for v in per_job.values()),
        aggregates=aggs,
        per_job=per_job,
    )


def cmd_sensitivity(args) -> dict:
    from evalkit.compare.aggregate import floor_ratio
    from evalkit.metrics.stream import PairEvaluator
    from evalkit.render.backend import parse_spec
    from evalkit.render.driver import select_jobs

    reference = parse_spec(args.reference).spec
    specs = [parse_spec(b).spec for b in (args.backend or [])]
    if reference in specs:
        raise SystemExit(f"--backend {reference}: it is the reference (--reference)")
    if len(set(specs)) != len(specs):
        raise SystemExit("--backend: the same backend is given twice")
    suite = load_canary_suite(args.suite)
    jobs = select_jobs(suite, args.jobs)
    sources = suite_sources(suite, args.max_frames)
    plan = [(s, "", 0) for s in [reference] + specs]
    if args.rerender:
        plan += [(s, " (re-render)", 0) for s in [reference] + specs]
    if args.seed_floor:
        fs = parse_spec(args.seed_floor).spec
        if fs not in [reference] + specs:
            plan.append((fs, "", 0))
        plan.append((fs, " (seed+1)", 1))
    renders, runs = {}, {}
    for spec, tag, offset in plan:
        label = spec + tag
        t0 = time.time()
        res = render_jobs(spec, args.model, jobs, sources, seed_offset=offset)
        renders[label] = {jid: r.frames for jid, r in res.items()}
        runs[label] = dict(
            spec=spec,
            seed_offset=offset,
            seconds=round(time.time() - t0, 2),
            render_seconds=[r.timing["seconds"] for r in res.values()],
        )
        if not tag:
            runs[label]["fingerprint"] = backend_fingerprint(spec)
        print(
            f"{label}: {len(res)} jobs in {time.time() - t0:.1f} s "
            f"(render {sum(runs[label]['render_seconds']):.1f} s)",
            flush=True,
        )
    ev = PairEvaluator(device=metric_device(args.metrics_device), temporal=False)
    pairs = {}
    floor = None
    if args.seed_floor:
        fs = parse_spec(args.seed_floor).spec
        floor = pairs[f"{fs} (seed+1) vs {fs}"] = distances(ev, renders[fs + " (seed+1)"], renders[fs], jobs)
        floor["kind"] = "seed floor"
    for spec in specs:
        pairs[f"{spec} vs {reference}"] = dict(
            kind="backend", **distances(ev, renders[spec], renders[reference], jobs)
        )
    if args.rerender:
        for spec in [reference] + specs:
            pairs[f"{spec} (re-render) vs {spec}"] = dict(
                kind="re-render", **distances(ev, renders[spec + " (re-render)"], renders[spec], jobs)
            )
    for name, p in pairs.items():
        if floor is not None and p is not floor:
            p["floor_ratio"] = floor_ratio(p["aggregates"], floor["aggregates"])
    conventions = ev.conventions
    ev.close()
    print(sensitivity_table(pairs, jobs))
    return dict(
        reference=reference,
        backends=specs,
        suite=str(args.suite),
        jobs=[j.id for j in jobs],
        max_frames=args.max_frames,
        params=PARAMS,
        conventions=conventions,
        runs=runs,
        pairs=pairs,
    )


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "inf"
    return format(v, spec)


def sensitivity_table(pairs: dict, jobs) -> str:
    head = (
        "| pair | LPIPS mean | LPIPS p95 | LPIPS worst frame | worst job (mean) | SSIM mean "
        "| PSNR mean dB | identical frames | identical jobs | LPIPS / seed floor |"
    )
    lines = [head, "|" + "---|" * 10]
    for name, p in pairs.items():
        ag = p["aggregates"]
        ratio = p.get("floor_ratio", {}).get("lpips", {}).get("mean")
        lines.append(
            f"| {name} | {_fmt(ag['lpips']['mean'], '.2e')} | {_fmt(ag['lpips']['p95'], '.2e')} "
            f"| {_fmt(ag['lpips']['worst'], '.2e')} | {_fmt(p['lpips_worst_job'], '.2e')} "
            f"| {_fmt(ag['ssim']['mean'], '.6f')} | {_fmt(ag['psnr']['mean'], '.2f')} "
            f"| {p['identical_frames']}/{p['frames']} | {p['identical_jobs']}/{p['jobs']} "
            f"| {_fmt(ratio, '.4f')} |"
        )
    return "\n".join(lines)


# -- all GPU figures -----------------------------------------------------------------------


def cmd_gpu(args) -> dict:
    """All GPU-side figures; writes ``--out`` after each section (a time limit keeps the rest)."""
    res = {}

    def save():
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(res, indent=1))

    a = argparse.Namespace(**vars(args))
    a.reference, a.backend, a.rerender, a.seed_floor = "cpu", GPU_SENSITIVITY, True, "cuda,dtype=fp32"
    res["sensitivity"] = cmd_sensitivity(a)
    save()
    for spec in ("cuda,dtype=bf16", "cuda,dtype=fp32"):
        a.backend = spec
        res[f"speed {spec}"] = cmd_speed(a)
    save()
    a.backend, a.clips = "cuda,dtype=fp32", "all"
    res["quality cuda,dtype=fp32 (all clips)"] = cmd_quality(a)
    save()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["quality", "speed", "sensitivity", "gpu"])
    ap.add_argument("--model", default=str(REPO / "models/canary"))
    ap.add_argument(
        "--backend",
        "-b",
        action="append",
        default=None,
        metavar="SPEC",
        help="backend spec as `evalkit render -b` takes it (quality and speed: one, "
        "default cpu; sensitivity: repeatable, the backends measured against "
        "--reference)",
    )
    ap.add_argument(
        "--reference",
        default="cpu",
        metavar="SPEC",
        help="sensitivity: the backend every other is measured against (default cpu)",
    )
    ap.add_argument(
        "--rerender",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="sensitivity: render every backend a second time (default on)",
    )
    ap.add_argument(
        "--seed-floor",
        default=None,
        metavar="SPEC",
        help="sensitivity: also render SPEC with seed offset 1, the noise floor",
    )
    ap.add_argument(
        "--suite",
        type=Path,
        default=SUITE,
        help="sensitivity: the suite whose jobs are rendered (default: the canary suite)",
    )
    ap.add_argument(
        "--jobs",
        nargs="*",
        default=None,
        help="sensitivity: job ids, id prefixes or clip ids (default: all 8)",
    )
    ap.add_argument(
        "--max-frames", type=int, default=0, help="cut every suite clip to its first N frames (smoke runs)"
    )
    ap.add_argument("--clips", default="suite", choices=["suite", "all"])
    ap.add_argument("--clip", default="astronaut_pan")
    ap.add_argument("--prompt", default="watercolor")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--metrics-device",
        default=None,
        help="where distances are computed (default: a GPU if any, as evalkit compare)",
    )
    ap.add_argument(
        "--lpips-weights",
        default=os.environ.get("CANARY_LPIPS_WEIGHTS"),
        help="alex LPIPS safetensors (default: $CANARY_LPIPS_WEIGHTS, else the "
        "evalkit cache of `evalkit setup`)",
    )
    ap.add_argument("--max-views", type=int, default=0, help="quality: first N photo views (smoke)")
    ap.add_argument("--max-clips", type=int, default=0, help="quality: first N clip jobs (smoke)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.cmd in ("quality", "speed"):
        if args.backend and len(args.backend) > 1:
            ap.error(f"{args.cmd}: give one --backend")
        args.backend = args.backend[0] if args.backend else "cpu"
    use_lpips_weights(args.lpips_weights)
    res = dict(quality=cmd_quality, speed=cmd_speed, sensitivity=cmd_sensitivity, gpu=cmd_gpu)[args.cmd](args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
