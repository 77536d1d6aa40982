"""The ``"torch"`` optical flow against OpenCV DIS (accuracy and speed), and LPIPS in strict fp32.

    PYTHONPATH=. python benchmarks/bench_flow.py --part synthetic --device cpu
    PYTHONPATH=. python benchmarks/bench_flow.py --device cuda --out OUT      # everything, GPU
    PYTHONPATH=. python benchmarks/bench_flow.py --device cuda --part temporal  # Triton warping error on/off
    PYTHONPATH=. python benchmarks/bench_flow.py --device cuda --part schedules --large  # pyramid schedules

Parts (``--part``, default all):

* ``synthetic`` -- end-point error against the known flow of synthetic motion
  (:mod:`evalkit.testing.flowcheck`: four bundled photographs, translations from 0.3 to 19 px, a
  rotation, a zoom and a mix; windows of 320x180 and, ``--large``, 1280x720 from photographs
  upscaled 2.6x): ``torch`` on ``--device`` against DIS ``fast`` and ``medium``, and the torch
  flow solved down to the other working levels (:data:`VARIANTS`).
* ``schedules`` -- the torch flow's pyramid schedules (``finest``, and ``warps``/``inner`` per
  level, :func:`evalkit.metrics.torchflow.per_level`): for each schedule of ``--schedules`` (default
  :data:`SCHEDULES`: v1, v2 = the default, and the session-10 sweep), the mean (median)
  end-point error on the synthetic sets above beside DIS ``fast``'s, the cases where it is <=
  DIS ``fast``, flows/s at the ``--sizes`` frame sizes (one batch of the flow's own batch size:
  the fused Triton path on CUDA, the torch path on the CPU), then the schedules whose mean EPE
  is <= DIS ``fast``'s on every set measured, fastest first. A schedule is ``NAME=KEY=VALUE,...``
  or just ``KEY=VALUE,...`` (named after its values), keys those of
  :data:`evalkit.metrics.torchflow.PARAMS`; ``warps``/``inner`` take one int or ints joined by ``/``,
  one per pyramid level from level 0 (the frames' resolution: not solved when ``finest`` is 1),
  the last one repeating above, e.g. ``--schedules "v1=finest=0,warps=3,inner=10"
  "finest=1,warps=1/3/4,inner=15"``. Raw H200 output:
  ``benchmarks/results/flow_schedules_h200.txt``.
* ``real`` -- the canary clips (256x256, 24 frames): warping error of each clip and tOF
  against a degraded copy (blur 0.7 px + noise 2/255) with each flow, their ratios to DIS
  ``fast``, and the mean end-point distance of the torch and DIS ``medium`` flows to DIS
  ``fast``'s (how far apart two CPU presets already are).
* ``speed`` -- flows/s at 1280x720 and 1920x1080: ``torch`` on the device (several batch
  sizes) against DIS ``fast`` (and ``medium``) in a pool of ``--threads`` OpenCV threads.
* ``stream`` -- :class:`evalkit.metrics.stream.PairEvaluator` from frames in host memory at 1280x720:
  LPIPS+SSIM+PSNR, and the full set with ``--flow torch`` against ``dis``, pairs/s.
* ``temporal`` -- the warping errors and tOF from flows on the device: the Triton pass
  (:mod:`evalkit.metrics._triton_temporal`, CUDA) against the torch path, side by side in one process:
  ms per pair on chunks of 8 and 16 pairs at ``--size`` with their differences and batch
  invariance, then the PairEvaluator full set with ``--flow torch`` (stream rows 2 and 3, or
  ``--stream-rows``) inside ``fast_paths(triton_temporal=False)`` and ``=True``, in turn
  (``--repeats`` rounds), pairs/s and the ratio.
* ``fused`` -- the torch flow's fused Triton path (:mod:`evalkit.metrics._triton_flow`, CUDA) against its
  torch path, side by side in one process: flows/s at 1280x720 and 1920x1080 (``--fused-batches``),
  the max |difference| between the two flows, batch invariance, the end-point error of both on
  the 1280x720 synthetic set, and the PairEvaluator full set with ``--flow torch`` with the
  fused path off and on (``EVALKIT_TRITON``).
* ``lpips`` -- LPIPS alone in strict fp32 (TF32 off) on frames on the device at 1280x720:
  today's :mod:`evalkit.metrics.perceptual` against variants (cuDNN autotuning off, channels-last,
  CUDA graphs, batch sizes), side by side, ratios printed, each checked against the
  ``lpips`` package's own model (when installed) and against ours.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.metrics._common import precise, resolve_device  # noqa: E402
from evalkit.metrics.flow import flow_u8  # noqa: E402
from evalkit.metrics.torchflow import BATCH_PIXELS, CONVENTION, PARAMS, torch_flow, use_fused  # noqa: E402
from evalkit.testing.flowcheck import endpoint_error, photo_grey, synthetic_pair  # noqa: E402

PARTS = ("synthetic", "schedules", "real", "speed", "stream", "temporal", "fused", "lpips")
#: Working levels of the torch flow measured beside the default (level ``PARAMS["finest"]``, 1:
#: solved down to 1/2 scale and upsampled): ``fin0`` solved down to the frames' resolution,
#: ``fin2`` stopped at 1/4 scale; the default's warps and inner iterations at every level.
VARIANTS = {f"fin{k}": dict(finest=k) for k in (0, 1, 2) if k != PARAMS["finest"]}
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
CASES = [
    ("shift 0.3", dict(shift=(0.3, -0.2))),
    ("shift 2.7", dict(shift=(2.7, 1.4))),
    ("shift 7.5", dict(shift=(-7.5, 3.0))),
    ("shift 19", dict(shift=(19.2, -6.1))),
    ("rot 4deg", dict(angle=4.0)),
    ("zoom 1.06", dict(zoom=1.06)),
    ("rot-3 zoom.96 +(4,2)", dict(angle=-3, zoom=0.96, shift=(4, 2))),
]
#: Stated tolerance on real clips (docs/metrics.md): warping error within this factor of DIS
#: fast's either way, tOF within TOF_ABS pixels (on all but the clips named in the docs).
WARP_FACTOR = 3.0
TOF_ABS = 0.1


def say(*a):
    print(*a, flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev, *, min_s=1.0, min_n=3):
    """Seconds per call (warm-up call excluded), at least ``min_n`` calls and ``min_s`` seconds."""
    fn()
    sync(dev)
    n, t0 = 0, time.perf_counter()
    while n < min_n or time.perf_counter() - t0 < min_s:
        fn()
        n += 1
    sync(dev)
    return (time.perf_counter() - t0) / n


def on_device(t: torch.Tensor, dev) -> torch.Tensor:
    """Test frames (luma planes or RGB batches) on the metric device (resolve_device)."""
    return t.to(dev)


def tflow(src, dst, dev, **kw):
    f = torch_flow(
        on_device(torch.from_numpy(src)[None], dev), on_device(torch.from_numpy(dst)[None], dev), **kw
    )
    return f[0].permute(1, 2, 0).cpu().numpy()


# -- synthetic --------------------------------------------------------------------------------


def synthetic_sets(large: bool, small: bool = True):
    """(label, (h, w), prescale) of the synthetic sets: 320x180 windows of the photographs
    scaled 0.8x, and (``large``) 1280x720 windows of the photographs upscaled to cover them."""
    return ([("320x180", (180, 320), 0.8)] if small else []) + (
        [("1280x720", (720, 1280), None)] if large else []
    )


def synthetic_cases(size, prescale=None):
    """(photo, motion, src, dst, true flow) for each of PHOTOS x CASES in windows of ``size``
    (h, w); ``prescale`` None: the photograph upscaled (bicubic) to cover the window with margin."""
    from skimage import data as skdata

    for name in PHOTOS:
        rgb = getattr(skdata, name)()
        photo = photo_grey(rgb, prescale or 1.12 * max(size[0] / rgb.shape[0], size[1] / rgb.shape[1]))
        for case, kw in CASES:
            yield (name, case, *synthetic_pair(photo, size, **kw))


def part_synthetic(dev, large: bool, small: bool = True):
    for label, size, prescale in synthetic_sets(large, small):
        say(
            f"\n## synthetic motion, {label} windows, end-point error in pixels "
            f"(torch {CONVENTION} on {dev.type}; DIS on the CPU)"
        )
        say(
            f"(torch: the default, level {PARAMS['finest']}; "
            + ", ".join(f"{k}: solved down to level {v['finest']}" for k, v in VARIANTS.items())
            + ")"
        )
        say(
            f"{'photo':10s} {'motion':22s} {'torch':>7s} {'fast':>7s} {'medium':>7s} "
            + " ".join(f"{k:>7s}" for k in VARIANTS)
        )
        tot = {"torch": [], "fast": [], "medium": [], **{k: [] for k in VARIANTS}}
        for name, case, src, dst, truth in synthetic_cases(size, prescale):
            e = {
                "torch": endpoint_error(tflow(src, dst, dev), truth),
                "fast": endpoint_error(flow_u8(src, dst, "dis", "fast"), truth),
                "medium": endpoint_error(flow_u8(src, dst, "dis", "medium"), truth),
                **{k: endpoint_error(tflow(src, dst, dev, **v), truth) for k, v in VARIANTS.items()},
            }
            for k, v in e.items():
                tot[k].append(v)
            say(f"{name:10s} {case:22s} " + " ".join(f"{v:7.3f}" for v in e.values()))
        m = {k: float(np.mean(v)) for k, v in tot.items()}
        md = {k: float(np.median(v)) for k, v in tot.items()}
        wins = sum(t <= f for t, f in zip(tot["torch"], tot["fast"]))
        say(f"{'MEAN':33s} " + " ".join(f"{v:7.3f}" for v in m.values()))
        say(f"{'MEDIAN':33s} " + " ".join(f"{v:7.3f}" for v in md.values()))
        say(
            f"torch <= DIS fast on {wins}/{len(tot['torch'])} cases; mean EPE torch/fast "
            f"{m['torch'] / m['fast']:.2f}, torch/medium {m['torch'] / m['medium']:.2f} "
            f"[no worse than DIS fast: {'met' if m['torch'] <= m['fast'] else 'NOT met'}]"
        )


# -- schedules --------------------------------------------------------------------------------

#: Pyramid schedules of the ``schedules`` part (``--schedules`` syntax; see the module's
#: docstring): torch-clg-v1 and v2 (the default), then the session-10 sweep of warps and inner
#: iterations per level (benchmarks/results/flow_schedules_h200.txt, run 2).
SCHEDULES = (
    "v1=finest=0,warps=3,inner=10",
    "v2=finest=1,warps=4,inner=15",
    "finest=0,warps=1/4,inner=10/15",
    "finest=0,warps=1/4,inner=10/20",
    "finest=0,warps=1/5,inner=10/20",
    "finest=0,warps=1/6,inner=10/20",
    "finest=0,warps=1/4,inner=5/15",
    "finest=0,warps=1/4,inner=10/30",
    "finest=0,warps=1/3,inner=10/20",
    "finest=1,warps=1/2/4,inner=15",
    "finest=1,warps=1/3/4,inner=15",
    "finest=1,warps=6,inner=20",
    "finest=1,warps=4,inner=10/10/20",
    "finest=1,warps=1/2/6,inner=10/15/20",
)


def parse_schedule(text: str) -> tuple[str, dict]:
    """``NAME=KEY=VALUE,...`` or ``KEY=VALUE,...`` -> (name, torch_flow keywords). Keys: those of
    :data:`evalkit.metrics.torchflow.PARAMS`; ``warps``/``inner``: an int or ints joined by ``/`` (one per
    pyramid level from level 0, the last repeating above); ``finest`` an int; the rest floats.
    Unnamed: named ``f<finest> w<warps> i<inner>`` (the default's values where not given)."""
    head, sep, rest = text.partition("=")
    name, body = (None, text) if head.strip() in PARAMS else (head.strip(), rest)
    if not sep or not body:
        raise ValueError(f"schedule {text!r}: expected [NAME=]KEY=VALUE,... (keys {', '.join(PARAMS)})")
    kw: dict = {}
    for item in body.split(","):
        key, eq, value = (x.strip() for x in item.partition("="))
        if key not in PARAMS or not eq:
            raise ValueError(
                f"schedule {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(PARAMS)}"
            )
        if key in ("warps", "inner"):
            levels = tuple(int(v) for v in value.split("/"))
            kw[key] = levels[0] if len(levels) == 1 else levels
        else:
            kw[key] = int(value) if key == "finest" else float(value)
    if name is None:
        v = {**PARAMS, **kw}
        fmt = lambda x: "/".join(map(str, x)) if isinstance(x, tuple) else str(x)  # noqa: E731
        name = f"f{v['finest']} w{fmt(v['warps'])} i{fmt(v['inner'])}" + "".join(
            f" {k}={kw[k]:g}" for k in ("window", "alpha") if k in kw
        )
    return name, kw


def part_schedules(dev, schedules, sizes, large: bool, small: bool = True) -> list[str]:
    """EPE of each schedule on the synthetic sets beside DIS fast's, flows/s at ``sizes``, and
    the schedules no worse than DIS fast on every set, fastest first (returned)."""
    named = dict(parse_schedule(t) for t in schedules)
    width = max(len(k) for k in [*named, "DIS fast"])
    mean: dict[str, dict[str, float]] = {}
    for label, size, prescale in synthetic_sets(large, small):
        tot: dict[str, list] = {"DIS fast": [], **{k: [] for k in named}}
        rocket: dict[str, list] = {k: [] for k in tot}
        for photo, _case, src, dst, truth in synthetic_cases(size, prescale):
            e = {
                "DIS fast": endpoint_error(flow_u8(src, dst, "dis", "fast"), truth),
                **{k: endpoint_error(tflow(src, dst, dev, **kw), truth) for k, kw in named.items()},
            }
            for k, v in e.items():
                tot[k].append(v)
                if photo == "rocket":
                    rocket[k].append(v)
        say(
            f"\n## schedules, synthetic {label}: mean EPE (median) [cases <= DIS fast] "
            f"(torch on {dev.type}; DIS on the CPU)"
        )
        for k, v in tot.items():
            wins = sum(t <= f for t, f in zip(v, tot["DIS fast"]))
            say(
                f"  {k:{width}s} {np.mean(v):.4f} ({np.median(v):.4f}) [{wins}/{len(v)}]"
                + (f"  no-texture rocket mean {np.mean(rocket[k]):.3f}" if rocket[k] else "")
            )
        mean[label] = {k: float(np.mean(v)) for k, v in tot.items()}
    speed: dict[tuple, float] = {}
    say(
        f"\n## schedules, speed on {dev.type} ({'fused Triton path' if use_fused(dev) else 'torch path'}), "
        "flows/s (one batch of the flow's own batch size)"
    )
    for h, w in sizes:
        _, _, s1, d1 = device_pair(h, w, dev)
        bs = 1 << max(0, (BATCH_PIXELS["cuda" if dev.type == "cuda" else "cpu"] // (h * w)).bit_length() - 1)
        s, d = batch_of(s1, bs), batch_of(d1, bs)
        for k, kw in named.items():
            speed[w, h, k] = bs / timed(
                lambda kw=kw, s=s, d=d: torch_flow(s, d, **kw), dev, min_s=1.0, min_n=3
            )
            say(f"  {w}x{h} batch {bs:3d} {k:{width}s} {speed[w, h, k]:8.1f} flows/s")
    if not mean:
        return []
    ok = [k for k in named if all(m[k] <= m["DIS fast"] for m in mean.values())]
    if sizes:
        h, w = sizes[0]
        ok.sort(key=lambda k: -speed[w, h, k])
    say(
        f"\ncandidates (mean EPE <= DIS fast on {', '.join(mean)})"
        + (f", fastest at {sizes[0][1]}x{sizes[0][0]} first:" if sizes else ":")
    )
    for k in ok:
        say(
            f"  {k:{width}s} "
            + (f"{speed[sizes[0][1], sizes[0][0], k]:8.1f} flows/s, " if sizes else "")
            + "EPE "
            + " / ".join(f"{m[k]:.3f} ({label})" for label, m in mean.items())
        )
    if not ok:
        say("  none")
    return ok


# -- real clips -------------------------------------------------------------------------------


def read_clip(path: Path) -> np.ndarray:
    """(T, H, W, 3) uint8 RGB, decoded with OpenCV (exactly what evalkit.video gives for FFV1)."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f[..., ::-1])
    cap.release()
    return np.ascontiguousarray(np.stack(frames))


def part_real(dev, frames: int):
    from scipy.ndimage import gaussian_filter

    from evalkit.metrics.flow import optical_flow
    from evalkit.metrics.temporal import tof, warping_error

    say(
        f"\n## real clips (datasets/canary, 256x256, {frames} frames): warping error (x1e-4, [0,1] MSE) "
        "and tOF (px) against a degraded copy"
    )
    say(
        f"{'clip':22s} {'we fast':>8s} {'we med':>8s} {'we torch':>8s} {'t/f':>5s} | {'tof fast':>8s} "
        f"{'tof med':>8s} {'tof torch':>9s} {'t-f':>6s} | {'epe(t,f)':>8s} {'epe(m,f)':>8s}"
    )
    rows = []
    for path in sorted((ROOT / "datasets" / "canary" / "clips").glob("*.mkv")):
        fr = read_clip(path)[:frames]
        rng = np.random.default_rng(0)
        bb = gaussian_filter(fr.astype(np.float32), (0, 0.7, 0.7, 0)) + rng.normal(0, 2, fr.shape)
        a = on_device(torch.from_numpy(fr).permute(0, 3, 1, 2).contiguous(), dev)
        b = on_device(
            torch.from_numpy(np.clip(np.round(bb), 0, 255).astype(np.uint8)).permute(0, 3, 1, 2).contiguous(),
            dev,
        )
        we, to, fl = {}, {}, {}
        for key, method, preset in (
            ("fast", "dis", "fast"),
            ("medium", "dis", "medium"),
            ("torch", "torch", "fast"),
        ):
            we[key] = warping_error(a, method=method, preset=preset).mean().item()
            to[key] = tof(a, b, method=method, preset=preset).mean().item()
            fl[key] = optical_flow(a[:-1], a[1:], method=method, preset=preset)
        epe = {k: (fl[k] - fl["fast"]).pow(2).sum(1).sqrt().mean().item() for k in ("torch", "medium")}
        r = we["torch"] / we["fast"]
        d = to["torch"] - to["fast"]
        rows.append((path.stem, r, d, to["medium"] - to["fast"], we["medium"] / we["fast"]))
        say(
            f"{path.stem:22s} {we['fast'] * 1e4:8.3f} {we['medium'] * 1e4:8.3f} {we['torch'] * 1e4:8.3f} "
            f"{r:5.2f} | {to['fast']:8.4f} {to['medium']:8.4f} {to['torch']:9.4f} {d:+6.3f} | "
            f"{epe['torch']:8.3f} {epe['medium']:8.3f}"
        )
    ok_we = [n for n, r, *_ in rows if 1 / WARP_FACTOR <= r <= WARP_FACTOR]
    ok_tof = [n for n, _, d, *_ in rows if abs(d) <= TOF_ABS]
    say(
        f"warping error torch/fast within x{WARP_FACTOR:g}: {len(ok_we)}/{len(rows)} clips "
        f"(range {min(r[1] for r in rows):.2f}-{max(r[1] for r in rows):.2f}; DIS medium/fast range "
        f"{min(r[4] for r in rows):.2f}-{max(r[4] for r in rows):.2f})"
    )
    say(
        f"tOF torch-fast within {TOF_ABS} px: {len(ok_tof)}/{len(rows)} clips "
        f"(outside: {', '.join(n for n, *_ in rows if n not in ok_tof) or 'none'}; range "
        f"{min(r[2] for r in rows):+.3f}..{max(r[2] for r in rows):+.3f}; DIS medium-fast range "
        f"{min(r[3] for r in rows):+.3f}..{max(r[3] for r in rows):+.3f})"
    )


# -- speed ------------------------------------------------------------------------------------


def frames_pair(h, w):
    """A real-looking pair at (h, w): a photograph upscaled, moved 3.4 px right and rotated."""
    from skimage import data as skdata

    photo = photo_grey(skdata.astronaut(), max(h, w) * 1.15 / 512)
    src, dst, _ = synthetic_pair(photo, (h, w), shift=(3.4, -1.2), angle=0.5)
    return src, dst


def device_pair(h, w, dev):
    """:func:`frames_pair` and the same two frames as (1, H, W) uint8 tensors on ``dev``."""
    src, dst = frames_pair(h, w)
    return src, dst, on_device(torch.from_numpy(src)[None], dev), on_device(torch.from_numpy(dst)[None], dev)


def batch_of(frame: torch.Tensor, bs: int) -> torch.Tensor:
    """``bs`` copies of a (1, H, W) frame, contiguous (a real batch, not a view)."""
    return frame.expand(bs, -1, -1).contiguous()


def cuda_profile(dev, fn) -> None:
    """The 12 CUDA kernels with the most time in one call of ``fn``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CUDA]) as pr:
        fn()
        sync(dev)
    say(pr.key_averages().table(sort_by="cuda_time_total", row_limit=12))


def part_speed(
    dev, threads: int, batches, sizes, dis: bool = True, big_batches: bool = False, profile: bool = False
):
    import cv2

    say(f"\n## flow speed: torch on {dev.type} vs DIS on {threads} CPU threads (one flow per thread)")
    for h, w in sizes:
        src, dst, s1, d1 = device_pair(h, w, dev)
        for bs in batches:
            s, d = batch_of(s1, bs), batch_of(d1, bs)
            try:
                t = timed(lambda: torch_flow(s, d), dev, min_s=1.5, min_n=2)
            except torch.OutOfMemoryError:
                say(f"{w}x{h} torch batch {bs}: out of memory")
                continue
            mem = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
            say(
                f"{w}x{h} torch batch {bs:3d}: {bs / t:8.1f} flows/s  ({t * 1000 / bs:.2f} ms/flow, "
                f"peak GPU {mem:.1f} GiB)"
            )
        bs = batches[len(batches) // 2]
        s, d = batch_of(s1, bs), batch_of(d1, bs)
        for name, kw in VARIANTS.items():
            t = timed(lambda kw=kw: torch_flow(s, d, **kw), dev, min_s=1.0, min_n=2)
            say(f"{w}x{h} torch {name} batch {bs:3d}: {bs / t:8.1f} flows/s")
        if dev.type == "cuda" and big_batches:
            for big in (1 << 26, 1 << 27):
                gbs = max(1, big // (h * w))
                sg, dg = batch_of(s1, gbs), batch_of(d1, gbs)
                t = timed(
                    lambda sg=sg, dg=dg, big=big: torch_flow(sg, dg, batch_pixels=big),
                    dev,
                    min_s=1.0,
                    min_n=2,
                )
                mem = torch.cuda.max_memory_allocated(dev) / 2**30
                say(
                    f"{w}x{h} torch eager batch {gbs:3d} (batch_pixels {big}): {gbs / t:8.1f} flows/s, "
                    f"peak GPU {mem:.1f} GiB"
                )
        if profile and dev.type == "cuda":
            sg, dg = batch_of(s1, 16), batch_of(d1, 16)
            cuda_profile(dev, lambda: torch_flow(sg, dg))
        ref = torch_flow(s[:2], d[:2])
        say(
            f"{w}x{h} torch batch-invariance: max |flow(batch 2) - flow(batch {bs})[:2]| = "
            f"{float((ref - torch_flow(s, d)[:2]).abs().max()):.1e} px"
        )
        if not dis:
            continue
        saved = cv2.getNumThreads()
        cv2.setNumThreads(1)
        try:
            with ThreadPoolExecutor(threads) as pool:
                for preset in ("fast", "medium"):
                    n = threads * (8 if preset == "fast" else 2)

                    def run():
                        list(pool.map(lambda _: flow_u8(src, dst, "dis", preset), range(n)))

                    t = timed(run, dev, min_s=1.5, min_n=1)
                    say(f"{w}x{h} DIS {preset:6s} x{threads}: {n / t:8.1f} flows/s")
        finally:
            cv2.setNumThreads(saved)


# -- stream -----------------------------------------------------------------------------------


def stream_clips(size, frames: int = 17):
    """Two (T, H, W, 3) uint8 clips at ``size`` (h, w): a photograph moving 1.3 px right and
    0.4 px down per frame (its channels offset), and a noisy copy (+-3)."""
    from skimage import data as skdata

    h, w = size
    photo = photo_grey(skdata.coffee(), max(h / 400, w / 600) * 1.1)
    grey = [synthetic_pair(photo, (h, w), shift=(1.3 * t, 0.4 * t))[1] for t in range(frames)]
    a = np.stack([np.stack([f, np.roll(f, 3, 0), np.roll(f, 5, 1)], -1) for f in grey])
    rng = np.random.default_rng(0)
    b = np.clip(a.astype(np.int16) + rng.integers(-3, 4, a.shape), 0, 255).astype(np.uint8)
    return a, b


def part_stream(dev, seconds: float, size, rows=None) -> dict[int, float]:
    """PairEvaluator rows (all, or the numbers in ``rows``); returns pairs/s by row number."""
    from evalkit.metrics.stream import PairEvaluator, stream_pair

    h, w = size
    a, b = stream_clips(size)
    rates = {}
    say(f"\n## PairEvaluator from frames in host memory, {w}x{h}, {dev.type} (cycle of {len(a)} frames)")
    from evalkit.metrics import torchflow

    default_finest = torchflow.torch_flow.__kwdefaults__["finest"]
    all_rows = (
        ("LPIPS+SSIM+PSNR", dict(temporal=False), 16, None),
        ("full set, flow dis-fast", dict(flow="dis"), 8, None),
        ("full set, flow torch", dict(flow="torch"), 8, None),
        ("full set, flow torch", dict(flow="torch"), 16, None),
        ("full set, torch fin1", dict(flow="torch"), 16, 1),
        ("full set, torch fin0", dict(flow="torch"), 16, 0),
    )
    for i, (label, kw, chunk, finest) in enumerate(all_rows):
        if rows is not None and i not in rows:
            continue
        ev = PairEvaluator(device=dev, **kw)
        # a fixed working level for the torch flow (benchmark only: patched default)
        torchflow.torch_flow.__kwdefaults__["finest"] = finest if finest is not None else default_finest
        try:

            def cyc(x, n):
                for i in range(n):
                    yield x[i % len(x)]

            warm = 3 * chunk
            for _ in stream_pair(cyc(a, warm), cyc(b, warm), evaluator=ev, chunk=chunk):
                pass
            n = chunk * max(4, int(seconds * 300 / chunk))
            ev.reset()
            sync(dev)
            t0 = time.perf_counter()
            done = 0
            for _ in stream_pair(cyc(a, n), cyc(b, n), evaluator=ev, chunk=chunk):
                done += 1
            sync(dev)
            dt = time.perf_counter() - t0
            tm = ", ".join(f"{k} {v:.2f} s" for k, v in ev.timings.items())
            say(f"{label:26s} chunk {chunk:2d}: {done / dt:7.1f} pairs/s ({done} pairs in {dt:.2f} s; {tm})")
            rates[i] = done / dt
        finally:
            ev.close()
            torchflow.torch_flow.__kwdefaults__["finest"] = default_finest
    return rates


# -- temporal ---------------------------------------------------------------------------------


def part_temporal(dev, seconds: float, size, chunks=(8, 16), rows=(2, 3), repeats: int = 2):
    """The warping errors and tOF from flows on the device: the Triton pass
    (:mod:`evalkit.metrics._triton_temporal`) against the torch path, side by side in one process
    (``fast_paths(triton_temporal=...)``): alone on a chunk of flows, then the PairEvaluator
    full set with ``--flow torch`` (part_stream's ``rows``), each ``repeats`` times in turn."""
    from evalkit.metrics import temporal
    from evalkit.metrics._common import fast_paths, luma, precise, to_unit
    from evalkit.metrics.flow import device_flows

    if temporal._temporal_kernel(dev) is None:
        say(f"\n## temporal kernels: not used on {dev.type} (CUDA and triton needed; EVALKIT_TRITON=0?)")
        return
    h, w = size
    a, b = stream_clips(size)
    say(f"\n## warping errors + tOF from flows on the device, {w}x{h}, {dev.type}: Triton pass vs torch path")
    for m in chunks:
        clips = [on_device(torch.from_numpy(x[: m + 1]), dev).permute(0, 3, 1, 2) for x in (a, b)]
        with precise():
            pa, pb = (to_unit(c).contiguous() for c in clips)  # as the stream stages them
            y = [luma(c) for c in clips]
            fl = [device_flows(torch.cat([yy[:-1], yy[1:]]), torch.cat([yy[1:], yy[:-1]])) for yy in y]
        args = (pa, pb, fl[0][:m], fl[0][m:], fl[1][:m], fl[1][m:])  # fwd_a, bwd_a, fwd_b, bwd_b
        res, rate = {}, {}
        for on in (False, True):
            with fast_paths(triton_temporal=on):
                res[on] = temporal.temporal_from_flows(*args)
                t = timed(lambda args=args: temporal.temporal_from_flows(*args), dev, min_s=1.0, min_n=5)
            rate[on] = m / t
            say(
                f"chunk {m:2d} {'triton' if on else 'torch ':6s}: {t * 1000 / m:6.3f} ms/pair "
                f"({m / t:8.1f} pairs/s)"
            )
        if temporal.TRITON_TEMPORAL.failed:
            say(f"  the Triton pass FAILED here and fell back: {temporal.TRITON_TEMPORAL.failed}")
        say(f"chunk {m:2d} triton/torch: x{rate[True] / rate[False]:.2f}")
        for name, x, ref in zip(("warp_error_a", "warp_error_b", "tof"), res[True], res[False]):
            both = x.isnan() == ref.isnan()
            rel = ((x - ref).abs() / ref.abs()).nan_to_num(0).max()
            say(
                f"  {name}: max relative difference {float(rel):.1e}, NaN alike {bool(both.all())}, "
                f"mean {float(ref.nanmean()):.6g}"
            )
        with fast_paths(triton_temporal=True):
            two = temporal.temporal_from_flows(pa[:3], pb[:3], *(f[:2] for f in args[2:]))
        same = all(torch.equal(x[:2], y_) for x, y_ in zip(res[True], two))
        say(f"  batch invariance: frames 1-2 alone give the same bits as in the chunk of {m}: {same}")
        del clips, pa, pb, y, fl, args, res
    say(
        f"\n## PairEvaluator full set, flow torch, {w}x{h}: warping error + tOF by the Triton pass vs "
        "the torch path (fast_paths(triton_temporal=...)), best of each"
    )
    best: dict[tuple[int, bool], float] = {}
    for rep in range(repeats):
        for on in (False, True):
            say(f"\n(triton_temporal={on}, round {rep + 1} of {repeats})")
            with fast_paths(triton_temporal=on):
                for i, r in part_stream(dev, seconds, size, rows=list(rows)).items():
                    best[i, on] = max(best.get((i, on), 0.0), r)
    say("")
    for i in rows:
        if (i, False) in best and (i, True) in best:
            off, on = best[i, False], best[i, True]
            say(
                f"full set row {i}: torch path {off:7.1f} pairs/s, Triton pass {on:7.1f} pairs/s, x{on / off:.2f}"
            )


# -- fused ------------------------------------------------------------------------------------


@contextlib.contextmanager
def env_var(name: str, value: str):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def part_fused(dev, batches, sizes, seconds: float, stream_size, profile: bool = False, syn_size=(720, 1280)):
    if not use_fused(dev):
        say(f"\n## fused flow: not available on {dev.type} (CUDA and triton needed; EVALKIT_TRITON=0?)")
        return
    import triton

    say(
        f"\n## torch flow ({CONVENTION}): fused Triton path vs torch path, {dev.type}, triton {triton.__version__} "
        "(one Jacobi iteration per launch)"
    )
    for h, w in sizes:
        _, _, s1, d1 = device_pair(h, w, dev)
        for bs in batches:
            s, d = batch_of(s1, bs), batch_of(d1, bs)
            rate = {}
            for fused in (False, True):
                torch.cuda.reset_peak_memory_stats(dev)
                try:
                    t = timed(
                        lambda fused=fused, s=s, d=d: torch_flow(s, d, fused=fused), dev, min_s=1.5, min_n=2
                    )
                except torch.OutOfMemoryError:
                    say(f"{w}x{h} batch {bs} {'fused' if fused else 'torch'}: out of memory")
                    continue
                rate[fused] = bs / t
                mem = torch.cuda.max_memory_allocated(dev) / 2**30
                say(
                    f"{w}x{h} batch {bs:3d} {'fused' if fused else 'torch':5s}: {bs / t:8.1f} flows/s "
                    f"({t * 1000 / bs:.2f} ms/flow, peak GPU {mem:.1f} GiB)"
                )
            if len(rate) == 2:
                say(f"{w}x{h} batch {bs:3d} fused/torch: x{rate[True] / rate[False]:.2f}")
        bs = batches[-1]
        s, d = batch_of(s1, bs), batch_of(d1, bs)
        ref, got = torch_flow(s[:2], d[:2], fused=False), torch_flow(s, d, fused=True)
        say(
            f"{w}x{h} max |flow fused - flow torch| = {float((got[:2] - ref).abs().max()):.1e} px; "
            f"batch invariance max |fused(batch 2) - fused(batch {bs})[:2]| = "
            f"{float((torch_flow(s[:2], d[:2], fused=True) - got[:2]).abs().max()):.1e} px"
        )
        del s, d, ref, got
        if profile:
            sg, dg = batch_of(s1, 16), batch_of(d1, 16)
            cuda_profile(dev, lambda: torch_flow(sg, dg, fused=True))
        torch.cuda.empty_cache()
    sh, sw = syn_size
    say(f"\n## synthetic motion, {sw}x{sh} windows, end-point error in pixels: torch path vs fused path")
    errs = {False: [], True: []}
    diffs = []
    for _, _, src, dst, truth in synthetic_cases(syn_size):
        f = {fu: tflow(src, dst, dev, fused=fu) for fu in (False, True)}
        for fu in f:
            errs[fu].append(endpoint_error(f[fu], truth))
        diffs.append(float(np.abs(f[True] - f[False]).max()))
    good = [dv for dv, e in zip(diffs, errs[False]) if e < 1.0]
    say(
        f"mean EPE torch path {np.mean(errs[False]):.4f} px, fused {np.mean(errs[True]):.4f} px "
        f"({len(errs[True])} cases); max |per-case EPE difference| "
        f"{max(abs(a - b) for a, b in zip(errs[False], errs[True])):.1e} px; max |flow difference| "
        f"{max(diffs):.1e} px ({max(good, default=float('nan')):.1e} px on the {len(good)} cases with EPE < 1 px: "
        "where the method fails, the flow also moves by ~1e-3 px when the input moves by one float32 ulp)"
    )
    for flag in ("0", "1"):
        with env_var("EVALKIT_TRITON", flag):
            say(f"\n(EVALKIT_TRITON={flag}: fused path {'on' if flag == '1' else 'off'})")
            part_stream(dev, seconds, stream_size, rows=[3])


# -- lpips ------------------------------------------------------------------------------------


def part_lpips(dev, batches, size):
    from evalkit.metrics.perceptual import LPIPS

    h, w = size
    g = torch.Generator().manual_seed(0)
    base = torch.rand((1, 3, h // 8, w // 8), generator=g)
    img = torch.nn.functional.interpolate(base, size=(h, w), mode="bicubic").clamp(0, 1)
    say(f"\n## LPIPS-alex alone, strict fp32 (TF32 off, deterministic cuDNN), {w}x{h}, frames on {dev.type}")
    model = LPIPS("alex", device=dev)
    ref_pkg = None
    try:
        import lpips as lpips_pkg

        from evalkit.metrics.weights import load_state_dict

        ref_pkg = lpips_pkg.LPIPS(net="alex", pnet_rand=True, verbose=False)
        ref_pkg.load_state_dict(load_state_dict("alex"), strict=False)
        ref_pkg = ref_pkg.eval().to(dev)
    except ImportError:
        say("(lpips package not installed: agreement checked against today's metrics/perceptual.py only)")
    results = {}
    for bs in batches:
        noise = torch.rand((bs, 3, h, w), generator=g) * 0.1
        a = img.expand(bs, -1, -1, -1).contiguous().to(dev)
        b = (a + noise.to(dev) - 0.05).clamp(0, 1)
        u = torch.cat([a, b])
        with precise(True):
            f = model.features(u)
            want = model.distance([t[:bs] for t in f], [t[bs:] for t in f])
            del f
        pkg = None
        if ref_pkg is not None:
            with precise(True):
                pkg = ref_pkg(a * 2 - 1, b * 2 - 1).reshape(-1)

        def today(u=u, bs=bs):
            with precise(True):
                f = model.features(u)
                return model.distance([t[:bs] for t in f], [t[bs:] for t in f])

        def no_autotune(u=u, bs=bs):
            with precise(False):
                f = model.features(u)
                return model.distance([t[:bs] for t in f], [t[bs:] for t in f])

        def trunk_only(u=u):
            with precise(True):
                x = ((u * 2 - 1) - model.shift) / model.scale
                for sl in model.slices:
                    x = sl(x)
                return x

        variants = {"today (autotune on)": today, "autotune off": no_autotune, "trunk alone": trunk_only}
        if dev.type == "cuda":
            variants["channels-last input"] = lambda u=u, bs=bs: today(
                u.contiguous(memory_format=torch.channels_last), bs
            )
            try:
                graph = torch.cuda.CUDAGraph()
                static = u.clone()
                with precise(True):
                    for _ in range(2):
                        today(static, bs)
                    torch.cuda.synchronize()
                    with torch.cuda.graph(graph):
                        gout = today(static, bs)

                def graphed(u=u):
                    static.copy_(u)
                    graph.replay()
                    return gout

                variants["CUDA graph"] = graphed
            except Exception as e:  # noqa: BLE001 -- report and go on
                say(f"CUDA graph capture failed: {type(e).__name__}: {e}")
        base_t = None
        for name, fn in variants.items():
            t = timed(fn, dev, min_s=1.0, min_n=3)
            base_t = base_t or t
            out = fn()
            agree = ""
            if name != "trunk alone":
                agree = f" | max|d| vs today {float((out - want).abs().max()):.1e}"
                if pkg is not None:
                    agree += f", vs lpips pkg {float((out - pkg).abs().max()):.1e}"
            results[(bs, name)] = bs / t
            say(f"batch {bs:3d} {name:22s}: {bs / t:7.1f} pairs/s  x{base_t / t:.3f}{agree}")
        if pkg is not None:

            def pkg_fwd(a=a, b=b):
                with precise(True):
                    return ref_pkg(a * 2 - 1, b * 2 - 1)

            t = timed(pkg_fwd, dev, min_s=1.0, min_n=3)
            say(f"batch {bs:3d} {'lpips package, strict':22s}: {bs / t:7.1f} pairs/s  x{base_t / t:.3f}")
        del a, b, u
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=PARTS, action="append", help="parts to run (default all)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="DIS threads (default: CPU cores)")
    p.add_argument("--large", action="store_true", help="also the 1280x720 synthetic set")
    p.add_argument("--no-small", action="store_true", help="not the 320x180 synthetic set")
    p.add_argument("--no-dis", action="store_true", help="speed part: torch only")
    p.add_argument(
        "--big-batches", action="store_true", help="speed part: also batches of 2^26 and 2^27 pixels"
    )
    p.add_argument("--profile", action="store_true", help="speed part: CUDA kernel time of one batch")
    p.add_argument("--stream-rows", default=None, help="stream part: row numbers to run (default all)")
    p.add_argument("--batches", default="8,16,32", help="flow batch sizes (speed part)")
    p.add_argument("--lpips-batches", default="8,16,32")
    p.add_argument("--fused-batches", default="16,32", help="flow batch sizes (fused part)")
    p.add_argument("--seconds", type=float, default=3.0, help="stream part: about this long per row")
    p.add_argument("--repeats", type=int, default=2, help="temporal part: rounds of the full set off and on")
    p.add_argument("--frames", type=int, default=24, help="real part: frames per clip")
    p.add_argument(
        "--sizes",
        default="1280x720,1920x1080",
        help="frame sizes of the speed, fused and schedules parts (schedules: '' for none)",
    )
    p.add_argument(
        "--schedules",
        nargs="+",
        default=list(SCHEDULES),
        metavar="[NAME=]KEY=VALUE,...",
        help="schedules part: torch flow schedules, e.g. 'v1=finest=0,warps=3,inner=10' "
        "'finest=1,warps=1/3/4,inner=15' (warps/inner per pyramid level from level 0, "
        "joined by /; default: v1, v2 and the session-10 sweep)",
    )
    p.add_argument("--size", default="1280x720", help="frame size of the stream and lpips parts")
    p.add_argument("--out", type=Path, default=None, help="also write what is printed to this file")
    args = p.parse_args(argv)
    for text in args.schedules:
        try:
            parse_schedule(text)
        except ValueError as e:
            p.error(str(e))
    dev = resolve_device(args.device)
    hw = lambda s: tuple(int(v) for v in s.split("x"))[::-1]  # noqa: E731
    threads = args.threads or len(os.sched_getaffinity(0))
    import cv2

    head = (
        f"bench_flow | device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}) | "
        f"torch {torch.__version__} | opencv {cv2.__version__} | cpus {len(os.sched_getaffinity(0))} | "
        f"torch threads {torch.get_num_threads()} | {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    if args.out:
        import io

        class Tee(io.TextIOBase):
            def __init__(self, *fs):
                self.fs = fs

            def write(self, s):
                for f in self.fs:
                    f.write(s)
                    f.flush()
                return len(s)

        sys.stdout = Tee(sys.__stdout__, open(args.out, "w"))
    say(head)
    parts = args.part or list(PARTS)
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part == "synthetic":
                part_synthetic(dev, args.large, not args.no_small)
            elif part == "schedules":
                part_schedules(
                    dev,
                    args.schedules,
                    [hw(x) for x in args.sizes.split(",") if x],
                    args.large,
                    not args.no_small,
                )
            elif part == "real":
                part_real(dev, args.frames)
            elif part == "speed":
                part_speed(
                    dev,
                    threads,
                    [int(x) for x in args.batches.split(",")],
                    [hw(x) for x in args.sizes.split(",")],
                    not args.no_dis,
                    args.big_batches,
                    args.profile,
                )
            elif part == "stream":
                part_stream(
                    dev,
                    args.seconds,
                    hw(args.size),
                    None if args.stream_rows is None else [int(x) for x in args.stream_rows.split(",")],
                )
            elif part == "temporal":
                part_temporal(
                    dev,
                    args.seconds,
                    hw(args.size),
                    rows=(2, 3)
                    if args.stream_rows is None
                    else [int(x) for x in args.stream_rows.split(",")],
                    repeats=args.repeats,
                )
            elif part == "fused":
                part_fused(
                    dev,
                    [int(x) for x in args.fused_batches.split(",")],
                    [hw(x) for x in args.sizes.split(",")],
                    args.seconds,
                    hw(args.size),
                    args.profile,
                )
            elif part == "lpips":
                part_lpips(dev, [int(x) for x in args.lpips_batches.split(",")], hw(args.size))
        except Exception as e:  # noqa: BLE001 -- one part failing must not lose the others
            import traceback

            traceback.print_exc()
            say(f"[{part}] FAILED: {type(e).__name__}: {e}")
        say(f"[{part}] {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
