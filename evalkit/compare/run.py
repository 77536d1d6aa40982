"""``evalkit compare``'s front door: two run folders (and noise-floor runs) measured on one
device into a report (frames.csv, clips.csv, summary.json, index.html).

:func:`compare_runs` is four steps, like :func:`evalkit.compare.clips.compare_clips`:

1. :func:`check_inputs`: the runs, floors, gate and report folder, every refusal before any work;
2. the pairs measured (:mod:`evalkit.compare.pairing`: paired by id, hashes checked while the
   metrics session starts, each pair streamed through one evaluator);
3. :func:`measure_floors`: each floor run against A, the same way;
4. :func:`summarize`: aggregates, floor ratios, findings, headline and the gate's verdict, the
   summary that :func:`evalkit.compare.report.write_report` writes.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from evalkit import __version__
from evalkit.compare.aggregate import (
    aggregate,
    clip_finding,
    floor_ratio,
    headline,
    with_gate,
    with_locals,
    with_offsets,
)
from evalkit.compare.floors import floor_kind, floor_refusal, identical_floor
from evalkit.compare.gating import check_conventions, open_gate
from evalkit.compare.local import BLOCK_CONVENTION
from evalkit.compare.options import MetricOptions
from evalkit.compare.pairing import JobMeasure, LocalCompareSession, pair_jobs
from evalkit.compare.report import (
    SUMMARY_SCHEMA_VERSION,
    ReportParts,
    check_report_folder,
    floor_notice,
    plot_axes,
    run_entry,
    same_run_warnings,
    write_report,
)
from evalkit.errors import InputFileError, UserError
from evalkit.formats.run import RunDir, run_name
from evalkit.fsutil import cleanup_dir_leftovers
from evalkit.metrics.catalogue import KEYS, units


@dataclass
class CompareResult:
    summary: dict
    out: Path
    exit_code: int
    measures: list[JobMeasure] = field(default_factory=list)


def open_run(path, role: str) -> RunDir:
    """A run folder given as ``role`` (``RUN_A``, ``--floor``, ...), its path made absolute."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(path, f"run folder not found ({role})")
    if not path.is_dir():
        raise InputFileError(path, f"not a folder ({role}: expected a run folder with manifest.json)")
    run = RunDir.open(path)
    run.path = run.path.resolve()  # absolute: the report records it, read from anywhere later
    return run


def _seed_offset(run: RunDir) -> int:
    return int((run.manifest.get("notes") or {}).get("seed_offset", 0))


def check_same_suite(a: RunDir, b: RunDir) -> None:
    sa, sb = a.manifest["suite"], b.manifest["suite"]
    if sa.get("name") != sb.get("name") or sa.get("sha256") != sb.get("sha256"):
        raise UserError(
            f"{b.path}: not comparable with {a.path}: runs of different suites "
            f"({sa.get('name')!r} sha256 {str(sa.get('sha256'))[:12]} vs "
            f"{sb.get('name')!r} sha256 {str(sb.get('sha256'))[:12]})"
        )


def alignment_of(measures: list[JobMeasure]) -> dict:
    """summary.json's ``alignment``: the rule, the jobs compared at an offset (``shifted``:
    job -> offset) and each job's finding (:meth:`evalkit.compare.alignment.Alignment.as_dict`)."""
    from evalkit.compare.alignment import RULE

    jobs = {
        m.pair.job_id: m.alignment.as_dict(compared=len(m.records))
        for m in measures
        if m.alignment is not None
    }
    return {"rule": RULE, "shifted": {j: a["offset"] for j, a in jobs.items() if a["offset"]}, "jobs": jobs}


def aggregates_of(measures: list[JobMeasure]) -> dict:
    """Aggregates per metric key (catalogue order) over every frame of every measured job."""
    return {
        k: aggregate([r.get(k) for m in measures for r in m.records], k)
        for k in KEYS
        if any(k in r for m in measures for r in m.records)
    }


def clip_findings(
    measures: list[JobMeasure], floor_jobs: dict, alignment: dict, floor: str | None = None, gate=None
) -> list[dict]:
    """summary.json's ``clip_findings``: each compared job's worst finding against its own
    floor jobs (:func:`evalkit.compare.aggregate.clip_finding`), worst first. ``floor_jobs``:
    floor name -> job id -> the floor job's aggregates; ``gate``: the compare's gate, judged on
    each clip alone too."""
    out = []
    for m in measures:
        jid = m.pair.job_id
        agg = aggregates_of([m])
        ratios = {name: floor_ratio(agg, per[jid]) for name, per in floor_jobs.items() if jid in per}
        f = clip_finding(
            jid,
            ratios,
            floor,
            alignment["jobs"].get(jid),
            (agg.get("lpips") or {}).get("mean"),
            _vmaf_of(agg, floor_jobs, jid, floor),
            gate.evaluate(agg, ratios, 0, {jid: m.alignment.offset if m.alignment else 0})
            if gate is not None
            else None,
            local=m.local,
            aggregates=agg,
            floor_aggregates={name: per[jid] for name, per in floor_jobs.items() if jid in per},
        )
        out.append(f)
    return sorted(out, key=lambda f: -f["rank"])


def run_headline(
    measures,
    ratios: dict,
    aggregates: dict,
    floor_info: dict,
    findings: list,
    verdict: dict | None,
    floor: str | None,
) -> dict | None:
    """summary.json's ``headline``: the clips at an offset first, then the worst family over
    all clips (or that the run is below what the floor resolves, with its dB), every local
    glitch with its frames and place, and the gate's verdict
    (:mod:`evalkit.compare.aggregate`)."""
    from evalkit.compare.local import mse_of

    worst = None  # the clip whose worst block is the run's
    for m in measures:
        if m.local and (worst is None or mse_of(m.local["block_psnr"]) > mse_of(worst.local["block_psnr"])):
            worst = m
    local = dict(worst.local, clip=worst.pair.job_id) if worst is not None else None
    head = headline(
        ratios,
        floor,
        aggregates=aggregates,
        local=local,
        floor_aggregates={n: i["aggregates"] for n, i in floor_info.items()},
    )
    return with_gate(with_locals(with_offsets(head, findings), findings), verdict)


def _vmaf_of(agg: dict, floor_jobs: dict, jid: str, floor: str | None):
    """(B's VMAF mean, the chosen floor job's or None) of one job, None without VMAF."""
    if "vmaf" not in agg:
        return None
    name = (
        floor if floor in floor_jobs else ("seed" if "seed" in floor_jobs else next(iter(floor_jobs), None))
    )
    fagg = (floor_jobs.get(name) or {}).get(jid) or {}
    return agg["vmaf"]["mean"], (fagg.get("vmaf") or {}).get("mean")


def _vmaf_pass(measures: list[JobMeasure], desc: str, on: bool, threads, progress) -> str | None:
    """The optional VMAF pass over measured pairs (:mod:`evalkit.compare.vmaf`)."""
    if not on or not measures:
        return None
    from tqdm import tqdm

    from evalkit.compare.vmaf import add_vmaf_to_measures

    with tqdm(total=len(measures), desc=desc, unit="job", disable=not progress) as bar:
        return add_vmaf_to_measures(measures, n_threads=threads, progress=bar)


def _floor_name(a: RunDir, f: RunDir, taken: set) -> str:
    # the same backend: the same run name (label, else spec), and the same spec
    same_backend = run_name(a.manifest) == run_name(f.manifest) and a.manifest["backend"].get(
        "spec"
    ) == f.manifest["backend"].get("spec")
    if floor_kind(f.manifest):
        name = floor_kind(f.manifest)
    elif same_backend and _seed_offset(a) != _seed_offset(f):
        name = "seed"
    elif same_backend:
        name = "rerender"
    else:
        name = "backend-" + run_name(f.manifest)
    base, i = name, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


def _fingerprint_diff(a: dict, b: dict) -> dict:
    skip = {"host"}
    return {
        k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if k not in skip and a.get(k) != b.get(k)
    }


def _session_and_pairs(pairing, start_session):
    """``(start_session(), pairing())``, the two at once: the clips' hash checks (files read and
    hashed on threads, which hold the interpreter lock only between blocks) run while the
    session starts (``import torch``, the device, the LPIPS weights: seconds). An error of
    either is raised once both have ended; a session already started is then closed."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="evalkit-pairing") as pool:
        paired = pool.submit(pairing)
        try:
            session = start_session()
        except BaseException:
            paired.cancel()
            with contextlib.suppress(BaseException):
                paired.result()
            raise
        try:
            pairs = paired.result()
        except BaseException:
            session.close()
            raise
    return session, pairs


@dataclass
class CompareInputs:
    """What :func:`check_inputs` opened and checked: runs A and B, the floor runs with their
    names in the report (``seed``, ``rerender``, ``backend-<name>``, ...), the gate, the folder."""

    a: RunDir
    b: RunDir
    floors: list[RunDir]
    floor_names: list[str]
    gate: object | None
    out: Path


def check_inputs(run_a, run_b, out, *, gate=None, floors=(), vmaf: bool = False) -> CompareInputs:
    """Every refusal of a compare, before any work: run folders, same suite, floors (not A or B
    themselves, of A's suite, usable as floors: :func:`evalkit.compare.floors.floor_refusal`),
    a gate that its floors and metrics can judge, VMAF available, the report folder."""
    a, b = open_run(run_a, "RUN_A"), open_run(run_b, "RUN_B")
    check_same_suite(a, b)
    floor_runs = [open_run(f, "--floor") for f in floors]
    for f in floor_runs:
        for run, role in ((a, "RUN_A"), (b, "RUN_B")):
            if f.path == run.path:
                raise UserError(
                    f"--floor {f.path}: is {role} itself (a floor is another render "
                    "of A's jobs: a re-render, or other seeds with --seed-offset)"
                )
        check_same_suite(a, f)
    floor_names: list[str] = []
    for f in floor_runs:
        floor_names.append(_floor_name(a, f, set(floor_names)))
    gate_obj = open_gate(gate) if gate else None
    if gate_obj and gate_obj.ratios and not floor_runs:
        raise UserError(f"{gate_obj.path}: the gate sets floor_ratio thresholds but no --floor run was given")
    if gate_obj and gate_obj.ratios and gate_obj.floor and gate_obj.floor not in floor_names:
        raise UserError(
            f"{gate_obj.path}: field 'floor': no floor {gate_obj.floor!r} in this "
            f"compare (its --floor runs are: {', '.join(floor_names)})"
        )
    for f in floor_runs:
        why = floor_refusal(a, b, f)
        if why:
            raise UserError(why)
    optional = [k for k in gate_obj.absolute if k == "vmaf"] if gate_obj else []
    if optional and not vmaf:
        raise UserError(
            f"{gate_obj.path}: field '{optional[0]}': the gate checks a metric that "
            f"compare computes only on request; add --{optional[0]}"
        )
    if vmaf:
        from evalkit.metrics.vmaf import check_available

        check_available()  # before any work: no ffmpeg with libvmaf is one line, now
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder (--out)")
    cleanup_dir_leftovers(out)  # what a killed compare left next to the report (or the old one)
    check_report_folder(out)
    return CompareInputs(a, b, floor_runs, floor_names, gate_obj, out)


def _bar(session, pairs, desc: str, progress: bool):
    """A progress bar over ``pairs`` in the session's unit (frames, or jobs)."""
    from tqdm import tqdm

    unit = session.progress_unit
    total = (
        sum(int((p.rec_a.get("output") or {}).get("frames") or 0) for p in pairs)
        if unit == "frame"
        else len(pairs)
    )
    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, mininterval=0.5)


def measure_floors(
    inputs: CompareInputs,
    session,
    *,
    chunk=None,
    offset="auto",
    vmaf: bool = False,
    vmaf_threads: int | None = None,
    progress: bool = True,
    floor_cache: bool = True,
) -> tuple[dict, dict]:
    """Each floor run's jobs paired with A's (any seeds) and measured: ``(floor_info,
    floor_jobs)``, summary.json's ``floors`` (name -> run, backend, jobs, aggregates, alignment,
    where each job's measurement came from) and name -> job id -> that job's aggregates. A floor
    identical to A is refused. ``floor_cache``: reuse the jobs an earlier compare measured and
    keep this one's (:mod:`evalkit.compare.floorcache`); False measures every floor job again."""
    from evalkit.compare.floorcache import FloorCache

    floor_info, floor_jobs = {}, {}
    cache = FloorCache(
        conventions={**session.conventions, "block": BLOCK_CONVENTION},
        offset=offset,
        vmaf=vmaf,
        report=inputs.out,
        measure_type=JobMeasure,
        enabled=floor_cache,
    )
    for f, name in zip(inputs.floors, inputs.floor_names):
        fpairs, fproblems = pair_jobs(inputs.a, f, same_seed=False)
        for p in fpairs:
            p.offset = offset
        reused, todo, sources = cache.split(fpairs)  # measured once, reused (floorcache)
        new = {}
        if todo:
            with _bar(session, todo, f"floor {name}", progress) as bar:
                new = {
                    m.pair.job_id: m
                    for m in session.measure(todo, chunk=chunk, keep_worst=False, progress=bar)
                }
        fm = [reused[p.job_id] if p.job_id in reused else new[p.job_id] for p in fpairs]
        why = identical_floor(f.path, fm)
        if why:
            raise UserError(why)
        measured = [m for m in fm if m.pair.job_id not in reused]
        _vmaf_pass(measured, f"vmaf floor {name}", vmaf, vmaf_threads, progress)
        cache.store(measured, f.path)
        floor_jobs[name] = {m.pair.job_id: aggregates_of([m]) for m in fm}
        floor_info[name] = {
            "run": str(f.path),
            "backend": f.manifest["backend"].get("spec"),
            "name": run_name(f.manifest),
            "seed_offset": _seed_offset(f),
            "jobs_compared": len(fm),
            "jobs_not_compared": fproblems,
            "aggregates": aggregates_of(fm),
            "cache": cache.provenance(name, fpairs, sources),
        }
        if any(m.alignment is not None and m.alignment.offset for m in fm):
            floor_info[name]["alignment"] = alignment_of(fm)
    return floor_info, floor_jobs


def summarize(
    inputs: CompareInputs,
    measures: list[JobMeasure],
    problems: dict,
    floor_info: dict,
    floor_jobs: dict,
    *,
    conventions: dict,
    metrics_device: str,
) -> dict:
    """summary.json from the measures (pure): aggregates, floor ratios, alignment, the gate's
    verdict, each clip's finding, the headline, fingerprint differences and warnings."""
    a, b, gate_obj = inputs.a, inputs.b, inputs.gate
    aggregates = aggregates_of(measures)
    ratios = {name: floor_ratio(aggregates, info["aggregates"]) for name, info in floor_info.items()}
    alignment = alignment_of(measures)
    verdict = gate_obj.evaluate(aggregates, ratios, len(problems), alignment["shifted"]) if gate_obj else None
    findings = clip_findings(measures, floor_jobs, alignment, gate_obj.floor if gate_obj else None, gate_obj)
    fa, fb = a.manifest["fingerprint"], b.manifest["fingerprint"]
    summary = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "evalkit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": {"name": a.manifest["suite"].get("name"), "sha256": a.manifest["suite"].get("sha256")},
        "runs": {"a": run_entry(a), "b": run_entry(b)},
        "fingerprint_differences": _fingerprint_diff(fa, fb),
        "metrics_device": metrics_device,
        "conventions": conventions,
        "units": units(),
        "jobs": {"compared": [m.pair.job_id for m in measures], "not_compared": problems},
        "alignment": alignment,
        "aggregates": aggregates,
        "floors": floor_info,
        "floor_ratios": ratios,
        "headline": run_headline(
            measures, ratios, aggregates, floor_info, findings, verdict, gate_obj.floor if gate_obj else None
        ),
        "clip_findings": findings,
        "plots": plot_axes(measures, floor_jobs, findings),
        "floor_notice": floor_notice(floor_info),
        "gate": verdict,
    }
    warnings = same_run_warnings(a.manifest, b.manifest, summary["fingerprint_differences"])
    if warnings:
        summary["warnings"] = warnings
    return summary


def compare_runs(
    run_a,
    run_b,
    out,
    *,
    gate=None,
    floors=(),
    device=None,
    chunk=None,
    metrics: MetricOptions | None = None,
    progress: bool = True,
    executor=None,
    vmaf: bool = False,
    vmaf_threads: int | None = None,
    ignore_conventions: bool = False,
    offset="auto",
    floor_cache: bool = True,
) -> CompareResult:
    """Compare run A with run B (and each ``floors`` run with A) and write the report ``out``.

    ``metrics``: the stream metrics' settings (:class:`evalkit.compare.options.MetricOptions`;
    default: every metric, DIS flow). ``executor``: measures the pairs elsewhere (its
    ``compare_session``; default: this process). ``offset``: ``"auto"`` tests every pair for a
    temporal offset and compares at one found (:mod:`evalkit.compare.alignment`; summary.json's
    ``alignment``), ``0`` pairs frames one by one untested. ``vmaf``: also score VMAF (a
    separate pass after the stream metrics, on the cross-backend pairs and the floors:
    :mod:`evalkit.compare.vmaf`); ``vmaf_threads``: libvmaf's threads (default every usable
    core); ``ignore_conventions``: judge with a gate that records other conventions than this
    compare's (:mod:`evalkit.compare.gating`); ``floor_cache``: reuse floor measurements kept
    by an earlier compare (:mod:`evalkit.compare.floorcache`). The result's ``exit_code``: 0, or 1 for a
    failed gate."""
    inputs = check_inputs(run_a, run_b, out, gate=gate, floors=floors, vmaf=vmaf)
    with contextlib.closing(ReportParts()) as parts:  # made while the jobs are measured
        return _compare(
            inputs,
            parts,
            device=device,
            chunk=chunk,
            metrics=metrics,
            progress=progress,
            executor=executor,
            vmaf=vmaf,
            vmaf_threads=vmaf_threads,
            ignore_conventions=ignore_conventions,
            offset=offset,
            floor_cache=floor_cache,
        )


def _compare(
    inputs: CompareInputs,
    parts: ReportParts,
    *,
    device,
    chunk,
    metrics,
    progress,
    executor,
    vmaf,
    vmaf_threads,
    ignore_conventions,
    offset,
    floor_cache,
) -> CompareResult:
    """:func:`compare_runs` once its inputs are checked; ``parts``: the report's parts, each
    job's started as soon as the job is measured (:class:`evalkit.compare.report.ReportParts`)."""
    a, b, gate_obj = inputs.a, inputs.b, inputs.gate
    metrics = metrics or MetricOptions()
    session, (pairs, problems) = _session_and_pairs(
        lambda: pair_jobs(a, b, same_seed=True),
        lambda: (
            LocalCompareSession(device=device, metrics=metrics)
            if executor is None
            else executor.compare_session(device=device, metrics=metrics)
        ),
    )
    try:
        if gate_obj is not None and not ignore_conventions:  # before any work
            check_conventions(gate_obj, {**session.conventions, "block": BLOCK_CONVENTION})
        for p in pairs:
            p.offset = offset
        with _bar(session, pairs, "compare", progress) as bar:  # report parts begun per job
            measures = session.measure(pairs, chunk=chunk, progress=bar, on_measured=parts.add)
        vmaf_convention = _vmaf_pass(measures, "vmaf", vmaf, vmaf_threads, progress)
        floor_info, floor_jobs = measure_floors(
            inputs,
            session,
            chunk=chunk,
            offset=offset,
            vmaf=vmaf,
            vmaf_threads=vmaf_threads,
            progress=progress,
            floor_cache=floor_cache,
        )
        conventions = dict(session.conventions)
        conventions["block"] = BLOCK_CONVENTION
        if vmaf:
            from evalkit.metrics.vmaf import vmaf_convention as _default

            conventions["vmaf"] = vmaf_convention or _default()
        metrics_device = session.device
    finally:
        session.close()

    summary = summarize(
        inputs,
        measures,
        problems,
        floor_info,
        floor_jobs,
        conventions=conventions,
        metrics_device=metrics_device,
    )
    write_report(inputs.out, summary, measures, parts)
    verdict = summary["gate"]
    code = 0 if verdict is None or verdict["verdict"] == "pass" else 1
    return CompareResult(summary, inputs.out, code, measures)
