"""Every threshold at exactly its value, one step below and one step above (issue 37: catch
screening's `<` made `<=` and a gate's limit made exclusive survived the suite). A step is one
float ulp (``math.nextafter``) for real limits, one for counts. Pure functions, no fixtures."""

from __future__ import annotations

import math
import textwrap

import pytest

from evalkit.compare.gating import open_gate
from evalkit.study import analyse, planning, stats

UP, DOWN = math.inf, -math.inf


def steps(x: float) -> tuple[float, float, float]:
    """(one ulp below, x, one ulp above)."""
    return math.nextafter(x, DOWN), x, math.nextafter(x, UP)


# -- catch screening ---------------------------------------------------------------------------


def _catch_rows(rater: int, right: int, n: int) -> list[dict]:
    return [
        {"kind": "catch", "catch_kind": "negative", "rater": rater, "correct": int(i < right)}
        for i in range(n)
    ]


def test_catch_screening_keeps_a_rater_at_exactly_the_needed_count():
    # 8 easy catch trials at alpha 0.05 need 7 right (P(X >= 7) = 9/256 <= 0.05 < 37/256)
    need = stats.catch_min_correct(8, 0.05)
    assert need == 7
    rows = [r for rid, right in ((1, need - 1), (2, need), (3, need + 1)) for r in _catch_rows(rid, right, 8)]
    kept, excluded, _ = analyse._screen(rows, [1, 2, 3], {"alpha": 0.05})
    assert kept == [2, 3]
    assert [(e["rater"], e["catch_correct"], e["catch_needed"]) for e in excluded] == [(1, 6, 7)]
    assert excluded[0]["reason"] == "6 of 8 catch trials right, 7 needed"


def test_catch_min_correct_at_exactly_alpha():
    # the rule is P(Binomial(n, 1/2) >= k) <= alpha: 9/256 and 37/256 are exact in binary
    below, at, above = steps(9 / 256)
    assert [stats.catch_min_correct(8, a) for a in (below, at, above)] == [8, 7, 7]
    below, at, above = steps(37 / 256)
    assert [stats.catch_min_correct(8, a) for a in (below, at, above)] == [7, 6, 6]
    # the fewest catch trials: all of 4 right has p = 1/16
    below, at, above = steps(1 / 16)
    with pytest.raises(ValueError, match="4 catch trials cannot show"):
        stats.catch_min_correct(4, below)
    assert stats.catch_min_correct(4, at) == stats.catch_min_correct(4, above) == 4


# -- gates -------------------------------------------------------------------------------------


def _gate(tmp_path, text: str):
    path = tmp_path / "gate.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return open_gate(path)


def _passes(gate, aggregates, ratios=None, missing=0) -> list[bool]:
    out = gate.evaluate(aggregates, ratios or {}, missing)
    return [c["pass"] for c in out["checks"]]


@pytest.mark.parametrize("value", [0.0123456789, 37.5, 1e-300])
def test_a_gate_max_is_inclusive_to_the_ulp(tmp_path, value):
    for limit, ok in zip(steps(value), (False, True, True)):
        g = _gate(tmp_path, f"lpips: {{mean: {{max: {limit!r}}}}}\n")
        assert _passes(g, {"lpips": {"mean": value}}) == [ok, True], (limit, value)
        assert g.evaluate({"lpips": {"mean": value}}, {}, 0)["verdict"] == ("pass" if ok else "fail")


@pytest.mark.parametrize("value", [0.0123456789, 37.5, 1e-300])
def test_a_gate_min_is_inclusive_to_the_ulp(tmp_path, value):
    for limit, ok in zip(steps(value), (True, True, False)):
        g = _gate(tmp_path, f"psnr: {{mean: {{min: {limit!r}}}}}\n")
        assert _passes(g, {"psnr": {"mean": value}}) == [ok, True], (limit, value)


def test_floor_ratio_limits_are_inclusive_to_the_ulp(tmp_path):
    r = 2.75
    for bound, oks in (("max", (False, True, True)), ("min", (True, True, False))):
        for limit, ok in zip(steps(r), oks):
            g = _gate(tmp_path, f"floor_ratio: {{lpips: {{mean: {{{bound}: {limit!r}}}}}}}\n")
            assert _passes(g, {}, {"seed": {"lpips": {"mean": r}}}) == [ok, True], (bound, limit)


def test_max_missing_jobs_is_inclusive(tmp_path):
    g = _gate(tmp_path, "lpips: {mean: {max: 1}}\nmax_missing_jobs: 2\n")
    assert [_passes(g, {"lpips": {"mean": 0.5}}, missing=m)[-1] for m in (1, 2, 3)] == [True, True, False]


def test_study_gate_interval_ratio_at_exactly_the_limit():
    pooled = {"threshold": 2.0, "ci": [1.0, 4.0]}
    assert analyse.gate_interval_problem(pooled, 4.0) is None  # exactly 4x: allowed
    assert analyse.gate_interval_problem(pooled, math.nextafter(4.0, UP)) is None
    assert "at most" in analyse.gate_interval_problem(pooled, math.nextafter(4.0, DOWN))
    assert analyse.gate_interval_problem({"threshold": 2.0, "ci": [1.0, math.nextafter(4.0, UP)]}) is not None
    # an interval must be closed above zero
    assert "closed" in analyse.gate_interval_problem({"threshold": 1.0, "ci": [0.0, 2.0]})
    assert analyse.gate_interval_problem({"threshold": 1.0, "ci": [math.nextafter(0.0, UP), 0.0]}) is None


# -- verdict margins (ABX) ---------------------------------------------------------------------


def _abx(margin=0.1, alpha=0.05, *, rate=0.5, flagged_clip=False, n_raters=12, n_clips=15):
    """An ABX design (12 x 15 unless said) at about ``rate`` correct (deterministic pattern)."""
    raters, clips, correct = [], [], []
    for r in range(n_raters):
        for c in range(n_clips):
            raters.append(r)
            clips.append(c)
            hit = ((r * 7 + c * 11) % 100) < rate * 100
            correct.append(1 if (flagged_clip and c == 0) else int(hit))
    return raters, clips, correct


def test_abx_indistinguishable_needs_the_bound_strictly_below_the_margin():
    # 20 x 60: enough raters and clips that the bound on visibly different clips stays
    # below 2 x margin at the margins stepped here (the claim also needs that)
    data = _abx(n_raters=20, n_clips=60)
    d = stats.decide_abx(*data, margin=0.1)
    u = d["upper_bound"]
    assert d["verdict"] == "indistinguishable" and 0.5 < u < 0.6
    assert d["visible_share_bound"] < 2 * (u - 0.5)
    # 0.5 + (u' - 0.5) == u' exactly for u' in [0.25, 1] (Sterbenz), so the limit is u' itself
    verdicts = [stats.decide_abx(*data, margin=lim - 0.5)["verdict"] for lim in steps(u)]
    assert verdicts == ["inconclusive", "inconclusive", "indistinguishable"]
    for lim in steps(u):
        assert stats.decide_abx(*data, margin=lim - 0.5)["upper_bound"] == u


def test_abx_distinguishable_at_p_exactly_alpha_over_two():
    data = _abx(rate=0.6)
    p = stats.decide_abx(*data, margin=0.1)["p_value"]
    assert 1e-6 < p < 0.025
    # alpha / 2 == p exactly when alpha = 2p (a power of two scales exactly)
    out = {
        a: stats.decide_abx(*data, margin=0.1, alpha=a)
        for a in (2 * math.nextafter(p, DOWN), 2 * p, 2 * math.nextafter(p, UP))
    }
    assert [o["flagged"] for o in out.values()] == [[], [], []]
    assert [o["verdict"] == "distinguishable" for o in out.values()] == [False, True, True]


def test_abx_clip_flag_at_holm_p_exactly_alpha_over_two():
    data = _abx(rate=0.5, flagged_clip=True)  # clip 0: 12 of 12 right
    q = stats.decide_abx(*data, margin=0.1)["per_clip"][0]["p_holm"]
    flagged = [stats.decide_abx(*data, margin=0.1, alpha=2 * a)["flagged"] for a in steps(q)]
    assert flagged == [[], [0], [0]]


# -- preference --------------------------------------------------------------------------------


def test_preference_needs_the_sign_flip_p_at_most_alpha():
    # 12 raters each preferring B in 7 of 8 ratings: of the 2**12 sign patterns only all-plus
    # and all-minus reach the observed sum, so the exact flip p is 2/4096 (a binary fraction)
    raters, clips, choices = [], [], []
    for r in range(12):
        for c in range(15):
            raters.append(r)
            clips.append(c)
            choices.append(0 if (r + c) % 8 == 0 else 1)
    d = stats.decide_preference(raters, clips, choices)
    assert d["flip_p"] == 2 / 4096 and d["verdict"] == "B preferred" and d["sd"] > 0
    out = [stats.decide_preference(raters, clips, choices, alpha=a) for a in steps(2 / 4096)]
    assert [o["verdict"] for o in out] == ["no preference shown", "B preferred", "B preferred"]
    assert all(o["ci"][0] > 0.7 for o in out)  # the interval is not what decides here


# -- planner floors ----------------------------------------------------------------------------


def test_plan_clip_floor_at_exactly_15():
    fast = dict(studies=40, reps=40, clip_accuracy=1.0)
    got = {
        c: planning.plan("abx", 0.3, clips=c, **fast)
        for c in (stats.MIN_CLIPS - 1, stats.MIN_CLIPS, stats.MIN_CLIPS + 1)
    }
    assert [p["clips"] for p in got.values()] == [15, 15, 16]
    assert got[14]["notes"][:1] == ["clips raised from 14 to the floor of 15"]
    assert not any("floor" in n for p in (got[15], got[16]) for n in p["notes"])


def test_plan_rater_floor_and_invite_rounding():
    # a margin met by any design: the floor of 12 included raters decides (0.45: at 0.3 the
    # bound on visibly different clips, 0.64 at 12 raters x 15 clips, must be below 0.6)
    p = planning.plan("abx", 0.45, studies=40, reps=40, clip_accuracy=1.0, exclusion_rate=0.25)
    assert p["raters"] == stats.MIN_RATERS == 12
    assert p["reasons"] == ["floor: at least 12 included raters"]
    assert p["invite"] == 16  # 12 / 0.75 is exactly 16: no extra rater
    for rate, invite in ((0.0, 12), (0.5, 24), (0.26, 17)):
        assert (
            planning.plan("abx", 0.45, studies=40, reps=40, clip_accuracy=1.0, exclusion_rate=rate)["invite"]
            == invite
        )


def test_plan_input_ranges_are_open_where_documented():
    fast = dict(studies=40, reps=40, clip_accuracy=1.0)
    for bad in (0.5, 0.0):
        with pytest.raises(ValueError, match=r"--margin: expected a number in \(0, 0.5\)"):
            planning.plan("abx", bad, **fast)
    assert planning.plan("abx", math.nextafter(0.5, DOWN), **fast)["raters"] == 12
    with pytest.raises(ValueError, match=r"--clip-accuracy: expected"):
        planning.plan("abx", 0.3, studies=40, reps=40, clip_accuracy=0.5)
    with pytest.raises(ValueError, match=r"--exclusion-rate: expected"):
        planning.plan("abx", 0.3, exclusion_rate=1.0, **fast)
