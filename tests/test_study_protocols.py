"""The protocols are objects (evalkit.study.protocols, issue 49): the design tables come from
them, each answers what differs per protocol, and the study's operations ask the object instead
of comparing protocol names."""

import ast
from pathlib import Path

import pytest

from evalkit.study import design, protocols
from evalkit.study.errors import StudyError

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


@pytest.mark.parametrize("module", ["create", "analyse", "export", "design"])
def test_no_protocol_name_compared_in_the_operations(module):
    """create, analyse, export and design ask the protocol object: no comparison with a
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
