"""evalkit compare: report files, agreement with `evalkit metrics`, floors, gates, bad input."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit.compare.aggregate import floor_ratio
from evalkit.render.driver import render_suite

SMOKE = DATASETS / "smoke" / "suite.yaml"
INVERT = "evalkit.testing.renderers:Invert"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The smoke suite through the fake renderer (the diffusers renderer's own fp32/bf16 runs are
    test_render's subject): fp32, bf16 (a little extra noise), and a seed-shifted fp32 whose
    seed noise (0-31 code values) is far above the bf16 difference."""
    root = tmp_path_factory.mktemp("runs")
    opts = {"noise": "32"}
    render_suite(SMOKE, ["cpu", "cpu,dtype=bf16"], root, renderer=INVERT, options=opts, progress=False)
    render_suite(SMOKE, ["cpu"], root, renderer=INVERT, options=opts, seed_offset=1, progress=False)
    return {"a": root / "cpu", "b": root / "cpu_dtype-bf16", "seed": root / "cpu_seed+1"}


@pytest.fixture
def copies(runs, tmp_path):
    """Private copies of the runs, for tests that damage them."""
    return {k: shutil.copytree(v, tmp_path / k) for k, v in runs.items()}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _mean_tolerances(clip_a, clip_b, m) -> dict:
    import numpy as np
    from numerics import ab_tolerance, gamma, mean_tolerance
    from test_metrics import lpips_tol, luma_planes, ssim_ab_tol, tlp_tol

    from evalkit.video import read_frames

    a, _ = read_frames(clip_a)
    b, _ = read_frames(clip_b)
    n, h, w = a.shape[:3]
    p = h * w
    lp = lpips_tol(a, b)
    # a CSV cell holds the shortest repr of a float64 (exact); a mean of n per-frame values adds
    # gamma(n) of itself
    per_mean = {
        "lpips": lp.mean(),
        "ssim": ssim_ab_tol(luma_planes(a), luma_planes(b)).mean(),
        "tlp": tlp_tol(a, b).mean(),
        "psnr": 0.0,
        "tof": mean_tolerance(m["tof"], p, ops=4),
        "warp_error_a": mean_tolerance(m["warp_error_a"], 3 * p, ops=1),
        "flicker": ab_tolerance(4 * gamma(16 * 16 + 5) * 255) + mean_tolerance(m["flicker"], p // 256),
    }
    tol = {k: v + ab_tolerance(gamma(n) * abs(m[k])) for k, v in per_mean.items()}
    tol["lpips_frames"] = np.asarray(lp)
    return tol


def test_end_to_end_report_agrees_with_evalkit_metrics(runs, tmp_path, cli):
    out = tmp_path / "report"
    code, stdout, err = cli(
        "compare", runs["a"], runs["b"], "--floor", runs["seed"], "--out", out, "--quiet", "--device", "cpu"
    )
    assert code == 0, err
    for name in ("frames.csv", "clips.csv", "summary.json", "index.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["suite"]["name"] == "smoke"
    assert summary["fingerprint_differences"]["dtype"] == ["fp32", "bf16"]
    clips = read_csv(out / "clips.csv")
    frames = read_csv(out / "frames.csv")
    assert len(clips) == 2 and all(c["status"] == "compared" for c in clips)
    assert len(frames) == 16
    import pandas as pd

    assert pd.read_csv(out / "frames.csv")["lpips"].notna().all()
    assert pd.read_csv(out / "clips.csv")["lpips_mean"].notna().all()
    for row in clips:
        clip_a = runs["a"] / "clips" / f"{row['job']}.mkv"
        clip_b = runs["b"] / "clips" / f"{row['job']}.mkv"
        code, js, err = cli("metrics", clip_a, clip_b, "--json", "--device", "cpu")
        assert code == 0, err
        m = json.loads(js)
        # the same frames through the same evaluator, in other batches: each metric within its
        # rounding bound (tests/numerics.py, as in test_metrics), means of per-frame bounds
        tol = _mean_tolerances(clip_a, clip_b, m)
        for key in ("lpips", "ssim", "psnr", "tlp", "tof", "flicker", "warp_error_a"):
            assert abs(float(row[f"{key}_mean"]) - m[key]) <= tol[key], key
        worst = max(m["per_frame"]["lpips"])
        assert abs(float(row["lpips_worst"]) - worst) <= tol["lpips_frames"].max()
    # the floor ratio is the cross-backend aggregate over the seed floor's
    seed = summary["floors"]["seed"]
    assert seed["seed_offset"] == 1 and seed["jobs_compared"] == 2
    ratio = summary["floor_ratios"]["seed"]["lpips"]["mean"]
    assert ratio == pytest.approx(
        summary["aggregates"]["lpips"]["mean"] / seed["aggregates"]["lpips"]["mean"]
    )
    assert 0 < ratio < 1  # bf16 noise is far below what another seed changes
    assert "LPIPS mean / seed floor" in stdout
    # the headline: the largest ratio of every family, against the seed floor, printed and kept
    head = summary["headline"]
    ratios = summary["floor_ratios"]["seed"]
    largest = max(("lpips", "ssim", "psnr", "tlp", "tof", "flicker"), key=lambda k: ratios[k]["mean"])
    assert head["families"]["fidelity"]["ratio"] < 1 and ratios[largest]["mean"] < 1
    # bf16 against fp32 differs less than another seed in every pixel metric: the headline says
    # it is below what the floor resolves, with B's and the floor's PSNR (issue 46 item 3)
    assert head["below_floor"] is True and head["metric"] == "psnr"
    assert head["ratio"] == ratios["psnr"]["mean"] < 1
    assert head["text"].startswith("below what the seed floor resolves: PSNR ")
    assert head["text"] in stdout
    assert {"fidelity", "temporal"} <= set(head["families"])


def test_headline_names_the_worst_family_against_the_floor():
    from evalkit.compare.aggregate import headline

    # a brightness flicker: LPIPS looks better than the floor, flicker 39 times worse
    ratios = {
        "seed": {
            "lpips": {"mean": 0.099},
            "ssim": {"mean": 0.5},
            "psnr": {"mean": 1.2},
            "tlp": {"mean": 0.8},
            "tof": {"mean": None},
            "flicker": {"mean": 39.0},
        },
        "rerender": {"lpips": {"mean": 2.0}},
    }
    h = headline(ratios)
    assert (h["floor"], h["family"], h["metric"], h["ratio"]) == ("seed", "temporal", "flicker", 39.0)
    assert h["text"].startswith(
        "worst: flicker 39x the seed floor's (brightness flickers: people notice flicker"
    )
    assert "fidelity: PSNR 1.2x the seed floor's" in h["text"]
    # the gate's floor when it names one; a zero floor is inf; nothing above 1 says so
    assert headline(ratios, "rerender")["text"].startswith("worst: LPIPS 2x the rerender floor's")
    assert "LPIPS infx" in headline({"seed": {"lpips": {"mean": float("inf")}}})["text"]
    assert headline({"seed": {"lpips": {"mean": 1.0}}})["text"].startswith("within the seed floor")
    assert headline({}) is None and headline({"seed": {"tof": {"mean": None}}}) is None


def test_every_ratio_and_clip_finding_is_one_sentence_in_words():
    from evalkit.compare.aggregate import clip_finding, ratio_sentence, with_offsets
    from evalkit.study.psychometric import headroom_sentence

    assert ratio_sentence("flicker", 39.0, "seed") == (
        "flicker 39x the seed floor's: B differs from A 39x more than the seed floor run does; "
        "brightness flickers: people notice flicker"
    )
    assert ratio_sentence("lpips", 0.099, "seed").endswith(
        "B differs from A 10.1x less than the seed floor run does (within what the pipeline varies by itself)"
    )
    assert "does not differ from A at all" in ratio_sentence("lpips", float("inf"), "rerender")
    # a clip without a floor says so; an offset ranks above any ratio and is named first
    bare = clip_finding("j1", {}, lpips_mean=0.02)
    assert bare["text"] == "j1: LPIPS mean 0.02, with no floor to read it against"
    shifted = clip_finding("j2", {"seed": {"lpips": {"mean": 0.5}}}, offset={"offset": -2})
    assert shifted["text"].startswith("j2: B is 2 frames early (offset -2; compared at that offset)")
    assert "once aligned, LPIPS 0.5x the seed floor's" in shifted["text"]
    big = clip_finding("j3", {"seed": {"lpips": {"mean": 50.0}}})
    assert shifted["rank"] > big["rank"] > bare["rank"]
    assert with_offsets(None, [bare, big]) is None
    assert with_offsets(None, [shifted])["text"].startswith("temporal offset: 1 clip out of step")
    # the headroom: threshold / real difference, in words
    assert headroom_sentence(0.11) == (
        "headroom 0.11x: the real difference is 9.1x the human threshold (75% correct in ABX), people see it"
    )
    assert headroom_sentence(3.0).startswith("headroom 3x: the real difference would have to grow 3x")


def test_floor_ratio_conventions():
    cross = {
        "lpips": {"mean": 0.02, "p95": 0.04, "worst": 0.05},
        "ssim": {"mean": 0.99, "p95": 0.98, "worst": 0.97},
        "psnr": {"mean": 40.0, "p95": 38.0, "worst": float("inf")},
    }
    floor = {
        "lpips": {"mean": 0.2, "p95": 0.0, "worst": 0.5},
        "ssim": {"mean": 0.9, "p95": 0.8, "worst": 0.7},
        "psnr": {"mean": 30.0, "p95": 28.0, "worst": 20.0},
    }
    r = floor_ratio(cross, floor)
    assert r["lpips"]["mean"] == pytest.approx(0.1)
    assert r["lpips"]["p95"] == float("inf")  # a zero floor
    assert r["ssim"]["mean"] == pytest.approx(0.01 / 0.1)
    assert r["psnr"]["mean"] == pytest.approx(0.1)  # 10 dB better = 1/10 of the MSE
    assert r["psnr"]["worst"] == 0.0


@pytest.mark.parametrize(
    "gate, code, reason",
    [
        (
            "lpips: {mean: {max: 0.5}, worst: {max: 0.9}}\npsnr: {mean: {min: 20}}\n"
            "floor_ratio: {lpips: {mean: {max: 0.5}}}\n",
            0,
            None,
        ),
        ("psnr: {mean: {min: 99}}\n", 1, "psnr mean = "),
        ("floor_ratio: {lpips: {mean: {max: 0.0000001}}}\n", 1, "lpips mean / seed floor = "),
    ],
)
def test_gate_pass_and_fail_exit_codes(runs, tmp_path, cli, gate, code, reason):
    (tmp_path / "gate.yaml").write_text(gate)
    out = tmp_path / "r"
    got, stdout, err = cli(
        "compare",
        runs["a"],
        runs["b"],
        "--floor",
        runs["seed"],
        "--out",
        out,
        "--gate",
        tmp_path / "gate.yaml",
        "--quiet",
        "--no-temporal",
    )
    assert got == code, err
    verdict = json.loads((out / "summary.json").read_text())["gate"]
    assert verdict["verdict"] == ("pass" if code == 0 else "fail")
    html = (out / "index.html").read_text()
    assert ("PASS" if code == 0 else "FAIL") in html
    if reason:
        assert any(r.startswith(reason) for r in verdict["reasons"])
        assert reason in stdout
    # each clip is judged by the gate alone too, in its sentence
    findings = json.loads((out / "summary.json").read_text())["clip_findings"]
    assert len(findings) == 2
    for f in findings:
        if reason:
            assert f["gate_failed"] and f["text"].split("; ")[-1].startswith(
                "over the gate on this clip alone: " + reason
            ), f["text"]
        else:
            assert f["gate_failed"] == [] and f["text"].endswith("; within the gate")
        assert f["text"] in stdout


@pytest.mark.slow  # Chromium
def test_report_html_renders_in_chromium(runs, tmp_path, cli, browser):
    out = tmp_path / "r"
    assert cli("compare", runs["a"], runs["b"], "--out", out, "--quiet")[0] == 0
    page = browser.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((out / "index.html").as_uri())
    page.wait_for_load_state("load")
    images = page.evaluate(
        "Array.from(document.images).map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])"
    )
    assert len(images) == 2 * 4  # per job: timeline, A, B, heatmap
    assert all(ok for _, ok in images), images
    assert errors == []
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    page.close()


# -- prompts that are markup, template syntax or mathtext; the caller's matplotlib backend ----

#: HTML, Jinja2 syntax and quotes: index.html shows them as text, never as markup or template
HOSTILE = "<img src=x onerror=alert(1)> & 'q' \"dq\" {{ 7 * 7 }} {% if true %}x{% endif %} {# c #}"
#: an even number of '$': matplotlib would parse it as mathtext (and fail on \foo{)
MATHTEXT = r"a $$ b, $\foo{ and $ c"


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    """A compare report of fake-rendered runs whose prompts are HOSTILE and MATHTEXT, written
    while the caller's matplotlib backend is "svg"; the backend after it is returned too."""
    import matplotlib

    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs

    root = tmp_path_factory.mktemp("hostile")
    clips = DATASETS / "smoke" / "clips"
    (root / "suite.yaml").write_text(
        "schema_version: 1\nname: hostile\nclips:\n"
        f"  - {{id: pan, path: {clips / 'astronaut_pan.mkv'}}}\n"
        f"  - {{id: obj, path: {clips / 'hubble_object.mkv'}}}\n"
        f"prompts: [{json.dumps(HOSTILE)}, {json.dumps(MATHTEXT)}]\nseeds: [0]\n"
    )
    render_suite(
        root / "suite.yaml",
        ["cpu", "cpu,dtype=bf16"],
        root / "runs",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        compare_runs(
            root / "runs" / "cpu",
            root / "runs" / "cpu_dtype-bf16",
            root / "report",
            device="cpu",
            metrics=MetricOptions(temporal=False),
            progress=False,
        )
        backend = matplotlib.get_backend()
    finally:
        matplotlib.use(before)
    return {"out": root / "report", "backend": backend}


def test_writing_a_report_leaves_the_matplotlib_backend_alone(hostile_report):
    # a notebook user's backend stays theirs: no matplotlib.use() and no pyplot in the library
    assert hostile_report["backend"] == "svg"


def html_text_and_images(path):
    """index.html as its text (entities decoded, whitespace collapsed) and its <img> srcs."""
    import re
    from html.parser import HTMLParser

    class Parser(HTMLParser):
        def __init__(self):
            super().__init__()
            self.text, self.images = [], []

        def handle_data(self, data):
            self.text.append(data)

        def handle_starttag(self, tag, attrs):
            if tag == "img":
                self.images.append(dict(attrs)["src"])

    p = Parser()
    p.feed(path.read_text())
    return re.sub(r"\s+", " ", "".join(p.text)), p.images


def test_prompts_with_html_and_template_syntax_are_escaped_text(hostile_report):
    out = hostile_report["out"]
    raw = (out / "index.html").read_text()
    text, images = html_text_and_images(out / "index.html")
    summary = json.loads((out / "summary.json").read_text())
    jobs = summary["jobs"]["compared"]
    assert len(jobs) == 4
    # the prompt is shown literally (not evaluated: no 49, no {% if %} taken), once per clip
    assert text.count(f"pan: {HOSTILE}") == 1 and text.count(f"obj: {HOSTILE}") == 1
    assert text.count(f"pan: {MATHTEXT}") == 1 and text.count(f"obj: {MATHTEXT}") == 1
    for literal in ("{{ 7 * 7 }}", "{% if true %}x{% endif %}", "{# c #}"):
        assert raw.count(literal) == 2, literal
    # ... and escaped: the only images are the report's own (timeline, A, B, heatmap per job)
    assert "<img src=x" not in raw and "&lt;img src=x onerror=alert(1)&gt;" in raw
    assert len(images) == 4 * len(jobs) and all(src.startswith("img/job") for src in images)
    for src in images:
        assert (out / src).is_file(), src


def test_prompts_with_dollar_signs_are_not_mathtext(hostile_report):
    from PIL import Image

    out = hostile_report["out"]
    rows = {r["job"]: r for r in read_csv(out / "clips.csv")}
    assert sum(r["prompt"] == MATHTEXT for r in rows.values()) == 2
    assert all(r["status"] == "compared" for r in rows.values())
    timelines = sorted((out / "img").glob("*_timeline.png"))
    assert len(timelines) == 4
    for p in timelines:
        with Image.open(p) as im:
            assert im.size == (700, 240)
    # written atomically: no temporary files left next to the outputs
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp")]


# -- temporal alignment (evalkit.compare.alignment) ---------------------------------------------


def _late_by_one(run, job: str) -> None:
    """Job ``job``'s clip in ``run`` made one frame late (its first frame twice, its last one
    gone: the frame count stays), the manifest's hash kept true."""
    import numpy as np

    from evalkit.fsutil import sha256_file
    from evalkit.video import read_frames, write_lossless

    m = json.loads((run / "manifest.json").read_text())
    rec = next(j for j in m["jobs"] if j["id"] == job)
    clip = run / rec["output"]["path"]
    frames, fps = read_frames(clip)
    write_lossless(clip, np.concatenate([frames[:1], frames[:-1]]), fps)
    rec["output"]["sha256"] = sha256_file(clip)
    (run / "manifest.json").write_text(json.dumps(m))


@pytest.mark.slow  # a third run rendered and compared
def test_compare_names_a_late_clip_and_compares_it_at_its_offset(runs, copies, tmp_path, cli):
    """fp32 against bf16 (and the seed floor): no offset anywhere; then one job of B one frame
    late: named with its offset in the output, summary.json, clips.csv and the page, and
    measured on the frames the clips share, which are those of the aligned compare."""
    base = tmp_path / "base"
    code, _, err = cli(
        "compare",
        runs["a"],
        runs["b"],
        "--floor",
        runs["seed"],
        "--out",
        base,
        "--quiet",
        "--device",
        "cpu",
        "--no-temporal",
    )
    assert code == 0, err
    s0 = json.loads((base / "summary.json").read_text())
    assert s0["alignment"]["shifted"] == {} and "floors" in s0
    assert {a["finding"] for a in s0["alignment"]["jobs"].values()} == {"aligned"}
    assert "alignment" not in s0["floors"]["seed"]  # the seed floor: no offset either
    job = s0["jobs"]["compared"][0]
    _late_by_one(copies["b"], job)
    out = tmp_path / "late"
    code, stdout, err = cli(
        "compare", runs["a"], copies["b"], "--out", out, "--quiet", "--device", "cpu", "--no-temporal"
    )
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    al = s["alignment"]["jobs"][job]
    assert s["alignment"]["shifted"] == {job: 1} and al["compared"] == 7
    assert (
        al["text"].startswith("B is 1 frame late (offset +1;")
        and "A frames 0-6 with B frames 1-7" in al["text"]
    )
    assert f"offset {job}: B is 1 frame late" in stdout
    rows = {r["job"]: r for r in read_csv(out / "clips.csv")}
    assert (rows[job]["offset"], rows[job]["alignment"], rows[job]["frames"]) == ("1", "shifted", "7")
    other = next(j for j in rows if j != job)
    assert (rows[other]["offset"], rows[other]["alignment"]) == ("0", "aligned")
    html = (out / "index.html").read_text()
    assert "Temporal offset:" in html and "B is 1 frame late" in html
    # at the offset, A's frames 0-6 meet the very frames of B they met before the shift
    before = {r["frame"]: float(r["lpips"]) for r in read_csv(base / "frames.csv") if r["job"] == job}
    after = {r["frame"]: float(r["lpips"]) for r in read_csv(out / "frames.csv") if r["job"] == job}
    assert sorted(after) == [str(i) for i in range(7)]
    assert all(after[f] == pytest.approx(before[f], rel=1e-4, abs=1e-6) for f in after)
    # --offset 0: frame by frame, untested, and the shift shows as a difference
    code, _, err = cli(
        "compare",
        runs["a"],
        copies["b"],
        "--out",
        tmp_path / "forced",
        "--quiet",
        "--device",
        "cpu",
        "--no-temporal",
        "--offset",
        "0",
    )
    assert code == 0, err
    s2 = json.loads((tmp_path / "forced" / "summary.json").read_text())
    assert s2["alignment"]["shifted"] == {} and s2["alignment"]["jobs"][job]["finding"] == "given"
    forced = [float(r["lpips"]) for r in read_csv(tmp_path / "forced" / "frames.csv") if r["job"] == job]
    assert len(forced) == 8 and max(forced) > 2 * max(before.values())


def test_compare_refuses_a_job_of_another_frame_rate(copies, tmp_path, cli):
    m = json.loads((copies["b"] / "manifest.json").read_text())
    job = m["jobs"][0]["id"]
    m["jobs"][0]["output"]["fps"] = "30"
    (copies["b"] / "manifest.json").write_text(json.dumps(m))
    out = tmp_path / "r"
    code, stdout, err = cli(
        "compare", copies["a"], copies["b"], "--out", out, "--quiet", "--device", "cpu", "--no-temporal"
    )
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs"]["not_compared"][job].startswith(
        "not comparable: frame-rate mismatch: A is 24 fps, B is 30 fps"
    )
    assert len(s["jobs"]["compared"]) == 1 and f"not compared {job}: not comparable: frame-rate" in stdout


def test_compare_stops_on_a_clip_whose_rate_is_not_its_manifests(copies, tmp_path, cli):
    """The manifest says 24 fps, the clip (hash made true) is 30 fps: one line naming the job."""
    from evalkit.fsutil import sha256_file
    from evalkit.video import read_frames, write_lossless

    m = json.loads((copies["b"] / "manifest.json").read_text())
    rec = m["jobs"][0]
    clip = copies["b"] / rec["output"]["path"]
    frames, _ = read_frames(clip)
    write_lossless(clip, frames, 30)
    rec["output"]["sha256"] = sha256_file(clip)
    (copies["b"] / "manifest.json").write_text(json.dumps(m))
    code, _, err = cli(
        "compare",
        copies["a"],
        copies["b"],
        "--out",
        tmp_path / "r",
        "--quiet",
        "--device",
        "cpu",
        "--no-temporal",
    )
    assert code == 2
    assert_one_line_error(
        err,
        f"job {rec['id']}",
        str(clip),
        "frame-rate mismatch: A is 24 fps, B is 30 fps",
        "not what their manifests say",
    )
    assert not (tmp_path / "r").exists()


# -- bad input ---------------------------------------------------------------------------------


def test_missing_and_malformed_run_folders(copies, tmp_path, cli):
    code, _, err = cli("compare", tmp_path / "nope", copies["b"], "--out", tmp_path / "r")
    assert code == 2
    assert_one_line_error(err, str(tmp_path / "nope"), "run folder not found")
    (copies["b"] / "manifest.json").write_text("{not json")
    code, _, err = cli("compare", copies["a"], copies["b"], "--out", tmp_path / "r")
    assert code == 2
    assert_one_line_error(err, "manifest.json", "not valid JSON")


def test_runs_of_different_suites(copies, tmp_path, cli):
    m = json.loads((copies["b"] / "manifest.json").read_text())
    m["suite"]["sha256"] = "0" * 64
    (copies["b"] / "manifest.json").write_text(json.dumps(m))
    code, _, err = cli("compare", copies["a"], copies["b"], "--out", tmp_path / "r")
    assert code == 2
    assert_one_line_error(err, "runs of different suites")


def test_jobs_missing_on_one_side_are_reported_and_the_rest_compared(copies, tmp_path, cli):
    m = json.loads((copies["b"] / "manifest.json").read_text())
    gone = m["jobs"].pop(0)["id"]
    (copies["b"] / "manifest.json").write_text(json.dumps(m))
    out = tmp_path / "r"
    code, stdout, err = cli("compare", copies["a"], copies["b"], "--out", out, "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs"]["not_compared"][gone].startswith("missing in run B")
    assert len(s["jobs"]["compared"]) == 1
    rows = {r["job"]: r for r in read_csv(out / "clips.csv")}
    assert rows[gone]["status"].startswith("missing in run B") and rows[gone]["lpips_mean"] == ""
    assert f"not compared {gone}: missing in run B" in stdout
    # with a gate, an incomplete comparison fails unless allowed
    (tmp_path / "g.yaml").write_text("lpips: {mean: {max: 1}}\n")
    assert (
        cli("compare", copies["a"], copies["b"], "--out", out, "--gate", tmp_path / "g.yaml", "--quiet")[0]
        == 1
    )
    (tmp_path / "g.yaml").write_text("lpips: {mean: {max: 1}}\nmax_missing_jobs: 1\n")
    assert (
        cli("compare", copies["a"], copies["b"], "--out", out, "--gate", tmp_path / "g.yaml", "--quiet")[0]
        == 0
    )


def test_a_clip_that_fails_its_hash_is_reported(copies, tmp_path, cli):
    clip = sorted((copies["b"] / "clips").iterdir())[1]
    clip.write_bytes(clip.read_bytes()[:-8] + b"\x00" * 8)
    out = tmp_path / "r"
    code, stdout, err = cli("compare", copies["a"], copies["b"], "--out", out, "--quiet")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert "fails its hash" in s["jobs"]["not_compared"][clip.stem]
    assert str(clip) in s["jobs"]["not_compared"][clip.stem]
    assert len(s["jobs"]["compared"]) == 1


@pytest.mark.parametrize(
    "gate, needle",
    [
        ("lpipz: {mean: {max: 1}}\n", "field 'lpipz': unknown metric"),
        ("lpips: {median: {max: 1}}\n", "field 'lpips.median': unknown aggregate"),
        ("lpips: {mean: {max: high}}\n", "field 'lpips.mean.max': expected a number"),
        ("floor_ratio: {lpips: {mean: {max: 0.5}}}\n", "no --floor run was given"),
    ],
)
def test_bad_gate_files(runs, tmp_path, cli, gate, needle):
    (tmp_path / "gate.yaml").write_text(gate)
    code, _, err = cli(
        "compare", runs["a"], runs["b"], "--out", tmp_path / "r", "--gate", tmp_path / "gate.yaml"
    )
    assert code == 2
    assert_one_line_error(err, "gate.yaml", needle)


def test_plot_titles_show_what_the_font_can_draw(tmp_path):
    """A prompt in a script the plot font lacks (CJK) is drawn with '?' and a pointer to the
    full text, without a warning per missing glyph; mathtext-like text stays text."""
    import warnings

    from matplotlib.figure import Figure

    from evalkit.compare.report import plot_text

    assert plot_text("c1: a cat in watercolor") == "c1: a cat in watercolor"
    t = plot_text("c2: 水彩画の猫 $$ $\\foo{")
    assert t.startswith("c2: ????? $$ $\\foo{") and "clips.csv" in t
    assert len(plot_text("x" * 500)) < 150
    fig = Figure(figsize=(3, 1))
    fig.subplots().set_title(t, parse_math=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.savefig(tmp_path / "t.png")


class _Session:
    def __init__(self, log):
        self.log = log
        log.append("session started")

    def close(self):
        self.log.append("session closed")


def test_the_hash_checks_run_while_the_session_starts():
    """compare starts its session (torch, the device, LPIPS) while the clips' hashes are
    checked; an error of either comes out once both have ended, and a started session is
    closed when the pairing fails."""
    import threading

    from evalkit.compare.run import _session_and_pairs
    from evalkit.errors import UserError

    log: list = []
    hashing = threading.Event()

    def pairing():
        hashing.set()
        return ["pair"], {}

    def start():
        assert hashing.wait(10), "the hash checks did not start before the session"
        return _Session(log)

    session, (pairs, problems) = _session_and_pairs(pairing, start)
    assert pairs == ["pair"] and log == ["session started"]

    log.clear()

    def bad_pairing():
        raise UserError("a.mkv: clip fails its hash")

    with pytest.raises(UserError, match="fails its hash"):
        _session_and_pairs(bad_pairing, lambda: _Session(log))
    assert log == ["session started", "session closed"]

    finished = threading.Event()

    def slow_pairing():
        finished.wait(0.2)
        finished.set()
        return [], {}

    def no_device():
        raise UserError("device: 'cuda' requested but no CUDA device is available here")

    with pytest.raises(UserError, match="no CUDA device"):
        _session_and_pairs(slow_pairing, no_device)
    assert finished.is_set()  # the hashing thread ended before the error came out


def test_metric_options_are_a_frozen_value_with_the_evaluators_defaults():
    """compare's metric settings are one frozen value (no dict of keywords); left alone they
    are exactly PairEvaluator's own defaults (a compare without options measures as before),
    and each one set reaches the evaluator's keyword of the same name."""
    import dataclasses
    import inspect

    from evalkit.compare.options import MetricOptions
    from evalkit.metrics.stream import PairEvaluator

    opts = MetricOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.temporal = False
    params = inspect.signature(PairEvaluator).parameters
    for key, value in opts.evaluator_kwargs().items():
        assert params[key].default == value, key
    assert "flow_preset" not in opts.evaluator_kwargs()  # the evaluator's default preset
    set_ = MetricOptions(temporal=False, flow="farneback", flow_preset="medium").evaluator_kwargs()
    assert set_ == {"temporal": False, "flow": "farneback", "flow_preset": "medium"}
    assert set(set_) <= set(params)
