"""``evalkit study``: create, invite, results, unblind, gate, plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evalkit.cli.common import output_file, positive_int
from evalkit.errors import UserError


def progress_lines(desc: str, unit: str, *, stream=None):
    """A progress printer for output that is not a terminal (a log file, CI): one line
    ``desc: done/total unit`` on stderr at each step of a short task, at each 5% of a long one,
    and at the end, instead of a bar's carriage returns."""
    shown = [0]

    def step(done: int, total: int) -> None:
        pct = 100 * done // max(1, total)
        if done == total or total <= 20 or pct // 5 > shown[0] // 5:
            shown[0] = pct
            print(f"{desc}: {done}/{total} {unit}", file=stream or sys.stderr, flush=True)

    return step


def cmd_study_create(args) -> int:
    from evalkit.study import create_study, protocols

    r = create_study(
        args.report,
        args.db,
        protocol=args.protocol,
        clips_spec=args.clips,
        raters_planned=args.raters,
        margin=args.margin,
        seed=args.seed,
        media_dir=args.media,
        catch_alpha=args.catch_alpha,
        levels=args.levels,
        ladder=args.ladder,
        metrics_device=args.metrics_device,
        progress=True if sys.stderr.isatty() else progress_lines("study media", "clips"),
        allow_masking=args.allow_masking,
        excerpt_seconds=args.excerpt,
        excerpt_at=args.excerpt_at,
        delivery=args.delivery,
        **({} if args.delivery_margin is None else {"delivery_margin_db": args.delivery_margin}),
    )
    for w in r["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    rows = protocols.get(args.protocol).rows_noun
    print(
        f"study {r['study']}: {args.protocol}, {r['clips']} {rows}, "
        f"{r['catch_versions']} catch versions, media -> {r['media']}"
    )
    print(f"  {r['catch_share']['text']}")
    if r.get("excerpt"):
        from evalkit.study.text import excerpt_lines

        print("  " + excerpt_lines(r["excerpt"])[0])
    print(
        f"  verdict after {r['raters_planned']} included raters (invite about {r['invite']}: "
        f"{100 * r['plan'].get('exclusion_rate', 0):.0f}% expected to fail the catch trials)"
    )
    from evalkit.study.delivery import lines

    print(f"  raters see: {r['seen']} (--delivery {r['delivery_mode']})")
    for ln in lines(r):
        print(f"  {ln}")
    print(
        f"  key sealed with {r['key_file']} (mode 0600; `study invite` and the server need it: "
        "keep it beside the database, out of shared copies)"
    )
    if r["same_runs"]["count"] > 1:
        print(f"  {r['same_runs']['text']}")
    return 0


def cmd_study_invite(args) -> int:
    from evalkit.study import invite

    prefix = invite_prefix(args.base_url)
    for r in invite(args.db, args.study, args.count, args.label):
        print(f"rater {r['rater']}: {prefix}{r['token']}")
    print("the links are shown only now (the database keeps hashes)", file=sys.stderr)
    return 0


def invite_prefix(base_url: str) -> str:
    """The link prefix for tokens from the server's base URL: ``http://host:port`` or
    ``http://host:port/some/path/`` gives ``.../?token=``; a prefix that already ends in
    ``token=`` is kept as given."""
    from urllib.parse import urlsplit

    if base_url.endswith("token="):
        return base_url
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"--base-url: expected the server's URL like http://host:7860, found {base_url!r}")
    if parts.query or parts.fragment:
        raise UserError(f"--base-url: expected no query or fragment, found {base_url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/?token="


def cmd_study_results(args) -> int:
    from evalkit.study import results, write_csvs
    from evalkit.study.text import results_text

    res = results(args.db, args.study, reps=args.reps)
    if args.csv:
        write_csvs(args.db, args.study, res, args.csv)
    if args.json:
        print(json.dumps(res, indent=2, default=str))
        return 0
    print(results_text(res))
    return 0


def cmd_study_gate(args) -> int:
    from evalkit.study import write_gate

    ratio = {} if args.max_interval_ratio is None else {"max_interval_ratio": args.max_interval_ratio}
    r = write_gate(
        args.db,
        args.study,
        args.out,
        safety_factor=args.safety_factor,
        reps=args.reps,
        allow_wide_interval=args.allow_wide_interval,
        **ratio,
    )
    what = "threshold" if r["bound"] is None else "lower bound of the threshold"
    print(
        f"gate -> {r['path']}: lpips mean at most {r['max']:.6g} ({what} {r['threshold']:.6g} "
        f"/ safety factor {args.safety_factor:g})"
    )
    if r.get("unblinding"):
        print(f"warning: {r['unblinding']['text']}", file=sys.stderr)
    return 0


def cmd_study_unblind(args) -> int:
    import getpass

    from evalkit.study import unblind

    who = args.who
    if who is None:
        try:
            who = getpass.getuser()
        except (KeyError, OSError):  # no user name in this environment
            who = "unknown"
    u = unblind(args.db, args.study, reason=args.reason, who=who)
    print(f"study {u['study_id']}: {u['text']}")
    print(
        "every later result and CSV reports this; the completed study's verdict can no "
        "longer be 'indistinguishable'",
        file=sys.stderr,
    )
    return 0


def cmd_study_plan(args) -> int:
    from tqdm import tqdm

    from evalkit.study import plan

    # simulations, counted as they run (how many the search needs is not known in advance)
    with tqdm(desc="study plan", unit="simulation", disable=not sys.stderr.isatty(), leave=False) as bar:

        def step(text: str) -> None:
            bar.set_postfix_str(text, refresh=False)
            bar.update(1)

        try:
            p = plan(
                args.protocol,
                args.margin,
                args.power,
                clips=args.clips,
                tie_rate=args.tie_rate,
                exclusion_rate=args.exclusion_rate,
                clip_accuracy=args.clip_accuracy,
                progress=step,
                visible_bound=args.visible_bound,
            )
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(p, indent=2, default=str))
        return 0
    print(
        f"{p['raters']} included raters x {p['clips']} clips = {p['raters'] * p['clips']} "
        f"test ratings; invite {p['invite']} ({100 * p['exclusion_rate']:.0f}% expected "
        "exclusions)"
    )
    for k in ("reason", "reasons", "notes"):
        v = p.get(k)
        for line in [v] if isinstance(v, str) else (v or []):
            print(f"  {line}")
    if p.get("visible_share_bound") is not None:
        print(
            f"  with --clips sample:{p['clips']} and none flagged, the verdict bounds the share "
            f"of visibly different clips like these at {100 * p['visible_share_bound']:.3g}% "
            "(one-sided 95%)"
        )
    return 0


def add_study(sub, common) -> None:
    s = sub.add_parser(
        "study", parents=[common], help="human A/B studies: create, invite, results, unblind, plan"
    )
    ss = s.add_subparsers(dest="study_command", metavar="SUBCOMMAND", required=True)
    v = ss.add_parser("create", parents=[common], help="create a study from a compare report")
    v.add_argument("report", type=Path, help="compare report folder")
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--protocol", required=True, choices=("preference", "abx", "threshold"))
    v.add_argument("--clips", default="all", help="all, worst:N or sample:N (default all)")
    v.add_argument(
        "--levels",
        default=None,
        metavar="K1,K2,...",
        help="threshold protocol: amplification factors k of the stimuli "
        "A + k (B - A), increasing (default 1,2,4,8,16,32; include 1, the real "
        "difference)",
    )
    v.add_argument(
        "--ladder",
        default=None,
        choices=("amplify", "blur"),
        help="threshold protocol: amplify the backend difference (default), or blur A "
        "with sigma k px (a known degradation, for comparison)",
    )
    v.add_argument(
        "--metrics-device",
        default="cpu",
        help="threshold protocol: device measuring the stimuli (default cpu)",
    )
    v.add_argument(
        "--raters",
        type=int,
        default=0,
        help="planned number of included raters (default: the planner's figure); "
        "no verdict is shown before this many have finished",
    )
    v.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="ABX equivalence margin: accuracy at most 0.5 + margin (default 0.1)",
    )
    v.add_argument("--seed", type=int, default=0, help="seed of selection and assignment")
    v.add_argument(
        "--media",
        type=Path,
        default=None,
        help="folder for browser copies (default: NAME.media/ next to the SQLite file NAME.db)",
    )
    v.add_argument(
        "--catch-alpha",
        type=float,
        default=0.05,
        help="a rater is kept when better than guessing on the easy catch trials "
        "(one-sided exact binomial at this level; default 0.05)",
    )
    v.add_argument(
        "--allow-masking",
        action="store_true",
        help="stream delivery: create the study even where the browser stream does "
        "not keep the A-B difference (the local delivery rule; recorded in the "
        "study and printed with its results)",
    )
    v.add_argument(
        "--delivery",
        default="auto",
        choices=("auto", "stream", "lossless"),
        help="how trials reach raters: stream (H.264 4:2:0 QP 12, what a product "
        "delivers, its fidelity to the difference checked), lossless (an animated "
        "lossless WebP painted on a canvas: the rendered pixels, exact; more bytes) "
        "or auto (default: lossless where the report's figures predict the stream "
        "would mask a row's difference, else stream; printed and recorded with why)",
    )
    v.add_argument(
        "--delivery-margin",
        type=float,
        default=None,
        metavar="DB",
        help="in each window where the A-B difference is, how far (dB) the delivered "
        "difference's part along the real one must lie above the rest of it "
        "(default 0: correlation at least 0.71; docs/studies.md)",
    )
    v.add_argument(
        "--excerpt",
        default=None,
        metavar="SECONDS",
        help="show raters one window of SECONDS of each clip (less to load, the part "
        "that differs): the same window on both sides and in every trial of a clip",
    )
    v.add_argument(
        "--excerpt-at",
        default=None,
        metavar="START|worst",
        help="with --excerpt: the window's start in seconds, or worst (default: the "
        "window of highest mean per-frame LPIPS in the report's frames.csv)",
    )
    v.set_defaults(func=cmd_study_create)
    v = ss.add_parser("invite", parents=[common], help="create raters; prints each link once")
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--study", required=True, help="study id")
    v.add_argument("--count", type=int, default=1, help="how many raters (default 1)")
    v.add_argument("--label", default=None, help="a label stored with the raters")
    v.add_argument(
        "--base-url",
        default="http://localhost:7860",
        help="the rater page's server as raters reach it, e.g. http://host:7860 "
        "(what `evalkit serve` prints); each link is BASE/?token=...",
    )
    v.set_defaults(func=cmd_study_invite)
    v = ss.add_parser("results", parents=[common], help="analyse a study: verdict and CSV")
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--study", required=True, help="study id")
    v.add_argument(
        "--csv",
        type=output_file,
        default=None,
        metavar="FILE",
        help="raw ratings to FILE, the summary to FILE's stem + .summary.csv",
    )
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument(
        "--reps",
        type=int,
        default=1000,
        help="bootstrap replicates of a threshold study's intervals (default 1000); "
        "ABX and preference verdicts always use 1000 with a seed fixed per study",
    )
    v.set_defaults(func=cmd_study_results)
    v = ss.add_parser(
        "gate",
        parents=[common],
        help="write a gate YAML from a threshold study (LPIPS at most threshold / safety factor)",
    )
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--study", required=True, help="study id (a complete threshold study)")
    v.add_argument(
        "--out", required=True, type=output_file, metavar="FILE", help="the gate YAML to write (atomically)"
    )
    v.add_argument(
        "--safety-factor",
        type=float,
        default=2.0,
        help="the gate's LPIPS mean bound is the threshold divided by this (at least 1; default 2)",
    )
    v.add_argument("--reps", type=int, default=1000, help="bootstrap replicates (default 1000)")
    v.add_argument(
        "--max-interval-ratio",
        type=float,
        default=None,
        help="refuse a gate when the threshold interval's upper end is more than "
        "this many times its lower end, or the interval is open (default 4)",
    )
    v.add_argument(
        "--allow-wide-interval",
        action="store_true",
        help="write the gate even from an open or wide threshold interval (a pilot)",
    )
    v.set_defaults(func=cmd_study_gate)
    v = ss.add_parser(
        "unblind",
        parents=[common],
        help="open a study's key before its planned raters finish (logged; the "
        "verdict then never says indistinguishable)",
    )
    v.add_argument("--db", required=True, help="database URL or SQLite file")
    v.add_argument("--study", required=True, help="study id")
    v.add_argument("--reason", required=True, help="why the key is opened (logged, one line)")
    v.add_argument("--who", default=None, help="who opens it (logged; default: this system user's name)")
    v.set_defaults(func=cmd_study_unblind)
    v = ss.add_parser("plan", parents=[common], help="raters and trials needed for a study")
    v.add_argument("--protocol", required=True, choices=("preference", "abx"))
    v.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="ABX: accuracy at most 0.5 + margin; preference: the win rate to detect",
    )
    v.add_argument("--power", type=float, default=0.8)
    v.add_argument(
        "--clips",
        "--clips-per-rater",
        dest="clips",
        type=positive_int,
        default=15,
        help="clips in the study, each rated once by every rater (at least 15)",
    )
    v.add_argument(
        "--exclusion-rate",
        type=float,
        default=0.1,
        help="expected share of raters failing the catch trials (default 0.1)",
    )
    v.add_argument(
        "--clip-accuracy",
        type=float,
        default=0.9,
        help="ABX accuracy of a single visible clip that must be flagged (default 0.9)",
    )
    v.add_argument(
        "--tie-rate", type=float, default=0.0, help="expected share of 'no difference' answers (preference)"
    )
    v.add_argument(
        "--visible-bound",
        type=float,
        default=None,
        metavar="SHARE",
        help="ABX: enough clips drawn at random (sample:N) that, with none flagged, "
        "at most this share of clips like these is visibly different (e.g. 0.1)",
    )
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=cmd_study_plan)
