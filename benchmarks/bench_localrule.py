"""The local delivery rule on known kinds of difference: for each canary clip and each case of
:mod:`evalkit.testing.deliverycases` (flicker, crf16, crf32, bf16, glitch), the trial streams
``study create`` makes for an ABX row (:func:`evalkit.study.media.store_tiled_streams`, every
arrangement), decoded and measured (:func:`evalkit.study.delivery.row_figures`, the worst
stream): the old global headroom, the retained correlation and gain, the local rule's share
kept and verdict, and the predictor's (:func:`evalkit.study.delivery.predict`) from the
pair's report figures.

    python benchmarks/bench_localrule.py [--clips N] [--frames N] [--out FILE]

Figures: docs/studies.md ("Delivery fidelity"); results in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalkit.fsutil import datasets_dir  # noqa: E402
from evalkit.study import delivery, design  # noqa: E402
from evalkit.study.media import store_tiled_streams  # noqa: E402
from evalkit.testing.deliverycases import CASES, case, frame_rows  # noqa: E402
from evalkit.video import read_frames  # noqa: E402


def measure(a, b, fps, media, margin_db: float = delivery.MARGIN_DB) -> dict:
    """An ABX row of ``a`` against ``b`` as ``study create`` delivers it: its judged figures."""
    keys = design.stream_keys("abx")
    made = store_tiled_streams([{"a": a, "b": b}], [list(k) for k in keys], fps, media)
    streams = {"rects": made[0][1]["rects"], "files": {k: m[0] for k, m in zip(keys, made)}}
    return delivery.judge(delivery.row_figures(media, streams, {"a": a, "b": b}, margin_db))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=8)
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--margin", type=float, default=delivery.MARGIN_DB, help="dB")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    lines = [
        "| clip | case | PSNR dB | old headroom dB | correlation | gain | amplitude | "
        "local corr. | kept | accepted | predicted | encode+measure s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    clips = sorted((datasets_dir() / "canary" / "clips").glob("*.mkv"))[: a.clips]
    for clip in clips:
        src, fps = read_frames(clip)
        src = src[: a.frames]
        for name in a.cases.split(","):
            fa, fb = case(src, fps, name)
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as media:
                f = measure(fa, fb, fps, media, a.margin)
            dt = time.perf_counter() - t0
            pred = delivery.predict(frame_rows(fa, fb))
            line = (
                f"| {clip.stem} | {name} | {f['ab_lossless_db']} | {f['headroom_db']} | "
                f"{f['correlation']} | {f['gain']} | {f['amplitude']} | "
                f"{f['local_correlation']} | {f['kept']} | {f['ok']} | "
                f"{'masks' if pred['masks'] else 'keeps'} ({pred['local_rms']}) | {dt:.1f} |"
            )
            lines.append(line)
            print(line, flush=True)
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
