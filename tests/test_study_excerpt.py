"""`study create --excerpt SECONDS [--excerpt-at START|worst]`: every trial of a clip shows one
window of it, the same on both sides, in the catch versions and the threshold stimuli; by default
the window of the highest mean per-frame LPIPS of a real compare report (real imports, real
LPIPS, real x264 streams decoded back); bad values are one line and exit code 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_one_line_error
from scipy.ndimage import gaussian_filter
from test_study_media import decode, psnr

from evalkit import study
from evalkit.study import excerpt
from evalkit.study.store import open_db
from evalkit.testing.studies import import_report, moving_texture, study_config

FPS = 24
T = 48  # 2 s
#: the frames where B differs from A, per prompt (the report's worst window lies over them)
NOISY = {"watercolor": range(30, 40), "night": range(4, 14)}


def blurred(frames, where):
    """``frames`` with the frames ``where`` blurred (a difference LPIPS sees and x264 keeps)."""
    out = frames.copy()
    for i in where:
        out[i] = gaussian_filter(out[i], (2.0, 2.0, 0))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two imported runs of one 2 s clip with two prompts; B differs from A (blurred) only in
    the frames of :data:`NOISY`; compared with real LPIPS."""
    pairs = {}
    for k, prompt in enumerate(NOISY):
        fa = moving_texture(T, 64, 96, seed=10 + k)
        pairs[prompt] = (fa, blurred(fa, NOISY[prompt]))
    rep, jobs = import_report(tmp_path_factory.mktemp("excerpt"), pairs, FPS)
    return {"report": rep, "frames": {j: (*pairs[p], p) for j, p in jobs.items()}}


def config(db, sid) -> dict:
    return study_config(db, sid)  # the streams are sealed: opened with the key file


def tiles(media, stream) -> list[np.ndarray]:
    """Every file of a row's (or catch version's) streams as its decoded tiles."""
    out = []
    for sha in stream["files"].values():
        frames = decode(media / f"{sha}.mp4")
        out.append([frames[:, y : y + h, x : x + w] for x, y, w, h in stream["rects"]])
    return out


def test_worst_start_is_the_window_of_highest_mean():
    per = {f: 0.01 for f in range(40)}
    per.update({f: 0.5 for f in range(20, 25)})
    assert excerpt.worst_start(per, 5) == 20
    assert excerpt.worst_start(per, 10) == 15  # ties: the earliest of 15..20
    # frames without a value do not count; a window within the clip's end
    gaps = {f: 0.1 for f in range(0, 30, 2)}
    gaps[28] = 0.9
    assert excerpt.worst_start(gaps, 4, total=30) == 25  # 25..28 and 26..29 both mean 0.5
    assert excerpt.worst_start({0: 1.0, 1: 2.0}, 5) == 0  # shorter than the window
    # the clip's frames after the last measured one are candidates when the total says so
    assert excerpt.worst_start({0: 0.0, 9: 1.0}, 3, total=12) == 7
    with pytest.raises(ValueError, match="at least 1 frame"):
        excerpt.worst_start(per, 0)


def test_worst_window_on_both_sides_catch_versions_and_results(report, tmp_path, cli):
    db = tmp_path / "s.db"
    code, out, err = cli(
        "study",
        "create",
        report["report"],
        "--db",
        db,
        "--protocol",
        "abx",
        "--excerpt",
        "0.5",
        "--raters",
        "2",
    )
    assert code == 0, err
    assert "excerpt: 0.5 s of each clip, the window of highest mean per-frame LPIPS" in out
    sid = int(out.split()[1].rstrip(":"))
    cfg = config(db, sid)
    ex = cfg["excerpt"]
    assert (ex["seconds"], ex["at"], ex["frames"]) == (0.5, "worst", 12)
    media = tmp_path / "s.media"
    by_clip = {}
    for cid, streams in cfg["streams"].items():
        by_clip[cid] = streams
    rows = {}
    with open_db(db).engine.connect() as conn:
        from evalkit.study.store import clips

        for r in conn.execute(clips.select().where(clips.c.study_id == sid)).mappings():
            rows[str(r["id"])] = r["job"]
    assert sorted(ex["windows"]) == sorted(report["frames"])
    for cid, job in rows.items():
        fa, fb, prompt = report["frames"][job]
        w = ex["windows"][job]
        noisy_frames = NOISY[prompt]
        # the window covers every frame where B differs (12 frames, 10 noisy: starts 28-30 or
        # 2-4; exactly zero LPIPS elsewhere makes the earliest the choice)
        assert w["start"] <= noisy_frames[0] and w["start"] + 12 >= noisy_frames[-1] + 1, w
        assert (w["start_s"], w["end_s"]) == (w["start"] / FPS, (w["start"] + 12) / FPS)
        assert w["lpips_window"] > 0
        s = w["start"]
        for shown in tiles(media, by_clip[cid]):
            # each tile is the window of A or of B: 12 frames, the same window on both sides
            assert all(len(t) == 12 for t in shown)
            for t in shown:
                best = max(psnr(t, fa[s : s + 12]), psnr(t, fb[s : s + 12]))
                assert best > 38, best
                assert psnr(t, fa[:12]) < best - 10  # not the clip's start
    # the catch versions: the same window, mirrored (the catch reference's rule)
    assert cfg["catch_pool"]
    for p in cfg["catch_pool"]:
        job = rows[str(p["clip_id"])]
        fa, fb, _ = report["frames"][job]
        s = ex["windows"][job]["start"]
        for shown in tiles(media, p["streams"]):
            assert all(len(t) == 12 for t in shown)
            ref = max(max(psnr(t, fa[s : s + 12, :, ::-1]), psnr(t, fb[s : s + 12, :, ::-1])) for t in shown)
            assert ref > 30, ref  # the reference tile (within its colour offset)
    # the server's watch time is the excerpt's
    assert set(cfg["media_seconds"].values()) == {0.5}
    res = study.results(db, sid)
    assert res["excerpt"]["windows"] == ex["windows"]
    code, out, _ = cli("study", "results", "--db", db, "--study", sid)
    assert code == 0 and "excerpt: 0.5 s of each clip" in out, out
    assert "--excerpt" not in json.dumps(res["excerpt"])


def test_owner_start_and_threshold_stimuli_share_the_window(report, tmp_path):
    db = tmp_path / "t.db"
    r = study.create_study(
        report["report"],
        db,
        protocol="threshold",
        raters_planned=2,
        levels="1,2,4",
        excerpt_seconds=0.5,
        excerpt_at="1",
    )
    cfg = config(db, r["study"])
    assert cfg["excerpt"]["at"] == 1.0
    assert {w["start"] for w in cfg["excerpt"]["windows"].values()} == {24}
    media = tmp_path / "t.media"
    stimuli = cfg["threshold"]["stimuli"]
    assert len(stimuli) == 6
    for cid, streams in cfg["streams"].items():
        fa, _, _ = report["frames"][stimuli[cid]["job"]]
        for shown in tiles(media, streams):
            assert all(len(t) == 12 for t in shown)
            # the level's colour offset aside, one tile is A's window from 1 s
            off = np.array(stimuli[cid]["offset"], np.int16)
            a_shown = np.clip(fa[24:36].astype(np.int16) + off, 0, 255).astype(np.uint8)
            assert max(psnr(t, a_shown) for t in shown) > 38
    # the stimuli were measured on the window (frames 24-35): "night" differs only in frames
    # 4-13, so within its window A and B are the same (every level 0); "watercolor"'s blurred
    # frames 30-39 reach into it
    for s in stimuli.values():
        prompt = report["frames"][s["job"]][2]
        assert (s["metrics"]["lpips"] > 0) == (prompt == "watercolor"), (prompt, s)
    assert set(cfg["media_seconds"].values()) == {0.5}


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--excerpt", "0"], ["--excerpt: expected a number of seconds > 0, found '0'"]),
        (["--excerpt", "-1"], ["--excerpt: expected a number of seconds > 0"]),
        (["--excerpt", "abc"], ["--excerpt: expected a number of seconds > 0, found 'abc'"]),
        (["--excerpt", "nan"], ["--excerpt: expected a number of seconds > 0, found 'nan'"]),
        (["--excerpt", "3"], ["pan", "--excerpt 3: expected at most the clip's length (2 s, 48 frames"]),
        (
            ["--excerpt", "0.5", "--excerpt-at", "1.8"],
            ["--excerpt-at 1.8: expected a start at most 1.5 s", "found 1.79167 s"],
        ),
        (
            ["--excerpt", "0.5", "--excerpt-at", "soon"],
            ["--excerpt-at: expected 'worst' or a start time in seconds >= 0, found 'soon'"],
        ),
        (["--excerpt-at", "1"], ["--excerpt-at: only with --excerpt SECONDS"]),
    ],
)
def test_bad_excerpts_are_one_line_and_create_nothing(report, tmp_path, cli, args, needles):
    db = tmp_path / "bad.db"
    code, out, err = cli("study", "create", report["report"], "--db", db, "--protocol", "abx", *args)
    assert code == 2, (out, err)
    assert_one_line_error(err, *needles)
    media = tmp_path / "bad.media"
    assert not media.exists() or not any(media.iterdir())
    if db.exists():
        assert study.list_studies(db) == []


def test_worst_needs_the_reports_per_frame_lpips(report, tmp_path, cli):
    import shutil

    rep = tmp_path / "report"
    shutil.copytree(report["report"], rep)
    (rep / "frames.csv").unlink()
    code, _, err = cli(
        "study", "create", rep, "--db", tmp_path / "x.db", "--protocol", "abx", "--excerpt", "0.5"
    )
    assert code == 2
    assert_one_line_error(err, "frames.csv", "--excerpt-at START")
