"""Speed of metrics/ against a naive per-frame loop over the reference packages, side by side.

    .venv/bin/python benchmarks/bench_metrics.py                       # CPU, 256x256, 32 pairs
    .venv/bin/python benchmarks/bench_metrics.py --device cuda --size 1280x720 --frames 200
    .venv/bin/python benchmarks/bench_metrics.py --memory 300 --size 1280x720   # peak RSS, ours only

Both sides compute the full metric set on the same synthetic pair (a moving texture; B is A
plus noise and a slight brightness flicker) on the same device:

* ours  -- metrics.stream.PairEvaluator: one LPIPS trunk pass per frame reused by tLP, batched
  frames, torch SSIM/PSNR, OpenCV DIS flow (or whatever --flow/--flow-preset/--flow-scale say).
* naive -- one call per quantity: ``lpips.LPIPS`` forward for LPIPS(a_t, b_t) and once per tLP
  term, scikit-image SSIM on the rounded luma, numpy PSNR, OpenCV Farneback for every flow
  (forward and backward on each clip), numpy/OpenCV warping, tOF and flicker.

It prints pairs/s of each side and their ratio, the agreement of the shared numbers, and the
process's peak resident memory. Model loading and one warm-up chunk are excluded from timing.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metrics.stream import PairEvaluator, auto_chunk, stream_pair  # noqa: E402


def synthetic_pair(n: int, h: int, w: int, seed: int = 0):
    """Two iterators of (H, W, 3) uint8 frames; nothing but a texture tile is held in memory."""
    rng = np.random.default_rng(seed)
    small = rng.random((h // 8 + 4, w // 8 + 4 + n // 4 + 2, 3)).astype(np.float32)
    import cv2

    tex = cv2.resize(small, (small.shape[1] * 8, small.shape[0] * 8), interpolation=cv2.INTER_CUBIC)
    tex = np.clip(tex * 255, 0, 255).astype(np.uint8)
    noise = [rng.integers(-4, 5, (h, w, 3), dtype=np.int16) for _ in range(4)]

    def frame_a(t):
        x = (2 * t) % (tex.shape[1] - w)
        return np.ascontiguousarray(tex[8:8 + h, x:x + w])

    def gen_a():
        for t in range(n):
            yield frame_a(t)

    def gen_b():
        for t in range(n):
            f = frame_a(t).astype(np.int16) + noise[t % 4] + (2 if t % 2 else -2)
            yield np.clip(f, 0, 255).astype(np.uint8)

    return gen_a, gen_b


# -- ours -------------------------------------------------------------------------------------

def run_ours(gen_a, gen_b, args, device):
    ev = PairEvaluator(device=device, net=args.net, flow=args.flow, flow_preset=args.flow_preset,
                       flow_scale=args.flow_scale, temporal=not args.no_temporal)
    # warm-up on one chunk (not timed)
    list(stream_pair((f for _, f in zip(range(args.chunk), gen_a())),
                     (f for _, f in zip(range(args.chunk), gen_b())), evaluator=ev, chunk=args.chunk))
    ev.reset()
    sync(device)
    t = time.perf_counter()
    recs = list(stream_pair(gen_a(), gen_b(), evaluator=ev, chunk=args.chunk))
    sync(device)
    dt = time.perf_counter() - t
    ev.close()
    return dt, recs


# -- naive --------------------------------------------------------------------------------------

def run_naive(gen_a, gen_b, n, args, device):
    import cv2
    import lpips
    from skimage.metrics import structural_similarity

    from metrics import _weights

    model = lpips.LPIPS(net=args.net, pnet_rand=True, verbose=False)
    model.load_state_dict(_weights.load_state_dict(args.net), strict=False)
    model = model.eval().to(device)
    fb = (0.5, 3, 15, 3, 5, 1.2, 0)

    def to_t(f):
        return torch.from_numpy(f).permute(2, 0, 1)[None].to(device).float() / 127.5 - 1

    def lum(f):
        x = f.astype(np.float64)
        return np.round(0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2])

    def flow(p, q):
        return cv2.calcOpticalFlowFarneback(p, q, None, *fb)

    def warp_err(prev, cur, bwd, fwd):
        h, w = bwd.shape[:2]
        gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
        mx, my = gx + bwd[..., 0], gy + bwd[..., 1]
        warped = cv2.remap(prev.astype(np.float32) / 255, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        f_at = cv2.remap(fwd, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        s = bwd + f_at
        ok = ((s ** 2).sum(-1) <= 0.01 * ((bwd ** 2).sum(-1) + (f_at ** 2).sum(-1)) + 0.5)
        ok &= (mx >= 0) & (mx <= w - 1) & (my >= 0) & (my <= h - 1)
        d = ((warped - cur.astype(np.float32) / 255) ** 2).sum(-1)
        return float(d[ok].sum() / (3 * ok.sum())) if ok.any() else float("nan")

    def lowpass(f):
        y = f.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        h, w = (y.shape[0] // 16) * 16, (y.shape[1] // 16) * 16
        return y[:h, :w].reshape(h // 16, 16, w // 16, 16).mean((1, 3))

    def one_frame(pa, pb, a, b):
        rec = {}
        with torch.no_grad():
            rec["lpips"] = model(to_t(a), to_t(b)).item()
        rec["ssim"] = structural_similarity(lum(a), lum(b), gaussian_weights=True, sigma=1.5,
                                            use_sample_covariance=False, data_range=255)
        mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()
        rec["psnr"] = 10 * np.log10(255 ** 2 / mse) if mse else float("inf")
        if pa is not None and not args.no_temporal:
            with torch.no_grad():
                rec["tlp"] = abs(model(to_t(a), to_t(pa)).item() - model(to_t(b), to_t(pb)).item())
            ga, gpa = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), cv2.cvtColor(pa, cv2.COLOR_RGB2GRAY)
            gb, gpb = cv2.cvtColor(b, cv2.COLOR_RGB2GRAY), cv2.cvtColor(pb, cv2.COLOR_RGB2GRAY)
            fa, ba = flow(gpa, ga), flow(ga, gpa)
            fbw, bb = flow(gpb, gb), flow(gb, gpb)
            rec["tof"] = float(np.sqrt(((fa - fbw) ** 2).sum(-1)).mean())
            rec["warp_error_a"] = warp_err(pa, a, ba, fa)
            rec["warp_error_b"] = warp_err(pb, b, bb, fbw)
            rec["flicker"] = float(np.abs((lowpass(a) - lowpass(pa)) - (lowpass(b) - lowpass(pb))).mean())
        return rec

    # warm-up
    fa0, fb0 = next(gen_a()), next(gen_b())
    one_frame(fa0, fb0, fa0, fb0)
    sync(device)
    t = time.perf_counter()
    recs, pa, pb = [], None, None
    for _, a, b in zip(range(n), gen_a(), gen_b()):
        recs.append(one_frame(pa, pb, a, b))
        pa, pb = a, b
    sync(device)
    return time.perf_counter() - t, recs


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    p.add_argument("--size", default="256x256", help="WxH (default 256x256)")
    p.add_argument("--frames", type=int, default=32, help="pairs timed for ours (default 32)")
    p.add_argument("--naive-frames", type=int, default=None, help="pairs timed for naive (default: --frames)")
    p.add_argument("--chunk", type=int, default=None, help="frames per batch (default: auto_chunk)")
    p.add_argument("--net", default="alex", choices=("alex", "vgg"))
    p.add_argument("--flow", default="dis", choices=("dis", "farneback"))
    p.add_argument("--flow-preset", default="medium", choices=("ultrafast", "fast", "medium"))
    p.add_argument("--flow-scale", type=float, default=1.0)
    p.add_argument("--no-temporal", action="store_true", help="LPIPS/SSIM/PSNR/exactness only")
    p.add_argument("--memory", type=int, default=0, metavar="N",
                   help="stream N pairs through ours only and report peak RSS (no naive run)")
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    dev = torch.device(args.device)
    if args.chunk is None:
        args.chunk = auto_chunk(h, w, dev)
    print(f"device {dev} | size {w}x{h} | torch {torch.__version__} | threads {torch.get_num_threads()} "
          f"| cpus {os.cpu_count()} | net {args.net} | flow ours {args.flow}-{args.flow_preset} "
          f"x{args.flow_scale:g}, naive farneback | chunk {args.chunk}")

    if args.memory:
        gen_a, gen_b = synthetic_pair(args.memory, h, w)
        rss0 = peak_rss_mb()
        dt, recs = run_ours(gen_a, gen_b, args, dev)
        print(f"memory: {len(recs)} pairs streamed in {dt:.1f} s ({len(recs) / dt:.2f} pairs/s); "
              f"peak RSS {peak_rss_mb():.0f} MB (after model load {rss0:.0f} MB)")
        if dev.type == "cuda":
            print(f"peak GPU memory {torch.cuda.max_memory_allocated(dev) / 2**20:.0f} MB")
        return 0

    n_ours = args.frames
    n_naive = args.naive_frames or args.frames
    gen_a, gen_b = synthetic_pair(max(n_ours, n_naive), h, w)
    ga_o = lambda: (f for _, f in zip(range(n_ours), gen_a()))  # noqa: E731
    gb_o = lambda: (f for _, f in zip(range(n_ours), gen_b()))  # noqa: E731
    dt_o, ro = run_ours(ga_o, gb_o, args, dev)
    dt_n, rn = run_naive(gen_a, gen_b, n_naive, args, dev)
    ps_o, ps_n = n_ours / dt_o, n_naive / dt_n
    what = "LPIPS+SSIM+PSNR+exactness" if args.no_temporal else \
        "full set (LPIPS, SSIM, PSNR, exactness, tLP, tOF, warping error x2, flicker)"
    print(f"metric set: {what}")
    print(f"ours : {n_ours:4d} pairs in {dt_o:7.2f} s = {ps_o:8.2f} pairs/s")
    print(f"naive: {n_naive:4d} pairs in {dt_n:7.2f} s = {ps_n:8.2f} pairs/s")
    print(f"ratio ours/naive: {ps_o / ps_n:.2f}x")
    m = min(n_ours, n_naive)
    for k in ("lpips", "ssim", "psnr", "tlp", "tof", "warp_error_a", "flicker"):
        xs = [(r1[k], r2[k]) for r1, r2 in zip(ro[:m], rn[:m]) if k in r1 and k in r2]
        if xs:
            d = max(abs(x - y) for x, y in xs)
            note = "" if k in ("lpips", "ssim", "psnr", "tlp", "flicker") else \
                " (flow method differs unless --flow farneback)"
            print(f"  agreement {k:<13} max |ours - naive| = {d:.2e}{note}")
    print(f"peak RSS {peak_rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
