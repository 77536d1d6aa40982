"""Temporal alignment (evalkit.compare.alignment): the offset detector on real footage, and
`evalkit metrics` through the CLI on shifted, re-encoded and rate-mismatched clips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit.compare.alignment import (
    MAX_OFFSET,
    MIN_PAIRS,
    WINDOW,
    detect_offset,
    probe_clips,
    rate_mismatch,
    read_small_luma,
    skip_frames,
    small_luma,
)
from evalkit.video import BrowserEncoding, read_frames, write_browser, write_lossless

CANARY = sorted((DATASETS / "canary" / "clips").glob("*.mkv"))
SMOKE = sorted((DATASETS / "smoke" / "clips").glob("*.mkv"))


@pytest.fixture(scope="module")
def footage():
    """Small luma of the real clips' first WINDOW + 1 frames."""
    return {
        p.stem + ("" if p.parent.parent.name == "canary" else "_smoke"): read_small_luma(p, WINDOW + 1)
        for p in CANARY + SMOKE
    }


def test_real_footage_moves_enough_to_test(footage):
    assert len(footage) == 10
    for name, luma in footage.items():
        assert detect_offset(luma, luma).finding == "aligned", name


@pytest.mark.parametrize("shift", [1, 2, 3])
def test_fires_on_real_shifts_both_ways(footage, shift):
    for name, luma in footage.items():
        if len(luma) - shift < MAX_OFFSET + MIN_PAIRS:  # the 8-frame smoke clips at 2, 3
            continue
        early = detect_offset(luma[:-shift], luma[shift:])  # B = A without its first frames
        late = detect_offset(luma[shift:], luma[:-shift])  # B = A with frames before A's
        assert (early.finding, early.offset) == ("shifted", -shift), (name, early)
        assert (late.finding, late.offset) == ("shifted", shift), (name, late)
        assert "early" in early.text(10) and "late" in late.text(10)


def test_identical_and_static_clips_never_fire(footage):
    luma = footage["astronaut_pan"]
    same = detect_offset(luma, [f.copy() for f in luma])
    assert same.finding == "aligned" and same.mad[0] == 0.0
    still = [luma[0]] * len(luma)
    r = detect_offset(still, still[1:] + [luma[0]])
    assert r.finding == "static" and r.offset == 0 and "barely moves" in r.reason
    # a still clip with noise (a re-encode of a still frame): still not testable, no offset
    rng = np.random.default_rng(0)
    noisy = [luma[0] + rng.normal(0, 2, luma[0].shape).astype(np.float32) for _ in luma]
    assert detect_offset(still, noisy).offset == 0


def test_too_short_clips_are_not_tested(footage):
    luma = footage["astronaut_pan"]
    r = detect_offset(luma[: MAX_OFFSET + 3], luma[1 : MAX_OFFSET + 4])
    assert r.finding == "short" and r.offset == 0 and "not tested" in r.text()


def _bf16(frames: np.ndarray, seed: int) -> np.ndarray:
    """Frames as a bf16 pipeline might give them: through bfloat16 (8 bits of mantissa) in the
    [-1, 1] range of a VAE's output, after a small seeded perturbation of that range (a bf16
    network's accumulated rounding, about 2 grey levels), rounded back to 8 bits."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(frames.astype(np.float32) / 127.5 - 1)
    x = (x + torch.randn(x.shape, generator=g) * (2 / 127.5)).to(torch.bfloat16).float()
    return np.clip(np.rint((x.numpy() + 1) * 127.5), 0, 255).astype(np.uint8)


def test_bf16_noise_does_not_fire_and_a_shift_of_it_does():
    for i, path in enumerate(CANARY):
        frames, _ = read_frames(path)
        la = [small_luma(f) for f in frames]
        lb = [small_luma(f) for f in _bf16(frames, i)]
        r = detect_offset(la, lb)
        assert r.finding == "aligned" and r.mad[0] > 0, (path.name, r)
        shifted = detect_offset(la[1:], lb[:-1])
        assert (shifted.finding, shifted.offset) == ("shifted", 1), (path.name, shifted)


@pytest.mark.parametrize("crf", [23, 40])
def test_compression_noise_does_not_fire_and_a_shift_of_it_does(tmp_path, crf):
    """H.264 re-encodes of the 8 canary clips (crf 23: ordinary; crf 40: blocky, the noise as
    large as the motion of the slow clips). Never an offset on the aligned pair; a one-frame
    shift found both ways on every clip at crf 23, and never a wrong offset at crf 40 (where
    the rule may stay silent: 4 of 8 found when this was written)."""
    found = 0
    for path in CANARY:
        frames, fps = read_frames(path)
        enc = write_browser(tmp_path / f"{path.stem}.mp4", frames, fps, BrowserEncoding(crf=crf))
        assert enc == len(frames)
        la = read_small_luma(path)
        lb = read_small_luma(tmp_path / f"{path.stem}.mp4")
        r = detect_offset(la, lb)
        assert r.finding == "aligned" and r.mad[0] > 0, (path.name, crf, r)
        for shift, (xa, xb) in ((-1, (la[:-1], lb[1:])), (1, (la[1:], lb[:-1]))):
            got = detect_offset(xa, xb)
            assert got.offset in (0, shift), (path.name, crf, got)
            if crf == 23:
                assert (got.finding, got.offset) == ("shifted", shift), (path.name, crf, got)
            found += got.offset == shift
    assert found >= 8, found


def test_small_luma_of_the_decoder_matches_the_readers_frames():
    """FFmpeg's area scaler (the fast path) and small_luma of decoded RGB agree on the offset
    figures to within a grey level or two (different colour conversions and rounding)."""
    path = CANARY[0]
    fast = read_small_luma(path, 6)
    frames, _ = read_frames(path)
    slow = [small_luma(f) for f in frames[:6]]
    assert fast[0].shape == slow[0].shape == (64, 64)
    assert float(np.mean(np.abs(np.stack(fast) - np.stack(slow)))) < 2.0


def test_rate_mismatch_and_skip_frames():
    assert rate_mismatch("24", "24/1") is None and rate_mismatch(None, "24") is None
    why = rate_mismatch("24", "30000/1001")
    assert "A is 24 fps, B is 29.97 fps" in why
    chunks = [np.arange(4)[:, None], np.arange(4, 8)[:, None]]
    assert [int(x) for c in skip_frames(chunks, 5) for x in c[:, 0]] == [5, 6, 7]
    assert [int(x) for c in skip_frames(iter(chunks), 0) for x in c[:, 0]] == list(range(8))


# -- evalkit metrics on two real clips --------------------------------------------------------


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A real canary clip; B one frame early (A's first frame dropped), B one frame late (A's
    first frame twice), and A at another frame rate."""
    root = tmp_path_factory.mktemp("align")
    frames, fps = read_frames(CANARY[0])
    frames = frames[:12]
    out = {
        "a": root / "a.mkv",
        "early": root / "early.mkv",
        "late": root / "late.mkv",
        "rate": root / "rate.mkv",
    }
    write_lossless(out["a"], frames, fps)
    write_lossless(out["early"], frames[1:], fps)
    write_lossless(out["late"], np.concatenate([frames[:1], frames[:-1]]), fps)
    write_lossless(out["rate"], frames, 30)
    return out


@pytest.mark.slow  # canary clips measured at offsets
def test_metrics_compares_an_early_clip_at_its_offset(cli, clips):
    code, out, err = cli(
        "metrics", clips["a"], clips["early"], "--json", "--device", "cpu", "--no-temporal", "--quiet"
    )
    assert code == 0, err
    r = json.loads(out)
    al = r["offset"]
    assert al["finding"] == "shifted" and al["offset"] == -1 and al["compared"] == 11
    assert "B is 1 frame early" in al["text"] and "A frames 1-11 with B frames 0-10" in al["text"]
    assert r["frames"] == 11 and r["identical"] is True  # the same frames, once aligned
    assert r["per_frame"]["frame"] == list(range(1, 12))  # A's frame numbers
    code, out, err = cli("metrics", clips["a"], clips["early"], "--device", "cpu", "--no-temporal", "--quiet")
    assert code == 0 and "offset: B is 1 frame early" in out


@pytest.mark.slow  # canary clips measured at offsets
def test_metrics_compares_a_late_clip_at_its_offset(cli, clips, tmp_path):
    code, out, err = cli(
        "metrics",
        clips["a"],
        clips["late"],
        "--json",
        "--device",
        "cpu",
        "--no-temporal",
        "--quiet",
        "--csv",
        tmp_path / "f.csv",
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["offset"]["offset"] == 1 and "B is 1 frame late" in r["offset"]["text"]
    assert r["frames"] == 11 and r["identical"] is True
    assert r["per_frame"]["frame"][0] == 0
    # forced frame by frame: the shift shows as a difference, and the output says it was forced
    code, out, err = cli(
        "metrics",
        clips["a"],
        clips["late"],
        "--json",
        "--device",
        "cpu",
        "--no-temporal",
        "--quiet",
        "--offset",
        "0",
    )
    assert code == 0, err
    r0 = json.loads(out)
    assert r0["offset"]["finding"] == "given" and r0["frames"] == 12 and r0["lpips"] > 0.05


@pytest.mark.slow  # canary clips measured
def test_metrics_aligned_clips_say_so(cli, clips):
    code, out, err = cli(
        "metrics", clips["a"], clips["a"], "--json", "--device", "cpu", "--no-temporal", "--quiet"
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["offset"]["finding"] == "aligned" and r["offset"]["offset"] == 0 and r["frames"] == 12


def test_metrics_refuses_a_frame_rate_mismatch(cli, clips):
    code, out, err = cli("metrics", clips["a"], clips["rate"], "--device", "cpu", "--quiet")
    assert code == 2
    assert_one_line_error(err, str(clips["rate"]), "frame-rate mismatch", "A is 24 fps, B is 30 fps")


def test_probe_clips_reads_only_the_window(clips, tmp_path):
    """Frames after the first WINDOW are never read: B's differ from A's there, and the offset's
    difference is still exactly 0."""
    frames, fps = read_frames(CANARY[1])
    rng = np.random.default_rng(1)
    tail = rng.integers(0, 256, (8, *frames.shape[1:]), dtype=np.uint8)
    write_lossless(tmp_path / "a.mkv", frames, fps)
    write_lossless(tmp_path / "b.mkv", np.concatenate([frames[1 : WINDOW + 1], tail]), fps)
    r = probe_clips(tmp_path / "a.mkv", tmp_path / "b.mkv")
    assert (r.finding, r.offset, r.frames) == ("shifted", -1, WINDOW) and r.mad[-1] == 0.0
    assert probe_clips(clips["a"], clips["early"]).frames == 11


@pytest.mark.slow  # VMAF at an offset
def test_metrics_vmaf_is_scored_at_the_offset(cli, clips):
    """VMAF (a separate pass over the clips) pairs the frames at the offset too: B early by one
    frame is A's frames, so every frame after the first scores the model's maximum, 100."""
    from evalkit.compare.vmaf import clip_vmaf

    code, out, err = cli(
        "metrics",
        clips["a"],
        clips["early"],
        "--json",
        "--device",
        "cpu",
        "--no-temporal",
        "--quiet",
        "--vmaf",
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["offset"]["offset"] == -1 and len(r["per_frame"]["vmaf"]) == 11
    assert r["per_frame"]["vmaf"][1:] == [100.0] * 10
    frame_by_frame = clip_vmaf(clips["a"], clips["early"], frames=11).scores
    assert max(frame_by_frame[1:]) < 100.0
