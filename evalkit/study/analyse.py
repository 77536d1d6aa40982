"""A study's results: the ratings read (unsealed once the key is open), the catch screen, the
verdict, the threshold analysis, unblinding and the gate set by people.

The key (which side is which backend, which answer is right) stays sealed until the planned
number of included raters has finished: before that, :func:`results` gives counts and progress
only, on every route that calls it (CLI, the admin page, ``/export``). An owner who must look
calls :func:`unblind`, which is logged (who, when, at how many included raters, why) and reported
with every later verdict and CSV; a study unblinded early never claims "indistinguishable".
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from sqlalchemy import func, select

from ..fsutil import atomic_write_text
from . import delivery, design, planning, protocols, seal, simcache, stats
from .errors import StudyError
from .lossless import SEEN, delivery_of
from .store import clips, load_study, now, open_db, raters, ratings, studies, trials, unblindings


def raw_ratings(db, study) -> tuple[dict, list[dict]]:
    """The study row and one dict per rating, joined with its trial, rater and clip: unsealed
    (:func:`unsealed_ratings`) once the key is open (the planned included raters complete, or a
    logged :func:`unblind`), else as stored: a test trial's ``expected``, ``correct``,
    ``score_b``, ``shown`` and ``sources`` empty (catch trials keep theirs, for screening)."""
    st, rows = stored_ratings(db, study)
    if key_state(db, st, rows)["key_open"]:
        rows = _unseal_rows(st, rows)
    return st, rows


def unsealed_ratings(db, study) -> tuple[dict, list[dict]]:
    """The study row and its ratings with the key (:mod:`.seal`, the study's key file): each
    row's ``shown``, ``sources`` and ``expected`` from its sealed trial, ``correct`` and
    ``score_b`` computed from them. Refused (:class:`StudyError`) while the key is sealed: the
    one way to it before completion is :func:`unblind`, logged."""
    st, rows = stored_ratings(db, study)
    state = key_state(db, st, rows)
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
            t = seal.unseal_trial(key, {"rater_id": r["rater"], "ord": r["trial_index"], "sealed": token})
            r.update(shown=t["shown"], sources=t["sources"], expected=t["expected"])
            r["correct"], r["score_b"] = design.score(st["protocol"], r, r["answer"])
        out.append(r)
    return out


def stored_ratings(db, study) -> tuple[dict, list[dict]]:
    """The study row and one dict per rating, joined with its trial, rater and clip, as stored."""
    d = open_db(db)
    with d.engine.connect() as conn:
        st = load_study(conn, study)
        q = (
            select(
                ratings.c.id.label("rating"),
                ratings.c.rater_id.label("rater"),
                raters.c.label.label("rater_label"),
                ratings.c.trial_id.label("trial"),
                trials.c.ord.label("trial_index"),
                trials.c.kind,
                trials.c.catch_kind,
                trials.c.expected,
                trials.c.clip_id,
                clips.c.job,
                clips.c.clip,
                clips.c.prompt,
                clips.c.seed,
                clips.c.lpips_mean,
                ratings.c.shown,
                ratings.c.sources,
                ratings.c.answer,
                ratings.c.correct,
                ratings.c.response_ms,
                ratings.c.client_ms,
                ratings.c.created,
                trials.c.sealed,
            )
            .join(trials, trials.c.id == ratings.c.trial_id)
            .join(raters, raters.c.id == ratings.c.rater_id)
            .join(clips, clips.c.id == trials.c.clip_id, isouter=True)
            .where(ratings.c.study_id == st["id"])
            .order_by(ratings.c.id)
        )
        rows = [dict(r) for r in conn.execute(q).mappings()]
    for r in rows:
        r["score_b"] = None
        if not r["sealed"]:  # nothing sealed (never since schema 6)
            _, r["score_b"] = design.score(st["protocol"], r, r["answer"])
    return st, rows


def _round(v, nd=4):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, nd)


def _progress_by_rater(db, sid: int) -> dict[int, dict]:
    """rater id -> {"trials", "answered", "finished_at" (last rating's time or None), "label"}."""
    d = open_db(db)
    with d.engine.connect() as conn:
        total = dict(
            conn.execute(
                select(trials.c.rater_id, func.count())
                .where(trials.c.study_id == sid)
                .group_by(trials.c.rater_id)
            ).all()
        )
        done = {
            r: (n, last)
            for r, n, last in conn.execute(
                select(ratings.c.rater_id, func.count(), func.max(ratings.c.created))
                .where(ratings.c.study_id == sid)
                .group_by(ratings.c.rater_id)
            ).all()
        }
        labels = dict(conn.execute(select(raters.c.id, raters.c.label).where(raters.c.study_id == sid)).all())
    return {
        rid: {
            "trials": n,
            "answered": done.get(rid, (0, None))[0],
            "finished_at": done[rid][1] if rid in done and done[rid][0] >= n else None,
            "label": labels.get(rid),
        }
        for rid, n in total.items()
    }


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
        except ValueError:  # too few catch trials (studies made before schema 4)
            kept.append(rid)
            continue
        if need is None or sum(c) < need:
            excluded.append(
                {
                    "rater": rid,
                    "catch_trials": len(c),
                    "catch_correct": sum(c),
                    "catch_needed": need,
                    "reason": "no easy catch trial"
                    if need is None
                    else f"{sum(c)} of {len(c)} catch trials right, {need} needed",
                }
            )
        else:
            kept.append(rid)
    g_all = [v for rid in complete for v in graded.get(rid, [])]
    g_kept = [v for rid in kept for v in graded.get(rid, [])]
    graded_out = {
        "trials": len(g_kept),
        "correct": int(sum(g_kept)),
        "accuracy": _round(float(np.mean(g_kept)) if g_kept else None),
        "accuracy_all_complete": _round(float(np.mean(g_all)) if g_all else None),
    }
    return kept, excluded, graded_out


def _decide(protocol: str, test: list[dict], margin: float, alpha: float, reps: int, seed: int) -> dict:
    rr = [r["rater"] for r in test]
    cc = [r["job"] for r in test]
    out = protocols.get(protocol).decide(rr, cc, test, margin=margin, alpha=alpha, reps=reps, seed=seed)
    names = {
        r["job"]: {"clip": r["clip"], "prompt": r["prompt"], "lpips_mean": r["lpips_mean"]} for r in test
    }
    for e in out.get("per_clip", []):
        e["job"] = e.pop("clip")
        e.update(names.get(e["job"], {}))
    out["rater_count"], out["clip_count"] = out.pop("raters", 0), out.pop("clips", 0)
    return out


def _ladder(db, study) -> str:
    with open_db(db).engine.connect() as conn:
        st = load_study(conn, study)
    return ((st["config"] or {}).get("threshold") or {}).get("ladder", "amplify")


#: ``study gate``'s default widest threshold interval (upper end / lower end): a pilot whose
#: interval spans more cannot set a gate (``--max-interval-ratio``; ``--allow-wide-interval``)
MAX_INTERVAL_RATIO = 4.0


def write_gate(
    db,
    study,
    out,
    *,
    safety_factor: float = 2.0,
    reps: int = 1000,
    max_interval_ratio: float = MAX_INTERVAL_RATIO,
    allow_wide_interval: bool = False,
) -> dict:
    """Write a gate YAML from a complete threshold study (atomically): LPIPS mean at most the
    pooled threshold / ``safety_factor``, with the study, threshold and interval recorded
    (:func:`.psychometric.gate_from_analysis`). Returns ``{"path", "threshold", "max",
    "unblinding"}``.

    Refused (a pilot cannot set a gate) when the measured threshold's interval is open at either
    end or its upper end is more than ``max_interval_ratio`` times its lower end, unless
    ``allow_wide_interval``. A threshold above every level shown gates on its lower bound (an
    interval open above by construction: conservative, allowed). A study unblinded early gets
    the unblinding as a comment in the gate file."""
    if (
        isinstance(max_interval_ratio, bool)
        or not isinstance(max_interval_ratio, (int, float))
        or not math.isfinite(max_interval_ratio)
        or max_interval_ratio <= 1
    ):
        raise StudyError(f"--max-interval-ratio: expected a number above 1, found {max_interval_ratio}")

    if (
        isinstance(safety_factor, bool)
        or not isinstance(safety_factor, (int, float))
        or not math.isfinite(safety_factor)
        or safety_factor < 1
    ):
        raise StudyError(f"--safety-factor: expected a number of at least 1, found {safety_factor}")
    res = results(db, study, reps=reps)
    if not protocols.get(res["protocol"]).sets_gate:
        raise StudyError(
            f"--study {study}: expected a threshold study, found a "
            f"{res['protocol']} study (a gate set by people needs --protocol "
            "threshold)"
        )
    kind = _ladder(db, study)
    if kind != "amplify":
        raise StudyError(
            f"--study {study}: expected a study of the amplify ladder (the backends' "
            f"own kind of difference), found the {kind} ladder (shown for "
            "comparison; it sets no gate)"
        )
    if res["status"] != "complete":
        raise StudyError(
            f"--study {study}: expected a complete study, found {res['status']} ({res['verdict_text']})"
        )
    from .psychometric import gate_from_analysis  # SciPy: only once there is a study to fit

    pooled = res["threshold"]["pooled"]
    problem = gate_interval_problem(pooled, max_interval_ratio)
    if problem and not allow_wide_interval:
        raise StudyError(
            f"--study {study}: {problem} (a pilot: add raters or clips, or "
            "--allow-wide-interval to gate anyway)"
        )
    # a threshold above every level shown gates on its lower bound; below them or none: refused
    # (the psychometric module's ThresholdError, a user error naming the study)
    text = gate_from_analysis(res["threshold"], study=str(res["study"]), safety_factor=float(safety_factor))
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
    return {
        "path": str(path),
        "threshold": thr,
        "bound": bound,
        "max": thr / float(safety_factor),
        "text": text,
        "unblinding": res.get("unblinding"),
    }


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
        return (
            f"expected a threshold interval at most {max_interval_ratio:g}x wide to set a "
            f"gate, found {found} ({hi / lo:.3g}x)"
        )
    return None


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


#: the most bootstrap replicates :func:`results` draws (more changes nothing but the wait)
MAX_REPS = 100_000


def key_state(db, st: dict, rows: list[dict]) -> dict:
    """Where a study stands: complete raters in order of completion, the catch screening, the
    logged unblindings and whether the key is open (the planned included raters are complete,
    or an unblinding was logged)."""
    planned = int(st["raters_planned"] or 0)
    prog = _progress_by_rater(db, st["id"])
    complete = sorted(
        (rid for rid, p in prog.items() if p["finished_at"] is not None),
        key=lambda rid: (prog[rid]["finished_at"], rid),
    )
    rule = _catch_rule(st)
    kept, excluded, graded = _screen(rows, complete, rule)
    done = planned > 0 and len(kept) >= planned
    unb = unblinding_log(db, st["id"])
    return {
        "planned": planned,
        "prog": prog,
        "complete": complete,
        "rule": rule,
        "kept": kept,
        "excluded": excluded,
        "graded": graded,
        "done": done,
        "unblindings": unb,
        "key_open": done or bool(unb),
    }


def unblinding_log(db, study) -> list[dict]:
    """The study's logged unblindings, oldest first: ``who``, ``reason``, ``created``,
    ``raters_included``, ``raters_planned``, ``text`` (one line for verdicts and CSVs)."""
    with open_db(db).engine.connect() as conn:
        sid = load_study(conn, study)["id"]
        rows = [
            dict(r)
            for r in conn.execute(
                select(unblindings).where(unblindings.c.study_id == sid).order_by(unblindings.c.id)
            ).mappings()
        ]
    for r in rows:
        r["text"] = (
            f"key opened early by {r['who']} on {r['created']} at "
            f"{r['raters_included']} of {r['raters_planned']} planned included "
            f"raters: {r['reason']}"
        )
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
            raise StudyError(
                f"{name}: expected one line of at most {MAX_REASON} characters, "
                f"found {len(v)} characters" + (" over several lines" if "\n" in v or "\r" in v else "")
            )
    st, rows = stored_ratings(db, study)  # counts only: the key stays sealed
    state = key_state(db, st, rows)
    if state["done"]:
        raise StudyError(
            f"--study {st['id']}: expected a study still short of its planned "
            f"raters, found it complete ({len(state['kept'])} of "
            f"{state['planned']} included raters): its key is open already, "
            "nothing to unblind"
        )
    entry = {
        "study_id": st["id"],
        "who": who.strip(),
        "reason": reason.strip(),
        "created": now(),
        "raters_included": len(state["kept"]),
        "raters_planned": state["planned"],
    }
    with open_db(db).engine.begin() as conn:
        entry["id"] = conn.execute(unblindings.insert().values(**entry)).inserted_primary_key[0]
    return unblinding_log(db, st["id"])[-1]


def _unblinding_out(unb: list[dict]) -> dict | None:
    if not unb:
        return None
    first = unb[0]
    return {
        "text": first["text"],
        "who": first["who"],
        "created": first["created"],
        "reason": first["reason"],
        "raters_included": first["raters_included"],
        "raters_planned": first["raters_planned"],
        "count": len(unb),
        "log": [{k: u[k] for k in ("who", "created", "raters_included", "reason")} for u in unb],
    }


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
    state = key_state(db, st, rows)
    planned, prog, complete = state["planned"], state["prog"], state["complete"]
    rule, kept, excluded, graded = state["rule"], state["kept"], state["excluded"], state["graded"]
    out = {
        "study": st["id"],
        "protocol": protocol,
        "margin": margin,
        "alpha": alpha,
        "raters_planned": planned,
        "raters_invited": len(prog),
        "raters_started": sum(1 for p in prog.values() if p["answered"]),
        "raters_complete": len(complete),
        "raters_included": len(kept),
        "excluded_raters": excluded,
        "ratings": len(rows),
        "catch_rule": {
            "alpha": rule["alpha"],
            "easy_trials": rule.get("easy_trials"),
            "min_correct": rule.get("min_correct"),
            "text": "a rater is kept when their correct easy catch answers are "
            "better than guessing (one-sided exact binomial, level "
            f"{rule['alpha']:g}); graded catches are reported only",
        },
        "graded_catches": graded,
        "bootstrap_reps": reps,
        "unblinding": _unblinding_out(state["unblindings"]),
        "delivery": (st["config"] or {}).get("delivery"),
        "media_bytes": (st["config"] or {}).get("media_bytes"),
        "excerpt": (st["config"] or {}).get("excerpt"),
        "same_runs": same_runs(db, st["id"]),
        "seal": _seal_out(st),
        "delivery_mode": delivery_of(st["config"]),
        "seen": SEEN[delivery_of(st["config"])],
        "delivery_choice": (st["config"] or {}).get("delivery_choice"),
    }
    proto = protocols.get(protocol)
    out["claim"] = proto.claim
    if not rows:
        out.update(
            status="no ratings",
            verdict="no ratings yet",
            verdict_text=f"no ratings yet: 0 of {planned} planned raters have started",
        )
        return out
    if planned <= 0:
        out.update(
            status="interim",
            verdict="interim",
            verdict_text="no verdict: this study has no planned number of raters "
            "(made before plans were recorded)",
        )
        return _with_pilot(out, st, rows, kept, reps)
    if len(kept) < planned:
        out.update(
            status="interim",
            verdict="interim",
            verdict_text=f"interim: {len(kept)} of {planned} planned included raters "
            f"complete ({len(complete)} complete, {len(excluded)} excluded); "
            "no verdict is shown before the planned design is complete"
            + (
                ""
                if out["unblinding"]
                else " (a pilot look needs the key: "
                "`evalkit study unblind`, logged, and the verdict then never "
                "says indistinguishable)"
            ),
        )
        return _with_pilot(out, st, rows, kept, reps)
    used = kept[:planned]
    out["raters_used"] = used
    test = [r for r in rows if r["kind"] == "test" and r["rater"] in set(used)]
    own = proto.own_results(st, test, reps)
    if own is not None:  # threshold: the psychometric fit
        out.update(status="complete", **own)
        return out
    vseed = stats.verdict_seed(st["seed"])
    out["bootstrap_reps"], out["bootstrap_seed"] = stats.VERDICT_REPS, vseed
    if reps != stats.VERDICT_REPS:
        out["reps_note"] = (
            f"--reps {reps} is not used: a verdict's bootstrap is fixed per "
            f"study ({stats.VERDICT_REPS} replicates, seed derived from the "
            "study seed), so the same ratings always give the same verdict"
        )
    dec = _decide(protocol, test, margin, alpha, stats.VERDICT_REPS, vseed)
    delivery.per_clip_headroom(dec.get("per_clip") or [], out["delivery"])
    early = out["unblinding"] is not None
    out["design"] = achieved = _achieved_design(st, len(used), dec)
    if (
        dec["verdict"] == "indistinguishable"
        and achieved["check"] is not None
        and not achieved["check"]["ok"]
    ):
        dec["verdict"] = "inconclusive"
        dec.setdefault("blocked", []).append(achieved["text"])
    dec["verdict"] = stats.after_unblinding(dec["verdict"], early)
    out.update(status="complete", **dec)
    out["verdict_text"] = f"{dec['verdict']} {out['seen']}"  # what raters saw, named
    if dec.get("blocked"):
        out["verdict_text"] += ": no equivalence claim although U < " + (
            f"{0.5 + margin:g}; " + "; ".join(dec["blocked"])
        )
    if dec["verdict"] == stats.UNBLINDED_EARLY:
        out["verdict_text"] += (
            ": no equivalence claim, the figures below are shown without "
            f"one (the {out['unblinding']['text']}; a look before the "
            "planned raters finished can steer when a study stops)"
        )
    if dec.get("flagged"):
        out["verdict_text"] += (
            "; detectably different clip"
            + ("s" if len(dec["flagged"]) > 1 else "")
            + ": "
            + ", ".join(map(str, dec["flagged"]))
        )
    out.update(proto.coverage(st, dec))
    # sensitivity: the figures on the first planned complete raters, exclusions ignored; not a
    # verdict (a second verdict line is a second chance to read "indistinguishable": with 30%
    # random clickers it said so 7-9% of the time at the boundary), so no verdict word
    used_all = set(complete[:planned])
    test_all = [r for r in rows if r["kind"] == "test" and r["rater"] in used_all]
    d2 = _decide(protocol, test_all, margin, alpha, stats.VERDICT_REPS, vseed)
    out["without_exclusions"] = {
        k: d2.get(k)
        for k in ("n", "accuracy", "p_value", "p_text", "upper_bound", "win_rate_b", "ties", "flagged")
        if k in d2
    }
    out["without_exclusions"].update(
        raters=len(used_all),
        label="sensitivity check, not a verdict: the same figures with the raters the catch trials excluded",
    )
    out.update({k: _round(v) for k, v in proto.agreement(test).items()})
    return out


def _seal_out(st: dict) -> dict:
    """How the study's key is kept: the key file, and whether its design can be rebuilt from
    its seed (studies sealed by the schema 6 upgrade)."""
    cfg = st["config"] or {}
    info = cfg.get("seal") or {}
    out = {"key_file": info.get("key_file"), "rebuildable_from_seed": bool(cfg.get("design_from_seed"))}
    out["text"] = f"key sealed with {info.get('key_file')}" if info else "key not sealed"
    if out["rebuildable_from_seed"]:
        out["text"] += (
            "; made before schema 6: its design was drawn from the study's seed, so "
            "anyone with the seed could rebuild the key at interim"
        )
    return out


def _achieved_design(st: dict, raters: int, dec: dict) -> dict:
    """The design the verdict used against the study's plan (``config.plan``): ``raters``,
    ``clips``, ``planned_raters``, ``planned_clips``, ``under_sized``, ``earlier_rule`` (an ABX
    plan of an earlier :data:`.stats.RULE_VERSION`) and, for ABX below its plan, without one
    or planned by an earlier rule, ``check``: :func:`.planning.design_check` at the achieved size (an
    "indistinguishable" there stands only when the achieved design still keeps the 5% rule);
    ``text`` says it in one line."""
    clips = int(dec.get("clip_count") or 0)
    the_plan = (st["config"] or {}).get("plan") or {}
    pr, pc = the_plan.get("raters"), the_plan.get("clips")
    proto = protocols.get(st["protocol"])
    pc = proto.planned_clips(pc, st["margin"])
    under = pr is None or raters < int(pr) or clips < int(pc or 0)
    # an ABX plan made by an earlier rule of the planner (before stats.RULE_VERSION 2: too few
    # clips per rater to see answers barely below chance) is checked like an under-sized one
    earlier = (
        proto.plans_clips
        and pr is not None
        and not under
        and int(the_plan.get("rule_version") or 1) < stats.RULE_VERSION
    )
    out = {
        "raters": raters,
        "clips": clips,
        "planned_raters": pr,
        "planned_clips": pc,
        "under_sized": bool(under),
        "earlier_rule": bool(earlier),
        "check": None,
    }
    if not under and not earlier:
        out["text"] = f"{raters} raters x {clips} clips, as planned"
        return out
    plan_txt = (
        f"the plan for margin {st['margin']:g} asks for {pr} raters x {pc} clips"
        if pr is not None
        else "no plan recorded"
    )
    out["text"] = (
        f"UNDER-SIZED: {raters} raters x {clips} clips; {plan_txt}"
        if under
        else f"{raters} raters x {clips} clips, as planned by an earlier rule of the "
        f"planner (version {int(the_plan.get('rule_version') or 1)}, now "
        f"{stats.RULE_VERSION})"
    )
    if proto.checks_design and clips >= 1 and raters >= 1:
        args = {"raters": raters, "clips": clips, "margin": st["margin"], "alpha": st["alpha"]}
        out["check"] = simcache.cached("design_check", args, lambda: planning.design_check(**args))
        out["text"] += f"; {out['check']['text']}"
    return out


def _with_pilot(out: dict, st: dict, rows: list[dict], kept: list, reps: int) -> dict:
    """An interim result after a logged unblinding: ``pilot`` holds the rule's figures on the
    included raters so far, labelled as a pilot (``verdict`` "pilot", never a claim)."""
    if out["unblinding"] is None:
        return out
    label = (
        f"PILOT on {len(kept)} included raters of {out['raters_planned']} planned, not a "
        f"verdict ({out['unblinding']['text']})"
    )
    test = [r for r in rows if r["kind"] == "test" and r["rater"] in set(kept)]
    if not test:
        out["pilot"] = {
            "label": label,
            "verdict": "pilot",
            "n": 0,
            "note": "no included rater has finished yet",
        }
        return out
    p = protocols.get(st["protocol"]).own_results(st, test, reps)
    if p is None:
        p = _decide(
            st["protocol"],
            test,
            st["margin"],
            st["alpha"],
            stats.VERDICT_REPS,
            stats.verdict_seed(st["seed"]),
        )
        p.pop("margin_terms", None)
    p.update(label=label, verdict="pilot")
    out["pilot"] = p
    return out


def key_text(state: dict) -> str:
    """The ``key`` column and line: ``open`` (the planned design is complete), the logged
    unblinding, or ``sealed: ...`` with the progress."""
    if state["unblindings"]:
        return state["unblindings"][0]["text"]
    if state["done"]:
        return "open: the planned included raters are complete"
    return (
        f"sealed until {state['planned']} planned included raters are complete "
        f"({len(state['kept'])} now; `evalkit study unblind` opens it, logged)"
    )


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
        sid = load_study(conn, study)["id"]
        rows = [
            dict(r)
            for r in conn.execute(
                select(studies.c.id, studies.c.run_a, studies.c.run_b, studies.c.config)
            ).mappings()
        ]
    mine = _runs_keys(next(r for r in rows if r["id"] == sid))
    ids = sorted(r["id"] for r in rows if r["id"] == sid or _runs_keys(r) & mine)
    n = len(ids)
    text = (
        f"{n} studies were made from these runs: {', '.join(map(str, ids))} (report every one, not the best)"
        if n > 1
        else f"1 study was made from these runs: {sid} (this one)"
    )
    return {"studies": ids, "count": n, "text": text}
