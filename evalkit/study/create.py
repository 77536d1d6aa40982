"""Make a study: read the compare report, choose clips and delivery, encode the trials' media,
write the study (its config sealed), invite raters, list studies.

Every function takes ``db`` (a URL, an SQLite path or an open :class:`StudyDB`).
"""

from __future__ import annotations

import csv
import json
import math
import secrets
from fractions import Fraction
from pathlib import Path

from sqlalchemy import func, select

from ..errors import InputFileError
from ..formats.run import clip_files
from . import delivery as delivery_rule
from . import design, excerpt, protocols, seal, stats, threshold, trialmedia
from .analyse import same_runs
from .errors import StudyError
from .live import token_hash
from .lossless import DELIVERIES, EXT, SEEN, exact_summary
from .media import ordered_map, prepare_media_dir
from .store import clips, load_study, new_media_key, now, open_db, raters, ratings, studies, trials

#: ``study create --delivery auto``: chosen from the report's figures before encoding
AUTO = "auto"


def _resolve(p: str, report: Path) -> Path:
    path = Path(p)
    if path.is_absolute() or path.exists():
        return path
    return (report / path) if (report / path).exists() else path


def read_report(report) -> dict:
    """The parts of a compare report a study needs: the two run folders and, per compared
    job, its lossless clips on both sides and its LPIPS mean. Errors name the file."""
    report = Path(report)
    summary_path = report / "summary.json"
    if not report.is_dir():
        raise InputFileError(report, "report folder not found")
    if not summary_path.is_file():
        raise InputFileError(summary_path, "not found (is this a compare report folder?)")
    try:
        summary = json.loads(summary_path.read_text())
        run_a = _resolve(summary["runs"]["a"]["path"], report)
        run_b = _resolve(summary["runs"]["b"]["path"], report)
        compared = list(summary["jobs"]["compared"])
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise InputFileError(summary_path, f"not a compare summary ({e.__class__.__name__}: {e})")
    from ..formats.models import SUMMARY_SCHEMA_VERSION, version_problem

    problem = version_problem(summary, SUMMARY_SCHEMA_VERSION, default=SUMMARY_SCHEMA_VERSION)
    if problem:  # a report of another evalkit: its fields may mean something else
        raise InputFileError(summary_path, f"field 'schema_version': {problem}")
    for side, run in (("a", run_a), ("b", run_b)):
        if not run.is_absolute() and not run.is_dir():  # older reports kept paths as given
            raise InputFileError(
                summary_path,
                f"field 'runs.{side}.path': run folder '{run}' not "
                "found (a path relative to where compare ran: run study create "
                "from that folder, or compare again)",
            )
    if not compared:
        raise InputFileError(summary_path, "field 'jobs.compared': no compared jobs, nothing to rate")
    rows = {}
    csv_path = report / "clips.csv"
    if csv_path.is_file():
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                rows[r["job"]] = r
    out = []
    clip_a, clip_b = clip_files(run_a), clip_files(run_b)
    for job in compared:
        r = rows.get(job, {})
        a, b = clip_a(job), clip_b(job)
        for p in (a, b):
            if not p.is_file():
                raise InputFileError(
                    p, f"clip of job {job} not found (the report's run folders must still hold their clips)"
                )
        lp = r.get("lpips_mean") or None
        out.append(
            {
                "job": job,
                "clip": r.get("clip", ""),
                "prompt": r.get("prompt", ""),
                "seed": int(r["seed"]) if r.get("seed") else 0,
                "lpips_mean": float(lp) if lp else None,
                "path_a": a,
                "path_b": b,
            }
        )
    return {"report": report, "run_a": run_a, "run_b": run_b, "jobs": out}


def run_identity(run_a, run_b) -> dict:
    """The runs a study is made from, recorded in its config (``runs``): per side the resolved
    folder and the SHA-256 of its ``manifest.json`` (None without one)."""
    from ..fsutil import sha256_file

    out = {}
    for side, run in (("a", run_a), ("b", run_b)):
        path = Path(run).resolve()
        m = path / "manifest.json"
        out[side] = {"path": str(path), "manifest_sha256": sha256_file(m) if m.is_file() else None}
    return out


def create_study(
    report,
    db,
    *,
    protocol: str,
    clips_spec: str = "all",
    raters_planned: int = 0,
    margin: float = 0.1,
    seed: int = 0,
    media_dir=None,
    catch_alpha: float = 0.05,
    alpha: float = 0.05,
    levels=None,
    ladder: str | None = None,
    metrics_device="cpu",
    progress: bool = False,
    allow_masking: bool = False,
    delivery_margin_db: float = delivery_rule.MARGIN_DB,
    excerpt_seconds=None,
    excerpt_at=None,
    delivery: str = "stream",
    design_seed: int | None = None,
) -> dict:
    """Create a study from a compare report: select clips, write the trial streams (every
    arrangement of each row's tiles, see :func:`.media.store_tiled` and
    :func:`.design.stream_keys`) and the catch versions, record everything.
    ``raters_planned`` 0: the planner's figure (:func:`.planning.plan`).

    ``protocol="threshold"``: ``levels`` (``"1,2,4"`` or numbers; default
    :data:`.threshold.DEFAULT_LEVELS`) amplify each clip's backend difference
    (:func:`.threshold.amplify`); every (clip, level) is one row of the ``clips`` table (side B
    is the stimulus ``S_k``, its ``lpips_mean`` the stimulus's LPIPS against A, measured on
    ``metrics_device``), shown as ABX. ``raters_planned`` is required (no planner).
    ``ladder``: ``amplify`` (default) or ``blur`` (A blurred with sigma k px: a known
    degradation to compare thresholds with; :func:`.threshold.stimulus`).

    Delivery fidelity (:mod:`.delivery`): every row's trial streams are decoded and measured
    against the lossless frames; a row whose stream does not keep its A-B difference (the
    local rule, windows judged at ``delivery_margin_db``) refuses the study
    (:class:`StudyError`, one line naming the clip and the figures, nothing written to the
    database) unless ``allow_masking`` (recorded in the study's config, ``delivery``).
    ``delivery="lossless"``: each trial's tiles as an animated lossless WebP instead
    (:mod:`.lossless`): raters see the rendered pixels, nothing is measured and nothing masked
    (``config["delivery_mode"]``). ``delivery="auto"`` (``study create``'s default): chosen
    from the report's figures before encoding (:func:`_choose_delivery`); what was asked, what
    was chosen and why are recorded as ``config["delivery_choice"]`` (returned too).

    The key parts are sealed with the key file beside the database (:mod:`.seal`, made 0600
    if missing; ``key_file``); ``same_runs``: :func:`same_runs`.

    Returns ``{"study", "clips", "catch_versions", "media", "raters_planned", "plan",
    "warnings", "delivery", "media_bytes", "excerpt", "key_file", "same_runs"}`` (``excerpt``: :func:`.excerpt.plan`'s windows, or None); ``warnings`` lists every way the design is below what the planner asks for.
    The clips' media are encoded several at once (:func:`.media.ordered_map`); ``progress``:
    True: a progress bar per clip on stderr; a callable: called ``(done, total)`` after each
    clip (``study create`` prints lines when stderr is not a terminal).

    ``excerpt_seconds``: every clip shown as one window of that many seconds, the same for
    both sides, catch versions and stimuli; ``excerpt_at``: ``"worst"`` (default: the window of
    highest mean per-frame LPIPS in the report) or the start in seconds
    (:mod:`.excerpt`; recorded as ``config["excerpt"]``)."""
    ex_seconds, ex_at, kind, ladder, ladder_warnings = _check_create(
        protocol,
        clips_spec=clips_spec,
        raters_planned=raters_planned,
        margin=margin,
        seed=seed,
        media_dir=media_dir,
        catch_alpha=catch_alpha,
        levels=levels,
        ladder=ladder,
        delivery_margin_db=delivery_margin_db,
        excerpt_seconds=excerpt_seconds,
        excerpt_at=excerpt_at,
    )
    if delivery not in (AUTO, *DELIVERIES):
        raise StudyError(f"--delivery: expected {', '.join(DELIVERIES)} or {AUTO}, found {delivery!r}")
    rep = read_report(report)
    d, media = _open_store(db, media_dir)
    key = seal.create_or_load(seal.default_path(d.path, media))  # before any encoding
    # the counterbalancing and every rater's draws come from a secret seed, sealed: the study's
    # own seed (the owner's) cannot rebuild the key (docs/studies.md, No peeking)
    # (``design_seed``: given only by the attacker suite's tests, so that a run is reproducible;
    # no command passes one)
    design_seed = secrets.randbits(63) if design_seed is None else int(design_seed)
    chosen = design.select_clips(rep["jobs"], clips_spec, seed)
    cut = excerpt.plan(rep["report"], chosen, ex_seconds, ex_at)  # None: whole clips
    choice = _choose_delivery(delivery, rep["report"], chosen, ladder, kind, cut, allow_masking=allow_masking)
    delivery = choice["chosen"]  # before any encoding
    n_rows = len(chosen) * len(ladder)  # rows of the clips table: (clip, level) pairs
    proto = protocols.get(protocol)
    the_plan, warnings = proto.study_plan(margin, alpha, raters_planned, len(chosen), ladder, ladder_warnings)
    planned = raters_planned or the_plan["raters"]
    swap, xbit = design.base_bits(n_rows, design_seed)
    # easy and graded catch trials per rater, at most half of a rater's trials (issue 46)
    n_catch, n_graded = design.catch_counts(n_rows, catch_alpha)
    min_correct = _catch_min_correct(n_catch, catch_alpha)  # refused before any encoding
    share = catch_share(n_rows, n_catch, n_graded, min_correct, catch_alpha)  # said by create
    work = _plan_rows(chosen, ladder, n_catch, kind, n_graded)
    encode = dict(
        kind=kind,
        forced=proto.forced_choice,
        media=media,
        offs=proto.offsets(ladder),
        swap=swap,
        xbit=xbit,
        metrics_device=metrics_device,
        measure_reference=proto.measures_reference,
        delivery_margin_db=delivery_margin_db,
        delivery=delivery,
    )
    try:
        made = _make_media(
            work,
            encode,
            cut=cut,
            ex_seconds=ex_seconds,
            ex_at=ex_at,
            delivery_margin_db=delivery_margin_db,
            allow_masking=allow_masking,
            progress=progress,
        )
    except StudyError as e:  # the encode masks what the figures did not show
        if choice["asked"] != AUTO or not str(e).startswith("delivery fidelity:"):
            raise
        raise StudyError(
            f"{e}; --delivery auto chose stream from the report's figures "
            f"({choice['reason']}), the encode disagrees: --delivery lossless "
            "shows the rendered pixels"
        ) from None
    clip_rows, pool = made["rows"], made["catches"]
    mode = delivery
    delivery = (
        exact_summary([r["delivery"] for r in clip_rows])
        if mode == "lossless"
        else delivery_rule.summary([r["delivery"] for r in clip_rows], delivery_margin_db, allow_masking)
    )
    media_bytes = delivery_rule.media_bytes(
        media, [r["streams"] for r in clip_rows] + [p["streams"] for p in pool], ext=EXT[mode]
    )
    config = _study_config(
        made,
        protocol=protocol,
        catch_alpha=catch_alpha,
        n_catch=n_catch,
        n_graded=n_graded,
        min_correct=min_correct,
        the_plan=the_plan,
        clips_of=len(rep["jobs"]),
        delivery=delivery,
        media_bytes=media_bytes,
        cut=cut,
        ladder=ladder,
        kind=kind,
        metrics_device=metrics_device,
    )
    config.update(
        design_seed=design_seed,
        runs=run_identity(rep["run_a"], rep["run_b"]),
        delivery_mode=mode,
        delivery_choice=choice,
    )
    sid = _write_study(
        d,
        key,
        config,
        made,
        protocol=protocol,
        margin=margin,
        seed=seed,
        clips_spec=clips_spec,
        planned=planned,
        catch_threshold=min_correct / n_catch,
        alpha=alpha,
        rep=rep,
        media=media,
    )
    return {
        "study": sid,
        "clips": len(clip_rows),
        "catch_versions": len(pool),
        "media": str(media),
        "raters_planned": planned,
        "invite": _invite_count(planned, the_plan),
        "plan": the_plan,
        "warnings": warnings,
        "delivery": delivery,
        "media_bytes": media_bytes,
        "excerpt": cut,
        "key_file": str(key.path),
        "same_runs": same_runs(d, sid),
        "delivery_mode": mode,
        "seen": SEEN[mode],
        "delivery_choice": choice,
        "catch_share": share,
    }


def _choose_delivery(
    asked: str, report, chosen: list, ladder: list, kind: str, cut, *, allow_masking: bool = False
) -> dict:
    """How trials will reach raters (``config["delivery_choice"]``): ``asked`` ``stream`` or
    ``lossless`` is taken as given; ``auto`` asks :func:`.delivery_rule.choose_delivery` from the
    report's figures alone, before anything is encoded (lossless where the H.264 stream is
    predicted to mask any row, else stream), except that ``allow_masking`` (which only a
    stream can need) keeps the stream and records the prediction beside it.
    ``{"asked", "chosen", "reason", "text"}``; ``text`` is the one line ``study create`` and
    ``study results`` print."""
    if asked != AUTO:
        return {
            "asked": asked,
            "chosen": asked,
            "reason": f"--delivery {asked}",
            "text": f"delivery choice: {asked} (forced: --delivery {asked})",
        }
    report = Path(report)
    figures = next((report / n for n in ("frames.csv", "clips.csv") if (report / n).is_file()), None)
    if figures is None:  # nothing to predict from: the safe choice
        mode, why = (
            "lossless",
            (
                "delivery: lossless (the report has no frames.csv or clips.csv "
                "to predict the stream's fidelity from)"
            ),
        )
    else:
        try:
            mode, why = delivery_rule.choose_delivery(
                delivery_rule.delivery_rows(chosen, ladder, kind, cut), report
            )
        except (OSError, UnicodeDecodeError, csv.Error, ValueError, TypeError) as e:
            raise InputFileError(
                figures,
                "could not read the figures to choose the delivery "
                f"({e.__class__.__name__}: {e}); or pass --delivery "
                "stream|lossless",
            ) from None
    reason = why.split(": ", 1)[1] if why.startswith("delivery: ") else why
    if allow_masking:
        return {
            "asked": AUTO,
            "chosen": "stream",
            "reason": f"--allow-masking; predicted {why}",
            "text": "delivery choice: stream (--allow-masking asks for the stream as "
            f"delivered, masking accepted; the report's figures predict {reason})",
        }
    return {
        "asked": AUTO,
        "chosen": mode,
        "reason": why,
        "text": f"delivery choice: {reason}; --delivery auto, from the report's figures "
        "(force one with --delivery stream|lossless)",
    }


def _check_create(
    protocol: str,
    *,
    clips_spec,
    raters_planned,
    margin,
    seed,
    media_dir,
    catch_alpha,
    levels,
    ladder,
    delivery_margin_db,
    excerpt_seconds,
    excerpt_at,
) -> tuple:
    """:func:`create_study`'s options, each refused (:class:`StudyError`) with a message naming
    its option, before anything is read or written. Returns the excerpt's (seconds, at), the
    ladder's kind, the levels (``[None]``: one row per clip) and the levels' warnings."""
    ex_seconds, ex_at = excerpt.parse(excerpt_seconds, excerpt_at)
    if protocol not in design.PROTOCOLS:
        raise StudyError(f"--protocol: expected preference, abx or threshold, found {protocol!r}")
    kind = "amplify" if ladder is None else ladder
    proto = protocols.get(protocol)
    proto.check_ladder(ladder)
    if kind not in threshold.LADDERS:
        raise StudyError(f"--ladder: expected one of {', '.join(threshold.LADDERS)}, found {ladder!r}")
    # from here: the levels (``[None]``: one row per clip)
    ladder, ladder_warnings = proto.levels(levels, kind, raters_planned)
    if not 0 < margin < 0.5:
        raise StudyError(f"--margin: expected a number in (0, 0.5), found {margin}")
    if not 0 <= delivery_margin_db < 100:
        raise StudyError(f"--delivery-margin: expected dB in [0, 100), found {delivery_margin_db}")
    if not 0 < catch_alpha < 1:
        raise StudyError(f"--catch-alpha: expected a number in (0, 1), found {catch_alpha}")
    if raters_planned < 0:
        raise StudyError(f"--raters: expected 0 (the planner's figure) or more, found {raters_planned}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise StudyError(f"--seed: expected an integer in [0, 2**63), found {seed!r}")
    if media_dir is not None and Path(media_dir).exists() and not Path(media_dir).is_dir():
        raise StudyError(f"--media {media_dir}: expected a folder, found a file")
    try:
        design.parse_clips_spec(clips_spec)
    except ValueError as e:
        raise StudyError(str(e)) from None
    return ex_seconds, ex_at, kind, ladder, ladder_warnings


def _open_store(db, media_dir) -> tuple:
    """The study database (created if new) and the folder of the browser copies (``media_dir``,
    or the database's default beside an SQLite file), cleared of what a killed create left."""
    d = open_db(db, create=True)
    media = Path(media_dir) if media_dir else d.default_media_dir
    if media is None:
        raise StudyError(
            "--media: a folder for the browser copies is needed with a "
            f"non-SQLite database ({d.engine.url.render_as_string()})"
        )
    prepare_media_dir(media)  # what a killed create left, before any encode
    return d, media


def _plan_rows(
    chosen: list, ladder: list, n_catch: int, kind: str, n_graded: int = design.GRADED_CATCHES
) -> list:
    """The rows of the clips table and their catch versions, planned in clip order: per clip,
    ``(clip, [(row index, level, [(catch kind, from B, colour offset)])])``, the work of
    :func:`.trialmedia.clip_media`. The catch versions come from what the rows show
    (:func:`.design.catch_plan`: the sides' content fingerprints, :func:`.trialmedia.fingerprint`,
    and the level with its colour offset; amplify level 1 unshifted shows B itself, as an ABX
    row does), never from a seed, so
    every study of the same rows has the same catch files, as it has the same test files."""
    offs = threshold.offsets(ladder) if ladder != [None] else {}
    rows, where = [], []
    for c in chosen:
        sides = (trialmedia.fingerprint(c["path_a"]), trialmedia.fingerprint(c["path_b"]))
        for k in ladder:
            # a level's row shows the stimulus shifted by the ladder's offset for it
            shown = None if k is None else (kind, float(k), tuple(offs[k]))
            rows.append((sides, None if shown == ("amplify", 1.0, (0, 0, 0)) else shown))
            where.append((c, k))
    plan = design.catch_plan(rows, n_catch, threshold.CATCH_OFFSETS, n_graded)
    work = []
    for i, ((c, k), versions) in enumerate(zip(where, plan)):
        if not work or work[-1][0] is not c:
            work.append((c, []))
        work[-1][1].append((i, k, versions))
    return work


def _make_media(
    work: list,
    encode: dict,
    *,
    cut,
    ex_seconds,
    ex_at,
    delivery_margin_db: float,
    allow_masking: bool,
    progress: bool,
) -> dict:
    """Every clip's media (:func:`.trialmedia.clip_media` with ``encode``, its delivery judged by
    :func:`_deliver`), made in workers (:func:`.media.ordered_map`) and taken in clip order; the
    clips of one study share one frame rate. Returns ``{"fps", "rows", "stimuli", "catches",
    "seconds", "reference"}``."""
    clip_rows, pool, seconds = [], [], {}
    stimuli, reference = [], {}
    study_fps = first = None

    def clip_media(job) -> dict:
        window = cut and (cut["windows"][job[0]["job"]], ex_seconds, ex_at)
        out = trialmedia.clip_media(*job, window=window, **encode)
        for row in out["rows"]:
            if encode["delivery"] == "lossless":
                continue  # exact: nothing to judge
            _deliver(row, encode["media"], delivery_margin_db, allow_masking)
        return out

    from tqdm import tqdm

    with tqdm(
        total=len(work), desc="study media", unit="clip", disable=progress is not True, mininterval=0.5
    ) as bar:
        for n, ((c, _), done) in enumerate(zip(work, ordered_map(clip_media, work)), 1):
            for path, f in ((c["path_a"], done["fps_a"]), (c["path_b"], done["fps_b"])):
                if study_fps is None:
                    study_fps, first = f, path
                elif f != study_fps:
                    raise StudyError(
                        f"{path}: field 'fps': expected {_fps_text(study_fps)} fps "
                        f"like {first} (the clips of one study share one frame "
                        f"rate), found {_fps_text(f)}"
                    )
            if done.get("error"):
                raise StudyError(done["error"])
            if "reference" in done:  # the real difference, the headroom's reference
                reference[c["job"]] = done["reference"]
            clip_rows.extend(done["rows"])
            stimuli.extend(done["stimuli"])
            pool.extend(done["catches"])
            seconds.update(done["seconds"])
            bar.update(1)
            if callable(progress):  # plain lines where no bar can be drawn (a log, CI)
                progress(n, len(work))
    return {
        "fps": study_fps,
        "rows": clip_rows,
        "stimuli": stimuli,
        "catches": pool,
        "seconds": seconds,
        "reference": reference,
    }


def _study_config(
    made: dict,
    *,
    protocol: str,
    catch_alpha: float,
    n_catch: int,
    n_graded: int,
    min_correct: int,
    the_plan: dict,
    clips_of: int,
    delivery: dict,
    media_bytes,
    cut,
    ladder: list,
    kind: str,
    metrics_device,
) -> dict:
    """The study's ``config``: catch rule, media key, plan, delivery, frame rate and media
    durations, the excerpt, the threshold ladder's conventions and reference; the streams,
    catch pool and stimuli by clip id are added by :func:`_write_study`."""
    pool, seconds, reference, study_fps = (made["catches"], made["seconds"], made["reference"], made["fps"])
    catch_rule = {
        "alpha": catch_alpha,
        "easy_trials": n_catch,
        "min_correct": min_correct,
        "graded_trials": n_graded if pool else 0,
    }
    timing = {
        "fps": float(study_fps),
        "fps_fraction": _fps_text(study_fps),
        "media_seconds": {k: round(float(v), 6) for k, v in sorted(seconds.items())},
    }
    config = {
        "catch_pool": [],
        "catch_rule": catch_rule,
        "media_key": new_media_key(),
        "plan": the_plan,
        "clips_of": clips_of,
        "delivery": delivery,
        "media_bytes": media_bytes,
        **timing,
    }
    if cut:
        config["excerpt"] = cut
    protocols.get(protocol).add_config(
        config, ladder=ladder, kind=kind, metrics_device=metrics_device, reference=reference
    )
    return config


def _write_study(
    d,
    key,
    config: dict,
    made: dict,
    *,
    protocol: str,
    margin: float,
    seed: int,
    clips_spec: str,
    planned: int,
    catch_threshold: float,
    alpha: float,
    rep: dict,
    media,
) -> int:
    """The study, its clips table rows and its config (streams, catch pool and stimuli by clip
    id) written in one transaction, the key parts sealed with ``key`` (:func:`.seal.seal_config`:
    streams, catch pool, the rows' counterbalancing bits, the design seed; the clips table's
    ``base_swap``/``base_x`` hold 0); returns the study's id."""
    clip_rows, pool, stimuli = made["rows"], made["catches"], made["stimuli"]
    with d.engine.begin() as conn:
        sid = conn.execute(
            studies.insert().values(
                protocol=protocol,
                margin=margin,
                seed=seed,
                clips_spec=clips_spec,
                raters_planned=planned,
                catch_threshold=catch_threshold,
                alpha=alpha,
                report=str(rep["report"]),
                run_a=str(rep["run_a"]),
                run_b=str(rep["run_b"]),
                media_dir=str(media),
                created=now(),
                config=config,
            )
        ).inserted_primary_key[0]
        ids = []
        for row in clip_rows:
            row = dict(row)
            streams = row.pop("streams")
            row.pop("delivery")
            bits = [int(row.pop("base_swap")), int(row.pop("base_x"))]
            ids.append(
                conn.execute(
                    clips.insert().values(study_id=sid, base_swap=0, base_x=0, **row)
                ).inserted_primary_key[0]
            )
            config.setdefault("streams", {})[str(ids[-1])] = streams
            config.setdefault("bits", {})[str(ids[-1])] = bits
        config["catch_pool"] = [
            {"clip_id": ids[p["ord"]], "kind": p["kind"], "streams": p["streams"]} for p in pool
        ]
        protocols.get(protocol).add_stimuli(config, ids, stimuli)
        conn.execute(
            studies.update().where(studies.c.id == sid).values(config=seal.seal_config(key, sid, config))
        )
    return sid


def _deliver(row: dict, media, margin_db: float, allow_masking: bool) -> None:
    """Judge a row's measured delivery (:func:`.delivery_rule.judge`); refuse
    (:class:`StudyError`) a masked row unless ``allow_masking``."""
    fig = delivery_rule.judge(row["delivery"], margin_db)
    row["delivery"] = fig
    if not fig["ok"] and not allow_masking:
        label = f"clip {row['job']}" + ("" if fig["level"] is None else f" at level {fig['level']:g}")
        raise StudyError(delivery_rule.refusal(label, fig))


def _fps_text(fps) -> str:
    fps = Fraction(fps).limit_denominator(1001 * 1000)
    return str(fps.numerator) if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator}"


#: the most raters one :func:`invite` makes (about 3 s; call it again for more)
MAX_INVITE = 10_000


def invite(db, study, count: int = 1, label: str | None = None) -> list[dict]:
    """Create ``count`` raters with their trial lists. Returns ``[{"rater", "token"}]``: the
    tokens exist only here (the database keeps their sha256)."""
    if not 1 <= count <= MAX_INVITE:
        raise StudyError(
            f"--count: expected 1 to {MAX_INVITE:,} raters per invitation, found "
            f"{count}" + (" (invite again for more)" if count > MAX_INVITE else "")
        )
    d = open_db(db)
    out = []
    with d.engine.begin() as conn:
        st = load_study(conn, study)
        cfg = seal.unseal_config(st["id"], st["config"])  # the key file is needed here
        key = seal.study_key(cfg)
        cl = [
            dict(r)
            for r in conn.execute(
                select(clips).where(clips.c.study_id == st["id"]).order_by(clips.c.ord)
            ).mappings()
        ]
        if "streams" not in cfg:  # made before trial streams (schema 4 and older)
            raise StudyError(
                f"study {st['id']}: made by an older evalkit (a video per side, "
                "before trial streams): it cannot take new raters; make it again "
                "from its report with `evalkit study create REPORT --db ...` and "
                "invite raters there"
            )
        pool = cfg["catch_pool"]
        # the study's catch trials per rater (a study made before the rule recorded them: the
        # counts of its time, unbounded)
        rule = cfg.get("catch_rule") or {}
        counts = (
            (int(rule["easy_trials"]), int(rule.get("graded_trials", 0)))
            if "easy_trials" in rule
            else (design.n_catch(len(cl)), design.GRADED_CATCHES)
        )
        for c in cl:
            c["streams"] = cfg["streams"][str(c["id"])]
            c["base_swap"], c["base_x"] = cfg["bits"][str(c["id"])]
        # the sealed design seed (never --seed: the draws could be rebuilt from it); studies
        # sealed by the schema 6 upgrade were drawn from their own seed
        dseed = cfg.get("design_seed", st["seed"])
        n = conn.execute(
            select(func.count()).select_from(raters).where(raters.c.study_id == st["id"])
        ).scalar_one()
        for k in range(n, n + count):
            token = secrets.token_urlsafe(24)
            rseed = design.rater_seed(dseed, k)
            rid = conn.execute(
                raters.insert().values(
                    study_id=st["id"],
                    idx=k,
                    token_sha256=token_hash(token),
                    label=label,
                    seed=0,
                    created=now(),
                )
            ).inserted_primary_key[0]  # the rater's seed: sealed
            plan = design.assign(st["protocol"], cl, pool, k, rseed, dseed, counts)
            conn.execute(
                trials.insert(),
                [
                    seal.seal_trial(key, rid, {"study_id": st["id"], "rater_id": rid, "ord": i, **t})
                    for i, t in enumerate(plan)
                ],
            )
            out.append({"rater": rid, "token": token})
    return out


def check_keys(db) -> list[str]:
    """Every study's key file, loaded and checked (:func:`.seal.study_key`): the server calls
    this before it serves, so a missing or wrong key file is one line at start, naming it,
    not an error on a rater's page. Returns the key files."""
    with open_db(db).engine.connect() as conn:
        cfgs = conn.execute(select(studies.c.config)).scalars().all()
    return sorted({str(seal.study_key(c).path) for c in cfgs if "seal" in (c or {})})


def list_studies(db) -> list[dict]:
    """One dict per study with live counts: clips, raters invited, ratings stored, trials."""
    d = open_db(db)

    def count(tbl):
        return select(tbl.c.study_id, func.count().label("n")).group_by(tbl.c.study_id).subquery()

    with d.engine.connect() as conn:
        n = {
            name: dict(conn.execute(select(q.c.study_id, q.c.n)).all())
            for name, q in (
                ("clips", count(clips)),
                ("raters", count(raters)),
                ("ratings", count(ratings)),
                ("trials", count(trials)),
            )
        }
        rows = conn.execute(
            select(studies.c.id, studies.c.protocol, studies.c.raters_planned, studies.c.created).order_by(
                studies.c.id
            )
        ).all()
    return [
        {
            "study": i,
            "protocol": p,
            "clips": n["clips"].get(i, 0),
            "raters": n["raters"].get(i, 0),
            "raters_planned": rp,
            "ratings": n["ratings"].get(i, 0),
            "trials": n["trials"].get(i, 0),
            "created": str(cr),
        }
        for i, p, rp, cr in rows
    ]


def catch_share(n_rows: int, easy: int, graded: int, min_correct: int, catch_alpha: float) -> dict:
    """What a rater's trials hold (``study create`` says it; issue 46): test and catch trials,
    the catch share against :data:`.design.MAX_CATCH_SHARE`, whether the bound cut catch trials
    (``reduced``) or the screening needs more than it allows (``over``), and the screening's
    error rates (an attentive rater, 95% right, excluded; a random clicker kept)."""
    catch = easy + graded
    total = n_rows + catch
    share = catch / total if total else 0.0
    full_easy, full_graded = design.n_catch(n_rows), design.GRADED_CATCHES
    reduced = (easy, graded) != (full_easy, full_graded)
    over = share > design.MAX_CATCH_SHARE + 1e-12
    excluded, kept = stats.catch_error_rates(easy, alpha=catch_alpha)
    text = (
        f"each rater: {total} trials, {n_rows} test and {catch} catch ({100 * share:.0f}%; "
        f"{easy} easy, {graded} graded)"
    )
    bound = f"{100 * design.MAX_CATCH_SHARE:.0f}%"
    if over:
        text += (
            f": above the {bound} bound, as the catch screening at --catch-alpha "
            f"{catch_alpha:g} needs {easy} easy catch trials; {2 * easy} or more test trials "
            "per rater stay within it"
        )
    elif reduced:
        text += (
            f": bounded at {bound} of a rater's trials (without the bound {full_easy} easy "
            f"and {full_graded} graded)"
        )
    text += (
        f"; a rater stays with {min_correct} of {easy} easy catch trials right: an attentive "
        f"rater (95% right) is excluded {100 * excluded:.0f}% of the time, a random clicker "
        f"kept {100 * kept:.1f}%"
    )
    return {
        "test": n_rows,
        "easy": easy,
        "graded": graded,
        "share": share,
        "reduced": reduced,
        "over": over,
        "attentive_excluded": excluded,
        "random_kept": kept,
        "text": text,
    }


def _catch_min_correct(n_catch: int, catch_alpha: float) -> int:
    """The easy catch trials a rater must get right (:func:`.stats.catch_min_correct`)."""
    try:
        return stats.catch_min_correct(n_catch, catch_alpha)
    except ValueError as e:
        raise StudyError(f"--catch-alpha: {e}") from None


def _invite_count(planned: int, the_plan: dict) -> int:
    rate = float(the_plan.get("exclusion_rate") or 0.0)
    return int(math.ceil(planned / (1 - rate))) if rate < 1 else planned
