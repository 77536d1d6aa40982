"""evalkit render: backends, renderer plugins, progress, resume after SIGKILL, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit import video
from evalkit.formats.run import RunDir, read_manifest, sha256_file
from evalkit.formats.suite import load_suite
from evalkit.render.driver import render_suite
from evalkit.testing.suites import write_suite

SMOKE = DATASETS / "smoke" / "suite.yaml"


@pytest.fixture(scope="module")
def tiny_pipeline(tmp_path_factory):
    from evalkit.testing import tiny_v2v

    path = tmp_path_factory.mktemp("tiny") / "pipe"
    tiny_v2v.build(path)
    return path


def frames_of(run_path, job_id):
    return video.read_frames(run_path / "clips" / f"{job_id}.mkv")[0]


def make_suite(tmp_path, prompts=("a", "b", "c"), seeds=(0, 1)):
    return write_suite(
        tmp_path, DATASETS / "smoke" / "clips" / "astronaut_pan.mkv", prompts=prompts, seeds=seeds
    )


# -- the diffusers renderer with a tiny pipeline built from configs ---------------------------


@pytest.mark.slow  # a diffusers pipeline in fp32 and bf16 on the CPU
def test_diffusers_pipeline_is_deterministic_per_backend_and_differs_across_dtypes(
    tiny_pipeline, tmp_path, cli
):
    opts = [
        "-O",
        f"model={tiny_pipeline}",
        "-O",
        "pipeline_class=evalkit.testing.tiny_v2v:TinyVideoToVideoPipeline",
    ]
    suite = load_suite(SMOKE)
    # two backends in one command, then fp32 again (its clips must be the same bits)
    for out, bf16_too in (("r1", True), ("r2", False)):
        backends = ["--backend", "cpu,dtype=fp32"] + (["--backend", "cpu,dtype=bf16"] * bf16_too)
        code, stdout, err = cli(
            "render", SMOKE, *backends, "--out", tmp_path / out, "--renderer", "diffusers", *opts, "--quiet"
        )
        assert code == 0, err
        assert stdout.count("2 rendered, 0 already done, 0 failed") == 1 + bf16_too, stdout
    fp32_1, fp32_2 = tmp_path / "r1" / "cpu", tmp_path / "r2" / "cpu"
    bf16 = tmp_path / "r1" / "cpu_dtype-bf16"
    m = read_manifest(fp32_1)
    assert m["renderer"]["name"] == "diffusers" and "CPU" in m["renderer"]["noise"]
    assert m["backend"]["dtype"] == "fp32" and read_manifest(bf16)["fingerprint"]["dtype"] == "bf16"
    for job in suite.jobs:
        # same backend and seed twice: bit-identical clips
        assert sha256_file(fp32_1 / "clips" / f"{job.id}.mkv") == sha256_file(
            fp32_2 / "clips" / f"{job.id}.mkv"
        )
        a, b = frames_of(fp32_1, job.id), frames_of(bf16, job.id)
        assert a.shape == b.shape == (8, 64, 64, 3)
        # fp32 against bf16: measurably different, but the same picture
        diff = np.abs(a.astype(int) - b.astype(int))
        assert diff.max() > 0 and diff.mean() < 40
        rec = [j for j in read_manifest(bf16)["jobs"] if j["id"] == job.id][0]
        assert rec["status"] == "done" and rec["timing"]["seconds"] > 0


@pytest.mark.slow  # a diffusers pipeline on the CPU
def test_seed_offset_changes_the_noise_but_not_the_job_ids(tiny_pipeline, tmp_path):
    opts = {
        "model": str(tiny_pipeline),
        "pipeline_class": "evalkit.testing.tiny_v2v:TinyVideoToVideoPipeline",
    }
    base = render_suite(
        SMOKE, ["cpu"], tmp_path, renderer="diffusers", options=opts, jobs=["astronaut_pan"], progress=False
    )[0]
    shifted = render_suite(
        SMOKE,
        ["cpu"],
        tmp_path,
        renderer="diffusers",
        options=opts,
        jobs=["astronaut_pan"],
        seed_offset=1,
        progress=False,
    )[0]
    assert shifted.path.name == "cpu_seed+1"
    jid = load_suite(SMOKE).jobs[0].id
    assert not np.array_equal(frames_of(base.path, jid), frames_of(shifted.path, jid))
    assert RunDir.open(shifted.path).job(jid)["effective_seed"] == 1


# -- resume ----------------------------------------------------------------------------------


@pytest.mark.slow  # a diffusers pipeline on the CPU
def test_resume_with_other_weights_under_the_same_path_is_refused(tiny_pipeline, tmp_path, cli):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_pipeline, model)
    opts = ["-O", f"model={model}", "-O", "pipeline_class=evalkit.testing.tiny_v2v:TinyVideoToVideoPipeline"]
    args = [
        "render",
        SMOKE,
        "-b",
        "cpu",
        "--renderer",
        "diffusers",
        *opts,
        "--jobs",
        "astronaut_pan",
        "--out",
        tmp_path / "runs",
    ]
    assert cli(*args)[0] == 0
    manifest = json.loads((tmp_path / "runs" / "cpu" / "manifest.json").read_text())
    assert len(manifest["renderer"]["model_sha256"]) == 64
    assert cli(*args)[0] == 0  # same weights: resumes
    manifest = json.loads((tmp_path / "runs" / "cpu" / "manifest.json").read_text())
    weights = next(p for p in model.rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # other weights, same path and size
    weights.write_bytes(bytes(data))
    code, _, err = cli(*args)
    assert code == 2
    assert_one_line_error(err, "has other contents now")
    assert json.loads((tmp_path / "runs" / "cpu" / "manifest.json").read_text()) == manifest


@pytest.mark.slow  # a render killed and re-run as processes
def test_sigkill_mid_run_then_rerun_completes_without_duplicates(tmp_path):
    suite_path = make_suite(tmp_path, prompts=("a", "b", "c", "d"), seeds=(0, 1))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "evalkit",
        "render",
        str(suite_path),
        "--backend",
        "cpu",
        "--out",
        str(out),
        "--renderer",
        "evalkit.testing.renderers:Invert",
        "-O",
        "sleep=0.4",
        "--quiet",
    ]
    env = dict(os.environ)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    manifest = out / "cpu" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        if (
            manifest.exists()
            and sum(j["status"] == "done" for j in json.loads(manifest.read_text())["jobs"]) >= 2
        ):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = json.loads(manifest.read_text())
    done_before = {j["id"] for j in before["jobs"] if j["status"] == "done"}
    assert 2 <= len(done_before) < 8
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"{8 - len(done_before)} rendered, {len(done_before)} already done, 0 failed" in again.stdout
    m = read_manifest(out / "cpu")
    ids = [j["id"] for j in m["jobs"]]
    assert len(ids) == len(set(ids)) == 8
    assert all(j["status"] == "done" for j in m["jobs"])
    clips = sorted(p.name for p in (out / "cpu" / "clips").iterdir())
    assert clips == sorted(f"{i}.mkv" for i in ids)  # nothing missing, nothing extra
    assert not list((out / "cpu").rglob(".tmp-*"))  # no half-written leftovers
    src = video.read_frames(DATASETS / "smoke" / "clips" / "astronaut_pan.mkv")[0]
    for j in m["jobs"]:
        clip = out / "cpu" / j["output"]["path"]
        assert sha256_file(clip) == j["output"]["sha256"]
        got = video.read_frames(clip)[0].astype(int)
        assert np.abs(got - (255 - src.astype(int))).max() <= 2


def test_rerun_skips_verified_jobs_and_redoes_tampered_ones(tmp_path):
    suite_path = make_suite(tmp_path)
    kw = dict(renderer="evalkit.testing.renderers:Invert", progress=False)
    first = render_suite(suite_path, ["cpu"], tmp_path / "o", **kw)[0]
    assert (first.done, first.skipped) == (6, 0)
    clip = sorted((first.path / "clips").iterdir())[0]
    clip.write_bytes(clip.read_bytes()[:-20] + b"\0" * 20)
    second = render_suite(suite_path, ["cpu"], tmp_path / "o", **kw)[0]
    assert (second.done, second.skipped) == (1, 5)
    assert RunDir.open(first.path).is_done(clip.stem)


def test_jobs_selects_a_subset(tmp_path):
    suite_path = make_suite(tmp_path)
    s = render_suite(
        suite_path,
        ["cpu"],
        tmp_path / "o",
        renderer="evalkit.testing.renderers:Invert",
        jobs=["pan-b-"],
        progress=False,
    )[0]
    assert s.done == 2
    assert {j["status"] for j in RunDir.open(s.path).jobs if j["prompt"] != "b"} == {"pending"}


# -- command and import renderers ------------------------------------------------------------

RENDER_SCRIPT = """\
import json, os, sys
from pathlib import Path
from PIL import Image
import numpy as np
job = json.load(open(sys.argv[1]))
assert os.environ["EVALKIT_JOB"] == sys.argv[1]
if job["prompt"] == "bad":
    print("cannot render prompt bad", file=sys.stderr)
    sys.exit(3)
inp = sorted(Path(os.environ["EVALKIT_INPUT_FRAMES"]).iterdir())
assert len(inp) == job["frames"] and Path(job["input"]).is_file()
out = Path(os.environ["EVALKIT_OUTPUT_DIR"])
for p in inp:
    Image.fromarray(255 - np.asarray(Image.open(p))).save(out / p.name)
"""


def test_command_renderer_runs_a_program_per_job(tmp_path):
    script = tmp_path / "render.py"
    script.write_text(RENDER_SCRIPT)
    suite_path = make_suite(tmp_path, prompts=("ok", "bad"), seeds=(0,))
    s = render_suite(
        suite_path,
        ["cpu"],
        tmp_path / "o",
        renderer="command",
        options={"cmd": f"{sys.executable} {script}"},
        progress=False,
    )[0]
    assert (s.done, s.failed) == (1, 1)
    [(bad_id, err)] = s.failures.items()
    assert "exited with 3" in err and "cannot render prompt bad" in err
    ok = [j for j in RunDir.open(s.path).jobs if j["status"] == "done"][0]
    src = video.read_frames(DATASETS / "smoke" / "clips" / "astronaut_pan.mkv")[0]
    assert np.array_equal(frames_of(s.path, ok["id"]), 255 - src)


def test_import_renderer_adopts_renders_by_job_id(tmp_path):
    suite_path = make_suite(tmp_path, prompts=("x", "y", "z"), seeds=(0,))
    suite = load_suite(suite_path)
    made = tmp_path / "made"
    made.mkdir()
    src = video.read_frames(DATASETS / "smoke" / "clips" / "astronaut_pan.mkv")[0]
    video.write_lossless(made / f"{suite.jobs[0].id}.mkv", src[:, ::-1], 24)
    folder = made / suite.jobs[1].id
    folder.mkdir()
    from PIL import Image

    for i, f in enumerate(src):
        Image.fromarray(f[:, ::-1]).save(folder / f"{i}.png")
    s = render_suite(
        suite_path, ["cpu"], tmp_path / "o", renderer="import", options={"dir": str(made)}, progress=False
    )[0]
    assert (s.done, s.failed) == (2, 1)
    assert np.array_equal(frames_of(s.path, suite.jobs[0].id), src[:, ::-1])
    assert np.array_equal(frames_of(s.path, suite.jobs[1].id), src[:, :, ::-1])
    assert f"no render for job {suite.jobs[2].id}" in s.failures[suite.jobs[2].id]


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, needle",
    [
        ("shape", "returned shape (8, 64, 64, 2), expected (N, H, W, 3)"),
        ("dtype", "returned dtype float32, expected uint8"),
        ("count", "returned 7 frames, expected 8"),
        ("raise", "RuntimeError: the pipeline exploded"),
        ("oom", "out of device memory: CUDA out of memory"),
    ],
)
def test_a_bad_job_is_recorded_and_the_others_go_on(mode, needle, tmp_path):
    suite_path = make_suite(tmp_path, prompts=("good", "bad", "fine"), seeds=(0,))
    s = render_suite(
        suite_path,
        ["cpu"],
        tmp_path / "o",
        renderer="evalkit.testing.renderers:Invert",
        options={"bad": mode},
        progress=False,
    )[0]
    assert (s.done, s.failed) == (2, 1)
    [(job_id, err)] = s.failures.items()
    assert "-bad-" in job_id and needle in err
    m = read_manifest(s.path)
    assert [j["status"] for j in m["jobs"]] == ["done", "failed", "done"]
    assert not (s.path / "clips" / f"{job_id}.mkv").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--renderer", "nope"], "renderer 'nope': unknown (built-in: diffusers, command, import, canary"),
        (["--backend", "cpu,precision=fp8"], "unknown key 'precision' (valid keys: dtype="),
        (["--backend", "cuda,dtype=bf16"], "CUDA/ROCm is not available here"),
        (["--renderer", "command"], "option 'cmd' is required"),
        (["-O", "colour=red"], "unknown option 'colour'"),
        (["--jobs", "zzz"], "--jobs: 'zzz' matches no job"),
        (["-O", "justtext"], "--renderer-opt: expected key=value"),
    ],
)
def test_bad_render_arguments_exit_2(args, needle, tmp_path, cli):
    base = {"--renderer": "evalkit.testing.renderers:Invert", "--backend": "cpu"}
    argv = ["render", str(SMOKE), "--out", str(tmp_path / "o"), "--quiet"]
    given = set(args[::2])
    for k, v in base.items():
        if k not in given:
            argv += [k, v]
    code, out, err = cli(*argv, *args)
    assert code == 2
    assert_one_line_error(err, needle)


@pytest.mark.slow  # a diffusers pipeline on the CPU
def test_a_real_diffusers_pipeline_class_animatediff_video_to_video(tmp_path):
    """diffusers' AnimateDiffVideoToVideoPipeline (tiny, from configs), resolved from its
    model_index.json; extra job params (height, width) pass through by name."""
    from evalkit.testing import tiny_animatediff

    model = tmp_path / "animatediff"
    tiny_animatediff.build(model)
    clip = DATASETS / "smoke" / "clips" / "hubble_object.mkv"
    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: ad
        clips: [{{id: hubble, path: {clip}}}]
        prompts: [watercolor]
        seeds: [3]
        params: {{strength: 0.6, steps: 4, guidance: 2.0, height: 64, width: 64}}
    """)
    )
    runs = {}
    for out, spec in (("a", "cpu"), ("b", "cpu"), ("a", "cpu,dtype=bf16")):
        [s] = render_suite(
            suite_path,
            [spec],
            tmp_path / out,
            renderer="diffusers",
            options={"model": str(model)},
            progress=False,
        )
        assert (s.done, s.failed) == (1, 0), s.failures
        runs[(out, spec)] = frames_of(s.path, load_suite(suite_path).jobs[0].id)
    a, again, bf16 = runs[("a", "cpu")], runs[("b", "cpu")], runs[("a", "cpu,dtype=bf16")]
    assert a.shape == (8, 64, 64, 3)
    assert np.array_equal(a, again)
    assert not np.array_equal(a, bf16)


def test_source_cache_prefetch_gives_the_same_frames_and_raises_where_get_would(tmp_path):
    """The next job's source is decoded on a thread while the current job renders: the frames
    are those a plain decode gives, a prefetch of the wrong clip is dropped, and a broken
    source fails the get() that needs it (not the prefetch)."""
    import dataclasses

    from evalkit.render.sources import SourceCache

    suite = load_suite(DATASETS / "smoke" / "suite.yaml")
    ids = list(suite.clips)
    plain = {c: video.ClipReader(suite.clips[c].path).read() for c in ids[:2]}
    sources = SourceCache(suite)
    try:
        first = sources.get(ids[0])[0]
        sources.prefetch(ids[1])
        assert sources.get(ids[0])[0] is first  # the current clip stays at hand
        assert np.array_equal(sources.get(ids[1])[0], plain[ids[1]])
        sources.prefetch(ids[1])  # already current: nothing to do
        sources.prefetch(ids[0])
        assert np.array_equal(sources.get(ids[0])[0], plain[ids[0]])
        bad = tmp_path / "broken.mkv"
        bad.write_bytes(b"not a video")
        suite.clips[ids[1]] = dataclasses.replace(suite.clips[ids[1]], path=bad)
        sources.prefetch(ids[1])  # the decode fails on the thread
        with pytest.raises(Exception) as e:
            sources.get(ids[1])
        assert "broken.mkv" in str(e.value)
    finally:
        sources.close()


# -- what runs between two pipeline calls (issue #16: the GPU never waits for the harness) ----


def test_the_first_pending_source_is_decoded_while_the_run_is_set_up(tmp_path, monkeypatch):
    """A new run starts decoding its first job's source before its manifest is written (the
    set-up overlaps the decode); a resumed run starts with its first pending job's source,
    not a done job's."""
    from evalkit.render.sources import SourceCache

    out, seen = tmp_path / "o", []
    real = SourceCache.prefetch

    def prefetch(self, clip_id):
        seen.append((clip_id, (out / "cpu" / "manifest.json").exists()))
        return real(self, clip_id)

    monkeypatch.setattr(SourceCache, "prefetch", prefetch)
    kw = dict(renderer="evalkit.testing.renderers:Invert", progress=False)
    [s] = render_suite(SMOKE, ["cpu"], out, **kw)
    assert (s.done, s.path) == (2, out / "cpu")
    assert seen[0] == ("astronaut_pan", False)
    run = RunDir.open(s.path)
    (s.path / run.job(run.jobs[1]["id"])["output"]["path"]).unlink()  # the second job redone
    seen.clear()
    [again] = render_suite(SMOKE, ["cpu"], out, **kw)
    assert (again.done, again.skipped) == (1, 1)
    assert seen == [("hubble_object", True)]


def test_with_many_cores_clips_are_encoded_in_parts_and_hashed_on_the_encoder_thread(tmp_path, monkeypatch):
    """A CPU render (writer threads) with 2 parts a clip (as with 8+ cores): each clip's parts
    are encoded at once, off the rendering thread, and the sha256 taken there is the file's."""
    import threading

    from evalkit.render import clipwriter, driver

    main, clips, parts = threading.get_ident(), [], []
    write, part_packets = clipwriter.ClipWriter.write, clipwriter._part_packets

    def write_clip(self, *args):
        clips.append(threading.get_ident())
        return write(self, *args)

    def part(*args):
        parts.append(threading.get_ident())
        return part_packets(*args)

    monkeypatch.setattr(clipwriter.ClipWriter, "write", write_clip)
    monkeypatch.setattr(clipwriter, "_part_packets", part)
    monkeypatch.setattr(driver, "clip_parts", lambda: 2)
    kw = dict(renderer="evalkit.testing.renderers:Invert", progress=False)
    [s] = render_suite(SMOKE, ["cpu"], tmp_path / "cpu", **kw)
    assert s.done == 2 and len(clips) == 2 and len(parts) == 4  # 8 frames: 2 parts
    assert main not in clips + parts
    run = RunDir.open(s.path)
    for rec in run.jobs:  # the sha256 taken on the encoder thread is the file's
        assert rec["output"]["sha256"] == sha256_file(s.path / rec["output"]["path"])


@pytest.mark.parametrize("codec", ["ffv1", "utvideo"])
def test_a_clip_encoded_in_parts_is_byte_identical_to_one_encoders(codec, tmp_path):
    """clipwriter: parts encoded at once, muxed in order, give write_lossless's bytes (odd
    sizes, an NTSC rate, uneven parts; a part too small falls back to one encoder)."""
    from concurrent.futures import ThreadPoolExecutor
    from fractions import Fraction

    from evalkit.lossless import lossless_format
    from evalkit.render.clipwriter import split_points, write_lossless_parts

    ext = lossless_format(codec).ext
    frames = video.read_frames(DATASETS / "smoke" / "clips" / "astronaut_pan.mkv")[0]
    frames = np.concatenate([frames, frames[::-1, ::-1]])[:13, :63, :61]  # 13 frames, 61x63
    assert split_points(13, 3) == [(0, 4), (4, 9), (9, 13)]
    assert split_points(13, 4) == [(0, 4), (4, 9), (9, 13)] and split_points(5, 3) == [(0, 5)]
    with ThreadPoolExecutor(3) as pool:
        for fps in (24, Fraction(30000, 1001)):
            one, parts = tmp_path / f"one{ext}", tmp_path / f"parts{ext}"
            video.write_lossless(one, frames, fps, codec=codec)
            assert write_lossless_parts(parts, frames, fps, codec=codec, pool=pool, parts=3) == 13
            assert parts.read_bytes() == one.read_bytes()
            assert np.array_equal(video.read_frames(parts)[0], frames)
        with pytest.raises(ValueError, match="clips are"):
            write_lossless_parts(tmp_path / "x.mp4", frames, 24, codec=codec, pool=pool, parts=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([one.name, parts.name])


def test_progress_reuses_one_job_bar():
    from evalkit.render.progress import Progress

    p = Progress(2, enabled=True)
    try:
        p.start_job("first job")(3, 12)
        bar = p.job_bar
        assert (bar.n, bar.total) == (3, 12)
        p.end_job(True)
        update = p.start_job("second job")
        assert p.job_bar is bar and (bar.n, bar.total, bar.desc) == (0, 1, "second job")
        update(1, 4)
        p.end_job(False)
        assert (bar.n, bar.total, p.overall.n) == (1, 4, 2)
    finally:
        p.close()
    assert p.job_bar is None
