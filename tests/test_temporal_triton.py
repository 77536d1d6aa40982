"""The Triton warping error and tOF (metrics/_triton_temporal.py) against the torch path they
replace on CUDA (``temporal.warping_error_from_flows``, ``temporal.tof_from_flows``).

The kernels run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, in a
subprocess: it must be set before triton is imported), at small sizes. Speed on a GPU:
``benchmarks/bench_flow.py --part temporal``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import run_interpreted
from numerics import U32, mean_tolerance

from evalkit.metrics import temporal
from evalkit.metrics._common import TritonFallback, fast_paths

pytestmark = pytest.mark.slow  # Triton's interpreter

pytest.importorskip("triton")

SCRIPT = r"""
import json
import numpy as np
import torch
import torch.nn.functional as F
from evalkit.metrics._common import fast_paths
from evalkit.metrics._triton_temporal import warp_errors_tof
from evalkit.metrics.stream import evaluate_pair
from evalkit.metrics.temporal import temporal_from_flows, tof_from_flows, warping_error_from_flows

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
out = {}


def smooth(n, h, w, amp):
    # a smooth random 2-channel field: bicubic upsampling of a 4x5 grid
    return F.interpolate(torch.randn(n, 2, 4, 5, generator=g) * amp, size=(h, w), mode="bicubic",
                         align_corners=True)


def flows(h, w, shifts, noise):
    # forward flows: a translation plus a smooth field; backward: minus the forward flow, plus
    # another smooth field of amplitude `noise` (the forward-backward test then keeps part)
    s = torch.tensor(shifts, dtype=torch.float32)[:, :, None, None]
    fwd = s + smooth(len(shifts), h, w, 1.5)
    bwd = -fwd + smooth(len(shifts), h, w, noise)
    return fwd, bwd


def torch_path(p, fwd, bwd):
    return warping_error_from_flows(p[:-1], p[1:], bwd, fwd)


# A: 33x47, 4 transitions, both clips and tOF as the stream computes them, frames channels-last
h, w = 33, 47
pa = torch.rand((5, h, w, 3), generator=g).permute(0, 3, 1, 2)
pb = (pa + 0.05 * torch.rand((5, 3, h, w), generator=g)).clamp(0, 1)
fa, ba = flows(h, w, [(2.3, -1.1), (25.7, 3.2), (0.0, 0.0), (-1.4, 0.6)], 0.8)
# frame 2: an exact integer translation (3, -2), consistent everywhere: sources land exactly on
# the last column and the first rows (corners beyond the edge weigh 0)
fa[2] = torch.tensor([-3.0, 2.0])[:, None, None]
ba[2] = torch.tensor([3.0, -2.0])[:, None, None]
# frame 3: an occlusion-like block where the backward flow points elsewhere (+6 px)
ba[3, :, 10:22, 15:30] += 6.0
fb, bb = flows(h, w, [(2.0, -1.0), (-24.2, -9.5), (0.5, 0.5), (-1.0, 1.0)], 1.2)
assert not pa.is_contiguous()
(ea, eb), t = warp_errors_tof([(pa[:-1], pa[1:], ba, fa), (pb[:-1], pb[1:], bb, fb)], (fa, fb))
out["A"] = {"got": [ea.tolist(), eb.tolist(), t.tolist()],
            "want": [torch_path(pa, fa, ba).tolist(), torch_path(pb, fb, bb).tolist(),
                     tof_from_flows(fa, fb).tolist()]}
# the kept fraction of each frame (torch path), to show the masks are partial
with torch.inference_mode():
    from evalkit.metrics.flow import consistency_mask
    out["A"]["kept"] = consistency_mask(ba, fa).float().mean((1, 2)).tolist()

# batch invariance: frame 2 alone, frames 1..2 as a batch of 2, bit for bit
for lo, hi in ((2, 3), (1, 3)):
    (xa, xb), xt = warp_errors_tof([(pa[lo:hi], pa[lo + 1:hi + 1], ba[lo:hi], fa[lo:hi]),
                                    (pb[lo:hi], pb[lo + 1:hi + 1], bb[lo:hi], fb[lo:hi])], (fa[lo:hi], fb[lo:hi]))
    out[f"alone_{lo}_{hi}"] = bool(torch.equal(xa, ea[lo:hi]) and torch.equal(xb, eb[lo:hi])
                                   and torch.equal(xt, t[lo:hi]))

# B: 48x64, 3 transitions, contiguous frames, one clip, no tOF; frame 1: every source outside
h, w = 48, 64
p = torch.rand((4, 3, h, w), generator=g)
f, b = flows(h, w, [(-7.7, 12.4), (0.3, 0.2), (40.0, -3.0)], 0.5)
b[1] = 1000.0
(e,), none = warp_errors_tof([(p[:-1], p[1:], b, f)])
out["B"] = {"got": e.tolist(), "want": torch_path(p, f, b).tolist(), "tof_none": none is None}

# the dispatcher: forced on (any device) the kernels, bit for bit; off the torch path exactly
with fast_paths(triton_temporal=True):
    on = temporal_from_flows(pa, pb, fa, ba, fb, bb)
with fast_paths(triton_temporal=False):
    off = temporal_from_flows(pa, pb, fa, ba, fb, bb)
want = (torch_path(pa, fa, ba), torch_path(pb, fb, bb), tof_from_flows(fa, fb))
out["dispatch_on"] = all(torch.equal(x, y) for x, y in zip(on, (ea, eb, t)))
out["dispatch_off"] = all(torch.equal(x, y) for x, y in zip(off, want))

# the stream end to end (the wiring of fwd/bwd of both clips): a moving texture, chunks of 2
rng = np.random.default_rng(3)
tex = rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)
tex = ((tex.astype(np.float32) + np.roll(tex, 1, 0) + np.roll(tex, 1, 1)) / 3).astype(np.uint8)
a = np.stack([tex[2 + i:34 + i, 3 + 2 * i:43 + 2 * i] for i in range(5)])
bb_ = np.clip(a.astype(int) + rng.integers(-8, 9, a.shape), 0, 255).astype(np.uint8)
runs = {}
for flag in (False, True):
    with fast_paths(triton_temporal=flag):
        runs[flag] = evaluate_pair(iter(a), iter(bb_), device="cpu", chunk=2, flow="torch")["records"]
keys = ["warp_error_a", "warp_error_b", "tof", "warp_error_diff"]
out["stream"] = {"got": [[r[k] for r in runs[True][1:]] for k in keys],
                 "want": [[r[k] for r in runs[False][1:]] for k in keys],
                 "others_equal": all({k: v for k, v in r1.items() if k not in keys} ==
                                     {k: v for k, v in r0.items() if k not in keys}
                                     for r0, r1 in zip(runs[False], runs[True]))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT)  # NaN parses as nan


def _tol(want, pixels):
    # the same masks and per-pixel float32 operations, the sums in another order: means of
    # 3 x pixels non-negative terms (a warping error; tOF: pixels end-point distances of 4
    # roundings each), numerics.mean_tolerance. A pixel kept on one side only would move the
    # error by ~1/(kept pixels), 1e-3 here: far outside.
    return mean_tolerance(np.nan_to_num(want), 3 * pixels, ops=4)


def _close(got, want, pixels):
    got, want = np.array(got, dtype=float), np.array(want, dtype=float)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    ok = np.isnan(want) | (np.abs(got - want) <= _tol(want, pixels))
    assert ok.all(), (got, want, _tol(want, pixels))


def test_warping_error_and_tof_match_the_torch_path(interpreted):
    r = interpreted["A"]
    for got, want in zip(r["got"], r["want"]):
        _close(got, want, 33 * 47)
    # real cases: partly kept frames (the occlusion block, sources leaving the frame at 25 px),
    # and the exact translation kept wherever its source is inside (1 - 3/47)(1 - 2/33)
    kept = r["kept"]
    assert 0.1 < kept[0] < 0.9 and 0.1 < kept[1] < 0.9 and 0.1 < kept[3] < 0.9
    # an exact count of kept pixels over the pixels: one float32 division
    assert kept[2] == pytest.approx((1 - 3 / 47) * (1 - 2 / 33), rel=U32, abs=0)
    assert min(r["want"][0]) > 1e-3 and min(r["want"][2]) > 1.0


def test_nothing_kept_gives_nan_and_odd_sizes_agree(interpreted):
    r = interpreted["B"]
    _close(r["got"], r["want"], 48 * 64)
    assert np.isnan(r["got"][1]) and not np.isnan(r["got"][0]) and not np.isnan(r["got"][2]) and r["tof_none"]


def test_a_frame_gives_the_same_bits_in_any_batch(interpreted):
    assert interpreted["alone_2_3"] and interpreted["alone_1_3"]


def test_switch_picks_the_kernels_or_the_torch_path(interpreted):
    assert interpreted["dispatch_on"] and interpreted["dispatch_off"]


def test_stream_records_agree_with_the_torch_path(interpreted):
    r = interpreted["stream"]
    assert r["others_equal"]
    for got, want in zip(r["got"][:3], r["want"][:3]):
        _close(got, want, 32 * 40)
    # warp_error_diff = b - a: both terms' tolerances and the subtraction's rounding
    tol = _tol(r["want"][0], 32 * 40) + _tol(r["want"][1], 32 * 40) + U32 * np.abs(r["want"][3])
    assert np.all(np.abs(np.array(r["got"][3]) - r["want"][3]) <= tol)
    assert min(r["want"][0]) > 0 and min(r["want"][2]) > 0


def test_kernels_are_chosen_on_cuda_by_default_and_not_when_off(monkeypatch):
    monkeypatch.delenv("EVALKIT_TRITON", raising=False)
    assert temporal._temporal_kernel(torch.device("cpu")) is None
    assert temporal._temporal_kernel(torch.device("cuda")) is not None  # triton imports here
    with fast_paths(triton_temporal=False):
        assert temporal._temporal_kernel(torch.device("cuda")) is None
    with fast_paths(triton_temporal=True):
        assert temporal._temporal_kernel(torch.device("cpu")) is not None
    monkeypatch.setenv("EVALKIT_TRITON", "0")
    assert temporal._temporal_kernel(torch.device("cuda")) is None


def test_kernels_that_cannot_run_fall_back_to_the_torch_numbers_once(monkeypatch):
    """Outside the interpreter the kernels cannot launch on CPU tensors, which is what a Triton
    that cannot compile on a user's GPU looks like: one warning naming the kernels, then the
    torch path's numbers exactly. Turned off, the kernels are not even tried."""
    fam = TritonFallback(temporal.TRITON_TEMPORAL.family, temporal.TRITON_TEMPORAL.load, strict=False)
    monkeypatch.setattr(temporal, "TRITON_TEMPORAL", fam)  # fresh: nothing failed yet
    gen = torch.Generator().manual_seed(2)
    pa, pb = torch.rand((3, 3, 20, 24), generator=gen), torch.rand((3, 3, 20, 24), generator=gen)
    fl = torch.randn((4, 2, 2, 20, 24), generator=gen)
    args = (pa, pb, fl[0], -fl[0] + 0.1 * fl[1], fl[2], -fl[2] + 0.1 * fl[3])
    want = temporal.warping_error_from_flows(pa[:-1], pa[1:], args[3], args[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fast_paths(triton_temporal=False):
            off = temporal.temporal_from_flows(*args)
    assert fam.failed is None and not fam.ran and torch.equal(off[0], want)
    with fast_paths(triton_temporal=True):
        with pytest.warns(RuntimeWarning, match=r"warp_errors_tof\) failed .*torch path"):
            got = temporal.temporal_from_flows(*args)
        assert fam.failed and fam.kernel() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = temporal.temporal_from_flows(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, off)) and all(
        torch.equal(x, y) for x, y in zip(again, off)
    )
    assert torch.equal(temporal.tof_from_flows(args[2], args[4]), got[2])
