"""The fused Triton path of the torch optical flow (metrics/_triton_flow.py) against the torch
path: Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess: it must be set before triton
is imported) runs the same kernels on CPU tensors, at small sizes. The speed on a GPU is
measured in ``benchmarks/bench_flow.py --part speed --fused``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import ROOT, run_interpreted
from numerics import gamma

from evalkit.metrics import torchflow

pytestmark = pytest.mark.slow  # Triton's interpreter

pytest.importorskip("triton")

SCRIPT = r"""
import functools
import json
import os
import torch
from numerics import flow_tolerance
from skimage import data as skdata
from evalkit.testing.flowcheck import photo_grey, synthetic_pair
from evalkit.metrics.torchflow import torch_flow

torch.set_num_threads(1)
astro, coffee = photo_grey(skdata.astronaut(), 0.4), photo_grey(skdata.coffee(), 0.4)
pairs = [synthetic_pair(astro, (48, 64), shift=(4.6, 2.2)),
         synthetic_pair(astro, (48, 64), angle=3.0, shift=(-1.3, 0.7))]
odd = synthetic_pair(coffee, (33, 47), zoom=1.04, shift=(0.4, -0.3))
t = lambda a: torch.from_numpy(a)  # noqa: E731
# solved down to the frames' own (odd) sizes: the default stops at 1/2 scale
torch_flow = functools.partial(torch_flow, finest=0)
src, dst = torch.stack([t(p[0]) for p in pairs]), torch.stack([t(p[1]) for p in pairs])
ref, fused = torch_flow(src, dst, fused=False), torch_flow(src, dst, fused=True)
alone = torch_flow(src[1:], dst[1:], fused=True)
oref = torch_flow(t(odd[0])[None], t(odd[1])[None], fused=False)
ofused = torch_flow(t(odd[0])[None], t(odd[1])[None], fused=True)
truth = [torch.from_numpy(p[2]).permute(2, 0, 1) for p in pairs]
print(json.dumps({
    # over their tolerances (numerics.flow_tolerance; finest=0: 2 levels at 48x64 and 33x47)
    "max_diff": float((ref - fused).abs().max()) / flow_tolerance(float(ref.abs().max()), levels=2),
    "odd_max_diff": float((oref - ofused).abs().max()) / flow_tolerance(float(oref.abs().max()), levels=2),
    "max_diff_px": float((ref - fused).abs().max()),
    "batch_diff": float((alone[0] - fused[1]).abs().max()),
    "finite": bool(fused.isfinite().all() and ofused.isfinite().all()),
    "epe_ref": [float((r - g).norm(dim=0).mean()) for r, g in zip(ref, truth)],
    "epe_fused": [float((r - g).norm(dim=0).mean()) for r, g in zip(fused, truth)],
    "median_shift": float(fused[0].norm(dim=0).median()),
}))
"""


def test_fused_flow_kernels_match_the_torch_path_under_the_triton_interpreter():
    got = run_interpreted(SCRIPT, path=(ROOT / "tests",), EVALKIT_TRITON="1")
    assert got["finite"], got
    # the same flow up to float32 rounding (2 pairs of 48x64, warped outside the frame at the
    # borders; 1 pair of 33x47: odd sizes, pyramid levels of odd sizes)
    assert got["max_diff"] <= 1, got
    assert got["odd_max_diff"] <= 1, got
    # batch-invariant: a pair computed alone is the same pair computed beside another
    assert got["batch_diff"] == 0.0, got
    # and it is a real flow: the 4.6 px shift is there, the error against the truth is small
    assert got["median_shift"] > 4.0, got
    for e_ref, e_fused in zip(got["epe_ref"], got["epe_fused"]):
        # a mean end-point error moves by at most the largest change of a vector (triangle
        # inequality), plus its own mean's rounding over 48x64 pixels
        assert (
            e_fused < 0.5 and abs(e_fused - e_ref) <= got["max_diff_px"] + 2 * gamma(48 * 64 + 4) * e_ref
        ), got


def test_fused_path_is_chosen_on_cuda_only_and_can_be_switched_off(monkeypatch):
    monkeypatch.delenv("EVALKIT_TRITON", raising=False)
    assert not torchflow.use_fused("cpu")
    assert torchflow.use_fused(torch.device("cuda"))  # triton imports here
    assert not torchflow.use_fused("cuda", fused=False)
    assert torchflow.use_fused("cpu", fused=True)
    monkeypatch.setenv("EVALKIT_TRITON", "0")
    assert not torchflow.use_fused("cuda")
    assert torchflow.use_fused("cuda", fused=True)


def test_default_fused_path_that_cannot_run_falls_back_to_the_torch_path(monkeypatch):
    """No GPU here: the kernels cannot launch on CPU tensors outside the interpreter, which is
    what a Triton that cannot compile on a user's machine looks like to torch_flow."""
    from evalkit.metrics._common import TritonFallback

    fam = TritonFallback(torchflow.TRITON_FUSED.family, torchflow.TRITON_FUSED.load, strict=False)
    monkeypatch.setattr(torchflow, "TRITON_FUSED", fam)  # fresh: nothing failed yet
    real = torchflow.use_fused
    monkeypatch.setattr(
        torchflow,
        "use_fused",
        lambda dev, fused=None: (fam.kernel() is not None) if fused is None else real(dev, fused),
    )
    g = torch.Generator().manual_seed(0)
    src = (torch.rand((1, 40, 48), generator=g) * 255).round().to(torch.uint8)
    dst = torch.roll(src, 2, 2)
    want = torchflow.torch_flow(src, dst, fused=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torchflow.torch_flow(src, dst)
    [w] = seen  # one warning, naming the kernels and the error
    assert w.category is RuntimeWarning
    assert "fused flow kernels (warp_step) failed" in str(w.message) and "torch path" in str(w.message)
    assert fam.failed and fam.failed.split(":")[0] in str(w.message)
    assert torch.equal(got, want)
    with warnings.catch_warnings():  # from now on the torch path, no warning
        warnings.simplefilter("error")
        torch.testing.assert_close(torchflow.torch_flow(src, dst), want, rtol=0, atol=0)
    with pytest.raises(Exception):  # forced: the error is not hidden
        torchflow.torch_flow(src, dst, fused=True)


# The products and blur kernels as they were before the 2-D launch grid (one lane per pixel of
# the flattened batch, per-lane divisions, clamps at every tap): the new ones must give the same
# bits (the same float operations in the same order; only the index work changed).
OLD_KERNELS = r"""
import triton
import triton.language as tl
from evalkit.metrics._triton_flow import _avg4_pair, pixel_index, _sample, _warp_mean


@triton.jit
def products(i0_ptr, i1_ptr, fl_ptr, out_ptr, total, H, W, sx, sy, BLOCK: tl.constexpr):
    live, HW, n, rem, y, x = pixel_index(total, H, W, BLOCK)
    img = n * HW
    fimg = n * (2 * HW)
    wm1 = (W - 1).to(tl.float32)
    hm1 = (H - 1).to(tl.float32)
    u = tl.load(fl_ptr + fimg + rem)
    v = tl.load(fl_ptr + fimg + HW + rem)
    px = x.to(tl.float32) + u
    py = y.to(tl.float32) + v
    inside = (px >= 0.0) & (px <= wm1) & (py >= 0.0) & (py <= hm1)
    insf = tl.where(inside, 1.0, 0.0)
    w1 = _sample(i1_ptr, img, px, py, W, H, wm1, hm1, sx, sy)
    i0 = tl.load(i0_ptr + img + rem)
    it = (w1 - i0) * insf
    xa = tl.maximum(x - 2, 0)
    xb = tl.maximum(x - 1, 0)
    xc = tl.minimum(x + 1, W - 1)
    xd = tl.minimum(x + 2, W - 1)
    ya = tl.maximum(y - 2, 0)
    yb = tl.maximum(y - 1, 0)
    yc = tl.minimum(y + 1, H - 1)
    yd = tl.minimum(y + 2, H - 1)
    gx = (_warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xa, W, H, HW, wm1, hm1, sx, sy) * (1.0 / 12)
          + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xb, W, H, HW, wm1, hm1, sx, sy) * (-8.0 / 12)
          + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xc, W, H, HW, wm1, hm1, sx, sy) * (8.0 / 12)
          + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xd, W, H, HW, wm1, hm1, sx, sy) * (-1.0 / 12))
    gy = (_warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, ya, x, W, H, HW, wm1, hm1, sx, sy) * (1.0 / 12)
          + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, yb, x, W, H, HW, wm1, hm1, sx, sy) * (-8.0 / 12)
          + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, yc, x, W, H, HW, wm1, hm1, sx, sy) * (8.0 / 12)
          + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, yd, x, W, H, HW, wm1, hm1, sx, sy) * (-1.0 / 12))
    gx = gx * insf
    gy = gy * insf
    o = n * (5 * HW) + rem
    tl.store(out_ptr + o, gx * gx, mask=live)
    tl.store(out_ptr + o + HW, gx * gy, mask=live)
    tl.store(out_ptr + o + 2 * HW, gy * gy, mask=live)
    tl.store(out_ptr + o + 3 * HW, gx * it, mask=live)
    tl.store(out_ptr + o + 4 * HW, gy * it, mask=live)


@triton.jit
def blur_x(in_ptr, g_ptr, out_ptr, total, W, R: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < total
    idx = tl.where(live, idx, 0)
    row = idx // W
    x = idx - row * W
    base = row * W
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(2 * R + 1):
        xq = tl.minimum(tl.maximum(x + (j - R), 0), W - 1)
        acc += tl.load(g_ptr + j) * tl.load(in_ptr + base + xq)
    tl.store(out_ptr + idx, acc, mask=live)


@triton.jit
def blur_y_coef(in_ptr, g_ptr, fl_ptr, coef_ptr, d_ptr, total, H, W, alpha, R: tl.constexpr,
                BLOCK: tl.constexpr):
    live, HW, n, rem, y, x = pixel_index(total, H, W, BLOCK)
    src = n * (5 * HW) + x
    j11 = tl.zeros([BLOCK], dtype=tl.float32)
    j12 = tl.zeros([BLOCK], dtype=tl.float32)
    j22 = tl.zeros([BLOCK], dtype=tl.float32)
    j13 = tl.zeros([BLOCK], dtype=tl.float32)
    j23 = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(2 * R + 1):
        g = tl.load(g_ptr + j)
        p = src + tl.minimum(tl.maximum(y + (j - R), 0), H - 1) * W
        j11 += g * tl.load(in_ptr + p)
        j12 += g * tl.load(in_ptr + p + HW)
        j22 += g * tl.load(in_ptr + p + 2 * HW)
        j13 += g * tl.load(in_ptr + p + 3 * HW)
        j23 += g * tl.load(in_ptr + p + 4 * HW)
    inv_u = 1.0 / (j11 + alpha)
    inv_v = 1.0 / (j22 + alpha)
    f = n * (2 * HW)
    fu = fl_ptr + f
    fv = fl_ptr + f + HW
    nu, nv = _avg4_pair(fu, fv, x, y, H, W)
    cu = (alpha * (nu - tl.load(fu + rem)) - j13) * inv_u
    cv = (alpha * (nv - tl.load(fv + rem)) - j23) * inv_v
    o = n * (5 * HW) + rem
    tl.store(coef_ptr + o, inv_u, mask=live)
    tl.store(coef_ptr + o + HW, inv_v, mask=live)
    tl.store(coef_ptr + o + 2 * HW, j12, mask=live)
    tl.store(coef_ptr + o + 3 * HW, cu, mask=live)
    tl.store(coef_ptr + o + 4 * HW, cv, mask=live)
    tl.store(d_ptr + f + rem, cu, mask=live)
    tl.store(d_ptr + f + HW + rem, cv, mask=live)
"""

EXACT = r"""
import json
import sys
import torch
import triton
from evalkit.metrics import _triton_flow as tf
from evalkit.metrics.torchflow import _gauss1d
import old_flow_kernels as old

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)


def one(kernel, total, *args, **kw):
    b = min(triton.next_power_of_2(total), 1 << 16)
    kernel[(triton.cdiv(total, b),)](*args, BLOCK=b, **kw)


def step(n, h, w, g, new):
    i0 = torch.rand((n, 1, h, w), generator=gen) * 255
    i1 = torch.roll(i0, (1, 2), (2, 3)) + torch.rand((n, 1, h, w), generator=gen) * 8
    flow = (torch.rand((n, 2, h, w), generator=gen) - 0.5) * 10     # warps outside the frame too
    sx, sy, r, alpha = 2.0 / max(w - 1, 1), 2.0 / max(h - 1, 1), g.numel() // 2, 1e-4
    out = []
    for kernels in ("old", "new"):
        prod = torch.full((n, 5, h, w), float("nan"))
        tmp, coef, d = torch.full_like(prod, float("nan")), torch.full_like(prod, float("nan")), torch.full_like(flow, float("nan"))
        if kernels == "old":
            one(old.products, n * h * w, i0, i1, flow, prod, n * h * w, h, w, sx, sy)
            one(old.blur_x, prod.numel(), prod, g, tmp, prod.numel(), w, R=r)
            one(old.blur_y_coef, n * h * w, tmp, g, flow, coef, d, n * h * w, h, w, alpha, R=r)
        else:
            tf._launch_rows(tf._products_kernel, None, n * h, w, i0, i1, flow, prod, n * h, h, w, sx, sy)
            tf._launch_rows(tf._blur_x_kernel, None, n * 5 * h, w, prod, g, tmp, n * 5 * h, w, R=r)
            tf._launch(tf._blur_y_coef_kernel, n * h * w, tmp, g, flow, coef, d, n * h * w, h, w, alpha, R=r)
        out.append((prod, tmp, coef, d))
    return [bool(torch.equal(a, b)) for a, b in zip(*out)]


got, interior = [], 0
real = tf._row_tile
for tile in (None, (64, 16, 4)):          # the interpreter's one program; small tiles
    tf._row_tile = real if tile is None else (lambda rows, w, t, tile=tile: tile)
    for n, h, w, sigma in ((2, 33, 47, 4.0), (3, 9, 20, 4.0), (2, 33, 47, 1.0), (1, 28, 70, 4.0)):
        g = _gauss1d(sigma, "cpu")
        r = g.numel() // 2
        if tile is not None:                 # blur_x programs without clamping
            interior += sum(1 for x0 in range(0, w, tile[1]) if x0 >= r and x0 + tile[1] + r <= w)
        got.append([tile, [n, h, w, r], step(n, h, w, g, True)])
print(json.dumps({"got": got, "interior": interior}))
"""


def test_row_kernels_give_the_same_bits_as_the_per_pixel_kernels(tmp_path):
    """The 2-D grid products and blur kernels against the former per-pixel ones, under the
    interpreter: the same bits for the products, both blur passes, the coefficients and the first
    iterate, on odd sizes, a width below the window's radius, at a single program and at small
    tiles (blur_x programs on the unclamped path and at the borders, blocks of rows across
    images, rows and lanes past the end)."""
    (tmp_path / "old_flow_kernels.py").write_text(OLD_KERNELS)
    got = run_interpreted(EXACT, path=[tmp_path])
    assert got["interior"] >= 3, got
    assert len(got["got"]) == 8, got
    for tile, size, same in got["got"]:
        assert same == [True] * 4, (tile, size, same)
