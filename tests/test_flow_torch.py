"""The ``"torch"`` optical flow (metrics/torchflow.py): accuracy against OpenCV DIS on synthetic
motion with a known flow, agreement of the temporal metrics with DIS on a real clip, the
streaming evaluator and the CLI. CPU only, small frames; the larger validation and the speed
on a GPU are in benchmarks/bench_flow.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import ROOT
from numerics import ab_tolerance, flow_tolerance, gamma, mean_tolerance
from skimage import data as skdata

from evalkit import metrics
from evalkit.metrics.flow import flow_u8
from evalkit.metrics.stream import PairEvaluator, evaluate_pair
from evalkit.metrics.torchflow import torch_flow
from evalkit.testing.flowcheck import endpoint_error, photo_grey, synthetic_pair

#: Stated tolerance of the temporal metrics with the torch flow against DIS ``fast`` on real
#: clips (docs/metrics.md, "GPU optical flow"): warping error within this factor either way,
#: tOF within this many pixels.
WARP_FACTOR = 3.0
TOF_ABS = 0.1

CASES = [
    dict(shift=(0.4, -0.3)),
    dict(shift=(4.6, 2.2)),
    dict(angle=3.0),
    dict(zoom=1.04),
    dict(angle=-2.0, zoom=0.97, shift=(1.5, -1.0)),
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the flow is many small kernels, and on a busy 2-core machine a
    second thread mostly waits at barriers (measured 10-30x slower). Results do not depend on it."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _flow_np(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    f = torch_flow(torch.from_numpy(src)[None], torch.from_numpy(dst)[None])
    return f[0].permute(1, 2, 0).numpy()


def _clip(name: str, frames: int) -> torch.Tensor:
    from evalkit.video import read_frames

    fr, _ = read_frames(ROOT / "datasets" / "canary" / "clips" / f"{name}.mkv")
    return torch.from_numpy(np.ascontiguousarray(fr[:frames])).permute(0, 3, 1, 2).contiguous()


def test_torch_flow_end_point_error_no_worse_than_dis_fast_on_synthetic_motion():
    photos = [photo_grey(skdata.astronaut(), 0.4), photo_grey(skdata.coffee(), 0.4)]
    errs = {"torch": [], "dis-fast": []}
    for photo in photos:
        for case in CASES:
            src, dst, truth = synthetic_pair(photo, (96, 128), **case)
            errs["torch"].append(endpoint_error(_flow_np(src, dst), truth))
            errs["dis-fast"].append(endpoint_error(flow_u8(src, dst, "dis", "fast"), truth))
    mean = {k: float(np.mean(v)) for k, v in errs.items()}
    assert mean["torch"] <= mean["dis-fast"], (mean, errs)
    assert max(errs["torch"]) < 0.6, errs
    # a wrong answer is not accepted: the zero flow is far off
    assert endpoint_error(np.zeros_like(truth), truth) > 1.0


def test_torch_flow_is_batch_invariant_and_deterministic():
    photo = photo_grey(skdata.astronaut(), 0.4)
    pairs = [synthetic_pair(photo, (64, 96), **c)[:2] for c in CASES[:3]]
    src = torch.stack([torch.from_numpy(s) for s, _ in pairs])
    dst = torch.stack([torch.from_numpy(d) for _, d in pairs])
    together = torch_flow(src, dst)
    one_by_one = torch_flow(src, dst, batch_pixels=1)
    # other batches, other kernels' vector tails (an FMA there, none in the tail): the rounding
    # of every iteration (numerics.flow_tolerance, 2 levels at 64x96)
    tol = flow_tolerance(float(together.abs().max()), levels=2)
    torch.testing.assert_close(together, one_by_one, rtol=0, atol=tol)
    assert torch.equal(torch_flow(src, dst), together)
    # the functional API computes from RGB frames on their device, in OpenCV's convention
    rgb = lambda g: g[:, None].expand(-1, 3, -1, -1)  # noqa: E731
    torch.testing.assert_close(
        metrics.optical_flow(rgb(src), rgb(dst), method="torch"), together, rtol=0, atol=tol
    )
    # --flow-scale: computed on area-downscaled frames, vectors back in full-size pixels
    half = metrics.optical_flow(rgb(src), rgb(dst), method="torch", scale=0.5)
    assert half.shape == together.shape
    assert all((half[i] - together[i]).norm(dim=0).median() < 0.5 for i in range(len(half)))
    assert together[1].norm(dim=0).median() > 4.0  # the 4.6 px shift is there


def test_temporal_metrics_with_torch_flow_within_tolerance_of_dis_on_a_real_clip():
    a = _clip("chelsea_handheld", 5)[:, :, 48:208, 48:208].contiguous()
    rng = np.random.default_rng(0)
    b = (
        (a.float() + torch.from_numpy(rng.normal(0, 2, a.shape)).float())
        .round()
        .clamp(0, 255)
        .to(torch.uint8)
    )
    we = {m: metrics.warping_error(a, method=m).mean().item() for m in ("dis", "torch")}
    tof = {m: metrics.tof(a, b, method=m).mean().item() for m in ("dis", "torch")}
    assert 1 / WARP_FACTOR <= we["torch"] / we["dis"] <= WARP_FACTOR, we
    assert abs(tof["torch"] - tof["dis"]) <= TOF_ABS, tof
    # without warping, the error is far larger (the flows do their job)
    still = ((a[1:].float() - a[:-1].float()) / 255).pow(2).mean().item()
    assert we["torch"] < 0.2 * still, (we, still)


def test_stream_with_torch_flow_is_chunk_invariant_and_matches_functional():
    a = _clip("astronaut_pan", 4)[:, :, :64, :96].contiguous()
    b = torch.flip(a, (3,)).contiguous()
    runs = [evaluate_pair(iter(a), iter(b), device="cpu", chunk=c, flow="torch") for c in (1, 3)]
    assert runs[0]["conventions"]["flow"] == "torch-clg-v2,luma8"
    # Chunks change the batches: flows within numerics.flow_tolerance of each other (64x96: 2
    # levels), and what is computed from them moves by at most (the model of the flow's
    # tolerance, assumed for the masks too: no pixel crosses the consistency test's threshold):
    # tOF, a mean end-point distance, by the largest change of a vector of each clip (triangle
    # inequality); a warping error, a mean of squared differences of frames whose values change
    # by at most 1 per pixel, by 2 sqrt(error) f + f^2 (Cauchy-Schwarz); both plus their means'
    # rounding. The LPIPS, SSIM and PSNR records: tests/test_metrics.py's bounds.
    p = 64 * 96
    f = flow_tolerance(2 * 64.0, levels=2)  # flows within the frame: |v| < 2 x 64 px

    from test_metrics import lpips_tol, luma_planes, ssim_ab_tol, tlp_tol

    ah, bh = (x.permute(0, 2, 3, 1).numpy() for x in (a, b))
    fixed = {
        "lpips": lpips_tol(ah, bh),
        "ssim": ssim_ab_tol(luma_planes(ah), luma_planes(bh)),
        "tlp": np.concatenate([[np.nan], tlp_tol(ah, bh)]),
    }
    flicker = ab_tolerance(4 * gamma(16 * 16 + 5) * 255)  # as in test_metrics

    def tol(k, want, frame=0):
        if k in fixed:
            return fixed[k][frame]
        if k.startswith("flicker"):
            return flicker + mean_tolerance(want, p // 256)
        if k == "tof":
            return 2 * f + mean_tolerance(want, p, ops=4)
        if k.startswith("warp_error"):
            return 2 * math.sqrt(abs(want)) * f + f * f + mean_tolerance(want, 3 * p, ops=1)
        return None

    for r0, r1 in zip(runs[0]["records"], runs[1]["records"]):
        assert r1.keys() == r0.keys()
        for k in r0:
            t = tol(k, r0[k], r0["frame"]) if isinstance(r0[k], float) else None
            if k == "warp_error_diff":
                t = tol("warp_error_a", r0["warp_error_a"]) + tol("warp_error_b", r0["warp_error_b"])
            if t is None:  # frame numbers, flags, PSNR (an exact integer MSE)
                assert r1[k] == r0[k], (k, r0["frame"])
            else:
                assert abs(r1[k] - r0[k]) <= t, (k, r0["frame"], r1[k], r0[k], t)
    recs = runs[1]["records"]
    tofs = metrics.tof(a, b, method="torch").numpy()
    assert all(abs(r["tof"] - w) <= tol("tof", w) for r, w in zip(recs[1:], tofs))
    wes = metrics.warping_error(b, method="torch").numpy()
    assert all(abs(r["warp_error_b"] - w) <= tol("warp_error_b", w) for r, w in zip(recs[1:], wes))
    ev = PairEvaluator(device="cpu", flow="torch")
    try:
        assert ev.flow_workers == 0  # no OpenCV threads for a device flow
    finally:
        ev.close()


def test_cli_metrics_and_compare_take_flow_torch(cli, tmp_path):
    clips = ROOT / "datasets" / "smoke" / "clips"
    code, out, err = cli(
        "metrics",
        clips / "astronaut_pan.mkv",
        clips / "hubble_object.mkv",
        "--device",
        "cpu",
        "--flow",
        "torch",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["conventions"]["flow"] == "torch-clg-v2,luma8"
    assert got["tof"] > 0.1
    # compare parses --flow torch (and gets as far as the missing run folder), refuses others
    code, out, err = cli(
        "compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "o", "--flow", "torch", "--quiet"
    )
    assert code == 2 and "--flow" not in err and str(tmp_path / "a") in err, err
    code, out, err = cli("compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "o", "--flow", "lk")
    assert code == 2 and "--flow" in err and "invalid choice" in err, err


def test_flow_auto_is_the_torch_flow_on_a_gpu_and_dis_elsewhere(cli):
    import argparse

    from evalkit.cli.compare import flow_method
    from evalkit.metrics.flow import resolve_flow

    assert resolve_flow("auto", "cuda") == "torch" and resolve_flow("auto", "cuda:1") == "torch"
    assert resolve_flow("auto", "cpu") == "dis"
    for method in ("dis", "farneback", "torch"):
        assert resolve_flow(method, "cuda") == method == resolve_flow(method, "cpu")
    # a DIS preset asked for with the default --flow means DIS, on any device
    ns = argparse.Namespace
    assert flow_method(ns(flow="auto", flow_preset="medium")) == "dis"
    assert flow_method(ns(flow="auto", flow_preset=None)) == "auto"
    assert flow_method(ns(flow="torch", flow_preset="medium")) == "torch"
    ev = PairEvaluator(device="cpu", flow="auto")
    try:
        assert ev.flow[0] == "dis" and ev.conventions["flow"] == "dis-fast,luma8"
    finally:
        ev.close()
    # the command's default on the CPU: DIS, recorded as such
    clips = ROOT / "datasets" / "smoke" / "clips"
    code, out, err = cli(
        "metrics", clips / "astronaut_pan.mkv", clips / "hubble_object.mkv", "--device", "cpu", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["conventions"]["flow"] == "dis-fast,luma8"
