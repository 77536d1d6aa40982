"""The one text rendering of a study's results, shared by ``evalkit study results`` and the
admin page (plain lines that also read as Markdown)."""

from __future__ import annotations

from . import delivery, protocols
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
    own = protocols.get(res["protocol"]).result_lines(res)
    if own is not None:
        return lines + own
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
            f"Holm-adjusted p {p_phrase(e['p_low_holm'])} (saw the difference and answered "
            "against it)"
        )
    for e in below.get("clips") or []:
        lines.append(
            f"clip {e['clip']} BELOW CHANCE: {e['correct']} of {e['ratings']} correct, "
            f"Holm-adjusted p {p_phrase(e['p_low_holm'])}"
        )
    we = res.get("without_exclusions") or {}
    if we:
        fig = protocols.get(res["protocol"]).sensitivity_figure(we)
        lines.append(
            f"sensitivity check, not a verdict: with the catch-excluded raters "
            f"({we.get('raters')} raters) {fig}"
        )
    if res.get("reps_note"):
        lines.append(f"note: {res['reps_note']}")
    return lines + closing_lines(res)


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
    """The figures of an analysis (a verdict's or a pilot's), the rule and the flagged clips
    (the protocol's :meth:`~.protocols.base.Protocol.figure_lines`)."""
    return protocols.get(res["protocol"]).figure_lines(res)


def flagged_lines(res: dict) -> list[str]:
    """A line for each clip the verdict flagged as detectably different."""
    lines = []
    for c in res.get("per_clip", []):
        if c.get("flagged"):
            lines.append(
                f"clip {c['job']} DETECTABLY DIFFERENT: {c['correct']} of "
                f"{c['ratings']} correct, Holm-adjusted p {p_phrase(c['p_holm'])}"
            )
    return lines


def results_text(res: dict) -> str:
    return "\n".join(results_lines(res))


def p_phrase(p) -> str:
    """A p-value after "p": ``= 0.03``, ``< 1e-6`` or ``n/a``."""
    t = format_p(p)
    return t if t.startswith("<") or t == "n/a" else f"= {t}"


def _exclusions(res: dict) -> list[str]:
    return [f"excluded rater {e['rater']}: {e['reason']}" for e in res["excluded_raters"]]


def closing_lines(res: dict) -> list[str]:
    """The lines every results text ends with: graded catches, exclusions, the verdict."""
    lines = []
    g = res.get("graded_catches") or {}
    if g.get("trials"):
        lines.append(f"graded (mild) catch trials: {g['correct']} of {g['trials']} right")
    return lines + _exclusions(res) + [f"verdict: {res['verdict'].upper()}"]
