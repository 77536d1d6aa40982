"""Delivery fidelity against the trial stream's QP: for each clip of a compare report, every ABX
arrangement of its A and B tiles encoded as ``study create`` does (:data:`evalkit.study.media
.TILED_ENCODING`) but at each QP asked for, decoded and measured by
:func:`evalkit.study.delivery.row_figures` (the worst stream), with the streams' bytes and the
seconds to encode and to measure.

    python benchmarks/bench_delivery.py REPORT [--qp 12,6,2,0] [--clips N]
    python benchmarks/bench_delivery.py --runs RUN_A RUN_B ...   (clips paired by file name:
                                                                  e.g. a seed-shifted re-render)

Figures: docs/studies.md ("Delivery fidelity") and benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalkit.study import (  # noqa: E402
    delivery,
    design,
    read_report,  # noqa: E402
)
from evalkit.study.media import TILED_ENCODING, TILED_X264, tile_frames, tile_layout  # noqa: E402
from evalkit.video import read_frames, write_browser  # noqa: E402


def encoding(qp: int):
    params = ":".join(p for p in TILED_X264.split(":") if not p.startswith("qp=")) + f":qp={qp}"
    return replace(TILED_ENCODING, options={**TILED_ENCODING.options, "x264-params": params})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, nargs="?")
    p.add_argument(
        "--runs",
        type=Path,
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="instead of a report: two run folders, clips paired by file name",
    )
    p.add_argument("--qp", default="12,6,2,0", help="QPs, comma-separated (default 12,6,2,0)")
    p.add_argument("--clips", type=int, default=0, help="first N clips (default all)")
    a = p.parse_args(argv)
    qps = [int(q) for q in a.qp.split(",")]
    if a.runs:
        jobs = [
            {"job": f.stem, "path_a": f, "path_b": a.runs[1] / "clips" / f.name}
            for f in sorted((a.runs[0] / "clips").glob("*.mkv"))
            if (a.runs[1] / "clips" / f.name).is_file()
        ]
    else:
        jobs = read_report(a.report)["jobs"]
    jobs = jobs[: a.clips or None]
    print(
        f"# {a.report or ' against '.join(map(str, a.runs))}: {len(jobs)} clips; load "
        f"average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| clip | frames | QP | A-B lossless dB | A-B delivered dB | encode error dB | "
        "error on the difference dB | headroom dB | accepted (10 dB) | stream bytes max | "
        "encode s | measure s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in jobs:
        fa, fps = read_frames(c["path_a"])
        fb, _ = read_frames(c["path_b"])
        layout = tile_layout(3, fa.shape[1], fa.shape[2])
        for qp in qps:
            with tempfile.TemporaryDirectory() as media:
                files = {}
                t0 = time.perf_counter()
                for key in design.stream_keys("abx"):
                    path = Path(media) / f"{key}.mp4"
                    write_browser(
                        path, tile_frames([{"a": fa, "b": fb}[ch] for ch in key], layout), fps, encoding(qp)
                    )
                    files[key] = key
                t1 = time.perf_counter()
                f = delivery.judge(
                    delivery.row_figures(
                        media, {"rects": layout["rects"], "files": files}, {"a": fa, "b": fb}
                    )
                )
                t2 = time.perf_counter()
                size = max((Path(media) / f"{k}.mp4").stat().st_size for k in files)
            print(
                f"| {c['job']} | {fa.shape[0]}x{fa.shape[2]}x{fa.shape[1]} | {qp} | "
                f"{f['ab_lossless_db']} | {f['ab_delivered_db']} | {f['encode_db']} | "
                f"{f['difference_error_db']} | {f['headroom_db']} | {f['ok']} | {size} | "
                f"{t1 - t0:.2f} | {t2 - t1:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
