"""A study's tables out: progress per rater, the ratings CSV (the key's columns empty while it is
sealed) and the summary CSV of :func:`evalkit.study.analyse.results`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..fsutil import atomic_write_text, csv_text
from . import protocols
from .analyse import key_state, key_text, raw_ratings, stored_ratings

#: the per-rater progress table's columns (:func:`study_progress`)
PROGRESS_COLUMNS = ("rater", "label", "answered", "trials", "done", "state")


def study_progress(db, study) -> dict:
    """Where a study stands, without its key: raters planned, invited, started, complete,
    included and excluded (catch trials, as :func:`results` counts them); trials answered of
    those assigned; one row per invited rater (:data:`PROGRESS_COLUMNS`: answered of their
    trials, ``done`` as a whole percentage, ``state`` not started / rating / complete /
    excluded); ``text``: one line saying it. Counts only: no answer, accuracy or clip figure."""
    st, rows = stored_ratings(db, study)  # counts only: no key file needed
    state = key_state(db, st, rows)
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
        table.append(
            {
                "rater": rid,
                "label": p["label"] or "",
                "answered": p["answered"],
                "trials": p["trials"],
                "done": int(100 * p["answered"] // p["trials"]) if p["trials"] else 0,
                "state": what,
            }
        )
    answered = sum(p["answered"] for p in prog.values())
    assigned = sum(p["trials"] for p in prog.values())
    out = {
        "study": st["id"],
        "protocol": st["protocol"],
        "raters_planned": planned,
        "raters_invited": len(prog),
        "raters_started": sum(1 for p in prog.values() if p["answered"]),
        "raters_complete": len(state["complete"]),
        "raters_included": len(state["kept"]),
        "raters_excluded": len(excluded),
        "trials_answered": answered,
        "trials_assigned": assigned,
        "complete": state["done"],
        "raters": table,
    }
    need = max(0, planned - len(state["kept"]))
    out["text"] = (
        f"{len(state['kept'])} of {planned} planned raters done"
        f" ({len(excluded)} excluded by catch trials"
        + (f"; {need} more needed for the verdict" if need else "; the verdict is ready")
        + f"); {len(prog)} invited, {out['raters_started']} started; "
        f"{answered} of {assigned} assigned trials answered"
    )
    return out


RAW_COLUMNS = (
    "rating",
    "rater",
    "rater_label",
    "trial",
    "trial_index",
    "kind",
    "catch_kind",
    "job",
    "clip",
    "prompt",
    "seed",
    "positions",
    "backend_per_side",
    "answer",
    "expected",
    "correct",
    "score_b",
    "response_ms",
    "client_ms",
    "created",
    "key",
)


#: the columns that carry the key, or let it be rebuilt (the answers with the study's seed, from
#: which the assignment is drawn): empty while the key is sealed
KEY_COLUMNS = (
    "positions",
    "backend_per_side",
    "answer",
    "expected",
    "correct",
    "score_b",
    "level",
    "stimulus_lpips",
)


def key_status(db, study) -> str:
    """The study's key in one line (:func:`key_text`): sealed with the progress, open, or the
    logged unblinding."""
    st, rows = stored_ratings(db, study)
    return key_text(key_state(db, st, rows))


def ratings_csv(db, study) -> str:
    """One row per rating: rater, trial, clip, positions (slot -> stored media), backend per
    side (slot -> a/b/reference/degraded), answer, correct, score for B, response time measured
    by the server (``response_ms``) and as the page reported it (``client_ms``), and ``key``
    (:func:`key_text`). A threshold study's rows add the test trial's ``level`` and its
    stimulus's ``stimulus_lpips`` (against A; backend b in ``backend_per_side`` is the stimulus
    of that level). While the key is sealed (before the planned included raters are complete,
    without a logged unblinding) the :data:`KEY_COLUMNS` are empty: counts and timing only."""
    st, rows = raw_ratings(db, study)
    state = key_state(db, st, rows)
    key = key_text(state)
    proto = protocols.get(st["protocol"])
    columns = RAW_COLUMNS + proto.rating_columns
    stimuli = proto.stimuli(st)

    def cells(r):
        r = dict(
            r,
            positions=json.dumps(r["shown"], sort_keys=True),
            backend_per_side=json.dumps(r["sources"], sort_keys=True),
            key=key,
        )
        s = stimuli.get(str(r["clip_id"])) if r["kind"] == "test" else None
        if s is not None:
            r["level"], r["stimulus_lpips"] = s["level"], s["metrics"].get("lpips")
        if not state["key_open"]:
            for k in KEY_COLUMNS:
                r[k] = None
        return [r.get(k) for k in columns]

    return csv_text(columns, (cells(r) for r in rows))


SUMMARY_COLUMNS = (
    "scope",
    "job",
    "status",
    "verdict",
    "ratings",
    "raters",
    "accuracy",
    "correct",
    "wins_b",
    "wins_a",
    "ties",
    "win_rate_b",
    "p_value",
    "p_holm",
    "flip_p",
    "flagged",
    "upper_bound",
    "margin",
    "alpha",
    "raters_planned",
    "raters_complete",
    "raters_included",
    "raters_excluded",
    "krippendorff_alpha",
    "visible_share_bound",
    "coverage",
    "unblinding",
    "rule",
)


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
    proto = protocols.REGISTRY.get(res.get("protocol"))
    own = proto.summary_csv(res) if proto is not None else None
    if own is not None:  # threshold: its own columns
        return own
    cov = res.get("coverage") or {}
    study_row = {
        "scope": "study",
        "job": "",
        "ratings": res.get("n"),
        "raters": res.get("rater_count"),
        "raters_excluded": len(res["excluded_raters"]),
        **res,
        "visible_share_bound": cov.get("bound"),
        "coverage": cov.get("text"),
        "unblinding": unb,
    }
    study_row["flagged"] = ";".join(map(str, res.get("flagged") or [])) or None
    rows = [[study_row.get(k) if k != "ratings" else res.get("n") for k in SUMMARY_COLUMNS]]
    pilot = res.get("pilot")
    if pilot:
        row = {
            "scope": "pilot",
            "status": res.get("status"),
            "ratings": pilot.get("n"),
            "raters": pilot.get("rater_count"),
            **pilot,
            "unblinding": unb,
            "flagged": ";".join(map(str, pilot.get("flagged") or [])) or None,
        }
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
