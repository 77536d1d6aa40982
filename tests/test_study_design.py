"""Study design and statistics: pure functions, assignment balance, Monte Carlo error rates."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from evalkit.study import design, stats, threshold

RECTS = [[16, 16, 64, 48], [96, 16, 64, 48], [176, 16, 64, 48]]


def _streams(name, catch=False):
    """Fake trial streams of a row (or catch version): one per arrangement, named by it."""
    keys = design.stream_keys("abx", catch) + design.stream_keys("preference", catch)
    return {"rects": RECTS, "files": {k: f"{name}-{k}" for k in keys}}


def _clips(n, seed=0):
    swap, x = design.base_bits(n, seed)
    return [
        {"id": i + 1, "base_swap": swap[i], "base_x": x[i], "streams": _streams(f"c{i}")} for i in range(n)
    ]


POOL = [{"clip_id": 1 + i, "kind": "negative", "streams": _streams(f"k{i}", True)} for i in range(3)] + [
    {"clip_id": 1, "kind": "hue_mild", "streams": _streams("g", True)}
]


def test_stream_keys_put_x_in_the_middle_with_every_match_side_and_content():
    assert design.stream_keys("preference") == ["ab", "ba"]
    assert design.stream_keys("preference", True) == ["rd", "dr"]
    assert design.stream_keys("abx") == ["aab", "baa", "bba", "abb"]
    assert design.stream_keys("abx", True) == ["rrd", "drr", "ddr", "rdd"]
    # the layout of the studies made between issue 44 and now: X in tile 0
    assert design.stream_keys("abx", x=0) == ["aab", "aba", "bba", "bab"]
    assert design.stream_keys("abx", True, x=0) == ["rrd", "rdr", "ddr", "drd"]
    for catch in (False, True):
        keys = design.stream_keys("abx", catch)
        # every (match tile, X content) once; X's match is exactly one of tiles 0 and 2, both
        # next to X
        assert {(0 if k[0] == k[1] else 2, k[1]) for k in keys} == {
            (t, c) for t in (0, 2) for c in set("".join(keys))
        }
        assert all((k[0] == k[1]) != (k[2] == k[1]) for k in keys)
        for x in (0, 1, 2):
            assert design.x_tile(design.stream_keys("abx", catch, x)) == x
    # studies made before issue 44 (every arrangement; catch versions X the reference) read as
    # the middle layout: every file it needs is there
    assert design.x_tile(["aab", "aba", "baa", "abb", "bab", "bba"]) == 1
    assert design.x_tile(["rrd", "rdr", "drr"]) == 1


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_each_box_shows_its_sides_tile_and_labels_say_nothing(protocol):
    """The stream a trial shows holds, in each box's tile, that slot's content; X is always in
    the middle tile; per file, across raters, each label lands on each of the other tiles about equally
    often whatever the answer (what raters pool per file says nothing)."""
    clips = _clips(12)
    letter = {"a": "a", "b": "b", "reference": "r", "degraded": "d"}
    pos = Counter()
    for k in range(40):
        for t in design.assign(protocol, clips, POOL, k, design.rater_seed(3, k), 3):
            arrangement = t["shown"]["media"].rsplit("-", 1)[1]
            tiles = t["shown"]["tiles"]
            assert set(tiles) == set(t["sources"])
            for slot, rect in tiles.items():
                assert arrangement[RECTS.index(rect)] == letter[t["sources"][slot]]
            assert len({tuple(r) for r in tiles.values()}) == len(tiles)
            if protocol == "abx":
                assert RECTS.index(tiles["X"]) == 1
                assert t["sources"][t["expected"]] == t["sources"]["X"]
                assert RECTS.index(tiles[t["expected"]]) in (0, 2)
            answer = t["expected"] or t["sources"]["left"]
            first = "A" if protocol == "abx" else "left"
            pos[(answer, RECTS.index(tiles[first]))] += 1
    tiles = (0, 2) if protocol == "abx" else (0, 1)
    for answer in {a for a, _ in pos}:
        total = sum(pos[(answer, i)] for i in tiles)
        for i in tiles:
            assert abs(pos[(answer, i)] / total - 0.5) < 0.08, (answer, i, pos)


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_every_file_test_or_catch_goes_to_the_same_number_of_raters(protocol):
    """Every F consecutive raters (F files a row: 2 or 4) get every file of every row and of
    every catch version exactly once: a file's share of raters never tells a catch file."""
    clips = _clips(10)
    pool = [
        {"clip_id": 1 + i, "kind": "negative", "streams": _streams(f"k{i}", True)}
        for i in range(design.n_catch(10))
    ] + [
        {"clip_id": 1 + i, "kind": "hue_mild", "streams": _streams(f"g{i}", True)}
        for i in range(design.GRADED_CATCHES)
    ]
    f = 2 if protocol == "preference" else 4
    for raters in (f, 3 * f):
        seen = Counter()
        for k in range(raters):
            plan = design.assign(protocol, clips, pool, k, design.rater_seed(5, k), 5)
            assert len({t["shown"]["media"] for t in plan}) == len(plan)  # no file twice
            seen.update(t["shown"]["media"] for t in plan)
        everything = {
            v
            for c in clips
            for v in c["streams"]["files"].values()
            if v.rsplit("-", 1)[1] in design.stream_keys(protocol)
        }
        everything |= {
            v
            for p in pool
            for v in p["streams"]["files"].values()
            if v.rsplit("-", 1)[1] in design.stream_keys(protocol, True)
        }
        assert set(seen) == everything and set(seen.values()) == {raters // f}


def test_an_old_study_s_abx_catch_versions_without_d_as_x_still_assign():
    old = {"rects": RECTS, "files": {k: f"o-{k}" for k in ("rrd", "rdr", "drr")}}
    pool = [{"clip_id": 1, "kind": "negative", "streams": old}]
    plans = [design.assign("abx", _clips(4), pool, k, design.rater_seed(1, k), 1) for k in range(4)]
    catches = [t for p in plans for t in p if t["kind"] == "catch"]
    assert {t["shown"]["media"] for t in catches} == {"o-rrd", "o-drr"}
    for t in catches:  # X in the middle, its match (the reference) on either side
        assert RECTS.index(t["shown"]["tiles"]["X"]) == 1
        assert t["sources"][t["expected"]] == t["sources"]["X"] == "reference"


@pytest.mark.parametrize("x", [0, 2])
def test_a_study_keeps_the_x_tile_its_files_were_made_with(x):
    """A study made between issue 44 and the middle layout stored its files with X in tile 0
    (``aab``, ``aba``, ...; ``x=2``: the layout for lossless WebP): the raters it takes now are
    served that layout, read from the stored keys (never the new constant: ``aab`` means X in
    tile 0 there, in tile 1 now), every file of it to the same number of raters, each box
    showing its tile's content."""
    old = lambda n, c=False: {
        "rects": RECTS,
        "files": {  # noqa: E731
            k: f"{n}-{k}" for k in design.stream_keys("abx", c, x=x)
        },
    }
    swap, bx = design.base_bits(6, 2)
    clips = [{"id": i + 1, "base_swap": swap[i], "base_x": bx[i], "streams": old(f"c{i}")} for i in range(6)]
    pool = [
        {"clip_id": 1 + i, "kind": "negative", "streams": old(f"k{i}", True)}
        for i in range(design.catch_counts(6)[0])
    ]
    seen = Counter()
    for k in range(8):
        for t in design.assign("abx", clips, pool, k, design.rater_seed(2, k), 2):
            arrangement = t["shown"]["media"].rsplit("-", 1)[1]
            tiles = t["shown"]["tiles"]
            assert RECTS.index(tiles["X"]) == x
            for slot, rect in tiles.items():
                assert arrangement[RECTS.index(rect)] == t["sources"][slot][0]
            assert t["sources"][t["expected"]] == t["sources"]["X"]
            seen[t["shown"]["media"]] += 1
    assert len(seen) == 4 * (6 + design.catch_counts(6)[0]) and set(seen.values()) == {2}


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_assignment_balance_uniqueness_catch_and_seed(protocol):
    clips = _clips(10)
    plans = [design.assign(protocol, clips, POOL, k, design.rater_seed(7, k), 7) for k in range(8)]
    for plan in plans:
        tests = [t for t in plan if t["kind"] == "test"]
        catches = [t for t in plan if t["kind"] == "catch"]
        # each clip exactly once per rater, catch trials present with a known answer
        assert sorted(t["clip_id"] for t in tests) == [c["id"] for c in clips]
        assert len(catches) == design.n_catch(10) + design.GRADED_CATCHES
        assert all(t["expected"] for t in catches)
        assert Counter(design.catch_grade(t["catch_kind"]) for t in catches) == {
            "easy": design.n_catch(10),
            "graded": design.GRADED_CATCHES,
        }
        for t in catches:  # the degraded side is one of the two compared videos
            compared = [s for s in t["sources"] if s != "X"]
            assert {t["sources"][s] for s in compared} == {"degraded", "reference"}
            want = t["sources"]["X"] if protocol == "abx" else "reference"
            assert t["sources"][t["expected"]] == want
        # within a rater, positions balanced
        if protocol == "abx":
            assert Counter(t["sources"]["X"] for t in tests) == {"a": 5, "b": 5}
            assert Counter(t["expected"] for t in tests) == {"A": 5, "B": 5}
            assert all(t["sources"][t["expected"]] == t["sources"]["X"] for t in tests)
        else:
            assert Counter(t["sources"]["left"] for t in tests) == {"a": 5, "b": 5}
        # the order is shuffled: catch trials are not all at the end
        kinds = [t["kind"] for t in plan]
        assert kinds != sorted(kinds, key=lambda k: k == "catch")
    # across raters: each clip shown from every file equally often
    per_clip = Counter()
    for plan in plans:
        for t in plan:
            if t["kind"] == "test":
                per_clip[(t["clip_id"], t["shown"]["media"])] += 1
    files = 2 if protocol == "preference" else 4
    assert len(per_clip) == 10 * files and set(per_clip.values()) == {8 // files}
    # reproducible from the seed; different raters get different orders
    again = [design.assign(protocol, clips, POOL, k, design.rater_seed(7, k), 7) for k in range(8)]
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
    data = [
        [1, 1, None, 1],
        [2, 2, 3, 2],
        [3, 3, 3, 3],
        [3, 3, 3, 3],
        [2, 2, 2, 2],
        [1, 2, 3, 4],
        [4, 4, 4, 4],
        [1, 1, 2, 1],
        [2, 2, 2, 2],
        [None, 5, 5, 5],
        [None, None, 1, 1],
        [None, None, 3, None],
    ]
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


def _rows(names, level=None):
    return [((f"{n}-a", f"{n}-b"), level) for n in names]


def test_catch_versions_come_from_what_the_rows_show_not_from_a_seed():
    """Issue 44 open (a): a row's test files are the same bytes in every study that shows it, so
    its catch versions are drawn from the rows alone (``design.catch_plan``: no seed): exactly
    ``n_catch`` easy versions and the graded ones; studies of the same rows get the same
    versions, whichever side is A; a study of a superset of the rows keeps most of them; rows
    of another pair of runs (one side shared) get their own draws; offsets distinct per clip."""
    offsets = threshold.CATCH_OFFSETS
    names = [f"clip{i}" for i in range(30)]
    plan = design.catch_plan(_rows(names), design.n_catch(30), offsets)
    kinds = Counter(design.catch_grade(k) for v in plan for k, _, _ in v)
    assert kinds == {"easy": design.n_catch(30), "graded": design.GRADED_CATCHES}
    assert plan == design.catch_plan(_rows(names), design.n_catch(30), offsets)
    # the same content with the sides swapped (a study of B against A): the same sources
    swapped = design.catch_plan([((b, a), lv) for (a, b), lv in _rows(names)], 8, offsets)
    assert [[(k, not fb, o) for k, fb, o in v] for v in swapped] == plan
    # the rows with catch versions are spread (a hash, not the report's order) and either side
    # is a source
    with_catch = [i for i, v in enumerate(plan) if v]
    assert len(with_catch) == design.n_catch(30) and with_catch != list(range(len(with_catch)))
    assert {fb for v in plan for _, fb, _ in v} == {False, True}
    # a study of the first 20 of these clips: each of its catch rows is one of the 30's
    sub = design.catch_plan(_rows(names[:20]), design.n_catch(20), offsets)
    mine = {names[i] for i, v in enumerate(sub) if any(design.catch_grade(k) == "easy" for k, _, _ in v)}
    assert mine >= {
        names[i] for i, v in enumerate(plan[:20]) if any(design.catch_grade(k) == "easy" for k, _, _ in v)
    }
    # one run shared, the other not (A against B, A against C): drawn apart
    other = design.catch_plan([((a, b + "-c"), lv) for (a, b), lv in _rows(names)], 8, offsets)
    assert other != plan
    # a study of 3 rows: several versions a row, every one with its own offset
    few = design.catch_plan(_rows(names[:3]), design.n_catch(3), offsets)
    assert sum(len(v) for v in few) == design.n_catch(3) + design.GRADED_CATCHES
    for v in few:
        assert len({o for _, _, o in v}) == len(v) and all(o in offsets for _, _, o in v)
    # a threshold clip's levels are rows of one clip: offsets distinct across its levels
    levels = [(("x-a", "x-b"), lv) for lv in (None, ("amplify", 2.0, (1, 0, 0)), ("amplify", 4.0, (0, 1, 0)))]
    ladder = design.catch_plan(levels, 8, offsets)
    offs = [o for v in ladder for _, _, o in v]
    assert len(offs) == len(set(offs)) == 8 + design.GRADED_CATCHES


def test_row_keys_fix_the_answer_s_place_per_row():
    """A new row's files (issue 45, sizes): preference one file, its order the row's bit; ABX
    of one place (lossless) two files that differ in X's content only, the match's place the
    row's bit; without it (H.264, X in the middle) the 4 files of stream_keys."""
    assert design.row_keys("preference", bit=0) == ["ab"]
    assert design.row_keys("preference", bit=1) == ["ba"]
    assert design.row_keys("preference", True, bit=1) == ["dr"]
    assert design.row_keys("abx", x=2, bit=0) == ["aba", "bab"]
    assert design.row_keys("abx", x=2, bit=1) == ["baa", "abb"]
    assert design.row_keys("abx", True, x=2, bit=0) == ["rdr", "drd"]
    assert design.row_keys("abx", x=1, bit=1, one_place=False) == design.stream_keys("abx")
    for x in (0, 1, 2):
        for bit in (0, 1):
            keys = design.row_keys("abx", x=x, bit=bit)
            assert len(keys) == 2 and keys[0][x] != keys[1][x]
            # the same place of the match in both (the tile other than X's with X's content)
            places = {next(t for t in range(3) if t != x and k[t] == k[x]) for k in keys}
            assert places == {sorted(set(range(3)) - {x})[bit]}
    assert design.ONE_PLACE == {"stream": False, "lossless": True}


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_rows_of_one_place_assign_balanced_with_x_stored(protocol):
    """Rows made by row_keys (ABX: X in tile 2 stored as ``x``, since the keys of one place
    cannot say which of two tiles is X; preference: one file a row): every 2 (ABX) or every
    rater (preference) gets every file once, each box shows its tile's content, X's tile is the
    stored one, the answer's tile is the row's, and X's content is balanced across raters."""
    swap, bx = design.base_bits(8, 4)

    def streams(n, bit, catch=False):
        keys = design.row_keys(protocol, catch, x=2, bit=bit)
        return {
            "rects": RECTS,
            **({"x": 2} if protocol == "abx" else {}),
            "files": {k: f"{n}-{k}" for k in keys},
        }

    clips = [
        {"id": i + 1, "base_swap": swap[i], "base_x": bx[i], "streams": streams(f"c{i}", bx[i])}
        for i in range(8)
    ]
    pool = [
        {"clip_id": 1 + i, "kind": "negative", "streams": streams(f"k{i}", i % 2, True)}
        for i in range(design.n_catch(8))
    ]
    f = 1 if protocol == "preference" else 2
    seen, x_content = Counter(), Counter()
    for k in range(4):
        for t in design.assign(protocol, clips, pool, k, design.rater_seed(3, k), 3):
            name, arrangement = t["shown"]["media"].rsplit("-", 1)
            seen[t["shown"]["media"]] += 1
            tiles = t["shown"]["tiles"]
            for slot, rect in tiles.items():
                assert arrangement[RECTS.index(rect)] == t["sources"][slot][0]
            if protocol == "abx":
                assert RECTS.index(tiles["X"]) == 2
                assert t["sources"][t["expected"]] == t["sources"]["X"]
                row = int(name[1:])
                bit = bx[row] if name[0] == "c" else row % 2
                assert RECTS.index(tiles[t["expected"]]) == bit
                x_content[(name, t["sources"]["X"])] += 1
    assert set(seen.values()) == {4 // f} and len(seen) == (8 + design.n_catch(8)) * f
    if protocol == "abx":
        assert set(x_content.values()) == {2}


def test_row_bits_are_drawn_from_what_the_row_shows():
    """design.row_bits: the same row gives the same bits in every study (no seed); a study of B
    against A gets the bit that puts the same content in the first tile (the same file); rows
    differing in content or level draw their own bits, which take both values."""
    bit, catches = design.row_bits(("fa", "fb"), None, 3)
    assert design.row_bits(("fa", "fb"), None, 3) == (bit, catches) and len(catches) == 3
    flipped, again = design.row_bits(("fb", "fa"), None, 3)
    assert flipped == 1 - bit and again == catches
    first = lambda sides, b: design.row_keys("preference", bit=b)[0][0]  # noqa: E731
    assert {"a": "fa", "b": "fb"}[first(("fa", "fb"), bit)] == {"a": "fb", "b": "fa"}[
        first(("fb", "fa"), flipped)
    ]
    bits = {design.row_bits((f"a{i}", f"b{i}"), lv, 0)[0] for i in range(20) for lv in (None, 2.0)}
    assert bits == {0, 1}
