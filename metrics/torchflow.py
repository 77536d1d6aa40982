"""Dense optical flow in torch: coarse-to-fine combined local-global flow (CPU or CUDA).

The ``"torch"`` flow method of :mod:`evalkit.metrics.flow` (convention name :data:`CONVENTION`). It runs
on the frames' device, batched over frame pairs, in float32 with TF32 off and deterministic
kernels only (separable convolutions, bilinear ``grid_sample`` forward, elementwise ops), so a
flow does not depend on the batch it was computed in, and never leaves the device.

Method (``v2``): the combined local-global (CLG) flow of Bruhn, Weickert, Schnoerr,
"Lucas/Kanade Meets Horn/Schunck: Combining Local and Global Optic Flow Methods", IJCV 2005
(Lucas-Kanade's windowed structure tensor as the data term, Horn-Schunck's quadratic
smoothness), linearised around the current flow and solved coarse to fine with warping
(Brox, Bruhn, Papenberg, Weickert, "High Accuracy Optical Flow Estimation Based on a Theory
for Warping", ECCV 2004):

1. Both grey frames (rounded 8-bit luma, the same input as the OpenCV methods) are scaled to
   [0, 1] and a Gaussian pyramid is built (binomial 5-tap blur, every second pixel) down to a
   coarsest side of at least :data:`MIN_SIDE` pixels, at most :data:`MAX_LEVELS` levels
   (1/32 scale: displacements of 20 px and more are found).
2. From the coarsest level to level ``finest``, the flow (upsampled from the level above,
   vectors doubled) is refined ``warps`` times: ``dst`` is warped back by the flow (bilinear),
   the spatial gradient is taken on the mean of ``src`` and the warped ``dst`` (5-tap central
   differences), the products ``Ix^2, IxIy, Iy^2, IxIt, IyIt`` are averaged with a Gaussian
   window of standard deviation ``window`` pixels (pixels whose warped position leaves
   ``dst`` do not vote), and the increment minimising ``w' J w + alpha |grad(flow + w)|^2``
   is approached with ``inner`` Jacobi iterations started at 0. ``warps`` and ``inner`` may
   differ by level (:func:`per_level`).
3. The flow of level ``finest`` is upsampled bilinearly to the frames' resolution (as OpenCV
   DIS ``fast`` stops at 1/4 scale).

``v2`` (:data:`PARAMS`) solves down to 1/2 scale with 4 warps of 15 Jacobi iterations at every
level. ``v1`` solved down to the frames' resolution with 3 warps of 10: 2.1x slower on one
H200 at 1280x720, and less accurate there (mean end-point error on the synthetic motion of
``benchmarks/bench_flow.py``, 1280x720: v1 0.402 px, v2 0.388, DIS ``fast`` 0.412; 320x180:
0.273, 0.359, 0.527). Work at the coarse levels is cheap and buys accuracy on large and
textureless motion; the frames' own level cost 3/4 of the time for little (schedules measured in
``benchmarks/README.md``).

On CUDA, when Triton imports, each warp step runs as a few fused Triton kernels
(:mod:`evalkit.metrics._triton_flow`: warp + gradient + products, the window's two passes with the Jacobi
coefficients, one kernel per Jacobi iteration) instead of ~80 torch ops, and the pyramid and the
flow's upsampling too (:mod:`evalkit.metrics._triton_pyramid`: one launch per level for both frames of
every pair, level 1 straight from the 8-bit frames, scaled in the kernel; one per upsampling, the
last one into the output): the same arithmetic, equal to the torch path up to float32 rounding,
so the convention is the same. ``fused=False`` or the
environment variable ``EVALKIT_TRITON=0`` keeps the torch path; the CPU always uses it.

Accuracy and speed against OpenCV DIS are measured in ``benchmarks/bench_flow.py`` (figures in
``docs/metrics.md``).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from ._common import TritonFallback, precise
from ._cudagraph import GraphCache

#: Convention name recorded in reports; bump it whenever a change can move the flow.
CONVENTION = "torch-clg-v2"
MAX_LEVELS = 6
MIN_SIDE = 16
#: Default parameters (part of the convention: changing one changes :data:`CONVENTION`).
PARAMS = dict(warps=4, inner=15, window=4.0, alpha=1e-4, finest=1)
#: Pixels (pairs x height x width) handled in one batch (memory bound); results do not depend on it.
BATCH_PIXELS = {"cuda": 1 << 25, "cpu": 1 << 21}

_BINOMIAL = (1.0, 4.0, 6.0, 4.0, 1.0)
_DERIV = (1.0 / 12, -8.0 / 12, 0.0, 8.0 / 12, -1.0 / 12)
_KERNELS: dict = {}


def _kernel(name: str, values, device) -> torch.Tensor:
    key = (name, str(device))
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return k


def _gauss1d(sigma: float, device) -> torch.Tensor:
    r = max(1, int(math.ceil(3 * sigma)))
    key = ("g", sigma, str(device))
    k = _KERNELS.get(key)
    if k is None:
        x = torch.arange(-r, r + 1, dtype=torch.float64)
        g = torch.exp(-0.5 * (x / sigma) ** 2)
        k = _KERNELS[key] = (g / g.sum()).float().to(device)
    return k


def _sep(x: torch.Tensor, kx: torch.Tensor, ky: torch.Tensor, stride: int = 1) -> torch.Tensor:
    """Separable correlation of every channel of ``x`` (N, C, H, W), replicate borders.

    CUDA: grouped convolutions (cuDNN); CPU: sums of shifted slices, several times faster
    there than oneDNN's depthwise convolution. Both are the same sums up to float32 rounding.
    """
    c = x.shape[1]
    rx, ry = kx.numel() // 2, ky.numel() // 2
    x = _pad(x, rx, ry)
    if x.device.type == "cuda":
        x = F.conv2d(x, kx.view(1, 1, 1, -1).expand(c, 1, 1, -1), stride=(1, stride), groups=c)
        return F.conv2d(x, ky.view(1, 1, -1, 1).expand(c, 1, -1, 1), stride=(stride, 1), groups=c)
    x = _taps(x, kx.tolist(), 3, stride)
    return _taps(x, ky.tolist(), 2, stride)


def _pad(x: torch.Tensor, rx: int, ry: int) -> torch.Tensor:
    """Replicate padding (on the CPU with concatenations: ``F.pad``'s replicate mode is slow there)."""
    if x.device.type == "cuda":
        return F.pad(x, (rx, rx, ry, ry), mode="replicate")
    n, c, h, w = x.shape
    if rx:
        x = torch.cat([x[..., :1].expand(n, c, h, rx), x, x[..., -1:].expand(n, c, h, rx)], 3)
    if ry:
        x = torch.cat(
            [x[:, :, :1].expand(n, c, ry, x.shape[3]), x, x[:, :, -1:].expand(n, c, ry, x.shape[3])], 2
        )
    return x


def _taps(x: torch.Tensor, k: list, dim: int, stride: int) -> torch.Tensor:
    n = (x.shape[dim] - len(k)) // stride + 1
    out = None
    for j, v in enumerate(k):
        if v == 0:
            continue
        sl = x.narrow(dim, j, (n - 1) * stride + 1)
        if stride > 1:
            sl = sl[..., ::stride] if dim == 3 else sl[:, :, ::stride]
        out = sl * v if out is None else out.add_(sl, alpha=v)
    return out


def _blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    g = _gauss1d(sigma, x.device)
    return _sep(x, g, g)


def _down(x: torch.Tensor) -> torch.Tensor:
    """Binomial blur and every second pixel: one pyramid level down. Sums of shifted slices
    on every device: on CUDA cuDNN's one-channel strided convolution (implicit GEMM) took a
    tenth of the fused flow's time; the same sums up to float32 rounding."""
    b = [v / 16 for v in _BINOMIAL]
    x = _pad(x, 2, 2)
    return _taps(_taps(x, b, 3, 2), b, 2, 2)


def _grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """5-tap central differences along x and y (replicate borders), x: (N, 1, H, W)."""
    d = _kernel("deriv", _DERIV, x.device)
    px, py = _pad(x, 2, 0), _pad(x, 0, 2)
    if x.device.type == "cuda":
        return F.conv2d(px, d.view(1, 1, 1, 5)), F.conv2d(py, d.view(1, 1, 5, 1))
    return _taps(px, d.tolist(), 3, 1), _taps(py, d.tolist(), 2, 1)


def _base_grid(h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ys = torch.arange(h, device=device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=device, dtype=torch.float32).view(1, 1, w)
    return xs, ys


def _warp(img: torch.Tensor, flow: torch.Tensor, xs, ys) -> tuple[torch.Tensor, torch.Tensor]:
    h, w = img.shape[2:]
    px = xs + flow[:, 0]
    py = ys + flow[:, 1]
    inside = ((px >= 0) & (px <= w - 1) & (py >= 0) & (py <= h - 1)).unsqueeze(1)
    grid = torch.stack([px * (2.0 / max(w - 1, 1)) - 1.0, py * (2.0 / max(h - 1, 1)) - 1.0], -1)
    out = F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=True)
    return out, inside


def _levels(h: int, w: int) -> int:
    n = 1
    while n < MAX_LEVELS and min(h, w) >> n >= MIN_SIDE:
        n += 1
    return n


def _upsample(flow: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Flow of the level above (pixel j there is pixel 2j here) -> this level, vectors x2."""
    ph, pw = flow.shape[2:]
    xs = torch.arange(w, device=flow.device, dtype=torch.float32) * (0.5 * 2.0 / max(pw - 1, 1)) - 1.0
    ys = torch.arange(h, device=flow.device, dtype=torch.float32) * (0.5 * 2.0 / max(ph - 1, 1)) - 1.0
    grid = torch.stack([xs.view(1, w).expand(h, w), ys.view(h, 1).expand(h, w)], -1)
    grid = grid.unsqueeze(0).expand(flow.shape[0], h, w, 2)
    return F.grid_sample(flow, grid, mode="bilinear", padding_mode="border", align_corners=True) * 2.0


_CROSS = ((0.0, 0.25, 0.0), (0.25, 0.0, 0.25), (0.0, 0.25, 0.0))


def _neigh(x: torch.Tensor) -> torch.Tensor:
    """Mean of the four neighbours (replicate borders)."""
    p = _pad(x, 1, 1)
    if x.device.type == "cuda":
        k = _kernel("cross", _CROSS, x.device)
        return F.conv2d(p, k.view(1, 1, 3, 3).expand(x.shape[1], 1, 3, 3), groups=x.shape[1])
    return (p[:, :, :-2, 1:-1] + p[:, :, 2:, 1:-1] + p[:, :, 1:-1, :-2] + p[:, :, 1:-1, 2:]) * 0.25


def _load_fused():
    from ._triton_flow import warp_step
    from ._triton_pyramid import down  # noqa: F401  (the pyramid's kernels: the same family)

    return warp_step


#: The fused kernels as a family with a torch fallback: if the default fused path fails in this
#: process (a Triton that cannot compile here), :func:`torch_flow` warns once and the default is
#: the torch path from then on. Not strict: a failure after a success falls back too (a new
#: frame size compiles new kernels).
TRITON_FUSED = TritonFallback("fused flow kernels (warp_step)", _load_fused, strict=False)


#: CUDA graphs of the fused path's batches (one per batch shape and parameters): the ~350
#: kernels of a batch in one launch, the same numbers (``EVALKIT_CUDA_GRAPHS=0``: launched one by one).
FLOW_GRAPHS = GraphCache("fused flow")


def use_fused(device, fused: bool | None = None) -> bool:
    """Whether :func:`torch_flow` takes the fused Triton path on ``device``.

    ``fused=None`` (default): on CUDA when Triton imports and ``EVALKIT_TRITON`` is not ``0``.
    ``True`` forces it (CUDA, or CPU tensors under ``TRITON_INTERPRET=1`` for tests), ``False``
    keeps the torch path. If the default fused path fails to run (a Triton that cannot compile
    on this machine), :func:`torch_flow` warns once and uses the torch path from then on.
    """
    if fused is not None:
        return bool(fused)
    if torch.device(device).type != "cuda" or os.environ.get("EVALKIT_TRITON", "1") == "0":
        return False
    return TRITON_FUSED.kernel() is not None


def per_level(value, level: int) -> int:
    """``warps``/``inner`` at pyramid ``level`` (0: the frames' resolution): an int applies to
    every level; a sequence gives the finest levels first, its last value repeating above."""
    if isinstance(value, int):
        return value
    return int(value[min(level, len(value) - 1)])


def _pyramids(src: torch.Tensor, dst: torch.Tensor, levels: int, finest: int, fused: bool):
    """Both frames' Gaussian pyramids (8-bit frames in, [0, 1] levels out) and every level's
    size. Fused: Triton kernels, level 1 straight from the frames unless level 0 is solved
    (level 0 is then None: only its size is needed)."""
    if fused:
        from ._triton_pyramid import down, down_size

        sizes = [tuple(src.shape[2:])]
        for _ in range(levels - 1):
            sizes.append(down_size(*sizes[-1]))
        if finest == 0:  # the frames' own level is solved: scaled here
            p0, p1 = [src.float() * (1.0 / 255)], [dst.float() * (1.0 / 255)]
        else:  # level 1 straight from the frames, scaled in the kernel
            a, b = down(src, dst, scale=True)
            p0, p1 = [None, a], [None, b]
        while len(p0) < levels:
            a, b = down(p0[-1], p1[-1])
            p0.append(a)
            p1.append(b)
        return p0, p1, sizes
    p0, p1 = [src.float() * (1.0 / 255)], [dst.float() * (1.0 / 255)]
    for _ in range(levels - 1):
        p0.append(_down(p0[-1]))
        p1.append(_down(p1[-1]))
    return p0, p1, [tuple(p.shape[2:]) for p in p0]


def _warp_step(
    i0: torch.Tensor, i1: torch.Tensor, flow: torch.Tensor, inner: int, window: float, alpha: float
) -> torch.Tensor:
    """One warp step in torch ops: warp, structure tensor, ``inner`` Jacobi iterations."""
    xs, ys = _base_grid(*i0.shape[2:], i0.device)
    i1w, inside = _warp(i1, flow, xs, ys)
    ix, iy = _grad((i0 + i1w) * 0.5)
    it = (i1w - i0) * inside
    ix = ix * inside
    iy = iy * inside
    s = _blur(torch.cat([ix * ix, ix * iy, iy * iy, ix * it, iy * it], 1), window)
    j11, j12, j22, j13, j23 = s[:, 0:1], s[:, 1:2], s[:, 2:3], s[:, 3:4], s[:, 4:5]
    # combined local-global (Bruhn et al. 2005): Jacobi iterations on the increment d
    # of  sum w' J w + alpha |grad(flow + d)|^2, both components at once:
    #   d_u = (alpha (avg(u + d_u) - u) - J12 d_v - J13) / (J11 + alpha)   (avg: 4 neighbours)
    inv = 1.0 / (torch.cat([j11, j22], 1) + alpha)
    cst = (alpha * (_neigh(flow) - flow) - torch.cat([j13, j23], 1)) * inv
    gain = alpha * inv
    cross = torch.cat([j12, j12], 1) * inv
    d = cst
    for _ in range(inner - 1):
        d = torch.addcmul(cst, gain, _neigh(d)).addcmul_(cross, d.flip(1), value=-1.0)
    return flow + d


def _flow_batch(
    src: torch.Tensor,
    dst: torch.Tensor,
    warps,
    inner,
    window: float,
    alpha: float,
    finest: int,
    fused: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The flow of a batch of pairs of grey frames in 8-bit units, (N, 1, H, W) each. ``fused``:
    the Triton path; the final upsampling then writes into ``out`` when given."""
    n = src.shape[0]
    levels = _levels(*src.shape[2:])
    finest = min(finest, levels - 1)
    p0, p1, sizes = _pyramids(src, dst, levels, finest, fused)
    if fused:
        from ._triton_flow import warp_step
        from ._triton_pyramid import upsample

        g = _gauss1d(window, src.device)

        def step(i0, i1, flow, ni):
            return warp_step(i0, i1, flow, g, ni, alpha)
    else:

        def step(i0, i1, flow, ni):
            return _warp_step(i0, i1, flow, ni, window, alpha)

        def upsample(flow, h, w, out=None):
            return _upsample(flow, h, w)

    flow = None
    for k in range(levels - 1, finest - 1, -1):
        hk, wk = sizes[k]
        if flow is None:
            flow = torch.zeros((n, 2, hk, wk), dtype=torch.float32, device=src.device)
        else:
            flow = upsample(flow, hk, wk)
        for _ in range(per_level(warps, k)):
            flow = step(p0[k], p1[k], flow, per_level(inner, k))
    for k in range(finest - 1, -1, -1):  # up to the frames' resolution
        flow = upsample(flow, *sizes[k], out=out if k == 0 else None)
    return flow


def torch_flow(
    src: torch.Tensor,
    dst: torch.Tensor,
    *,
    warps=PARAMS["warps"],
    inner=PARAMS["inner"],
    window: float = PARAMS["window"],
    alpha: float = PARAMS["alpha"],
    finest: int = PARAMS["finest"],
    batch_pixels: int | None = None,
    fused: bool | None = None,
) -> torch.Tensor:
    """Flow from each grey frame of ``src`` to the same frame of ``dst`` -> ``(N, 2, H, W)``.

    ``src``, ``dst``: ``(N, 1, H, W)`` or ``(N, H, W)`` grey frames in 8-bit units (uint8 or
    float), on any device; the flow is computed there in float32 (OpenCV's convention, see
    :mod:`evalkit.metrics.flow`). ``warps``, ``inner``: an int for every pyramid level or a sequence,
    finest level first (:func:`per_level`); the defaults are the convention's (:data:`PARAMS`).
    Pairs are processed ``batch_pixels`` pixels at a time (default by device,
    :data:`BATCH_PIXELS`); the result does not depend on it. ``fused``: the Triton
    path (:func:`use_fused`; default: on CUDA when available), equal up to float32 rounding.
    """
    if src.ndim == 3:
        src, dst = src.unsqueeze(1), dst.unsqueeze(1)
    n, _, h, w = src.shape
    if batch_pixels is None:
        batch_pixels = BATCH_PIXELS["cuda" if src.device.type == "cuda" else "cpu"]
    auto = fused is None
    fused = use_fused(src.device, fused)
    step = max(1, batch_pixels // (h * w))
    if fused:  # int32 indexing of (pairs, 5, H, W) in the kernels
        step = max(1, min(step, ((1 << 31) - 1) // (5 * h * w)))
    out = torch.empty((n, 2, h, w), dtype=torch.float32, device=src.device)

    def batch(s: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return _flow_batch(s, d, warps, inner, window, alpha, finest, fused)

    key = (repr(warps), repr(inner), window, alpha, finest)

    def compute() -> torch.Tensor:
        with precise():
            for i in range(0, n, step):
                s, d, o = src[i : i + step], dst[i : i + step], out[i : i + step]
                if fused and FLOW_GRAPHS.usable(s, d):  # a CUDA graph per batch shape
                    FLOW_GRAPHS.run(batch, (s, d), key, o.copy_)
                    continue
                f = _flow_batch(s, d, warps, inner, window, alpha, finest, fused, out=o)
                if f is not o:
                    o.copy_(f)
        return out

    if auto and fused:  # the default fused path: torch if it cannot run here
        return TRITON_FUSED.run(
            compute,
            lambda: torch_flow(
                src,
                dst,
                warps=warps,
                inner=inner,
                window=window,
                alpha=alpha,
                finest=finest,
                batch_pixels=batch_pixels,
                fused=False,
            ),
        )
    return compute()
