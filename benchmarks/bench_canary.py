#!/usr/bin/env python
"""Quality, speed and backend-sensitivity figures of the shipped canary pipeline.

Subcommands (each prints a table and writes JSON with ``--out``)::

    python benchmarks/bench_canary.py quality      [--device cpu] [--clips suite|all]
    python benchmarks/bench_canary.py speed        [--device cpu --dtype fp32]
    python benchmarks/bench_canary.py sensitivity  --backends cpu:fp32,cpu:bf16
    python benchmarks/bench_canary.py gpu          # on a CUDA machine: all three, GPU backends

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

Sensitivity renders every job of ``datasets/canary/suite.yaml`` on each backend and reports the
mean over frames and jobs of LPIPS, SSIM and PSNR between each pair of backends.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

HELD_OUT = [("astronaut", "skimage.data", "astronaut.png"), ("coffee", "skimage.data", "coffee.png"),
            ("chelsea", "skimage.data", "chelsea.png"), ("rocket", "skimage.data", "rocket.jpg"),
            ("camera", "skimage.data", "camera.png"),
            ("hubble", "skimage.data", "hubble_deep_field.jpg"),
            ("china", "sklearn.datasets", "images/china.jpg"),
            ("flower", "sklearn.datasets", "images/flower.jpg")]
PARAMS = dict(strength=0.6, num_inference_steps=12, guidance_scale=4.0)
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# -- helpers -------------------------------------------------------------------------------


def load_pipe(model: str, device: str, dtype: str):
    import torch

    from evalkit.canary import load_pipeline

    return load_pipeline(model, device=device, dtype=getattr(torch, DTYPES[dtype]))


def render(pipe, frames: np.ndarray, prompt: str, seed: int = 0, **params) -> np.ndarray:
    import torch

    p = dict(PARAMS)
    p.update(params)
    out = pipe(prompt=prompt, video=frames, generator=torch.Generator("cpu").manual_seed(seed),
               output_type="np", **p)
    return out.frames[0]


def to_u8(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


class Lpips:
    def __init__(self, weights: str | None, device: str = "cpu"):
        import lpips
        import torch

        self.torch = torch
        net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
        if weights:
            from safetensors.torch import load_file
            sd = load_file(weights)
        else:
            from metrics.weights import load_state_dict
            sd = load_state_dict("alex")
        net.load_state_dict(sd, strict=False)
        self.net = net.eval().to(device)
        self.device = device

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per-frame LPIPS of two (N, H, W, 3) uint8 arrays."""
        t = self.torch
        out = []
        with t.no_grad():
            for i in range(0, len(a), 16):
                x = t.from_numpy(a[i:i + 16]).permute(0, 3, 1, 2).float().to(self.device) / 127.5 - 1
                y = t.from_numpy(b[i:i + 16]).permute(0, 3, 1, 2).float().to(self.device) / 127.5 - 1
                out.append(self.net(x, y).flatten().cpu().numpy())
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
        bwd = dis.calc(gray[t], gray[t - 1], None)          # cur -> prev
        fwd = dis.calc(gray[t - 1], gray[t], None)          # prev -> cur
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
        prev = cv2.remap(out[t - 1].astype(np.float32) / 255.0, mx, my, cv2.INTER_LINEAR,
                         borderMode=cv2.BORDER_REPLICATE)
        d = np.abs(out[t].astype(np.float32) / 255.0 - prev).mean(-1)
        errs.append(float(d[mask].mean()) if mask.any() else 0.0)
    return float(np.mean(errs))


def photo_views(size: int = 256) -> dict[str, np.ndarray]:
    import cv2

    import importlib.util
    spec = importlib.util.spec_from_file_location("canary_train", REPO / "tools" / "canary_train.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    find_photo, load_rgb = tool.find_photo, tool.load_rgb

    views = {}
    for name, module, rel in HELD_OUT:
        img = load_rgb(find_photo(module, rel))
        h, w = img.shape[:2]
        s = min(h, w)
        sq = img[(h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
        views[f"{name}_full"] = cv2.resize(sq, (size, size), interpolation=cv2.INTER_AREA)
        q = s // 4
        zoom = sq[q:q + s // 2, q:q + s // 2]
        views[f"{name}_zoom"] = cv2.resize(zoom, (size, size), interpolation=cv2.INTER_AREA)
    return views


def suite_jobs():
    import yaml

    suite = yaml.safe_load((REPO / "datasets/canary/suite.yaml").read_text())
    return suite, [(j["clip"], j["prompt"], int(j.get("seed", 0))) for j in suite["jobs"]]


def read_clip(clip_id: str, suite: str = "canary") -> np.ndarray:
    path = REPO / f"datasets/{suite}/clips/{clip_id}.mkv"
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

    pipe = load_pipe(args.model, args.device, args.dtype)
    lp = Lpips(args.lpips_weights, "cuda" if args.device.startswith("cuda") else "cpu")
    views = photo_views()
    if args.max_views:
        views = dict(list(views.items())[: args.max_views])
    suite, jobs = suite_jobs()
    if args.clips == "all":
        clip_jobs = [(c["id"], s) for c in suite["clips"] for s in STYLES]
    else:
        clip_jobs = [(c, p) for c, p, _ in jobs]
    if args.max_clips:
        clip_jobs = clip_jobs[: args.max_clips]
    per_style = {s: dict(photo_out=[], photo_src=[], grad_out=[], grad_tgt=[], clip_out=[],
                         clip_src=[], warp_canary=[], warp_classical=[]) for s in STYLES}
    t0 = time.time()
    src_views = np.stack(list(views.values()))
    for style in STYLES:
        tgt = apply_style_frames(style, src_views)
        out = np.stack([to_u8(render(pipe, v[None], style)[0]) for v in src_views])
        r = per_style[style]
        r["photo_out"] += lp(out, tgt).tolist()
        r["photo_src"] += lp(src_views, tgt).tolist()
        r["grad_out"].append(grad_mag(out))
        r["grad_tgt"].append(grad_mag(tgt))
        print(f"[{time.time() - t0:6.1f}s] photos {style}", flush=True)
    flows_cache = {}
    for clip_id, style in clip_jobs:
        src = read_clip(clip_id)
        if clip_id not in flows_cache:
            flows_cache[clip_id] = source_flows(src)
        tgt = apply_style_frames(style, src)
        out = to_u8(render(pipe, src, style))
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
        row = dict(lpips_out=round(float(lo), 4), lpips_src=round(float(ls), 4),
                   lpips_ratio=round(float(lo / ls), 3),
                   lpips_ratio_photos=round(float(np.mean(r["photo_out"]) / np.mean(r["photo_src"])), 3),
                   grad_ratio=round(float(np.mean(r["grad_out"]) / np.mean(r["grad_tgt"])), 3))
        if r["clip_out"]:
            row["lpips_ratio_clips"] = round(float(np.mean(r["clip_out"]) / np.mean(r["clip_src"])), 3)
            row["warp_canary"] = round(float(np.mean(r["warp_canary"])), 4)
            row["warp_classical"] = round(float(np.mean(r["warp_classical"])), 4)
            row["warp_ratio"] = round(row["warp_canary"] / max(row["warp_classical"], 1e-9), 3)
        row["pass"] = bool(row["lpips_ratio"] <= 0.7 and row["grad_ratio"] >= 0.7 and
                           row.get("warp_ratio", 0) <= 2.0)
        rows[style] = row
    print(f"{'style':22s} {'LPIPS out':>9s} {'src':>6s} {'ratio':>6s} {'grad':>6s} {'warp':>6s} pass")
    for s, r in rows.items():
        print(f"{s:22s} {r['lpips_out']:9.4f} {r['lpips_src']:6.4f} {r['lpips_ratio']:6.3f} "
              f"{r['grad_ratio']:6.3f} {r.get('warp_ratio', float('nan')):6.3f} {r['pass']}")
    return dict(device=args.device, dtype=args.dtype, params=PARAMS, photos=list(views),
                clip_jobs=clip_jobs, styles=rows, seconds=round(time.time() - t0, 1))


# -- speed ---------------------------------------------------------------------------------


def cmd_speed(args) -> dict:
    import torch

    pipe = load_pipe(args.model, args.device, args.dtype)
    frames = read_clip(args.clip)
    sync = (lambda: torch.cuda.synchronize()) if args.device.startswith("cuda") else (lambda: None)
    render(pipe, frames, args.prompt)          # warm-up
    times = []
    for _ in range(args.repeats):
        sync()
        t = time.perf_counter()
        render(pipe, frames, args.prompt)
        sync()
        times.append(time.perf_counter() - t)
    res = dict(device=args.device, dtype=args.dtype, clip=args.clip, frames=list(frames.shape),
               params=PARAMS, seconds=[round(x, 4) for x in times],
               median_s=round(statistics.median(times), 4), threads=torch.get_num_threads(),
               cpu_count=os.cpu_count(),
               device_name=(torch.cuda.get_device_name(0) if args.device.startswith("cuda")
                            else _cpu_name()))
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


def cmd_sensitivity(args) -> dict:
    from skimage.metrics import structural_similarity

    backends = args.backends.split(",")
    _, jobs = suite_jobs()
    renders: dict[str, dict] = {}
    skipped = {}
    for b in backends:
        device, dtype = b.split(":")
        pipe = load_pipe(args.model, device, dtype)
        renders[b] = {}
        t0 = time.time()
        for clip, prompt, seed in jobs:
            if args.budget_s and time.time() - t0 > args.budget_s:
                skipped[b] = skipped.get(b, 0) + 1
                continue
            renders[b][clip] = to_u8(render(pipe, read_clip(clip), prompt, seed))
        print(f"{b}: {len(renders[b])} jobs in {time.time() - t0:.1f}s", flush=True)
        del pipe
    lp = Lpips(args.lpips_weights, "cuda" if any(b.startswith("cuda") for b in backends) else "cpu")
    pairs = {}
    for a, b in itertools.combinations(backends, 2):
        common = [c for c, _, _ in jobs if c in renders[a] and c in renders[b]]
        per_job = {}
        for c in common:
            x, y = renders[a][c], renders[b][c]
            ssim = [structural_similarity(p, q, channel_axis=2, data_range=255) for p, q in zip(x, y)]
            mse = ((x.astype(np.float64) - y.astype(np.float64)) ** 2).mean(axis=(1, 2, 3))
            psnr = [float(10 * np.log10(255.0 ** 2 / m)) if m > 0 else float("inf") for m in mse]
            per_job[c] = dict(lpips=float(lp(x, y).mean()), ssim=float(np.mean(ssim)),
                              psnr=float(np.mean([min(p, 100.0) for p in psnr])),
                              identical=bool(np.array_equal(x, y)))
        if per_job:
            pairs[f"{a} vs {b}"] = dict(
                jobs=len(per_job),
                lpips=round(float(np.mean([v["lpips"] for v in per_job.values()])), 5),
                lpips_max=round(float(np.max([v["lpips"] for v in per_job.values()])), 5),
                ssim=round(float(np.mean([v["ssim"] for v in per_job.values()])), 5),
                psnr=round(float(np.mean([v["psnr"] for v in per_job.values()])), 2),
                per_job=per_job)
            print(f"{a} vs {b}: {json.dumps({k: v for k, v in pairs[f'{a} vs {b}'].items() if k != 'per_job'})}",
                  flush=True)
    return dict(backends=backends, params=PARAMS, pairs=pairs, skipped_jobs=skipped)


def cmd_gpu(args) -> dict:
    """All GPU-side figures; writes ``--out`` after each section (a time limit keeps the rest)."""
    res = {}

    def save():
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1))

    a = argparse.Namespace(**vars(args))
    a.device, a.dtype = "cuda", "bf16"
    res["speed_cuda_bf16"] = cmd_speed(a)
    a.dtype = "fp32"
    res["speed_cuda_fp32"] = cmd_speed(a)
    save()
    a.backends = "cuda:bf16,cuda:fp32,cpu:fp32"
    a.budget_s = 0
    res["sensitivity"] = cmd_sensitivity(a)
    save()
    if args.with_cpu_bf16:
        a.backends, a.budget_s = "cpu:fp32,cpu:bf16", args.cpu_bf16_budget
        res["sensitivity_cpu_bf16"] = cmd_sensitivity(a)
        save()
    a.device, a.dtype, a.clips = "cuda", "fp32", "all"
    res["quality_cuda_fp32_all_clips"] = cmd_quality(a)
    save()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["quality", "speed", "sensitivity", "gpu"])
    ap.add_argument("--model", default=str(REPO / "models/canary"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--clips", default="suite", choices=["suite", "all"])
    ap.add_argument("--clip", default="astronaut_pan")
    ap.add_argument("--prompt", default="watercolor")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default="cpu:fp32,cpu:bf16")
    ap.add_argument("--budget-s", type=float, default=0, help="per-backend render time cap")
    ap.add_argument("--with-cpu-bf16", action="store_true")
    ap.add_argument("--cpu-bf16-budget", type=float, default=60)
    ap.add_argument("--lpips-weights", default=os.environ.get("CANARY_LPIPS_WEIGHTS"),
                    help="alex LPIPS safetensors (default: $CANARY_LPIPS_WEIGHTS, else the cache)")
    ap.add_argument("--max-views", type=int, default=0, help="quality: first N photo views (smoke)")
    ap.add_argument("--max-clips", type=int, default=0, help="quality: first N clip jobs (smoke)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    res = dict(quality=cmd_quality, speed=cmd_speed, sensitivity=cmd_sensitivity,
               gpu=cmd_gpu)[args.cmd](args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
