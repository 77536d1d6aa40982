"""``evalkit compare`` and ``evalkit metrics``: the compare flow."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evalkit.cli.common import executor_args, make_executor, output_file, output_folder, positive_int

FLOW_CHOICES = ("auto", "dis", "farneback", "torch")
FLOW_HELP = (
    "optical flow for the temporal metrics: auto (default: torch on a GPU, dis "
    "elsewhere; dis when --flow-preset is given), dis (OpenCV DIS) or farneback on the "
    "CPU, or torch on the metrics device (on a GPU: no CPU-bound flow)"
)


def flow_method(args) -> str:
    """``--flow``, with ``auto`` meaning DIS when a DIS preset is asked for (else the
    evaluator resolves it for its device: :func:`evalkit.metrics.flow.resolve_flow`)."""
    return "dis" if args.flow == "auto" and args.flow_preset else args.flow


def cmd_compare(args) -> int:
    from evalkit.compare.aggregate import ratio_meaning
    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs
    from evalkit.metrics.catalogue import fmt, keys

    options = MetricOptions(
        temporal=not args.no_temporal, flow=flow_method(args), flow_preset=args.flow_preset or None
    )
    executor = make_executor(args)
    try:
        result = compare_runs(
            args.run_a,
            args.run_b,
            args.out,
            gate=args.gate,
            floors=args.floor,
            device=None if args.device == "auto" else args.device,
            metrics=options,
            progress=not args.quiet,
            executor=executor,
            vmaf=args.vmaf,
            vmaf_threads=args.vmaf_threads,
            ignore_conventions=args.ignore_conventions,
            offset=args.offset,
            floor_cache=not args.remeasure_floor,
        )
    finally:
        if executor is not None:
            executor.close()
    s = result.summary
    agg = s["aggregates"]
    print(
        f"compared {len(s['jobs']['compared'])} jobs "
        f"({len(s['jobs']['not_compared'])} not compared) -> {result.out}"
    )
    for key in keys(headline=True):
        if key in agg:
            a = agg[key]
            print(f"  {key:6s} mean {fmt(a['mean'])}  p95 {fmt(a['p95'])}  worst {fmt(a['worst'])}")
    for info in s["floors"].values():
        if info.get("cache"):
            print(f"  {info['cache']['text']}")
    for name, ratios in s["floor_ratios"].items():
        r = ratios.get("lpips", {}).get("mean")
        print(f"  LPIPS mean / {name} floor: {fmt(r)}x: {ratio_meaning('lpips', r, name)}")
    for jid, al in s["alignment"]["jobs"].items():
        if al["offset"]:
            print(f"  offset {jid}: {al['text']}")
    if s.get("headline"):
        print(s["headline"]["text"])
    print_findings(s.get("clip_findings") or [])
    if s.get("floor_notice"):
        print(f"note: {s['floor_notice']}")
    for w in s.get("warnings", []):
        print(f"warning: {w}")
    for jid, why in s["jobs"]["not_compared"].items():
        print(f"  not compared {jid}: {why}")
    if s["gate"] is not None:
        print_verdict(s["gate"])
    return result.exit_code


#: clips printed by ``compare`` (worst first); the rest are in the report
MAX_FINDINGS = 10


def print_findings(findings: list[dict]) -> None:
    """Each clip's worst finding, one line each, worst first (``summary.json["clip_findings"]``)."""
    if not findings:
        return
    print("clips, worst first:")
    for f in findings[:MAX_FINDINGS]:
        print(f"  {f['text']}")
    if len(findings) > MAX_FINDINGS:
        print(f"  ... {len(findings) - MAX_FINDINGS} more in summary.json and index.html")


def print_verdict(verdict: dict) -> None:
    """A gate's verdict as ``compare --gate`` and ``evalkit gate`` print it."""
    print(f"gate: {verdict['verdict'].upper()}")
    for reason in verdict["reasons"]:
        print(f"  {reason}")


def cmd_gate(args) -> int:
    import json

    from evalkit.compare.gating import judge_report, pin_conventions

    if args.pin:
        pinned = pin_conventions(args.report, args.gate)
        print(f"{args.gate}: conventions recorded: " + ", ".join(f"{k}={v}" for k, v in pinned.items()))
    verdict = judge_report(args.report, args.gate, ignore_conventions=args.ignore_conventions)
    if args.json:
        print(json.dumps(verdict, indent=2))
    else:
        print_verdict(verdict)
    return 0 if verdict["verdict"] == "pass" else 1


def add_gate(sub, common) -> None:
    s = sub.add_parser(
        "gate", parents=[common], help="judge a saved compare report against a gate (no new compare)"
    )
    s.add_argument("report", type=Path, help="compare report folder (or its summary.json)")
    s.add_argument("--gate", type=Path, required=True, help="gate YAML (exit 1 when it fails)")
    s.add_argument(
        "--pin",
        action="store_true",
        help="first record in the gate the report's conventions of the metrics it bounds",
    )
    s.add_argument("--json", action="store_true", help="the verdict and every check as JSON")
    conventions_arg(s)
    s.set_defaults(func=cmd_gate)


def cmd_floor(args) -> int:
    from evalkit.compare.floors import make_reencode_floor

    out = make_reencode_floor(args.run_a, args.out, progress=not args.quiet)
    print(f"reencode floor of {args.run_a} -> {out}")
    print(f"use it: evalkit compare {args.run_a} RUN_B --floor {out} --out REPORT")
    return 0


def add_floor(sub, common) -> None:
    s = sub.add_parser(
        "floor",
        parents=[common],
        help="make a noise-floor run for footage without seeds: A's frames "
        "re-encoded through 4:2:0 (see docs/metrics.md#comparing-two-runs)",
    )
    s.add_argument("run_a", type=Path, help="run folder A (the reference backend)")
    s.add_argument(
        "--out",
        "-o",
        type=output_folder,
        required=True,
        help="folder of runs: the floor is written to OUT/<A's folder>_reencode",
    )
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_floor)


def conventions_arg(s) -> None:
    s.add_argument(
        "--ignore-conventions",
        action="store_true",
        help="judge even when the gate records other conventions (flow, SSIM...) than "
        "the report was measured under",
    )


def cmd_metrics(args) -> int:
    from evalkit.compare.clips import compare_clips, format_text

    result = compare_clips(
        args.a,
        args.b,
        device=args.device,
        net=args.net,
        chunk=args.chunk,
        align=args.align,
        temporal=not args.no_temporal,
        flow=flow_method(args),
        flow_preset=args.flow_preset,
        flow_scale=args.flow_scale,
        ssim_channel=args.ssim_channel,
        csv_path=args.csv,
        keep_frames=args.json,
        vmaf=args.vmaf,
        vmaf_threads=args.vmaf_threads,
        progress=not args.quiet and sys.stderr.isatty(),
        offset=args.offset,
    )
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(format_text(result))
    return 0


def add_compare(sub, common) -> None:
    s = sub.add_parser(
        "compare", parents=[common], help="compare two runs: metrics, noise floor, gate, CSV/JSON/HTML report"
    )
    s.add_argument("run_a", type=Path, help="run folder A (the reference backend)")
    s.add_argument("run_b", type=Path, help="run folder B (the backend under test)")
    s.add_argument("--out", "-o", type=Path, required=True, help="report folder")
    s.add_argument("--gate", type=Path, default=None, help="gate YAML (exit 1 when it fails)")
    s.add_argument(
        "--floor",
        type=Path,
        action="append",
        default=[],
        metavar="RUN",
        help="noise-floor run compared against A: a re-render on A's backend, a "
        "--seed-offset run, or `evalkit floor`'s re-encode of A (repeatable)",
    )
    s.add_argument("--device", default="auto", help="where metrics run: auto, cpu, cuda, cuda:N")
    s.add_argument("--flow", choices=FLOW_CHOICES, default="auto", help=FLOW_HELP)
    s.add_argument(
        "--flow-preset",
        choices=("ultrafast", "fast", "medium"),
        default=None,
        help="DIS preset for the temporal metrics (default fast)",
    )
    s.add_argument("--no-temporal", action="store_true", help="skip the temporal metrics")
    s.add_argument(
        "--offset",
        choices=("auto", "0"),
        default="auto",
        help="temporal offset of each B clip: auto (default: tested on the first frames; "
        "a job with one is compared at it and named in the report) or 0 (frame by "
        "frame, untested)",
    )
    s.add_argument(
        "--remeasure-floor",
        action="store_true",
        help="measure the --floor runs again instead of reusing an earlier compare's "
        "measurement of the same clips and metric settings (kept in "
        "$EVALKIT_FLOOR_CACHE, default ~/.cache/evalkit/floors)",
    )
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    conventions_arg(s)
    vmaf_args(s)
    executor_args(s)
    s.set_defaults(func=cmd_compare)


def add_metrics(sub, common) -> None:
    s = sub.add_parser(
        "metrics",
        parents=[common],
        help="LPIPS, SSIM, PSNR, exactness and temporal metrics of two clips or images",
    )
    s.add_argument("a", type=Path, help="clip A: video file, image, or folder of images")
    s.add_argument("b", type=Path, help="clip B, same size and frame count as A")
    s.add_argument(
        "--json", action="store_true", help="print one JSON object: per-metric means and per-frame lists"
    )
    s.add_argument(
        "--csv", type=output_file, default=None, metavar="FILE", help="also write the per-frame table to FILE"
    )
    s.add_argument(
        "--device",
        default="auto",
        help="where metrics run: auto (a GPU if present, else cpu), cpu, cuda, cuda:N",
    )
    s.add_argument("--net", choices=("alex", "vgg"), default="alex", help="LPIPS trunk (default alex)")
    s.add_argument(
        "--ssim-channel",
        choices=("luma", "rgb"),
        default="luma",
        help="SSIM on rounded BT.601 luma (default, original convention) or per RGB plane",
    )
    s.add_argument("--flow", choices=FLOW_CHOICES, default="auto", help=FLOW_HELP)
    s.add_argument(
        "--flow-preset",
        choices=("ultrafast", "fast", "medium"),
        default=None,
        help="DIS preset (default fast)",
    )
    s.add_argument(
        "--flow-scale",
        type=float,
        default=1.0,
        help="compute flow on frames downscaled by this factor in (0, 1] (default 1)",
    )
    s.add_argument("--no-temporal", action="store_true", help="skip the temporal metrics")
    s.add_argument(
        "--align",
        choices=("error", "shortest"),
        default="error",
        help="different frame counts: error (default) or compare the common prefix (recorded in the output)",
    )
    s.add_argument(
        "--offset",
        type=offset_arg,
        default="auto",
        help="temporal offset of B: auto (default: tested on the first frames; an "
        "offset found is compared at and reported, a frame-rate mismatch is an "
        "error) or a whole number of frames, untested (0: frame by frame; "
        "N > 0: B is N frames late)",
    )
    s.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="frames per batch (default: by frame size and device, 8 at 256x256 on cpu)",
    )
    s.add_argument(
        "--quiet", action="store_true", help="no progress bar (shown on a terminal's stderr, per frame)"
    )
    vmaf_args(s)
    s.set_defaults(func=cmd_metrics)


def offset_arg(s: str):
    """``--offset``: ``auto`` or a whole number of frames."""
    import argparse

    if s == "auto":
        return s
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a whole number of frames, found {s!r}") from None


def vmaf_args(s) -> None:
    s.add_argument(
        "--vmaf",
        action="store_true",
        help="also VMAF (libvmaf in imageio-ffmpeg's ffmpeg, model vmaf_v0.6.1; "
        "BT.709 limited-range YUV 4:4:4): a second decoding pass, off by default",
    )
    s.add_argument(
        "--vmaf-threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="libvmaf threads (default: every usable CPU core)",
    )
