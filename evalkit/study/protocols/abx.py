"""ABX (forced choice): can claim distinguishable or indistinguishable (:func:`..stats.decide_abx`,
the equivalence rule with the clip veto; planned by :func:`..planning.plan`)."""

from __future__ import annotations

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
