"""``study create`` holds a window of frames, not the clip (issue 36): the frames alive at once
while a study's trial streams are encoded and measured are as many for a clip of N frames as
for one of 2N.

Design: no clock, no resident-set sampling. Every frame the study code holds is a numpy array
(decoded windows, the contents shown, catch references and degraded copies, threshold stimuli,
tiled stream frames, delivered frames decoded back); numpy reports each array's data to
``tracemalloc``, so its peak of traced bytes (``reset_peak`` before each create) counts them
all, at the moment they are allocated, whichever thread does it (it counts Python's own objects
too: a first study is made before, so that modules loaded on first use do not count). The peak
is given here in frames of the clip (``H x W x 3`` bytes). What is not numpy (x264's own buffers, LPIPS's torch
tensors) is bounded by the frame size and the metrics' chunk, not by the clip: the whole
command's resident memory at real scale is ``benchmarks/bench_memory.py``'s.

The assertions: with 2N frames the peak is below 2N frames (one whole side; a study holding
its clip whole peaks above 4N, both sides), and at most one window's contents above the peak
with N frames (the encoders' threads take their windows a little earlier or later). Measured:
ABX 214 frames for N and 2N, preference 254-257 and 260 (the test runs preference).
"""

from __future__ import annotations

import tracemalloc

import pytest

from evalkit import study
from evalkit.testing.studies import import_report, moving_texture

N = 320  # frames of the short clip (a window's peak is about 210-260 of them)
WARM = 24  # a first study's clip: loads what is loaded on first use
H, W = 96, 128
#: one window's contents (A, B, a catch reference and its degraded copy, 8 frames each)
SLACK = 4 * 8


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """For N and 2N frames: a report of two imported runs of one clip (B a brighter A)."""
    out = {}
    for n in (WARM, N, 2 * N):
        fa = moving_texture(n, H, W, seed=5)
        fb = fa.copy()
        fb[..., 1] = (fb[..., 1].astype("int16") + 12).clip(0, 255).astype("uint8")
        out[n] = import_report(tmp_path_factory.mktemp(f"studymem{n}"), {"memory": (fa, fb)}, 24)[0]
    return out


def peak_frames(report, db, **kw) -> float:
    """``create_study``'s peak of numpy bytes alive at once, in frames of the clip."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        res = study.create_study(report, db, seed=1, **kw)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert res["clips"] >= 1 and res["catch_versions"] >= 1
    return peak / (H * W * 3)


def check_window(peaks: dict) -> None:
    short, long_ = peaks[N], peaks[2 * N]
    assert long_ < 2 * N, f"{long_:.0f} frames alive at once for a {2 * N}-frame clip: a whole side"
    assert long_ <= short + SLACK, f"the window grew with the clip: {short:.0f} -> {long_:.0f}"


@pytest.mark.slow  # studies of N and 2N frames made (every stream encoded and measured)
def test_study_create_holds_a_window(reports, tmp_path):
    # preference: two tiles a stream, test arrangements and catch versions; ABX's three tiles
    # go through the same windows (trialmedia.clip_media), at 1.5x the time: not repeated here
    kw = {"protocol": "preference"}
    study.create_study(reports[WARM], tmp_path / "warm.sqlite", seed=1, **kw)  # modules loaded
    peaks = {n: peak_frames(reports[n], tmp_path / f"s{n}.sqlite", **kw) for n in (N, 2 * N)}
    check_window(peaks)
