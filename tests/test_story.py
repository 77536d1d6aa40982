"""Reports that tell the story (issues 38 and 46): known failures of a real clip, imported as two
farms without seeds, against a floor made by `evalkit floor`, ranked and named in the command's
summary, summary.json and the page (a local glitch second only to the shift, with its frames and
place; +-1 LSB of noise said to be below the floor); gates that fail on an offset and on a local
glitch; floors that cannot be floors refused in one line."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit.formats.run import read_manifest
from evalkit.testing.variants import VARIANTS, block_box, h264_roundtrip, make_variant_runs
from evalkit.video import read_frames

pytestmark = pytest.mark.slow  # real imports, compares and a floor of four variants

CLIP = DATASETS / "canary" / "clips" / "chelsea_handheld.mkv"
FRAMES = 16
#: the variants worst first: the shift, the local block, the flicker, crf32, crf16, and the
#: +-1 LSB noise below the floor
RANKED = ("shift1", "block", "flicker", "crf32", "crf16", "lsb1")


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    from evalkit.cli import main

    root = tmp_path_factory.mktemp("story")
    p = make_variant_runs(root, CLIP, frames=FRAMES)
    p["report"] = root / "report"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "compare",
                str(p["a"]),
                str(p["b"]),
                "--floor",
                str(p["floor"]),
                "--out",
                str(p["report"]),
                "--device",
                "cpu",
                "--quiet",
            ]
        )
    assert code == 0
    p["stdout"] = out.getvalue()
    p["summary"] = json.loads((p["report"] / "summary.json").read_text())
    return p


def test_the_reencode_floor_is_a_through_420_and_named_so(story):
    m = read_manifest(story["floor"])
    assert m["notes"]["floor"]["kind"] == "reencode" and m["label"] == "farm-a"
    assert m["notes"]["floor"]["of"] == str(story["a"].resolve())
    a = read_frames(story["a"] / "clips" / f"{story['jobs']['crf16']}.mkv")[0]
    f = read_frames(story["floor"] / "clips" / f"{story['jobs']['crf16']}.mkv")[0]
    # exactly what a lossless H.264 (x264 at CRF 0, yuv420p) re-encode of A decodes to
    assert np.array_equal(f, h264_roundtrip(a, 24, 0))
    assert 0 < np.abs(a.astype(np.int16) - f).mean() < 4
    s = story["summary"]
    assert list(s["floors"]) == ["reencode"] and s["floors"]["reencode"]["jobs_compared"] == len(VARIANTS)
    assert s["floor_notice"] is None


def test_the_four_variants_are_ranked_and_named(story):
    s = story["summary"]
    jobs = story["jobs"]
    order = [f["clip"] for f in s["clip_findings"]]
    # the shift first (with its offset), then the flicker (by name), then crf32 above crf16
    assert order == [jobs[v] for v in RANKED], order
    by = {f["clip"]: f for f in s["clip_findings"]}
    shift, flick, c32, c16 = (by[jobs[v]] for v in ("shift1", "flicker", "crf32", "crf16"))
    assert shift["offset"] == 1 and "B is 1 frame late (offset +1" in shift["text"]
    assert flick["metric"] == "flicker" and "people notice flicker" in flick["text"]
    assert flick["offset"] == 0 and c32["offset"] == 0 and c16["offset"] == 0
    # every variant differs from A more than the floor does; each is worse than the one below it
    assert flick["ratio"] > c32["ratio"] > c16["ratio"] > 1
    # the flicker hides from the fidelity metrics: its LPIPS is below the floor's (every floor
    # job is the same clip's re-encode), its flicker far above
    import csv

    with open(story["report"] / "clips.csv") as fh:
        rows = {r["job"]: r for r in csv.DictReader(fh)}
    floor_lpips = s["floors"]["reencode"]["aggregates"]["lpips"]["mean"]
    assert float(rows[jobs["flicker"]]["lpips_mean"]) < floor_lpips < float(rows[jobs["crf16"]]["lpips_mean"])
    assert s["floor_ratios"]["reencode"]["flicker"]["mean"] > 1
    for f in (flick, c32, c16):
        assert re.search(
            rf"{f['ratio']:.3g}x the reencode floor's: B differs from A "
            rf"{f['ratio']:.3g}x more than the reencode floor run does",
            f["text"],
        )
    # the report's headline names the shift first, then the local glitch with its frames and
    # place, then the other families (flicker)
    head = s["headline"]
    assert head["offsets"] == {jobs["shift1"]: 1}
    assert head["text"].startswith(
        f"temporal offset: 1 clip out of step with A: {jobs['shift1']} (B 1 frame late, offset +1)"
    )
    first, last, *_ = block_box(FRAMES, 256, 256)
    when = f"on frame {first}" if first == last else f"on frames {first}-{last}"
    assert f"then worst: {jobs['block']}: a local glitch {when}" in head["text"]
    assert "(upper right)" in head["text"] and "temporal: flicker" in head["text"]
    assert head["metric"] == "block_psnr" and head["family"] == "local"
    assert "gate:" not in head["text"]  # no gate: nothing said of one


def test_the_block_is_named_with_its_frames_place_and_db(story):
    s, jobs = story["summary"], story["jobs"]
    by = {f["clip"]: f for f in s["clip_findings"]}
    blk = by[jobs["block"]]
    first, last, bx, by_, side = block_box(FRAMES, 256, 256)
    loc = blk["local"]
    assert blk["metric"] == "block_psnr" and blk["ratio"] > 100
    assert loc["burst"] == [first, last] and loc["local"] and not loc["throughout"]
    assert bx <= loc["x"] and loc["x"] + loc["side"] <= bx + side
    assert by_ <= loc["y"] and loc["y"] + loc["side"] <= by_ + side
    assert f"worst block {blk['ratio']:.3g}x the reencode floor's" in blk["text"]
    assert re.search(r"that block \d+\.\d dB PSNR, the whole frame \d+\.\d dB", blk["text"])
    # its worst block is the run's worst: the aggregate a gate bounds
    assert s["aggregates"]["block_psnr"]["worst"] == pytest.approx(loc["block_psnr"], rel=1e-12)


def test_noise_below_the_floor_is_said_so_in_one_line_with_its_db(story):
    s, jobs = story["summary"], story["jobs"]
    lsb = {f["clip"]: f for f in s["clip_findings"]}[jobs["lsb1"]]
    assert lsb["below_floor"] and lsb["ratio"] < 1 and lsb["rank"] < 1
    floor_psnr = s["floors"]["reencode"]["aggregates"]["psnr"]["mean"]
    assert re.match(
        rf"{jobs['lsb1']}: below what the reencode floor resolves: PSNR 49\.\d dB "
        rf"against the floor's {floor_psnr:.1f} dB",
        lsb["text"],
    ), lsb["text"]


def test_gates_fail_on_the_offset_by_default_and_on_the_block(story, cli, tmp_path):
    """The issue's "reasonable gate" bounds only aggregates: it passed the block and the shift.
    Now it fails on the shift (no max_offset_frames: any offset fails), and with the offset
    allowed, a block_psnr bound fails on the block."""
    report = story["report"]
    reasonable = tmp_path / "reasonable.yaml"
    reasonable.write_text("lpips: {mean: {max: 0.2}, worst: {max: 0.5}}\npsnr: {mean: {min: 30}}\n")
    code, out, _err = cli("gate", report, "--gate", reasonable)
    assert code == 1 and "gate: FAIL" in out
    assert f"temporal offset = 1 frame (<= 0): {story['jobs']['shift1']} +1" in out
    local = tmp_path / "local.yaml"
    local.write_text(reasonable.read_text() + "max_offset_frames: 1\nblock_psnr: {worst: {min: 20}}\n")
    code, out, _err = cli("gate", report, "--gate", local)
    worst = story["summary"]["aggregates"]["block_psnr"]["worst"]
    assert code == 1 and f"block_psnr worst = {worst:.6g} (>= 20)" in out
    assert "temporal offset" not in out
    ok = tmp_path / "ok.yaml"
    ok.write_text(reasonable.read_text() + "max_offset_frames: 1\nblock_psnr: {worst: {min: 5}}\n")
    assert cli("gate", report, "--gate", ok)[0] == 0


def test_the_command_prints_them_worst_first_with_every_ratio_explained(story):
    out = story["stdout"].splitlines()
    start = out.index("clips, worst first:")
    lines = out[start + 1 : start + 1 + len(RANKED)]
    for line, v in zip(lines, RANKED, strict=True):
        assert line.strip().startswith(story["jobs"][v]), (v, line)
    floor_line = next(ln for ln in out if "LPIPS mean / reencode floor" in ln)
    assert re.search(
        r"floor: [0-9.]+x: B differs from A [0-9.]+x (more|less) than the reencode "
        r"floor run does",
        floor_line,
    ), floor_line
    assert story["summary"]["headline"]["text"] in out


def test_the_page_shows_the_findings_worst_first(story):
    html = (story["report"] / "index.html").read_text()
    top = html[: html.index("<h2>Summary</h2>")]
    ranked = re.findall(r"<li class='bad'>([^<]*)</li>", top)
    # every clip but the one below the floor is red
    assert [t.split(":")[0] for t in ranked] == [story["jobs"][v] for v in RANKED[:-1]]
    assert "a local glitch" in ranked[1] and "people notice flicker" in ranked[2]
    assert f"{story['jobs']['lsb1']}: below what the reencode floor resolves" in top
    # the clip sections follow the same order, each with its worst finding
    sections = re.findall(r"<code>(pan-[^<]+)</code>\)</small></h3>", html)
    assert sections == [story["jobs"][v] for v in RANKED]
    assert html.count("<b>Worst finding:</b>") == len(VARIANTS)
    assert "class='ratio-help'" in html


# -- floors that cannot be floors ---------------------------------------------------------------


def test_a_run_of_bs_backend_is_refused_as_a_floor(story, cli, tmp_path):
    code, _out, err = cli(
        "render",
        story["suite"],
        "-r",
        "import",
        "-O",
        f"dir={story['b'].parent.parent / 'farm_b'}",
        "--label",
        "farm-b",
        "--out",
        tmp_path,
        "--quiet",
    )
    assert code == 0, err
    code, _out, err = cli(
        "compare",
        story["a"],
        story["b"],
        "--floor",
        tmp_path / "farm-b",
        "--out",
        tmp_path / "r",
        "--device",
        "cpu",
        "--quiet",
    )
    assert code == 2
    assert_one_line_error(
        err, f"--floor {tmp_path / 'farm-b'}", "is a run of B's backend", "'farm-b'", "not A's ('farm-a')"
    )
    assert not (tmp_path / "r").exists()


def test_a_copy_of_a_is_refused_as_a_floor(story, cli, tmp_path):
    copy = shutil.copytree(story["a"], tmp_path / "farm-a")
    code, _out, err = cli(
        "compare",
        story["a"],
        story["b"],
        "--floor",
        copy,
        "--out",
        tmp_path / "r",
        "--device",
        "cpu",
        "--quiet",
    )
    assert code == 2
    assert_one_line_error(
        err,
        f"--floor {copy}",
        "A's own files, byte for byte",
        "every ratio to it would be infinite",
        "evalkit floor RUN_A",
    )


def test_a_floor_identical_to_a_frame_for_frame_is_refused(story, cli, tmp_path):
    """A re-import of A's files in another lossless format: other bytes, A's frames. (One job:
    A and the floor re-imported for it alone, so the compare measures one pair, not four.)"""
    job = story["jobs"]["crf16"]
    for out, lossless in (("a", "ffv1"), ("floor", "utvideo")):
        code, _out, err = cli(
            "render",
            story["suite"],
            "-r",
            "import",
            "-O",
            f"dir={story['a'].parent.parent / 'farm_a'}",
            "--label",
            "farm-a",
            "--lossless",
            lossless,
            "--jobs",
            job,
            "--out",
            tmp_path / out,
            "--quiet",
        )
        assert code == 0, err
    code, _out, err = cli(
        "compare",
        tmp_path / "a" / "farm-a",
        story["b"],
        "--floor",
        tmp_path / "floor" / "farm-a",
        "--out",
        tmp_path / "r",
        "--device",
        "cpu",
        "--quiet",
        "--no-temporal",
    )
    assert code == 2
    assert_one_line_error(err, "every frame is identical to A's", "infinite", "--seed-offset 1")
    assert not (tmp_path / "r").exists()


def test_floor_command_resumes_and_refuses_what_is_not_run_a(story, cli, tmp_path):
    before = {j["id"]: j["output"]["sha256"] for j in read_manifest(story["floor"])["jobs"]}
    code, out, err = cli("floor", story["a"], "--out", story["floor"].parent, "--quiet")
    assert code == 0, err
    after = {j["id"]: j["output"]["sha256"] for j in read_manifest(story["floor"])["jobs"]}
    assert after == before and len(after) == len(VARIANTS)
    code, _out, err = cli("floor", tmp_path, "--out", tmp_path / "o")
    assert code == 2
    assert_one_line_error(err, str(tmp_path), "not a run folder")
    code, _out, err = cli("floor", story["floor"], "--out", tmp_path / "o")
    assert code == 2
    assert_one_line_error(err, "is itself a reencode floor", "give the run it was made from")
    (tmp_path / "o" / "farm-a_reencode").mkdir(parents=True)
    (tmp_path / "o" / "farm-a_reencode" / "x.txt").write_text("mine")
    code, _out, err = cli("floor", story["a"], "--out", tmp_path / "o")
    assert code == 2
    assert_one_line_error(err, "farm-a_reencode", "is not a run folder")
