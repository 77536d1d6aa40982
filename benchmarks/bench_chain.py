"""The LPIPS+SSIM+PSNR chain stage by stage, today's kernels against the fast paths, in one process.

    PYTHONPATH=. python benchmarks/bench_chain.py --device cuda --size 1280x720 --out OUT/chain.txt
    PYTHONPATH=. python benchmarks/bench_chain.py --device cpu --size 256x256 --pairs 32

"old" runs inside ``evalkit.metrics._common.fast_paths(all=False)`` (the torch kernels: depthwise
convolutions for SSIM, separate MSE and exactness passes, AlexNet's conv1 as a strided conv);
"new" is the default (on CUDA: SSIM and MSE+exactness as Triton kernels, conv1 by
space-to-depth; on the CPU the default is today's code, so "new" = "old" there and the extra
line "trunk, conv1 s2d forced" measures the space-to-depth conv1 on the CPU).

Frames: a cycle of 32 distinct synthetic frame pairs (a moving texture; B is A plus noise),
uint8, in memory. Printed: which fast paths the default uses here; per-pair milliseconds of each
stage (uint8 -> [0, 1] float of A and B, their rounded luma, LPIPS trunk on A and B, LPIPS
head, SSIM, MSE, exactness; new: MSE and exactness in one pass), best of ``--repeat`` runs of
``--iters`` chunks, old and new alternating; the largest |difference| of each value between
old and new, and (CUDA) whether the luma of all 2^24 RGB triples is the same; then
``PairEvaluator(temporal=False).update()`` pairs/s on frames already on the
device and ``stream_pair`` pairs/s from host frames (chunks of 16 and 32), old against new,
ratios printed. Metric numbers only move by float32 rounding (MSE and exactness: not at all).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evalkit.metrics._common import as_frames, fast_path, fast_paths, luma, precise, resolve_device  # noqa: E402
from evalkit.metrics.fidelity import (  # noqa: E402
    exactness_kernel,
    luma_kernel,
    mse_exactness_kernel,
    mse_kernel,
    ssim_kernel,
)
from evalkit.metrics.perceptual import get_model  # noqa: E402
from evalkit.metrics.stream import PairEvaluator, stream_pair, unit_into  # noqa: E402

CYCLE = 32


def frames(n: int, h: int, w: int, seed: int = 0):
    """(n, H, W, 3) uint8 numpy A and B: a smooth moving texture, B = A + noise."""
    import cv2

    rng = np.random.default_rng(seed)
    small = rng.random((h // 8 + 4, w // 8 + 4 + n, 3)).astype(np.float32)
    tex = cv2.resize(small, (small.shape[1] * 8, small.shape[0] * 8), interpolation=cv2.INTER_CUBIC)
    tex = np.clip(tex * 255, 0, 255).astype(np.uint8)
    a = np.stack([tex[8 : 8 + h, 2 * t : 2 * t + w] for t in range(n)])
    b = np.clip(a.astype(np.int16) + rng.integers(-6, 7, a.shape), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a), b


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def mode(name: str):
    return fast_paths(all=False) if name == "old" else contextlib.nullcontext()


def timed(fn, dev, iters: int) -> float:
    sync(dev)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(dev)
    return (time.perf_counter() - t) / iters


def stages(a, b, dev, chunk, iters, repeat, out):
    """Per-pair ms of each stage, old and new, and the largest |difference| of each value."""
    model = get_model("alex", dev)
    autotune = dev.type == "cuda"
    with precise(autotune):
        u = torch.cat([a, b]).float().div_(255.0)
        ya, yb = luma(a), luma(b)
    u2 = torch.empty_like(u)

    def to_float():
        unit_into(a, u2[:chunk])
        unit_into(b, u2[chunk:])
        return u2

    parts = {
        "to-float (A and B)": to_float,
        "luma (A and B, rounded)": lambda: (luma_kernel(a), luma_kernel(b)),
        "trunk (LPIPS on A and B)": lambda: model.features(u),
        "head (LPIPS distances)": None,
        "SSIM (luma, rounded)": lambda: ssim_kernel(a, b, lumas=(ya, yb)),
        "MSE": lambda: mse_kernel(a, b),
        "exactness": lambda: exactness_kernel(a, b),
        "MSE + exactness": lambda: mse_exactness_kernel(a, b),
    }
    values, best = {}, {}
    for name in ("old", "new"):
        with mode(name), precise(autotune):
            f = model.features(u)
            fa, fb = [t[:chunk] for t in f], [t[chunk:] for t in f]
            mse, ex = mse_exactness_kernel(a, b)
            values[name] = {
                "unit": to_float().clone(),
                "luma": luma_kernel(a),
                "lpips": model.distance(fa, fb),
                "ssim": ssim_kernel(a, b, lumas=(ya, yb)),
                "mse": mse,
                **ex,
            }
            parts["head (LPIPS distances)"] = lambda fa=fa, fb=fb: model.distance(fa, fb)
            best[name] = {}
            for label, fn in parts.items():
                fn()  # warm-up (compile, autotune)
    for label in parts:
        for _ in range(repeat):
            for name in ("old", "new"):
                with mode(name), precise(autotune):
                    if label.startswith("head"):
                        f = model.features(u)
                        fa, fb = [t[:chunk] for t in f], [t[chunk:] for t in f]
                        fn = lambda fa=fa, fb=fb: model.distance(fa, fb)
                    else:
                        fn = parts[label]
                    ms = timed(fn, dev, iters) / chunk * 1e3
                best[name][label] = min(best[name].get(label, ms), ms)
    out(f"\nper pair, ms (chunk {chunk}, best of {repeat} x {iters}):")
    out(f"  {'stage':28s} {'old':>9s} {'new':>9s} {'old/new':>8s}")
    for label in parts:
        o, n = best["old"][label], best["new"][label]
        out(f"  {label:28s} {o:9.4f} {n:9.4f} {o / n:8.2f}")
    o = sum(best["old"][k] for k in parts if k != "MSE + exactness")
    n = sum(best["new"][k] for k in parts if k not in ("MSE", "exactness"))
    out(f"  {'chain (sum of the above)':28s} {o:9.4f} {n:9.4f} {o / n:8.2f}")
    with precise(autotune), fast_paths(conv1_s2d=True):
        model.features(u)
        forced = min(timed(lambda: model.features(u), dev, iters) for _ in range(repeat)) / chunk * 1e3
    out(
        f"  {'trunk, conv1 s2d forced':28s} {best['old']['trunk (LPIPS on A and B)']:9.4f} {forced:9.4f} "
        f"{best['old']['trunk (LPIPS on A and B)'] / forced:8.2f}"
    )
    out(
        "max |old - new|: "
        + ", ".join(
            f"{k} {(values['old'][k].double() - values['new'][k].double()).abs().max().item():.3g}"
            for k in values["old"]
        )
    )


def luma_exhaustive(dev, out):
    """Rounded luma of all 2^24 RGB triples (one 4096x4096 frame): the default path against
    ``evalkit.metrics._common.luma`` (13,178 of them are exact halves in float64)."""
    i = np.arange(1 << 24, dtype=np.int64)
    rgb = np.stack([i >> 16, (i >> 8) & 255, i & 255]).astype(np.uint8).reshape(1, 3, 4096, 4096)
    x = as_frames(torch.from_numpy(rgb), "rgb", device=dev)
    with precise():
        with fast_paths(triton_luma=False):
            want = luma_kernel(x)
        got = luma_kernel(x)
    bad = int((got != want).sum().item())
    out(f"luma of all 2^24 RGB triples, default path vs torch float64: {bad} differ")


RECORDS: dict[str, list] = {}  # mode -> the records of the evaluator's first chunk


def update_rate(a_all, b_all, dev, chunk, pairs, name) -> float:
    ev = PairEvaluator(device=dev, temporal=False)
    try:
        with mode(name):
            for i in range(3):  # warm-up
                j = (i * chunk) % CYCLE
                recs = ev.update(a_all[j : j + chunk], b_all[j : j + chunk])
                if i == 0:
                    RECORDS[name] = recs
            sync(dev)
            t = time.perf_counter()
            done = 0
            while done < pairs:
                j = (done // chunk * chunk) % CYCLE
                done += len(ev.update(a_all[j : j + chunk], b_all[j : j + chunk]))
            sync(dev)
            return done / (time.perf_counter() - t)
    finally:
        ev.close()


def stream_rate(a_np, b_np, dev, chunk, pairs, name) -> float:
    def gen(x, n):
        for t in range(n):
            yield x[t % len(x)]

    ev = PairEvaluator(device=dev, temporal=False)
    try:
        with mode(name):
            for _ in stream_pair(gen(a_np, 2 * chunk), gen(b_np, 2 * chunk), evaluator=ev, chunk=chunk):
                pass
            ev.reset()
            t = time.perf_counter()
            n = sum(1 for _ in stream_pair(gen(a_np, pairs), gen(b_np, pairs), evaluator=ev, chunk=chunk))
            return n / (time.perf_counter() - t)
    finally:
        ev.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--size", default="1280x720", help="WxH (default 1280x720)")
    p.add_argument("--chunk", type=int, default=16, help="pairs per chunk of the stage timings")
    p.add_argument("--iters", type=int, default=10, help="chunks per timing")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--pairs", type=int, default=1024, help="pairs per throughput run")
    p.add_argument("--out", type=Path, help="also write the printed lines here")
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    dev = resolve_device(args.device)
    lines = []

    def out(s=""):
        print(s, flush=True)
        lines.append(s)

    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "not installed"
    out(
        f"bench_chain | device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}) "
        f"| size {w}x{h} | torch {torch.__version__} | triton {tv} | torch threads "
        f"{torch.get_num_threads()} | cpus {os.cpu_count()} | env EVALKIT_TRITON="
        f"{os.environ.get('EVALKIT_TRITON', '-')}"
    )
    from evalkit.metrics import fidelity

    with precise():
        active = {
            "triton_ssim": fidelity._planes_fn(dev) is not fidelity._ssim_planes,
            "triton_pixels": dev.type == "cuda"
            and fidelity._triton("mse_exactness_u8") is not None
            and fast_path("triton_pixels"),
            "conv1_s2d": get_model("alex", dev)._use_s2d(),
            "triton_luma": dev.type == "cuda"
            and fidelity._triton("luma_u8") is not None
            and fast_path("triton_luma"),
            "one_pass_unit": dev.type == "cuda" and fast_path("one_pass_unit"),
        }
    out(
        "new = the default here, fast paths in use: "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in active.items())
    )
    a_np, b_np = frames(CYCLE, h, w)
    a_all = as_frames(torch.from_numpy(a_np).permute(0, 3, 1, 2).contiguous(), "a", device=dev)
    b_all = as_frames(torch.from_numpy(b_np).permute(0, 3, 1, 2).contiguous(), "b", device=dev)
    chunk = min(args.chunk, CYCLE)
    stages(a_all[:chunk], b_all[:chunk], dev, chunk, args.iters, args.repeat, out)
    if dev.type == "cuda":  # on the CPU both sides run the same code
        luma_exhaustive(dev, out)

    out(f"\nPairEvaluator(temporal=False), pairs/s ({args.pairs} pairs):")
    out(f"  {'run':36s} {'old':>8s} {'new':>8s} {'new/old':>8s}")
    rates = {}
    for label, fn, ch in (
        ("update(), frames on the device, 16", update_rate, 16),
        ("stream_pair, host frames, chunk 16", stream_rate, 16),
        ("stream_pair, host frames, chunk 32", stream_rate, 32),
    ):
        src = (a_all, b_all) if fn is update_rate else (a_np, b_np)
        r = {}
        for _ in range(2):  # alternate; keep the best
            for name in ("old", "new"):
                r[name] = max(r.get(name, 0.0), fn(*src, dev, ch, args.pairs, name))
        rates[label] = r
        out(f"  {label:36s} {r['old']:8.1f} {r['new']:8.1f} {r['new'] / r['old']:8.2f}")
    diffs = {
        k: max(abs(o[k] - n[k]) if o[k] != n[k] else 0.0 for o, n in zip(RECORDS["old"], RECORDS["new"]))
        for k in ("lpips", "ssim", "psnr", "max_abs_diff", "diff_fraction")
    }
    out("records of update(), max |old - new|: " + ", ".join(f"{k} {v:.3g}" for k, v in diffs.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
