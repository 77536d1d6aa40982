"""The lossless formats of run clips (``render --lossless``): FFV1 in .mkv (the default, bytes
as before) and UT Video in .nut, with real codecs: exact round trips, run manifests, resume,
compare/metrics/import/study across formats."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit import video
from evalkit.errors import InputFileError, UserError
from evalkit.formats.run import RunDir, read_manifest
from evalkit.formats.suite import load_suite
from evalkit.lossless import LOSSLESS_FORMATS

SMOKE = DATASETS / "smoke" / "suite.yaml"
INVERT = "evalkit.testing.renderers:Invert"


def edge_frames(h=17, w=33, n=5):
    """Odd-sized frames holding every extreme: all 0, all 255, random, a ramp of 0..255."""
    rng = np.random.default_rng(7)
    f = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    f[0], f[1] = 0, 255
    f[2].reshape(-1)[:256] = np.arange(256, dtype=np.uint8)
    return f


@pytest.mark.parametrize("codec", list(LOSSLESS_FORMATS))
def test_round_trip_exact_every_reader(tmp_path, codec):
    frames = edge_frames()
    path = tmp_path / f"c{LOSSLESS_FORMATS[codec].ext}"
    assert video.write_lossless(path, iter(frames), 24, codec=codec) == len(frames)
    reader = video.ClipReader(path)
    assert reader.info.codec == codec and (reader.info.width, reader.info.height) == (33, 17)
    assert reader.info.frames_estimate == len(frames)
    assert np.array_equal(video.read_frames(path)[0], frames)
    # as compare reads: chunks decoded in a background thread
    got = np.concatenate(list(video.Prefetch(video.ClipReader(path).chunks(2), 2)))
    assert np.array_equal(got, frames)
    assert np.array_equal(np.stack(list(video.ClipReader(path, threads=1))), frames)


def test_ffv1_stays_the_default_with_todays_bytes(tmp_path):
    committed = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
    frames, fps = video.read_frames(committed)
    video.write_lossless(tmp_path / "a.mkv", frames, fps)
    video.write_lossless(tmp_path / "b.mkv", frames, fps, codec="ffv1")
    assert (tmp_path / "a.mkv").read_bytes() == committed.read_bytes()
    assert (tmp_path / "b.mkv").read_bytes() == committed.read_bytes()


def test_path_suffix_must_match_the_codec(tmp_path):
    f = edge_frames()[:1]
    with pytest.raises(ValueError, match=r"utvideo clips are \.nut files, found '.*x\.mkv'"):
        video.write_lossless(tmp_path / "x.mkv", f, 24, codec="utvideo")
    with pytest.raises(ValueError, match=r"ffv1 clips are \.mkv files, found '.*x\.nut'"):
        video.write_lossless(tmp_path / "x.nut", f, 24)
    with pytest.raises(ValueError, match="expected one of ffv1, utvideo, found 'h264'"):
        video.write_lossless(tmp_path / "x.mkv", f, 24, codec="h264")
    assert not list(tmp_path.iterdir())


def _run(tmp_path, **kw):
    suite = load_suite(SMOKE)
    return suite, RunDir.create(
        tmp_path / "run",
        suite=suite,
        renderer={"name": "t"},
        backend={"spec": "cpu"},
        fingerprint={"host": "h"},
        **kw,
    )


def test_manifest_records_the_format_and_old_manifests_read_as_ffv1(tmp_path):
    suite, run = _run(tmp_path, lossless="utvideo")
    jid = suite.jobs[0].id
    assert read_manifest(run.path)["lossless"] == {"codec": "utvideo", "ext": ".nut"}
    rec = run.record_done(jid, edge_frames(), 24, preview=False)
    assert rec["output"]["path"] == f"clips/{jid}.nut" and run.is_done(jid)
    assert np.array_equal(video.read_frames(run.clip_path(jid))[0], edge_frames())
    # bytes of another format are refused before anything is written
    with pytest.raises(ValueError, match="expected a utvideo clip"):
        run.record_done_encoded(
            suite.jobs[1].id,
            (DATASETS / "smoke" / "clips" / "astronaut_pan.mkv").read_bytes(),
            None,
            frames=8,
            width=64,
            height=64,
            fps=24,
        )
    assert not run.clip_path(suite.jobs[1].id).exists()
    # resuming keeps the format; asking for another is a user error naming both
    assert (
        RunDir.create(
            run.path, suite=suite, renderer={"name": "t"}, backend={"spec": "cpu"}, fingerprint={"host": "h"}
        ).lossless
        == "utvideo"
    )
    with pytest.raises(
        UserError,
        match=r"run: this run's clips are utvideo \(\.nut\), "
        r"--lossless ffv1 asks for ffv1",
    ):
        RunDir.create(
            run.path,
            suite=suite,
            renderer={"name": "t"},
            backend={"spec": "cpu"},
            fingerprint={"host": "h"},
            lossless="ffv1",
        )

    # a manifest written before the choice (no "lossless") is FFV1 in .mkv, and stays so
    old = tmp_path / "old"
    _, run = _run(old)
    doc = json.loads((run.path / "manifest.json").read_text())
    del doc["lossless"]
    (run.path / "manifest.json").write_text(json.dumps(doc))
    reopened = RunDir.open(run.path)
    assert reopened.lossless == "ffv1" and reopened.clip_path(jid).name == f"{jid}.mkv"
    again = RunDir.create(
        run.path,
        suite=suite,
        renderer={"name": "t"},
        backend={"spec": "cpu"},
        fingerprint={"host": "h"},
        lossless="ffv1",
    )
    assert "lossless" not in read_manifest(again.path)
    # a manifest whose extension contradicts its codec names the field
    doc["lossless"] = {"codec": "utvideo", "ext": ".mkv"}
    (run.path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(
        InputFileError,
        match=r"field 'lossless.ext': expected '.nut' for codec "
        r"'utvideo', found '.mkv'",
    ):
        RunDir.open(run.path)


def test_a_new_run_on_a_device_is_utvideo_unless_asked_and_a_resumed_one_keeps_its_own(tmp_path, monkeypatch):
    """No --lossless: a new run rendered on a device (as the driver tells it: ``on_device``)
    writes UT Video, one on the CPU FFV1; --lossless wins either way; a run resumed on a device
    keeps the format it was made with (no error for not naming it)."""
    from evalkit.lossless import DEVICE_LOSSLESS, new_run_format
    from evalkit.render import driver
    from evalkit.render.driver import render_suite
    from evalkit.testing.renderers import Invert

    assert (new_run_format(True), new_run_format(False)) == ("utvideo", "ffv1") == (DEVICE_LOSSLESS, "ffv1")
    suite = load_suite(SMOKE)
    first = [suite.jobs[0].id]

    def render(out, device, **kw):
        monkeypatch.setattr(driver, "on_device", lambda runs: device)
        [s] = render_suite(SMOKE, ["cpu"], tmp_path / out, renderer=Invert(), progress=False, **kw)
        assert s.failed == 0
        m = read_manifest(s.path)
        return m["lossless"]["codec"], sorted(p.suffix for p in (s.path / "clips").iterdir())

    n = len(suite.jobs)
    assert render("gpu", True) == ("utvideo", [".nut"] * n)
    assert render("cpu", False) == ("ffv1", [".mkv"] * n)
    assert render("asked", True, lossless="ffv1") == ("ffv1", [".mkv"] * n)
    # made on the CPU (FFV1) with one job, resumed on a device: FFV1 still, every job
    assert render("resumed", False, jobs=first) == ("ffv1", [".mkv"])
    assert render("resumed", True) == ("ffv1", [".mkv"] * n)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The smoke suite through the fake renderer twice: FFV1 (default) and UT Video; then an
    import of the FFV1 run's clips into UT Video; compare reports FFV1 vs each."""
    from evalkit.cli import main

    root = tmp_path_factory.mktemp("lossless")
    out = root / "runs"
    common = ["render", SMOKE, "-r", INVERT, "-b", "cpu", "-o", out, "--quiet"]
    assert main([str(a) for a in common + ["--label", "ffv1"]]) == 0
    assert main([str(a) for a in common + ["--label", "ut", "--lossless", "utvideo"]]) == 0
    assert (
        main(
            [
                str(a)
                for a in [
                    "render",
                    SMOKE,
                    "-r",
                    "import",
                    "-O",
                    f"dir={out / 'ffv1' / 'clips'}",
                    "--label",
                    "imp",
                    "-o",
                    out,
                    "--lossless",
                    "utvideo",
                    "--quiet",
                ]
            ]
        )
        == 0
    )
    reports = {}
    for other in ("ut", "imp"):
        reports[other] = root / f"report-{other}"
        assert (
            main(
                [
                    str(a)
                    for a in [
                        "compare",
                        out / "ffv1",
                        out / other,
                        "--out",
                        reports[other],
                        "--device",
                        "cpu",
                        "--no-temporal",
                        "--quiet",
                    ]
                ]
            )
            == 0
        )
    return {"root": root, "out": out, "reports": reports}


def test_render_utvideo_compares_identical_to_ffv1(runs, cli):
    out = runs["out"]
    suite = load_suite(SMOKE)
    for name, codec, ext in (("ffv1", "ffv1", ".mkv"), ("ut", "utvideo", ".nut"), ("imp", "utvideo", ".nut")):
        m = read_manifest(out / name)
        assert m["lossless"] == {"codec": codec, "ext": ext}
        assert sorted(p.name for p in (out / name / "clips").iterdir()) == sorted(
            f"{j.id}{ext}" for j in suite.jobs
        )
    for other, report in runs["reports"].items():
        with open(report / "clips.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == len(suite.jobs), other
        assert all(r["status"] == "compared" and r["identical"] == "true" for r in rows), other
        assert all(float(r["lpips_worst"]) == 0.0 for r in rows), other
    # evalkit metrics on the files themselves, one of each format
    jid = suite.jobs[0].id
    code, js, err = cli(
        "metrics",
        out / "ffv1" / "clips" / f"{jid}.mkv",
        out / "ut" / "clips" / f"{jid}.nut",
        "--json",
        "--device",
        "cpu",
        "--no-temporal",
    )
    assert code == 0, err
    assert json.loads(js)["lpips"] == 0.0


def test_resume_keeps_the_format_and_refuses_another(runs, cli):
    out = runs["out"]
    before = {p.name: p.read_bytes() for p in (out / "ut" / "clips").iterdir()}
    code, _, err = cli(
        "render",
        SMOKE,
        "-r",
        INVERT,
        "-b",
        "cpu",
        "-o",
        out,
        "--quiet",
        "--label",
        "ut",
        "--lossless",
        "ffv1",
    )
    assert code == 2
    assert_one_line_error(err, str(out / "ut"), "utvideo", "--lossless ffv1")
    code, stdout, err = cli("render", SMOKE, "-r", INVERT, "-b", "cpu", "-o", out, "--quiet", "--label", "ut")
    assert code == 0, err
    assert "0 rendered, 2 already done" in stdout
    assert {p.name: p.read_bytes() for p in (out / "ut" / "clips").iterdir()} == before
    code, _, err = cli("render", SMOKE, "-r", INVERT, "-b", "cpu", "-o", out, "--lossless", "x")
    assert code == 2 and "invalid choice: 'x' (choose from 'ffv1', 'utvideo')" in err


def test_study_create_over_utvideo_runs(runs, tmp_path):
    from evalkit.study import create_study, read_report

    report = runs["reports"]["ut"]
    r = read_report(report)
    assert {p["path_a"].suffix for p in r["jobs"]} == {".mkv"}
    assert {p["path_b"].suffix for p in r["jobs"]} == {".nut"}
    assert all(p["path_b"].is_file() for p in r["jobs"])
    made = create_study(
        report, tmp_path / "s.db", protocol="preference", raters_planned=4, allow_masking=True
    )
    assert made["clips"] == len(r["jobs"])
