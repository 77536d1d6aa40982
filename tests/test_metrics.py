"""metrics/: calibration, agreement with the reference packages, temporal metrics, bad input.

Real lpips package and weights from the evalkit cache, real scikit-image and OpenCV; small
frames so the file runs in well under two minutes on two CPU cores. Speed is measured in
benchmarks/bench_metrics.py, never here.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_one_line_error
from numerics import U32, U64, ab_tolerance, gamma, lpips_bound, mean_tolerance, psnr_bound, ssim_bound
from PIL import Image
from scipy.ndimage import gaussian_filter
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from evalkit import metrics
from evalkit.metrics import MetricInputError
from evalkit.metrics.flow import consistency_mask
from evalkit.metrics.stream import PairEvaluator, evaluate_pair, stream_pair
from evalkit.metrics.temporal import warping_error_from_flows

# The lpips package builds torchvision trunks with the deprecated ``pretrained=`` argument.
pytestmark = pytest.mark.filterwarnings("ignore:.*(pretrained|weight enum).*:UserWarning")

CALIB = ROOT / "tests" / "data" / "calibration"
PAIRS = ("I03", "I04", "I06", "I08", "I19")


# -- helpers ---------------------------------------------------------------------------------


def load_png(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.uint8)


def chw(frames_hwc: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) or (H, W, 3) uint8 numpy -> (N, 3, H, W) tensor."""
    if frames_hwc.ndim == 3:
        frames_hwc = frames_hwc[None]
    return torch.from_numpy(np.ascontiguousarray(frames_hwc)).permute(0, 3, 1, 2).contiguous()


def ref_luma(x: np.ndarray) -> np.ndarray:
    """The reference convention: round(0.299 R + 0.587 G + 0.114 B) on 8-bit values."""
    x = x.astype(np.float64)
    return np.round(0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2])


def sk_ssim(x, y, **kw):
    return structural_similarity(x, y, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, **kw)


def texture(h, w, seed=0, sigma=2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = gaussian_filter(rng.random((h, w, 3)), (sigma, sigma, 0))
    t = (t - t.min()) / (t.max() - t.min())
    return (t * 255).round().astype(np.uint8)


def translated_clip(n=6, h=64, w=96, dx=2, dy=1, seed=0) -> np.ndarray:
    """A texture moving by (dx, dy) pixels per frame: (n, h, w, 3) uint8."""
    big = texture(h + 2 * n * abs(dy) + 2, w + 2 * n * abs(dx) + 2, seed)
    oy, ox = n * abs(dy) + 1, n * abs(dx) + 1
    # frame t shows the texture shifted by t*(dx, dy): content moves right/down
    return np.stack([big[oy - t * dy : oy - t * dy + h, ox - t * dx : ox - t * dx + w] for t in range(n)])


# -- tolerances (tests/numerics.py: float32 rounding bounds of the operations involved) ------


def luma_planes(frames_hwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.stack([ref_luma(x) for x in np.asarray(frames_hwc)]))[:, None]


def rgb_planes(frames_hwc: np.ndarray) -> torch.Tensor:
    f = np.asarray(frames_hwc, dtype=np.float64)
    return torch.from_numpy(f.transpose(0, 3, 1, 2).reshape(-1, 1, *f.shape[1:3]).copy())


def ssim_tol(x: torch.Tensor, y: torch.Tensor, **kw) -> np.ndarray:
    """Our float32 SSIM against scikit-image's float64 one: each within its own bound."""
    return (ssim_bound(x, y, **kw) + ssim_bound(x, y, u=U64, **kw)).numpy()


def ssim_ab_tol(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Two float32 SSIMs of the same planes (another batch, another order)."""
    return ab_tolerance(ssim_bound(x, y)).numpy()


def lpips_tol(a: np.ndarray, b: np.ndarray, net: str = "alex") -> np.ndarray:
    """Two float32 LPIPS of the same uint8 frames (another trunk layout, batch or library)."""
    from evalkit.metrics.perceptual import get_model

    return ab_tolerance(
        lpips_bound(get_model(net, "cpu"), chw(a).double() / 255, chw(b).double() / 255)
    ).numpy()


def tlp_tol(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two float32 tLP |d_a - d_b| of the same clips: the bounds of both distances, and the
    subtraction's rounding."""
    from evalkit.metrics.perceptual import get_model

    m = get_model("alex", "cpu")
    x, y = chw(a).double() / 255, chw(b).double() / 255
    steps = lpips_bound(m, x[1:], x[:-1]) + lpips_bound(m, y[1:], y[:-1])
    return ab_tolerance(steps).numpy() + 2 * U32


@pytest.fixture(scope="module")
def natural():
    """Two natural 128x96 crops (ref, dist) of a calibration pair, as (1, H, W, 3)."""
    r = load_png(CALIB / "ref" / "I19.png")[100:196, 200:328]
    d = load_png(CALIB / "dist" / "I19.png")[100:196, 200:328]
    return r, d


@pytest.fixture(scope="module")
def lpips_ref():
    """The lpips package's own model, loaded with the cached weights."""
    import lpips

    from evalkit.metrics import weights as _weights

    models = {}

    def get(net):
        if net not in models:
            m = lpips.LPIPS(net=net, pnet_rand=True, verbose=False)
            m.load_state_dict(_weights.load_state_dict(net), strict=False)
            models[net] = m.eval()
        return models[net]

    return get


# -- calibration through the CLI -------------------------------------------------------------


def official():
    """{pair: {metric: (value, decimals printed)}}."""
    with open(CALIB / "official.csv") as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    return {
        p: {
            m: (float(rows[m][p]), len(rows[m][p].partition(".")[2]))
            for m in ("lpips_alex_v0.1", "ssim", "psnr")
        }
        for p in PAIRS
    }


def assert_reproduces(got: float, want: tuple[float, int], decimals: int):
    """Equal to ``decimals`` decimals, and to every decimal official.csv prints."""
    value, printed = want
    assert abs(got - value) < 0.5 * 10**-decimals, (got, value)
    assert round(got, printed) == pytest.approx(value, abs=1e-12), (got, value)


@pytest.mark.parametrize("pair", PAIRS)
def test_cli_reproduces_official_calibration(cli, pair):
    code, out, err = cli(
        "metrics", CALIB / "ref" / f"{pair}.png", CALIB / "dist" / f"{pair}.png", "--json", "--device", "cpu"
    )
    assert code == 0, err
    got = json.loads(out)
    want = official()[pair]
    assert_reproduces(got["lpips"], want["lpips_alex_v0.1"], 4)
    assert_reproduces(got["ssim"], want["ssim"], 4)
    assert_reproduces(got["psnr"], want["psnr"], 2)
    assert got["frames"] == 1 and got["per_frame"]["lpips"] == [got["lpips"]]
    assert got["conventions"]["ssim"] == "luma-rounded,gaussian11,sigma1.5,valid"
    assert got["conventions"]["psnr"] == "rgb8,peak255"
    assert "tlp" not in got  # one frame: no temporal metrics


# -- agreement with the reference packages ---------------------------------------------------


def _random_pair(seed, n=3, h=40, w=56):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    b = np.clip(a.astype(int) + rng.integers(-40, 41, a.shape), 0, 255).astype(np.uint8)
    return a, b


@pytest.mark.parametrize("kind", ["random", "natural"])
def test_ssim_matches_skimage_luma(kind, natural):
    a, b = _random_pair(1) if kind == "random" else (natural[0][None], natural[1][None])
    got = metrics.ssim(chw(a), chw(b)).numpy()
    want = [sk_ssim(ref_luma(x), ref_luma(y), data_range=255) for x, y in zip(a, b)]
    assert np.all(np.abs(got - want) <= ssim_tol(luma_planes(a), luma_planes(b)))


@pytest.mark.parametrize("kind", ["random", "natural"])
def test_ssim_rgb_and_data_range_options_match_skimage(kind, natural):
    a, b = _random_pair(2) if kind == "random" else (natural[0][None], natural[1][None])
    got = metrics.ssim(chw(a), chw(b), channel="rgb").numpy()
    want = [
        sk_ssim(x.astype(np.float64), y.astype(np.float64), data_range=255, channel_axis=-1)
        for x, y in zip(a, b)
    ]
    # the mean of three planes: one more sum of three
    tol = ssim_tol(rgb_planes(a), rgb_planes(b)).reshape(-1, 3).mean(1) * (1 + gamma(3)) + gamma(3) * np.abs(
        want
    )
    assert np.all(np.abs(got - want) <= tol)
    # float input in [0, 1] with another data range (as tools that assume L = 2 would do)
    af, bf = chw(a).float() / 255, chw(b).float() / 255
    got2 = metrics.ssim(af, bf, channel="rgb", data_range=2.0).numpy()
    want2 = [
        sk_ssim(
            x.numpy().transpose(1, 2, 0).astype(np.float64),
            y.numpy().transpose(1, 2, 0).astype(np.float64),
            data_range=2.0,
            channel_axis=-1,
        )
        for x, y in zip(af, bf)
    ]
    # the same rounded float32 values; ours scales them by 255 first (one rounding each)
    xf, yf = (rgb_planes(f.permute(0, 2, 3, 1).double().numpy() * 255) for f in (af, bf))
    c = dict(c1=(0.01 * 510) ** 2, c2=(0.03 * 510) ** 2)
    tol = ssim_tol(xf, yf, e_in=(U32 * xf.abs(), U32 * yf.abs()), **c).reshape(-1, 3).mean(1) * (1 + gamma(3))
    assert np.all(np.abs(got2 - want2) <= tol + gamma(3) * np.abs(want2))
    assert np.abs(got2 - got).min() > 1e-4  # the option really changes the score


@pytest.mark.parametrize("kind", ["random", "natural"])
def test_psnr_matches_skimage_and_numpy(kind, natural):
    a, b = _random_pair(3) if kind == "random" else (natural[0][None], natural[1][None])
    got = metrics.psnr(chw(a), chw(b)).numpy()
    want = [peak_signal_noise_ratio(x, y, data_range=255) for x, y in zip(a, b)]
    # ours: an exact integer MSE, then float64; scikit-image sums the squares in float64
    n = a[0].size
    assert np.all(np.abs(got - want) <= psnr_bound(want, 1) + psnr_bound(want, n))
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).reshape(len(a), -1).mean(1)
    assert np.all(np.abs(got - 10 * np.log10(255**2 / mse)) <= 2 * psnr_bound(want, n))
    # float frames in [0, 1] give the same numbers (peak 1), up to the rounding of x / 255 and
    # of the float32 difference and square: per value 3 u of |x| + |y|, carried into the MSE
    gotf = metrics.psnr(chw(a).float() / 255, chw(b).float() / 255).numpy()
    x, y = (v.astype(np.float64).reshape(len(a), -1) / 255 for v in (a, b))
    e_d = 3 * U32 * (np.abs(x) + np.abs(y))
    d = x - y
    rel = (2 * np.abs(d) * e_d + e_d**2 + U32 * d * d).mean(1) / (d * d).mean(1)
    assert np.all(np.abs(gotf - want) <= psnr_bound(want, n, mse_rel=rel) + psnr_bound(want, n))


@pytest.mark.slow  # the lpips package's VGG and AlexNet
@pytest.mark.parametrize("net", ["alex", "vgg"])
@pytest.mark.parametrize("kind", ["random", "natural"])
def test_lpips_matches_lpips_package(net, kind, natural, lpips_ref):
    a, b = _random_pair(4, n=2, h=64, w=64) if kind == "random" else (natural[0][None], natural[1][None])
    got = metrics.lpips(chw(a), chw(b), net=net)
    with torch.no_grad():
        want = lpips_ref(net)(chw(a).float() / 127.5 - 1, chw(b).float() / 127.5 - 1).flatten()
    assert got.shape == want.shape
    assert np.all((got - want).abs().numpy() <= lpips_tol(a, b, net))
    assert want.min().item() > 1e-3  # a real difference, not 0 == 0


def test_exactness_identical_and_one_pixel():
    a = chw(texture(32, 48, seed=5))
    b = a.clone()
    ex = metrics.exactness(a, b)
    assert ex["max_abs_diff"].item() == 0 and ex["diff_fraction"].item() == 0
    assert math.isinf(metrics.psnr(a, b).item())
    la = luma_planes(texture(32, 48, seed=5)[None])
    assert abs(metrics.ssim(a, b).item() - 1.0) <= ssim_bound(la, la).item()
    assert metrics.lpips(a, b).item() == 0.0
    b[0, 1, 7, 9] = (int(b[0, 1, 7, 9]) + 3) % 256
    ex = metrics.exactness(a, b)
    assert ex["max_abs_diff"].item() == 3
    assert ex["diff_fraction"].item() == pytest.approx(1 / (32 * 48), rel=U32, abs=0)  # one division


# -- temporal ---------------------------------------------------------------------------------


def test_warping_error_near_zero_for_translation_with_correct_flow():
    clip = chw(translated_clip(n=4, dx=2, dy=1)).float() / 255
    prev, cur = clip[:-1], clip[1:]
    n, _, h, w = cur.shape
    true_bwd = torch.zeros(n, 2, h, w)
    true_bwd[:, 0], true_bwd[:, 1] = -2.0, -1.0  # pixel x of frame t came from x - (2, 1)
    err = warping_error_from_flows(prev, cur, true_bwd, -true_bwd)
    unwarped = ((cur - prev) ** 2).mean((1, 2, 3))
    # exact integer flows: only the grid's normalisation and grid_sample's un-normalisation round
    # (6 operations on coordinates up to w), moving each sample by at most gamma(6) w pixels of
    # a texture whose values change by at most 1 per pixel; squared, then averaged
    assert err.max().item() <= (gamma(6) * w) ** 2 * (1 + gamma(3 * h * w))
    assert unwarped.min().item() > 1e-3
    mask = consistency_mask(true_bwd, -true_bwd)
    assert mask[:, 1:, 2:].all() and not mask[:, 0, :].any()  # sources above the frame are masked
    # with the flow estimated by DIS from the clip itself
    est = metrics.warping_error(clip)
    assert est.max().item() < 0.01 * unwarped.min().item()
    # a wrong flow does not give near zero
    bad = warping_error_from_flows(prev, cur, torch.zeros_like(true_bwd), torch.zeros_like(true_bwd))
    assert bad.min().item() > 100 * est.max().item()


def test_flicker_rises_monotonically_with_amplitude():
    base = translated_clip(n=6, dx=1, dy=0, seed=3).astype(np.int16)
    a = chw(base.astype(np.uint8))
    sign = np.array([(-1) ** t for t in range(len(base))], dtype=np.int16)[:, None, None, None]
    values, values_b, values_a = [], [], []
    for amp in (0, 2, 5, 10, 20):
        b = chw(np.clip(base + amp * sign, 0, 255).astype(np.uint8))
        values.append(metrics.flicker(a, b).mean().item())
        values_b.append(metrics.flicker_single(b).mean().item())
        values_a.append(metrics.flicker_single(a).mean().item())
    assert values[0] == 0.0
    assert all(x < y for x, y in zip(values, values[1:])), values
    assert all(x < y for x, y in zip(values_b, values_b[1:])), values_b
    assert len(set(values_a)) == 1  # clip a is untouched


def test_identical_clips_give_zero_temporal_differences():
    clip = translated_clip(n=5)
    res = evaluate_pair(iter(clip), iter(clip.copy()), device="cpu", chunk=2)
    for rec in res["records"][1:]:
        assert rec["tlp"] == 0.0 and rec["tof"] == 0.0 and rec["flicker"] == 0.0
        assert rec["warp_error_diff"] == 0.0 and rec["warp_error_a"] == rec["warp_error_b"]
    assert res["identical"] and res["identical_frames"] == 5
    assert math.isinf(res["means"]["psnr"])
    assert res["means"]["tlp"] == 0.0 and res["means"]["tof"] == 0.0


@pytest.mark.slow  # temporal metrics on clips
def test_tlp_and_tof_respond_to_a_difference(lpips_ref):
    a = translated_clip(n=4, seed=1)
    b = a.copy()
    b[2] = translated_clip(n=4, seed=9)[2]  # one frame of b is unrelated content
    t = metrics.tlp(chw(a), chw(b))
    o = metrics.tof(chw(a), chw(b))
    tol = tlp_tol(a, b)
    # transition 0 is the same in both clips: 0 up to the rounding of the two distances
    assert t[0].item() <= tol[0] and t[1].item() > 0.05 and t[2].item() > 0.05
    # the same uint8 frames give DIS the same flows: their end-point difference is 0 exactly
    assert o[0].item() == 0.0 and o[1].item() > 0.5
    # tLP from reused features equals the lpips package computing each term separately
    m = lpips_ref("alex")
    x = lambda f: chw(f).float() / 127.5 - 1  # noqa: E731
    with torch.no_grad():
        want = abs(m(x(a[2]), x(a[1])).item() - m(x(b[2]), x(b[1])).item())
    assert abs(t[1].item() - want) <= tol[1]


# -- streaming ---------------------------------------------------------------------------------


@pytest.mark.slow  # the streaming evaluator on clips
def test_stream_is_chunk_invariant_and_matches_functional():
    a = translated_clip(n=7, seed=2)
    rng = np.random.default_rng(7)
    b = np.clip(a.astype(int) + rng.integers(-6, 7, a.shape), 0, 255).astype(np.uint8)
    runs = [evaluate_pair(iter(a), iter(b), device="cpu", chunk=c)["records"] for c in (1, 3, 16)]
    # Chunks change the batches (so the kernels and the order of sums), never the per-element
    # arithmetic: each metric's tolerance is the rounding bound of its sums.
    n, h, w = a.shape[:3]
    p = h * w
    la, lb = luma_planes(a), luma_planes(b)
    # flicker: 16x16 block means of float32 luma (3 products, 2 sums) up to 255, four of them
    # combined, then a mean over the blocks
    fl_elem = ab_tolerance(4 * gamma(16 * 16 + 5) * 255)
    tol = {
        "lpips": lpips_tol(a, b),
        "ssim": ssim_ab_tol(la, lb),
        "tlp": np.concatenate([[np.nan], tlp_tol(a, b)]),
    }

    def within(k, i, got, want):
        if k in tol:
            return abs(got - want) <= tol[k][i]
        if k.startswith("flicker"):
            return abs(got - want) <= fl_elem + mean_tolerance(want, p // 256)
        if k == "psnr":  # an exact integer MSE
            return got == want
        # tof, warping errors: means of non-negative per-pixel terms, the same element-wise
        return abs(got - want) <= mean_tolerance(want, 3 * p, ops=1) or got == want

    for recs in runs[1:]:
        assert [r.keys() for r in recs] == [r.keys() for r in runs[0]]
        for r0, r in zip(runs[0], recs):
            for k in r0:
                if isinstance(r0[k], float) and not math.isnan(r0[k]):
                    assert within(k, r0["frame"], r[k], r0[k]), (k, r0["frame"], r[k], r0[k])
                else:
                    assert r[k] == r0[k] or (r[k] != r[k] and r0[k] != r0[k]), (k, r0["frame"])
    recs = runs[1]
    assert "tlp" not in recs[0] and "tlp" in recs[1] and "flicker_a" not in recs[1] and "flicker_a" in recs[2]
    ta, tb = chw(a), chw(b)

    def agree(key, got, want, tolerance):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        assert np.all(np.abs(got - want) <= tolerance), (key, got, want, tolerance)

    agree("lpips", [r["lpips"] for r in recs], metrics.lpips(ta, tb).numpy(), tol["lpips"])
    agree("ssim", [r["ssim"] for r in recs], metrics.ssim(ta, tb).numpy(), tol["ssim"])
    agree("tlp", [r["tlp"] for r in recs[1:]], metrics.tlp(ta, tb).numpy(), tol["tlp"][1:])
    tof = metrics.tof(ta, tb).numpy()
    agree("tof", [r["tof"] for r in recs[1:]], tof, mean_tolerance(tof, p, ops=4))
    we = metrics.warping_error(ta).numpy()
    agree("warp_error_a", [r["warp_error_a"] for r in recs[1:]], we, mean_tolerance(we, 3 * p, ops=1))
    fl = metrics.flicker(ta, tb).numpy()
    agree("flicker", [r["flicker"] for r in recs[1:]], fl, fl_elem + mean_tolerance(fl, p // 256))
    fb = metrics.flicker_single(tb).numpy()
    agree("flicker_b", [r["flicker_b"] for r in recs[2:]], fb, fl_elem + mean_tolerance(fb, p // 256))


def test_stream_without_temporal_metrics_stages_alike():
    # without temporal metrics frames are staged with torch's threaded copy: same numbers
    a = translated_clip(n=6, seed=5)
    b = np.clip(a.astype(int) + 3, 0, 255).astype(np.uint8)
    full = evaluate_pair(iter(a), iter(b), device="cpu", chunk=4)["records"]
    fid = evaluate_pair(iter(list(a)), iter(b), device="cpu", chunk=4, temporal=False)["records"]
    assert len(fid) == len(full) == 6 and "tlp" not in fid[1]
    for r0, r in zip(full, fid):
        for k in ("lpips", "ssim", "psnr", "max_abs_diff", "diff_fraction"):
            assert r[k] == r0[k], (k, r0["frame"])
    from evalkit.metrics.stream import _chunk_for, auto_chunk

    assert auto_chunk(720, 1280, "cpu") == 2 and auto_chunk(256, 256, "cpu") == 8
    # on a GPU: 8 frames at 720p while OpenCV's flows pass through pinned host memory, 16 when
    # they do not (no temporal metrics, or the torch flow, whose flows stay on the device)
    assert _chunk_for("cuda", 720, 1280, True) == 8 and _chunk_for("cuda", 720, 1280, False) == 16
    assert _chunk_for("cuda", 1080, 1920, True) == 3 and _chunk_for("cuda", 1080, 1920, False) == 7


def test_flows_on_host_only_for_opencv_flows():
    from evalkit.metrics.stream import PairEvaluator, flows_on_host

    for kw, want in (
        (dict(flow="dis"), True),
        (dict(flow="farneback"), True),
        (dict(flow="torch"), False),
        (dict(flow="dis", temporal=False), False),
    ):
        ev = PairEvaluator(device="cpu", **kw)
        try:
            assert flows_on_host(ev) is want, kw
        finally:
            ev.close()


def test_stream_accepts_chunks_and_tensors_and_is_deterministic():
    a = translated_clip(n=5, seed=4)
    b = a[:, ::-1].copy()  # vertically flipped: very different
    r1 = evaluate_pair([a[:2], a[2:]], (torch.from_numpy(f).permute(2, 0, 1) for f in b), device="cpu")
    r2 = evaluate_pair(iter(a), iter(b), device="cpu", chunk=4)
    assert [x["lpips"] for x in r1["records"]] == [x["lpips"] for x in r2["records"]]
    assert r1["means"] == r2["means"]


@pytest.mark.slow  # the streaming evaluator on clips
def test_stream_flow_threads_pipeline_and_update_agree():
    """The flow thread pool, the two-chunks-in-flight pipeline of stream_pair and plain
    update() calls give the same records, bit for bit; OpenCV threading is restored."""
    import cv2

    a = translated_clip(n=9, seed=5)
    rng = np.random.default_rng(3)
    b = np.clip(a.astype(int) + rng.integers(-5, 6, a.shape), 0, 255).astype(np.uint8)
    cv_threads = cv2.getNumThreads()
    inline = evaluate_pair(iter(a), iter(b), device="cpu", chunk=2, flow_workers=0)
    pooled = evaluate_pair(iter(a), iter(b), device="cpu", chunk=2, flow_workers=3)
    assert cv2.getNumThreads() == cv_threads
    ev = PairEvaluator(device="cpu")
    try:
        stepped = [r for i in range(0, 9, 2) for r in ev.update(chw(a[i : i + 2]), chw(b[i : i + 2]))]
        assert ev.compute()["means"] == inline["means"]
    finally:
        ev.close()
    assert pooled["records"] == inline["records"] == stepped
    assert inline["conventions"]["flow"] == "dis-fast,luma8"  # the default preset


def test_flow_does_not_depend_on_what_the_thread_computed_before():
    """A cached DIS instance that saw another frame size gave other flows (fixed)."""
    import concurrent.futures

    from evalkit.metrics.flow import flow_u8

    clip = translated_clip(n=2, seed=5)[..., 1].copy()  # 64x96
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fresh thread: reference
        ref = pool.submit(flow_u8, clip[0], clip[1]).result()
    other = np.random.default_rng(0).integers(0, 256, (2, 64, 64), dtype=np.uint8)
    flow_u8(other[0], other[1])  # another size first
    assert np.array_equal(flow_u8(clip[0], clip[1]), ref)


def test_stream_reads_at_most_one_chunk_ahead():
    """Callers that keep recent frames (evalkit compare keeps 2 chunks + 2) rely on this."""
    a = translated_clip(n=11, seed=6)
    read = {"a": 0, "b": 0}

    def counted(frames, side):
        for f in frames:
            read[side] += 1
            yield f

    chunk = 3
    for rec in stream_pair(counted(a, "a"), counted(a[:, :, ::-1], "b"), device="cpu", chunk=chunk):
        limit = min(len(a), (rec["frame"] // chunk + 2) * chunk)
        assert read["a"] <= limit and read["b"] <= limit, (rec["frame"], read)


class _OrderSpy(PairEvaluator):
    """A CPU evaluator that logs when each chunk is finished (its device work all queued) and
    when its records are handed out."""

    def __init__(self, **kw):
        super().__init__(device="cpu", **kw)
        self.log = []

    def _finish(self, job):
        if not job.finished:
            self.log.append(("finish", job.t0))
        super()._finish(job)

    def _records(self, job):
        self.log.append(("records", job.t0))
        return super()._records(job)


@pytest.mark.slow  # the streaming evaluator on clips
def test_stream_queues_the_next_chunk_before_handing_out_records():
    """Without flow threads, chunk k+1's work is all queued (finished) before chunk k's records
    are handed out, so a GPU never idles meanwhile; with flow threads, chunk k is finished
    after chunk k+1 is prepared (the threads get that time); the records are the same."""
    a = translated_clip(n=9, seed=4)
    b = np.clip(a.astype(int) + 3, 0, 255).astype(np.uint8)
    chunk = 3
    logs, records = {}, {}
    for name, kw in (
        ("torch flow", dict(flow="torch")),
        ("no temporal", dict(temporal=False)),
        ("flow threads", dict(flow_workers=2)),
    ):
        ev = _OrderSpy(**kw)
        try:
            records[name] = list(stream_pair(iter(a), iter(b), evaluator=ev, chunk=chunk))
            logs[name] = ev.log
        finally:
            ev.close()
    queued_first = [
        ("finish", 0),
        ("finish", 3),
        ("records", 0),
        ("finish", 6),
        ("records", 3),
        ("records", 6),
    ]
    assert logs["torch flow"] == logs["no temporal"] == queued_first
    assert logs["flow threads"] == [
        ("finish", 0),
        ("records", 0),
        ("finish", 3),
        ("records", 3),
        ("finish", 6),
        ("records", 6),
    ]
    assert [r["frame"] for r in records["torch flow"]] == list(range(9))
    ref = evaluate_pair(iter(a), iter(b), device="cpu", chunk=chunk, flow="torch")["records"]
    assert records["torch flow"] == ref


def test_stream_frame_size_change_and_dtype_change_name_the_frame():
    a = translated_clip(n=5)
    bad = list(a[:3]) + [a[3, :40]] + [a[4]]
    with pytest.raises(MetricInputError, match=r"^b: frame 3 is 96x40, expected 96x64 like frame 0 of b"):
        list(stream_pair(iter(a), iter(bad), device="cpu", chunk=2))
    mixed = list(a[:3]) + [a[3].astype(np.float32) / 255] + [a[4]]
    with pytest.raises(MetricInputError, match=r"^b: frame 3 is float32, expected uint8"):
        list(stream_pair(iter(a), iter(mixed), device="cpu", chunk=4))


# -- bad input --------------------------------------------------------------------------------


def test_different_sizes_is_a_clear_error():
    a = torch.zeros(2, 3, 32, 48, dtype=torch.uint8)
    b = torch.zeros(2, 3, 32, 40, dtype=torch.uint8)
    with pytest.raises(MetricInputError, match=r"b: frames are 40x32, expected 48x32"):
        metrics.ssim(a, b)
    with pytest.raises(MetricInputError, match=r"40x32, expected 48x32"):
        list(stream_pair(iter(a), iter(b), device="cpu"))


def test_input_errors_carry_their_field_detail_and_hint():
    """A caller words a MetricInputError for its own inputs from its parts (compare names the
    clip file, the command line's option), never by parsing the message; the message is
    ``field: detail (hint)`` and the parts survive pickling (worker processes, Ray)."""
    import pickle

    a = translated_clip(n=5)
    with pytest.raises(MetricInputError) as e:
        list(stream_pair(iter(a), iter(a[:3]), device="cpu", chunk=2))
    err = e.value
    assert (err.field, err.detail) == ("b", "3 frames, expected 5 like a")
    assert err.hint == "frame counts differ; use align='shortest' to compare the common prefix"
    assert str(err) == f"b: {err.detail} ({err.hint})"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is MetricInputError and isinstance(again, ValueError)
    assert (again.field, again.detail, again.hint, str(again)) == (err.field, err.detail, err.hint, str(err))
    b = np.array(a[:4])
    b[2] = 0
    frames = [*b[:2], b[2][:, :40], *b[3:]]  # frame 2 of another size
    with pytest.raises(MetricInputError) as e:
        list(stream_pair(iter(a[:4]), iter(frames), device="cpu", chunk=2))
    assert e.value.field == "b" and e.value.hint is None
    assert e.value.detail.startswith("frame 2 is 40x") and str(e.value) == f"b: {e.value.detail}"
    with pytest.raises(MetricInputError) as e:  # an option: its name leads the message
        PairEvaluator(device="cpu", ssim_channel="blue")
    assert e.value.field is None and str(e.value).startswith("ssim_channel: expected one of")


def test_different_frame_counts_error_or_recorded_alignment():
    a = translated_clip(n=5)
    with pytest.raises(MetricInputError, match=r"b: 3 frames, expected 5 like a"):
        list(stream_pair(iter(a), iter(a[:3]), device="cpu", chunk=2))
    with pytest.raises(MetricInputError, match=r"b: 4 frames, expected 3"):
        metrics.psnr(chw(a[:3]), chw(a[:4]))
    res = evaluate_pair(iter(a), iter(a[:3]), device="cpu", chunk=2, align="shortest")
    assert res["frames"] == 3 and len(res["records"]) == 3
    assert res["alignment"] == {
        "mode": "shortest",
        "frames_a": 5,
        "frames_b": 3,
        "compared": 3,
        "dropped_a": 2,
        "dropped_b": 0,
    }


def test_nan_and_inf_name_the_frame():
    a = torch.rand(6, 3, 32, 32)
    b = a.clone()
    b[4, 1, 3, 3] = float("nan")
    with pytest.raises(MetricInputError, match=r"^b: frame 4 holds nan values"):
        metrics.lpips(a, b)
    b[4, 1, 3, 3] = 0.5
    a[2, 0, 0, 0] = float("inf")
    with pytest.raises(MetricInputError, match=r"^a: frame 2 holds inf values"):
        metrics.ssim(a, b)
    # streamed in chunks of 2: the global frame number is named
    a[2, 0, 0, 0] = 0.5
    b[5, 2, 1, 1] = -float("inf")
    with pytest.raises(MetricInputError, match=r"^b: frame 5 holds -inf values"):
        list(stream_pair(iter(a), iter(b), device="cpu", chunk=2))
    b[5, 2, 1, 1] = 1.5
    with pytest.raises(MetricInputError, match=r"^b: frame 5 has values in \[.*1\.5\]; expected float"):
        metrics.psnr(a, b)


def test_wrong_shape_and_dtype_messages():
    with pytest.raises(
        MetricInputError, match=r"a: expected frames of shape \(N, 3, H, W\), found \(2, 24, 24, 3\)"
    ):
        metrics.psnr(torch.zeros(2, 24, 24, 3), torch.zeros(2, 24, 24, 3))
    with pytest.raises(
        MetricInputError, match=r"expected uint8 in \[0, 255\] or float in \[0, 1\], found dtype int64"
    ):
        metrics.psnr(torch.zeros(1, 3, 8, 8, dtype=torch.int64), torch.zeros(1, 3, 8, 8, dtype=torch.int64))
    with pytest.raises(MetricInputError, match=r"net: expected one of alex, vgg, found 'squeeze'"):
        metrics.lpips(torch.zeros(1, 3, 32, 32), torch.zeros(1, 3, 32, 32), net="squeeze")
    with pytest.raises(
        MetricInputError, match=r"24x20 is too small for LPIPS-alex; expected both sides >= 31"
    ):
        metrics.lpips(torch.zeros(1, 3, 20, 24), torch.zeros(1, 3, 20, 24))


# -- the command on clips ---------------------------------------------------------------------


def test_cli_metrics_on_clips_json_csv_and_errors(cli, tmp_path):
    from evalkit.video import write_lossless

    a = translated_clip(n=4, h=48, w=64)
    pa, pb, pc = tmp_path / "a.mkv", tmp_path / "b.mkv", tmp_path / "c.mkv"
    write_lossless(pa, a, 24)
    write_lossless(pb, a, 24)
    code, out, err = cli("metrics", pa, pb, "--json", "--device", "cpu", "--csv", tmp_path / "f.csv")
    assert code == 0, err
    got = json.loads(out)  # valid JSON: no Infinity/NaN tokens
    assert "Infinity" not in out and "NaN" not in out
    assert got["identical"] is True and got["psnr"] is None and got["per_frame"]["psnr"] == [None] * 4
    la = luma_planes(a[:1])
    assert got["lpips"] == 0.0 and abs(got["ssim"] - 1.0) <= ssim_bound(la, la).item()
    assert got["tlp"] == 0.0 and got["tof"] == 0.0 and got["warp_error_diff"] == 0.0
    assert got["per_frame"]["frame"] == [0, 1, 2, 3]
    assert got["per_frame"]["tlp"][0] is None and len(got["per_frame"]["tlp"]) == 4
    assert {"flow", "warp_error", "tlp", "tof", "flicker"} <= set(got["conventions"])
    rows = list(csv.DictReader(open(tmp_path / "f.csv")))
    assert [r["frame"] for r in rows] == ["0", "1", "2", "3"] and rows[0]["psnr"] == "inf"
    assert rows[0]["tlp"] == "" and float(rows[1]["tlp"]) == 0.0

    # different frame counts: one-line error naming the file; --align shortest records it
    write_lossless(pc, a[:3], 24)
    code, out, err = cli("metrics", pa, pc, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, str(pc), "3 frames, expected 4")
    code, out, err = cli("metrics", pa, pc, "--device", "cpu", "--json", "--align", "shortest")
    assert code == 0, err
    al = json.loads(out)["alignment"]
    assert al["compared"] == 3 and al["frames_a"] == 4 and al["frames_b"] == 3

    # different sizes
    small = tmp_path / "small.png"
    Image.fromarray(a[0, :40]).save(small)
    Image.fromarray(a[0]).save(tmp_path / "full.png")
    code, out, err = cli("metrics", tmp_path / "full.png", small, "--device", "cpu")
    assert code == 2
    assert_one_line_error(err, str(small), "64x40", "64x48")


def test_cudnn_benchmark_limit_is_set_inside_precise_and_restored(monkeypatch):
    """``PairEvaluator(cudnn_benchmark_limit=)``: the number of
    candidates cuDNN's autotuning times, set only inside the metric's ``precise`` blocks."""
    import torch

    from evalkit.metrics._common import precise
    from evalkit.metrics._errors import MetricInputError
    from evalkit.metrics.stream import CUDNN_BENCHMARK_LIMIT, PairEvaluator

    before = torch.backends.cudnn.benchmark_limit
    with precise(True, 3):
        assert torch.backends.cudnn.benchmark_limit == 3
        with precise():
            assert torch.backends.cudnn.benchmark_limit == 3
    assert torch.backends.cudnn.benchmark_limit == before
    assert PairEvaluator(device="cpu", temporal=False).cudnn_benchmark_limit == CUDNN_BENCHMARK_LIMIT
    assert PairEvaluator(device="cpu", temporal=False, cudnn_benchmark_limit=0).cudnn_benchmark_limit == 0
    with pytest.raises(MetricInputError, match="cudnn_benchmark_limit.*found 'few'"):
        PairEvaluator(device="cpu", temporal=False, cudnn_benchmark_limit="few")
    with pytest.raises(MetricInputError, match="cudnn_benchmark_limit.*found -1"):
        PairEvaluator(device="cpu", temporal=False, cudnn_benchmark_limit=-1)


def test_warm_up_loads_every_triton_kernel_module():
    """The warm-up's loading thread imports Triton's kernel modules of the stream
    (:data:`evalkit.metrics.stream.KERNEL_MODULES`): every ``metrics/_triton_*.py`` is listed, and
    loading them imports each (here with the CPU's Triton, as CI installs it)."""
    import importlib.util
    import sys
    from pathlib import Path

    from evalkit import metrics
    from evalkit.metrics import stream

    on_disk = {p.stem for p in Path(metrics.__file__).parent.glob("_triton_*.py")}
    assert on_disk == set(stream.KERNEL_MODULES)
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    for name in stream.KERNEL_MODULES:
        sys.modules.pop(f"evalkit.metrics.{name}", None)
    stream._load_kernel_modules()
    assert all(f"evalkit.metrics.{name}" in sys.modules for name in stream.KERNEL_MODULES)


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(),
    reason="CUDA: the autotuned trunk in two passes against one pass",
)
def test_autotuned_trunk_in_two_passes_matches_one_pass_on_cuda():
    """On a GPU: with cuDNN autotuning (the trunk runs A and B in two passes after a warm-up)
    the records agree with the untuned one-pass path up to float32 rounding."""
    import numpy as np

    from evalkit.metrics.stream import PairEvaluator, stream_pair

    r = np.random.default_rng(0)
    fa = r.integers(0, 256, (20, 256, 320, 3), np.uint8)
    fb = np.clip(fa.astype(int) + r.integers(-9, 10, fa.shape), 0, 255).astype(np.uint8)
    out = {}
    for tuned in (True, False):
        ev = PairEvaluator(device="cuda", temporal=True, flow="torch", cudnn_benchmark=tuned)
        ev.warm_up(256, 320, 8)
        out[tuned] = list(stream_pair(iter([fa]), iter([fb]), evaluator=ev, chunk=8))
        ev.close()
    from evalkit.metrics.perceptual import get_model

    m = get_model("alex", "cpu")
    x, y = (
        torch.from_numpy(fa).permute(0, 3, 1, 2).double() / 255,
        torch.from_numpy(fb).permute(0, 3, 1, 2).double() / 255,
    )
    tols = {
        "lpips": ab_tolerance(lpips_bound(m, x, y)).tolist(),
        "tlp": [None]
        + (ab_tolerance(lpips_bound(m, x[1:], x[:-1]) + lpips_bound(m, y[1:], y[:-1])) + 2 * U32).tolist(),
    }
    for a, b in zip(out[True], out[False]):
        for k in ("lpips", "tlp"):
            if a.get(k) is not None:  # LPIPS's rounding bound at these sizes (tests/numerics.py)
                assert abs(a[k] - b[k]) <= tols[k][a["frame"]], (k, a[k], b[k])
