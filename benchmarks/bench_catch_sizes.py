#!/usr/bin/env python
"""Do a lossless study's catch files tell themselves apart from test files by their frame sizes?
The two features of the attacker suite that do (issue 45: ``p_cv``, the spread of a file's
frame sizes, and ``twin``, how close the nearest other file of the rater's is in per-frame
sizes), on the attacker's scenes, for ways of making a catch version:

- ``now``: the reference is one side (A or B at random) mirrored and colour-shifted, the
  degraded copy its :func:`evalkit.study.media.degrade` (every tile from one side);
- ``mixed``: the degraded copy is made from the *other* side (mirrored, shifted the same), so a
  catch file holds one side twice and the other once, as a test file does;
- ``reversed`` / ``mixed_reversed``: the same with the catch's frames in reverse order;
- ``two_clips``: the degraded copy made from the other side of *another* clip (the next in a
  random cycle over the catch rows): the file twins no clip's test file.

Per study (one content-family pair of the attacker suite, 14 clips each, a catch version of
every clip, 2 of them graded; each simulated rater gets 10 of them, as in a study: more catch
files than a study has, for tighter figures),
raters are simulated: one file of every row (test rows: X's content and the match's place at
random; lossless: X in tile 2, animated WebP frames as :mod:`evalkit.study.lossless` encodes
them). Printed: over every (catch file, test file) pair of a rater, the share where the catch's
feature is the larger (0.5: no tell), and a held-out stump (fitted on one study, counted on the
other, as the attacker suite does).

    .venv/bin/python benchmarks/bench_catch_sizes.py [--out benchmarks/results/catch_sizes_cpu2.txt]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

VARIANTS = ("now", "mixed", "reversed", "mixed_reversed", "two_clips")


def frame_sizes(tiles, layout):
    from evalkit.study.lossless import vp8l
    from evalkit.study.media import tile_frames

    return np.array(
        [len(vp8l(tile_frames([x[t : t + 1] for x in tiles], layout)[0])) for t in range(len(tiles[0]))],
        float,
    )


def study(families, seeds, rng, protocol, raters=40):
    from evalkit.study import design, threshold
    from evalkit.study.media import degrade, tile_layout
    from evalkit.testing import attack

    clips = []
    for fam in families:
        for s in seeds:
            a = attack.scene(fam, s)
            clips.append((a, attack.backend_b(a, s)))
    n_tiles = 3 if protocol == "abx" else 2
    layout = tile_layout(n_tiles, *clips[0][0].shape[1:3])
    x = design.X_TILE["lossless"]
    tests = []  # per clip: the frame sizes of each of its 4 possible files
    for a, b in clips:
        src = {"a": a, "b": b}
        tests.append([frame_sizes([src[ch] for ch in k], layout) for k in design.stream_keys(protocol, x=x)])
    picks = rng.permutation(len(clips))
    catches = {v: [] for v in VARIANTS}
    for n, i in enumerate(picks):
        a, b = clips[i]
        from_b = bool(rng.integers(2))
        off = threshold.CATCH_OFFSETS[0]
        s, o = (b, a) if from_b else (a, b)
        other = clips[picks[(n + 1) % len(picks)]][0 if from_b else 1]
        kind = "negative" if n < len(picks) - 2 else "hue_mild"
        keys = design.row_keys(protocol, True, x=x, bit=int(rng.integers(2)))
        key = keys[int(rng.integers(len(keys)))]
        for v in VARIANTS:
            ref = threshold.shifted(s[:, :, ::-1], off)
            src = other if v == "two_clips" else o if "mixed" in v else s
            deg = degrade(threshold.shifted(src[:, :, ::-1], off), 24, kind)
            if "reversed" in v:
                ref, deg = ref[::-1], deg[::-1]
            catches[v].append(frame_sizes([{"r": ref, "d": deg}[ch] for ch in key], layout))
    out = {}
    for v in VARIANTS:
        pairs = []
        for _ in range(raters):
            got = [t[int(rng.integers(len(t)))] for t in tests]
            # a rater's 10 catch versions (8 easy, 2 graded) of as many clips, as a study has
            mine = list(rng.choice(len(picks) - 2, 8, replace=False)) + [len(picks) - 2, len(picks) - 1]
            files = [(f, 0) for f in got] + [(catches[v][k], 1) for k in mine]
            feats = []
            for j, (f, is_catch) in enumerate(files):
                twin = min(np.abs(f - g).sum() / f.sum() for k, (g, _) in enumerate(files) if k != j)
                feats.append(
                    {"p_cv": f.std() / f.mean(), "twin": twin, "file_size": f.sum(), "catch": is_catch}
                )
            c = [f for f in feats if f["catch"]]
            t = [f for f in feats if not f["catch"]]
            pairs += [(ci, ti) for ci in c for ti in t]
        out[v] = pairs
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(45)
    lines = [
        "catch file vs test file, lossless (ABX: X in tile 2), the attacker's scenes: share "
        "of (catch, test) pairs of a rater where the catch's feature is larger "
        "(0.5 = no tell); held: a sign stump fitted on the other study, counted on this one"
    ]
    for protocol in ("abx", "preference"):
        studies = {
            "pan+blobs": study(("pan", "blobs"), range(7), rng, protocol),
            "grain+stripes": study(("grain", "stripes"), range(100, 107), rng, protocol),
        }
        lines.append(f"-- {protocol}")
        for v in VARIANTS:
            for feat in ("p_cv", "twin", "file_size"):
                row = [f"{v:15s} {feat:9s}"]
                for name, st in studies.items():
                    d = np.array([c[feat] - t[feat] for c, t in st[v]])
                    row.append(f"{name}: {np.mean(d > 0) + 0.5 * np.mean(d == 0):.3f}")
                (_, s1), (_, s2) = studies.items()
                for fit, test in ((s2, s1), (s1, s2)):
                    d_fit = np.array([c[feat] - t[feat] for c, t in fit[v]])
                    sign = 1 if np.mean(d_fit > 0) >= 0.5 else -1
                    d = np.array([c[feat] - t[feat] for c, t in test[v]])
                    row.append(f"held {np.mean(sign * d > 0):.3f}")
                lines.append("  ".join(row))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
