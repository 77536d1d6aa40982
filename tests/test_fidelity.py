"""Delivery fidelity (issue 34 item 9): the browser stream keeps the A-B difference, measured on
the delivered frames (real x264 streams decoded with PyAV, real SQLite)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_one_line_error

from evalkit import study
from evalkit.study import design, fidelity
from evalkit.study.store import open_db, studies
from evalkit.study.text import results_lines
from evalkit.testing.studies import answer, hidden

PATTERN = "evalkit.testing.renderers:Pattern"


@pytest.fixture(scope="module")
def pattern_reports(tmp_path_factory):
    """Two compare reports of the smoke clips whose backends differ by a known pattern:
    ``checker`` (+-1 in a one-pixel checkerboard, finer than the stream's quantizer) and
    ``square`` (+24 in the central square)."""
    from evalkit.testing.studies import make_report

    return {d: make_report(tmp_path_factory.mktemp(d), seeds=(0,), renderer=PATTERN,
                           options={"diff": d}) for d in ("checker", "square")}


def _frames(values, shape=(1, 1, 10, 3)):
    return np.asarray(values, np.uint8).reshape(shape)


def test_rule_boundary_exactly_at_the_margin():
    """SSE(D) exactly 10 x SSE(D' - D) is 10 dB of headroom: accepted at 10 dB; one more unit of
    error squared is below it: refused. Integer sums, no tolerance."""
    a = _frames(np.zeros(30))
    b = _frames([10] + [0] * 29)                  # D: one value of 10, SSE 100
    d2 = np.zeros(30, np.int16)
    d2[0] = 10
    d2[1:11] = 1                                  # D' - D: ten values of 1, SSE 10
    s = fidelity.Sums()
    s.add(a, b, a, _frames(d2))
    f = s.figures()
    assert f["sums"]["ab"] == 100 and f["sums"]["diff_err"] == 10
    assert f["headroom_db"] == 10.0
    assert fidelity.acceptable(f["sums"], 10.0)
    assert not fidelity.acceptable(f["sums"], 10.0 + 1e-9)
    d2[11] = 1                                    # SSE 11: 9.59 dB
    s = fidelity.Sums()
    s.add(a, b, a, _frames(d2))
    assert not fidelity.acceptable(s.figures()["sums"], 10.0)
    assert fidelity.judge(s.figures())["ok"] is False


def test_figures_of_an_exact_and_an_erased_delivery():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (2, 4, 4, 3)).astype(np.uint8)
    b = np.clip(a.astype(int) + 3, 0, 255).astype(np.uint8)
    s = fidelity.Sums()
    s.add(a, b, a, b)                             # delivered exactly
    f = fidelity.judge(s.figures())
    assert f["ok"] and f["headroom_db"] is None and f["difference_error_db"] is None
    assert f["identical"] is False
    s = fidelity.Sums()
    s.add(a, b, a, a)                             # the difference erased: headroom 0 dB
    f = s.figures()
    assert f["headroom_db"] == 0.0 and not fidelity.acceptable(f["sums"])
    assert f["ab_delivered_db"] == math.inf and f["encode_b_db"] == f["ab_lossless_db"]
    s = fidelity.Sums()
    s.add(a, a, a, b)                             # identical sides: nothing to mask
    f = fidelity.judge(s.figures())
    assert f["ok"] and f["identical"] and f["headroom_db"] is None


def test_masking_refused_with_one_line_then_allowed_and_reported(pattern_reports, tmp_path,
                                                                 cli):
    """A difference finer than the encode's quantizer is refused (exit 2, one line naming the
    clip and both figures, nothing in the database); --allow-masking creates it, records the
    override and every results text says so."""
    db = tmp_path / "s.db"
    code, out, err = cli("study", "create", pattern_reports["checker"], "--db", db, "--protocol",
                         "abx", "--raters", "3")
    assert code == 2
    assert_one_line_error(err, "delivery fidelity: clip ", "-s0-", "dB PSNR lossless",
                          "error on the A-B difference is", "--allow-masking")
    assert study.list_studies(db) == []           # nothing half-written
    code, out, err = cli("study", "create", "--allow-masking", pattern_reports["checker"],
                         "--db", db, "--protocol", "abx", "--raters", "3")
    assert code == 0, err
    assert "DELIVERY MASKED: 2 of 2 rows" in out and "media: " in out
    with open_db(db).engine.connect() as conn:
        config = conn.execute(studies.select()).mappings().one()["config"]
    d = config["delivery"]
    assert d["allow_masking"] is True and d["masked"] == 2
    for row in d["rows"]:
        assert row["ok"] is False and row["headroom_db"] < 10
        # the checkerboard is +-1 on every channel: 48.13 dB lossless, a little more where
        # clipping at 0 or 255 took it away
        assert 10 * math.log10(255 ** 2) - 0.01 <= row["ab_lossless_db"] < 49
        # every file of the row measured: 4 in ABX since issue 44 (X in tile 0, its match in
        # tile 1 or 2, either content as X)
        assert row["streams"] == len(design.stream_keys("abx")) == 4
    text = "\n".join(results_lines(study.results(db, 1)))
    assert "DELIVERY MASKED" in text and "--allow-masking" in text
    for row in d["rows"]:
        assert (f"{row['job']} {row['ab_lossless_db']:.1f} dB / "
                f"{row['difference_error_db']:.1f} dB") in text


def test_a_difference_the_stream_carries_is_accepted_with_its_figures(pattern_reports,
                                                                      tmp_path):
    from evalkit.app.admin import verdict_markdown

    db = tmp_path / "s.db"
    made = study.create_study(pattern_reports["square"], db, protocol="abx", raters_planned=3)
    d = made["delivery"]
    assert d["masked"] == 0 and not d["allow_masking"] and len(d["rows"]) == 2
    for row in d["rows"]:
        assert row["ok"] and row["headroom_db"] >= 10
        assert abs(row["ab_delivered_db"] - row["ab_lossless_db"]) < 1
    mb = made["media_bytes"]
    files = sorted((tmp_path / "s.media").glob("*.mp4"))
    assert mb["streams"] == len(files) and mb["total"] == sum(p.stat().st_size for p in files)
    assert mb["max"] == max(p.stat().st_size for p in files)
    tok = study.invite(db, made["study"], 3)
    for t in tok:                                 # complete: the per-clip rows carry it
        answer(db, t["token"], lambda trial: hidden(db, trial["trial"])["expected"])
    res = study.results(db, made["study"])
    assert res["status"] == "complete" and len(res["per_clip"]) == 2
    for c in res.get("per_clip") or []:
        row = next(r for r in d["rows"] if r["job"] == c["job"])
        assert c["delivery_headroom_db"] == row["headroom_db"] and c["delivery_ok"] is True
    page = verdict_markdown(res)                  # what the admin page shows
    w = d["worst"]
    assert f"least headroom: clip {w['job']}" in page
    assert f"{w['ab_lossless_db']:.1f} dB" in page and "delivery: every row" in page
    assert f"max {fidelity.bytes_text(mb['max'])}" in page


def test_threshold_stimuli_are_measured_as_delivered(pattern_reports, tmp_path):
    """Each level's stimulus pair is measured after the encode; a level amplified past what
    the stream needs is accepted, and a margin no stream meets refuses naming the level."""
    db = tmp_path / "t.db"
    made = study.create_study(pattern_reports["square"], db, protocol="threshold",
                              levels="0.5,1,2", raters_planned=2)
    rows = made["delivery"]["rows"]
    assert sorted(r["level"] for r in rows) == [0.5, 0.5, 1.0, 1.0, 2.0, 2.0]
    by = {r["level"]: r["ab_lossless_db"] for r in rows}
    assert by[0.5] > by[1.0] > by[2.0]            # a larger level is a larger difference
    with pytest.raises(study.StudyError, match=r"delivery fidelity: clip .* at level 0.5"):
        study.create_study(pattern_reports["square"], tmp_path / "u.db", protocol="threshold",
                           levels="0.5,1,2", raters_planned=2, delivery_margin_db=60)


@pytest.mark.parametrize("value", ["0", "-3", "nan", "100"])
def test_a_bad_delivery_margin_is_one_line_before_anything_is_written(pattern_reports, tmp_path,
                                                                      cli, value):
    db = tmp_path / "s.db"
    code, _, err = cli("study", "create", pattern_reports["square"], "--db", db, "--protocol",
                       "abx", "--delivery-margin", value)
    assert code == 2
    assert_one_line_error(err, "--delivery-margin", "expected dB in (0, 100)")
    assert not db.exists() and not (tmp_path / "s.media").exists()
