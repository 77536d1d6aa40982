#!/usr/bin/env python
"""Where a whole ``evalkit compare`` process spends its time: one process, the CLI's own
``main``, with the compare's steps wrapped (this script's patches, not the product's) to print
a timeline from the interpreter's start: imports, the session's start (torch, device, LPIPS
weights), the pairs' hash checks, each job's warm-up and measurement, the report's files.

``--decode-only`` instead reads every pair's two clips through the same decoders a compare uses
(:class:`evalkit.compare.pairing.PairDecoder`, one job ahead) and measures nothing: the pace
decoding alone allows. ``--compute-only`` measures the first pair's frames, held in memory, three
times over: the pace the metrics alone allow.

    python benchmarks/profile_compare.py RUN_A RUN_B --out REPORT [compare options]
    python benchmarks/profile_compare.py RUN_A RUN_B --decode-only
    python benchmarks/profile_compare.py RUN_A RUN_B DEVICE --compute-only
"""

from __future__ import annotations

import os
import sys
import time

T0 = time.perf_counter()


def since_start() -> float:
    """Seconds since this process started (the interpreter's start-up included, from /proc)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return up - start_ticks / os.sysconf("SC_CLK_TCK")
    except OSError:
        return time.perf_counter() - T0


OFFSET = since_start() - (time.perf_counter() - T0)  # interpreter start-up before line 1


def stamp(what: str) -> None:
    print(f"[{time.perf_counter() - T0 + OFFSET:7.2f} s] {what}", file=sys.stderr, flush=True)


def wrap(owner, name: str, label) -> None:
    """``owner.name`` stamped at its start and end (nothing when the tree has no such name:
    the script runs over older trees too)."""
    fn = getattr(owner, name, None)
    if fn is None:
        return

    def timed(*a, **k):
        t = time.perf_counter()
        stamp(f"{label(*a, **k)} begins")
        try:
            return fn(*a, **k)
        finally:
            stamp(f"{label(*a, **k)} ends ({time.perf_counter() - t:.2f} s)")

    setattr(owner, name, timed)


def decode_only(run_a: str, run_b: str) -> None:
    from evalkit.compare.pairing import PairDecoder, pair_jobs
    from evalkit.compare.run import open_run

    a, b = open_run(run_a, "RUN_A"), open_run(run_b, "RUN_B")
    pairs, _ = pair_jobs(a, b, same_seed=True)
    stamp(f"{len(pairs)} pairs found")
    chunk = 8
    t, frames = time.perf_counter(), 0
    ahead = [PairDecoder(pairs[0], chunk)]
    for i, p in enumerate(pairs):
        if i + 1 < len(pairs):
            ahead.append(PairDecoder(pairs[i + 1], chunk))
        dec = ahead.pop(0)
        for ca, cb in zip(dec.a, dec.b):
            frames += len(ca)
        dec.close()
        stamp(f"job {p.job_id} decoded")
    dt = time.perf_counter() - t
    stamp(f"decode only: {frames} pairs in {dt:.2f} s = {frames / dt:.0f} pairs/s")


def compute_only(run_a: str, run_b: str, device: str, repeat: int) -> None:
    """The first pair's clips decoded into memory, then measured ``repeat`` times in a row by
    one evaluator: the pace of the metrics alone (no decoding, no start-up, no report)."""
    import numpy as np

    from evalkit.compare.pairing import pair_jobs
    from evalkit.compare.run import open_run
    from evalkit.metrics.stream import PairEvaluator, evaluator_chunk, stream_pair
    from evalkit.video import ClipReader

    a, b = open_run(run_a, "RUN_A"), open_run(run_b, "RUN_B")
    pairs, _ = pair_jobs(a, b, same_seed=True)
    fa = np.stack(list(ClipReader(pairs[0].path_a)))
    fb = np.stack(list(ClipReader(pairs[0].path_b)))
    stamp(f"decoded {fa.shape} x 2")
    ev = PairEvaluator(device=device)
    chunk = evaluator_chunk(fa.shape[1], fa.shape[2], ev)
    if ev.device.type == "cuda":
        ev.warm_up(fa.shape[1], fa.shape[2], chunk)
    stamp(f"evaluator ready on {ev.device}, chunk {chunk}")
    for r in range(repeat):
        ev.reset()
        t = time.perf_counter()
        n = sum(
            1
            for _ in stream_pair(
                iter(fa[i : i + chunk] for i in range(0, len(fa), chunk)),
                iter(fb[i : i + chunk] for i in range(0, len(fb), chunk)),
                evaluator=ev,
                chunk=chunk,
            )
        )
        ev.compute()
        dt = time.perf_counter() - t
        stamp(f"compute only, pass {r}: {n} pairs in {dt:.2f} s = {n / dt:.0f} pairs/s")


def main() -> int:
    args = sys.argv[1:]
    if "--compute-only" in args:
        args.remove("--compute-only")
        compute_only(args[0], args[1], args[2] if len(args) > 2 else "cuda", 3)
        return 0
    if "--decode-only" in args:
        args.remove("--decode-only")
        decode_only(*args[:2])
        return 0
    stamp("script start (interpreter start-up before it)")
    import evalkit.cli as cli

    stamp("evalkit.cli imported")
    import evalkit.compare.pairing as pairing
    import evalkit.compare.report as report
    import evalkit.compare.run as run

    stamp("evalkit.compare.pairing imported")
    for owner in (pairing, run):
        wrap(owner, "_session_and_pairs", lambda *a, **k: "session start + hash checks")
        wrap(owner, "pair_jobs", lambda *a, **k: "pair_jobs (hashes)")
        wrap(owner, "write_report", lambda *a, **k: "write_report")
        wrap(owner, "finish_report", lambda *a, **k: "finish_report (after the last job)")
    wrap(pairing.LocalCompareSession, "_warm_up", lambda self, p, c: f"warm-up {p.job_id}")
    wrap(pairing, "measure_pair", lambda ev, p, **k: f"measure {p.job_id}")
    wrap(pairing, "resolve_offset", lambda *a, **k: "resolve_offset")
    wrap(report, "write_frames_csv", lambda *a, **k: "frames.csv")
    wrap(report, "write_clips_csv", lambda *a, **k: "clips.csv")
    code = cli.main(["compare", *args])
    stamp(f"compare returned {code}")
    return code


if __name__ == "__main__":
    rc = main()
    stamp("exit")
    sys.exit(rc)
