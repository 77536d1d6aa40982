"""The threshold protocol (issue 17): the amplified ladder, its design, bad input, and a whole
small study end to end through the real app (the real `evalkit serve`, Debian's Chromium, real
encodes, real LPIPS weights, real SQLite): scripted raters whose accuracy depends on the level,
then `study results --json` has a threshold and a headroom, `study gate` writes a gate, and
`compare` accepts that gate."""

from __future__ import annotations

import csv
import json
from collections import Counter

import numpy as np
import pytest
import yaml
from conftest import assert_one_line_error
from sqlalchemy import select

from evalkit import study
from evalkit.study import design, seal, store, threshold
from evalkit.testing.page import ENABLED, admin_results, answer, open_page
from evalkit.testing.server import ADMIN_PASSWORD, Server
from evalkit.testing.studies import hidden, rate
from evalkit.video import read_frames

pytestmark = pytest.mark.slow  # a whole study through the real app and Chromium

LEVELS = (1.0, 2.0, 4.0, 8.0)
RATERS = 8
#: scripted raters: probability of a correct ABX answer at each level (chance at the real
#: difference and at 2x, nearly always right at 8x)
P_CORRECT = {1.0: 0.5, 2.0: 0.55, 4.0: 0.85, 8.0: 1.0}


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("threshold")
    report = reports(seeds=(0,))  # 2 clips of 8 frames, 24 fps (shared)
    db = root / "s.db"
    made = study.create_study(
        report,
        db,
        protocol="threshold",
        levels="1,2,4,8",
        raters_planned=RATERS,
        seed=7,
        allow_masking=True,
        design_seed=7,
    )  # the secret seed pinned: the same trials
    with store.open_db(db).engine.connect() as conn:
        cfg = conn.execute(
            select(store.studies.c.config).where(store.studies.c.id == made["study"])
        ).scalar_one()
        rows = [
            dict(r)
            for r in conn.execute(
                select(store.clips).where(store.clips.c.study_id == made["study"]).order_by(store.clips.c.ord)
            ).mappings()
        ]
    cfg = seal.unseal_config(made["study"], cfg)  # the streams are sealed: the key file
    return {
        "root": root,
        "report": report,
        "db": db,
        "sid": made["study"],
        "made": made,
        "config": cfg,
        "rows": rows,
    }


def level_of(env, trial_id) -> float | None:
    h = hidden(env["db"], trial_id)
    st = env["config"]["threshold"]["stimuli"].get(str(h["clip_id"]))
    return st["level"] if h["kind"] == "test" else None


def scripted(env, rng):
    """A rater who passes every catch trial and answers a test trial right with the level's
    probability (``P_CORRECT``)."""

    def pick(t):
        h = hidden(env["db"], t["trial"])
        if h["kind"] == "catch":
            return h["expected"]
        right = rng.random() < P_CORRECT[level_of(env, t["trial"])]
        return h["expected"] if right else ("B" if h["expected"] == "A" else "A")

    return pick


# -- levels and bad input ----------------------------------------------------------------------


def test_levels_are_checked():
    assert threshold.parse_levels("1,2,4,8") == ([1.0, 2.0, 4.0, 8.0], [])
    assert threshold.parse_levels([0.5, 1, 3])[0] == [0.5, 1.0, 3.0]
    levels, warn = threshold.parse_levels("2,4,8")
    assert levels == [2.0, 4.0, 8.0] and "no level 1" in warn[0]
    for bad, says in (
        ("4,2,1", "increasing"),
        ("1,2,2,4", "increasing"),
        ("0,1,2", "positive"),
        ("-1,1,2", "positive"),
        ("1,2", "3 to 12"),
        ("1,,2", "comma"),
        ("a,b,c", "comma"),
        ("1,2,inf", "positive"),
        ("", "comma"),
    ):
        with pytest.raises(study.StudyError, match=says) as e:
            threshold.parse_levels(bad)
        assert str(e.value).startswith("--levels")


def test_cli_refuses_bad_threshold_input(env, cli, tmp_path):
    report, db = env["report"], tmp_path / "x.db"
    for args, needles in (
        (["--protocol", "threshold", "--levels", "4,2,1", "--raters", "4"], ("--levels", "4,2,1")),
        (["--protocol", "threshold", "--levels", "1,x,4", "--raters", "4"], ("--levels", "1,x,4")),
        (["--protocol", "threshold", "--levels", "1,2,4"], ("--raters", "found 0")),
        (["--protocol", "abx", "--levels", "1,2,4"], ("--levels", "only for --protocol threshold")),
        (["--protocol", "abx", "--ladder", "blur"], ("--ladder", "only for --protocol threshold")),
    ):
        code, out, err = cli("study", "create", "--allow-masking", report, "--db", db, *args)
        assert code == 2, (args, out, err)
        assert_one_line_error(err, *needles)
    assert not (tmp_path / "x.media").exists()  # refused before any encoding
    # a gate needs a sane safety factor (and a complete study: see the end-to-end test)
    code, _, err = cli(
        "study",
        "gate",
        "--db",
        env["db"],
        "--study",
        env["sid"],
        "--out",
        tmp_path / "g.yaml",
        "--safety-factor",
        "0.5",
    )
    assert code == 2
    assert_one_line_error(err, "--safety-factor", "0.5")
    assert not (tmp_path / "g.yaml").exists()


# -- stimuli -------------------------------------------------------------------------------------


def test_stimuli_amplify_the_real_difference(env):
    summary = json.loads((env["report"] / "summary.json").read_text())
    with open(env["report"] / "clips.csv", newline="") as f:
        report_lpips = {r["job"]: float(r["lpips_mean"]) for r in csv.DictReader(f)}
    cfg = env["config"]["threshold"]
    assert cfg["levels"] == list(LEVELS) and cfg["conventions"]["lpips"].startswith("v0.1,alex")
    runs = {
        k: env["report"] / summary["runs"][k]["path"]
        if not summary["runs"][k]["path"].startswith("/")
        else summary["runs"][k]["path"]
        for k in ("a", "b")
    }
    by_job: dict[str, list] = {}
    for cid, s in cfg["stimuli"].items():
        by_job.setdefault(s["job"], []).append(s)
    assert set(by_job) == set(report_lpips) and len(env["rows"]) == 2 * len(LEVELS)
    for job, stims in by_job.items():
        fa = read_frames(f"{runs['a']}/clips/{job}.mkv")[0]
        fb = read_frames(f"{runs['b']}/clips/{job}.mkv")[0]
        assert not np.array_equal(fa, fb)
        # k = 1 is B's frames exactly (before encoding), k = 0 A's; k = 2 doubles the difference
        assert np.array_equal(threshold.amplify(fa, fb, 1.0), fb)
        assert np.array_equal(threshold.amplify(fa, fb, 0.0), fa)
        d2 = threshold.amplify(fa, fb, 2.0).astype(int) - fa
        inside = (2 * fb.astype(int) - fa >= 0) & (2 * fb.astype(int) - fa <= 255)
        assert np.array_equal(d2[inside], 2 * (fb.astype(int) - fa)[inside])
        stims.sort(key=lambda s: s["level"])
        assert [s["level"] for s in stims] == list(LEVELS)
        assert [s["identical_to_b"] for s in stims] == [True, False, False, False]
        # measured like compare: the real difference equals the report's LPIPS, and the
        # stimuli's LPIPS, SSIM and PSNR move monotonically with k
        ref = cfg["reference"][job]
        assert ref["lpips"] == pytest.approx(report_lpips[job], abs=1e-6)
        assert stims[0]["metrics"]["lpips"] == pytest.approx(ref["lpips"], abs=1e-9)
        lp = [s["metrics"]["lpips"] for s in stims]
        assert all(b > 1.5 * a for a, b in zip(lp, lp[1:])), lp
        assert all(
            b < a
            for a, b in zip([s["metrics"]["ssim"] for s in stims], [s["metrics"]["ssim"] for s in stims][1:])
        )
        diffs = [s["metrics"]["max_abs_diff"] for s in stims]
        assert diffs[0] == ref["max_abs_diff"] and diffs == sorted(diffs) and diffs[-1] > diffs[0]
        # each level's pair is shown shifted by its own colour offset (at most 1 code value per
        # channel; none at level 1), so A's copy is another picture in every level's trial
        offs = [tuple(s["offset"]) for s in stims]
        assert offs[0] == (0, 0, 0) and len(set(offs)) == len(offs) and (1, 1, 1) not in offs
        assert all(max(map(abs, o)) <= 1 for o in offs)
    # each (clip, level) is one row of the clips table: its B side is that level's stimulus
    lp_rows = sorted(r["lpips_mean"] for r in env["rows"])
    assert lp_rows == sorted(s["metrics"]["lpips"] for s in cfg["stimuli"].values())
    # each row: one stream per ABX arrangement of its tiles, no file shared between rows
    streams = [env["config"]["streams"][str(r["id"])] for r in env["rows"]]
    assert all(sorted(s["files"]) == sorted(design.stream_keys("abx")) for s in streams)
    files = [f for s in streams for f in s["files"].values()]
    assert len(set(files)) == len(files)


def test_blur_ladder_for_comparison(env, cli, tmp_path):
    """The known-degradation ladder: A blurred with sigma k px, measured like the amplified
    stimuli, the real difference still the reference; it sets no gate."""
    db = tmp_path / "b.db"
    made = study.create_study(
        env["report"],
        db,
        protocol="threshold",
        ladder="blur",
        levels="0.5,1,2",
        raters_planned=2,
        clips_spec="worst:1",
        allow_masking=True,
    )
    assert made["warnings"] == []  # level 1 is not "the real B" here
    with store.open_db(db).engine.connect() as conn:
        cfg = conn.execute(select(store.studies.c.config)).scalar_one()["threshold"]
    assert cfg["ladder"] == "blur"
    stims = sorted(cfg["stimuli"].values(), key=lambda s: s["level"])
    assert [s["identical_to_b"] for s in stims] == [False] * 3
    lp = [s["metrics"]["lpips"] for s in stims]
    assert lp == sorted(lp) and lp[0] > 0
    ((job, ref),) = cfg["reference"].items()
    assert ref["lpips"] == pytest.approx(env["config"]["threshold"]["reference"][job]["lpips"])
    code, _, err = cli("study", "gate", "--db", db, "--study", made["study"], "--out", tmp_path / "g.yaml")
    assert code == 2 and not (tmp_path / "g.yaml").exists()
    assert_one_line_error(err, "blur ladder", "sets no gate")


# -- design --------------------------------------------------------------------------------------


def test_design_is_balanced_interleaved_and_reproducible():
    rects = [[16, 16, 8, 8], [40, 16, 8, 8], [64, 16, 8, 8]]

    def streams(name, catch=False):
        return {"rects": rects, "files": {k: f"{name}{k}" for k in design.stream_keys("abx", catch)}}

    rows = [{"id": i + 1, "streams": streams(f"s{i}")} for i in range(12)]  # 3 clips x 4 levels
    level = {r["id"]: LEVELS[i % 4] for i, r in enumerate(rows)}
    swap, xbit = design.base_bits(len(rows), 7)
    for r, s, x in zip(rows, swap, xbit):
        r["base_swap"], r["base_x"] = s, x
    pool = [
        {"clip_id": 1, "kind": k, "streams": streams(f"k{k}", True)}
        for k in design.CATCH_KINDS + design.GRADED_KINDS
    ]
    plans = [design.assign("threshold", rows, pool, k, design.rater_seed(7, k)) for k in range(8)]
    assert plans[3] == design.assign("threshold", rows, pool, 3, design.rater_seed(7, 3))
    assert plans[3] != design.assign("threshold", rows, pool, 3, design.rater_seed(8, 3))
    arrangements = Counter()
    for plan in plans:
        tests = [t for t in plan if t["kind"] == "test"]
        assert sorted(t["clip_id"] for t in tests) == [r["id"] for r in rows]  # each once
        assert sum(t["kind"] == "catch" for t in plan) == sum(design.catch_counts(len(rows)))
        # within a rater: X is A in half of the trials, each side at each position half
        assert sum(t["sources"]["X"] == "a" for t in tests) == 6
        assert sum(t["expected"] == "A" for t in tests) == 6
        for t in tests:
            assert t["expected"] == ("A" if t["sources"]["A"] == t["sources"]["X"] else "B")
            # X and its match: two tiles of the trial's one stream
            assert t["shown"]["tiles"]["X"] != t["shown"]["tiles"][t["expected"]]
        seq = [level[t["clip_id"]] for t in tests]
        assert seq != sorted(seq) and seq != sorted(seq, reverse=True)
        # interleaved: levels not in blocks (some level change between neighbours >= 6 times)
        assert sum(a != b for a, b in zip(seq, seq[1:])) >= 6
        for t in tests:
            arrangements[(t["clip_id"], t["shown"]["media"])] += 1
    # every 4 consecutive raters get each (clip, level) in all 4 files: 8 raters, twice
    assert set(arrangements.values()) == {2} and len(arrangements) == 4 * len(rows)
    # orders differ between raters; the page is told "abx"
    assert len({tuple(t["clip_id"] for t in p) for p in plans}) == len(plans)
    assert design.page_protocol("threshold") == "abx"
    assert design.ANSWERS["threshold"] == design.ANSWERS["abx"]


# -- end to end ----------------------------------------------------------------------------------


def test_threshold_study_end_to_end_through_the_app(env, browser, cli, tmp_path):
    """Scripted raters whose accuracy depends on the level: one through Chromium on the real
    server, the others through the rater service the server uses. Then the admin page shows
    the psychometric curve, `study results --json` has the threshold and the headroom, the CSVs
    carry the levels, `study gate` writes a gate and `compare` accepts it."""
    db, sid = env["db"], env["sid"]
    tokens = [r["token"] for r in study.invite(db, sid, RATERS)]
    rng = np.random.default_rng(17)
    pick = scripted(env, rng)
    server = Server(db).start()
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    try:
        # rater 1 in the browser: the rater page shows plain ABX trials
        state = open_page(page, server.url, tokens[0])
        seen = 0
        while state["trial"] is not None:
            t = state["trial"]
            assert t["protocol"] == "abx" and sorted(t["tiles"]) == ["A", "B", "X"]
            assert "level" not in json.dumps(t)
            page.wait_for_function(ENABLED, timeout=30000)
            state = answer(page, pick(t), "click" if seen % 2 else "key")
            assert "error" not in state, state
            seen += 1
        page.wait_for_selector("#done:not([hidden])")
        assert seen == 2 * len(LEVELS) + sum(design.catch_counts(2 * len(LEVELS)))
        # the others through the service, interim until the last one finishes
        clock = study.FakeClock()
        with study.RaterService(db, clock=clock) as svc:
            for k, tok in enumerate(tokens[1:], 2):
                rate(svc, tok, pick, clock)
                if k == RATERS - 1:
                    res = study.results(db, sid, reps=100)
                    assert res["status"] == "interim" and "threshold" not in res
                    interim = list(csv.DictReader(study.summary_csv(res).splitlines()))
                    assert [(r["scope"], r["status"], r["threshold"]) for r in interim] == [
                        ("pooled", "interim", "")
                    ]  # no figure before the end
                    code, _, err = cli(
                        "study", "gate", "--db", db, "--study", sid, "--out", tmp_path / "early.yaml"
                    )
                    assert code == 2 and not (tmp_path / "early.yaml").exists()
                    assert_one_line_error(err, f"--study {sid}", "complete", "interim")
        # the admin page: verdict with the threshold, the curve and the accuracy-vs-LPIPS plot
        page.goto(f"{server.url}/admin/")
        page.wait_for_selector("input[type=password]", timeout=30000)
        text = admin_results(page, sid, ADMIN_PASSWORD, pattern="verdict:", timeout_ms=90000)
        assert "THRESHOLD MEASURED" in text and "headroom" in text, text
        page.wait_for_selector("#curve img, #curve svg, #curve canvas", timeout=30000)
        page.wait_for_selector("#lpips-plot img, #lpips-plot svg, #lpips-plot canvas", timeout=30000)
        table = page.inner_text("#per-clip")  # the points per (clip, level)
        assert all(job in table for job in env["config"]["threshold"]["reference"]), table
    finally:
        ctx.close()
        server.stop()
    # the results as JSON and CSV
    out_csv = tmp_path / "thr.csv"
    code, out, err = cli(
        "study", "results", "--db", db, "--study", sid, "--json", "--reps", "200", "--csv", out_csv
    )
    assert code == 0, err
    res = json.loads(out)
    a = res["threshold"]
    assert res["status"] == "complete" and res["raters_included"] == RATERS
    pooled = a["pooled"]
    xs = {lv: [p["x"] for p in pooled["points"] if p["level"] == lv] for lv in LEVELS}
    # the scripted raters cross 75% between levels 2 and 8: so does the fitted threshold
    assert max(xs[2.0]) < pooled["threshold"] < max(xs[8.0]), (pooled["threshold"], xs)
    lo, hi = pooled["ci"]
    assert lo is not None and hi is not None and lo <= pooled["threshold"] <= hi
    assert sum(p["n"] for p in pooled["points"]) == RATERS * 2 * len(LEVELS) == pooled["n_trials"]
    ref = a["reference"]
    assert ref == pytest.approx(
        np.exp(np.mean(np.log([v["lpips"] for v in env["config"]["threshold"]["reference"].values()]))),
        rel=1e-6,
    )
    assert a["headroom"]["value"] == pytest.approx(pooled["threshold"] / ref, rel=1e-6)
    assert a["headroom"]["value"] > 2
    assert set(a["clips"]) == set(env["config"]["threshold"]["reference"])
    for p in res["levels"]:  # per (clip, level): the scripted accuracy shows
        assert p["n"] == RATERS
    acc = {lv: np.mean([p["accuracy"] for p in res["levels"] if p["level"] == lv]) for lv in LEVELS}
    assert acc[8.0] == 1.0 and acc[1.0] < 0.8
    # the admin page's figures: the curve marks the threshold, its interval and the real
    # difference; accuracy against LPIPS has one point per (clip, level)
    from evalkit.app.admin import curve_plot, lpips_plot

    ax = curve_plot(res).axes[0]
    vlines = {round(float(ln.get_xdata()[0]), 12) for ln in ax.get_lines() if len(set(ln.get_xdata())) == 1}
    assert {round(pooled["threshold"], 12), round(ref, 12)} <= vlines
    assert ax.collections[0].get_offsets().shape[0] == len(pooled["points"])
    assert lpips_plot(res).axes[0].collections[0].get_offsets().shape[0] == 2 * len(LEVELS)
    abx_like = {
        "status": "complete",
        "protocol": "abx",
        "per_clip": [
            {"job": "j1", "lpips_mean": 0.01, "accuracy": 0.6, "ratings": 10},
            {"job": "j2", "lpips_mean": 0.05, "accuracy": 0.9, "ratings": 10},
            {"job": "j3", "lpips_mean": None, "accuracy": 0.5, "ratings": 10},
        ],
    }
    assert lpips_plot(abx_like).axes[0].collections[0].get_offsets().shape[0] == 2
    assert curve_plot(abx_like) is None
    raw = list(csv.DictReader(open(out_csv, newline="")))
    test_rows = [r for r in raw if r["kind"] == "test"]
    assert len(test_rows) == RATERS * 2 * len(LEVELS)
    assert {float(r["level"]) for r in test_rows} == set(LEVELS)
    assert all(float(r["stimulus_lpips"]) > 0 for r in test_rows)
    summ = list(csv.DictReader(open(out_csv.with_name("thr.summary.csv"), newline="")))
    assert Counter(r["scope"] for r in summ) == {"pooled": 1, "clip": 2, "level": 8}
    assert float(summ[0]["threshold"]) == pytest.approx(pooled["threshold"])
    # a pilot cannot set a gate: an interval wider than the stated factor is refused (one
    # line, nothing written) unless the owner overrides
    ratio = hi / lo
    wide = tmp_path / "wide.yaml"
    code, out, err = cli(
        "study",
        "gate",
        "--db",
        db,
        "--study",
        sid,
        "--out",
        wide,
        "--reps",
        "200",
        "--max-interval-ratio",
        f"{ratio * 0.99:.6g}",
    )
    assert code == 2 and not wide.exists()
    assert_one_line_error(err, f"--study {sid}", "interval at most", "--allow-wide-interval")
    code, out, err = cli(
        "study",
        "gate",
        "--db",
        db,
        "--study",
        sid,
        "--out",
        wide,
        "--reps",
        "200",
        "--max-interval-ratio",
        f"{ratio * 0.99:.6g}",
        "--allow-wide-interval",
    )
    assert code == 0 and wide.exists(), err
    # the gate set by people, and compare gated on it (this test's design is pilot-sized, 2
    # clips: an interval wider than the default 4x is refused unless the owner overrides)
    gate = tmp_path / "gate.yaml"
    args = (
        "study",
        "gate",
        "--db",
        db,
        "--study",
        sid,
        "--out",
        gate,
        "--reps",
        "200",
        "--safety-factor",
        "2",
    )
    code, out, err = cli(*args)
    if ratio > 4:
        assert code == 2 and not gate.exists()
        assert_one_line_error(err, "at most 4x wide", f"({ratio:.3g}x")
        code, out, err = cli(*args, "--allow-wide-interval")
    assert code == 0, err
    g = yaml.safe_load(gate.read_text())
    assert g["lpips"]["mean"]["max"] == pytest.approx(pooled["threshold"] / 2)
    assert g["human_threshold"]["value"] == pytest.approx(pooled["threshold"])
    assert g["human_threshold"]["study"] == str(sid)
    summary = json.loads((env["report"] / "summary.json").read_text())
    runs = [summary["runs"][k]["path"] for k in ("a", "b")]
    code, out, err = cli(
        "compare", *runs, "--out", tmp_path / "gated", "--gate", gate, "--no-temporal", "--device", "cpu"
    )
    assert code == 0, (out, err)  # the real difference is far below the gate
    verdict = json.loads((tmp_path / "gated" / "summary.json").read_text())["gate"]
    assert verdict["verdict"] == "pass", verdict
