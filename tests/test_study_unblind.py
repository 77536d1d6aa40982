"""No peeking: the key stays sealed on every route until the planned included raters are done;
an owner who must look unblinds, logged, and the verdict after an early unblinding never says
"indistinguishable". Real SQLite files, the real CLI, a real server for /export."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import httpx
import pytest
from conftest import assert_one_line_error, old_study_db

from evalkit import study
from evalkit.study import store
from evalkit.testing.server import ADMIN_PASSWORD, Server
from evalkit.testing.studies import answer, hidden

RATERS = 6


@pytest.fixture(scope="module")
def report(reports):
    return reports()


def _clip_ord(db):
    """clip id -> its row order in the study (the same for two studies of one seed)."""
    with store.open_db(db).engine.connect() as conn:
        return {
            i: o
            for i, o in conn.execute(
                store.clips.select().with_only_columns(store.clips.c.id, store.clips.c.ord)
            )
        }


def _pick(db, k, ords):
    """Rater k: every catch right; a test trial right exactly when (k + clip order) is odd, so
    every rater and every clip is at exactly 50% (the rule's bound then sits far below the
    margin; at 6 raters x 6 clips the rule still makes no claim: the bound on visibly different
    clips is 1)."""

    def pick(t):
        h = hidden(db, t["trial"])
        if h["kind"] == "catch":
            return h["expected"]
        other = "A" if h["expected"] == "B" else "B"
        return h["expected"] if (k + ords[h["clip_id"]]) % 2 else other

    return pick


def _csvs(cli, db, sid, path):
    code, out, err = cli(
        "study", "results", "--db", db, "--study", sid, "--json", "--csv", path, "--reps", "300"
    )
    assert code == 0, err
    raw = list(csv.DictReader(open(path, newline="")))
    summ = list(csv.DictReader(open(path.with_name(path.stem + ".summary.csv"), newline="")))
    return json.loads(out), raw, summ


@pytest.mark.slow  # whole studies rated
def test_sealed_until_complete_unblinding_logged_and_never_indistinguishable(report, tmp_path, cli):
    db = tmp_path / "s.db"
    sids = []
    for _ in range(2):  # the same design twice: a control and one to be unblinded early
        code, out, err = cli(
            "study",
            "create",
            "--allow-masking",
            report,
            "--db",
            db,
            "--protocol",
            "abx",
            "--clips",
            "all",
            "--raters",
            RATERS,
            "--margin",
            "0.45",
            "--seed",
            "9",
        )
        assert code == 0, err
        sids.append(int(out.split(":", 1)[0].split()[1]))
    control, early = sids
    ords = _clip_ord(db)
    toks = {sid: [r["token"] for r in study.invite(db, sid, RATERS)] for sid in sids}
    for k in range(2):
        answer(db, toks[early][k], _pick(db, k, ords))
    # interim: the CLI's CSVs and JSON hold counts and timing, no key
    res, raw, summ = _csvs(cli, db, early, tmp_path / "a.csv")
    assert res["status"] == "interim" and "pilot" not in res and res["unblinding"] is None
    assert "accuracy" not in res and "per_clip" not in res
    assert raw and all(r[k] == "" for r in raw for k in study.export.KEY_COLUMNS if k in r)
    assert all(
        r["key"] == "sealed until 6 planned included raters are complete (2 now; "
        "`evalkit study unblind` opens it, logged)"
        for r in raw
    )
    assert all(r["response_ms"] and r["kind"] for r in raw)  # progress and timing
    assert [(r["scope"], r["accuracy"], r["unblinding"]) for r in summ] == [("study", "", "")]
    # refused: no reason, a reason over lines, an unknown study
    for args, words in (
        ((), ("--reason",)),
        (("--reason", " "), ("--reason", "non-empty")),
        (("--reason", "a\nb"), ("--reason", "one line")),
    ):
        code, _, err = cli("study", "unblind", "--db", db, "--study", early, *args)
        assert code == 2
        if args:
            assert_one_line_error(err, *words)
    code, _, err = cli("study", "unblind", "--db", db, "--study", "99", "--reason", "x")
    assert code == 2
    assert_one_line_error(err, "study 99")
    assert study.unblinding_log(db, early) == []
    # the owner looks: logged, who, when, at how many included raters
    code, out, err = cli(
        "study", "unblind", "--db", db, "--study", early, "--reason", "pilot look", "--who", "alice"
    )
    assert code == 0, err
    assert "key opened early by alice" in out and "at 2 of 6 planned included raters" in out
    row = (
        sqlite3.connect(db)
        .execute("select study_id, who, reason, raters_included, raters_planned, created from unblindings")
        .fetchall()
    )
    assert [r[:5] for r in row] == [(early, "alice", "pilot look", 2, RATERS)] and row[0][5]
    # a clearly labelled pilot while interim, the key in the CSVs, the unblinding everywhere
    res, raw, summ = _csvs(cli, db, early, tmp_path / "b.csv")
    assert res["status"] == "interim" and res["verdict"] == "interim"
    assert res["unblinding"]["who"] == "alice" and res["unblinding"]["raters_included"] == 2
    p = res["pilot"]
    assert p["verdict"] == "pilot" and p["n"] == 2 * 6 and p["accuracy"] == 0.5
    assert p["label"].startswith("PILOT on 2 included raters of 6 planned, not a verdict")
    assert all(r["correct"] in ("0", "1") and r["backend_per_side"] for r in raw)
    assert all(r["key"].startswith("key opened early by alice") for r in raw)
    assert [r["scope"] for r in summ] == ["study", "pilot"]
    assert all("key opened early by alice" in r["unblinding"] for r in summ)
    assert summ[1]["verdict"] == "pilot" and float(summ[1]["accuracy"]) == 0.5
    code, text, _ = cli("study", "results", "--db", db, "--study", early)
    assert "UNBLINDED: key opened early by alice" in text and "PILOT on 2" in text
    assert "pilot: ABX accuracy 0.5" in text and "INDISTINGUISHABLE" not in text
    # both studies completed the same way
    for sid in sids:
        for k in range(RATERS):
            if sid == control or k >= 2:
                answer(db, toks[sid][k], _pick(db, k, ords))
    ctrl, raw_c, _ = _csvs(cli, db, control, tmp_path / "c.csv")
    # U is far below the margin, but 6 raters x 6 clips cannot bound the share of visibly
    # different clips (issue 44, items 3 and 4): no claim, and the study says it is under-sized
    assert ctrl["status"] == "complete" and ctrl["verdict"] == "inconclusive"
    assert ctrl["upper_bound"] < 0.95 and not ctrl["below_chance"]["found"]
    assert any("does not exclude 0.9" in b for b in ctrl["blocked"])
    assert ctrl["design"]["under_sized"] and ctrl["design"]["raters"] == RATERS
    assert ctrl["bootstrap_reps"] == study.stats.VERDICT_REPS and "reps_note" in ctrl
    assert all(r["key"] == "open: the planned included raters are complete" for r in raw_c)
    assert all(r["correct"] in ("0", "1") for r in raw_c)
    code, _, err = cli("study", "unblind", "--db", db, "--study", control, "--reason", "late")
    assert code == 2
    assert_one_line_error(err, f"--study {control}", "complete", "nothing to unblind")
    res, raw, summ = _csvs(cli, db, early, tmp_path / "d.csv")
    # not "unblinded early": the rule itself makes no claim here (stats.after_unblinding is
    # tested on its own in test_study_stats); the unblinding is reported everywhere
    assert res["status"] == "complete" and res["verdict"] == "inconclusive"
    assert "verdict" not in res["without_exclusions"]
    assert res["without_exclusions"]["label"].startswith("sensitivity check, not a verdict")
    assert (res["accuracy"], res["upper_bound"]) == (ctrl["accuracy"], ctrl["upper_bound"])
    assert res["unblinding"]["who"] == "alice"
    assert all(r["key"].startswith("key opened early by alice") for r in raw)
    assert summ[0]["verdict"] == "inconclusive"
    assert all("key opened early by alice" in r["unblinding"] for r in summ)
    code, text, _ = cli("study", "results", "--db", db, "--study", early)
    assert "verdict: INCONCLUSIVE" in text and "UNBLINDED EARLY: key opened early by alice" in text
    assert "UNDER-SIZED: 6 raters x 6 clips" in text
    assert "sensitivity check, not a verdict: with the catch-excluded raters" in text
    assert not any(
        "INDISTINGUISHABLE" in ln
        for ln in text.splitlines()  # but the rule's
        if not ln.startswith("rule: ")
    )
    # what the verdict covers: every compared clip, with the bound on visible clips like these
    cov = ctrl["coverage"]
    assert cov["selection"] == "all" and cov["clips"] == cov["of"] == 6 and cov["flagged"] == 0
    # 6 ratings per clip cannot flag a clip at Holm's alpha/2/6: the bound says so
    assert cov["flag_power"] == 0 and cov["bound"] == 1.0
    code, text, _ = cli("study", "results", "--db", db, "--study", control)
    assert "coverage: covers every compared clip (6 of 6), 0 flagged" in text
    assert "no bound: with 6 ratings per clip the clip veto cannot flag" in text
    c = study.stats.coverage("sample:15", 15, 107, 0, 107)
    assert c["bound"] == pytest.approx((1 - 0.05 ** (1 / 15)) / c["flag_power"])
    assert "at most 18.1% of clips like these are visibly different" in c["text"]
    w = study.stats.coverage("worst:15", 15, 107, 0, 107)
    assert w["bound"] is None and "15 clips of 107 with the highest LPIPS mean" in w["text"]


@pytest.mark.slow  # the real server
def test_export_route_serves_no_key_before_complete(report, tmp_path):
    """Through the real server's /export routes (the admin page's downloads call the same
    functions: tests/test_app_more.py downloads them in Chromium)."""
    db = tmp_path / "e.db"
    sid = study.create_study(
        report, db, protocol="abx", clips_spec="worst:3", seed=4, raters_planned=3, allow_masking=True
    )["study"]
    toks = [r["token"] for r in study.invite(db, sid, 2)]
    answer(db, toks[0], lambda t: "A")
    answer(db, toks[1], lambda t: "B", limit=4)
    server = Server(db).start()
    try:

        def get(which):
            r = httpx.get(f"{server.url}/export/{sid}/{which}.csv", auth=("admin", ADMIN_PASSWORD))
            assert r.status_code == 200, r.text
            return list(csv.DictReader(io.StringIO(r.text)))

        raw = get("ratings")
        assert len(raw) > 4
        for r in raw:
            assert all(r[k] == "" for k in study.export.KEY_COLUMNS if k in r), r
            assert r["key"].startswith("sealed until 3 planned")
        assert [(r["scope"], r["status"], r["accuracy"]) for r in get("summary")] == [
            ("study", "interim", "")
        ]
        study.unblind(db, sid, reason="the lead asked", who="bob")
        raw = get("ratings")
        assert {r["answer"] for r in raw} == {"A", "B"}
        assert all(r["key"].startswith("key opened early by bob") for r in raw)
        summ = get("summary")
        assert summ[1]["scope"] == "pilot" and "by bob" in summ[0]["unblinding"]
    finally:
        server.stop()


def test_unblindings_table_added_to_a_version_4_database(report, tmp_path):
    path = tmp_path / "v4.db"
    sid = old_study_db(report, path, 4)  # as a version 4 database was: no unblindings table
    d = store.StudyDB(store.sqlite_url(path))
    assert d.schema_version() == store.SCHEMA_VERSION == 6
    assert "delivered" in [r[1] for r in sqlite3.connect(path).execute("pragma table_info(trials)")]
    assert study.results(d, sid, reps=100)["unblinding"] is None
    u = study.unblind(d, sid, reason="upgrade check", who="carol")
    assert u["raters_included"] == 0 and u["who"] == "carol"
    d.dispose()


def test_a_pilot_interval_cannot_set_a_gate():
    """`study gate`'s check (the CLI refusal and the override run in
    tests/test_threshold_study.py): a measured threshold whose interval is open at either end
    or wider than the stated factor is refused; a lower bound (threshold above every level)
    gates on the bound itself."""
    from evalkit.study.analyse import gate_interval_problem

    pilot = {"threshold": 0.0015, "ci": [None, 0.062]}  # the 4-rater pilot of issue 34
    assert "closed at both ends" in gate_interval_problem(pilot)
    assert "n/a to 0.062" in gate_interval_problem(pilot)
    assert "closed" in gate_interval_problem({"threshold": 0.01, "ci": [0.005, None]})
    wide = {"threshold": 0.01, "ci": [0.004, 0.024]}
    assert "at most 4x wide" in gate_interval_problem(wide)
    assert "(6x)" in gate_interval_problem(wide)
    assert gate_interval_problem(wide, 6.5) is None
    assert gate_interval_problem({"threshold": 0.01, "ci": [0.006, 0.02]}) is None
    assert gate_interval_problem({"threshold": None, "ci": [0.2, None], "bound": "lower"}) is None
