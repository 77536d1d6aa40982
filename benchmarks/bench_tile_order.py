#!/usr/bin/env python
"""Does an ABX trial file's size tell where X's match is? Per clip, the six orders of tiles
(X, its match and the other side) encoded as ``study create`` does (H.264: :func:`evalkit.study
.media.store_tiled_streams`; lossless WebP: :mod:`evalkit.study.lossless` where it is present,
else the same frames through Pillow with the same options, the VP8L sizes being all that
differs), and the two places of the match compared with X's content fixed:

- before (X in tile 0, issue 44 item 1): match next to X (tile 1) minus one tile away (tile 2):
  ``aab - aba``, ``bba - bab``;
- after (X in the middle tile, :func:`evalkit.study.design.stream_keys`): match left (tile 0)
  minus match right (tile 2): ``aab - baa``, ``bba - abb``.

And preference: backend B left (``ba``) minus right (``ab``) (a row has one of them since
:func:`evalkit.study.design.row_keys`); and the two files of an ABX row of one place (X's
content a minus b, the match's place fixed): per place, for the lossless layout (X in tile 2)
and the middle one.

Per pair: the whole file's bytes and each frame's coded bytes (H.264: the slice NAL units with
padding stripped, as :func:`evalkit.testing.attack.features` reads them; WebP: each frame's VP8L
chunk). Printed: the mean difference (percent of the second file), its spread, the share of
pairs (and of frames) where the first is smaller, and the two-sided sign test p; a pooled rule
"the smaller files of a clip have the match at the first place" is right in that share of
pairs (or its complement).

Clips: the 8 canary clips (``datasets/canary/clips``, 256x256, 24 frames) against
:func:`evalkit.testing.attack.backend_b` of them (smoothed, +-1 noise: a bf16-like difference),
and the attacker suite's scenes (4 families x 4 seeds, 64x48, 12 frames).

    .venv/bin/python benchmarks/bench_tile_order.py [--out benchmarks/results/tile_order_cpu2.txt]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

ORDERS = ("aab", "aba", "baa", "abb", "bab", "bba", "ab", "ba")
#: (layout, [(first, second)] per X content): first minus second
PAIRS = {
    "before: X tile 0, match tile 1 minus tile 2": [("aab", "aba"), ("bba", "bab")],
    "after: X tile 1, match tile 0 minus tile 2": [("aab", "baa"), ("bba", "abb")],
    "X tile 2 (lossless, both places: before row_keys), match tile 0 minus tile 1": [
        ("aba", "baa"),
        ("bab", "abb"),
    ],
    "preference (before row_keys): backend B left minus right": [("ba", "ab")],
    # the two files of a row of one place (design.row_keys; lossless now): they differ in
    # X's content, so the pooled rule compares X = a with X = b; the place is told only if
    # these differ between the places
    "one place, X tile 2 (lossless now): X a minus X b, match tile 0": [("aba", "bab")],
    "one place, X tile 2 (lossless now): X a minus X b, match tile 1": [("baa", "abb")],
    "one place, X tile 1 (not used): X a minus X b, match tile 0": [("aab", "bba")],
    "one place, X tile 1 (not used): X a minus X b, match tile 2": [("baa", "abb")],
}


def cases():
    from evalkit.testing import attack
    from evalkit.video import read_frames

    for i, path in enumerate(sorted((ROOT / "datasets" / "canary" / "clips").glob("*.mkv"))):
        a = read_frames(path)[0]
        yield "canary", path.stem, a, attack.backend_b(a, i)
    for fam in attack.FAMILIES:
        for sd in range(4):
            a = attack.scene(fam, sd)
            yield "scenes", f"{fam}-{sd}", a, attack.backend_b(a, sd)


def h264(a, b, tmp) -> dict:
    """order -> (file bytes, per-frame coded bytes)."""
    from evalkit.study.media import store_tiled_streams
    from evalkit.testing.attack import features

    got = store_tiled_streams([{"a": a, "b": b}], [list(o) for o in ORDERS], 24, tmp)
    out = {}
    for o, (sha, _, _) in zip(ORDERS, got):
        data = (Path(tmp) / f"{sha}.mp4").read_bytes()
        out[o] = (len(data), features(data)["_sizes"])
    return out


def webp(a, b) -> tuple[dict, str]:
    from evalkit.study.media import tile_frames, tile_layout

    try:
        from evalkit.study import lossless

        def frame_bytes(f):
            return len(lossless.vp8l(f))

        how = "evalkit.study.lossless.vp8l"
    except ImportError:
        from PIL import Image

        def frame_bytes(f):
            buf = io.BytesIO()
            Image.fromarray(f).save(buf, "WEBP", lossless=True, quality=0, method=0, exact=True)
            return len(buf.getvalue())

        how = "Pillow WEBP lossless quality=0 method=0 (lossless not on this branch)"
    out = {}
    for o in ORDERS:
        lay = tile_layout(len(o), a.shape[1], a.shape[2])
        sizes = np.array([frame_bytes(f) for f in tile_frames([{"a": a, "b": b}[c] for c in o], lay)], float)
        out[o] = (float(sizes.sum()), sizes)
    return out, how


def summary(rows: list[tuple[float, np.ndarray]]) -> str:
    """rows: (file difference %, per-frame differences %) per pair."""
    from scipy.stats import binomtest

    d = np.array([r[0] for r in rows])
    fr = np.concatenate([r[1] for r in rows])
    neg, n = int((d < 0).sum()), len(d)
    nz = int((d != 0).sum())
    p = binomtest(neg, nz, 0.5).pvalue if nz else 1.0
    fneg = int((fr < 0).sum())
    fnz = int((fr != 0).sum())
    return (
        f"files: mean {d.mean():+.3f}% (sd {d.std():.3f}), first smaller in {neg}/{n} "
        f"(equal {n - nz}), sign p={p:.2g}; frames: mean {fr.mean():+.3f}%, first smaller "
        f"in {fneg}/{len(fr)} (equal {len(fr) - fnz})"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    got = {}  # (codec, set) -> [(case, {order: (bytes, frames)})]
    how = ""
    with tempfile.TemporaryDirectory() as tmp:
        for kind, name, a, b in cases():
            got.setdefault(("H.264 stream (store_tiled_streams, QP 12)", kind), []).append(
                (name, h264(a, b, tmp))
            )
            w, how = webp(a, b)
            got.setdefault(("lossless WebP", kind), []).append((name, w))
    say("## ABX trial files: does the size tell where X's match is? (first minus second, X's content fixed)")
    say(f"WebP frames: {how}")
    for (codec, kind), per in got.items():
        say(f"\n{codec}, {kind} ({len(per)} clips; ABX 2 pairs each, preference 1)")
        for layout, pairs in PAIRS.items():
            rows = []
            for _, sizes in per:
                for one, two in pairs:
                    (s1, f1), (s2, f2) = sizes[one], sizes[two]
                    rows.append((100 * (s1 - s2) / s2, 100 * (f1 - f2) / np.maximum(f2, 1)))
            say(f"  {layout}: {summary(rows)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
