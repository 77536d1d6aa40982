"""The CUDA fast paths of the metric chain, checked on the CPU (metrics/_triton_ssim.py,
metrics/_triton_pixels.py, the space-to-depth conv1 of metrics/perceptual.py).

The Triton kernels run on CPU tensors under ``TRITON_INTERPRET=1`` (in a subprocess: the
variable must be set before triton is imported) and are compared with the torch path they
replace on CUDA and with scikit-image. Speed: benchmarks/bench_chain.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from numerics import U32, ab_tolerance, gamma

from evalkit import metrics
from evalkit.metrics._common import fast_path, fast_paths, precise
from evalkit.metrics.perceptual import conv_s2d, get_model, s2d_weight

pytestmark = pytest.mark.filterwarnings("ignore:.*(pretrained|weight enum).*:UserWarning")

# Runs in the interpreter; prints one JSON object.
_SCRIPT = r"""
import json, sys
import numpy as np, torch
from PIL import Image
from skimage.metrics import structural_similarity
from evalkit.metrics._common import luma, precise
from evalkit.metrics.fidelity import _gaussian_window, _ssim_planes, exactness_kernel, mse_kernel
from evalkit.metrics._triton_pixels import mse_exactness_u8
from evalkit.metrics._triton_ssim import ssim_planes
from numerics import ssim_bound

g = _gaussian_window(11, 1.5, "cpu")
c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
rng = np.random.default_rng(0)
out = {}

def cmp(name, x, y):
    with precise():
        want, got = _ssim_planes(x, y, g, c1, c2), ssim_planes(x, y, g, c1, c2)
    out[name] = {"got": got.tolist(), "want": want.tolist(), "bound": ssim_bound(x, y).tolist()}
    return got

# 3 planes of 37x53 (random 8-bit values, a noisy copy), odd sizes
x = torch.from_numpy(rng.integers(0, 256, (3, 1, 37, 53))).float()
y = (x + torch.from_numpy(rng.integers(-40, 41, x.shape)).float()).clamp(0, 255)
batch = cmp("random_37x53", x, y)
# one plane alone gives bit for bit what it gives in the batch
alone = ssim_planes(x[2:], y[2:], g, c1, c2)
out["batch_independent"] = bool(alone[0] == batch[2])
out["deterministic"] = bool((ssim_planes(x[2:], y[2:], g, c1, c2) == alone).all())
# the smallest frame (one window position), constant planes, extreme values
cmp("one_window_11x11", torch.from_numpy(rng.integers(0, 256, (1, 1, 11, 11))).float(),
    torch.from_numpy(rng.integers(0, 256, (1, 1, 11, 11))).float())
cmp("constant", torch.full((2, 1, 16, 19), 7.0), torch.stack([torch.full((1, 16, 19), 7.0),
                                                               torch.full((1, 16, 19), 250.0)]))
cb = ((torch.arange(24)[:, None] + torch.arange(29)[None, :]) % 2 * 255.0)[None, None]
cmp("extremes", torch.cat([cb, cb, torch.zeros_like(cb)]), torch.cat([cb, 255 - cb, torch.full_like(cb, 255.0)]))
cmp("float_unrounded", torch.from_numpy(rng.random((2, 1, 23, 31)) * 255).float(),
    torch.from_numpy(rng.random((2, 1, 23, 31)) * 255).float())

# calibration frames: luma planes, against scikit-image (float64) as well
sk = []
planes = []
crop = (slice(None), slice(None)) if sys.argv[2] == "full" else (slice(100, 164), slice(200, 296))
for pair in sys.argv[3:]:
    r = np.asarray(Image.open(f"{sys.argv[1]}/ref/{pair}.png").convert("RGB"), dtype=np.uint8)[crop]
    d = np.asarray(Image.open(f"{sys.argv[1]}/dist/{pair}.png").convert("RGB"), dtype=np.uint8)[crop]
    ya = luma(torch.from_numpy(r).permute(2, 0, 1)[None])
    yb = luma(torch.from_numpy(d).permute(2, 0, 1)[None])
    planes.append((ya, yb))
    sk.append(structural_similarity(ya[0, 0].double().numpy(), yb[0, 0].double().numpy(), gaussian_weights=True,
                                    sigma=1.5, use_sample_covariance=False, data_range=255))
got = cmp("calibration", torch.cat([p[0] for p in planes]), torch.cat([p[1] for p in planes]))
out["calibration"]["skimage"] = sk

# MSE and exactness of uint8 frames: channels-last views and contiguous frames
a = torch.from_numpy(rng.integers(0, 256, (4, 37, 53, 3), dtype=np.uint8)).permute(0, 3, 1, 2)
b = a.clone().contiguous()
b[1, 2, 5, 7] ^= 1
b[2] = torch.from_numpy(rng.integers(0, 256, (3, 37, 53), dtype=np.uint8))
b[3] = 255 - a[3]
with precise():
    m, ex = mse_exactness_u8(a, b)
    out["pixels"] = {"mse": [m.tolist(), mse_kernel(a, b).tolist()],
                     "max_abs_diff": [ex["max_abs_diff"].tolist(), exactness_kernel(a, b)["max_abs_diff"].tolist()],
                     "diff_fraction": [ex["diff_fraction"].tolist(), exactness_kernel(a, b)["diff_fraction"].tolist()]}
for v in out.values():
    if isinstance(v, dict) and "got" in v:
        v["max_diff"] = float(np.abs(np.array(v["got"]) - np.array(v["want"])).max())
        if "skimage" in v:
            v["max_diff_skimage"] = float(np.abs(np.array(v["got"]) - np.array(v["skimage"])).max())
            v["max_diff_skimage_torch"] = float(np.abs(np.array(v["want"]) - np.array(v["skimage"])).max())
# rounded luma of uint8 frames: every RGB triple whose float64 luma is an exact half (13,178
# of them: the rounding convention matters there) and random ones, channels-last
from evalkit.metrics._common import LUMA_WEIGHTS
from evalkit.metrics._triton_pixels import luma_u8
v = np.arange(256, dtype=np.float64)
ties = []
for r in range(256):
    yv = (r * 0.299 + v[:, None] * 0.587) + v[None, :] * 0.114
    gi, bi = np.nonzero(yv - np.floor(yv) == 0.5)
    ties += [(r, g, b) for g, b in zip(gi, bi)]
trip = np.concatenate([np.array(ties, dtype=np.uint8), rng.integers(0, 256, (3206, 3), dtype=np.uint8)])
x = torch.from_numpy(trip.reshape(1, -1, 64, 3)).permute(0, 3, 1, 2)
out["luma"] = {"ties": len(ties), "equal": bool(torch.equal(luma_u8(x, LUMA_WEIGHTS), luma(x))),
               "pixels": int(x[0, 0].numel())}
print(json.dumps(out))
"""

CALIB_PAIRS = ("I03", "I04", "I06", "I08", "I19")  # all of them: with "full" (see the report)


@pytest.fixture(scope="module")
def interpreted():
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    p = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(ROOT / "tests/data/calibration"), "crop", "I19"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# Tolerances: the same float32 operations per window, summed in other orders. Each path stays
# within numerics.ssim_bound of the exact SSIM of its planes (gamma_n of float32 for the filter
# sums, the cancellation of E[x^2] - E[x]^2 on values centred on the rounded mean: on the
# constant planes 7 and 250 (shift 128) that is what dominates), so they differ by at most twice
# that (ab_tolerance); scikit-image's float64 by its own bound with float64's roundoff.


@pytest.mark.parametrize(
    "case", ["random_37x53", "one_window_11x11", "constant", "extremes", "float_unrounded", "calibration"]
)
@pytest.mark.slow  # Triton's interpreter (the module fixture `interpreted`)
def test_triton_ssim_matches_torch_path(interpreted, case):
    r = interpreted[case]
    got, want = np.array(r["got"]), np.array(r["want"])
    assert got.shape == want.shape and np.isfinite(got).all()
    bound = np.array(r["bound"])
    if case == "constant":
        c1 = (0.01 * 255) ** 2
        exact = [1.0, (2 * 7 * 250 + c1) / (7**2 + 250**2 + c1)]  # no variance: the C2 terms cancel
        assert np.all(np.abs(got - exact) <= bound) and np.all(np.abs(want - exact) <= bound)
    assert np.all(np.abs(got - want) <= ab_tolerance(bound)), (got, want, bound)
    if case == "extremes":  # same pattern, inverted pattern, black against white
        assert abs(got[0] - 1.0) <= bound[0] and got[1] < -0.99 and abs(got[2]) < 1e-3


@pytest.mark.slow  # Triton's interpreter (the module fixture `interpreted`)
def test_triton_ssim_matches_skimage_on_a_calibration_crop(interpreted):
    r = interpreted["calibration"]
    # scikit-image's float64: its own rounding is 2^-29 of ours, inside the bound's margin
    assert np.all(np.abs(np.array(r["got"]) - r["skimage"]) <= np.array(r["bound"]) * (1 + 2**-29))
    assert r["got"][0] > 0.3  # a real difference


@pytest.mark.slow  # Triton's interpreter (the module fixture `interpreted`)
def test_triton_ssim_is_deterministic_and_independent_of_the_batch(interpreted):
    assert interpreted["deterministic"] and interpreted["batch_independent"]


@pytest.mark.slow  # Triton's interpreter (the module fixture `interpreted`)
def test_triton_mse_and_exactness_equal_the_torch_path(interpreted):
    px = interpreted["pixels"]
    assert px["mse"][0] == px["mse"][1]
    assert px["max_abs_diff"][0] == px["max_abs_diff"][1] == [0.0, 1.0, px["max_abs_diff"][1][2], 255.0]
    # the count of differing positions is exact; each division rounds once (u each: 2u apart)
    np.testing.assert_allclose(px["diff_fraction"][0], px["diff_fraction"][1], rtol=2 * U32, atol=0)
    assert px["diff_fraction"][0][0] == 0.0
    assert px["diff_fraction"][0][1] == pytest.approx(1 / (37 * 53), rel=U32, abs=0)


@pytest.mark.slow  # Triton's interpreter (the module fixture `interpreted`)
def test_triton_luma_equals_numpy_rounding_on_every_tie(interpreted):
    r = interpreted["luma"]
    assert r["ties"] == 13178 and r["pixels"] == 13178 + 3206 and r["equal"]


@pytest.mark.parametrize("hw", [(31, 31), (64, 64), (37, 53), (66, 91), (33, 34), (35, 36), (128, 96)])
def test_conv1_space_to_depth_equals_the_strided_conv(hw):
    h, w = hw
    assert {(h + 4 - 11) % 4 for h in (31, 64, 37, 66)} == {0, 1, 2, 3}
    g = torch.Generator().manual_seed(h * 1000 + w)
    x = torch.randn(2, 3, h, w, generator=g)
    weight, bias = torch.randn(64, 3, 11, 11, generator=g) * 0.1, torch.randn(64, generator=g)
    want = F.conv2d(x, weight, bias, stride=4, padding=2)
    got = conv_s2d(x, s2d_weight(weight, 4), bias, k=11, stride=4, padding=2)
    assert got.shape == want.shape
    # the same 363 products and the bias summed in another order: each within gamma(364) of the
    # sum of their magnitudes (a dot product in any order), so twice that apart
    mag = F.conv2d(x.double().abs(), weight.double().abs(), bias.double().abs(), stride=4, padding=2)
    assert ((got - want).abs().double() <= ab_tolerance(gamma(364) * mag)).all()


@pytest.mark.slow  # the lpips package
def test_lpips_with_space_to_depth_conv1_matches_the_package(lpips_ref_alex):
    from test_metrics import _random_pair, chw, load_png, lpips_tol

    r = load_png(ROOT / "tests/data/calibration/ref/I19.png")[100:196, 200:328][None]
    d = load_png(ROOT / "tests/data/calibration/dist/I19.png")[100:196, 200:328][None]
    model = get_model("alex", "cpu")
    for a, b in (_random_pair(4, n=2, h=64, w=64), (r, d)):
        with fast_paths(conv1_s2d=True):
            assert model._use_s2d()
            got = model(chw(a), chw(b))
        with fast_paths(conv1_s2d=False):
            assert not model._use_s2d()
            plain = model(chw(a), chw(b))
        with torch.no_grad():
            want = lpips_ref_alex(chw(a).float() / 127.5 - 1, chw(b).float() / 127.5 - 1).flatten()
        # two float32 evaluations of the same LPIPS (tests/numerics.py: the trunk's running bound
        # through the head), whatever the order of the conv1 sums
        tol = torch.from_numpy(lpips_tol(a, b)).float()
        assert ((got - want).abs() <= tol).all() and ((got - plain).abs() <= tol).all()
        assert want.min().item() > 1e-3
    assert not model._use_s2d()  # the CPU default: the plain conv


def test_fast_path_switches(monkeypatch):
    monkeypatch.setenv("EVALKIT_TRITON", "0")
    assert not fast_path("triton_ssim") and not fast_path("triton_pixels") and fast_path("conv1_s2d")
    with fast_paths(triton_ssim=True):
        assert fast_path("triton_ssim") and not fast_path("triton_pixels")
        with fast_paths(all=False):
            assert not any(
                fast_path(k) for k in ("triton_ssim", "triton_pixels", "conv1_s2d", "one_pass_unit")
            )
    monkeypatch.delenv("EVALKIT_TRITON")
    assert fast_path("triton_ssim")
    with pytest.raises(ValueError, match="unknown"):
        with fast_paths(ssim=False):
            pass
    # on the CPU the values do not depend on the switches
    a = torch.randint(0, 256, (2, 3, 40, 48), dtype=torch.uint8)
    b = torch.randint(0, 256, (2, 3, 40, 48), dtype=torch.uint8)
    with fast_paths(all=False):
        off = metrics.ssim(a, b), metrics.psnr(a, b)
    on = metrics.ssim(a, b), metrics.psnr(a, b)
    assert all(torch.equal(x, y) for x, y in zip(off, on))


def test_one_pass_unit_conversion_is_the_same_division():
    from evalkit.metrics.stream import unit_into

    x = (torch.arange(2 * 40 * 50 * 3) % 256).to(torch.uint8).reshape(2, 40, 50, 3).permute(0, 3, 1, 2)
    got, want = torch.empty(x.shape), torch.empty(x.shape)
    with fast_paths(one_pass_unit=True):
        unit_into(x, got)
    with fast_paths(one_pass_unit=False):
        unit_into(x, want)
    assert (
        torch.equal(got, want)
        and got[0, 0, 0, 1].item() == np.float32(3) / np.float32(255)
        and got.max().item() == 1.0
    )


@pytest.fixture(scope="module")
def lpips_ref_alex():
    import lpips

    from evalkit.metrics import weights as _weights

    m = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    m.load_state_dict(_weights.load_state_dict("alex"), strict=False)
    return m.eval()


def test_a_triton_path_that_fails_before_it_ever_ran_falls_back_once_with_a_warning():
    """A kernel that does not compile on a user's GPU (say ROCm) must not stop a compare: the
    first failure warns, turns the family off and gives the torch result; once a path has run,
    a later failure is a real error and is raised."""
    from evalkit.metrics._common import TritonFallback

    calls = []

    def broken():
        calls.append("triton")
        raise RuntimeError("PTX .version 8.7 does not support .target sm_120\nmore")

    fam = TritonFallback("SSIM kernels (ssim_planes)", lambda: "kernel")
    assert fam.kernel() == "kernel" and fam.failed is None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fam.run(broken, lambda: "torch")
        assert fam.run(broken, lambda: "torch again") == "torch again"  # a second caller: no warning
    assert out == "torch" and calls == ["triton", "triton"]
    assert fam.kernel() is None  # off for the process
    [w] = seen
    assert "ssim_planes" in str(w.message) and "sm_120" in str(w.message)
    assert "torch path" in str(w.message) and "RuntimeError" in str(w.message)
    assert "more" not in str(w.message)  # one line
    ok = TritonFallback("luma kernel (luma_u8)", lambda: "kernel")
    assert ok.run(lambda: "ok", lambda: "torch") == "ok"
    with pytest.raises(RuntimeError):  # it ran before: a real error
        ok.run(broken, lambda: "torch")
    lenient = TritonFallback("fused flow kernels", lambda: "kernel", strict=False)
    assert lenient.run(lambda: "ok", lambda: "torch") == "ok"
    with pytest.warns(RuntimeWarning, match="fused flow kernels"):  # not strict: falls back
        assert lenient.run(broken, lambda: "torch") == "torch"
    assert TritonFallback("x", _no_triton).kernel() is None  # Triton not installed: torch


def _no_triton():
    raise ImportError("No module named 'triton'")


@pytest.mark.parametrize("family", ["TRITON_SSIM", "TRITON_LUMA", "TRITON_PIXELS"])
def test_each_fidelity_kernel_that_cannot_run_falls_back_to_the_same_torch_numbers(monkeypatch, family):
    """The real kernels of evalkit.metrics.fidelity on CPU tensors outside the interpreter: they cannot
    launch, which is what a Triton that cannot compile on a user's GPU looks like. Through
    fidelity's own families: one warning naming the kernel, then the torch path's numbers exactly,
    and from then on no Triton and no warning."""
    pytest.importorskip("triton")
    from evalkit.metrics import fidelity
    from evalkit.metrics._common import LUMA_WEIGHTS, TritonFallback, luma

    old = getattr(fidelity, family)
    fam = TritonFallback(old.family, old.load)  # fresh: nothing failed or ran yet
    monkeypatch.setattr(fidelity, family, fam)
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 256, (2, 3, 24, 32), dtype=torch.uint8, generator=g)
    b = torch.randint(0, 256, (2, 3, 24, 32), dtype=torch.uint8, generator=g)
    fn = fam.kernel()
    assert fn is not None
    if family == "TRITON_SSIM":
        x, y = luma(a), luma(b)
        win = fidelity._gaussian_window(11, 1.5, "cpu")
        c = ((0.01 * 255) ** 2, (0.03 * 255) ** 2)
        args = (x, y, win, *c)
        call, torch_path = (lambda: fn(*args)), (lambda: fidelity._ssim_planes(*args))
    elif family == "TRITON_LUMA":
        call, torch_path = (lambda: fn(a, LUMA_WEIGHTS)), (lambda: luma(a))
    else:
        call, torch_path = (
            (lambda: fn(a, b)),
            (lambda: (fidelity.mse_kernel(a, b), fidelity.exactness_kernel(a, b))),
        )
    with precise():
        with pytest.warns(RuntimeWarning, match=r"Triton .*\(" + fn.__name__ + r"\) failed .*torch path"):
            got = fam.run(call, torch_path)
        want = torch_path()
    assert fam.failed and fam.kernel() is None
    flat = lambda v: [v[0], *v[1].values()] if isinstance(v, tuple) else [v]  # noqa: E731
    assert all(torch.equal(p, q) for p, q in zip(flat(got), flat(want), strict=True))
