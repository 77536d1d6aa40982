"""Real-scale plumbing on small inputs: parallel decoding in compare/metrics gives the same
numbers as one-clip-at-a-time decoding, stays bounded, reports errors and shows progress."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from conftest import DATASETS

from evalkit.formats.suite import load_suite
from evalkit.render.driver import render_suite
from evalkit.video import ClipReader, Prefetch, write_lossless

SMOKE = DATASETS / "smoke" / "suite.yaml"


@pytest.fixture(scope="module")
def import_runs(tmp_path_factory):
    """Two runs of the smoke suite adopted with the import renderer: the clips themselves, and
    the clips with seeded noise (so every frame differs)."""
    root = tmp_path_factory.mktemp("scale")
    suite = load_suite(SMOKE)
    noisy = root / "noisy"
    rng = np.random.default_rng(16)
    for job in suite.jobs:
        frames = ClipReader(suite.clips[job.clip].path).read()
        noise = rng.integers(-6, 7, frames.shape)
        write_lossless(
            noisy / f"{job.id}.mkv", np.clip(frames.astype(int) + noise, 0, 255).astype(np.uint8), 24
        )
        write_lossless(root / "same" / f"{job.id}.mkv", frames, 24)
    render_suite(
        SMOKE, ["cpu"], root / "a", renderer="import", options={"dir": str(root / "same")}, progress=False
    )
    render_suite(SMOKE, ["cpu"], root / "b", renderer="import", options={"dir": str(noisy)}, progress=False)
    return root / "a" / "cpu", root / "b" / "cpu"


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


@pytest.mark.slow  # compares run several ways
@pytest.mark.parametrize("chunk", [None, 3])
def test_compare_with_parallel_decoding_matches_sequential_decoding(import_runs, tmp_path, chunk):
    from evalkit.compare.local import psnr_of, worst_block
    from evalkit.compare.run import compare_runs
    from evalkit.metrics.stream import PairEvaluator, stream_pair

    res = compare_runs(*import_runs, tmp_path / "r", device="cpu", chunk=chunk, progress=False)
    assert len(res.measures) == 2
    ev = PairEvaluator(device="cpu")
    try:
        for m in res.measures:
            ev.reset()
            # frame by frame, one clip after the other: the path compare took before
            seq = list(
                stream_pair(
                    iter(ClipReader(m.pair.path_a)),
                    iter(ClipReader(m.pair.path_b)),
                    evaluator=ev,
                    chunk=chunk,
                )
            )
            assert len(seq) == len(m.records) == 8
            frames_a, frames_b = ClipReader(m.pair.path_a).read(), ClipReader(m.pair.path_b).read()
            for i, (r, s) in enumerate(zip(m.records, seq)):
                # compare adds each frame's worst block (evalkit.compare.local) from the same
                # decoded frames: the sequential path's frames give the same figure
                assert r.keys() == s.keys() | {"block_psnr"}
                assert all(_same(r[k], s[k]) for k in s), (m.pair.job_id, r, s)
                assert _same(r["block_psnr"], psnr_of(worst_block(frames_a[i], frames_b[i])[0]))
            # the report's thumbnails are the worst frame's, as decoded
            assert m.worst_frame == int(np.argmax([s["lpips"] for s in seq]))
            assert np.array_equal(m.worst_a, ClipReader(m.pair.path_a).read()[m.worst_frame])
            assert np.array_equal(m.worst_b, ClipReader(m.pair.path_b).read()[m.worst_frame])
    finally:
        ev.close()


def test_compare_shows_per_frame_progress(import_runs, tmp_path, capsys):
    from evalkit.compare.run import compare_runs

    compare_runs(*import_runs, tmp_path / "r", device="cpu", progress=True)
    err = capsys.readouterr().err
    assert "compare" in err and "16/16" in err and "frame" in err


def test_metrics_shows_per_frame_progress_when_asked(import_runs, capsys):
    from evalkit.compare.clips import compare_clips

    a, b = (sorted((r / "clips").glob("*.mkv"))[0] for r in import_runs)
    out = compare_clips(a, b, device="cpu", progress=True, keep_frames=False)
    err = capsys.readouterr().err
    assert out["frames"] == 8 and "metrics" in err and "8/8" in err


def test_prefetch_stays_bounded_and_stops_when_closed():
    made = []
    release = threading.Event()

    def items():
        for i in range(100):
            made.append(i)
            yield i

    p = Prefetch(items(), depth=3)
    assert next(p) == 0
    release.wait(0.5)  # let the thread run ahead as far as it may
    assert len(made) <= 1 + 3 + 1  # the one taken, the queue, the one waiting to go in
    p.close()
    p._thread.join(2)
    assert not p._thread.is_alive()
    assert len(made) < 10
    with pytest.raises(StopIteration):
        next(p)


def test_prefetch_hands_the_readers_error_to_the_consumer(tmp_path):
    from evalkit.errors import VideoError

    bad = tmp_path / "cut.mkv"
    good = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoError) as direct:
        list(ClipReader(bad).chunks(2))
    p = Prefetch(ClipReader(bad).chunks(2), depth=2)
    with pytest.raises(VideoError) as threaded:
        list(p)
    assert str(threaded.value) == str(direct.value)
    assert len(list(Prefetch(ClipReader(good).chunks(3)))) == 3  # 8 frames: 3 + 3 + 2


def test_study_media_made_in_parallel_are_those_made_one_by_one(import_runs, tmp_path, monkeypatch, capsys):
    from sqlalchemy import select

    from evalkit.compare.run import compare_runs
    from evalkit.study import create_study, media, open_db, planning
    from evalkit.study.store import clips, studies
    from evalkit.testing.studies import study_config

    # the planner's figure is not what is tested here: a small simulation
    monkeypatch.setattr(
        planning,
        "cached_plan",
        lambda protocol, margin, n, alpha: planning.plan(
            protocol, margin, clips=n, alpha=alpha, studies=40, reps=40
        ),
    )
    compare_runs(*import_runs, tmp_path / "r", device="cpu", progress=False)
    rows = {}
    for workers in (1, 2):
        monkeypatch.setattr(media, "media_workers", lambda w=workers: w)
        db = tmp_path / f"s{workers}.db"
        r = create_study(
            tmp_path / "r", db, protocol="abx", seed=3, progress=workers == 2, allow_masking=True
        )
        assert r["clips"] == 2 and r["catch_versions"] >= 2
        d = open_db(db)
        with d.engine.begin() as conn:
            cl = [dict(x) for x in conn.execute(select(clips)).mappings()]
            sid = conn.execute(select(studies.c.id)).scalar_one()
        cfg = study_config(db, sid)  # the catch pool is sealed: opened with the key file
        for x in cl:
            x.pop("id"), x.pop("study_id")
        rows[workers] = (
            cl,
            [{k: v for k, v in p.items() if k != "clip_id"} for p in cfg["catch_pool"]],
            cfg["media_seconds"],
            sorted(p.name for p in (tmp_path / f"s{workers}.media").glob("*.mp4")),
        )
    assert rows[1] == rows[2]
    assert "study media" in capsys.readouterr().err


def test_hue_catch_version_by_frame_groups_is_the_whole_clip_transform():
    from evalkit.study import media

    frames = ClipReader(DATASETS / "smoke" / "clips" / "hubble_object.mkv").read()
    frames = np.concatenate([frames, frames[::-1], frames[:3]])  # 19 frames: 8 + 8 + 3
    c, s = np.cos(np.radians(20.0)), np.sin(np.radians(20.0))
    rot = np.array([[1, 0, 0], [0, c, -s], [0, s, c]], np.float32)
    m = (np.linalg.inv(media._YCC) @ rot @ media._YCC).astype(np.float32)
    whole = np.clip(frames.astype(np.float32) @ m.T + 0.5, 0, 255).astype(np.uint8)
    assert np.array_equal(media.degrade(frames, 24, "hue_mild"), whole)


def test_study_plan_reports_each_simulation():
    from evalkit.study import plan

    steps = []
    p = plan("preference", 0.2, clips=15, studies=40, reps=40, progress=steps.append)
    assert steps and all("raters" in s for s in steps)
    assert any(s.startswith(f"{p['raters']} raters") for s in steps)


def test_a_writer_error_fails_only_its_job_and_the_render_goes_on(tmp_path, monkeypatch):
    from evalkit import video
    from evalkit.formats.run import RunDir
    from evalkit.testing.suites import write_suite

    suite = write_suite(
        tmp_path,
        DATASETS / "smoke" / "clips" / "astronaut_pan.mkv",
        name="writer",
        prompts=("a", "b", "c"),
        seeds=(0,),
    )
    real = video.write_browser

    def flaky(path, frames, fps, *a, **kw):
        if "-b-" in path.name:
            raise OSError(28, "No space left on device")
        return real(path, frames, fps, *a, **kw)

    monkeypatch.setattr(video, "write_browser", flaky)
    s = render_suite(
        suite, ["cpu"], tmp_path / "out", renderer="evalkit.testing.renderers:Invert", progress=False
    )[0]
    assert (s.done, s.failed) == (2, 1)
    ((jid, why),) = s.failures.items()
    assert "-b-" in jid and "writing the clip failed" in why and "No space left" in why
    run = RunDir.open(s.path)
    assert not run.clip_path(jid).exists() and not run.preview_path(jid).exists()
    for j in run.jobs:
        if j["id"] != jid:
            assert run.is_done(j["id"], verify=True) and run.preview_path(j["id"]).is_file()
    monkeypatch.setattr(video, "write_browser", real)
    again = render_suite(
        suite, ["cpu"], tmp_path / "out", renderer="evalkit.testing.renderers:Invert", progress=False
    )[0]
    assert (again.done, again.failed, again.skipped) == (1, 0, 2)


@pytest.fixture(scope="module")
def make_scale():
    import sys

    if str(DATASETS) not in sys.path:
        sys.path.insert(0, str(DATASETS))
    import make_scale

    return make_scale


def test_real_scale_generator_renders_16_9_frames_in_parts_like_the_whole_clip(
    make_scale, tmp_path, monkeypatch
):
    from make_clips import render_clip

    spec = make_scale.ScaleSpec(96, 54, 7, 24)
    whole = render_clip("hubble_object", 96, 7, 24, height=54, subframes=3)
    assert whole.shape == (7, 54, 96, 3) and whole.std() > 10
    assert not np.array_equal(whole[0], whole[-1])  # the camera moves
    monkeypatch.setitem(make_scale.SUITES, "scale720", spec)
    monkeypatch.setattr(make_scale, "PART", 3)  # parts of 3 + 3 + 1 frames
    paths = make_scale.generate("scale720", tmp_path, workers=2, clips=["hubble_object", "astronaut_pan"])
    assert [p.name for p in paths] == ["hubble_object.mkv", "astronaut_pan.mkv"]
    assert np.array_equal(ClipReader(paths[0]).read(), whole)
    assert ClipReader(paths[1]).read().shape == (7, 54, 96, 3)


def test_real_scale_suites_name_the_generated_clips(make_scale):
    import yaml

    from evalkit.formats.gate import load_gate
    from evalkit.metrics.catalogue import keys

    for name, spec in make_scale.SUITES.items():
        doc = yaml.safe_load((DATASETS / name / "suite.yaml").read_text())
        assert doc["name"] == name and len(doc["jobs"]) == 8 and spec.frames == 240
        assert sorted(c["id"] for c in doc["clips"]) == sorted(make_scale.CLIPS)
        assert {c["path"] for c in doc["clips"]} == {f"clips/{c}.mkv" for c in make_scale.CLIPS}
        gate = load_gate(
            DATASETS / name / "gate.yaml", metrics=keys(compares=True), ratio_metrics=keys(ratio=True)
        )
        assert gate.ratios


@pytest.mark.slow  # decoding in worker processes
def test_compare_and_metrics_decoding_in_worker_processes_match_threads(import_runs, tmp_path, monkeypatch):
    from evalkit.compare.clips import compare_clips
    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs

    got = {}
    for mode in ("0", "1"):  # threads, then worker processes (evalkit.procdecode)
        monkeypatch.setattr("evalkit.procdecode.PROCESS_MIN_CORES", 0 if mode == "1" else 10**6)
        res = compare_runs(
            *import_runs,
            tmp_path / mode,
            device="cpu",
            chunk=3,
            progress=False,
            metrics=MetricOptions(temporal=False),
        )
        a, b = (sorted((r / "clips").glob("*.mkv"))[1] for r in import_runs)
        got[mode] = (res, compare_clips(a, b, device="cpu", chunk=2, temporal=False))
    (rt, mt), (rp, mp) = got["0"], got["1"]
    assert [m.pair.job_id for m in rp.measures] == [m.pair.job_id for m in rt.measures]
    for p, t in zip(rp.measures, rt.measures):
        assert len(p.records) == len(t.records) == 8
        assert all(_same(x[k], y[k]) for x, y in zip(p.records, t.records) for k in x)
        assert p.worst_frame == t.worst_frame
        # the worst frames were copied out of the shared memory before it was handed back
        assert np.array_equal(p.worst_a, ClipReader(p.pair.path_a).read()[p.worst_frame])
        assert np.array_equal(p.worst_b, ClipReader(p.pair.path_b).read()[p.worst_frame])
    assert mp["per_frame"] == mt["per_frame"] and mp["frames"] == 8


def test_a_warm_up_changes_no_record(import_runs):
    from evalkit.metrics.stream import PairEvaluator, stream_pair

    a, b = (sorted((r / "clips").glob("*.mkv"))[0] for r in import_runs)
    fa, fb = ClipReader(a).read(), ClipReader(b).read()
    got = []
    for warm in (False, True):
        ev = PairEvaluator(device="cpu")
        try:
            if warm:
                ev.warm_up(fa.shape[1], fa.shape[2], 3)
            got.append((list(stream_pair(iter(fa), iter(fb), evaluator=ev, chunk=3)), ev.compute()))
        finally:
            ev.close()
    (cold, cold_sum), (hot, hot_sum) = got
    assert len(hot) == 8 and all(_same(x[k], y[k]) for x, y in zip(cold, hot) for k in x)
    assert hot_sum["frames"] == 8 and hot_sum["means"] == cold_sum["means"]


def test_readers_run_ahead_by_bytes_so_1080p_holds_fewer_frames_than_720p():
    from evalkit.compare.clips import prefetch_depth

    hd, full = 1280 * 720 * 3, 1920 * 1080 * 3
    assert prefetch_depth(16, frame_bytes=hd) == prefetch_depth(16) == 2  # 720p as before
    assert prefetch_depth(8, frame_bytes=hd) == prefetch_depth(8) == 4
    assert prefetch_depth(7, frame_bytes=full) == 2 < prefetch_depth(7)  # 14 frames, not 35
    assert prefetch_depth(3, frame_bytes=full) * 3 * full <= 32 * hd + 3 * full
    assert prefetch_depth(1, frame_bytes=10**12) == 2  # never below 2 chunks
