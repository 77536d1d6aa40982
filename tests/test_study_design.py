"""Study design and statistics: pure functions, assignment balance, Monte Carlo error rates."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from evalkit.study import design, stats


RECTS = [[16, 16, 64, 48], [96, 16, 64, 48], [176, 16, 64, 48]]


def _streams(name, catch=False):
    """Fake trial streams of a row (or catch version): one per arrangement, named by it."""
    keys = design.stream_keys("abx", catch) + design.stream_keys("preference", catch)
    return {"rects": RECTS, "files": {k: f"{name}-{k}" for k in keys}}


def _clips(n, seed=0):
    swap, x = design.base_bits(n, seed)
    return [{"id": i + 1, "base_swap": swap[i], "base_x": x[i], "streams": _streams(f"c{i}")}
            for i in range(n)]


POOL = [{"clip_id": 1 + i, "kind": "negative", "streams": _streams(f"k{i}", True)}
        for i in range(3)] + [{"clip_id": 1, "kind": "hue_mild", "streams": _streams("g", True)}]


def test_stream_keys_cover_every_arrangement():
    assert design.stream_keys("preference") == ["ab", "ba"]
    assert design.stream_keys("preference", True) == ["rd", "dr"]
    assert sorted(design.stream_keys("abx")) == ["aab", "aba", "abb", "baa", "bab", "bba"]
    assert sorted(design.stream_keys("abx", True)) == ["drr", "rdr", "rrd"]


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_each_box_shows_its_sides_tile_and_positions_are_uniform(protocol):
    """The stream a trial shows holds, in each box's tile, that slot's content; the tile of each
    slot is drawn at random per trial: every slot is in every position about equally often,
    whatever the answer."""
    clips = _clips(12)
    letter = {"a": "a", "b": "b", "reference": "r", "degraded": "d"}
    pos = Counter()
    n = 0
    for k in range(40):
        for t in design.assign(protocol, clips, POOL, k, design.rater_seed(3, k)):
            arrangement = t["shown"]["media"].rsplit("-", 1)[1]
            tiles = t["shown"]["tiles"]
            assert set(tiles) == set(t["sources"])
            for slot, rect in tiles.items():
                assert arrangement[RECTS.index(rect)] == letter[t["sources"][slot]]
            assert len({tuple(r) for r in tiles.values()}) == len(tiles)
            answer = t["expected"] or t["sources"]["left"]
            for slot, rect in tiles.items():
                pos[(answer, slot, RECTS.index(rect))] += 1
            n += 1
    slots = 2 if protocol == "preference" else 3
    for (answer, slot, _), c in pos.items():
        total = sum(v for (a, s, _), v in pos.items() if (a, s) == (answer, slot))
        assert abs(c / total - 1 / slots) < 0.08, (answer, slot, c, total)


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_assignment_balance_uniqueness_catch_and_seed(protocol):
    clips = _clips(10)
    plans = [design.assign(protocol, clips, POOL, k, design.rater_seed(7, k)) for k in range(8)]
    for plan in plans:
        tests = [t for t in plan if t["kind"] == "test"]
        catches = [t for t in plan if t["kind"] == "catch"]
        # each clip exactly once per rater, catch trials present with a known answer
        assert sorted(t["clip_id"] for t in tests) == [c["id"] for c in clips]
        assert len(catches) == design.n_catch(10) + design.GRADED_CATCHES
        assert all(t["expected"] for t in catches)
        assert Counter(design.catch_grade(t["catch_kind"]) for t in catches) == {
            "easy": design.n_catch(10), "graded": design.GRADED_CATCHES}
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
