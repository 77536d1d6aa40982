"""``stream_pair`` from frames in host memory: code trees and settings side by side, one process each.

    PYTHONPATH=. python benchmarks/bench_pipeline.py --baseline BASE_TREE --out OUT/pipeline.txt
    PYTHONPATH=. python benchmarks/bench_pipeline.py --device cpu --size 128x72 --pairs 32 \\
        --variants ours,ours:EVALKIT_TRITON=0                             # smoke check

What it measures: the metric pipeline of ``evalkit compare`` without the decoders. Each variant
runs in a fresh interpreter (its start-up, cuDNN autotuning and Triton loading are its own, as a
user's ``compare`` has them): ``PairEvaluator`` on ``--device``, ``warm_up`` timed, then
``stream_pair`` over ``--pairs`` pairs of uint8 numpy frames (a cycle of 32 synthetic pairs of
``bench_chain.frames``, in host memory) with the full set and the ``"torch"`` flow, then
LPIPS+SSIM+PSNR; pairs/s, the warm-up's seconds and the mean of each metric (the variants must
agree up to float32 rounding). Variants: ``TREE[:VAR=VALUE,...]`` where TREE is ``ours`` (this
checkout) or ``baseline`` (``--baseline``), each environment setting applied in its process
only, e.g. ``ours:EVALKIT_TRITON=0`` or ``ours:CUDNN_BENCH=0`` (this script's own: the
evaluator's ``cudnn_benchmark`` off, cuDNN's heuristics instead of its autotuning). ``--repeats`` rounds, the variants' order reversed
every second round; the best rate of each and its ratio to the first variant are printed.
``--profile PAIRS`` adds a table of the kernels' device time per pair of each variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args) -> dict:
    # the measured tree's code first: bench_chain puts this checkout at the head of sys.path,
    # and a package imported after it would come from here (the baseline would run ours)
    from evalkit import metrics
    from evalkit.metrics.stream import PairEvaluator, stream_pair

    tree = Path.cwd().resolve()
    if not Path(metrics.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"bench_pipeline: metrics imported from {metrics.__file__}, not from {tree}")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_chain import CYCLE, frames

    w, h = map(int, args.size.split("x"))
    a, b = frames(CYCLE, h, w)
    out = {}
    for name, temporal in (("full set torch", True), ("LPIPS+SSIM+PSNR", False)):
        bench = os.environ.get("CUDNN_BENCH")
        ev = PairEvaluator(
            device=args.device,
            temporal=temporal,
            flow="torch",
            cudnn_benchmark=None if bench is None else bench == "1",
        )
        t = time.perf_counter()
        ev.warm_up(h, w, args.chunk)
        warm = time.perf_counter() - t

        def gen(x, n):
            for i in range(n):
                yield x[i % len(x)]

        ev.timings = dict.fromkeys(ev.timings, 0.0)
        with sync_points(args.sync_debug and ev.device.type == "cuda") as syncs:
            t = time.perf_counter()
            n = sum(
                1 for _ in stream_pair(gen(a, args.pairs), gen(b, args.pairs), evaluator=ev, chunk=args.chunk)
            )
            rate = n / (time.perf_counter() - t)
        means = {k: v for k, v in ev.compute()["means"].items() if isinstance(v, float)}
        chunks = -(-n // args.chunk)
        host = {k: 1e3 * v / chunks for k, v in ev.timings.items()}
        out[name] = {"pairs_per_s": rate, "warm_up_s": warm, "means": means, "host_ms": host}
        if syncs:
            out[name]["syncs"] = syncs
        if args.profile:
            out[name]["profile"] = profile(ev, a, b, args)
        ev.close()
    return out


@contextlib.contextmanager
def sync_points(on: bool):
    """With ``on``: torch's CUDA sync debug mode for the block; yields a dict that then holds
    each place (file:line) that made the host wait for the device, and how often."""
    found: dict = {}
    if not on:
        yield found
        return
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            where = f"{os.path.relpath(w.filename, ROOT)}:{w.lineno}"
            found[where] = found.get(where, 0) + 1


def profile(ev, a, b, args) -> str:
    """Kernel table of ``args.profile`` pairs through ``stream_pair``: self device time of each
    kernel (on the CPU: self CPU time of each op)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from evalkit.metrics.stream import stream_pair

    n = args.profile
    cuda = ev.device.type == "cuda"

    def self_us(e) -> float:
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    ev.reset()
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in stream_pair(
            (a[i % len(a)] for i in range(n)),
            (b[i % len(b)] for i in range(n)),
            evaluator=ev,
            chunk=args.chunk,
        ):
            pass
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t
    events = [e for e in prof.key_averages() if self_us(e) > 0]
    events.sort(key=lambda e: -self_us(e))
    total = sum(self_us(e) for e in events) / 1e3
    lines = [
        f"-- profile: {n} pairs, wall {wall * 1e3:.1f} ms (profiled), kernel time {total:.1f} ms "
        f"= {total / n:.3f} ms a pair"
    ]
    for e in events[: args.profile_top]:
        ms = self_us(e) / 1e3
        lines.append(
            f"   {ms:9.2f} ms {100 * ms / total:5.1f}% {ms / n:7.4f} ms/pair x{e.count:<6d} {e.key[:90]}"
        )
    return "\n".join(lines)


def run(tree: Path, env_extra: dict, args) -> tuple[dict, float]:
    """One variant's :func:`child` in a fresh interpreter under ``tree``'s code -> (its
    result, the process's seconds)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_scale import run_in

    t = time.perf_counter()
    r = run_in(
        tree,
        "--device",
        args.device,
        "--size",
        args.size,
        "--pairs",
        args.pairs,
        "--chunk",
        args.chunk,
        "--profile",
        args.profile,
        "--profile-top",
        args.profile_top,
        *(["--sync-debug"] if args.sync_debug else []),
        timeout=600,
        env_extra=env_extra,
        script=Path(__file__),
    )
    return r, time.perf_counter() - t


def parse_variant(text: str, baseline: str | None) -> tuple[Path, dict]:
    tree, _, settings = text.partition(":")
    pairs = [s for s in settings.split(",") if s]
    if (
        tree not in ("ours", "baseline")
        or (tree == "baseline" and not baseline)
        or any("=" not in s for s in pairs)
    ):
        print(
            f"--variants: {text!r}: expected ours[:VAR=V,...] or baseline[...] (baseline needs --baseline)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    env = dict(s.split("=", 1) for s in pairs)
    return (ROOT if tree == "ours" else Path(baseline).resolve()), env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="?", default="ab", choices=("ab", "_child"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="1280x720")
    p.add_argument("--pairs", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--baseline", default=None, help="checkout of the code to compare against")
    p.add_argument("--variants", default="baseline,ours")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="PAIRS",
        help="also a kernel table of this many pairs (last round only)",
    )
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument(
        "--sync-debug",
        action="store_true",
        help="list the places where the host waited for the device (CUDA sync debug mode)",
    )
    p.add_argument("--out", default=None, help="also write the printed lines here")
    args = p.parse_args(argv)
    if args.what == "_child":
        print(json.dumps(child(args)))
        return 0
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    names = args.variants.split(",")
    variants = [parse_variant(v, args.baseline) for v in names]
    say(
        f"# bench_pipeline {args.size} on {args.device}, {args.pairs} pairs, chunk {args.chunk}; "
        f"variants: {', '.join(names)}"
    )
    best: dict = {}
    for i in range(args.repeats):
        order = list(range(len(names)))[:: 1 if i % 2 == 0 else -1]
        for j in order:
            r, took = run(*variants[j], args)
            for row, v in r.items():
                say(
                    f"  {names[j]:40s} {row:16s} {v['pairs_per_s']:8.1f} pairs/s | warm-up "
                    f"{v['warm_up_s']:.2f} s | process {took:.1f} s | means "
                    + " ".join(
                        f"{k}={x:.9g}"
                        for k, x in sorted(v["means"].items())
                        if k in ("lpips", "ssim", "tof", "warp_error_a")
                    )
                )
                say(
                    "      host ms a chunk (the thread that feeds the device): "
                    + " ".join(f"{k} {x:.1f}" for k, x in v.get("host_ms", {}).items())
                )
                for where, count in sorted(v.get("syncs", {}).items(), key=lambda kv: -kv[1]):
                    say(f"      host waited for the device at {where} x{count}")
                if "profile" in v and i == args.repeats - 1:
                    say(v["profile"])
                key = (names[j], row)
                best[key] = max(best.get(key, 0.0), v["pairs_per_s"])
    say(f"best of {args.repeats}, ratio to {names[0]}:")
    for row in ("full set torch", "LPIPS+SSIM+PSNR"):
        for name in names:
            say(
                f"  {row:16s} {name:40s} {best[(name, row)]:8.1f} pairs/s "
                f"{best[(name, row)] / best[(names[0], row)]:6.2f}x"
            )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
