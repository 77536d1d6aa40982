"""Threshold analysis (evalkit.study.psychometric): the fit recovers known psychometric functions,
the clustered-bootstrap intervals cover the truth at their nominal rate (a fast seeded slice of
benchmarks/bench_threshold_sim.py), degenerate data give bounds and notes instead of numbers,
and a gate written from an analysis is read back, gates a compare report and is drawn on its
per-frame LPIPS plots."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from evalkit.study import psychometric as P
from evalkit.study import simulate as PS
from evalkit.study.psychometric import ThresholdError

LEVELS = (1, 2, 4, 8, 16, 32)


def _trials(fn, *, raters=6, clips=3, levels=(1, 2, 4, 8), repeats=3, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for r in range(raters):
        for c in range(clips):
            for lv in levels:
                for _ in range(repeats):
                    out.append(
                        {
                            "rater": f"r{r}",
                            "clip": f"c{c}",
                            "level": lv,
                            "x": 0.01 * lv * (1 + c / 10),
                            "correct": fn(rng, lv),
                        }
                    )
    return out


REF = {"c0": 0.01, "c1": 0.011, "c2": 0.012}


# -- the model and the fit -------------------------------------------------------------------


@pytest.mark.parametrize("model", P.MODELS)
def test_threshold_is_where_a_rater_without_lapses_is_75_percent_right(model):
    for lapse in (0.0, 0.04):
        p = P.psychometric(0.03, 0.03, 2.5, lapse, model=model)
        assert p == pytest.approx(0.75 - lapse / 2)
    x = np.geomspace(1e-4, 10, 50)
    p = P.psychometric(x, 0.03, 2.5, 0.02, model=model)
    assert np.all(np.diff(p) >= 0) and p[0] == pytest.approx(0.5, abs=1e-3)
    assert p[-1] == pytest.approx(0.98, abs=1e-3)


@pytest.mark.parametrize(
    "model, threshold, slope, lapse",
    [("weibull", 0.05, 2.0, 0.03), ("weibull", 0.012, 4.0, 0.0), ("logistic", 0.08, 1.5, 0.05)],
)
def test_the_fit_recovers_a_known_function_from_many_trials(model, threshold, slope, lapse):
    x = 0.01 * np.asarray(LEVELS, float) ** 0.9
    n = np.full(x.size, 20_000)
    k = np.round(n * P.psychometric(x, threshold, slope, lapse, model=model))  # expected counts
    fit = P.fit_psychometric(x, n, k, model=model)
    assert fit["threshold"] == pytest.approx(threshold, rel=2e-3)
    assert fit["slope"] == pytest.approx(slope, rel=2e-2)
    assert fit["lapse"] == pytest.approx(lapse, abs=2e-3)
    assert fit["deviance"] < 0.1 and fit["at_bound"] is None


def test_analysis_recovers_the_threshold_of_a_big_nearly_noiseless_study():
    rng = np.random.default_rng(5)
    s = PS.simulate_trials(rng, raters=30, clips=6, repeats=12, rater_sd=0.05, clip_sd=0.05, lapse_max=0.02)
    a = P.threshold_analysis(s["trials"], reference=s["reference"], n_boot=200, n_gof=50)
    pooled = a["pooled"]
    assert pooled["threshold"] == pytest.approx(s["truth"], rel=0.05)
    lo, hi = pooled["ci"]
    assert lo < s["truth"] < hi and hi / lo < 1.3
    assert a["headroom"]["value"] == pytest.approx(pooled["threshold"] / a["reference"])
    assert a["reference"] == pytest.approx(math.exp(np.mean(np.log(list(s["reference"].values())))))
    for c, blk in a["clips"].items():
        assert blk["threshold"] == pytest.approx(s["clip_truth"][c], rel=0.12)
        assert blk["ci"][0] < s["clip_truth"][c] < blk["ci"][1]
        assert blk["n_raters"] == 30 and blk["reference"] == s["reference"][c]
    assert pooled["n_trials"] == len(s["trials"]) and pooled["n_clips"] == 6
    assert pooled["gof"]["df"] == 36 - 3 and 0 < pooled["gof"]["p"] <= 1
    assert len(pooled["points"]) == 36 and len(pooled["curve"]) == 61
    json.dumps(a, allow_nan=False)


# -- the Monte Carlo slice -------------------------------------------------------------------


def _not_undercovering(res, confidence=0.95, alpha=1e-3):
    """The covered count is not implausibly low for the nominal rate (one-sided binomial test
    at ``alpha``), nor the interval absurdly wide (coverage 1.0 in a large sample)."""
    n, k = res["n"], res["covered"]
    assert binom.cdf(k, n, confidence) > alpha, f"coverage {k}/{n} below {confidence}"


@pytest.mark.slow  # a Monte Carlo slice
def test_intervals_cover_known_thresholds_at_the_nominal_rate():
    """Heterogeneous raters (log threshold sd 0.3) and clips (0.3), lapses up to 0.04, 8 raters
    x 3 clips x 6 levels x 2 repeats: the 95% intervals (pooled: two-way clustered bootstrap;
    per clip: raters resampled, expanded percentile) cover the population truth at 95% within
    binomial error, and the pooled estimate is nearly unbiased (log scale)."""
    res = PS.simulate_coverage(studies=100, raters=8, clips=3, repeats=2, n_boot=100, seed=11)
    for part in ("pooled", "clips"):
        _not_undercovering(res[part])
        assert res[part]["in_range"] >= 0.95
    assert res["pooled"]["coverage"] < 1.0
    assert abs(res["pooled"]["log_bias_mean"]) < 0.08
    assert res["pooled"]["log_rmse"] < 0.4


def test_the_monte_carlo_runs_the_analysis_own_rule():
    """simulate_coverage reproduces threshold_analysis's intervals for the same study and
    seed (same draws, same fit, same interval rule): what the Monte Carlo measures is what
    users get."""
    res = PS.simulate_coverage(studies=3, raters=6, clips=3, repeats=2, n_boot=120, seed=3, keep=True)
    d = res["data"]
    for s in range(3):
        trials = PS.trials_from_counts(d["n"][s], d["k"][s], d["x"][s], d["levels"])
        ref = {f"c{c:03d}": float(d["ref"][s, c]) for c in range(3)}
        a = P.threshold_analysis(trials, reference=ref, n_boot=120, seed=int(d["seeds"][s]), n_gof=0)
        t, ci, bound = res["pooled"]["rows"][s]
        assert a["pooled"]["bound"] == bound
        for got, want in zip(a["pooled"]["ci"], ci):
            assert (got is None) == (want is None)
            if got is not None:
                assert got == pytest.approx(want, rel=1e-3)
        for c in range(3):
            t, ci, bound = res["clips"]["rows"][s * 3 + c]
            blk = a["clips"][f"c{c:03d}"]
            assert blk["bound"] == bound
            for got, want in zip(blk["ci"], ci):
                assert (got is None) == (want is None)
                if got is not None:
                    assert got == pytest.approx(want, rel=1e-3)


# -- degenerate data and bad input -----------------------------------------------------------


def test_all_correct_gives_an_upper_bound_and_no_gate():
    a = P.threshold_analysis(_trials(lambda r, lv: True), reference=REF, n_boot=100, n_gof=20)
    pooled = a["pooled"]
    assert pooled["threshold"] is None and pooled["bound"] == "upper"
    assert pooled["ci"][0] is None and pooled["ci"][1] >= 0.01  # never below the range
    assert a["headroom"]["value"] is None
    assert any("below the smallest lpips shown" in n for n in a["notes"])
    json.dumps(a, allow_nan=False)
    with pytest.raises(ThresholdError, match="below the smallest"):
        P.gate_from_analysis(a, study="s")


def test_chance_everywhere_gives_a_lower_bound_and_a_conservative_gate():
    a = P.threshold_analysis(
        _trials(lambda r, lv: bool(r.random() < 0.5), repeats=4), reference=REF, n_boot=100, n_gof=20
    )
    pooled = a["pooled"]
    assert pooled["threshold"] is None and pooled["bound"] == "lower"
    assert pooled["ci"][1] is None and pooled["ci"][0] <= 0.012 * 8  # never above the range
    assert any("a lower bound only" in n for n in a["notes"])
    assert not any("lapse rate at its bound" in n for n in a["notes"])
    text = P.gate_from_analysis(a, study="chance")
    assert "bound: lower" in text and "lower bound" in text
    json.dumps(a, allow_nan=False)


def test_undefined_fits_are_none_with_a_note():
    a = P.threshold_analysis([], reference={})
    assert a["pooled"]["threshold"] is None and a["notes"]
    one_level = _trials(lambda r, lv: True, levels=(4,), clips=1)
    a = P.threshold_analysis(one_level, reference=REF, n_boot=50)
    assert a["pooled"]["threshold"] is None and a["clips"]["c0"]["threshold"] is None
    assert any("fewer than 2 levels" in n for n in a["notes"])
    json.dumps(a, allow_nan=False)
    with pytest.raises(ThresholdError, match="no threshold"):
        P.gate_from_analysis(a, study="s")


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda t: t.pop("x"), "trial 0: field 'x' missing"),
        (lambda t: t.update(x=0.0), "trial 0: field 'x': expected a positive number, found 0.0"),
        (lambda t: t.update(x="a"), "field 'x': expected a positive number, found 'a'"),
        (lambda t: t.update(correct="yes"), "field 'correct': expected true or false"),
        (lambda t: t.update(clip="zz"), "reference: clip 'zz': expected a positive number, found None"),
    ],
)
def test_bad_trials_are_one_line_errors_naming_the_field(change, needle):
    trials = _trials(lambda r, lv: True)
    change(trials[0])
    with pytest.raises(ThresholdError) as e:
        P.threshold_analysis(trials, reference=REF, n_boot=10)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_gate_arguments():
    a = P.threshold_analysis(
        _trials(lambda r, lv: lv >= 4 or bool(r.random() < 0.5)), reference=REF, n_boot=50, n_gof=0
    )
    with pytest.raises(ThresholdError, match="safety factor: expected a number >= 1, found 0.5"):
        P.gate_from_analysis(a, study="s", safety_factor=0.5)
    with pytest.raises(ThresholdError, match="aggregate: expected mean, p95 or worst"):
        P.gate_from_analysis(a, study="s", aggregate="median")


# -- the gate, round trip through compare -------------------------------------------------------


@pytest.fixture(scope="module")
def analysis():
    rng = np.random.default_rng(2)
    s = PS.simulate_trials(rng, raters=8, clips=3, repeats=2)
    return P.threshold_analysis(s["trials"], reference=s["reference"], n_boot=200, n_gof=50)


def test_gate_text_round_trips_through_the_gate_reader(analysis, tmp_path):
    from evalkit.formats.gate import load_gate
    from evalkit.metrics.catalogue import keys

    text = P.gate_from_analysis(analysis, study="study-7", safety_factor=2.5)
    (tmp_path / "gate.yaml").write_text(text)
    gate = load_gate(tmp_path / "gate.yaml", metrics=keys(compares=True), ratio_metrics=keys(ratio=True))
    t = analysis["pooled"]["threshold"]
    assert gate.absolute == {"lpips": {"mean": {"max": pytest.approx(t / 2.5)}}}
    h = gate.human_threshold
    assert h["value"] == pytest.approx(t) and h["study"] == "study-7"
    assert h["ci"] == pytest.approx(analysis["pooled"]["ci"])
    assert (h["safety_factor"], h["criterion"], h["metric"]) == (2.5, 0.75, "lpips")
    assert text.startswith("# Gate set by people") and "headroom" in text


@pytest.mark.parametrize(
    "edit, needle",
    [
        (("value: ", "value: -"), "field 'human_threshold.value': expected a positive number"),
        (
            ("metric: lpips\n  value", "metric: loudness\n  value"),
            "field 'human_threshold.metric': unknown metric 'loudness'",
        ),
        (("ci: [", "ci: [1.0, "), "field 'human_threshold.ci': expected two entries"),
        (
            ("safety_factor: 2.0", "safety_factor: 0.5"),
            "field 'human_threshold.safety_factor': expected a number >= 1",
        ),
        (
            ("  criterion: 0.75\n", "  criterion: 0.75\n  colour: red\n"),
            "field 'human_threshold.colour': unknown key",
        ),
        (('study: "s"', "study: 7"), "field 'human_threshold.study': expected a study name"),
    ],
)
def test_bad_human_threshold_blocks_name_the_field(analysis, tmp_path, edit, needle):
    from evalkit.formats.gate import GateError, load_gate
    from evalkit.metrics.catalogue import keys

    text = P.gate_from_analysis(analysis, study="s")
    assert edit[0] in text
    (tmp_path / "gate.yaml").write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(GateError) as e:
        load_gate(tmp_path / "gate.yaml", metrics=keys(compares=True), ratio_metrics=keys(ratio=True))
    assert needle in str(e.value) and "gate.yaml" in str(e.value)


def _purple_pixels(png: bytes) -> int:
    from PIL import Image

    from evalkit.compare.report import THRESHOLD_COLOR

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    want = np.array([int(THRESHOLD_COLOR[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - want).max(-1) <= 12).sum())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of one smoke clip by the fake Invert renderer, fp32 and bf16 (its bf16 frames
    carry extra noise, so they differ)."""
    from conftest import DATASETS

    from evalkit.render.driver import render_suite

    root = tmp_path_factory.mktemp("runs")
    clip = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
    (root / "suite.yaml").write_text(
        f"schema_version: 1\nname: thr\nclips:\n  - {{id: pan, path: {clip}}}\nprompts: [p]\nseeds: [0]\n"
    )
    render_suite(
        root / "suite.yaml",
        ["cpu", "cpu,dtype=bf16"],
        root,
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )
    return root / "cpu", root / "cpu_dtype-bf16"


def test_a_gate_set_by_people_gates_a_compare_report_and_is_drawn(analysis, runs, tmp_path, cli):
    """Write the gate from an analysis, gate a real compare with it: the verdict follows the
    bound, summary.json and the HTML gate section carry the threshold, and every per-frame
    LPIPS plot has the threshold's line (its colour's pixels), which a report gated without it
    lacks."""
    (tmp_path / "gate.yaml").write_text(P.gate_from_analysis(analysis, study="s-1"))
    out = tmp_path / "r"
    code, _, err = cli(
        "compare", *runs, "--out", out, "--gate", tmp_path / "gate.yaml", "--quiet", "--no-temporal"
    )
    summary = json.loads((out / "summary.json").read_text())
    bound = analysis["pooled"]["threshold"] / 2
    passed = summary["aggregates"]["lpips"]["mean"] <= bound
    assert code == (0 if passed else 1), err
    gate = summary["gate"]
    assert gate["verdict"] == ("pass" if passed else "fail")
    assert gate["human_threshold"]["value"] == pytest.approx(analysis["pooled"]["threshold"])
    html = (out / "index.html").read_text()
    assert "Gate set by people" in html and "s-1" in html
    assert f"{analysis['pooled']['threshold']:.4g}" in html
    timelines = sorted((out / "img").glob("*_timeline.png"))
    assert timelines
    with_line = [_purple_pixels(p.read_bytes()) for p in timelines]
    assert min(with_line) > 300  # a dashed line across the plot, and a dotted one

    (tmp_path / "plain.yaml").write_text("lpips: {mean: {max: 1.0}}\n")
    code, _, err = cli(
        "compare",
        *runs,
        "--out",
        tmp_path / "r2",
        "--gate",
        tmp_path / "plain.yaml",
        "--quiet",
        "--no-temporal",
    )
    assert code == 0, err
    assert "human_threshold" not in json.loads((tmp_path / "r2" / "summary.json").read_text())["gate"]
    assert "Gate set by people" not in (tmp_path / "r2" / "index.html").read_text()
    without = [
        _purple_pixels(p.read_bytes()) for p in sorted((tmp_path / "r2" / "img").glob("*_timeline.png"))
    ]
    assert max(without) < 20


def test_a_few_very_different_clips_get_a_note_on_the_pooled_interval():
    """Below FEW_CLIPS clips whose thresholds spread widely, the pooled interval undercovers
    (benchmark section 5): the analysis says so; alike clips get no such note."""

    def run(clip_sd, seed):
        rng = np.random.default_rng(seed)
        s = PS.simulate_trials(
            rng,
            raters=10,
            clips=4,
            repeats=4,
            rater_sd=0.1,
            clip_sd=clip_sd,
            reference_sd=0.0,
            threshold=0.03,
        )
        return P.threshold_analysis(s["trials"], reference=s["reference"], n_boot=50, n_gof=0)

    spread = run(1.0, 2)
    ts = [b["threshold"] for b in spread["clips"].values()]
    assert None not in ts and np.std(np.log(ts), ddof=1) > P.CLIP_SPREAD_NOTE
    assert any("thresholds differ a lot" in n for n in spread["notes"])
    alike = run(0.0, 2)
    assert not any("thresholds differ a lot" in n for n in alike["notes"])
