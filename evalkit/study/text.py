"""The one text rendering of a study's results, shared by ``evalkit study results`` and the
admin page (plain lines that also read as Markdown)."""

from __future__ import annotations

from . import delivery
from .stats import format_p


def num(v, nd: int = 3) -> str:
    """A figure for people: ``n/a`` for None, else at most ``nd`` decimals."""
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}".rstrip("0").rstrip(".") if v == v else "n/a"
    return str(v)


def results_lines(res: dict) -> list[str]:
    """The results as lines: the verdict first, then how it was reached, then what raters
    were sent (delivery fidelity and media bytes, :func:`.delivery.lines`)."""
    lines = _verdict_lines(res)
    # after the head and the raters: every study of these runs (no silent best of several), and
    # a key that its seed could rebuild (sealed by the schema 6 upgrade)
    extra = [res["same_runs"]["text"]] if res.get("same_runs") else []
    if (res.get("seal") or {}).get("rebuildable_from_seed"):
        extra.append(res["seal"]["text"])
    return lines[:2] + extra + lines[2:] + delivery.lines(res)


def _verdict_lines(res: dict) -> list[str]:
    head = f"study {res['study']} ({res['protocol']})"
    people = (
        f"{res['raters_included']} included of {res['raters_complete']} complete raters "
        f"({len(res['excluded_raters'])} excluded by catch trials; "
        f"{res['raters_planned']} planned, {res['raters_invited']} invited)"
    )
    unb = res.get("unblinding")
    ex = excerpt_lines(res.get("excerpt"))
    if res["status"] != "complete":
        lines = [f"{head}: {res['verdict_text']}", people, *ex]
        if unb:
            lines.append(f"UNBLINDED: {unb['text']}")
        pilot = res.get("pilot")
        if pilot:
            lines.append(pilot["label"])
            if pilot.get("n"):
                fig = _figure_lines(dict(pilot, protocol=res["protocol"]))
                lines += [f"pilot: {ln}" for ln in fig if not ln.startswith("rule: ")]
            else:
                lines.append(f"pilot: {pilot.get('note', 'no ratings')}")
        lines += _exclusions(res)
        lines.append(f"verdict: {res['verdict'].upper()}")
        return lines
    seen = f" {res['seen']}" if res.get("seen") else ""  # what raters saw (.lossless)
    lines = [f"{head}: verdict {res['verdict'].upper()}{seen}", people, *ex]
    if unb:
        lines.append(f"UNBLINDED EARLY: {unb['text']}")
    if res["protocol"] == "threshold":
        return lines + _threshold_lines(res)
    lines += _figure_lines(res)
    cov = res.get("coverage")
    if cov:
        lines.append(f"coverage: {cov['text']}")
    des = res.get("design") or {}
    if des.get("under_sized") or des.get("earlier_rule"):
        lines.append(des["text"])
    for b in res.get("blocked") or []:
        lines.append(f"no equivalence claim: {b}")
    below = res.get("below_chance") or {}
    for e in below.get("raters") or []:
        lines.append(
            f"rater {e['rater']} BELOW CHANCE: {e['correct']} of {e['ratings']} correct, "
            f"Holm-adjusted p {_p(e['p_low_holm'])} (saw the difference and answered "
            "against it)"
        )
    for e in below.get("clips") or []:
        lines.append(
            f"clip {e['clip']} BELOW CHANCE: {e['correct']} of {e['ratings']} correct, "
            f"Holm-adjusted p {_p(e['p_low_holm'])}"
        )
    we = res.get("without_exclusions") or {}
    if we:
        fig = (
            f"accuracy {num(we.get('accuracy'))}, upper bound {num(we.get('upper_bound'))}"
            if res["protocol"] == "abx"
            else f"win rate of B {num(we.get('win_rate_b'))}"
        )
        lines.append(
            f"sensitivity check, not a verdict: with the catch-excluded raters "
            f"({we.get('raters')} raters) {fig}"
        )
    if res.get("reps_note"):
        lines.append(f"note: {res['reps_note']}")
    return lines + _closing(res)


def excerpt_lines(ex: dict | None) -> list[str]:
    """The line naming a study's excerpt (:mod:`.excerpt`): what each clip showed."""
    if not ex:
        return []
    how = "the window of highest mean per-frame LPIPS" if ex["at"] == "worst" else f"from {num(ex['at'])} s"
    wins = ", ".join(
        f"{job} {num(w['start_s'], 2)}-{num(w['end_s'], 2)} s" for job, w in sorted(ex["windows"].items())[:6]
    )
    more = len(ex["windows"]) - 6
    return [
        f"excerpt: {num(ex['seconds'])} s of each clip, {how} ({wins}"
        + (f", {more} more in --json" if more > 0 else "")
        + ")"
    ]


def _figure_lines(res: dict) -> list[str]:
    """The figures of an ABX or preference analysis (a verdict's or a pilot's), the rule and
    the flagged clips."""
    lines = []
    if res["protocol"] == "threshold":
        return [res["verdict_text"]] if res.get("verdict_text") else []
    if res["protocol"] == "abx":
        mt = res.get("margin_terms") or {}
        lines.append(
            f"ABX accuracy {num(res['accuracy'])} ({res['correct']} of {res['n']} "
            f"correct), one-sided exact binomial p {_p(res['p_value'])}; upper bound "
            f"{num(res['upper_bound'])} against {num(0.5 + res['margin'])}"
        )
        if mt:
            lines.append(
                f"margin {num(res['margin'])}: accuracy at most "
                f"{num(mt.get('accuracy_limit'))}, i.e. at most "
                f"{num(mt.get('proportion_discriminators'))} of raters discriminating, "
                f"d' {num(mt.get('d_prime'), 2)}"
            )
    else:
        lines.append(
            f"B preferred {res['wins_b']}, A preferred {res['wins_a']}, no difference "
            f"{res['ties']} (tie rate {num(res['tie_rate'])}); win rate of B "
            f"{num(res['win_rate_b'])} (interval {num(res['ci'][0])} to "
            f"{num(res['ci'][1])}), cluster p {_p(res['p_value'])}, rater sign-flip "
            f"p {_p(res.get('flip_p'))}, sign test p {_p(res['sign_p'])}"
        )
        if "krippendorff_alpha" in res:
            lines.append(f"Krippendorff's alpha {num(res.get('krippendorff_alpha'))}")
    lines.append(f"rule: {res['rule']}")
    for c in res.get("per_clip", []):
        if c.get("flagged"):
            lines.append(
                f"clip {c['job']} DETECTABLY DIFFERENT: {c['correct']} of "
                f"{c['ratings']} correct, Holm-adjusted p {_p(c['p_holm'])}"
            )
    return lines


def _threshold_lines(res: dict) -> list[str]:
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
            f"{gof.get('df')} df, p {_p(gof.get('p'))}"
        )
    lines += [f"note: {n}" for n in a.get("notes") or []]
    lines.append(f"rule: {res['rule']}")
    return lines + _closing(res)


def results_text(res: dict) -> str:
    return "\n".join(results_lines(res))


def _p(p) -> str:
    t = format_p(p)
    return t if t.startswith("<") or t == "n/a" else f"= {t}"


def _exclusions(res: dict) -> list[str]:
    return [f"excluded rater {e['rater']}: {e['reason']}" for e in res["excluded_raters"]]


def _closing(res: dict) -> list[str]:
    """The lines every results text ends with: graded catches, exclusions, the verdict."""
    lines = []
    g = res.get("graded_catches") or {}
    if g.get("trials"):
        lines.append(f"graded (mild) catch trials: {g['correct']} of {g['trials']} right")
    return lines + _exclusions(res) + [f"verdict: {res['verdict'].upper()}"]
