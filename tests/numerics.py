"""Rounding bounds for the numeric tests: every tolerance is derived from float32's unit
roundoff, the operations a result went through and the magnitudes involved, never from one
CPU's result (another x86 CPU sums in another order: other SIMD widths, other BLAS and oneDNN
kernels, other thread splits).

The model is Higham's (N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
SIAM 2002): each float32 operation returns ``op(x, y) (1 + d)`` with ``|d| <= u = 2**-24``;
``gamma(n) = n u / (1 - n u)`` bounds ``n`` such factors (Lemma 3.1); a sum of ``n`` terms
evaluated in ANY order (any tree, any split over threads or SIMD lanes) is within
``gamma(n - 1) * sum(|x_i|)`` of the exact sum (section 4.2, eq. 4.4), and a dot product of
``n`` terms within ``gamma(n) * sum(|x_i y_i|)`` (eq. 3.5). Two implementations that each stay
within ``E`` of the exact value differ by at most ``2 E``: that is the tolerance of an A/B
assertion. These are worst-case bounds, so they hold on any CPU or GPU that rounds to nearest;
they are loose by about the square root of the number of terms, which still leaves a real bug
(a wrong constant, a lost term, a wrong layout) orders of magnitude outside them.

:func:`lpips_bound` applies the model to LPIPS (a conv trunk, then the per-pixel normalisation,
the squared differences, the channel weights and the spatial means), computing the bound from
the actual frames in float64.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

U32 = 2.0**-24  # unit roundoff of float32 (round to nearest)
EPS32 = float(np.finfo(np.float32).eps)  # 2**-23, the spacing of float32 numbers at 1
# Standard deviations of a probabilistic error estimate taken as its bound: a normal variable
# passes 8 of them with probability 1e-15 (per element, for a test's few thousand elements).
SIGMAS = 8.0


def gamma(n: int, u: float = 2.0**-24) -> float:
    """Higham's gamma_n: the bound on n rounding factors, ``|prod(1 + d_i)^(+-1) - 1|``."""
    if n <= 0:
        return 0.0
    if n * u >= 1:
        return float("inf")
    return n * u / (1 - n * u)


def sum_bound(n: int, abs_sum) -> float:
    """Error of a float32 sum of ``n`` terms in any order whose absolute values sum to ``abs_sum``."""
    return gamma(n - 1) * abs_sum


def mean_bound(n: int, abs_mean) -> float:
    """Error of a float32 mean of ``n`` terms (a sum in any order, one division), given the mean
    of their absolute values."""
    return gamma(n) * abs_mean


def ab_tolerance(bound) -> float:
    """The tolerance between two implementations that each stay within ``bound`` of the exact value."""
    return 2 * bound


# -- LPIPS ------------------------------------------------------------------------------------


def _conv(m: torch.nn.Conv2d, x: torch.Tensor, weight=None) -> torch.Tensor:
    w = m.weight.double() if weight is None else weight
    return F.conv2d(x, w, None, m.stride, m.padding)


def lpips_trunk_bound(model, frames: torch.Tensor, *, input_ops: int = 4, sigmas: float = SIGMAS):
    """The exact trunk features of ``frames`` (``(N, 3, H, W)`` in [0, 1], float64) and a bound
    on each float32 feature's error, ``sigmas`` standard deviations of a running error estimate.

    A worst-case bound carried through five convolutions multiplies by ``|W|`` at each layer and
    ends far above the features themselves (no use). Rounding errors instead are modelled as
    independent, zero-mean, ``|d| <= u`` uniform (variance ``u^2 / 3`` of the rounded value),
    the model of Higham and Mary (*A new approach to probabilistic rounding error analysis*, SIAM
    J. Sci. Comput. 41(5), 2019), and their variance is carried through the layers:

    - input scaling ``((2 x - 1) - shift) / scale``: ``input_ops`` roundings of the magnitudes
      involved (4 for ``x / 255``, ``- 1``, ``- shift``, ``/ scale``; the lpips package's
      ``x / 127.5 - 1`` then its scaling layer is 4 too);
    - a convolution of ``K = C k k`` products plus the bias: ``(K + 1) u^2 / 3 (|W| * |h| + |b|)^2``
      (every partial sum, in any order, is at most ``|W| * |h| + |b|``), plus ``W^2 * var`` carried;
    - ReLU passes the error (1-Lipschitz), and is exactly 0 where its input is below minus the
      error bound; max pooling passes the window's largest.
    """
    shift, scale = model.shift.double().cpu(), model.scale.double().cpu()
    x = frames.double().cpu()
    h = ((x * 2 - 1) - shift) / scale
    var = input_ops * U32**2 / 3 * ((2 * x.abs() + 1 + shift.abs()) / scale) ** 2
    feats, errs = [], []
    for sl in model.slices:
        for layer in sl:
            if isinstance(layer, torch.nn.Conv2d):
                k = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
                w = layer.weight.double().cpu()
                b = layer.bias.double().cpu().view(1, -1, 1, 1)
                mag = F.conv2d(h.abs(), w.abs(), None, layer.stride, layer.padding) + b.abs()
                var = F.conv2d(var, w * w, None, layer.stride, layer.padding) + (k + 1) * U32**2 / 3 * mag**2
                h = F.conv2d(h, w, None, layer.stride, layer.padding) + b
            elif isinstance(layer, torch.nn.ReLU):
                var = torch.where(h < -sigmas * var.sqrt(), torch.zeros_like(var), var)
                h = torch.relu(h)
            elif isinstance(layer, torch.nn.MaxPool2d):
                h = F.max_pool2d(h, layer.kernel_size, layer.stride)
                var = F.max_pool2d(var, layer.kernel_size, layer.stride)
            else:  # pragma: no cover - the trunks hold only these
                raise TypeError(f"no bound for {layer!r}")
        feats.append(h)
        errs.append(sigmas * var.sqrt())
    return feats, errs


def lpips_head_bound(fa, fb, weights, eps: float, ea=None, eb=None) -> torch.Tensor:
    """A bound on the float32 LPIPS distance's error, per frame, given the features ``fa``,
    ``fb`` (lists of ``(N, C, h, w)``, float64) and bounds ``ea``, ``eb`` on their errors (None:
    the float32 features themselves are the input, exact).

    Per pixel: the normalisation ``f / (||f|| + eps)`` (C squares summed, a square root, an
    addition, a division: ``gamma(C + 3)`` relative, plus the input error through the norm:
    ``(e_c + |n_c| ||e||) / (||f|| + eps - ||e||)``); the difference ``n_a - n_b`` (one rounding);
    its square (one rounding); the channel weights and their sum (``gamma(C)``); the spatial mean
    (``gamma(P)``); the sum over the layers (``gamma(L - 1)``). First-order terms and their
    squares both kept.
    """
    total, layer_vals = None, []
    for i, (a, b, w) in enumerate(zip(fa, fb, weights)):
        a, b = a.double().cpu(), b.double().cpu()
        c = a.shape[1]
        p = a.shape[2] * a.shape[3]
        w = w.double().cpu().abs().view(1, -1, 1, 1)

        def normalised(f, e):
            norm = f.pow(2).sum(1, keepdim=True).sqrt()
            n = f / (norm + eps)
            rnd = gamma(c + 3) * n.abs()
            if e is None:
                return n, rnd
            enorm = e.pow(2).sum(1, keepdim=True).sqrt()
            room = norm + eps - enorm
            carried = torch.where(
                room > 0, (e + n.abs() * enorm) / room.clamp_min(1e-300), torch.full_like(e, 2.0)
            )
            return n, (carried + rnd).clamp_max(1 + n.abs())

        na, ba = normalised(a, None if ea is None else ea[i].double().cpu())
        nb, bb = normalised(b, None if eb is None else eb[i].double().cpu())
        diff = na - nb
        e_diff = ba + bb + U32 * (diff.abs() + ba + bb)
        sq = diff * diff
        e_sq = 2 * diff.abs() * e_diff + e_diff**2 + U32 * (diff.abs() + e_diff) ** 2
        chan = (w * sq).sum(1)
        e_chan = (w * e_sq).sum(1) + gamma(c) * (w * (sq + e_sq)).sum(1)
        mean = chan.mean((1, 2))
        e_mean = e_chan.mean((1, 2)) + gamma(p) * (chan + e_chan).mean((1, 2))
        layer_vals.append((mean, e_mean))
        total = e_mean if total is None else total + e_mean
    n_layers = len(layer_vals)
    return total + gamma(n_layers - 1) * sum(m + e for m, e in layer_vals)


def lpips_bound(model, a: torch.Tensor, b: torch.Tensor, *, input_ops: int = 4) -> torch.Tensor:
    """Per-frame bound on a float32 LPIPS of frames ``a``, ``b`` (``(N, 3, H, W)`` in [0, 1]) from
    its exact value: the trunk's running bound carried through the head (:func:`lpips_head_bound`)."""
    fa, ea = lpips_trunk_bound(model, a, input_ops=input_ops)
    fb, eb = lpips_trunk_bound(model, b, input_ops=input_ops)
    weights = [lin.weight.reshape(-1) for lin in model.lins]
    return lpips_head_bound(fa, fb, weights, 1e-10, ea, eb)


# -- SSIM -------------------------------------------------------------------------------------

U64 = 2.0**-53  # unit roundoff of float64 (scikit-image's arithmetic)


def ssim_bound(
    x,
    y,
    *,
    win: int = 11,
    sigma: float = 1.5,
    c1: float = (0.01 * 255) ** 2,
    c2: float = (0.03 * 255) ** 2,
    e_in=None,
    u: float = U32,
) -> torch.Tensor:
    """A bound on the error of a mean SSIM of plane pairs ``x``, ``y`` (``(M, 1, H, W)``, the
    exact planes in 8-bit units) evaluated with unit roundoff ``u``, per plane pair ``(M,)``.

    ``e_in``: a bound on each input value's own error (float frames scaled to 8-bit units), or
    None for exact inputs (rounded luma, uint8 values). Each filtered statistic (the means, the
    second moments) is a Gaussian-weighted sum of ``win^2`` terms with weights rounded to the
    arithmetic's precision: ``gamma(win^2 + 2)`` of the filtered magnitudes (a separable filter
    does fewer operations; any order). The variances ``E[x^2] - E[x]^2`` are computed on values
    centred on the pair's rounded mean (fidelity._ssim_planes), so their magnitudes are those of
    the centred values (one unit wider, for a mean rounded the other way). Then the SSIM
    formula's roundings (3 units for each product or sum), carried first order with the
    squares of the errors kept, and the mean over ``P`` window positions, ``gamma(P)``.
    """
    x, y = x.double().cpu(), y.double().cpu()
    m = x.shape[0]
    r = torch.arange(win, dtype=torch.float64) - (win - 1) / 2
    g1 = torch.exp(-0.5 * (r / sigma) ** 2)
    g1 = g1 / g1.sum()
    k2 = torch.outer(g1, g1).view(1, 1, win, win).expand(m, 1, win, win).contiguous()

    def filt(v):
        return F.conv2d(v.reshape(1, m, *v.shape[2:]), k2, groups=m).reshape(
            m, 1, v.shape[2] - win + 1, v.shape[3] - win + 1
        )

    gk = gamma(win * win + 2, u)
    shift = ((x.mean((1, 2, 3), keepdim=True) + y.mean((1, 2, 3), keepdim=True)) / 2).round()
    xs, ys = x - shift, y - shift
    ex = torch.zeros_like(x) if e_in is None else e_in[0].double().cpu()
    ey = torch.zeros_like(y) if e_in is None else e_in[1].double().cpu()
    ax, ay = xs.abs() + 1, ys.abs() + 1  # either rounding of the mean

    def stat(v, mag, e):
        return filt(v), gk * filt(mag) + filt(e)

    mx, e_mx = stat(xs, ax, ex)
    my, e_my = stat(ys, ay, ey)
    exx, e_exx = stat(xs * xs, ax * ax, 2 * ax * ex + ex * ex + u * ax * ax)
    eyy, e_eyy = stat(ys * ys, ay * ay, 2 * ay * ey + ey * ey + u * ay * ay)
    exy, e_exy = stat(xs * ys, ax * ay, ax * ey + ay * ex + ex * ey + u * ax * ay)
    vx, vy, cxy = exx - mx * mx, eyy - my * my, exy - mx * my
    e_vx = e_exx + (2 * mx.abs() + e_mx) * e_mx + 2 * u * (exx.abs() + mx * mx)
    e_vy = e_eyy + (2 * my.abs() + e_my) * e_my + 2 * u * (eyy.abs() + my * my)
    e_cxy = e_exy + my.abs() * e_mx + mx.abs() * e_my + e_mx * e_my + 2 * u * (exy.abs() + (mx * my).abs())
    mx, my = mx + shift, my + shift
    e_mx, e_my = e_mx + u * mx.abs(), e_my + u * my.abs()
    a1, a2 = 2 * mx * my + c1, 2 * cxy + c2
    b1, b2 = mx * mx + my * my + c1, vx + vy + c2
    e_a1 = 2 * (my.abs() * e_mx + mx.abs() * e_my + e_mx * e_my) + 3 * u * (2 * (mx * my).abs() + c1)
    e_a2 = 2 * e_cxy + 3 * u * (2 * cxy.abs() + c2)
    e_b1 = (2 * mx.abs() + e_mx) * e_mx + (2 * my.abs() + e_my) * e_my + 3 * u * b1
    e_b2 = e_vx + e_vy + 3 * u * (vx.abs() + vy.abs() + c2)
    low = ((b1 - e_b1) * (b2 - e_b2)).clamp_min(1e-300)
    s = a1 * a2 / (b1 * b2)
    e_s = (
        (a2.abs() * e_a1 + a1.abs() * e_a2 + e_a1 * e_a2) / low
        + s.abs() * (b1 * b2 / low - 1)
        + 3 * u * s.abs()
    )
    p = s.shape[2] * s.shape[3]
    return e_s.mean((1, 2, 3)) + gamma(p, u) * (s.abs() + e_s).mean((1, 2, 3))


# -- means, PSNR ------------------------------------------------------------------------------


def mean_tolerance(values, n: int, ops: int = 0):
    """A/B tolerance of means of ``n`` non-negative per-pixel terms (each from ``ops`` float32
    roundings of the same inputs, identical element-wise in both) summed in any order:
    ``2 gamma(n + ops) |value|``."""
    return ab_tolerance(gamma(n + ops) * np.abs(np.asarray(values, dtype=np.float64)))


def psnr_bound(psnr_db, n: int, *, mse_rel: float = 0.0, u: float = U64):
    """A bound on a PSNR's error, dB: its MSE summed over ``n`` squares in the arithmetic of unit
    roundoff ``u`` (``gamma(n)`` relative, the terms are non-negative) plus ``mse_rel`` of error
    carried into the MSE, then ``10 log10(peak^2 / mse)``: one division, a logarithm within 2 ulps
    (libm, SLEEF's u10 functions: 1 ulp) and a product, ``4 u`` of the value, and
    ``10 / ln 10`` dB per unit of relative MSE error."""
    rel = gamma(n, u) + mse_rel + 4 * u
    return 10 / np.log(10) * rel + 4 * u * np.abs(np.asarray(psnr_db, dtype=np.float64))


# -- the iterative flow -----------------------------------------------------------------------

#: Float32 roundings per pixel in one inner Jacobi iteration of evalkit.metrics.torchflow's solver (the
#: four-neighbour mean: 4; the data term's products and sums: 12; the update's division and the
#: clamp: 4), and per warp (the warp's coordinates and bilinear sample: 10; the gradients' five
#: taps: 10; the structure tensor's blur: 22).
FLOW_OPS_PER_ITERATION = 20
FLOW_OPS_PER_WARP = 42


def flow_tolerance(max_flow: float, *, levels: int, warps: int = 4, inner: int = 15) -> float:
    """A/B tolerance, pixels, of two float32 evaluations of the iterative flow that sum in other
    orders: every rounding of every iteration at every level, on values of the flow's magnitude,
    carried undamped to the end (the model assumes the solver does not amplify an earlier error:
    each Jacobi sweep of the linearised problem is a contraction, and the upsampling between
    levels doubles vectors that the next level re-solves), twice."""
    ops = levels * warps * (inner * FLOW_OPS_PER_ITERATION + FLOW_OPS_PER_WARP)
    return ab_tolerance(gamma(ops) * max_flow)
