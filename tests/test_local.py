"""Local and short-lived differences (issue 46): the worst block of each frame and the burst it
belongs to, on a real clip made 64 frames long, with the variants of evalkit.testing.variants;
the gate's offset key. Pure numpy: no compare runs here (tests/test_story.py runs them)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import DATASETS

from evalkit.compare.aggregate import below_floor, clip_finding
from evalkit.compare.floors import roundtrip_420
from evalkit.compare.local import LocalTrack, block_side, burst, psnr_of, where, worst_block
from evalkit.formats.gate import load_gate
from evalkit.testing.variants import block_box, variant
from evalkit.video import read_frames

CLIP = DATASETS / "canary" / "clips" / "chelsea_handheld.mkv"


@pytest.fixture(scope="module")
def source():
    """The canary clip played forwards, backwards and forwards again: 64 real frames."""
    f, fps = read_frames(CLIP)
    return np.concatenate([f, f[::-1], f])[:64], fps


def track(a, b) -> LocalTrack:
    t = LocalTrack.empty()
    for i, (x, y) in enumerate(zip(a, b)):
        t.add(i, x, y)
    return t


def test_worst_block_is_exact_integer_arithmetic():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (40, 72, 3), dtype=np.uint8)
    b = a.copy()
    b[20:25, 50:53, 1] = a[20:25, 50:53, 1] ^ 0xFF  # one place differs
    mse, x, y, side, whole = worst_block(a, b)
    assert side == block_side(40, 72) == 8
    d = (a.astype(np.int64) - b) ** 2
    assert x <= 50 and x + side >= 53 and y <= 20 and y + side >= 25
    assert mse == d[y : y + side, x : x + side].sum() / (side * side * 3)
    assert whole == d.sum() / d.size
    # no other block of the grid is worse (brute force over every start of the stride grid)
    best = max(
        d[j : j + side, i : i + side].sum() for j in (*range(0, 33, 4), 32) for i in (*range(0, 65, 4), 64)
    )
    assert mse * side * side * 3 == best
    assert worst_block(a, a)[0] == 0 and psnr_of(0.0) == math.inf


def test_the_block_glitch_is_found_on_exactly_its_frames_and_place(source):
    frames, fps = source
    first, last, bx, by, bside = block_box(*frames.shape[:3])
    assert (first, last) == (40, 43)
    local = track(frames, variant(frames, fps, "block")).summary(frames.shape[2], frames.shape[1])
    assert local["burst"] == [40, 43] and not local["throughout"] and local["local"]
    assert 40 <= local["frame"] <= 43
    x, y, side = local["x"], local["y"], local["side"]
    assert bx <= x and x + side <= bx + bside and by <= y and y + side <= by + bside
    assert local["where"].endswith("(upper right)")
    assert local["block_psnr"] < 15 < local["frame_psnr"]


def test_spread_differences_are_not_local_and_noise_is_below_the_floor(source):
    frames, fps = source
    floor = np.stack([roundtrip_420(f) for f in frames])
    f_worst = track(frames, floor).worst_mse()
    for name in ("crf32", "flicker"):
        local = track(frames, variant(frames, fps, name)).summary(256, 256)
        assert not local["local"], name  # spread over the frame, not in one place
    lsb = track(frames, variant(frames, fps, "lsb1"))
    assert lsb.worst_mse() < f_worst  # +-1 LSB: every block better than the floor's worst
    assert 49 < psnr_of(lsb.worst_mse()) < 51


def test_burst_is_the_run_above_the_midpoint():
    mse = np.array([1.0, 1, 1, 5, 40, 50, 42, 1, 1, 30.0])
    assert burst(mse, 5) == (4, 6)  # midpoint (1 + 50) / 2: 40, 50, 42; not 5, not 30
    assert where(0, 0, 32, 256, 256) == "x 0-31, y 0-31 (upper left)"
    assert where(112, 112, 32, 256, 256).endswith("(centre)")


def _ratios(**kw):
    return {"reencode": {k: {"mean": v, "p95": v, "worst": v} for k, v in kw.items()}}


def test_a_clip_below_its_floor_says_so_with_its_db():
    agg = {"psnr": {"mean": 49.9}, "block_psnr": {"worst": 49.7}}
    fagg = {"reencode": {"psnr": {"mean": 41.8}, "block_psnr": {"worst": 38.1}}}
    r = _ratios(lpips=0.5, psnr=0.15, tof=3.2, flicker=1.4, block_psnr=0.07)
    assert below_floor(r["reencode"])
    f = clip_finding("c", r, aggregates=agg, floor_aggregates=fagg)
    assert f["below_floor"] and f["ratio"] < 1 and f["metric"] == "psnr"
    assert f["text"].startswith(
        "c: below what the reencode floor resolves: PSNR 49.9 dB against "
        "the floor's 41.8 dB, worst block 49.7 dB against 38.1 dB; tOF 3.2x"
    )
    # one step over the floor in the pixels and it is a finding again
    r = _ratios(lpips=0.5, psnr=1.0001, tof=3.2, block_psnr=0.07)
    f = clip_finding("c", r, aggregates=agg, floor_aggregates=fagg)
    assert not f["below_floor"] and f["metric"] == "tof" and f["ratio"] == 3.2


def test_a_local_glitch_outranks_spread_ratios_only_when_local():
    r = _ratios(lpips=2.0, psnr=1.5, flicker=150.0, block_psnr=690.0)
    glitch = {
        "frame": 41,
        "x": 160,
        "y": 64,
        "side": 32,
        "block_psnr": 9.7,
        "frame_psnr": 25.4,
        "burst": [40, 43],
        "burst_frames": 4,
        "frames": 64,
        "throughout": False,
        "local": True,
        "where": "x 160-191, y 64-95 (upper right)",
    }
    f = clip_finding("c", r, local=glitch, aggregates={}, floor_aggregates={})
    assert f["metric"] == "block_psnr" and f["rank"] == 690.0
    assert (
        "a local glitch on frames 40-43 (4 of 64), worst at frame 41 in x 160-191, y 64-95 "
        "(upper right): that block 9.7 dB PSNR" in f["text"]
    )
    spread = dict(glitch, throughout=True, local=False)
    f = clip_finding("c", r, local=spread, aggregates={}, floor_aggregates={})
    assert f["metric"] == "flicker" and f["rank"] == 150.0


@pytest.mark.parametrize(
    "limit,offset,ok",
    [(None, 0, True), (None, 1, False), (None, -1, False), (1, 1, True), (1, -2, False), (2, -2, True)],
)
def test_the_gate_fails_on_any_offset_unless_allowed(tmp_path, limit, offset, ok):
    p = tmp_path / "g.yaml"
    p.write_text("lpips: {mean: {max: 1}}\n" + (f"max_offset_frames: {limit}\n" if limit is not None else ""))
    g = load_gate(p, metrics=("lpips",), ratio_metrics=("lpips",))
    out = g.evaluate({"lpips": {"mean": 0.1}}, {}, 0, {"j1": 0, "j2": offset})
    assert out["verdict"] == ("pass" if ok else "fail")
    check = out["checks"][-1]
    assert check["check"] == "temporal offset" and check["value"] == abs(offset)
    if not ok:
        assert out["reasons"] == [
            f"temporal offset = {abs(offset)} frame{'' if abs(offset) == 1 else 's'} "
            f"(<= {limit or 0}): j2 {offset:+d}"
        ]
