"""LPIPS's head as Triton kernels (CUDA; CPU tensors only under ``TRITON_INTERPRET=1``, for tests):
``perceptual.LPIPS.distance`` computed from the raw trunk features of both sides in one pass
per layer.

For each layer l (C channels, H x W pixels) and each pixel, the torch path computes, over
five separate memory passes for the normalisation (``features``) and four for the head:

* ``n = sqrt(sum_c h_c^2)`` and ``f_c = h_c / (n + eps)`` on each side (``normalize_tensor``);
* ``sum_c w_c (fa_c - fb_c)^2`` (the 1x1 convolution ``lin``), then the mean over the pixels.

``_layer`` does all of it per tile of pixels of one frame: it loads the tile's channel
vectors of both sides once (every channel of a pixel in one program), forms the two norms,
divides (IEEE division and square root, as torch), and stores the tile's sum of
``sum_c w_c (fa_c - fb_c)^2``. ``_reduce`` then adds, per frame, each layer's tile sums in a
fixed order, divides by the layer's pixel count and adds the layers in order (as the torch
path's ``total + v``). No atomics: every number depends on its own frame only, in an order
fixed by the frame size and the layout of the features (NCHW or channels-last), so results
are deterministic and the same whatever else is in the batch. Against the torch path: the
same float32 operations per element, summed in another order (float32 rounding).

Memory traffic per layer and frame pair: one read of both sides' raw features (and the
partial sums), where the torch path reads and writes the features and the normalised
features several times.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

#: Under TRITON_INTERPRET=1 (tests on CPU tensors) one program per frame and layer where the
#: layer fits: the interpreter's cost is per operation, not per element.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: Elements of one side's tile (channels x pixels) per program on a GPU, and its warps: every
#: channel of 8192 / C pixels (128 pixels of layer 1, 16 of AlexNet's 384-channel layer 3).
_TILE, _WARPS = 8192, 8
_REDUCE_BLOCK = 256
LAYERS = 5


@triton.jit
def _layer(
    x_ptr,
    y_ptr,
    w_ptr,
    part_ptr,
    C,
    HW,
    part_row,
    part_off,
    eps,
    xn,
    xc,
    xp,
    yn,
    yc,
    yp,
    CP: tl.constexpr,
    BP: tl.constexpr,
):
    t = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    c = tl.arange(0, CP)[:, None]
    p = t * BP + tl.arange(0, BP)[None, :]
    cm = c < C
    m = cm & (p < HW)
    # raw features of both sides (masked lanes are 0: their norm is eps, their difference 0)
    x = tl.load(x_ptr + n * xn + c * xc + p * xp, mask=m, other=0.0)
    y = tl.load(y_ptr + n * yn + c * yc + p * yp, mask=m, other=0.0)
    nx = tl.sqrt_rn(tl.sum(x * x, axis=0)) + eps
    ny = tl.sqrt_rn(tl.sum(y * y, axis=0)) + eps
    d = tl.math.div_rn(x, nx[None, :]) - tl.math.div_rn(y, ny[None, :])
    w = tl.load(w_ptr + c, mask=cm, other=0.0)
    s = tl.sum(w * (d * d), axis=0)
    tl.store(part_ptr + n * part_row + part_off + t, tl.sum(s, axis=0))


@triton.jit
def _layer_mean(part_ptr, start, count, hw, BLOCK: tl.constexpr):
    """Mean over a layer's pixels of one frame: its tile sums, in a fixed order, over hw."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, count, BLOCK):
        idx = s + tl.arange(0, BLOCK)
        acc += tl.load(part_ptr + start + idx, mask=idx < count, other=0.0)
    return tl.math.div_rn(tl.sum(acc, axis=0), hw)


@triton.jit
def _reduce(
    part_ptr,
    out_ptr,
    part_row,
    s0,
    s1,
    s2,
    s3,
    s4,
    c0,
    c1,
    c2,
    c3,
    c4,
    hw0,
    hw1,
    hw2,
    hw3,
    hw4,
    BLOCK: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    row = part_ptr + n * part_row
    total = _layer_mean(row, s0, c0, hw0, BLOCK)
    total += _layer_mean(row, s1, c1, hw1, BLOCK)
    total += _layer_mean(row, s2, c2, hw2, BLOCK)
    total += _layer_mean(row, s3, c3, hw3, BLOCK)
    total += _layer_mean(row, s4, c4, hw4, BLOCK)
    tl.store(out_ptr + n, total)


def _pixel_strides(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """``t`` (contiguous if need be) and its (frame, channel, pixel) strides: pixel p of a frame
    is at ``p * stride`` (NCHW and channels-last alike; other layouts are copied)."""
    _, _, h, w = t.shape
    sn, sc, sh, sw = t.stride()
    if w == 1:
        return t, sn, sc, sh
    if h == 1 or sh == w * sw:
        return t, sn, sc, sw
    t = t.contiguous()
    sn, sc, _, sw = t.stride()
    return t, sn, sc, sw


def _tile(c: int, hw: int) -> tuple[int, int]:
    cp = triton.next_power_of_2(c)
    if INTERPRET:
        return cp, max(1, min(triton.next_power_of_2(hw), (1 << 16) // cp))
    return cp, max(16, _TILE // cp)


def lpips_distance(
    fa: list[torch.Tensor], fb: list[torch.Tensor], weights: list[torch.Tensor], eps: float
) -> torch.Tensor:
    """LPIPS v0.1 from the raw trunk features of both sides: five (N, C_l, H_l, W_l) float32
    tensors each (any strides), ``weights`` the five heads' (C_l,) float32 weights (contiguous,
    on the features' device) -> (N,) float32."""
    if not (len(fa) == len(fb) == len(weights) == LAYERS):
        raise ValueError(
            f"lpips_distance: expected {LAYERS} layers, found {len(fa)}, {len(fb)}, {len(weights)}"
        )
    n = fa[0].shape[0]
    dev = fa[0].device
    tiles, plan = 0, []
    for x, y, w in zip(fa, fb, weights):
        if x.shape != y.shape or x.shape[0] != n:
            raise ValueError(f"lpips_distance: feature shapes differ: {tuple(x.shape)} and {tuple(y.shape)}")
        _, c, h, wd = x.shape
        cp, bp = _tile(c, h * wd)
        k = triton.cdiv(h * wd, bp)
        plan.append((x, y, w, c, h * wd, cp, bp, tiles, k))
        tiles += k
    parts = torch.empty((n, tiles), dtype=torch.float32, device=dev)
    for x, y, w, c, hw, cp, bp, start, k in plan:
        x, *xs = _pixel_strides(x)
        y, *ys = _pixel_strides(y)
        _layer[(k, n)](
            x,
            y,
            w,
            parts,
            c,
            hw,
            tiles,
            start,
            eps,
            *xs,
            *ys,
            CP=cp,
            BP=bp,
            num_warps=4 if INTERPRET else _WARPS,
        )
    out = torch.empty(n, dtype=torch.float32, device=dev)
    starts = [p[7] for p in plan]
    counts = [p[8] for p in plan]
    hws = [float(p[4]) for p in plan]
    _reduce[(n,)](parts, out, tiles, *starts, *counts, *hws, BLOCK=_REDUCE_BLOCK)
    return out
