"""Speed of VMAF (evalkit.metrics.vmaf: libvmaf in imageio-ffmpeg's ffmpeg) against LPIPS, on the CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_vmaf.py                  # 256x256 and 1280x720
    PYTHONPATH=. .venv/bin/python benchmarks/bench_vmaf.py --sizes 256x256 --frames 32 --rounds 2

Both sides score the same pair of clips held in memory: A is a natural clip of the canary suite
(``datasets/canary/clips/``), resized to the frame size with bicubic interpolation, B is A
re-encoded with x264 at CRF 28 and decoded (so VMAF sees a realistic distortion; LPIPS does
not care). Timed:

* ``vmaf``       -- :func:`evalkit.metrics.vmaf.vmaf` end to end: our RGB -> YUV 4:4:4 conversion,
  the pipe, ffmpeg + libvmaf (``n_threads`` = the cores this process may use, and 1), the
  JSON log;
* ``yuv``        -- the RGB -> YUV conversion alone (both clips), the part done in Python;
* ``lpips``      -- :func:`evalkit.metrics.lpips` on the CPU (AlexNet, float32), in batches of 8 at
  256x256 and 2 at 720p, like the stream evaluator's CPU chunks.

The machine is shared, so the sides alternate in blocks for ``--rounds`` rounds in one
process and the rates are cumulative (frames over the seconds of all blocks). Frames per
second are printed per side, with the ratio VMAF / LPIPS, the load average and the VMAF mean.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalkit.metrics.vmaf import check_available, rgb_to_yuv444, vmaf  # noqa: E402


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def make_pair(n: int, h: int, w: int, clip: str = "chelsea_handheld") -> tuple[np.ndarray, np.ndarray]:
    """A: a canary clip resized to w x h, cycled to n frames; B: A through x264 CRF 28."""
    import io

    import av
    from PIL import Image

    from evalkit.video import ClipReader

    src = ClipReader(ROOT / "datasets" / "canary" / "clips" / f"{clip}.mkv").read()
    a = np.stack(
        [np.asarray(Image.fromarray(src[t % len(src)]).resize((w, h), Image.BICUBIC)) for t in range(n)]
    )
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("libx264", rate=24, options={"crf": "28", "preset": "veryfast"})
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for f in a:
            c.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        c.mux(s.encode())
    buf.seek(0)
    with av.open(buf) as c:
        b = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    return a, b


def run_size(h: int, w: int, frames: int, rounds: int) -> dict:
    import torch

    from evalkit import metrics

    a, b = make_pair(frames, h, w)
    ta, tb = torch.from_numpy(a).permute(0, 3, 1, 2), torch.from_numpy(b).permute(0, 3, 1, 2)
    batch = 8 if h * w <= 256 * 256 else 2
    n_cores = cores()

    def side_vmaf(threads):
        return lambda: vmaf(a, b, n_threads=threads)

    def side_yuv():
        rgb_to_yuv444(a)
        rgb_to_yuv444(b)

    def side_lpips():
        out = [metrics.lpips(ta[i : i + batch], tb[i : i + batch]) for i in range(0, frames, batch)]
        return torch.cat(out)

    sides = {
        f"vmaf n_threads={n_cores}": side_vmaf(n_cores),
        "vmaf n_threads=1": side_vmaf(1),
        "yuv (conversion only)": side_yuv,
        "lpips alex cpu": side_lpips,
    }
    # warm-up: model load, ffmpeg probe, page cache
    res = vmaf(a[:2], b[:2])
    metrics.lpips(ta[:1], tb[:1])
    secs = dict.fromkeys(sides, 0.0)
    for _ in range(rounds):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            out = fn()
            secs[name] += time.perf_counter() - t0
            if name.startswith("vmaf n_threads=") and out is not None:
                res = out
    rates = {name: frames * rounds / s for name, s in secs.items()}
    return {
        "size": f"{w}x{h}",
        "frames": frames,
        "rounds": rounds,
        "rates": rates,
        "vmaf_mean": res.mean,
        "convention": res.convention,
        "load": os.getloadavg(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256x256,1280x720", help="comma-separated WxH")
    p.add_argument(
        "--frames", type=int, default=None, help="frames per block (default 32 at 256x256, 8 at larger sizes)"
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = p.parse_args(argv)
    exe = check_available()
    print(
        f"# bench_vmaf: {platform.node()} {platform.processor() or platform.machine()}, "
        f"{cores()} usable cores, ffmpeg {exe}"
    )
    for size in args.sizes.split(","):
        w, h = (int(v) for v in size.split("x"))
        frames = args.frames or (32 if w * h <= 256 * 256 else 8)
        r = run_size(h, w, frames, args.rounds)
        print(
            f"\n## {r['size']}: {r['frames']} frames x {r['rounds']} rounds, "
            f"load average {r['load'][0]:.2f} {r['load'][1]:.2f} {r['load'][2]:.2f}"
        )
        lp = r["rates"]["lpips alex cpu"]
        for name, rate in r["rates"].items():
            print(f"  {name:24s} {rate:8.2f} frames/s   {rate / lp:6.2f}x LPIPS")
        print(f"  VMAF mean of the CRF 28 copy: {r['vmaf_mean']:.3f}")
    print(f"\nconvention: {r['convention']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
