"""Study operations: create, invite, results, CSV export, unblinding, gate.

The key (which side is which backend, which answer is right) stays sealed until the planned
number of included raters has finished: before that, :func:`results`, :func:`ratings_csv` and
:func:`summary_csv` give counts and progress only, on every route that calls them (CLI, the
admin page, ``/export``). An owner who must look calls :func:`unblind`, which is logged (who,
when, at how many included raters, why) and reported with every later verdict and CSV; a study
unblinded early never claims "indistinguishable".

Every function takes ``db`` (a URL, an SQLite path or an open :class:`StudyDB`). What raters
do (next trial, media, answer, progress) lives in :mod:`.live`.
"""
from __future__ import annotations

import csv
import json
import math
import secrets
from fractions import Fraction
from pathlib import Path

import numpy as np
from sqlalchemy import func, select

from ..errors import InputFileError
from ..fsutil import atomic_write_text, csv_text
from ..formats.run import clip_files
from . import design, excerpt, fidelity, seal, simcache, stats, threshold, trialmedia
from .lossless import DELIVERIES, EXT, SEEN, delivery_of, exact_summary
from .errors import (StudyError, UnknownStudy)
from .live import token_hash
from .media import ordered_map, prepare_media_dir
from .store import (clips, new_media_key, now, open_db, raters, ratings, studies, trials,
                    unblindings)

#: ``study create --delivery auto``: chosen from the report's figures before encoding
AUTO = "auto"


# -- creation ------------------------------------------------------------------------------

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
    from ..formats.models import SUMMARY_SCHEMA_VERSION
    from ..formats.models import version_problem

    problem = version_problem(summary, SUMMARY_SCHEMA_VERSION, default=SUMMARY_SCHEMA_VERSION)
    if problem:             # a report of another evalkit: its fields may mean something else
        raise InputFileError(summary_path, f"field 'schema_version': {problem}")
    for side, run in (("a", run_a), ("b", run_b)):
        if not run.is_absolute() and not run.is_dir():   # older reports kept paths as given
            raise InputFileError(summary_path, f"field 'runs.{side}.path': run folder '{run}' not "
                                 "found (a path relative to where compare ran: run study create "
                                 "from that folder, or compare again)")
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
                raise InputFileError(p, f"clip of job {job} not found (the report's run folders "
                                     "must still hold their clips)")
        lp = r.get("lpips_mean") or None
        out.append({"job": job, "clip": r.get("clip", ""), "prompt": r.get("prompt", ""),
                    "seed": int(r["seed"]) if r.get("seed") else 0,
                    "lpips_mean": float(lp) if lp else None, "path_a": a, "path_b": b})
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


def _runs_keys(row) -> set:
    """What makes two studies "from the same runs": the pair of run manifests' hashes (either
    order), or the pair of run folders (studies made before hashes were recorded)."""
    cfg = row["config"] or {}
    runs = cfg.get("runs") or {}
    keys = {("path", frozenset(str(Path(p).resolve()) for p in (row["run_a"], row["run_b"])))}
    shas = [(runs.get(s) or {}).get("manifest_sha256") for s in ("a", "b")]
    if all(shas):
        keys.add(("manifest", frozenset(shas)))
    return keys


def same_runs(db, study) -> dict:
    """Every study in this database made from the same runs as ``study`` (same run manifests,
    or the same run folders), itself included: ``{"studies": [ids], "text"}``; results name them
    all, so a best of several studies of the same runs cannot be reported as if it were the
    only one."""
    with open_db(db).engine.connect() as conn:
        sid = _study(conn, study)["id"]
        rows = [dict(r) for r in conn.execute(select(
            studies.c.id, studies.c.run_a, studies.c.run_b, studies.c.config)).mappings()]
    mine = _runs_keys(next(r for r in rows if r["id"] == sid))
    ids = sorted(r["id"] for r in rows if r["id"] == sid or _runs_keys(r) & mine)
    n = len(ids)
    text = (f"{n} studies were made from these runs: {', '.join(map(str, ids))} (report every "
            "one, not the best)" if n > 1 else
            f"1 study was made from these runs: {sid} (this one)")
    return {"studies": ids, "count": n, "text": text}


def create_study(report, db, *, protocol: str, clips_spec: str = "all", raters_planned: int = 0,
                 margin: float = 0.1, seed: int = 0, media_dir=None,
                 catch_alpha: float = 0.05, alpha: float = 0.05, levels=None,
                 ladder: str | None = None, metrics_device="cpu", progress: bool = False,
                 allow_masking: bool = False,
                 delivery_margin_db: float = fidelity.MARGIN_DB,
                 excerpt_seconds=None, excerpt_at=None, delivery: str = "stream",
                 design_seed: int | None = None) -> dict:
    """Create a study from a compare report: select clips, write the trial streams (every
    arrangement of each row's tiles, see :func:`.media.store_tiled` and
    :func:`.design.stream_keys`) and the catch versions, record everything.
    ``raters_planned`` 0: the planner's figure (:func:`.stats.plan`).

    ``protocol="threshold"``: ``levels`` (``"1,2,4"`` or numbers; default
    :data:`.threshold.DEFAULT_LEVELS`) amplify each clip's backend difference
    (:func:`.threshold.amplify`); every (clip, level) is one row of the ``clips`` table (side B
    is the stimulus ``S_k``, its ``lpips_mean`` the stimulus's LPIPS against A, measured on
    ``metrics_device``), shown as ABX. ``raters_planned`` is required (no planner).
    ``ladder``: ``amplify`` (default) or ``blur`` (A blurred with sigma k px: a known
    degradation to compare thresholds with; :func:`.threshold.stimulus`).

    Delivery fidelity (:mod:`.fidelity`): every row's trial streams are decoded and measured
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
        protocol, clips_spec=clips_spec, raters_planned=raters_planned, margin=margin, seed=seed,
        media_dir=media_dir, catch_alpha=catch_alpha, levels=levels, ladder=ladder,
        delivery_margin_db=delivery_margin_db, excerpt_seconds=excerpt_seconds,
        excerpt_at=excerpt_at)
    if delivery not in (AUTO, *DELIVERIES):
        raise StudyError(f"--delivery: expected {', '.join(DELIVERIES)} or {AUTO}, found "
                         f"{delivery!r}")
    rep = read_report(report)
    d, media = _open_store(db, media_dir)
    key = seal.create_or_load(seal.default_path(d.path, media))   # before any encoding
    # the counterbalancing and every rater's draws come from a secret seed, sealed: the study's
    # own seed (the owner's) cannot rebuild the key (docs/studies.md, No peeking)
    # (``design_seed``: given only by the attacker suite's tests, so that a run is reproducible;
    # no command passes one)
    design_seed = secrets.randbits(63) if design_seed is None else int(design_seed)
    chosen = design.select_clips(rep["jobs"], clips_spec, seed)
    cut = excerpt.plan(rep["report"], chosen, ex_seconds, ex_at)   # None: whole clips
    choice = _choose_delivery(delivery, rep["report"], chosen, ladder, kind, cut,
                              allow_masking=allow_masking)
    delivery = choice["chosen"]                # before any encoding
    n_rows = len(chosen) * len(ladder)        # rows of the clips table: (clip, level) pairs
    the_plan, warnings = _study_plan(protocol, margin, alpha, raters_planned, len(chosen),
                                     ladder, ladder_warnings)
    planned = raters_planned or the_plan["raters"]
    swap, xbit = design.base_bits(n_rows, design_seed)
    # easy and graded catch trials per rater, at most half of a rater's trials (issue 46)
    n_catch, n_graded = design.catch_counts(n_rows, catch_alpha)
    min_correct = _catch_min_correct(n_catch, catch_alpha)   # refused before any encoding
    share = catch_share(n_rows, n_catch, n_graded, min_correct, catch_alpha)   # said by create
    work = _plan_rows(chosen, ladder, n_catch, kind, n_graded)
    encode = dict(kind=kind, forced=protocol in design.FORCED_CHOICE, media=media,
                  offs=threshold.offsets(ladder) if protocol == "threshold" else {},
                  swap=swap, xbit=xbit, metrics_device=metrics_device,
                  measure_reference=protocol == "threshold", delivery_margin_db=delivery_margin_db,
                  delivery=delivery)
    try:
        made = _make_media(work, encode, cut=cut, ex_seconds=ex_seconds, ex_at=ex_at,
                           delivery_margin_db=delivery_margin_db, allow_masking=allow_masking,
                           progress=progress)
    except StudyError as e:                    # the encode masks what the figures did not show
        if choice["asked"] != AUTO or not str(e).startswith("delivery fidelity:"):
            raise
        raise StudyError(f"{e}; --delivery auto chose stream from the report's figures "
                         f"({choice['reason']}), the encode disagrees: --delivery lossless "
                         "shows the rendered pixels") from None
    clip_rows, pool = made["rows"], made["catches"]
    mode = delivery
    delivery = (exact_summary([r["delivery"] for r in clip_rows]) if mode == "lossless" else
                fidelity.summary([r["delivery"] for r in clip_rows], delivery_margin_db,
                                 allow_masking))
    media_bytes = fidelity.media_bytes(media, [r["streams"] for r in clip_rows]
                                       + [p["streams"] for p in pool], ext=EXT[mode])
    config = _study_config(made, protocol=protocol, catch_alpha=catch_alpha, n_catch=n_catch,
                           n_graded=n_graded,
                           min_correct=min_correct, the_plan=the_plan, clips_of=len(rep["jobs"]),
                           delivery=delivery, media_bytes=media_bytes, cut=cut, ladder=ladder,
                           kind=kind, metrics_device=metrics_device)
    config.update(design_seed=design_seed, runs=run_identity(rep["run_a"], rep["run_b"]),
                  delivery_mode=mode, delivery_choice=choice)
    sid = _write_study(d, key, config, made, protocol=protocol, margin=margin, seed=seed,
                       clips_spec=clips_spec, planned=planned,
                       catch_threshold=min_correct / n_catch, alpha=alpha, rep=rep, media=media)
    return {"study": sid, "clips": len(clip_rows), "catch_versions": len(pool), "media": str(media),
            "raters_planned": planned, "invite": _invite_count(planned, the_plan),
            "plan": the_plan, "warnings": warnings, "delivery": delivery,
            "media_bytes": media_bytes, "excerpt": cut, "key_file": str(key.path),
            "same_runs": same_runs(d, sid), "delivery_mode": mode, "seen": SEEN[mode],
            "delivery_choice": choice, "catch_share": share}


def _choose_delivery(asked: str, report, chosen: list, ladder: list, kind: str, cut, *,
                     allow_masking: bool = False) -> dict:
    """How trials will reach raters (``config["delivery_choice"]``): ``asked`` ``stream`` or
    ``lossless`` is taken as given; ``auto`` asks :func:`.fidelity.choose_delivery` from the
    report's figures alone, before anything is encoded (lossless where the H.264 stream is
    predicted to mask any row, else stream), except that ``allow_masking`` (which only a
    stream can need) keeps the stream and records the prediction beside it.
    ``{"asked", "chosen", "reason", "text"}``; ``text`` is the one line ``study create`` and
    ``study results`` print."""
    if asked != AUTO:
        return {"asked": asked, "chosen": asked, "reason": f"--delivery {asked}",
                "text": f"delivery choice: {asked} (forced: --delivery {asked})"}
    report = Path(report)
    figures = next((report / n for n in ("frames.csv", "clips.csv") if (report / n).is_file()),
                   None)
    if figures is None:                        # nothing to predict from: the safe choice
        mode, why = "lossless", ("delivery: lossless (the report has no frames.csv or clips.csv "
                                 "to predict the stream's fidelity from)")
    else:
        try:
            mode, why = fidelity.choose_delivery(
                fidelity.delivery_rows(chosen, ladder, kind, cut), report)
        except (OSError, UnicodeDecodeError, csv.Error, ValueError, TypeError) as e:
            raise InputFileError(figures, "could not read the figures to choose the delivery "
                                 f"({e.__class__.__name__}: {e}); or pass --delivery "
                                 "stream|lossless") from None
    reason = why.split(": ", 1)[1] if why.startswith("delivery: ") else why
    if allow_masking:
        return {"asked": AUTO, "chosen": "stream", "reason": f"--allow-masking; predicted {why}",
                "text": "delivery choice: stream (--allow-masking asks for the stream as "
                        f"delivered, masking accepted; the report's figures predict {reason})"}
    return {"asked": AUTO, "chosen": mode, "reason": why,
            "text": f"delivery choice: {reason}; --delivery auto, from the report's figures "
                    "(force one with --delivery stream|lossless)"}


def _check_create(protocol: str, *, clips_spec, raters_planned, margin, seed, media_dir,
                  catch_alpha, levels, ladder, delivery_margin_db, excerpt_seconds,
                  excerpt_at) -> tuple:
    """:func:`create_study`'s options, each refused (:class:`StudyError`) with a message naming
    its option, before anything is read or written. Returns the excerpt's (seconds, at), the
    ladder's kind, the levels (``[None]``: one row per clip) and the levels' warnings."""
    ex_seconds, ex_at = excerpt.parse(excerpt_seconds, excerpt_at)
    if protocol not in design.PROTOCOLS:
        raise StudyError(f"--protocol: expected preference, abx or threshold, found {protocol!r}")
    kind = "amplify" if ladder is None else ladder
    if ladder is not None and protocol != "threshold":
        raise StudyError(f"--ladder: only for --protocol threshold, found --protocol {protocol}")
    if kind not in threshold.LADDERS:
        raise StudyError(f"--ladder: expected one of {', '.join(threshold.LADDERS)}, found "
                         f"{ladder!r}")
    ladder, ladder_warnings = [None], []       # from here: the levels (None: one per clip)
    if protocol == "threshold":
        ladder, ladder_warnings = threshold.parse_levels(
            threshold.DEFAULT_LEVELS if levels is None else levels, kind)
        if raters_planned <= 0:
            raise StudyError("--raters: the threshold protocol needs the planned number of "
                             f"raters (it has no planner), found {raters_planned}")
    elif levels is not None:
        raise StudyError(f"--levels: only for --protocol threshold, found --protocol {protocol}")
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
        raise StudyError("--media: a folder for the browser copies is needed with a "
                         f"non-SQLite database ({d.engine.url.render_as_string()})")
    prepare_media_dir(media)                   # what a killed create left, before any encode
    return d, media


def _study_plan(protocol: str, margin: float, alpha: float, raters_planned: int, n_clips: int,
                ladder: list, ladder_warnings: list) -> tuple[dict, list[str]]:
    """The study's design (:func:`_plan`; for the threshold protocol, ``--raters`` as given) and
    the warnings on it (:func:`_design_warnings`, or the levels' warnings)."""
    if protocol == "threshold":
        the_plan = {"raters": raters_planned, "exclusion_rate": 0.0, "levels": ladder,
                    "note": "no planner for the threshold protocol: --raters as given"}
        warnings = list(ladder_warnings)
    else:
        the_plan = _plan(protocol, margin, n_clips, alpha)
        warnings = _design_warnings(protocol, n_clips, raters_planned, the_plan)
    return the_plan, warnings


def catch_share(n_rows: int, easy: int, graded: int, min_correct: int,
                catch_alpha: float) -> dict:
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
    text = (f"each rater: {total} trials, {n_rows} test and {catch} catch ({100 * share:.0f}%; "
            f"{easy} easy, {graded} graded)")
    bound = f"{100 * design.MAX_CATCH_SHARE:.0f}%"
    if over:
        text += (f": above the {bound} bound, as the catch screening at --catch-alpha "
                 f"{catch_alpha:g} needs {easy} easy catch trials; {2 * easy} or more test trials "
                 "per rater stay within it")
    elif reduced:
        text += (f": bounded at {bound} of a rater's trials (without the bound {full_easy} easy "
                 f"and {full_graded} graded)")
    text += (f"; a rater stays with {min_correct} of {easy} easy catch trials right: an attentive "
             f"rater (95% right) is excluded {100 * excluded:.0f}% of the time, a random clicker "
             f"kept {100 * kept:.1f}%")
    return {"test": n_rows, "easy": easy, "graded": graded, "share": share, "reduced": reduced,
            "over": over, "attentive_excluded": excluded, "random_kept": kept, "text": text}


def _catch_min_correct(n_catch: int, catch_alpha: float) -> int:
    """The easy catch trials a rater must get right (:func:`.stats.catch_min_correct`)."""
    try:
        return stats.catch_min_correct(n_catch, catch_alpha)
    except ValueError as e:
        raise StudyError(f"--catch-alpha: {e}") from None


def _plan_rows(chosen: list, ladder: list, n_catch: int, kind: str,
               n_graded: int = design.GRADED_CATCHES) -> list:
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


def _make_media(work: list, encode: dict, *, cut, ex_seconds, ex_at, delivery_margin_db: float,
                allow_masking: bool, progress: bool) -> dict:
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
                continue                       # exact: nothing to judge
            _deliver(row, encode["media"], delivery_margin_db, allow_masking)
        return out

    from tqdm import tqdm

    with tqdm(total=len(work), desc="study media", unit="clip", disable=progress is not True,
              mininterval=0.5) as bar:
        for n, ((c, _), done) in enumerate(zip(work, ordered_map(clip_media, work)), 1):
            for path, f in ((c["path_a"], done["fps_a"]), (c["path_b"], done["fps_b"])):
                if study_fps is None:
                    study_fps, first = f, path
                elif f != study_fps:
                    raise StudyError(f"{path}: field 'fps': expected {_fps_text(study_fps)} fps "
                                     f"like {first} (the clips of one study share one frame "
                                     f"rate), found {_fps_text(f)}")
            if done.get("error"):
                raise StudyError(done["error"])
            if "reference" in done:           # the real difference, the headroom's reference
                reference[c["job"]] = done["reference"]
            clip_rows.extend(done["rows"])
            stimuli.extend(done["stimuli"])
            pool.extend(done["catches"])
            seconds.update(done["seconds"])
            bar.update(1)
            if callable(progress):      # plain lines where no bar can be drawn (a log, CI)
                progress(n, len(work))
    return {"fps": study_fps, "rows": clip_rows, "stimuli": stimuli, "catches": pool,
            "seconds": seconds, "reference": reference}


def _study_config(made: dict, *, protocol: str, catch_alpha: float, n_catch: int, n_graded: int,
                  min_correct: int, the_plan: dict, clips_of: int, delivery: dict,
                  media_bytes, cut, ladder: list, kind: str, metrics_device) -> dict:
    """The study's ``config``: catch rule, media key, plan, delivery, frame rate and media
    durations, the excerpt, the threshold ladder's conventions and reference; the streams,
    catch pool and stimuli by clip id are added by :func:`_write_study`."""
    pool, seconds, reference, study_fps = (made["catches"], made["seconds"], made["reference"],
                                           made["fps"])
    catch_rule = {"alpha": catch_alpha, "easy_trials": n_catch,
                  "min_correct": min_correct,
                  "graded_trials": n_graded if pool else 0}
    timing = {"fps": float(study_fps), "fps_fraction": _fps_text(study_fps),
              "media_seconds": {k: round(float(v), 6) for k, v in sorted(seconds.items())}}
    config = {"catch_pool": [], "catch_rule": catch_rule, "media_key": new_media_key(),
              "plan": the_plan, "clips_of": clips_of, "delivery": delivery,
              "media_bytes": media_bytes, **timing}
    if cut:
        config["excerpt"] = cut
    if protocol == "threshold":
        config["threshold"] = {"levels": ladder, "ladder": kind, "metric": threshold.METRIC,
                               "metrics_device": str(metrics_device),
                               "conventions": _conventions(reference), "stimuli": {},
                               "reference": {j: {k: v for k, v in m.items() if k != "conventions"}
                                             for j, m in reference.items()}}
    return config


def _write_study(d, key, config: dict, made: dict, *, protocol: str, margin: float, seed: int,
                 clips_spec: str, planned: int, catch_threshold: float, alpha: float, rep: dict,
                 media) -> int:
    """The study, its clips table rows and its config (streams, catch pool and stimuli by clip
    id) written in one transaction, the key parts sealed with ``key`` (:func:`.seal.seal_config`:
    streams, catch pool, the rows' counterbalancing bits, the design seed; the clips table's
    ``base_swap``/``base_x`` hold 0); returns the study's id."""
    clip_rows, pool, stimuli = made["rows"], made["catches"], made["stimuli"]
    with d.engine.begin() as conn:
        sid = conn.execute(studies.insert().values(
            protocol=protocol, margin=margin, seed=seed, clips_spec=clips_spec,
            raters_planned=planned,
            catch_threshold=catch_threshold, alpha=alpha,
            report=str(rep["report"]), run_a=str(rep["run_a"]), run_b=str(rep["run_b"]),
            media_dir=str(media), created=now(), config=config)).inserted_primary_key[0]
        ids = []
        for row in clip_rows:
            row = dict(row)
            streams = row.pop("streams")
            row.pop("delivery")
            bits = [int(row.pop("base_swap")), int(row.pop("base_x"))]
            ids.append(conn.execute(clips.insert().values(study_id=sid, base_swap=0, base_x=0,
                                                          **row)).inserted_primary_key[0])
            config.setdefault("streams", {})[str(ids[-1])] = streams
            config.setdefault("bits", {})[str(ids[-1])] = bits
        config["catch_pool"] = [{"clip_id": ids[p["ord"]], "kind": p["kind"],
                                 "streams": p["streams"]} for p in pool]
        if protocol == "threshold":
            config["threshold"]["stimuli"] = {str(ids[s["ord"]]): {
                k: v for k, v in s.items() if k != "ord"} for s in stimuli}
        conn.execute(studies.update().where(studies.c.id == sid).values(
            config=seal.seal_config(key, sid, config)))
    return sid

def _deliver(row: dict, media, margin_db: float, allow_masking: bool) -> None:
    """Judge a row's measured delivery (:func:`.fidelity.judge`); refuse
    (:class:`StudyError`) a masked row unless ``allow_masking``."""
    fig = fidelity.judge(row["delivery"], margin_db)
    row["delivery"] = fig
    if not fig["ok"] and not allow_masking:
        label = f"clip {row['job']}" + ("" if fig["level"] is None else
                                        f" at level {fig['level']:g}")
        raise StudyError(fidelity.refusal(label, fig))


def _conventions(reference: dict) -> dict:
    return next((m.get("conventions") for m in reference.values()), None) or {}


def _invite_count(planned: int, the_plan: dict) -> int:
    rate = float(the_plan.get("exclusion_rate") or 0.0)
    return int(math.ceil(planned / (1 - rate))) if rate < 1 else planned


_PLANS: dict = {}


def _plan(protocol: str, margin: float, n_clips: int, alpha: float) -> dict:
    """The planner's design for this study (cached per process and on disk: it simulates)."""
    key = (protocol, margin, n_clips, alpha)
    if key not in _PLANS:
        try:
            _PLANS[key] = simcache.cached(
                "plan", {"protocol": protocol, "margin": margin, "clips": n_clips, "alpha": alpha},
                lambda: stats.plan(protocol, margin, clips=n_clips, alpha=alpha))
        except ValueError as e:
            raise StudyError(str(e)) from None
    return _PLANS[key]


def _design_warnings(protocol: str, n_clips: int, raters_planned: int, the_plan: dict) -> list[str]:
    out = []
    if n_clips < stats.MIN_CLIPS:
        out.append(f"{n_clips} clips is below the {stats.MIN_CLIPS} the planner requires: the "
                   "verdict's error rates are only simulated from that size up")
    if protocol == "abx" and n_clips < the_plan.get("clips", 0):
        out.append(f"{n_clips} clips is below the planner's {the_plan['clips']} clips per rater "
                   f"for --margin {the_plan['margin']:g} (" + "; ".join(the_plan.get("notes") or [])
                   + "): the results will be UNDER-SIZED and claim 'indistinguishable' only if "
                   "the achieved design still keeps the 5% rule; add clips or raters")
    if raters_planned and raters_planned < the_plan["raters"]:
        out.append(f"--raters {raters_planned} is below the planner's {the_plan['raters']} "
                   f"included raters for --margin {the_plan['margin']:g} (see `evalkit study plan`)")
    return out


def _fps_text(fps) -> str:
    fps = Fraction(fps).limit_denominator(1001 * 1000)
    return str(fps.numerator) if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator}"


def _study(conn, study) -> dict:
    try:
        sid = int(study)
    except (TypeError, ValueError):
        raise UnknownStudy(study) from None
    if not 0 < sid < 2**63:          # no such id; the driver would overflow on a larger one
        raise UnknownStudy(study)
    row = conn.execute(select(studies).where(studies.c.id == sid)).mappings().first()
    if row is None:
        raise UnknownStudy(study)
    return dict(row)


#: the most raters one :func:`invite` makes (about 3 s; call it again for more)
MAX_INVITE = 10_000


def invite(db, study, count: int = 1, label: str | None = None) -> list[dict]:
    """Create ``count`` raters with their trial lists. Returns ``[{"rater", "token"}]``: the
    tokens exist only here (the database keeps their sha256)."""
    if not 1 <= count <= MAX_INVITE:
        raise StudyError(f"--count: expected 1 to {MAX_INVITE:,} raters per invitation, found "
                         f"{count}" + (" (invite again for more)" if count > MAX_INVITE else ""))
    d = open_db(db)
    out = []
    with d.engine.begin() as conn:
        st = _study(conn, study)
        cfg = seal.unseal_config(st["id"], st["config"])     # the key file is needed here
        key = seal.study_key(cfg)
        cl = [dict(r) for r in conn.execute(select(clips).where(clips.c.study_id == st["id"])
                                            .order_by(clips.c.ord)).mappings()]
        if "streams" not in cfg:   # made before trial streams (schema 4 and older)
            raise StudyError(f"study {st['id']}: made by an older evalkit (a video per side, "
                             "before trial streams): it cannot take new raters; make it again "
                             "from its report with `evalkit study create REPORT --db ...` and "
                             "invite raters there")
        pool = cfg["catch_pool"]
        # the study's catch trials per rater (a study made before the rule recorded them: the
        # counts of its time, unbounded)
        rule = cfg.get("catch_rule") or {}
        counts = ((int(rule["easy_trials"]), int(rule.get("graded_trials", 0)))
                  if "easy_trials" in rule else (design.n_catch(len(cl)), design.GRADED_CATCHES))
        for c in cl:
            c["streams"] = cfg["streams"][str(c["id"])]
            c["base_swap"], c["base_x"] = cfg["bits"][str(c["id"])]
        # the sealed design seed (never --seed: the draws could be rebuilt from it); studies
        # sealed by the schema 6 upgrade were drawn from their own seed
        dseed = cfg.get("design_seed", st["seed"])
        n = conn.execute(select(func.count()).select_from(raters)
                         .where(raters.c.study_id == st["id"])).scalar_one()
        for k in range(n, n + count):
            token = secrets.token_urlsafe(24)
            rseed = design.rater_seed(dseed, k)
            rid = conn.execute(raters.insert().values(
                study_id=st["id"], idx=k, token_sha256=token_hash(token), label=label,
                seed=0, created=now())).inserted_primary_key[0]   # the rater's seed: sealed
            plan = design.assign(st["protocol"], cl, pool, k, rseed, dseed, counts)
            conn.execute(trials.insert(), [seal.seal_trial(
                key, rid, {"study_id": st["id"], "rater_id": rid, "ord": i, **t})
                for i, t in enumerate(plan)])
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
        return (select(tbl.c.study_id, func.count().label("n")).group_by(tbl.c.study_id)
                .subquery())
    with d.engine.connect() as conn:
        n = {name: dict(conn.execute(select(q.c.study_id, q.c.n)).all())
             for name, q in (("clips", count(clips)), ("raters", count(raters)),
                             ("ratings", count(ratings)), ("trials", count(trials)))}
        rows = conn.execute(select(studies.c.id, studies.c.protocol, studies.c.raters_planned,
                                   studies.c.created).order_by(studies.c.id)).all()
    return [{"study": i, "protocol": p, "clips": n["clips"].get(i, 0),
             "raters": n["raters"].get(i, 0), "raters_planned": rp,
             "ratings": n["ratings"].get(i, 0), "trials": n["trials"].get(i, 0),
             "created": str(cr)} for i, p, rp, cr in rows]


# -- rater side: see :mod:`.live` (the one implementation of next trial, answer and progress)

# -- analysis ------------------------------------------------------------------------------

def raw_ratings(db, study) -> tuple[dict, list[dict]]:
    """The study row and one dict per rating, joined with its trial, rater and clip: unsealed
    (:func:`unsealed_ratings`) once the key is open (the planned included raters complete, or a
    logged :func:`unblind`), else as stored: a test trial's ``expected``, ``correct``,
    ``score_b``, ``shown`` and ``sources`` empty (catch trials keep theirs, for screening)."""
    st, rows = _stored_ratings(db, study)
    if _state(db, st, rows)["key_open"]:
        rows = _unseal_rows(st, rows)
    return st, rows


def unsealed_ratings(db, study) -> tuple[dict, list[dict]]:
    """The study row and its ratings with the key (:mod:`.seal`, the study's key file): each
    row's ``shown``, ``sources`` and ``expected`` from its sealed trial, ``correct`` and
    ``score_b`` computed from them. Refused (:class:`StudyError`) while the key is sealed: the
    one way to it before completion is :func:`unblind`, logged."""
    st, rows = _stored_ratings(db, study)
    state = _state(db, st, rows)
    if not state["key_open"]:
        raise StudyError(f"--study {st['id']}: {key_text(state)}")
    return st, _unseal_rows(st, rows)


def _unseal_rows(st: dict, rows: list[dict]) -> list[dict]:
    if not any(r.get("sealed") for r in rows):
        return rows
    key = seal.study_key(st["config"])
    out = []
    for r in rows:
        r = dict(r)
        r["answer"] = seal.open_answer(key, r["rater"], r["trial"], r["answer"])
        token = r.pop("sealed", None)
        if token:
            t = seal.unseal_trial(key, {"rater_id": r["rater"], "ord": r["trial_index"],
                                        "sealed": token})
            r.update(shown=t["shown"], sources=t["sources"], expected=t["expected"])
            r["correct"], r["score_b"] = design.score(st["protocol"], r, r["answer"])
        out.append(r)
    return out


def _stored_ratings(db, study) -> tuple[dict, list[dict]]:
    """The study row and one dict per rating, joined with its trial, rater and clip, as stored."""
    d = open_db(db)
    with d.engine.connect() as conn:
        st = _study(conn, study)
        q = (select(ratings.c.id.label("rating"), ratings.c.rater_id.label("rater"),
                    raters.c.label.label("rater_label"), ratings.c.trial_id.label("trial"),
                    trials.c.ord.label("trial_index"), trials.c.kind, trials.c.catch_kind,
                    trials.c.expected, trials.c.clip_id, clips.c.job, clips.c.clip,
                    clips.c.prompt, clips.c.seed, clips.c.lpips_mean, ratings.c.shown, ratings.c.sources, ratings.c.answer,
                    ratings.c.correct, ratings.c.response_ms, ratings.c.client_ms,
                    ratings.c.created, trials.c.sealed)
             .join(trials, trials.c.id == ratings.c.trial_id)
             .join(raters, raters.c.id == ratings.c.rater_id)
             .join(clips, clips.c.id == trials.c.clip_id, isouter=True)
             .where(ratings.c.study_id == st["id"]).order_by(ratings.c.id))
        rows = [dict(r) for r in conn.execute(q).mappings()]
    for r in rows:
        r["score_b"] = None
        if not r["sealed"]:                   # nothing sealed (never since schema 6)
            _, r["score_b"] = design.score(st["protocol"], r, r["answer"])
    return st, rows


def _round(v, nd=4):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, nd)


def _progress_by_rater(db, sid: int) -> dict[int, dict]:
    """rater id -> {"trials", "answered", "finished_at" (last rating's time or None), "label"}."""
    d = open_db(db)
    with d.engine.connect() as conn:
        total = dict(conn.execute(select(trials.c.rater_id, func.count()).where(
            trials.c.study_id == sid).group_by(trials.c.rater_id)).all())
        done = {r: (n, last) for r, n, last in conn.execute(
            select(ratings.c.rater_id, func.count(), func.max(ratings.c.created))
            .where(ratings.c.study_id == sid).group_by(ratings.c.rater_id)).all()}
        labels = dict(conn.execute(select(raters.c.id, raters.c.label)
                                   .where(raters.c.study_id == sid)).all())
    return {rid: {"trials": n, "answered": done.get(rid, (0, None))[0],
                  "finished_at": done[rid][1] if rid in done and done[rid][0] >= n else None,
                  "label": labels.get(rid)} for rid, n in total.items()}


def _catch_rule(st: dict) -> dict:
    rule = dict((st["config"] or {}).get("catch_rule") or {})
    rule.setdefault("alpha", 0.05)
    return rule


def _screen(rows: list[dict], complete: list[int], rule: dict) -> tuple[list[int], list[dict], dict]:
    """Catch screening of the complete raters: (included ids, excluded entries, graded stats).

    A rater is kept when their correct easy catch answers reach
    :func:`.stats.catch_min_correct` (better than guessing at the rule's alpha); graded catches
    are reported, never used to exclude."""
    easy: dict[int, list] = {}
    graded: dict[int, list] = {}
    for r in rows:
        if r["kind"] == "catch":
            g = graded if design.catch_grade(r["catch_kind"]) == "graded" else easy
            g.setdefault(r["rater"], []).append(int(r["correct"]))
    kept, excluded = [], []
    for rid in complete:
        c = easy.get(rid, [])
        try:
            need = stats.catch_min_correct(len(c), rule["alpha"]) if c else None
        except ValueError:          # too few catch trials (studies made before schema 4)
            kept.append(rid)
            continue
        if need is None or sum(c) < need:
            excluded.append({"rater": rid, "catch_trials": len(c), "catch_correct": sum(c),
                             "catch_needed": need,
                             "reason": "no easy catch trial" if need is None else
                             f"{sum(c)} of {len(c)} catch trials right, {need} needed"})
        else:
            kept.append(rid)
    g_all = [v for rid in complete for v in graded.get(rid, [])]
    g_kept = [v for rid in kept for v in graded.get(rid, [])]
    graded_out = {"trials": len(g_kept), "correct": int(sum(g_kept)),
                  "accuracy": _round(float(np.mean(g_kept)) if g_kept else None),
                  "accuracy_all_complete": _round(float(np.mean(g_all)) if g_all else None)}
    return kept, excluded, graded_out


def _decide(protocol: str, test: list[dict], margin: float, alpha: float, reps: int, seed: int) -> dict:
    rr = [r["rater"] for r in test]
    cc = [r["job"] for r in test]
    if protocol in design.FORCED_CHOICE:
        out = stats.decide_abx(rr, cc, [int(r["correct"]) for r in test], margin=margin,
                               alpha=alpha, reps=reps, seed=seed)
    else:
        out = stats.decide_preference(rr, cc, [r["score_b"] for r in test], alpha=alpha,
                                      reps=reps, seed=seed)
    names = {r["job"]: {"clip": r["clip"], "prompt": r["prompt"], "lpips_mean": r["lpips_mean"]}
             for r in test}
    for e in out.get("per_clip", []):
        e["job"] = e.pop("clip")
        e.update(names.get(e["job"], {}))
    out["rater_count"], out["clip_count"] = out.pop("raters", 0), out.pop("clips", 0)
    return out


def _threshold_results(st: dict, test: list[dict], reps: int) -> dict:
    """The threshold analysis of a complete threshold study's test trials
    (:func:`.psychometric.threshold_analysis`), the points per (clip, level), and a verdict
    line."""
    from .psychometric import headroom_sentence, threshold_analysis
    from .text import num

    cfg = st["config"].get("threshold") or {}
    stimuli = cfg.get("stimuli") or {}
    trials_ = threshold.analysis_trials(test, stimuli)
    ref = threshold.reference(st["config"])
    a = threshold_analysis(trials_, reference=ref, metric=threshold.METRIC, n_boot=reps,
                           seed=int(st["seed"]) % 2**32)
    n, correct = len(trials_), sum(t["correct"] for t in trials_)
    pooled = a.get("pooled") or {}
    thr, ci = pooled.get("threshold"), pooled.get("ci") or [None, None]
    head = a.get("headroom") or {}
    hci = head.get("ci") or [None, None]
    if thr is None:
        bound = pooled.get("bound")
        verdict = {"lower": "threshold above the levels shown",
                   "upper": "threshold below the levels shown"}.get(bound, "no threshold")
        text = f"{verdict}: " + ("; ".join(a.get("notes") or []) or "see the points per level")
    else:
        verdict = "threshold measured"
        text = (f"threshold {threshold.METRIC} {num(thr, 4)} (interval {num(ci[0], 4)} to "
                f"{num(ci[1], 4)}); real difference {num(a.get('reference'), 4)}; "
                f"{headroom_sentence(head.get('value'))} (interval {num(hci[0], 2)} to "
                f"{num(hci[1], 2)})")
    return {"verdict": verdict, "verdict_text": text, "threshold": a, "n": n, "correct": correct,
            "accuracy": (correct / n) if n else None, "levels": threshold.per_level(test, stimuli),
            "rule": f"psychometric fit of ABX proportion correct against the stimulus's "
                    f"{threshold.METRIC} (guess rate 0.5, criterion "
                    f"{a.get('criterion', 0.75)}); interval from a bootstrap over raters and "
                    f"clips ({reps} replicates)",
            "rater_count": len({t["rater"] for t in trials_}),
            "clip_count": len({t["clip"] for t in trials_})}


def _ladder(db, study) -> str:
    with open_db(db).engine.connect() as conn:
        st = _study(conn, study)
    return ((st["config"] or {}).get("threshold") or {}).get("ladder", "amplify")


#: ``study gate``'s default widest threshold interval (upper end / lower end): a pilot whose
#: interval spans more cannot set a gate (``--max-interval-ratio``; ``--allow-wide-interval``)
MAX_INTERVAL_RATIO = 4.0


def write_gate(db, study, out, *, safety_factor: float = 2.0, reps: int = 1000,
               max_interval_ratio: float = MAX_INTERVAL_RATIO,
               allow_wide_interval: bool = False) -> dict:
    """Write a gate YAML from a complete threshold study (atomically): LPIPS mean at most the
    pooled threshold / ``safety_factor``, with the study, threshold and interval recorded
    (:func:`.psychometric.gate_from_analysis`). Returns ``{"path", "threshold", "max",
    "unblinding"}``.

    Refused (a pilot cannot set a gate) when the measured threshold's interval is open at either
    end or its upper end is more than ``max_interval_ratio`` times its lower end, unless
    ``allow_wide_interval``. A threshold above every level shown gates on its lower bound (an
    interval open above by construction: conservative, allowed). A study unblinded early gets
    the unblinding as a comment in the gate file."""
    from .psychometric import gate_from_analysis

    if isinstance(max_interval_ratio, bool) or not isinstance(max_interval_ratio, (int, float)) \
            or not math.isfinite(max_interval_ratio) or max_interval_ratio <= 1:
        raise StudyError(f"--max-interval-ratio: expected a number above 1, found "
                         f"{max_interval_ratio}")

    if isinstance(safety_factor, bool) or not isinstance(safety_factor, (int, float)) \
            or not math.isfinite(safety_factor) or safety_factor < 1:
        raise StudyError(f"--safety-factor: expected a number of at least 1, found {safety_factor}")
    res = results(db, study, reps=reps)
    if res["protocol"] != "threshold":
        raise StudyError(f"--study {study}: expected a threshold study, found a "
                         f"{res['protocol']} study (a gate set by people needs --protocol "
                         "threshold)")
    kind = _ladder(db, study)
    if kind != "amplify":
        raise StudyError(f"--study {study}: expected a study of the amplify ladder (the backends' "
                         f"own kind of difference), found the {kind} ladder (shown for "
                         "comparison; it sets no gate)")
    if res["status"] != "complete":
        raise StudyError(f"--study {study}: expected a complete study, found {res['status']} "
                         f"({res['verdict_text']})")
    pooled = res["threshold"]["pooled"]
    problem = gate_interval_problem(pooled, max_interval_ratio)
    if problem and not allow_wide_interval:
        raise StudyError(f"--study {study}: {problem} (a pilot: add raters or clips, or "
                         "--allow-wide-interval to gate anyway)")
    # a threshold above every level shown gates on its lower bound; below them or none: refused
    # (the psychometric module's ThresholdError, a user error naming the study)
    text = gate_from_analysis(res["threshold"], study=str(res["study"]),
                              safety_factor=float(safety_factor))
    if res.get("unblinding"):
        text = text.rstrip("\n") + f"\n# {res['unblinding']['text']}\n"
    path = Path(out)
    if path.is_dir():
        raise StudyError(f"--out {path}: expected a file name, found a folder")
    atomic_write_text(path, text)
    thr = pooled.get("threshold")
    bound = None
    if thr is None:
        thr, bound = pooled["ci"][0], "lower"
    return {"path": str(path), "threshold": thr, "bound": bound,
            "max": thr / float(safety_factor), "text": text,
            "unblinding": res.get("unblinding")}


def gate_interval_problem(pooled: dict, max_interval_ratio: float = MAX_INTERVAL_RATIO) -> str | None:
    """Why a threshold fit cannot set a gate, or None: a measured threshold whose interval is
    open at either end, or whose upper end is more than ``max_interval_ratio`` times its lower
    end. A threshold above every level shown (none measured, a lower bound) is not refused here:
    its gate is the bound itself."""
    thr = pooled.get("threshold")
    if thr is None:
        return None
    lo, hi = (pooled.get("ci") or [None, None])[:2]
    found = f"threshold {thr:.4g}, interval {_num(lo)} to {_num(hi)}"
    if lo is None or hi is None or lo <= 0:
        return f"expected a threshold interval closed at both ends to set a gate, found {found}"
    if hi / lo > max_interval_ratio:
        return (f"expected a threshold interval at most {max_interval_ratio:g}x wide to set a "
                f"gate, found {found} ({hi / lo:.3g}x)")
    return None


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


#: the most bootstrap replicates :func:`results` draws (more changes nothing but the wait)
MAX_REPS = 100_000


def _state(db, st: dict, rows: list[dict]) -> dict:
    """Where a study stands: complete raters in order of completion, the catch screening, the
    logged unblindings and whether the key is open (the planned included raters are complete,
    or an unblinding was logged)."""
    planned = int(st["raters_planned"] or 0)
    prog = _progress_by_rater(db, st["id"])
    complete = sorted((rid for rid, p in prog.items() if p["finished_at"] is not None),
                      key=lambda rid: (prog[rid]["finished_at"], rid))
    rule = _catch_rule(st)
    kept, excluded, graded = _screen(rows, complete, rule)
    done = planned > 0 and len(kept) >= planned
    unb = unblinding_log(db, st["id"])
    return {"planned": planned, "prog": prog, "complete": complete, "rule": rule, "kept": kept,
            "excluded": excluded, "graded": graded, "done": done, "unblindings": unb,
            "key_open": done or bool(unb)}


def unblinding_log(db, study) -> list[dict]:
    """The study's logged unblindings, oldest first: ``who``, ``reason``, ``created``,
    ``raters_included``, ``raters_planned``, ``text`` (one line for verdicts and CSVs)."""
    with open_db(db).engine.connect() as conn:
        sid = _study(conn, study)["id"]
        rows = [dict(r) for r in conn.execute(
            select(unblindings).where(unblindings.c.study_id == sid)
            .order_by(unblindings.c.id)).mappings()]
    for r in rows:
        r["text"] = (f"key opened early by {r['who']} on {r['created']} at "
                     f"{r['raters_included']} of {r['raters_planned']} planned included "
                     f"raters: {r['reason']}")
    return rows


#: the longest ``--reason`` / ``--who`` kept in the log
MAX_REASON = 500


def unblind(db, study, *, reason: str, who: str) -> dict:
    """Open a study's key before its planned included raters are complete, logged in the
    database (who, when, at how many included raters, why). From then on the CSVs carry the key,
    :func:`results` shows a clearly labelled pilot summary while the study is interim, and every
    later verdict and CSV reports the unblinding; the verdict of the completed study never
    claims "indistinguishable". Refused for a complete study (its key is open already).
    Returns the logged entry."""
    for name, v in (("--reason", reason), ("--who", who)):
        if not isinstance(v, str) or not v.strip():
            raise StudyError(f"{name}: expected a non-empty text, found {v!r}")
        if len(v) > MAX_REASON or "\n" in v or "\r" in v:
            raise StudyError(f"{name}: expected one line of at most {MAX_REASON} characters, "
                             f"found {len(v)} characters" + (" over several lines"
                                                             if "\n" in v or "\r" in v else ""))
    st, rows = _stored_ratings(db, study)   # counts only: the key stays sealed
    state = _state(db, st, rows)
    if state["done"]:
        raise StudyError(f"--study {st['id']}: expected a study still short of its planned "
                         f"raters, found it complete ({len(state['kept'])} of "
                         f"{state['planned']} included raters): its key is open already, "
                         "nothing to unblind")
    entry = {"study_id": st["id"], "who": who.strip(), "reason": reason.strip(), "created": now(),
             "raters_included": len(state["kept"]), "raters_planned": state["planned"]}
    with open_db(db).engine.begin() as conn:
        entry["id"] = conn.execute(unblindings.insert().values(**entry)).inserted_primary_key[0]
    return unblinding_log(db, st["id"])[-1]


def _unblinding_out(unb: list[dict]) -> dict | None:
    if not unb:
        return None
    first = unb[0]
    return {"text": first["text"], "who": first["who"], "created": first["created"],
            "reason": first["reason"], "raters_included": first["raters_included"],
            "raters_planned": first["raters_planned"], "count": len(unb),
            "log": [{k: u[k] for k in ("who", "created", "raters_included", "reason")}
                    for u in unb]}


def results(db, study, *, reps: int = 1000) -> dict:
    """Analysis of a study (every rule in :mod:`evalkit.study.stats`).

    ``status``: ``no ratings``, ``interim`` (fewer complete included raters than planned: no
    verdict and no figure that would show where it is heading, on any page or command) or
    ``complete``. The verdict uses the first ``raters_planned`` included raters in order of
    completion (later raters are counted, not used: adding raters after a look cannot change a
    verdict); ``without_exclusions`` gives the same figures with the excluded raters (a
    sensitivity check, labelled, never a verdict). ABX and preference verdicts draw their
    bootstrap with :data:`.stats.VERDICT_REPS` replicates and :func:`.stats.verdict_seed`
    (``reps`` applies to threshold studies only: the same ratings always give the same
    verdict). ``design``: the achieved design against the plan (:func:`_achieved_design`); an
    ABX study below its plan says so and says "indistinguishable" only where the achieved
    design still keeps the 5% rule.

    ``unblinding``: None, or the first logged :func:`unblind` (``text``, who, when, at how many
    included raters, ``log`` of all). Then, while interim, ``pilot`` holds the rule's figures on
    the included raters so far, labelled as a pilot (never a verdict); once complete, a verdict
    of "indistinguishable" becomes :data:`.stats.UNBLINDED_EARLY` (the figures stay). ABX:
    ``coverage`` (:func:`.stats.coverage`) says which clips the verdict covers and bounds the
    share of visibly different clips like these."""
    if isinstance(reps, bool) or not isinstance(reps, int) or not 100 <= reps <= MAX_REPS:
        raise StudyError(f"--reps: expected 100 to {MAX_REPS:,} bootstrap replicates, found {reps}")
    st, rows = raw_ratings(db, study)
    protocol, margin, alpha = st["protocol"], st["margin"], st["alpha"]
    state = _state(db, st, rows)
    planned, prog, complete = state["planned"], state["prog"], state["complete"]
    rule, kept, excluded, graded = state["rule"], state["kept"], state["excluded"], state["graded"]
    out = {"study": st["id"], "protocol": protocol, "margin": margin, "alpha": alpha,
           "raters_planned": planned, "raters_invited": len(prog),
           "raters_started": sum(1 for p in prog.values() if p["answered"]),
           "raters_complete": len(complete), "raters_included": len(kept),
           "excluded_raters": excluded, "ratings": len(rows),
           "catch_rule": {"alpha": rule["alpha"], "easy_trials": rule.get("easy_trials"),
                          "min_correct": rule.get("min_correct"),
                          "text": "a rater is kept when their correct easy catch answers are "
                                  "better than guessing (one-sided exact binomial, level "
                                  f"{rule['alpha']:g}); graded catches are reported only"},
           "graded_catches": graded, "bootstrap_reps": reps,
           "unblinding": _unblinding_out(state["unblindings"]),
           "delivery": (st["config"] or {}).get("delivery"),
           "media_bytes": (st["config"] or {}).get("media_bytes"),
           "excerpt": (st["config"] or {}).get("excerpt"),
           "same_runs": same_runs(db, st["id"]), "seal": _seal_out(st),
           "delivery_mode": delivery_of(st["config"]), "seen": SEEN[delivery_of(st["config"])],
           "delivery_choice": (st["config"] or {}).get("delivery_choice")}
    out["claim"] = ("ABX (forced choice): can claim distinguishable or indistinguishable"
                    if protocol == "abx" else
                    "threshold (ABX over amplified differences): the metric size of a "
                    "difference of this kind that raters notice (75% correct), and the real "
                    "difference's headroom below it; assumes amplified differences are seen like "
                    "natural ones (docs/studies.md)"
                    if protocol == "threshold" else
                    "preference: reports a preference or none; never claims indistinguishable "
                    "(raters who see a difference but split their taste look like raters who "
                    "see none; use ABX for that claim)")
    if not rows:
        out.update(status="no ratings", verdict="no ratings yet",
                   verdict_text=f"no ratings yet: 0 of {planned} planned raters have started")
        return out
    if planned <= 0:
        out.update(status="interim", verdict="interim",
                   verdict_text="no verdict: this study has no planned number of raters "
                                "(made before plans were recorded)")
        return _with_pilot(out, st, rows, kept, reps)
    if len(kept) < planned:
        out.update(status="interim", verdict="interim",
                   verdict_text=f"interim: {len(kept)} of {planned} planned included raters "
                                f"complete ({len(complete)} complete, {len(excluded)} excluded); "
                                "no verdict is shown before the planned design is complete"
                                + ("" if out["unblinding"] else " (a pilot look needs the key: "
                                   "`evalkit study unblind`, logged, and the verdict then never "
                                   "says indistinguishable)"))
        return _with_pilot(out, st, rows, kept, reps)
    used = kept[:planned]
    out["raters_used"] = used
    test = [r for r in rows if r["kind"] == "test" and r["rater"] in set(used)]
    if protocol == "threshold":
        out.update(status="complete", **_threshold_results(st, test, reps))
        return out
    vseed = stats.verdict_seed(st["seed"])
    out["bootstrap_reps"], out["bootstrap_seed"] = stats.VERDICT_REPS, vseed
    if reps != stats.VERDICT_REPS:
        out["reps_note"] = (f"--reps {reps} is not used: a verdict's bootstrap is fixed per "
                            f"study ({stats.VERDICT_REPS} replicates, seed derived from the "
                            "study seed), so the same ratings always give the same verdict")
    dec = _decide(protocol, test, margin, alpha, stats.VERDICT_REPS, vseed)
    fidelity.per_clip_headroom(dec.get("per_clip") or [], out["delivery"])
    early = out["unblinding"] is not None
    out["design"] = achieved = _achieved_design(st, len(used), dec)
    if (dec["verdict"] == "indistinguishable" and achieved["check"] is not None
            and not achieved["check"]["ok"]):
        dec["verdict"] = "inconclusive"
        dec.setdefault("blocked", []).append(achieved["text"])
    dec["verdict"] = stats.after_unblinding(dec["verdict"], early)
    out.update(status="complete", **dec)
    out["verdict_text"] = f"{dec['verdict']} {out['seen']}"     # what raters saw, named
    if dec.get("blocked"):
        out["verdict_text"] += ": no equivalence claim although U < " + (
            f"{0.5 + margin:g}; " + "; ".join(dec["blocked"]))
    if dec["verdict"] == stats.UNBLINDED_EARLY:
        out["verdict_text"] += (": no equivalence claim, the figures below are shown without "
                                f"one (the {out['unblinding']['text']}; a look before the "
                                "planned raters finished can steer when a study stops)")
    if dec.get("flagged"):
        out["verdict_text"] += ("; detectably different clip" + ("s" if len(dec["flagged"]) > 1
                                else "") + ": " + ", ".join(map(str, dec["flagged"])))
    if protocol in design.FORCED_CHOICE:
        out["coverage"] = _coverage(st, dec)
    # sensitivity: the figures on the first planned complete raters, exclusions ignored; not a
    # verdict (a second verdict line is a second chance to read "indistinguishable": with 30%
    # random clickers it said so 7-9% of the time at the boundary), so no verdict word
    used_all = set(complete[:planned])
    test_all = [r for r in rows if r["kind"] == "test" and r["rater"] in used_all]
    d2 = _decide(protocol, test_all, margin, alpha, stats.VERDICT_REPS, vseed)
    out["without_exclusions"] = {k: d2.get(k) for k in (
        "n", "accuracy", "p_value", "p_text", "upper_bound", "win_rate_b",
        "ties", "flagged") if k in d2}
    out["without_exclusions"].update(
        raters=len(used_all), label="sensitivity check, not a verdict: the same figures with "
        "the raters the catch trials excluded")
    if protocol == "preference":
        units: dict[str, list] = {}
        for r in test:
            units.setdefault(r["job"], []).append({1.0: "b", 0.0: "a", 0.5: "same"}[r["score_b"]])
        out["krippendorff_alpha"] = _round(stats.krippendorff_alpha_nominal(list(units.values())))
    return out


def _seal_out(st: dict) -> dict:
    """How the study's key is kept: the key file, and whether its design can be rebuilt from
    its seed (studies sealed by the schema 6 upgrade)."""
    cfg = st["config"] or {}
    info = cfg.get("seal") or {}
    out = {"key_file": info.get("key_file"), "rebuildable_from_seed": bool(
        cfg.get("design_from_seed"))}
    out["text"] = (f"key sealed with {info.get('key_file')}" if info else "key not sealed")
    if out["rebuildable_from_seed"]:
        out["text"] += ("; made before schema 6: its design was drawn from the study's seed, so "
                        "anyone with the seed could rebuild the key at interim")
    return out


def _achieved_design(st: dict, raters: int, dec: dict) -> dict:
    """The design the verdict used against the study's plan (``config.plan``): ``raters``,
    ``clips``, ``planned_raters``, ``planned_clips``, ``under_sized``, ``earlier_rule`` (an ABX
    plan of an earlier :data:`.stats.RULE_VERSION`) and, for ABX below its plan, without one
    or planned by an earlier rule, ``check``: :func:`.stats.design_check` at the achieved size (an
    "indistinguishable" there stands only when the achieved design still keeps the 5% rule);
    ``text`` says it in one line."""
    clips = int(dec.get("clip_count") or 0)
    the_plan = (st["config"] or {}).get("plan") or {}
    pr, pc = the_plan.get("raters"), the_plan.get("clips")
    if st["protocol"] == "abx" and pc is not None:
        pc = max(int(pc), stats.min_clips(st["margin"]))   # plans made before the clips floor
    under = pr is None or raters < int(pr) or clips < int(pc or 0)
    # an ABX plan made by an earlier rule of the planner (before stats.RULE_VERSION 2: too few
    # clips per rater to see answers barely below chance) is checked like an under-sized one
    earlier = (st["protocol"] == "abx" and pr is not None and not under
               and int(the_plan.get("rule_version") or 1) < stats.RULE_VERSION)
    out = {"raters": raters, "clips": clips, "planned_raters": pr, "planned_clips": pc,
           "under_sized": bool(under), "earlier_rule": bool(earlier), "check": None}
    if not under and not earlier:
        out["text"] = f"{raters} raters x {clips} clips, as planned"
        return out
    plan_txt = (f"the plan for margin {st['margin']:g} asks for {pr} raters x {pc} clips"
                if pr is not None else "no plan recorded")
    out["text"] = (f"UNDER-SIZED: {raters} raters x {clips} clips; {plan_txt}" if under else
                   f"{raters} raters x {clips} clips, as planned by an earlier rule of the "
                   f"planner (version {int(the_plan.get('rule_version') or 1)}, now "
                   f"{stats.RULE_VERSION})")
    if st["protocol"] in design.FORCED_CHOICE and clips >= 1 and raters >= 1:
        args = {"raters": raters, "clips": clips, "margin": st["margin"], "alpha": st["alpha"]}
        out["check"] = simcache.cached("design_check", args,
                                       lambda: stats.design_check(**args))
        out["text"] += f"; {out['check']['text']}"
    return out


def _coverage(st: dict, dec: dict) -> dict:
    """What an ABX verdict covers (:func:`.stats.coverage`): the clips and how they were chosen,
    and the bound on the share of visibly different clips like these."""
    per_clip = dec.get("per_clip") or []
    return stats.coverage(st["clips_spec"], len(per_clip),
                          (st["config"] or {}).get("clips_of"), len(dec.get("flagged") or []),
                          min((c["ratings"] for c in per_clip), default=0), alpha=st["alpha"])


def _with_pilot(out: dict, st: dict, rows: list[dict], kept: list, reps: int) -> dict:
    """An interim result after a logged unblinding: ``pilot`` holds the rule's figures on the
    included raters so far, labelled as a pilot (``verdict`` "pilot", never a claim)."""
    if out["unblinding"] is None:
        return out
    label = (f"PILOT on {len(kept)} included raters of {out['raters_planned']} planned, not a "
             f"verdict ({out['unblinding']['text']})")
    test = [r for r in rows if r["kind"] == "test" and r["rater"] in set(kept)]
    if not test:
        out["pilot"] = {"label": label, "verdict": "pilot", "n": 0,
                        "note": "no included rater has finished yet"}
        return out
    if st["protocol"] == "threshold":
        p = _threshold_results(st, test, reps)
    else:
        p = _decide(st["protocol"], test, st["margin"], st["alpha"], stats.VERDICT_REPS,
                    stats.verdict_seed(st["seed"]))
        p.pop("margin_terms", None)
    p.update(label=label, verdict="pilot")
    out["pilot"] = p
    return out


# -- progress (the admin page until the verdict) ------------------------------------------------

#: the per-rater progress table's columns (:func:`study_progress`)
PROGRESS_COLUMNS = ("rater", "label", "answered", "trials", "done", "state")


def study_progress(db, study) -> dict:
    """Where a study stands, without its key: raters planned, invited, started, complete,
    included and excluded (catch trials, as :func:`results` counts them); trials answered of
    those assigned; one row per invited rater (:data:`PROGRESS_COLUMNS`: answered of their
    trials, ``done`` as a whole percentage, ``state`` not started / rating / complete /
    excluded); ``text``: one line saying it. Counts only: no answer, accuracy or clip figure."""
    st, rows = _stored_ratings(db, study)   # counts only: no key file needed
    state = _state(db, st, rows)
    prog, planned = state["prog"], state["planned"]
    excluded = {e["rater"] for e in state["excluded"]}
    table = []
    for rid in sorted(prog):
        p = prog[rid]
        if rid in excluded:
            what = "excluded (catch trials)"
        elif p["finished_at"] is not None:
            what = "complete"
        else:
            what = "rating" if p["answered"] else "not started"
        table.append({"rater": rid, "label": p["label"] or "", "answered": p["answered"],
                      "trials": p["trials"],
                      "done": int(100 * p["answered"] // p["trials"]) if p["trials"] else 0,
                      "state": what})
    answered = sum(p["answered"] for p in prog.values())
    assigned = sum(p["trials"] for p in prog.values())
    out = {"study": st["id"], "protocol": st["protocol"], "raters_planned": planned,
           "raters_invited": len(prog), "raters_started": sum(1 for p in prog.values() if p["answered"]),
           "raters_complete": len(state["complete"]), "raters_included": len(state["kept"]),
           "raters_excluded": len(excluded), "trials_answered": answered,
           "trials_assigned": assigned, "complete": state["done"], "raters": table}
    need = max(0, planned - len(state["kept"]))
    out["text"] = (f"{len(state['kept'])} of {planned} planned raters done"
                   f" ({len(excluded)} excluded by catch trials"
                   + (f"; {need} more needed for the verdict" if need else "; the verdict is ready")
                   + f"); {len(prog)} invited, {out['raters_started']} started; "
                   f"{answered} of {assigned} assigned trials answered")
    return out


RAW_COLUMNS = ("rating", "rater", "rater_label", "trial", "trial_index", "kind", "catch_kind",
               "job", "clip", "prompt", "seed", "positions", "backend_per_side", "answer",
               "expected", "correct", "score_b", "response_ms", "client_ms", "created", "key")
#: the columns that carry the key, or let it be rebuilt (the answers with the study's seed, from
#: which the assignment is drawn): empty while the key is sealed
KEY_COLUMNS = ("positions", "backend_per_side", "answer", "expected", "correct", "score_b",
               "level", "stimulus_lpips")


def key_text(state: dict) -> str:
    """The ``key`` column and line: ``open`` (the planned design is complete), the logged
    unblinding, or ``sealed: ...`` with the progress."""
    if state["unblindings"]:
        return state["unblindings"][0]["text"]
    if state["done"]:
        return "open: the planned included raters are complete"
    return (f"sealed until {state['planned']} planned included raters are complete "
            f"({len(state['kept'])} now; `evalkit study unblind` opens it, logged)")


def key_status(db, study) -> str:
    """The study's key in one line (:func:`key_text`): sealed with the progress, open, or the
    logged unblinding."""
    st, rows = _stored_ratings(db, study)
    return key_text(_state(db, st, rows))


def ratings_csv(db, study) -> str:
    """One row per rating: rater, trial, clip, positions (slot -> stored media), backend per
    side (slot -> a/b/reference/degraded), answer, correct, score for B, response time measured
    by the server (``response_ms``) and as the page reported it (``client_ms``), and ``key``
    (:func:`key_text`). A threshold study's rows add the test trial's ``level`` and its
    stimulus's ``stimulus_lpips`` (against A; backend b in ``backend_per_side`` is the stimulus
    of that level). While the key is sealed (before the planned included raters are complete,
    without a logged unblinding) the :data:`KEY_COLUMNS` are empty: counts and timing only."""
    st, rows = raw_ratings(db, study)
    state = _state(db, st, rows)
    key = key_text(state)
    columns = RAW_COLUMNS
    stimuli = {}
    if st["protocol"] == "threshold":
        columns = RAW_COLUMNS + ("level", "stimulus_lpips")
        stimuli = (st["config"].get("threshold") or {}).get("stimuli") or {}

    def cells(r):
        r = dict(r, positions=json.dumps(r["shown"], sort_keys=True),
                 backend_per_side=json.dumps(r["sources"], sort_keys=True), key=key)
        s = stimuli.get(str(r["clip_id"])) if r["kind"] == "test" else None
        if s is not None:
            r["level"], r["stimulus_lpips"] = s["level"], s["metrics"].get("lpips")
        if not state["key_open"]:
            for k in KEY_COLUMNS:
                r[k] = None
        return [r.get(k) for k in columns]

    return csv_text(columns, (cells(r) for r in rows))


SUMMARY_COLUMNS = ("scope", "job", "status", "verdict", "ratings", "raters", "accuracy",
                   "correct", "wins_b", "wins_a", "ties", "win_rate_b", "p_value", "p_holm",
                   "flip_p", "flagged", "upper_bound", "margin", "alpha", "raters_planned",
                   "raters_complete", "raters_included", "raters_excluded",
                   "krippendorff_alpha", "visible_share_bound", "coverage", "unblinding",
                   "rule")


def summary_csv(res: dict) -> str:
    """The summary as CSV: one ``scope=study`` row, then one ``scope=clip`` row per clip (only
    once the design is complete: interim results show no figure that would reveal a trend;
    after a logged unblinding, an interim study adds one ``scope=pilot`` row). Every row of a
    study unblinded early names the unblinding (``unblinding``); ABX rows carry the
    ``coverage`` and its ``visible_share_bound``. Numbers are full precision (p-values are
    never rounded to 0). A threshold study's summary has its own columns
    (:data:`.threshold.SUMMARY_COLUMNS`: pooled and per-clip fits, the points per level; the
    unblinding in ``notes``)."""
    unb = (res.get("unblinding") or {}).get("text")
    if res.get("protocol") == "threshold":
        rows = threshold.summary_rows(res)
        if unb:
            i = threshold.SUMMARY_COLUMNS.index("notes")
            rows[0][i] = "; ".join(x for x in (rows[0][i], unb) if x)
        return csv_text(threshold.SUMMARY_COLUMNS, rows)
    cov = res.get("coverage") or {}
    study_row = {"scope": "study", "job": "", "ratings": res.get("n"),
                 "raters": res.get("rater_count"),
                 "raters_excluded": len(res["excluded_raters"]), **res,
                 "visible_share_bound": cov.get("bound"), "coverage": cov.get("text"),
                 "unblinding": unb}
    study_row["flagged"] = ";".join(map(str, res.get("flagged") or [])) or None
    rows = [[study_row.get(k) if k != "ratings" else res.get("n") for k in SUMMARY_COLUMNS]]
    pilot = res.get("pilot")
    if pilot:
        row = {"scope": "pilot", "status": res.get("status"), "ratings": pilot.get("n"),
               "raters": pilot.get("rater_count"), **pilot, "unblinding": unb,
               "flagged": ";".join(map(str, pilot.get("flagged") or [])) or None}
        rows.append([row.get(k) if k != "ratings" else pilot.get("n") for k in SUMMARY_COLUMNS])
    for c in res.get("per_clip", []):
        row = {"scope": "clip", **c, "raters": None, "unblinding": unb}
        rows.append([row.get(k) for k in SUMMARY_COLUMNS])
    return csv_text(SUMMARY_COLUMNS, rows)


def write_csvs(db, study, res: dict, path) -> tuple[Path, Path]:
    """``path`` gets the raw ratings; ``<stem>.summary.csv`` next to it the summary."""
    path = Path(path)
    atomic_write_text(path, ratings_csv(db, study))
    spath = path.with_name(path.stem + ".summary.csv")
    atomic_write_text(spath, summary_csv(res))
    return path, spath
