"""Study operations: create, invite, next trial, submit, progress, results, CSV export.

Every function takes ``db`` (a URL, an SQLite path or an open :class:`StudyDB`). What a rater
sees (:func:`next_trial`, :func:`submit`, :func:`progress`) carries only trial ids, positions
and media file names (content hashes): never a backend, run or job name.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import secrets
from fractions import Fraction
from pathlib import Path

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from ..errors import InputFileError
from ..fsutil import atomic_write_text
from ..video import read_frames
from . import design, stats
from .errors import (BadAnswer, RatingConflict, StudyError, TrialNotAssigned, UnknownStudy,
                     UnknownToken, UnknownTrial)
from .media import degrade, store_browser_copy
from .store import clips, now, open_db, raters, ratings, studies, trials

CATCH_CLIPS = 6          # degraded versions are made of at most this many clips
DEFAULT_FPS = 24.0       # frame rate assumed for studies created before it was recorded


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
                 catch_threshold: float = 0.8, alpha: float = 0.05) -> dict:
    """Create a study from a compare report: select clips, write browser copies and degraded
    catch versions by content hash, record everything. Returns ``{"study", "clips", "media"}``."""
    if protocol not in design.PROTOCOLS:
        raise StudyError(f"--protocol: expected preference or abx, found {protocol!r}")
    if not 0 < margin < 0.5:
        raise StudyError(f"--margin: expected a number in (0, 0.5), found {margin}")
    if not 0 <= catch_threshold <= 1:
        raise StudyError(f"--catch-threshold: expected a number in [0, 1], found {catch_threshold}")
    try:
        design.parse_clips_spec(clips_spec)
    except ValueError as e:
        raise StudyError(str(e)) from None
    rep = read_report(report)
    d = open_db(db)
    media = Path(media_dir) if media_dir else d.default_media_dir
    if media is None:
        raise StudyError("--media: a folder for the browser copies is needed with a "
                         f"non-SQLite database ({d.engine.url.render_as_string()})")
    chosen = design.select_clips(rep["jobs"], clips_spec, seed)
    swap, xbit = design.base_bits(len(chosen), seed)
    clip_rows, pool, seconds = [], [], {}
    study_fps = first = None
    for i, c in enumerate(chosen):
        fa, fps = read_frames(c["path_a"])
        fb, fps_b = read_frames(c["path_b"])
        for path, f in ((c["path_a"], fps), (c["path_b"], fps_b)):
            if study_fps is None:
                study_fps, first = f, path
            elif f != study_fps:
                raise StudyError(f"{path}: field 'fps': expected {_fps_text(study_fps)} fps like "
                                 f"{first} (the clips of one study share one frame rate), "
                                 f"found {_fps_text(f)}")
        ma = store_browser_copy(fa, fps, media)
        mb = store_browser_copy(fb, fps, media)
        seconds[ma], seconds[mb] = len(fa) / fps, len(fb) / fps
        clip_rows.append({"ord": i, "job": c["job"], "clip": c["clip"], "prompt": c["prompt"],
                          "seed": c["seed"], "lpips_mean": c["lpips_mean"], "media_a": ma,
                          "media_b": mb, "base_swap": swap[i], "base_x": xbit[i]})
        if i < CATCH_CLIPS:
            kind = design.CATCH_KINDS[i % len(design.CATCH_KINDS)]
            deg = degrade(fa, fps, kind)
            pool.append({"ord": i, "kind": kind, "reference": ma,
                         "degraded": store_browser_copy(deg, fps, media)})
            seconds[pool[-1]["degraded"]] = len(deg) / fps
    timing = {"fps": float(study_fps), "fps_fraction": _fps_text(study_fps),
              "media_seconds": {k: round(float(v), 6) for k, v in sorted(seconds.items())}}
    with d.engine.begin() as conn:
        sid = conn.execute(studies.insert().values(
            protocol=protocol, margin=margin, seed=seed, clips_spec=clips_spec,
            raters_planned=raters_planned, catch_threshold=catch_threshold, alpha=alpha,
            report=str(rep["report"]), run_a=str(rep["run_a"]), run_b=str(rep["run_b"]),
            media_dir=str(media), created=now(),
            config={"catch_pool": [], **timing})).inserted_primary_key[0]
        ids = []
        for row in clip_rows:
            ids.append(conn.execute(clips.insert().values(study_id=sid, **row))
                       .inserted_primary_key[0])
        catch_pool = [{"clip_id": ids[p["ord"]], "kind": p["kind"], "reference": p["reference"],
                       "degraded": p["degraded"]} for p in pool]
        conn.execute(studies.update().where(studies.c.id == sid)
                     .values(config={"catch_pool": catch_pool, **timing}))
    return {"study": sid, "clips": len(clip_rows), "catch_versions": len(pool), "media": str(media)}


def _fps_text(fps) -> str:
    fps = Fraction(fps).limit_denominator(1001 * 1000)
    return str(fps.numerator) if fps.denominator == 1 else f"{fps.numerator}/{fps.denominator}"


def study_fps(config: dict) -> float:
    """The frame rate of a study's clips (studies made before it was recorded: 24)."""
    return float(config.get("fps") or DEFAULT_FPS)


def _study(conn, study) -> dict:
    try:
        sid = int(study)
    except (TypeError, ValueError):
        raise UnknownStudy(study) from None
    row = conn.execute(select(studies).where(studies.c.id == sid)).mappings().first()
    if row is None:
        raise UnknownStudy(study)
    return dict(row)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def invite(db, study, count: int = 1, label: str | None = None) -> list[dict]:
    """Create ``count`` raters with their trial lists. Returns ``[{"rater", "token"}]``: the
    tokens exist only here (the database keeps their sha256)."""
    if count < 1:
        raise StudyError(f"--count: expected at least 1, found {count}")
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


# -- rater side ----------------------------------------------------------------------------

def _rater(conn, token: str) -> dict:
    if not isinstance(token, str) or not token:
        raise UnknownToken()
    row = conn.execute(select(raters).where(raters.c.token_sha256 == token_hash(token))) \
        .mappings().first()
    if row is None:
        raise UnknownToken()
    return dict(row)


def _public(trial: dict, protocol: str, total: int, fps: float = DEFAULT_FPS) -> dict:
    # fps is shared by every side of a trial, so it says nothing about which is which
    return {"trial": trial["id"], "index": trial["ord"] + 1, "total": total,
            "protocol": protocol, "answers": list(design.ANSWERS[protocol]), "fps": fps,
            "media": {slot: f"{sha}.mp4" for slot, sha in trial["shown"].items()}}


def progress(db, token: str) -> dict:
    """``{"done", "total", "finished"}`` for the rater with this token."""
    d = open_db(db)
    with d.engine.connect() as conn:
        r = _rater(conn, token)
        total = conn.execute(select(func.count()).select_from(trials)
                             .where(trials.c.rater_id == r["id"])).scalar_one()
        done = conn.execute(select(func.count()).select_from(ratings)
                            .where(ratings.c.rater_id == r["id"])).scalar_one()
    return {"done": done, "total": total, "finished": done >= total}


def next_trial(db, token: str) -> dict | None:
    """The rater's first unanswered trial (``trial`` id, ``index``/``total``, ``protocol``,
    ``answers``, ``fps`` (the study's), ``media``: slot -> ``<sha256>.mp4``), or None when all
    are answered. Read-only: the web app's :class:`.live.RaterService` also records when a trial
    is first shown (its play-through gate); :func:`submit` has no gate."""
    d = open_db(db)
    with d.engine.connect() as conn:
        r = _rater(conn, token)
        protocol, config = conn.execute(select(studies.c.protocol, studies.c.config)
                                        .where(studies.c.id == r["study_id"])).one()
        total = conn.execute(select(func.count()).select_from(trials)
                             .where(trials.c.rater_id == r["id"])).scalar_one()
        answered = select(ratings.c.trial_id).where(ratings.c.rater_id == r["id"])
        t = conn.execute(select(trials).where(trials.c.rater_id == r["id"],
                                              trials.c.id.not_in(answered))
                         .order_by(trials.c.ord).limit(1)).mappings().first()
    return None if t is None else _public(dict(t), protocol, total, study_fps(config))


def check_response_ms(trial_id, response_ms) -> int:
    """``response_ms`` as a non-negative int, else :class:`BadAnswer` naming the field."""
    try:
        ms = int(response_ms)
    except (TypeError, ValueError):
        raise BadAnswer(f"trial {trial_id}: field 'response_ms': expected milliseconds, "
                        f"found {response_ms!r}") from None
    if ms < 0:
        raise BadAnswer(f"trial {trial_id}: field 'response_ms': expected >= 0, found {ms}")
    return ms


def check_answer(trial_id, protocol: str, answer) -> None:
    """:class:`BadAnswer` naming the field unless ``answer`` is one of ``protocol``'s."""
    if answer not in design.ANSWERS[protocol]:
        raise BadAnswer(f"trial {trial_id}: field 'answer': expected one of "
                        f"{', '.join(design.ANSWERS[protocol])}, found {answer!r}")


def submit(db, token: str, trial_id, answer: str, response_ms, client: str | None = None) -> dict:
    """Record a rater's answer once. A repeated submit of the same answer is idempotent
    (``new`` False); a different answer to an answered trial is a :class:`RatingConflict`."""
    d = open_db(db)
    try:
        tid = int(trial_id)
    except (TypeError, ValueError):
        raise UnknownTrial(trial_id) from None
    ms = check_response_ms(trial_id, response_ms)
    with d.engine.connect() as conn:
        r = _rater(conn, token)
        t = conn.execute(select(trials).where(trials.c.id == tid)).mappings().first()
        if t is None:
            raise UnknownTrial(trial_id)
        t = dict(t)
        if t["rater_id"] != r["id"]:
            raise TrialNotAssigned(trial_id, r["id"])
        protocol = conn.execute(select(studies.c.protocol)
                                .where(studies.c.id == r["study_id"])).scalar_one()
    check_answer(trial_id, protocol, answer)
    correct, _ = design.score(protocol, t, answer)
    row = {"study_id": r["study_id"], "rater_id": r["id"], "trial_id": tid, "answer": answer,
           "correct": correct, "response_ms": ms, "shown": t["shown"], "sources": t["sources"],
           "client": client, "created": now()}
    new = True
    try:
        with d.engine.begin() as conn:
            rid = conn.execute(ratings.insert().values(**row)).inserted_primary_key[0]
    except IntegrityError:
        new = False
        with d.engine.connect() as conn:
            prev = conn.execute(select(ratings).where(ratings.c.rater_id == r["id"],
                                                      ratings.c.trial_id == tid)).mappings().one()
        if prev["answer"] != answer:
            raise RatingConflict(tid, prev["answer"], answer) from None
        rid = prev["id"]
    return {"rating": rid, "trial": tid, "answer": answer, "new": new}


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
                    ratings.c.correct, ratings.c.response_ms, ratings.c.created)
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


def results(db, study, *, reps: int = 1000) -> dict:
    """Analysis of a study (see :mod:`evalkit.study.stats` for every definition)."""
    st, rows = raw_ratings(db, study)
    protocol, margin = st["protocol"], st["margin"]
    # catch-trial screening
    per_rater: dict[int, list] = {}
    for r in rows:
        if r["kind"] == "catch":
            per_rater.setdefault(r["rater"], []).append(r["correct"])
    all_raters = sorted({r["rater"] for r in rows})
    excluded = []
    for rid in all_raters:
        c = per_rater.get(rid, [])
        acc = float(np.mean(c)) if c else None
        if acc is None or acc < st["catch_threshold"]:
            excluded.append({"rater": rid, "catch_trials": len(c), "catch_accuracy": _round(acc),
                             "reason": "no catch trial answered" if acc is None else
                             f"catch accuracy below {st['catch_threshold']}"})
    gone = {e["rater"] for e in excluded}
    test = [r for r in rows if r["kind"] == "test" and r["rater"] not in gone]
    n = len(test)
    out = {"study": st["id"], "protocol": protocol, "margin": margin, "alpha": st["alpha"],
           "catch_threshold": st["catch_threshold"], "ratings": len(rows),
           "raters": len(all_raters), "raters_included": len(all_raters) - len(excluded),
           "raters_planned": st["raters_planned"], "excluded_raters": excluded,
           "trials": n, "bootstrap_reps": reps}
    rr = [r["rater"] for r in test]
    cc = [r["job"] for r in test]
    if protocol == "abx":
        y = [r["correct"] for r in test]
        k = int(sum(y))
        lo, hi = stats.wilson(k, n)
        out.update(correct=k, accuracy=_round(k / n if n else None), accuracy_ci95=[_round(lo), _round(hi)],
                   p_value=_round(stats.binom_p(k, n, "greater"), 6), test="one-sided binomial, accuracy > 0.5")
        bound = stats.upper_bound("abx", y, rr, cc, alpha=st["alpha"], reps=reps, seed=st["seed"])
        out["upper_bound"] = _round(bound)
        out["verdict_rule"] = f"upper {100 * (1 - st['alpha']):.0f}% bound of accuracy < {0.5 + margin:g}"
        units_val = lambda r: r["correct"]  # noqa: E731
    else:
        wins_b = sum(1 for r in test if r["score_b"] == 1.0)
        wins_a = sum(1 for r in test if r["score_b"] == 0.0)
        ties = n - wins_a - wins_b
        dec = wins_a + wins_b
        lo, hi = stats.wilson(wins_b, dec)
        y = [r["score_b"] for r in test]
        out.update(wins_b=wins_b, wins_a=wins_a, ties=ties,
                   win_rate_b=_round(wins_b / dec if dec else None), win_rate_b_ci95=[_round(lo), _round(hi)],
                   score_b=_round(float(np.mean(y)) if n else None),
                   p_value=_round(stats.binom_p(wins_b, dec, "two-sided"), 6),
                   test="two-sided binomial on decisive trials, win rate of B = 0.5")
        bound = stats.upper_bound("preference", y, rr, cc, alpha=st["alpha"], reps=reps, seed=st["seed"])
        out["upper_bound"] = _round(bound)
        out["verdict_rule"] = f"upper {100 * (1 - st['alpha']):.0f}% bound of |score_b - 0.5| < {margin:g}"
        units_val = lambda r: {1.0: "b", 0.0: "a", 0.5: "same"}[r["score_b"]]  # noqa: E731
    out["verdict"] = stats.verdict(protocol, bound, margin)
    by_clip: dict[str, list] = {}
    for r in test:
        by_clip.setdefault(r["job"], []).append(r)
    per_clip = []
    for job, rs in sorted(by_clip.items()):
        e = {"job": job, "clip": rs[0]["clip"], "prompt": rs[0]["prompt"], "ratings": len(rs)}
        if protocol == "abx":
            e["accuracy"] = _round(float(np.mean([r["correct"] for r in rs])))
        else:
            e["wins_b"] = sum(r["score_b"] == 1.0 for r in rs)
            e["wins_a"] = sum(r["score_b"] == 0.0 for r in rs)
            e["ties"] = sum(r["score_b"] == 0.5 for r in rs)
            e["score_b"] = _round(float(np.mean([r["score_b"] for r in rs])))
        per_clip.append(e)
    out["per_clip"] = per_clip
    out["krippendorff_alpha"] = _round(stats.krippendorff_alpha_nominal(
        [[units_val(r) for r in rs] for rs in by_clip.values()]))
    return out


RAW_COLUMNS = ("rating", "rater", "rater_label", "trial", "trial_index", "kind", "catch_kind",
               "job", "clip", "prompt", "seed", "positions", "backend_per_side", "answer",
               "expected", "correct", "score_b", "response_ms", "created")


def ratings_csv(db, study) -> str:
    """One row per rating: rater, trial, clip, positions (slot -> media), backend per side
    (slot -> a/b/reference/degraded), answer, correct, score for B, response time."""
    _, rows = raw_ratings(db, study)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RAW_COLUMNS)
    for r in rows:
        r = dict(r, positions=json.dumps(r["shown"], sort_keys=True),
                 backend_per_side=json.dumps(r["sources"], sort_keys=True))
        w.writerow(["" if r.get(k) is None else r[k] for k in RAW_COLUMNS])
    return buf.getvalue()


def summary_csv(res: dict) -> str:
    """The summary as CSV: one row ``scope=study`` then one ``scope=clip`` row per clip."""
    keys = ["accuracy", "wins_b", "wins_a", "ties", "win_rate_b", "score_b"]
    head = ["scope", "job", "ratings", *keys, "p_value", "upper_bound", "margin", "verdict",
            "raters_included", "raters_excluded", "krippendorff_alpha"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    cell = lambda v: "" if v is None else v  # noqa: E731
    w.writerow(["study", "", res["trials"], *[cell(res.get(k)) for k in keys],
                cell(res.get("p_value")), cell(res.get("upper_bound")), res["margin"],
                res["verdict"], res["raters_included"], len(res["excluded_raters"]),
                cell(res.get("krippendorff_alpha"))])
    for c in res["per_clip"]:
        w.writerow(["clip", c["job"], c["ratings"], *[cell(c.get(k)) for k in keys],
                    "", "", "", "", "", "", ""])
    return buf.getvalue()


def write_csvs(db, study, res: dict, path) -> tuple[Path, Path]:
    """``path`` gets the raw ratings; ``<stem>.summary.csv`` next to it the summary."""
    path = Path(path)
    atomic_write_text(path, ratings_csv(db, study))
    spath = path.with_name(path.stem + ".summary.csv")
    atomic_write_text(spath, summary_csv(res))
    return path, spath
