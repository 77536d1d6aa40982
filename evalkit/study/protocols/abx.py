"""ABX (forced choice): can claim distinguishable or indistinguishable (:func:`..stats.decide_abx`,
the equivalence rule with the clip veto; planned by :func:`..planning.plan` with the steps
here: clips to see answers barely below chance, raters for the clip veto and the boundary
checks, the bound on visibly different clips)."""

from __future__ import annotations

import math

from .. import stats
from .base import Protocol


class ABX(Protocol):
    name = "abx"
    answers = ("A", "B")
    forced_choice = True
    page = "abx"
    checks_design = True
    plans_clips = True
    claim = "ABX (forced choice): can claim distinguishable or indistinguishable"

    planned = True
    bounds_visible = True

    def decide(self, raters, clips, test, *, margin, alpha, reps, seed):
        return stats.decide_abx(
            raters, clips, [int(r["correct"]) for r in test], margin=margin, alpha=alpha, reps=reps, seed=seed
        )

    def coverage(self, st, dec):
        return {"coverage": _coverage(st, dec)}

    def planned_clips(self, planned, margin):
        if planned is None:
            return planned
        return max(int(planned), stats.min_clips(margin))  # plans made before the clips floor

    # -- planning --------------------------------------------------------------------------

    def clips_floor(self, margin):
        return stats.min_clips(margin)

    def check_ratings(self, margin, raters, clips):
        if raters * clips > stats.MAX_RATERS:
            raise ValueError(
                f"--margin {margin:g}: about {raters:,} included raters x {clips:,} "
                f"clips = {raters * clips:,} test ratings would be needed (at least "
                f"{clips:,} clips to bound the share of visibly different clips below "
                f"{stats.visible_share_limit(margin):g} and to see answers barely below "
                f"chance; the limit is {stats.MAX_RATERS:,} test ratings); use a larger "
                "--margin"
            )

    def simulated_power(self, raters, clips, p):
        from ..simulate import simulate_abx

        return simulate_abx(
            raters,
            clips,
            "homogeneous",
            mu=0.5,
            margin=p.margin,
            alpha=p.alpha,
            studies=p.studies,
            reps=p.reps,
            seed=p.seed + raters,
        )["indistinguishable"]

    def plan_clips(self, clips, raters_at, notes, p):
        # answers barely below chance are seen by the raters' spread check, whose power grows
        # with clips per rater: raise the clips until it sees them at the raters the other
        # constraints need there (more clips need fewer raters for power: iterate, with the
        # power's normal approximation; the boundary checks at the final size include both
        # scenarios and add raters if they still fail there)
        from ..planning import spread_clips
        from ..simulate import WEAK_BOTS

        C = spread_from = clips
        for _ in range(8):
            approx, pw, r_power, method = raters_at(C, [], simulate=False)
            r_pre = _raters(r_power, method, C, p, notes=[], checks=False)[0]
            need, how = spread_clips(p.margin, r_pre, alpha=p.alpha, start=C)
            if p.progress is not None:
                p.progress(f"{r_pre} raters: {need} clips see answers barely below chance")
            if need <= C:
                break
            if r_pre * need > 100 * stats.MAX_RATERS:
                raise ValueError(
                    f"--margin {p.margin:g}: about {r_pre:,} included raters x "
                    f"{need:,} clips = {r_pre * need:,} test ratings would be "
                    f"needed (clips per rater to see answers barely below chance; "
                    f"the limit is {stats.MAX_RATERS:,} test ratings); use a larger "
                    "--margin"
                )
            C = need
        if C > spread_from:
            notes.append(
                f"clips raised from {spread_from} to {C} (answers barely below chance: "
                f"with fewer clips per rater, every rater at {0.5 + p.margin:g} and half "
                f"of them inverted, or bots at {WEAK_BOTS[1]:g} as "
                f"{WEAK_BOTS[0]:.0%} of raters, would go unseen more than "
                f"{p.alpha:g} of the time; {how})"
            )
        return C, spread_from

    def plan_raters(self, r_power, method, clips, clips_before, notes, p):
        C = clips
        R, reasons, edges, checks_simulated = _raters(r_power, method, C, p, notes=notes)
        if R * C > stats.MAX_RATERS:
            raise ValueError(
                f"--margin {p.margin:g}: {R:,} included raters x {C:,} clips = "
                f"{R * C:,} test ratings would be needed (clips per rater to see "
                f"answers barely below chance; the limit is {stats.MAX_RATERS:,} test "
                "ratings); use a larger --margin"
            )
        if C > clips_before:
            reasons.append(
                f"answers barely below chance: {C} clips per rater (not {clips_before}) see them at {R} raters"
            )
        return R, reasons, edges, checks_simulated

    def plan_figures(self, out, pw, edges, big, p):
        R, C = out["raters"], out["clips"]
        vb, _ = stats.visible_share_bound(0, C, R, alpha=p.alpha, visible_accuracy=p.clip_accuracy)
        out["visible_share_bound"] = float(vb)
        if p.visible_bound is not None:
            need = stats.clips_for_bound(
                p.visible_bound, R, alpha=p.alpha, visible_accuracy=p.clip_accuracy, start=C
            )
            if need > C:  # more clips may need more raters: plan again at that size
                return p.again(self.name, need)
            out["visible_bound_target"] = p.visible_bound
            out["reasons"].append(
                f"visible bound: {C} clips drawn at random bound the share of "
                f"visibly different clips (accuracy >= {p.clip_accuracy:g}) at "
                f"{float(vb):.3g} <= {p.visible_bound:g} when none is flagged"
            )
        out.update(
            _figures(
                R,
                C,
                margin=p.margin,
                alpha=p.alpha,
                clip_accuracy=p.clip_accuracy,
                clip_power=p.clip_power,
                seed=p.seed,
                chk=p.chk,
                edges=edges,
                big=big,
            )
        )
        return None

    # -- results text ----------------------------------------------------------------------

    def estimate_lines(self, res):
        from ..text import num, p_phrase

        lines = [
            f"ABX accuracy {num(res['accuracy'])} ({res['correct']} of {res['n']} "
            f"correct), one-sided exact binomial p {p_phrase(res['p_value'])}; upper bound "
            f"{num(res['upper_bound'])} against {num(0.5 + res['margin'])}"
        ]
        mt = res.get("margin_terms") or {}
        if mt:
            lines.append(
                f"margin {num(res['margin'])}: accuracy at most "
                f"{num(mt.get('accuracy_limit'))}, i.e. at most "
                f"{num(mt.get('proportion_discriminators'))} of raters discriminating, "
                f"d' {num(mt.get('d_prime'), 2)}"
            )
        return lines

    def sensitivity_figure(self, without):
        from ..text import num

        return f"accuracy {num(without.get('accuracy'))}, upper bound {num(without.get('upper_bound'))}"

    def per_clip_title(self, key):
        return f"per clip {key} (red: detectably different, Holm-adjusted)"


def _coverage(st: dict, dec: dict) -> dict:
    """What an ABX verdict covers (:func:`.stats.coverage`): the clips and how they were chosen,
    and the bound on the share of visibly different clips like these."""
    per_clip = dec.get("per_clip") or []
    return stats.coverage(
        st["clips_spec"],
        len(per_clip),
        (st["config"] or {}).get("clips_of"),
        len(dec.get("flagged") or []),
        min((c["ratings"] for c in per_clip), default=0),
        alpha=st["alpha"],
    )


def _raters(r_power, method, C, p, *, notes, checks: bool = True) -> tuple[int, list, dict, bool]:
    """ABX raters past the power figure ``r_power`` (``p``: :class:`..planning.PlanInputs`):
    the clip veto (one clip at ``clip_accuracy`` flagged with probability ``clip_power``), then
    (``checks``) the boundary error in every scenario of :data:`..simulate.BOUNDARY_SCENARIOS`
    and :data:`..simulate.INVERSION_SCENARIOS`. Returns (raters, reasons, the boundary
    simulations, whether the checks were simulated)."""
    from .. import planning

    power, alpha, clip_accuracy, clip_power = p.power, p.alpha, p.clip_accuracy, p.clip_power
    heterogeneity, seed, chk, progress = p.heterogeneity, p.seed, p.chk, p.progress

    reasons: list[str] = []
    edges: dict[str, dict] = {}
    R = max(stats.MIN_RATERS, r_power)
    # the search below is linear (the exact power is a saw-tooth) and each step costs O(R):
    # refuse a clip accuracy so close to 0.5 that it would run for minutes
    need = planning.clip_raters_estimate(C, alpha, clip_accuracy, clip_power)
    if need > planning.MAX_CLIP_RATERS:
        raise ValueError(
            f"--clip-accuracy {clip_accuracy:g}: about {need:,} ratings per clip "
            f"would be needed to flag one clip (the limit is "
            f"{planning.MAX_CLIP_RATERS:,}); use a larger --clip-accuracy"
        )
    r_clip = stats.MIN_RATERS
    while stats.clip_veto_power(r_clip, C, alpha, clip_accuracy) < clip_power:
        r_clip += 1
        if r_clip > stats.MAX_RATERS:
            raise ValueError(
                f"clip accuracy {clip_accuracy}: cannot be flagged with {stats.MAX_RATERS:,} ratings per clip"
            )

    def clip_ok_from(r: int) -> int:
        while stats.clip_veto_power(r, C, alpha, clip_accuracy) < clip_power:  # binomial saw-tooth
            r += 1
        return r

    R = clip_ok_from(max(R, r_clip))
    r_veto = R
    lim = stats.visible_share_limit(chk["margin"])
    while float(stats.visible_share_bound(0, C, R, alpha=alpha)[0]) >= lim:
        R += 1
        if R > planning.MAX_CLIP_RATERS:
            raise ValueError(
                f"--clips {C}: the share of visibly different clips cannot be "
                f"bounded below {lim:g} with up to {planning.MAX_CLIP_RATERS:,} raters; "
                "use more clips"
            )
    checks_simulated = method == "simulation" and R * C <= 2 * planning.SIMULATE_MAX_CELLS
    if method == "simulation" and not checks_simulated:  # the clip veto made R large
        notes.append(
            f"{R} raters x {C} clips is too large to simulate quickly: the checks "
            "at this size are the normal approximation"
        )
    r_base = R
    if R == r_power and r_power > stats.MIN_RATERS:
        reasons.append(
            f"power: {power:g} probability of 'indistinguishable' when "
            f"everyone guesses needs {r_power} raters"
        )
    if r_veto > r_power:
        reasons.append(
            f"clip veto: flagging one clip at accuracy {clip_accuracy:g} with "
            f"probability {clip_power:g} needs {r_veto} ratings per clip "
            f"(power alone: {r_power})"
        )
    if R > max(r_veto, r_power):
        reasons.append(
            f"coverage: {C} clips bound the share of visibly different clips "
            f"below {lim:g} (2 x margin) from {R} ratings per clip"
        )
    # the error claim at this size: "indistinguishable" at the boundary 0.5 + margin must
    # stay <= alpha (one MC SE allowed) in every scenario; with few raters and many clips
    # (golden ears missed by the sample) it may not: add raters until it does
    while checks_simulated and checks:
        edges = planning.boundary_checks(R, C, heterogeneity=heterogeneity, seed=seed + 1, **chk)
        if progress is not None:
            progress(f"{R} raters: boundary checks")
        bad = planning.boundary_failures(edges, alpha)
        if not bad:
            break
        if R * C > 2 * planning.SIMULATE_MAX_CELLS:
            notes.append(
                f"boundary error above {alpha:g} at {R} raters "
                f"({', '.join(f'{k} {v:.3f}' for k, v in bad.items())}); stopped "
                f"adding raters"
            )
            break
        R = clip_ok_from(math.ceil(R * 1.1) + 1)
    if R > r_base:
        reasons.append(
            f"heterogeneity and answers below chance: 'indistinguishable' at true accuracy "
            f"{0.5 + chk['margin']:g} stays <= {alpha:g} in every scenario from {R} "
            f"raters (not at {r_base})"
        )
    return R, reasons, edges, checks_simulated


def _figures(R, C, *, margin, alpha, clip_accuracy, clip_power, seed, chk, edges, big) -> dict:
    """An ABX plan's rule, clip-flag power and its checks at the planned size (simulated, or
    the normal approximation when ``big``)."""
    from .. import planning
    from ..simulate import simulate_abx

    out = {
        "margin_terms": stats.margin_terms(margin),
        "rule": stats.abx_rule_text(margin, alpha, R, C, 2000),
        "clip_accuracy": clip_accuracy,
        "clip_power_target": clip_power,
        "clip_flag_power": stats.clip_veto_power(R, C, alpha, clip_accuracy),
    }
    if big:
        out.update(
            simulated_power=planning.normal_power(R, C, margin, alpha, two_sided=False),
            simulated_power_se=None,
            boundary_error=None,
            boundary_error_se=None,
            distinguishable_at_chance=None,
            clip_flag_simulated=None,
        )
        return out
    null = simulate_abx(R, C, "homogeneous", mu=0.5, seed=seed + R, **chk)
    vis = simulate_abx(R, C, "one_visible_clip", clip_accuracy=clip_accuracy, seed=seed + 7, **chk)
    out.update(
        simulated_power=null["indistinguishable"],
        simulated_power_se=null["se"]["indistinguishable"],
        distinguishable_at_chance=null["distinguishable"],
        boundary_error={sc: o["indistinguishable"] for sc, o in edges.items()},
        boundary_error_se=max(o["se"]["indistinguishable"] for o in edges.values()),
        clip_flag_simulated=vis["clip_flagged"],
    )
    return out
