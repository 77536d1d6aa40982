#!/usr/bin/env python
"""The format of lossless trials (``study create --delivery lossless``), measured: per frame of
a trial (the tiled frame of :mod:`evalkit.study.media`), Pillow's lossless WebP at several
efforts against PNG at several zlib levels (the frames of an APNG): encode time on this CPU
and bytes; and whether a frame's size tells where the equal tiles of an ABX trial are (the
six orders of tiles a, a, b: a compressor that matches across tiles makes neighbours cheaper);
and, as the attacker suite's scenes would show it, whether a file is smaller when the match of
X (in tile 0) is in tile 1 rather than tile 2.

Frames: the scale720 clip ``astronaut_pan`` (``datasets/make_clips.render_clip`` at 1280x720,
frames 100-103) as A, A blurred (sigma 0.6) as B, tiled for ABX (3904x752); the 64x64 corner
of the same; and 256x256 of +-1 noise around uniform noise (the issue's worst case).

    .venv/bin/python benchmarks/bench_lossless_delivery.py [--out benchmarks/results/lossless_delivery_cpu2.txt]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "datasets"))

import numpy as np  # noqa: E402

FORMATS = (
    ("WEBP", dict(lossless=True, quality=0, method=0, exact=True)),
    ("WEBP", dict(lossless=True, quality=25, method=0, exact=True)),
    ("WEBP", dict(lossless=True, quality=50, method=1, exact=True)),
    ("WEBP", dict(lossless=True, quality=75, method=4, exact=True)),
    ("PNG", dict(compress_level=1)),
    ("PNG", dict(compress_level=3)),
    ("PNG", dict(compress_level=6)),
)


def size(frame, fmt, **kw) -> int:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, fmt, **kw)
    return len(buf.getvalue())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import make_clips
    from scipy.ndimage import gaussian_filter

    from evalkit.study.media import tile_frames, tile_layout

    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    a = np.asarray(
        make_clips.render_clip(
            "astronaut_pan", 1280, 240, 24, {}, height=720, subframes=3, first=100, count=4
        )
    )
    b = np.stack([gaussian_filter(f, (0.6, 0.6, 0)) for f in a])
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (1, 256, 256, 3))
    noise = np.clip(base + rng.integers(-1, 2, (4, 256, 256, 3)), 0, 255).astype(np.uint8)
    tiled = tile_frames([a, b, a], tile_layout(3, 720, 1280))
    say(
        "## bytes and encode time per frame (Pillow "
        f"{__import__('PIL').__version__}, libwebp {__import__('PIL.features').features.version('webp')})"
    )
    for name, frames in (("ABX 720p tiled 3904x752", tiled), ("noise 256x256", noise)):
        raw = frames[0].nbytes
        say(f"{name}: raw {raw / 1e6:.2f} MB a frame")
        for fmt, kw in FORMATS:
            t0 = time.process_time()
            n = [size(f, fmt, **kw) for f in frames]
            ms = (time.process_time() - t0) / len(frames) * 1000
            opts = ", ".join(f"{k}={v}" for k, v in kw.items() if k not in ("lossless", "exact"))
            say(
                f"  {fmt} {opts}: {ms:.0f} ms CPU a frame, {np.mean(n) / 1e6:.3f} MB "
                f"({np.mean(n) / raw:.3f} of raw)"
            )
    say("\n## a frame's bytes by tile order (ABX: a is X and its equal; first frame)")
    for h, w in ((720, 1280), (64, 64)):
        lay = tile_layout(3, h, w)
        tiles = {"a": a[:1, :h, :w], "b": b[:1, :h, :w]}
        for fmt, kw in (FORMATS[0], FORMATS[4]):
            got = {
                o: size(tile_frames([tiles[c] for c in o], lay)[0], fmt, **kw)
                for o in ("aab", "aba", "baa", "abb", "bab", "bba")
            }
            lo, hi = min(got.values()), max(got.values())
            opts = ", ".join(f"{k}={v}" for k, v in kw.items() if k not in ("lossless", "exact"))
            say(
                f"  {w}x{h} tiles, {fmt} {opts}: "
                + ", ".join(f"{o} {v}" for o, v in got.items())
                + f"; spread {100 * (hi - lo) / lo:.2f}%"
            )
    say(
        "\n## ABX with X in tile 0: the match in tile 1 against tile 2, the same X content "
        "(the attacker suite's 64x48 scenes, 4 families x 4 seeds, first frame)"
    )
    from evalkit.testing import attack

    cases = []
    for fam in attack.FAMILIES:
        for sd in range(4):
            x = attack.scene(fam, sd, t=1)
            cases.append((x, attack.backend_b(x, sd)))
    lay = tile_layout(3, 48, 64)
    for fmt, kw in (FORMATS[0], FORMATS[2], FORMATS[3], FORMATS[4]):
        d = []
        for x, y in cases:
            got = {
                o: size(tile_frames([{"a": x, "b": y}[c] for c in o], lay)[0], fmt, **kw)
                for o in ("aab", "aba", "bba", "bab")
            }
            d += [(got["aab"] - got["aba"]) / got["aba"] * 100, (got["bba"] - got["bab"]) / got["bab"] * 100]
        d = np.array(d)
        opts = ", ".join(f"{k}={v}" for k, v in kw.items() if k not in ("lossless", "exact"))
        say(
            f"  {fmt} {opts}: match in tile 1 minus tile 2: mean {d.mean():+.2f}% (sd "
            f"{d.std():.2f}), smaller in {100 * (d < 0).mean():.0f}% of {len(d)} pairs"
        )
    # the same question for whole 12-frame trial files: today's H.264 stream and lossless WebP
    import tempfile

    from evalkit.study.lossless import write_webp
    from evalkit.study.media import store_tiled

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("H.264 trial stream (store_tiled)", "animated lossless WebP (write_webp)"):
            d = []
            for sd in range(4):
                for fam in attack.FAMILIES:
                    x = attack.scene(fam, sd)
                    y = attack.backend_b(x, sd)
                    got = {}
                    for o in ("aab", "aba", "bba", "bab"):
                        tiles = [{"a": x, "b": y}[c] for c in o]
                        if name.startswith("H.264"):
                            sha, _ = store_tiled(tiles, 24, tmp)
                            got[o] = (Path(tmp) / f"{sha}.mp4").stat().st_size
                        else:
                            f = Path(tmp) / "t.webp"
                            write_webp(f, iter(tile_frames(tiles, lay)), 24)
                            got[o] = f.stat().st_size
                    d += [
                        (got["aab"] - got["aba"]) / got["aba"] * 100,
                        (got["bba"] - got["bab"]) / got["bab"] * 100,
                    ]
            d = np.array(d)
            say(
                f"  whole files, 12 frames, {name}: match in tile 1 minus tile 2: mean "
                f"{d.mean():+.2f}% (sd {d.std():.2f}), smaller in {100 * (d < 0).mean():.0f}% of "
                f"{len(d)} pairs"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
