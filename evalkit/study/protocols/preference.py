"""Preference: which backend raters prefer, or none (:func:`..stats.decide_preference`); never
claims indistinguishable."""

from __future__ import annotations

from .. import stats
from .base import Protocol


class Preference(Protocol):
    name = "preference"
    answers = ("left", "right", "same")
    paired = True
    page = "preference"
    claim = (
        "preference: reports a preference or none; never claims indistinguishable "
        "(raters who see a difference but split their taste look like raters who "
        "see none; use ABX for that claim)"
    )

    planned = True
    two_sided = True
    per_clip_key = "win_rate_b"

    def decide(self, raters, clips, test, *, margin, alpha, reps, seed):
        return stats.decide_preference(
            raters, clips, [r["score_b"] for r in test], alpha=alpha, reps=reps, seed=seed
        )

    def agreement(self, test):
        units: dict[str, list] = {}
        for r in test:
            units.setdefault(r["job"], []).append({1.0: "b", 0.0: "a", 0.5: "same"}[r["score_b"]])
        return {"krippendorff_alpha": stats.krippendorff_alpha_nominal(list(units.values()))}

    # -- planning --------------------------------------------------------------------------

    def power_terms(self, tie_rate, heterogeneity):
        return 1 - tie_rate, heterogeneity

    def simulated_power(self, raters, clips, p):
        from ..simulate import simulate_preference

        return simulate_preference(
            raters,
            clips,
            win_rate=0.5 + p.margin,
            tie_rate=p.tie_rate,
            rater_sd=p.heterogeneity,
            alpha=p.alpha,
            studies=p.studies,
            reps=p.reps,
            seed=p.seed + raters,
        )["B preferred"]

    def plan_raters(self, r_power, method, clips, clips_before, notes, p):
        R, edges, checks_simulated = max(stats.MIN_RATERS, r_power), {}, method == "simulation"
        reasons = (
            [
                f"power: {p.power:g} probability of 'B preferred' at win rate "
                f"{0.5 + p.margin:g} needs {r_power} raters"
            ]
            if R == r_power and r_power > stats.MIN_RATERS
            else []
        )
        return R, reasons, edges, checks_simulated

    def plan_figures(self, out, pw, edges, big, p):
        out.update(
            _figures(
                out["raters"],
                out["clips"],
                pw,
                margin=p.margin,
                alpha=p.alpha,
                tie_rate=p.tie_rate,
                share=p.share,
                h=p.h,
                heterogeneity=p.heterogeneity,
                studies=p.studies,
                reps=p.reps,
                seed=p.seed,
                big=big,
            )
        )
        return None

    # -- results text ----------------------------------------------------------------------

    def estimate_lines(self, res):
        from ..text import num, p_phrase

        lines = [
            f"B preferred {res['wins_b']}, A preferred {res['wins_a']}, no difference "
            f"{res['ties']} (tie rate {num(res['tie_rate'])}); win rate of B "
            f"{num(res['win_rate_b'])} (interval {num(res['ci'][0])} to "
            f"{num(res['ci'][1])}), cluster p {p_phrase(res['p_value'])}, rater sign-flip "
            f"p {p_phrase(res.get('flip_p'))}, sign test p {p_phrase(res['sign_p'])}"
        ]
        if "krippendorff_alpha" in res:
            lines.append(f"Krippendorff's alpha {num(res.get('krippendorff_alpha'))}")
        return lines

    def sensitivity_figure(self, without):
        from ..text import num

        return f"win rate of B {num(without.get('win_rate_b'))}"


def _figures(R, C, pw, *, margin, alpha, tie_rate, share, h, heterogeneity, studies, reps, seed, big) -> dict:
    """A preference plan's rule and its power and chance-level checks at the planned size."""
    from .. import planning
    from ..simulate import mc_se, simulate_preference

    out = {"tie_rate": tie_rate, "rule": stats.preference_rule_text(alpha, min(R, C) - 1, 2000)}
    if big:
        out.update(
            simulated_power=planning.normal_power(
                R, C, margin, alpha, two_sided=True, decisive_share=share, rater_sd=h
            ),
            simulated_power_se=None,
            any_preference_at_chance=None,
        )
        return out
    null = simulate_preference(
        R,
        C,
        win_rate=0.5,
        tie_rate=tie_rate,
        rater_sd=heterogeneity,
        alpha=alpha,
        studies=studies,
        reps=reps,
        seed=seed + 1,
    )
    out.update(
        simulated_power=pw(R),
        simulated_power_se=mc_se(pw(R), studies),
        any_preference_at_chance=null["any preference"],
    )
    return out
