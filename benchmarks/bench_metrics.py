"""Speed of metrics/ against a naive per-frame loop over the reference packages, side by side.

    .venv/bin/python benchmarks/bench_metrics.py                       # CPU, 256x256, full set
    .venv/bin/python benchmarks/bench_metrics.py --part fidelity       # LPIPS+SSIM+PSNR+exactness
    .venv/bin/python benchmarks/bench_metrics.py --part memory --memory 2000 --size 1280x720
    # everything for one machine, each part in its own process (with a time limit), results
    # and a summary in OUT/:
    PYTHONPATH=. python benchmarks/bench_metrics.py --device cuda --size 1280x720 --out OUT
    bash benchmarks/device_metrics.sh OUT                              # the same, GPU defaults

Parts (``--part``):

* ``fidelity`` -- LPIPS+SSIM+PSNR+exactness, ours against naive;
* ``full``     -- the full set (+ tLP, tOF, warping error on both clips, flicker), ours against
  naive, then the capacity of the optical-flow thread pool for each DIS preset (flows/s with
  the evaluator's number of flow threads; the full set needs 4 flows per pair);
* ``memory``   -- N pairs (``--memory``, default 2,000) streamed through ours: peak resident
  memory (and GPU memory).

Both sides compute on the same synthetic pair (a moving texture; B is A plus noise and a
slight brightness flicker), on the same device, from frames already in memory (a cycle of 32
distinct frames, so decoding or generating frames is not what is timed):

* ours  -- evalkit.metrics.stream.stream_pair / PairEvaluator: frames staged once (pinned, one copy per
  chunk), one LPIPS trunk pass per frame reused by tLP, torch SSIM/PSNR on the device, OpenCV
  DIS flow in a thread pool overlapping the device work, warping on the device.
* naive -- one call per quantity: ``lpips.LPIPS`` forward for LPIPS(a_t, b_t) and once per tLP
  term, scikit-image SSIM on the rounded luma, numpy PSNR, OpenCV Farneback for every flow
  (forward and backward on each clip), numpy/OpenCV warping, tOF and flicker.

Ours is warmed up first (model load, cuDNN autotuning, thread pools, pinned buffers: three
chunks, not timed), then timed over a steady run of at least ``--seconds`` and ``--frames``
pairs (a whole number of chunks); the naive loop is warmed up on one pair and timed over a few
pairs (``--naive-frames``), which is enough for its rate. Each part prints pairs/s of each side,
their ratio, the agreement of the shared numbers, where ours spent its time, and peak memory.
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

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

from evalkit.metrics._common import resolve_device  # noqa: E402
from evalkit.metrics.flow import DEFAULT_PRESET, DIS_PRESETS  # noqa: E402
from evalkit.metrics.stream import PairEvaluator, auto_chunk, default_flow_workers, stream_pair  # noqa: E402

PARTS = ("fidelity", "full", "memory")
#: Targets of issue #3 (pairs/s, ratio to naive) by (device type, part).
TARGETS = {("cuda", "fidelity"): (400, None), ("cuda", "full"): (100, 50), ("cpu", "full"): (None, 3)}
#: Seconds each part may take when ``--out`` runs them all (process start and model load included).
PART_LIMITS = {"fidelity": 55, "full": 75, "memory": 80}
CYCLE = 32


def synthetic_pair(n: int, h: int, w: int, seed: int = 0, cycle: int = CYCLE):
    """Two iterator factories of (H, W, 3) uint8 frames, frame t = frame t mod ``cycle``.

    The ``cycle`` distinct frames of each clip are made once, up front: timing covers the
    metrics, not the making of frames. The texture moves by 2 pixels per frame.
    """
    import cv2

    rng = np.random.default_rng(seed)
    k = min(n, cycle)
    small = rng.random((h // 8 + 4, w // 8 + 4 + k // 4 + 2, 3)).astype(np.float32)
    tex = cv2.resize(small, (small.shape[1] * 8, small.shape[0] * 8), interpolation=cv2.INTER_CUBIC)
    tex = np.clip(tex * 255, 0, 255).astype(np.uint8)
    noise = [rng.integers(-4, 5, (h, w, 3), dtype=np.int16) for _ in range(4)]

    def frame_a(t):
        x = (2 * t) % (tex.shape[1] - w)
        return np.ascontiguousarray(tex[8 : 8 + h, x : x + w])

    def frame_b(t):
        f = frame_a(t).astype(np.int16) + noise[t % 4] + (2 if t % 2 else -2)
        return np.clip(f, 0, 255).astype(np.uint8)

    fa = [frame_a(t) for t in range(k)]
    fb = [frame_b(t) for t in range(k)]

    def gen(frames, count):
        def g():
            for t in range(n if count is None else count):
                yield frames[t % k]

        return g

    return gen(fa, None), gen(fb, None), (lambda count: gen(fa, count)), (lambda count: gen(fb, count))


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- ours -------------------------------------------------------------------------------------


def make_evaluator(args, device, temporal):
    return PairEvaluator(
        device=device,
        net=args.net,
        flow=args.flow,
        flow_preset=args.flow_preset,
        flow_scale=args.flow_scale,
        temporal=temporal,
        flow_workers=args.flow_workers,
    )


def run_ours(
    count_a, count_b, args, device, temporal, *, min_frames, seconds, max_frames, max_seconds=float("inf")
):
    """Warm up on three chunks, then time a steady run of whole chunks.

    The run stops at the first chunk boundary where both ``min_frames`` pairs and ``seconds``
    have passed, or ``max_seconds`` have (or at ``max_frames``). Returns (seconds, records,
    evaluator timings, evaluator).
    """
    ev = make_evaluator(args, device, temporal)
    c = args.chunk
    list(stream_pair(count_a(3 * c)(), count_b(3 * c)(), evaluator=ev, chunk=c))  # warm-up
    sync(device)
    ev.reset()
    state = {"t0": None, "n": 0}

    # a decides at chunk boundaries when to stop; b stops at the same count (stream_pair reads
    # a's chunk before b's, so the count is known in time)
    def gen_a():
        for i, f in enumerate(count_a(max_frames)()):
            if i % c == 0 and i > 0:
                elapsed = time.perf_counter() - state["t0"]
                if (i >= min_frames and elapsed >= seconds) or elapsed >= max_seconds:
                    break
            yield f
            state["n"] = i + 1
        state["stop"] = state["n"]

    def gen_b():
        for i, f in enumerate(count_b(max_frames)()):
            if i >= state.get("stop", max_frames):
                return
            yield f

    sync(device)
    state["t0"] = time.perf_counter()
    recs = list(stream_pair(gen_a(), gen_b(), evaluator=ev, chunk=c))
    sync(device)
    dt = time.perf_counter() - state["t0"]
    return dt, recs, dict(ev.timings), ev


# -- naive --------------------------------------------------------------------------------------


def run_naive(gen_a, gen_b, n, args, device, temporal):
    """The baseline, by design outside evalkit: the ``lpips`` package's model and its inputs
    placed on the metric engine's device by hand, on PyTorch's numeric defaults (on a GPU cuDNN
    may use TF32 there, which the engine never does), so its LPIPS agreement with ours on a GPU
    includes that rounding."""
    import cv2
    import lpips
    from skimage.metrics import structural_similarity

    from evalkit.metrics import weights as _weights

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
        warped = cv2.remap(
            prev.astype(np.float32) / 255, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        )
        f_at = cv2.remap(fwd, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        s = bwd + f_at
        ok = (s**2).sum(-1) <= 0.01 * ((bwd**2).sum(-1) + (f_at**2).sum(-1)) + 0.5
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
        rec["ssim"] = structural_similarity(
            lum(a), lum(b), gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255
        )
        mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()
        rec["psnr"] = 10 * np.log10(255**2 / mse) if mse else float("inf")
        if pa is not None and temporal:
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

    # warm-up (first CUDA calls, lazy imports)
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


# -- parts ----------------------------------------------------------------------------------------


def header(args, dev, w, h, part):
    import cv2

    return (
        f"device {dev} | size {w}x{h} | torch {torch.__version__} | opencv {cv2.__version__} "
        f"| torch threads {torch.get_num_threads()} | cpus {os.cpu_count()} | net {args.net} "
        f"| flow ours {args.flow}-{args.flow_preset} x{args.flow_scale:g} "
        f"({args.flow_workers if args.flow_workers is not None else default_flow_workers(dev)} flow threads), "
        f"naive farneback | chunk {args.chunk} | part {part}"
    )


def part_compare(args, dev, w, h, temporal, out):
    n_naive = args.naive_frames
    _, _, count_a, count_b = synthetic_pair(max(args.frames, n_naive, 3 * args.chunk, CYCLE), h, w)
    dt_o, ro, timings, ev = run_ours(
        count_a,
        count_b,
        args,
        dev,
        temporal,
        min_frames=args.frames,
        seconds=args.seconds,
        max_frames=args.max_frames,
        max_seconds=args.max_seconds,
    )
    conventions = ev.conventions
    flow_workers = ev.flow_workers
    ev.close()
    dt_n, rn = run_naive(count_a(n_naive), count_b(n_naive), n_naive, args, dev, temporal)
    n_ours = len(ro)
    ps_o, ps_n = n_ours / dt_o, n_naive / dt_n
    what = (
        "full set (LPIPS, SSIM, PSNR, exactness, tLP, tOF, warping error x2, flicker)"
        if temporal
        else "LPIPS+SSIM+PSNR+exactness"
    )
    out(f"metric set: {what}")
    out(f"ours : {n_ours:5d} pairs in {dt_o:7.2f} s = {ps_o:8.2f} pairs/s (after warm-up)")
    out(f"naive: {n_naive:5d} pairs in {dt_n:7.2f} s = {ps_n:8.2f} pairs/s")
    out(f"ratio ours/naive: {ps_o / ps_n:.2f}x")
    m = min(n_ours, n_naive)
    for k in ("lpips", "ssim", "psnr", "tlp", "tof", "warp_error_a", "flicker"):
        xs = [(r1[k], r2[k]) for r1, r2 in zip(ro[:m], rn[:m]) if k in r1 and k in r2]
        if xs:
            d = max(abs(x - y) for x, y in xs)
            note = (
                ""
                if k in ("lpips", "ssim", "psnr", "tlp", "flicker")
                else " (flow method differs unless --flow farneback)"
            )
            out(f"  agreement {k:<13} max |ours - naive| = {d:.2e}{note}")
    busy = ", ".join(f"{k} {v:.2f} s" for k, v in timings.items())
    out(f"ours, where the main thread spent its time: {busy} (of {dt_o:.2f} s)")
    res = {
        "part": "full" if temporal else "fidelity",
        "device": str(dev),
        "size": f"{w}x{h}",
        "ours_pairs": n_ours,
        "ours_s": dt_o,
        "ours_pairs_per_s": ps_o,
        "naive_pairs": n_naive,
        "naive_s": dt_n,
        "naive_pairs_per_s": ps_n,
        "ratio": ps_o / ps_n,
        "timings": timings,
        "flow_workers": flow_workers,
        "conventions": conventions,
        "chunk": args.chunk,
    }
    if temporal and dev.type == "cuda" or args.flow_capacity:
        res["flow_capacity"] = flow_capacity(args, h, w, flow_workers or 1, out)
    if not temporal and dev.type == "cuda" or args.lpips_alone:
        res["lpips_alone_pairs_per_s"] = lpips_alone(args, dev, h, w, count_a, count_b, out)
    return res


def lpips_alone(args, dev, h, w, count_a, count_b, out, seconds=3.0):
    """LPIPS only (trunk + distances), on frames already on the device: the compute ceiling."""
    from evalkit.metrics._common import as_frames, precise
    from evalkit.metrics.perceptual import get_model

    c = args.chunk
    model = get_model(args.net, dev)
    a = as_frames(np.stack(list(count_a(c)())).transpose(0, 3, 1, 2), "a", device=dev)
    b = as_frames(np.stack(list(count_b(c)())).transpose(0, 3, 1, 2), "b", device=dev)
    x = torch.cat([a, b]).float().div_(255).contiguous()
    rates = {}
    for bench in (False, True) if dev.type == "cuda" else (False,):
        with precise(bench):
            for _ in range(3):
                f = model.features(x)
                model.distance([t[:c] for t in f], [t[c:] for t in f])
            sync(dev)
            n, t = 0, time.perf_counter()
            while time.perf_counter() - t < seconds:
                f = model.features(x)
                d = model.distance([t_[:c] for t_ in f], [t_[c:] for t_ in f])
                d.sum().item()
                n += c
            rates[bench] = n / (time.perf_counter() - t)
        out(
            f"  LPIPS alone (frames on the device, fp32, cuDNN autotune {'on' if bench else 'off'}): "
            f"{rates[bench]:.0f} pairs/s"
        )
    return rates[max(rates)]


def flow_capacity(args, h, w, workers, out):
    """Flows/s of a pool of ``workers`` threads for each DIS preset (OpenCV threads set to 1)."""
    from concurrent.futures import ThreadPoolExecutor

    import cv2

    from evalkit.metrics.flow import flow_u8

    ga, _, _, _ = synthetic_pair(8, h, w)
    grey = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in ga()]
    saved = cv2.getNumThreads()
    cv2.setNumThreads(1)
    caps = {}
    try:
        with ThreadPoolExecutor(workers) as pool:
            for preset in DIS_PRESETS:
                list(pool.map(lambda i: flow_u8(grey[i % 7], grey[i % 7 + 1], "dis", preset), range(workers)))
                n = 4 * workers
                t = time.perf_counter()
                list(pool.map(lambda i: flow_u8(grey[i % 7], grey[i % 7 + 1], "dis", preset), range(n)))
                dt = time.perf_counter() - t
                caps[preset] = n / dt
                out(
                    f"  flow pool capacity, dis-{preset:<9} {workers:2d} threads: {n / dt:7.1f} flows/s "
                    f"= {n / dt / 4:6.1f} pairs/s ceiling (4 flows per pair)"
                )
    finally:
        cv2.setNumThreads(saved)
    return caps


def part_memory(args, dev, w, h, out):
    _, _, count_a, count_b = synthetic_pair(max(args.memory, CYCLE), h, w)
    rss0 = peak_rss_mb()
    ev = make_evaluator(args, dev, True)
    sync(dev)
    t = time.perf_counter()
    n = 0
    for _ in stream_pair(count_a(args.memory)(), count_b(args.memory)(), evaluator=ev, chunk=args.chunk):
        n += 1
        if n % 250 == 0:  # progress, in case a time limit stops the run
            out(f"  {n} pairs in {time.perf_counter() - t:.1f} s, peak RSS so far {peak_rss_mb():.0f} MB")
    sync(dev)
    dt = time.perf_counter() - t
    ev.close()
    rss = peak_rss_mb()
    out(
        f"memory: {n} pairs streamed in {dt:.1f} s ({n / dt:.2f} pairs/s, cold start included); "
        f"peak RSS {rss:.0f} MB (before the evaluator {rss0:.0f} MB; target < 3000 MB)"
    )
    res = {
        "part": "memory",
        "device": str(dev),
        "size": f"{w}x{h}",
        "pairs": n,
        "seconds": dt,
        "pairs_per_s": n / dt,
        "peak_rss_mb": rss,
        "rss_before_mb": rss0,
        "chunk": args.chunk,
    }
    if dev.type == "cuda":
        res["peak_gpu_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
        out(f"peak GPU memory {res['peak_gpu_mb']:.0f} MB")
    return res


# -- orchestration ----------------------------------------------------------------------------------


def run_all(args, argv):
    """Each part in its own process (clean peak-memory figures, a time limit per part)."""
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = [a for a in argv if a not in ("--out", args.out)]
    for part in args.parts.split(","):
        cmd = [sys.executable, str(Path(__file__).resolve()), *base, "--part", part, "--out", str(out_dir)]
        limit = PART_LIMITS.get(part, 90) * args.limit_scale
        t = time.perf_counter()
        try:
            r = subprocess.run(cmd, timeout=limit, capture_output=True, text=True)
            status = "ok" if r.returncode == 0 else f"exit {r.returncode}"
            log = r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            status = f"timed out after {limit:.0f} s"
            log = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        (out_dir / f"{part}.log").write_text(log)
        print(f"[{part}] {status} in {time.perf_counter() - t:.0f} s", flush=True)
        if status != "ok":
            print("\n".join(log.strip().splitlines()[-15:]))
    print(summarize(out_dir))
    return 0


def summarize(out_dir: Path) -> str:
    lines = [f"metrics benchmark summary ({out_dir})"]
    for part in PARTS:
        f = out_dir / f"{part}.json"
        if not f.is_file():
            lines.append(f"  {part:<8} no result (see {part}.log)")
            continue
        r = json.loads(f.read_text())
        dev = r["device"].split(":")[0]
        if part == "memory":
            gpu = f", peak GPU {r['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in r else ""
            ok = "met" if r["peak_rss_mb"] < 3000 else "MISSED"
            lines.append(
                f"  memory   {r['pairs']} pairs at {r['size']}: peak RSS {r['peak_rss_mb']:.0f} MB "
                f"(target < 3000: {ok}){gpu}, {r['pairs_per_s']:.1f} pairs/s cold"
            )
            continue
        target = TARGETS.get((dev, part), (None, None))
        verdict = []
        if target[0]:
            verdict.append(
                f">= {target[0]} pairs/s: {'met' if r['ours_pairs_per_s'] >= target[0] else 'MISSED'}"
            )
        if target[1]:
            verdict.append(f">= {target[1]}x: {'met' if r['ratio'] >= target[1] else 'MISSED'}")
        lines.append(
            f"  {part:<8} {r['size']} {r['device']}: ours {r['ours_pairs_per_s']:.1f} pairs/s "
            f"({r['ours_pairs']} pairs), naive {r['naive_pairs_per_s']:.2f} pairs/s, "
            f"ratio {r['ratio']:.1f}x" + (f"  [{'; '.join(verdict)}]" if verdict else "")
        )
        if "lpips_alone_pairs_per_s" in r:
            lines.append(
                f"           LPIPS alone on device-resident frames: {r['lpips_alone_pairs_per_s']:.0f} pairs/s"
            )
        if "flow_capacity" in r:
            lines.append(
                "           flow pool ceilings (pairs/s): "
                + ", ".join(f"dis-{k} {v / 4:.0f}" for k, v in r["flow_capacity"].items())
            )
    text = "\n".join(lines)
    (out_dir / "summary.txt").write_text(text + "\n")
    return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    p.add_argument("--size", default="256x256", help="WxH (default 256x256)")
    p.add_argument(
        "--part",
        choices=PARTS,
        default=None,
        help="one part in this process (default: full, or fidelity with --no-temporal; "
        "with --out and no --part: every part, each in its own process)",
    )
    p.add_argument("--parts", default=",".join(PARTS), help="parts run by --out (default all)")
    p.add_argument("--out", default=None, help="folder for the results (PART.txt, PART.json, summary.txt)")
    p.add_argument("--summarize", default=None, metavar="DIR", help="print the summary of a results folder")
    p.add_argument(
        "--frames",
        type=int,
        default=None,
        help="at least this many pairs timed for ours (default 32 on the CPU, 1000 on a GPU)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="time ours for at least this long (default 0 on the CPU, 6 on a GPU)",
    )
    p.add_argument("--max-frames", type=int, default=20000, help="never time more pairs than this")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop timing ours after this long even short of --frames (default 20 on a GPU)",
    )
    p.add_argument(
        "--naive-frames",
        type=int,
        default=None,
        help="pairs timed for naive (default 16, 4 for the full set on a GPU)",
    )
    p.add_argument("--chunk", type=int, default=None, help="frames per batch (default: auto_chunk)")
    p.add_argument("--net", default="alex", choices=("alex", "vgg"))
    p.add_argument("--flow", default="dis", choices=("dis", "farneback"))
    p.add_argument("--flow-preset", default=DEFAULT_PRESET, choices=DIS_PRESETS)
    p.add_argument("--flow-scale", type=float, default=1.0)
    p.add_argument("--flow-workers", type=int, default=None, help="flow threads (default: the evaluator's)")
    p.add_argument(
        "--flow-capacity", action="store_true", help="also measure the flow pool (always on a GPU)"
    )
    p.add_argument(
        "--lpips-alone",
        action="store_true",
        help="also time LPIPS alone on frames already on the device (always on a GPU)",
    )
    p.add_argument("--no-temporal", action="store_true", help="same as --part fidelity")
    p.add_argument(
        "--memory",
        type=int,
        default=None,
        metavar="N",
        help="pairs streamed by the memory part (default 2000); alone: --part memory",
    )
    p.add_argument(
        "--limit-scale", type=float, default=1.0, help="multiplies the per-part time limits of --out"
    )
    args = p.parse_args(argv)
    if args.summarize:
        print(summarize(Path(args.summarize)))
        return 0
    w, h = (int(v) for v in args.size.lower().split("x"))
    dev = resolve_device(args.device)  # the metric engine's own device rule
    gpu = dev.type == "cuda"
    if args.part is None and args.out:
        return run_all(args, argv)
    part = args.part or ("memory" if args.memory else "fidelity" if args.no_temporal else "full")
    if args.chunk is None:
        args.chunk = auto_chunk(h, w, dev, host_flows=part != "fidelity" and args.flow != "torch")
    if args.frames is None:
        args.frames = 1000 if gpu else 32
    if args.seconds is None:
        args.seconds = 6.0 if gpu else 0.0
    if args.max_seconds is None:
        args.max_seconds = 20.0 if gpu else float("inf")
    if args.naive_frames is None:
        args.naive_frames = 4 if gpu and part == "full" else 16
    args.memory = args.memory or 2000

    lines = []

    def out(line):
        print(line, flush=True)
        lines.append(line)

    out(header(args, dev, w, h, part))
    if part == "memory":
        res = part_memory(args, dev, w, h, out)
    else:
        res = part_compare(args, dev, w, h, part == "full", out)
        out(f"peak RSS {peak_rss_mb():.0f} MB")
    res["header"] = lines[0]
    if args.out:
        d = Path(args.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{part}.txt").write_text("\n".join(lines) + "\n")
        (d / f"{part}.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
