"""VMAF (evalkit.metrics.vmaf; --vmaf on `metrics` and `compare`): real libvmaf in imageio-ffmpeg's
ffmpeg, real x264 encodes, the real CLI."""

from __future__ import annotations

import csv
import json
import re
import subprocess

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit.metrics import MetricInputError
from evalkit.metrics.vmaf import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    VmafUnavailable,
    check_available,
    ffmpeg_exe,
    rgb_to_yuv444,
    vmaf,
)

SMOKE = DATASETS / "smoke" / "suite.yaml"


def moving_clip(n=8, h=64, w=96, step=5, seed=0):
    """(n, h, w, 3) uint8: a smooth random texture with fine grain, panning ``step`` px a frame."""
    rng = np.random.default_rng(seed)
    big_h, big_w = h + 8, w + step * n + 8
    base = rng.integers(0, 256, (big_h // 8 + 1, big_w // 8 + 1, 3)).astype(np.float64)
    tex = np.repeat(np.repeat(base, 8, 0), 8, 1)[:big_h, :big_w]
    tex = np.clip(tex + rng.normal(0, 18, tex.shape), 0, 255)
    return np.stack([tex[4 : 4 + h, step * t : step * t + w] for t in range(n)]).astype(np.uint8)


def noisy(a, sigma, seed=1):
    rng = np.random.default_rng(seed)
    return np.clip(a + rng.normal(0, sigma, a.shape), 0, 255).astype(np.uint8)


# -- the colour conversion -------------------------------------------------------------------


def test_conversion_is_the_stated_matrix_and_range():
    rgb = np.array([[[255, 255, 255], [0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]]], np.uint8)

    def yuv(**kw):
        return rgb_to_yuv444(rgb, **kw)[0].reshape(3, -1).T.tolist()

    # BT.709 limited range (ITU-R BT.709-6 with 8-bit studio levels): the textbook values
    assert yuv() == [[235, 128, 128], [16, 128, 128], [63, 102, 240], [173, 42, 26], [32, 240, 118]]
    assert yuv(matrix="bt601") == [
        [235, 128, 128],
        [16, 128, 128],
        [81, 90, 240],
        [145, 54, 34],
        [41, 240, 110],
    ]
    assert yuv(yuv_range="full")[:3] == [[255, 128, 128], [0, 128, 128], [54, 99, 255]]
    grey = np.full((2, 4, 4, 3), 128, np.uint8)
    assert rgb_to_yuv444(grey).shape == (2, 3, 4, 4)
    assert set(rgb_to_yuv444(grey)[:, 0].ravel()) == {126}  # 16 + 219 * 128 / 255


# -- what VMAF says ----------------------------------------------------------------------------


def test_identical_clips_score_the_models_maximum_on_every_frame():
    a = moving_clip()
    same = vmaf(a, a.copy()).scores
    # from frame 1 on the reference moves: identical frames reach the model's clip, 100
    assert same[1:].tolist() == [100.0] * (len(a) - 1)
    # frame 0 has no predecessor: motion 0, where identical frames (VIF = ADM = 1) get the
    # model's value at zero motion; it hardly depends on the content (libvmaf's integer VIF and
    # ADM of identical frames differ from 1 in the last digits): a still clip of other content
    # scores it on every frame
    still = np.repeat(moving_clip(n=1, seed=5), 4, axis=0)
    still_scores = vmaf(still, still.copy()).scores
    assert still_scores.tolist() == pytest.approx([same[0]] * 4, abs=1e-3)
    assert 90 < same[0] < 100
    # no degraded frame scores above the identical one (strong motion lets the model forgive
    # mild noise up to its clip at 100), and strong noise scores below it
    for sigma in (6, 30):
        worse = vmaf(a, noisy(a, sigma)).scores
        assert (worse <= same).all() and worse[0] < same[0]
    assert (worse < same).all()


def test_equals_ffmpeg_libvmaf_run_directly_on_the_same_yuv(tmp_path):
    a, b = moving_clip(n=6), noisy(moving_clip(n=6), 5)
    ours = vmaf(a, b, n_threads=2)
    n, h, w = a.shape[:3]
    rgb_to_yuv444(a).tofile(tmp_path / "ref.yuv")  # planar yuv444p, frame after frame
    rgb_to_yuv444(b).tofile(tmp_path / "dist.yuv")

    def direct(ref, dist, pix_fmt, log):
        raw = ["-f", "rawvideo", "-pix_fmt", pix_fmt, "-s", f"{w}x{h}", "-r", "25", "-i"]
        subprocess.run(
            [
                ffmpeg_exe(),
                "-hide_banner",
                "-loglevel",
                "error",
                *raw,
                str(dist),
                *raw,
                str(ref),
                "-lavfi",
                f"[0:v][1:v]libvmaf=model=version={DEFAULT_MODEL}:log_fmt=json:log_path={log}",
                "-f",
                "null",
                "-",
            ],
            check=True,
        )
        return [f["metrics"]["vmaf"] for f in json.loads(log.read_text())["frames"]]

    expected = direct(tmp_path / "ref.yuv", tmp_path / "dist.yuv", "yuv444p", tmp_path / "d.json")
    assert len(expected) == n
    # the same libvmaf on the same YUV (its features are fixed-point integers, its model float64);
    # both scores come through its JSON log, printed with 6 decimals: half a unit of the last
    np.testing.assert_allclose(ours.scores, expected, rtol=0, atol=0.5e-6 + 1e-12)
    assert 20 < ours.mean < 100 and ours.model == DEFAULT_MODEL
    assert f"model {DEFAULT_MODEL}" in ours.convention and "BT.709" in ours.convention
    assert "limited range" in ours.convention and ours.libvmaf_version in ours.convention
    # the models read luma only: 4:2:0 made from the same luma scores the same
    for name, x in (("ref", a), ("dist", b)):
        p = rgb_to_yuv444(x)
        c = p[:, 1:].reshape(n, 2, h // 2, 2, w // 2, 2).mean((3, 5)).round().astype(np.uint8)
        np.concatenate([p[:, 0].reshape(n, -1), c.reshape(n, -1)], 1).tofile(tmp_path / f"{name}420.yuv")
    assert (
        direct(tmp_path / "ref420.yuv", tmp_path / "dist420.yuv", "yuv420p", tmp_path / "d420.json")
        == expected
    )


@pytest.mark.parametrize("clip", ["astronaut_pan", "hubble_object"])
def test_a_crf32_encode_scores_lower_than_a_crf16_encode(tmp_path, clip):
    import av

    from evalkit.video import ClipReader

    a = ClipReader(DATASETS / "smoke" / "clips" / f"{clip}.mkv").read()  # natural content

    def x264(crf):
        path = tmp_path / f"crf{crf}.mp4"
        with av.open(str(path), "w") as c:
            s = c.add_stream("libx264", rate=24, options={"crf": str(crf), "preset": "veryfast"})
            s.width, s.height, s.pix_fmt = a.shape[2], a.shape[1], "yuv420p"
            for f in a:
                c.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
            c.mux(s.encode())
        with av.open(str(path)) as c:
            return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])

    hi, lo = vmaf(a, x264(16)), vmaf(a, x264(32))
    assert len(hi.scores) == len(lo.scores) == len(a) == 8
    assert lo.mean < hi.mean - 5, (lo.mean, hi.mean)
    assert (lo.scores < hi.scores).all()


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, kw, needle",
    [
        (moving_clip(h=16, w=16), moving_clip(h=16, w=16), {}, "VMAF needs at least 32x32"),
        (moving_clip(), moving_clip(n=7), {}, "b: 7 frames, expected 8 like a"),
        (moving_clip(), moving_clip(w=64), {}, "b: frame 0 is 64x64, expected 96x64 like a"),
        (moving_clip().astype(np.float32), moving_clip(), {}, "a: frame 0: expected uint8 RGB"),
        (moving_clip()[..., :2], moving_clip(), {}, "a: frame 0: expected uint8 RGB"),
        (moving_clip()[:0], moving_clip(), {}, "a: expected at least one frame, found none"),
        (moving_clip(), moving_clip(), {"model": "vmaf_b_v0.6.3"}, "model: expected a built-in"),
        (moving_clip(), moving_clip(), {"matrix": "bt2020"}, "matrix: expected one of bt709, bt601"),
        (moving_clip(), moving_clip(), {"yuv_range": "pc"}, "yuv_range: expected one of limited, full"),
        (moving_clip(), moving_clip(), {"n_threads": 0}, "n_threads: expected a positive integer"),
    ],
)
def test_bad_frames_and_options(a, b, kw, needle):
    with pytest.raises(MetricInputError) as e:
        vmaf(a, b, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_binary_or_filter(tmp_path, monkeypatch):
    with pytest.raises(VmafUnavailable, match="nope: not an executable file"):
        vmaf(moving_clip(), moving_clip(), ffmpeg=str(tmp_path / "nope"))
    with pytest.raises(VmafUnavailable, match="/bin/true: has no libvmaf filter"):
        check_available("/bin/true")  # a real program, without the filter
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "gone"))
    with pytest.raises(VmafUnavailable, match="IMAGEIO_FFMPEG_EXE: .*gone: not an executable"):
        check_available()
    assert set(BUILTIN_MODELS) >= {DEFAULT_MODEL}


# -- the CLI: compare and metrics --------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from evalkit.render.driver import render_suite

    root = tmp_path_factory.mktemp("runs")
    render_suite(
        SMOKE, ["cpu", "cpu,dtype=bf16"], root, renderer="evalkit.testing.renderers:Invert", progress=False
    )
    render_suite(
        SMOKE, ["cpu"], root, renderer="evalkit.testing.renderers:Invert", seed_offset=1, progress=False
    )
    return {"a": root / "cpu", "b": root / "cpu_dtype-bf16", "seed": root / "cpu_seed+1"}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_compare_vmaf_writes_the_columns_and_gates_on_them(runs, tmp_path, cli):
    from evalkit.compare.vmaf import clip_vmaf

    gate = tmp_path / "gate.yaml"
    # min bounds (higher is better): the mean passes 10, the worst frame cannot pass 100.5
    gate.write_text("vmaf: {mean: {min: 10}, worst: {min: 100.5}}\nlpips: {mean: {max: 1}}\n")
    out = tmp_path / "report"
    code, stdout, err = cli(
        "compare",
        runs["a"],
        runs["b"],
        "--out",
        out,
        "--quiet",
        "--device",
        "cpu",
        "--no-temporal",
        "--vmaf",
        "--vmaf-threads",
        "2",
        "--gate",
        gate,
        "--floor",
        runs["seed"],
    )
    assert code == 1, err
    assert "vmaf" in stdout and "gate: FAIL" in stdout and "vmaf worst = " in stdout
    frames, clips = read_csv(out / "frames.csv"), read_csv(out / "clips.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(frames) == 16 and all(0 < float(r["vmaf"]) <= 100 for r in frames)
    for row in clips:  # per clip: the pass's scores of that pair, aggregated like psnr
        res = clip_vmaf(runs["a"] / "clips" / f"{row['job']}.mkv", runs["b"] / "clips" / f"{row['job']}.mkv")
        per_frame = [float(r["vmaf"]) for r in frames if r["job"] == row["job"]]
        np.testing.assert_allclose(per_frame, res.scores, rtol=0, atol=1e-9)
        assert float(row["vmaf_mean"]) == pytest.approx(res.mean)
        assert float(row["vmaf_worst"]) == pytest.approx(res.scores.min())  # higher is better
    agg = summary["aggregates"]["vmaf"]
    assert agg["frames"] == 16 and agg["worst"] <= agg["p95"] <= agg["mean"]
    assert summary["conventions"]["vmaf"].startswith("libvmaf ")
    floor = summary["floors"]["seed"]["aggregates"]["vmaf"]  # the floor is scored too
    assert floor["frames"] == 16 and "vmaf" not in summary["floor_ratios"]["seed"]
    # each clip's sentence says its VMAF and its floor job's (no ratio: VMAF has none)
    for f in summary["clip_findings"]:
        row = next(r for r in clips if r["job"] == f["clip"])
        assert f["vmaf"] == pytest.approx(float(row["vmaf_mean"]))
        # (a clip over the gate on its own has the gate's words after it)
        assert re.search(rf"; VMAF {f['vmaf']:.3g} \(the seed floor's [0-9.]+\) of 100(;|$)", f["text"])
        assert f["text"] in stdout
    checks = {c["check"]: c for c in summary["gate"]["checks"]}
    assert checks["vmaf mean"]["pass"] and checks["vmaf mean"]["value"] == agg["mean"]
    assert not checks["vmaf worst"]["pass"] and checks["vmaf worst"]["value"] == agg["worst"]
    assert summary["gate"]["reasons"] == [checks["vmaf worst"]["text"]]
    # without --vmaf: no vmaf column, and a gate on vmaf is a one-line user error
    code, _, err = cli(
        "compare",
        runs["a"],
        runs["b"],
        "--out",
        out,
        "--quiet",
        "--device",
        "cpu",
        "--no-temporal",
        "--gate",
        gate,
    )
    assert code == 2
    assert_one_line_error(err, str(gate), "field 'vmaf'", "--vmaf")
    code, _, err = cli(
        "compare", runs["a"], runs["b"], "--out", out, "--quiet", "--device", "cpu", "--no-temporal"
    )
    assert code == 0, err
    assert "vmaf" not in read_csv(out / "frames.csv")[0]
    assert "vmaf_mean" not in read_csv(out / "clips.csv")[0]
    assert "vmaf" not in json.loads((out / "summary.json").read_text())["conventions"]


def test_metrics_vmaf_json_and_csv(runs, tmp_path, cli, monkeypatch):
    clip_a = sorted((runs["a"] / "clips").glob("*.mkv"))[0]
    clip_b = runs["b"] / "clips" / clip_a.name
    code, js, err = cli(
        "metrics",
        clip_a,
        clip_b,
        "--json",
        "--device",
        "cpu",
        "--no-temporal",
        "--vmaf",
        "--csv",
        tmp_path / "f.csv",
    )
    assert code == 0, err
    m = json.loads(js)
    from evalkit.compare.vmaf import clip_vmaf

    res = clip_vmaf(clip_a, clip_b)
    assert m["per_frame"]["vmaf"] == res.scores.tolist()
    assert m["vmaf"] == pytest.approx(res.mean) and "vmaf" in m["units"]
    assert m["conventions"]["vmaf"] == res.convention
    assert [float(r["vmaf"]) for r in read_csv(tmp_path / "f.csv")] == res.scores.tolist()
    # no ffmpeg with libvmaf: one line, exit 2
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", "/bin/true")
    code, _, err = cli("metrics", clip_a, clip_b, "--device", "cpu", "--no-temporal", "--vmaf")
    assert code == 2
    assert_one_line_error(err, "/bin/true: has no libvmaf filter")
