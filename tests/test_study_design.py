"""Study design and statistics: pure functions, assignment balance, Monte Carlo error rates."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from evalkit.study import design, stats


def _clips(n, seed=0):
    swap, x = design.base_bits(n, seed)
    return [{"id": i + 1, "media_a": f"a{i}", "media_b": f"b{i}", "base_swap": swap[i],
             "base_x": x[i]} for i in range(n)]


POOL = [{"clip_id": 1, "kind": "blur", "reference": "a0", "degraded": "d0"},
        {"clip_id": 2, "kind": "compression", "reference": "a1", "degraded": "d1"},
        {"clip_id": 3, "kind": "dropped_frames", "reference": "a2", "degraded": "d2"}]


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_assignment_balance_uniqueness_catch_and_seed(protocol):
    clips = _clips(10)
    plans = [design.assign(protocol, clips, POOL, k, design.rater_seed(7, k)) for k in range(8)]
    for plan in plans:
        tests = [t for t in plan if t["kind"] == "test"]
        catches = [t for t in plan if t["kind"] == "catch"]
        # each clip exactly once per rater, catch trials present with a known answer
        assert sorted(t["clip_id"] for t in tests) == [c["id"] for c in clips]
        assert len(catches) == design.n_catch(10) and all(t["expected"] for t in catches)
        assert {t["catch_kind"] for t in catches} <= set(design.CATCH_KINDS)
        for t in catches:   # the degraded side is one of the two compared videos
            assert "degraded" in t["sources"].values() and "reference" in t["sources"].values()
            slot = [s for s, v in t["sources"].items() if v == "reference" and s != "X"][0]
            assert t["expected"] == slot
        # within a rater, positions balanced
        first = "left" if protocol == "preference" else "A"
        assert Counter(t["sources"][first] for t in tests) == {"a": 5, "b": 5}
        if protocol == "abx":
            assert Counter(t["sources"]["X"] for t in tests) == {"a": 5, "b": 5}
            assert all(t["sources"][t["expected"]] == t["sources"]["X"] for t in tests)
        # the order is shuffled: catch trials are not all at the end
        kinds = [t["kind"] for t in plan]
        assert kinds != sorted(kinds, key=lambda k: k == "catch")
    # across raters: each clip shown in every arrangement equally often
    per_clip = Counter()
    for plan in plans:
        for t in plan:
            if t["kind"] == "test":
                per_clip[(t["clip_id"], tuple(sorted(t["sources"].items())))] += 1
    arrangements = 2 if protocol == "preference" else 4
    assert len(per_clip) == 10 * arrangements and set(per_clip.values()) == {8 // arrangements}
    # reproducible from the seed; different raters get different orders
    again = [design.assign(protocol, clips, POOL, k, design.rater_seed(7, k)) for k in range(8)]
    assert again == plans
    assert [t["clip_id"] for t in plans[0]] != [t["clip_id"] for t in plans[2]]


def test_clip_selection():
    rows = [{"job": f"j{i}", "lpips_mean": v} for i, v in enumerate([0.1, 0.5, 0.3, 0.05])]
    assert [r["job"] for r in design.select_clips(rows, "worst:2", 0)] == ["j1", "j2"]
    assert design.select_clips(rows, "all", 0) == rows
    s = design.select_clips(rows, "sample:2", 3)
    assert len(s) == 2 and s == design.select_clips(rows, "sample:2", 3)
    for bad in ("worst", "best:2", "sample:0", "worst:x"):
        with pytest.raises(ValueError, match="--clips"):
            design.parse_clips_spec(bad)


def test_wilson_binomial_and_alpha_against_references():
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = stats.wilson(37, 60)
    rlo, rhi = proportion_confint(37, 60, alpha=0.05, method="wilson")
    assert (lo, hi) == pytest.approx((rlo, rhi), abs=1e-12)
    assert stats.binom_p(15, 20, "greater") == pytest.approx(0.020694732666015625)
    assert stats.binom_p(10, 20, "two-sided") == pytest.approx(1.0)
    # Krippendorff's alpha, nominal: Krippendorff (2011) "Computing Krippendorff's alpha",
    # the worked example with 4 coders and missing values -> 0.743
    data = [[1, 1, None, 1], [2, 2, 3, 2], [3, 3, 3, 3], [3, 3, 3, 3], [2, 2, 2, 2],
            [1, 2, 3, 4], [4, 4, 4, 4], [1, 1, 2, 1], [2, 2, 2, 2], [None, 5, 5, 5],
            [None, None, 1, 1], [None, None, 3, None]]
    units = [[v for v in u if v is not None] for u in data]
    assert stats.krippendorff_alpha_nominal(units) == pytest.approx(0.743, abs=5e-4)
    assert stats.krippendorff_alpha_nominal([["a", "a"], ["b", "b"]]) == 1.0


def test_cluster_bootstrap_is_reproducible_and_centred():
    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.6).astype(float)
    r, c = np.repeat(np.arange(10), 20), np.tile(np.arange(20), 10)
    b1 = stats.cluster_bootstrap(y, r, c, reps=500, seed=4)
    assert np.array_equal(b1, stats.cluster_bootstrap(y, r, c, reps=500, seed=4))
    assert abs(np.nanmean(b1) - y.mean()) < 0.01
    # conservative for independent ratings: wider than the plain binomial standard error
    assert np.nanstd(b1) > np.sqrt(y.mean() * (1 - y.mean()) / 200)


# The verdict rules, the planner and their Monte Carlo error rates: tests/test_study_stats.py
