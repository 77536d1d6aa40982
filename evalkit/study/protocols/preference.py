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

    def decide(self, raters, clips, test, *, margin, alpha, reps, seed):
        return stats.decide_preference(
            raters, clips, [r["score_b"] for r in test], alpha=alpha, reps=reps, seed=seed
        )

    def agreement(self, test):
        units: dict[str, list] = {}
        for r in test:
            units.setdefault(r["job"], []).append({1.0: "b", 0.0: "a", 0.5: "same"}[r["score_b"]])
        return {"krippendorff_alpha": stats.krippendorff_alpha_nominal(list(units.values()))}
