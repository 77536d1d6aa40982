"""Issue 46 item 6: the catch share of a rater's trials is bounded (a 5-clip study gave each rater
15 trials, 10 of them catch trials) and `study create` says what a rater gets."""

from __future__ import annotations

from collections import Counter

import pytest

from evalkit.study import design, stats
from evalkit.study.create import catch_share

RECTS = [[16, 16, 8, 8], [40, 16, 8, 8], [64, 16, 8, 8]]


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_catch_counts_bound_the_share_where_the_screening_allows(alpha):
    least = design.min_easy_catches(alpha)
    stats.catch_min_correct(least, alpha)  # the screening works with that many
    with pytest.raises(ValueError):
        stats.catch_min_correct(least - 1, alpha)  # and not with one fewer
    for n in range(1, 100):
        easy, graded = design.catch_counts(n, alpha)
        full = (design.n_catch(n), design.GRADED_CATCHES)
        share = (easy + graded) / (n + easy + graded)
        if sum(full) / (n + sum(full)) <= design.MAX_CATCH_SHARE:
            assert (easy, graded) == full  # nothing cut where it fits
        elif n >= 2 * least or n * design.MAX_CATCH_SHARE / (1 - design.MAX_CATCH_SHARE) >= least:
            assert share <= design.MAX_CATCH_SHARE  # bounded
            assert graded == 0 or easy == full[0]  # graded ones go first
        else:
            assert (easy, graded) == (least, 0)  # the fewest the screening takes
        assert easy >= min(least, full[0]) and graded <= design.GRADED_CATCHES


def _streams(name, catch=False):
    return {"rects": RECTS, "files": {k: f"{name}-{k}" for k in design.stream_keys("abx", catch)}}


def test_a_five_clip_study_gives_each_rater_half_catch_trials_not_two_thirds():
    """The issue's study: 5 clips. Before: 8 easy + 2 graded catch trials, 10 of 15. Now 5
    easy, every catch version once per rater, and the rule a rater meets is said."""
    n = 5
    easy, graded = design.catch_counts(n)
    assert (easy, graded) == (5, 0)
    swap, bx = design.base_bits(n, 1)
    clips = [
        {"id": i + 1, "base_swap": swap[i], "base_x": bx[i], "streams": _streams(f"c{i}")} for i in range(n)
    ]
    pool = [
        {
            "clip_id": 1 + i,
            "kind": design.CATCH_KINDS[i % len(design.CATCH_KINDS)],
            "streams": _streams(f"k{i}", True),
        }
        for i in range(easy)
    ]
    for k in range(8):
        plan = design.assign("abx", clips, pool, k, design.rater_seed(4, k), 4, (easy, graded))
        kinds = Counter(t["kind"] for t in plan)
        assert kinds == {"test": 5, "catch": 5}
        # each catch version once: no picture recurs to tell the reference
        assert len({t["shown"]["media"] for t in plan}) == len(plan)
        assert design.assign("abx", clips, pool, k, design.rater_seed(4, k), 4) == plan
    min_correct = stats.catch_min_correct(easy, 0.05)
    s = catch_share(n, easy, graded, min_correct, 0.05)
    assert s["share"] == 0.5 and s["reduced"] and not s["over"]
    assert s["text"].startswith(
        "each rater: 10 trials, 5 test and 5 catch (50%; 5 easy, 0 graded): "
        "bounded at 50% of a rater's trials (without the bound 8 easy and 2 graded)"
    )
    excluded, kept = stats.catch_error_rates(easy, alpha=0.05)
    assert f"excluded {100 * excluded:.0f}%" in s["text"] and f"kept {100 * kept:.1f}%" in s["text"]
    assert "5 of 5 easy catch trials right" in s["text"]


def test_what_create_says_for_small_and_large_studies():
    s = catch_share(3, 5, 0, 5, 0.05)
    assert s["over"] and "above the 50% bound" in s["text"] and "10 or more test trials" in s["text"]
    e, g = design.catch_counts(30)
    s = catch_share(30, e, g, stats.catch_min_correct(e, 0.05), 0.05)
    assert not s["over"] and not s["reduced"] and "bound" not in s["text"]
    assert s["text"].startswith("each rater: 40 trials, 30 test and 10 catch (25%; 8 easy, 2 graded)")
