"""Study operations: create, invite, results, CSV export.

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
from ..video import read_frames
from . import design, stats
from .errors import (StudyError, UnknownStudy)
from .live import token_hash
from .media import degrade, ordered_map, store_matched_set
from .store import clips, new_media_key, now, open_db, raters, ratings, studies, trials



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
    except (ValueError, KeyError, TypeError) as e:
        raise InputFileError(summary_path, f"not a compare summary ({e.__class__.__name__}: {e})")
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
    for job in compared:
        r = rows.get(job, {})
        a, b = run_a / "clips" / f"{job}.mkv", run_b / "clips" / f"{job}.mkv"
        for p in (a, b):
            if not p.is_file():
                raise InputFileError(p, f"clip of job {job} not found (the report's run folders "
                                     "must still hold their clips)")
        lp = r.get("lpips_mean") or None
        out.append({"job": job, "clip": r.get("clip", ""), "prompt": r.get("prompt", ""),
                    "seed": int(r["seed"]) if r.get("seed") else 0,
                    "lpips_mean": float(lp) if lp else None, "path_a": a, "path_b": b})
    return {"report": report, "run_a": run_a, "run_b": run_b, "jobs": out}


def create_study(report, db, *, protocol: str, clips_spec: str = "all", raters_planned: int = 0,
                 margin: float = 0.1, seed: int = 0, media_dir=None,
                 catch_alpha: float = 0.05, alpha: float = 0.05, progress: bool = False) -> dict:
    """Create a study from a compare report: select clips, write the browser copies (equal-size
    matched sets, see :func:`.media.store_matched_set`) and the catch versions, record
    everything. ``raters_planned`` 0: the planner's figure (:func:`.stats.plan`).

    Returns ``{"study", "clips", "catch_versions", "media", "raters_planned", "plan",
    "warnings"}``; ``warnings`` lists every way the design is below what the planner asks for.
    The clips' media are encoded several at once (:func:`.media.ordered_map`); ``progress``:
    a progress bar per clip on stderr."""
    if protocol not in design.PROTOCOLS:
        raise StudyError(f"--protocol: expected preference or abx, found {protocol!r}")
    if not 0 < margin < 0.5:
        raise StudyError(f"--margin: expected a number in (0, 0.5), found {margin}")
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
    rep = read_report(report)
    d = open_db(db, create=True)
    media = Path(media_dir) if media_dir else d.default_media_dir
    if media is None:
        raise StudyError("--media: a folder for the browser copies is needed with a "
                         f"non-SQLite database ({d.engine.url.render_as_string()})")
    chosen = design.select_clips(rep["jobs"], clips_spec, seed)
    the_plan = _plan(protocol, margin, len(chosen), alpha)
    warnings = _design_warnings(protocol, len(chosen), raters_planned, the_plan)
    planned = raters_planned or the_plan["raters"]
    swap, xbit = design.base_bits(len(chosen), seed)
    rng = np.random.default_rng([seed, 4])
    clip_rows, pool, seconds = [], [], {}
    study_fps = first = None
    n_catch = design.n_catch(len(chosen))     # easy catch trials per rater
    n_easy = min(len(chosen), n_catch)        # clips with an easy catch version
    try:                                      # refused before any encoding
        min_correct = stats.catch_min_correct(n_catch, catch_alpha)
    except ValueError as e:
        raise StudyError(f"--catch-alpha: {e}") from None
    # the catch plan is drawn in clip order (the same draws as ever); the media of the clips
    # are then made side by side (:func:`.media.ordered_map`), results taken in clip order
    work = []
    for i, c in enumerate(chosen):
        kinds = []
        if i < n_easy:
            kinds.append(design.CATCH_KINDS[i % len(design.CATCH_KINDS)])
        if i < design.GRADED_CATCHES:
            kinds.append(design.GRADED_KINDS[i % len(design.GRADED_KINDS)])
        # the reference comes from either backend (drawn per catch)
        work.append((i, c, [(kind, bool(rng.integers(2))) for kind in kinds]))

    def clip_media(job) -> dict:
        return _clip_media(*job, protocol=protocol, media=media)

    from tqdm import tqdm

    with tqdm(total=len(work), desc="study media", unit="clip", disable=not progress,
              mininterval=0.5) as bar:
        for i, c, done in ((w[0], w[1], r) for w, r in zip(work, ordered_map(clip_media, work))):
            for path, f in ((c["path_a"], done["fps_a"]), (c["path_b"], done["fps_b"])):
                if study_fps is None:
                    study_fps, first = f, path
                elif f != study_fps:
                    raise StudyError(f"{path}: field 'fps': expected {_fps_text(study_fps)} fps "
                                     f"like {first} (the clips of one study share one frame "
                                     f"rate), found {_fps_text(f)}")
            if done.get("error"):
                raise StudyError(done["error"])
            names = done["names"]
            ma, mb = names[0], names[1]
            alt_a, alt_b = (names[2], names[3]) if protocol == "abx" else (None, None)
            seconds.update(done["seconds"])
            clip_rows.append({"ord": i, "job": c["job"], "clip": c["clip"], "prompt": c["prompt"],
                              "seed": c["seed"], "lpips_mean": c["lpips_mean"], "media_a": ma,
                              "media_b": mb, "media_a_alt": alt_a, "media_b_alt": alt_b,
                              "base_swap": swap[i], "base_x": xbit[i]})
            pool.extend(done["catches"])
            bar.update(1)
    catch_rule = {"alpha": catch_alpha, "easy_trials": n_catch,
                  "min_correct": min_correct,
                  "graded_trials": design.GRADED_CATCHES if pool else 0}
    timing = {"fps": float(study_fps), "fps_fraction": _fps_text(study_fps),
              "media_seconds": {k: round(float(v), 6) for k, v in sorted(seconds.items())}}
    config = {"catch_pool": [], "catch_rule": catch_rule, "media_key": new_media_key(),
              "plan": the_plan, **timing}
    with d.engine.begin() as conn:
        sid = conn.execute(studies.insert().values(
            protocol=protocol, margin=margin, seed=seed, clips_spec=clips_spec,
            raters_planned=planned,
            catch_threshold=min_correct / n_catch, alpha=alpha,
            report=str(rep["report"]), run_a=str(rep["run_a"]), run_b=str(rep["run_b"]),
            media_dir=str(media), created=now(), config=config)).inserted_primary_key[0]
        ids = []
        for row in clip_rows:
            ids.append(conn.execute(clips.insert().values(study_id=sid, **row))
                       .inserted_primary_key[0])
        config["catch_pool"] = [{"clip_id": ids[p["ord"]], "kind": p["kind"],
                                 "reference": p["reference"], "degraded": p["degraded"],
                                 "reference_alt": p["reference_alt"]} for p in pool]
        conn.execute(studies.update().where(studies.c.id == sid).values(config=config))
    return {"study": sid, "clips": len(clip_rows), "catch_versions": len(pool), "media": str(media),
            "raters_planned": planned, "invite": _invite_count(planned, the_plan),
            "plan": the_plan, "warnings": warnings}


def _clip_media(i: int, c: dict, catches: list, *, protocol: str, media: Path) -> dict:
    """One clip's media (run in a worker thread): its matched set and its catch versions."""
    fa, fps = read_frames(c["path_a"])
    fb, fps_b = read_frames(c["path_b"])
    out = {"fps_a": fps, "fps_b": fps_b, "seconds": {}, "catches": []}
    if fps != fps_b:            # reported by the caller, in clip order, as a study-wide rule
        return out
    if fa.shape != fb.shape:
        out["error"] = (f"{c['path_b']}: expected {fa.shape[0]} frames of "
                        f"{fa.shape[2]}x{fa.shape[1]} like {c['path_a']}, found "
                        f"{fb.shape[0]} of {fb.shape[2]}x{fb.shape[1]}")
        return out
    # one matched set per clip: both sides (and, for ABX, their alternate encodings shown
    # as X) have the same length, box layout and per-frame sample sizes
    items = [(fa, 0), (fb, 0)] + ([(fa, 1), (fb, 1)] if protocol == "abx" else [])
    out["names"] = names = store_matched_set(items, fps, media)
    for n in names:
        out["seconds"][n] = len(fa) / fps
    del items
    for kind, from_b in catches:
        # re-encoded from frames one code value brighter, so the reference's bytes never
        # match a test trial's video
        src = fb if from_b else fa
        ref = np.where(src == 255, src, src + np.uint8(1))
        deg = degrade(ref, fps, kind)
        names = store_matched_set([(ref, 0), (deg, 0)] + ([(ref, 1)] if protocol == "abx" else []),
                                  fps, media)
        for n in names:
            out["seconds"][n] = len(ref) / fps
        out["catches"].append({"ord": i, "kind": kind, "reference": names[0],
                               "degraded": names[1],
                               "reference_alt": names[2] if protocol == "abx" else None})
        del ref, deg
    return out


def _invite_count(planned: int, the_plan: dict) -> int:
    rate = float(the_plan.get("exclusion_rate") or 0.0)
    return int(math.ceil(planned / (1 - rate))) if rate < 1 else planned


_PLANS: dict = {}


def _plan(protocol: str, margin: float, n_clips: int, alpha: float) -> dict:
    """The planner's design for this study (cached per process: it simulates)."""
    key = (protocol, margin, n_clips, alpha)
    if key not in _PLANS:
        try:
            _PLANS[key] = stats.plan(protocol, margin, clips=n_clips, alpha=alpha)
        except ValueError as e:
            raise StudyError(str(e)) from None
    return _PLANS[key]


def _design_warnings(protocol: str, n_clips: int, raters_planned: int, the_plan: dict) -> list[str]:
    out = []
    if n_clips < stats.MIN_CLIPS:
        out.append(f"{n_clips} clips is below the {stats.MIN_CLIPS} the planner requires: the "
                   "verdict's error rates are only simulated from that size up")
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
        cl = [dict(r) for r in conn.execute(select(clips).where(clips.c.study_id == st["id"])
                                            .order_by(clips.c.ord)).mappings()]
        pool = st["config"]["catch_pool"]
        n = conn.execute(select(func.count()).select_from(raters)
                         .where(raters.c.study_id == st["id"])).scalar_one()
        for k in range(n, n + count):
            token = secrets.token_urlsafe(24)
            rseed = design.rater_seed(st["seed"], k)
            rid = conn.execute(raters.insert().values(
                study_id=st["id"], idx=k, token_sha256=token_hash(token), label=label,
                seed=rseed, created=now())).inserted_primary_key[0]
            plan = design.assign(st["protocol"], cl, pool, k, rseed)
            conn.execute(trials.insert(), [
                {"study_id": st["id"], "rater_id": rid, "ord": i, **t} for i, t in enumerate(plan)])
            out.append({"rater": rid, "token": token})
    return out


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
    """The study row and one dict per rating, joined with its trial, rater and clip."""
    d = open_db(db)
    with d.engine.connect() as conn:
        st = _study(conn, study)
        q = (select(ratings.c.id.label("rating"), ratings.c.rater_id.label("rater"),
                    raters.c.label.label("rater_label"), ratings.c.trial_id.label("trial"),
                    trials.c.ord.label("trial_index"), trials.c.kind, trials.c.catch_kind,
                    trials.c.expected, clips.c.job, clips.c.clip, clips.c.prompt,
                    clips.c.seed, ratings.c.shown, ratings.c.sources, ratings.c.answer,
                    ratings.c.correct, ratings.c.response_ms, ratings.c.client_ms,
                    ratings.c.created)
             .join(trials, trials.c.id == ratings.c.trial_id)
             .join(raters, raters.c.id == ratings.c.rater_id)
             .join(clips, clips.c.id == trials.c.clip_id, isouter=True)
             .where(ratings.c.study_id == st["id"]).order_by(ratings.c.id))
        rows = [dict(r) for r in conn.execute(q).mappings()]
    for r in rows:
        _, r["score_b"] = design.score(st["protocol"], {"kind": r["kind"],
                                                        "expected": r["expected"],
                                                        "sources": r["sources"]}, r["answer"])
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
    if protocol == "abx":
        out = stats.decide_abx(rr, cc, [int(r["correct"]) for r in test], margin=margin,
                               alpha=alpha, reps=reps, seed=seed)
    else:
        out = stats.decide_preference(rr, cc, [r["score_b"] for r in test], alpha=alpha,
                                      reps=reps, seed=seed)
    names = {r["job"]: {"clip": r["clip"], "prompt": r["prompt"]} for r in test}
    for e in out.get("per_clip", []):
        e["job"] = e.pop("clip")
        e.update(names.get(e["job"], {}))
    out["rater_count"], out["clip_count"] = out.pop("raters", 0), out.pop("clips", 0)
    return out


#: the most bootstrap replicates :func:`results` draws (more changes nothing but the wait)
MAX_REPS = 100_000


def results(db, study, *, reps: int = 1000) -> dict:
    """Analysis of a study (every rule in :mod:`evalkit.study.stats`).

    ``status``: ``no ratings``, ``interim`` (fewer complete included raters than planned: no
    verdict and no figure that would show where it is heading, on any page or command) or
    ``complete``. The verdict uses the first ``raters_planned`` included raters in order of
    completion (later raters are counted, not used: adding raters after a look cannot change a
    verdict), and is repeated without the catch exclusions as a sensitivity check."""
    if isinstance(reps, bool) or not isinstance(reps, int) or not 100 <= reps <= MAX_REPS:
        raise StudyError(f"--reps: expected 100 to {MAX_REPS:,} bootstrap replicates, found {reps}")
    st, rows = raw_ratings(db, study)
    protocol, margin, alpha = st["protocol"], st["margin"], st["alpha"]
    planned = int(st["raters_planned"] or 0)
    prog = _progress_by_rater(db, st["id"])
    complete = sorted((rid for rid, p in prog.items() if p["finished_at"] is not None),
                      key=lambda rid: (prog[rid]["finished_at"], rid))
    rule = _catch_rule(st)
    kept, excluded, graded = _screen(rows, complete, rule)
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
           "graded_catches": graded, "bootstrap_reps": reps}
    out["claim"] = ("ABX (forced choice): can claim distinguishable or indistinguishable"
                    if protocol == "abx" else
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
        return out
    if len(kept) < planned:
        out.update(status="interim", verdict="interim",
                   verdict_text=f"interim: {len(kept)} of {planned} planned included raters "
                                f"complete ({len(complete)} complete, {len(excluded)} excluded); "
                                "no verdict is shown before the planned design is complete")
        return out
    used = kept[:planned]
    out["raters_used"] = used
    test = [r for r in rows if r["kind"] == "test" and r["rater"] in set(used)]
    dec = _decide(protocol, test, margin, alpha, reps, st["seed"])
    out.update(status="complete", **dec)
    out["verdict_text"] = dec["verdict"]
    if dec.get("flagged"):
        out["verdict_text"] += ("; detectably different clip" + ("s" if len(dec["flagged"]) > 1
                                else "") + ": " + ", ".join(map(str, dec["flagged"])))
    # sensitivity: the same rule on the first planned complete raters, exclusions ignored
    used_all = set(complete[:planned])
    test_all = [r for r in rows if r["kind"] == "test" and r["rater"] in used_all]
    d2 = _decide(protocol, test_all, margin, alpha, reps, st["seed"])
    out["without_exclusions"] = {k: d2.get(k) for k in (
        "verdict", "n", "accuracy", "p_value", "p_text", "upper_bound", "win_rate_b",
        "ties", "flagged") if k in d2}
    out["without_exclusions"]["raters"] = len(used_all)
    if protocol == "preference":
        units: dict[str, list] = {}
        for r in test:
            units.setdefault(r["job"], []).append({1.0: "b", 0.0: "a", 0.5: "same"}[r["score_b"]])
        out["krippendorff_alpha"] = _round(stats.krippendorff_alpha_nominal(list(units.values())))
    return out


RAW_COLUMNS = ("rating", "rater", "rater_label", "trial", "trial_index", "kind", "catch_kind",
               "job", "clip", "prompt", "seed", "positions", "backend_per_side", "answer",
               "expected", "correct", "score_b", "response_ms", "client_ms", "created")


def ratings_csv(db, study) -> str:
    """One row per rating: rater, trial, clip, positions (slot -> stored media), backend per
    side (slot -> a/b/reference/degraded), answer, correct, score for B, response time measured
    by the server (``response_ms``) and as the page reported it (``client_ms``)."""
    _, rows = raw_ratings(db, study)

    def cells(r):
        r = dict(r, positions=json.dumps(r["shown"], sort_keys=True),
                 backend_per_side=json.dumps(r["sources"], sort_keys=True))
        return [r.get(k) for k in RAW_COLUMNS]

    return csv_text(RAW_COLUMNS, (cells(r) for r in rows))


SUMMARY_COLUMNS = ("scope", "job", "status", "verdict", "ratings", "raters", "accuracy",
                   "correct", "wins_b", "wins_a", "ties", "win_rate_b", "p_value", "p_holm",
                   "flagged", "upper_bound", "margin", "alpha", "raters_planned",
                   "raters_complete", "raters_included", "raters_excluded",
                   "krippendorff_alpha", "rule")


def summary_csv(res: dict) -> str:
    """The summary as CSV: one ``scope=study`` row, then one ``scope=clip`` row per clip (only
    once the design is complete: interim results show no figure that would reveal a trend).
    Numbers are full precision (p-values are never rounded to 0)."""
    study_row = {"scope": "study", "job": "", "ratings": res.get("n"),
                 "raters": res.get("rater_count"),
                 "raters_excluded": len(res["excluded_raters"]), **res}
    study_row["flagged"] = ";".join(map(str, res.get("flagged") or [])) or None
    rows = [[study_row.get(k) if k != "ratings" else res.get("n") for k in SUMMARY_COLUMNS]]
    for c in res.get("per_clip", []):
        row = {"scope": "clip", **c, "raters": None}
        rows.append([row.get(k) for k in SUMMARY_COLUMNS])
    return csv_text(SUMMARY_COLUMNS, rows)


def write_csvs(db, study, res: dict, path) -> tuple[Path, Path]:
    """``path`` gets the raw ratings; ``<stem>.summary.csv`` next to it the summary."""
    path = Path(path)
    atomic_write_text(path, ratings_csv(db, study))
    spath = path.with_name(path.stem + ".summary.csv")
    atomic_write_text(spath, summary_csv(res))
    return path, spath
