"""The protocols are objects (evalkit.study.protocols, issue 49): the design tables come from
them, each answers what differs per protocol, and the study's operations ask the object instead
of comparing protocol names."""

import ast
from pathlib import Path

import pytest

from evalkit.study import design, planning, protocols, stats, text
from evalkit.study.errors import StudyError
from evalkit.study.protocols.preference import Preference

STUDY = Path(__file__).resolve().parents[1] / "evalkit" / "study"
NAMES = {"abx", "preference", "threshold"}


def test_the_design_tables_come_from_the_registry():
    assert design.PROTOCOLS == ("preference", "abx", "threshold") == tuple(protocols.REGISTRY)
    assert design.ANSWERS == {
        "preference": ("left", "right", "same"),
        "abx": ("A", "B"),
        "threshold": ("A", "B"),
    }
    assert design.FORCED_CHOICE == ("abx", "threshold")
    # a threshold study's trials are shown exactly as ABX: the page never learns of levels
    assert [design.page_protocol(p) for p in design.PROTOCOLS] == ["preference", "abx", "abx"]
    assert all(protocols.get(p).name == p for p in design.PROTOCOLS)
    with pytest.raises(KeyError):
        protocols.get("ranking")


def test_each_protocol_answers_for_itself():
    pref, abx, thr = (protocols.get(p) for p in ("preference", "abx", "threshold"))
    assert pref.paired and not abx.paired and not thr.paired
    assert design.stream_keys("preference") == ["ab", "ba"]
    assert len(design.stream_keys("threshold")) == 4
    # only the threshold protocol has levels, and it has no planner: --raters is needed
    assert abx.levels(None, "amplify", 0) == ([None], [])
    with pytest.raises(
        StudyError, match="--levels: only for --protocol threshold, found --protocol preference"
    ):
        pref.levels("1,2", "amplify", 12)
    with pytest.raises(StudyError, match="--ladder: only for --protocol threshold"):
        abx.check_ladder("amplify")
    with pytest.raises(StudyError, match="--raters: the threshold protocol needs"):
        thr.levels(None, "amplify", 0)
    the_plan, warnings = thr.study_plan(0.1, 0.05, 12, 6, [1, 2, 4], ["w"])
    assert the_plan["raters"] == 12 and warnings == ["w"]
    assert thr.rating_columns == ("level", "stimulus_lpips") and abx.rating_columns == ()
    assert thr.sets_gate and not abx.sets_gate and not pref.sets_gate
    # the ABX floor on the achieved design's clips (plans made before the floor)
    assert abx.planned_clips(10, 0.1) > 10 and thr.planned_clips(10, 0.1) == 10
    assert pref.planned_clips(None, 0.1) is None and abx.planned_clips(None, 0.1) is None
    for p in (pref, abx, thr):
        easy, graded = p.catch_kinds
        assert easy == design.CATCH_KINDS and graded == design.GRADED_KINDS


def test_preference_scores_and_agreement():
    pref, abx = protocols.get("preference"), protocols.get("abx")
    test = [
        {"rater": r, "job": j, "score_b": s, "correct": None}
        for r, j, s in (("r1", "j1", 1.0), ("r2", "j1", 1.0), ("r1", "j2", 0.0), ("r2", "j2", 0.0))
    ]
    assert pref.agreement(test) == {"krippendorff_alpha": pytest.approx(1.0)}
    assert abx.agreement(test) == {}
    trial = {"kind": "test", "expected": None, "sources": {"left": "b", "right": "a"}}
    assert design.score("preference", trial, "left") == (None, 1.0)
    assert design.score("abx", dict(trial, expected="A"), "A") == (1, None)


@pytest.mark.parametrize("module", ["create", "analyse", "export", "design", "planning", "text"])
def test_no_protocol_name_compared_in_the_operations(module):
    """create, analyse, export, design, planning and text ask the protocol object: no comparison with a
    protocol's name and no test of membership in FORCED_CHOICE."""
    tree = ast.parse((STUDY / f"{module}.py").read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                if isinstance(part, ast.Constant) and part.value in NAMES:
                    bad.append(f"{module}.py:{node.lineno} compares with {part.value!r}")
                if (
                    isinstance(part, (ast.Attribute, ast.Name))
                    and getattr(part, "attr", getattr(part, "id", None)) == "FORCED_CHOICE"
                ):
                    bad.append(f"{module}.py:{node.lineno} tests FORCED_CHOICE")
    assert bad == []


def test_planning_and_the_results_text_ask_the_protocol():
    pref, abx, thr = (protocols.get(p) for p in ("preference", "abx", "threshold"))
    assert [p.planned for p in (pref, abx, thr)] == [True, True, False]
    assert pref.two_sided and not abx.two_sided
    assert abx.bounds_visible and not pref.bounds_visible and not thr.bounds_visible
    assert abx.clips_floor(0.05) == stats.min_clips(0.05) > stats.MIN_CLIPS == pref.clips_floor(0.05)
    assert pref.power_terms(0.2, 0.15) == (0.8, 0.15) and abx.power_terms(0.2, 0.15) == (1.0, 0.0)
    with pytest.raises(ValueError, match="test ratings would be needed"):
        abx.check_ratings(0.05, stats.MAX_RATERS, 2)
    pref.check_ratings(0.05, stats.MAX_RATERS, 2)  # no such limit
    with pytest.raises(ValueError, match="protocol: expected abx or preference, found 'threshold'"):
        planning.plan("threshold", 0.1)
    with pytest.raises(ValueError, match="--visible-bound: only for --protocol abx \\(a preference study"):
        planning.plan("preference", 0.1, visible_bound=0.1)
    # results text and the admin page: what each protocol's figures are
    assert thr.by_level and not abx.by_level and thr.rows_noun == "clip-level stimuli"
    assert (pref.per_clip_key, abx.per_clip_key) == ("win_rate_b", "accuracy")
    assert "Holm" in abx.per_clip_title("accuracy") and thr.per_clip_title("accuracy") == "per clip accuracy"
    assert abx.sensitivity_figure({"accuracy": 0.5, "upper_bound": 0.61}) == "accuracy 0.5, upper bound 0.61"
    assert pref.sensitivity_figure({"win_rate_b": 0.25}) == "win rate of B 0.25"
    assert thr.figure_lines({"verdict_text": "threshold measured"}) == ["threshold measured"]
    assert abx.result_lines({}) is None


class _Ranking(Preference):
    """A protocol added as one object: preference under another name."""

    name = "ranking"


def test_a_new_protocol_is_one_object(monkeypatch):
    # registered, it is planned and its results are written without a change elsewhere
    monkeypatch.setitem(protocols.REGISTRY, "ranking", _Ranking())
    kw = dict(clips=15, studies=30, reps=30, seed=5)
    mine, theirs = planning.plan("ranking", 0.3, **kw), planning.plan("preference", 0.3, **kw)
    assert mine.pop("protocol") == "ranking" and theirs.pop("protocol") == "preference"
    assert mine == theirs and mine["raters"] >= stats.MIN_RATERS
    res = {
        "protocol": "ranking",
        "wins_b": 9,
        "wins_a": 3,
        "ties": 0,
        "tie_rate": 0.0,
        "win_rate_b": 0.75,
        "ci": [0.6, 0.9],
        "p_value": 0.01,
        "flip_p": 0.02,
        "sign_p": 0.03,
        "rule": "the rule",
        "per_clip": [],
    }
    lines = text._figure_lines(res)
    assert lines[0].startswith("B preferred 9, A preferred 3") and lines[-1] == "rule: the rule"
