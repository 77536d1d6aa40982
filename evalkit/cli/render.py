"""``evalkit render`` and ``evalkit suite``: the render flow."""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.cli.common import executor_args, make_executor, output_folder, renderer_options
from evalkit.errors import UserError
from evalkit.lossless import LOSSLESS_FORMATS


def cmd_render(args) -> int:
    from evalkit.formats.run import read_manifest
    from evalkit.render.adopt import UNKNOWN_FINGERPRINT
    from evalkit.render.backend import parse_spec
    from evalkit.render.driver import render_suite

    if not 0 <= args.seed_offset < 2**63:
        raise UserError(
            f"--seed-offset: expected a non-negative integer below 2**63, found {args.seed_offset}"
        )
    specs = [parse_spec(text) for text in args.backend or []]  # once: render_suite takes them
    if args.executor == "local":
        for text, spec in zip(args.backend or [], specs):
            if spec.resource:  # a node label only Ray can honour
                raise UserError(f"--backend {text!r}: resource= picks Ray nodes; only with --executor ray")
    executor = make_executor(args)
    try:
        summaries = render_suite(
            args.suite,
            specs,
            args.out,
            renderer=args.renderer,
            options=renderer_options(args.renderer_opt),
            jobs=args.jobs,
            seed_offset=args.seed_offset,
            progress=not args.quiet,
            executor=executor,
            label=args.label,
            fingerprint_file=args.fingerprint,
            lossless=args.lossless,
        )
    finally:
        if executor is not None:
            executor.close()
    failed = 0
    for s in summaries:
        print(f"{s.backend}: {s.done} rendered, {s.skipped} already done, {s.failed} failed -> {s.path}")
        if read_manifest(s.path)["fingerprint"] == UNKNOWN_FINGERPRINT:
            print(
                f"  note: {s.path.name} holds renders made elsewhere and no --fingerprint: "
                "reports cannot say which machine made them"
            )
        for job_id, err in s.failures.items():
            print(f"  failed {job_id}: {err}")
        failed += s.failed
    return 1 if failed else 0


def cmd_import(args) -> int:
    from evalkit.render.importing import import_files

    if args.map and args.pattern:
        raise UserError("--map and --pattern: give one (a mapping file, or a file-name pattern)")
    summaries = import_files(
        args.suite,
        args.folder,
        args.out,
        label=args.label,
        mapping=args.map,
        pattern=args.pattern,
        fingerprint_file=args.fingerprint,
        backend=args.backend,
        lossless=args.lossless,
        jobs=args.jobs,
        progress=not args.quiet,
    )
    failed = 0
    for s in summaries:
        print(f"{s.backend}: {s.done} imported, {s.skipped} already done, {s.failed} failed -> {s.path}")
        for job_id, err in s.failures.items():
            print(f"  failed {job_id}: {err}")
        failed += s.failed
    return 1 if failed else 0


def add_import(sub, common) -> None:
    s = sub.add_parser(
        "import",
        parents=[common],
        help="adopt files made elsewhere as a run, named by clip (or by a mapping "
        "file or pattern): render -r import without renaming",
    )
    s.add_argument("suite", type=Path, help="the suite YAML file (its clips: what the files are renders of)")
    s.add_argument("folder", type=Path, help="the folder of files to import")
    s.add_argument(
        "--label",
        required=True,
        metavar="NAME",
        help="name the run (its folder OUT/NAME, and its name in reports), e.g. farm-a",
    )
    s.add_argument("--out", "-o", type=Path, required=True, help="output folder of runs")
    s.add_argument(
        "--map",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML or JSON mapping of clip (or job) ids to file names in FOLDER",
    )
    s.add_argument(
        "--pattern",
        default=None,
        metavar="GLOB",
        help="file name pattern with {clip}, {job}, {prompt}, {seed}, e.g. 'farm_{clip}_*.mp4' "
        "(default: <job id>.* or, for a clip with one job, <clip id>.*)",
    )
    s.add_argument(
        "--fingerprint",
        type=Path,
        default=None,
        metavar="FILE",
        help="the fingerprint of the machine that made the files (evalkit fingerprint --json)",
    )
    s.add_argument(
        "--backend",
        "-b",
        default=None,
        metavar="SPEC",
        help="the backend the files were made with (recorded, not applied)",
    )
    s.add_argument("--jobs", nargs="+", default=None, metavar="ID", help="only these jobs (job or clip id)")
    s.add_argument(
        "--lossless",
        choices=list(LOSSLESS_FORMATS),
        default=None,
        help="format of the stored lossless clips (as render --lossless)",
    )
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_import)


def cmd_suite_validate(args) -> int:
    from evalkit.formats.suite import load_suite
    from evalkit.render.renderers.imported import import_name

    if not 0 <= args.seed_offset < 2**63:
        raise UserError(
            f"--seed-offset: expected a non-negative integer below 2**63, found {args.seed_offset}"
        )
    if args.seed_offset and not args.jobs:
        raise UserError(
            "--seed-offset: only with --jobs (it lists the file names an import of "
            "a seed-offset run looks for)"
        )
    suite = load_suite(args.path, check_clips=True)
    print(f"{args.path}: ok: suite '{suite.name}', {len(suite.clips)} clips, {len(suite.jobs)} jobs")
    if args.jobs:
        for job in suite.jobs:
            seed = job.seed + args.seed_offset
            line = (
                f"{import_name(job, seed)}\t{job.clip}\t{job.prompt}\tseed={seed}\t"
                f"{json.dumps(job.params, sort_keys=True)}"
            )
            print(line + (f"\tjob={job.id}" if args.seed_offset else ""))
    return 0


def cmd_suite_preview(args) -> int:
    from evalkit.formats.suite import load_suite, write_previews

    suite = load_suite(args.path)
    written = write_previews(suite, args.out, progress=not args.quiet)
    print(f"wrote {len(written)} browser previews to {args.out}")
    return 0


def add_render(sub, common) -> None:
    s = sub.add_parser(
        "render", parents=[common], help="render a suite's jobs on one or more backends (resumable)"
    )
    s.add_argument("suite", type=Path, help="the suite YAML file")
    s.add_argument(
        "--backend",
        "-b",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend spec, e.g. cuda:0,dtype=bf16 or cpu,dtype=fp32 (repeatable; "
        "required unless -r import has --label or a --fingerprint naming one)",
    )
    s.add_argument(
        "--out", "-o", type=Path, required=True, help="output folder: one run folder per backend inside it"
    )
    s.add_argument(
        "--label",
        default=None,
        metavar="NAME",
        help="name the run (its folder OUT/NAME, and its name in reports and "
        "studies), e.g. mi325x-bf16; with one --backend at most",
    )
    s.add_argument(
        "--fingerprint",
        type=Path,
        default=None,
        metavar="FILE",
        help="adopt the fingerprint of the machine that really rendered (written "
        "there by evalkit fingerprint -b SPEC --json), e.g. with -r import",
    )
    s.add_argument(
        "--renderer",
        "-r",
        default=None,
        help="diffusers, command, import, canary, or module:Class (default: the suite's renderer)",
    )
    s.add_argument(
        "--renderer-opt",
        "-O",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="renderer option, e.g. model=PATH (diffusers), cmd=... (command), dir=... (import); repeatable",
    )
    s.add_argument(
        "--jobs",
        nargs="+",
        default=None,
        metavar="ID",
        help="only these jobs (job id, id prefix, or clip id)",
    )
    s.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        help="add N to every seed (a seed-shifted run for the noise floor)",
    )
    s.add_argument(
        "--lossless",
        choices=list(LOSSLESS_FORMATS),
        default=None,
        help="format of the lossless clips: ffv1 (.mkv, smallest; the default for a "
        "new run on the CPU) or utvideo (.nut, 1.15-1.5x larger, encodes and "
        "decodes several times faster; the default for a new run on a GPU, or "
        "imported on a machine with one); a resumed run keeps its own",
    )
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    executor_args(s, retries=True)
    s.set_defaults(func=cmd_render)


def add_suite(sub, common) -> None:
    s = sub.add_parser("suite", parents=[common], help="work with suite files")
    ss = s.add_subparsers(dest="suite_command", metavar="SUBCOMMAND", required=True)
    v = ss.add_parser("validate", parents=[common], help="check a suite YAML and its clips")
    v.add_argument("path", type=Path, help="the suite YAML file")
    v.add_argument(
        "--jobs",
        action="store_true",
        help="also list the jobs: the file name -r import looks for (the job id), clip, prompt, seed, params",
    )
    v.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        metavar="N",
        help="with --jobs: the names for an import of a --seed-offset N run (the job "
        "id of seed + N; the run's own job id follows as job=)",
    )
    v.set_defaults(func=cmd_suite_validate)
    v = ss.add_parser(
        "preview", parents=[common], help="write browser copies (H.264 mp4) of a suite's source clips"
    )
    v.add_argument("path", type=Path, help="the suite YAML file")
    v.add_argument("--out", type=output_folder, required=True, help="output folder")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=cmd_suite_preview)
