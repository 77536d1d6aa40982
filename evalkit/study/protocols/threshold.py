"""Threshold: ABX trials over amplified differences (the ladder of :mod:`..threshold`); the
psychometric fit (:func:`..psychometric.threshold_analysis`) gives the metric size of a
difference raters notice and the real difference's headroom below it. No planner: ``--raters``
as given."""

from __future__ import annotations

from .abx import ABX


class Threshold(ABX):
    name = "threshold"
    claim = (
        "threshold (ABX over amplified differences): the metric size of a "
        "difference of this kind that raters notice (75% correct), and the real "
        "difference's headroom below it; assumes amplified differences are seen like "
        "natural ones (docs/studies.md)"
    )
    rating_columns = ("level", "stimulus_lpips")
    measures_reference = True
    sets_gate = True
    plans_clips = False  # no planner
    planned = False
    bounds_visible = False
    by_level = True
    rows_noun = "clip-level stimuli"

    def check_ladder(self, ladder):
        return None

    def levels(self, levels, kind, raters_planned):
        from .. import threshold
        from ..errors import StudyError

        ladder, warnings = threshold.parse_levels(
            threshold.DEFAULT_LEVELS if levels is None else levels, kind
        )
        if raters_planned <= 0:
            raise StudyError(
                "--raters: the threshold protocol needs the planned number of "
                f"raters (it has no planner), found {raters_planned}"
            )
        return ladder, warnings

    def study_plan(self, margin, alpha, raters_planned, n_clips, ladder, ladder_warnings):
        the_plan = {
            "raters": raters_planned,
            "exclusion_rate": 0.0,
            "levels": ladder,
            "note": "no planner for the threshold protocol: --raters as given",
        }
        return the_plan, list(ladder_warnings)

    def offsets(self, ladder):
        from .. import threshold

        return threshold.offsets(ladder)

    def add_config(self, config, *, ladder, kind, metrics_device, reference):
        from .. import threshold

        config["threshold"] = {
            "levels": ladder,
            "ladder": kind,
            "metric": threshold.METRIC,
            "metrics_device": str(metrics_device),
            "conventions": _conventions(reference),
            "stimuli": {},
            "reference": {
                j: {k: v for k, v in m.items() if k != "conventions"} for j, m in reference.items()
            },
        }

    def add_stimuli(self, config, ids, stimuli):
        config["threshold"]["stimuli"] = {
            str(ids[s["ord"]]): {k: v for k, v in s.items() if k != "ord"} for s in stimuli
        }

    def own_results(self, st, test, reps):
        return _threshold_results(st, test, reps)

    def coverage(self, st, dec):
        return {}

    def planned_clips(self, planned, margin):
        return planned

    def figure_lines(self, res):
        return [res["verdict_text"]] if res.get("verdict_text") else []

    def result_lines(self, res):
        return _threshold_lines(res)

    def per_clip_title(self, key):
        return f"per clip {key}"

    def stimuli(self, st):
        return (st["config"].get("threshold") or {}).get("stimuli") or {}

    def summary_csv(self, res):
        from ...fsutil import csv_text
        from .. import threshold

        rows = threshold.summary_rows(res)
        unb = (res.get("unblinding") or {}).get("text")
        if unb:
            i = threshold.SUMMARY_COLUMNS.index("notes")
            rows[0][i] = "; ".join(x for x in (rows[0][i], unb) if x)
        return csv_text(threshold.SUMMARY_COLUMNS, rows)


def _threshold_results(st: dict, test: list[dict], reps: int) -> dict:
    """The threshold analysis of a complete threshold study's test trials
    (:func:`.psychometric.threshold_analysis`), the points per (clip, level), and a verdict
    line."""
    from .. import threshold
    from ..psychometric import headroom_sentence, threshold_analysis
    from ..text import num

    cfg = st["config"].get("threshold") or {}
    stimuli = cfg.get("stimuli") or {}
    trials_ = threshold.analysis_trials(test, stimuli)
    ref = threshold.reference(st["config"])
    a = threshold_analysis(
        trials_, reference=ref, metric=threshold.METRIC, n_boot=reps, seed=int(st["seed"]) % 2**32
    )
    n, correct = len(trials_), sum(t["correct"] for t in trials_)
    pooled = a.get("pooled") or {}
    thr, ci = pooled.get("threshold"), pooled.get("ci") or [None, None]
    head = a.get("headroom") or {}
    hci = head.get("ci") or [None, None]
    if thr is None:
        bound = pooled.get("bound")
        verdict = {
            "lower": "threshold above the levels shown",
            "upper": "threshold below the levels shown",
        }.get(bound, "no threshold")
        text = f"{verdict}: " + ("; ".join(a.get("notes") or []) or "see the points per level")
    else:
        verdict = "threshold measured"
        text = (
            f"threshold {threshold.METRIC} {num(thr, 4)} (interval {num(ci[0], 4)} to "
            f"{num(ci[1], 4)}); real difference {num(a.get('reference'), 4)}; "
            f"{headroom_sentence(head.get('value'))} (interval {num(hci[0], 2)} to "
            f"{num(hci[1], 2)})"
        )
    return {
        "verdict": verdict,
        "verdict_text": text,
        "threshold": a,
        "n": n,
        "correct": correct,
        "accuracy": (correct / n) if n else None,
        "levels": threshold.per_level(test, stimuli),
        "rule": f"psychometric fit of ABX proportion correct against the stimulus's "
        f"{threshold.METRIC} (guess rate 0.5, criterion "
        f"{a.get('criterion', 0.75)}); interval from a bootstrap over raters and "
        f"clips ({reps} replicates)",
        "rater_count": len({t["rater"] for t in trials_}),
        "clip_count": len({t["clip"] for t in trials_}),
    }


def _threshold_lines(res: dict) -> list[str]:
    """A complete threshold study's lines: the fit, per clip and per level, the rule."""
    from ..text import closing_lines, num, p_phrase

    a = res.get("threshold") or {}
    lines = [
        res["verdict_text"],
        f"ABX accuracy over all levels {num(res.get('accuracy'))} ({res.get('correct')} of "
        f"{res.get('n')} correct)",
    ]
    for job, f in sorted((a.get("clips") or {}).items()):
        ci = f.get("ci") or [None, None]
        lines.append(
            f"clip {job}: threshold {num(f.get('threshold'), 4)} (interval "
            f"{num(ci[0], 4)} to {num(ci[1], 4)}), real difference "
            f"{num(f.get('reference'), 4)}"
        )
    for p in res.get("levels") or []:
        lines.append(
            f"clip {p['job']} level {num(p['level'])}: {a.get('metric', 'lpips')} "
            f"{num(p.get('lpips'), 4)}, {p['correct']} of {p['n']} correct"
        )
    gof = (a.get("pooled") or {}).get("gof") or {}
    if gof:
        lines.append(
            f"goodness of fit: deviance {num(gof.get('deviance'), 2)} on "
            f"{gof.get('df')} df, p {p_phrase(gof.get('p'))}"
        )
    lines += [f"note: {n}" for n in a.get("notes") or []]
    lines.append(f"rule: {res['rule']}")
    return lines + closing_lines(res)


def _conventions(reference: dict) -> dict:
    return next((m.get("conventions") for m in reference.values()), None) or {}
