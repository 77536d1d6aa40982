"""LPIPS, the learned perceptual image patch similarity, with features computed once per frame.

Zhang, Isola, Efros, Shechtman, Wang, "The Unreasonable Effectiveness of Deep Features as a
Perceptual Metric", CVPR 2018 (https://github.com/richzhang/PerceptualSimilarity, PyPI
``lpips``), version v0.1 linear layers, AlexNet trunk by default, VGG16 as an option.

Matches ``lpips.LPIPS(net=net, version="0.1")(2*a - 1, 2*b - 1)`` (inputs scaled from [0, 1]
to [-1, 1], i.e. ``normalize=True``) to float32 rounding. The network is rebuilt here so that
the trunk features of a frame can be computed once and reused: LPIPS(a_t, b_t) and the tLP
terms LPIPS(a_t, a_t-1), LPIPS(b_t, b_t-1) need only one trunk pass per frame.

Weights come from the evalkit cache (:mod:`evalkit.metrics.weights`); nothing is ever downloaded.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from ._common import TritonFallback, check_pair, fast_path, fast_path_forced, precise, to_unit
from ._errors import MetricInputError
from .weights import NETS, load_state_dict

# ScalingLayer of lpips v0.1 (lpips/lpips.py): ImageNet mean/std expressed for [-1, 1] inputs.
_SHIFT = (-0.030, -0.088, -0.188)
_SCALE = (0.458, 0.448, 0.450)
# normalize_tensor's epsilon in lpips/__init__.py.
_EPS = 1e-10

# Trunks as torchvision builds them, cut into lpips' five slices (pretrained_networks.py).
_ALEX = [
    ("conv", 3, 64, 11, 4, 2),
    ("relu",),
    ("pool",),
    ("conv", 64, 192, 5, 1, 2),
    ("relu",),
    ("pool",),
    ("conv", 192, 384, 3, 1, 1),
    ("relu",),
    ("conv", 384, 256, 3, 1, 1),
    ("relu",),
    ("conv", 256, 256, 3, 1, 1),
    ("relu",),
]
_ALEX_CUTS = (2, 5, 8, 10, 12)
_ALEX_CHANNELS = (64, 192, 384, 256, 256)
# Smallest frame side the trunks accept (every slice keeps at least one feature pixel).
MIN_SIDE = {"alex": 31, "vgg": 16}


def _vgg16_layers():
    layers, c_in = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512):
        if v == "M":
            layers.append(("maxpool2",))
        else:
            layers += [("conv", c_in, v, 3, 1, 1), ("relu",)]
            c_in = v
    return layers


_VGG_CUTS = (4, 9, 16, 23, 30)
_VGG_CHANNELS = (64, 128, 256, 512, 512)


def _load_head():
    from ._triton_lpips import lpips_distance

    return lpips_distance


#: The Triton head (:func:`evalkit.metrics._triton_lpips.lpips_distance`) as a family with a torch
#: fallback (one warning, then the torch path for the process). Not strict: a new frame size
#: compiles new kernels, which may fail where others ran.
TRITON_LPIPS = TritonFallback("LPIPS head kernels (lpips_distance)", _load_head, strict=False)


def _normalise(h: torch.Tensor) -> torch.Tensor:
    """lpips' ``normalize_tensor``: each pixel's channel vector over its norm (+ eps)."""
    return h / (torch.sqrt(torch.sum(h * h, dim=1, keepdim=True)) + _EPS)


def _make(spec):
    kind = spec[0]
    if kind == "conv":
        _, ci, co, k, s, p = spec
        return nn.Conv2d(ci, co, k, stride=s, padding=p)
    if kind == "relu":
        return nn.ReLU(inplace=True)
    if kind == "pool":
        return nn.MaxPool2d(kernel_size=3, stride=2)
    return nn.MaxPool2d(kernel_size=2, stride=2)


def s2d_weight(weight: torch.Tensor, stride: int) -> torch.Tensor:
    """A (O, C, k, k) kernel of stride ``stride`` as the (O, C s^2, q, q) kernel of stride 1 over
    ``pixel_unshuffle(x, stride)``, q = ceil(k / s) (zero taps fill the k..q s gap)."""
    o, c, k, _ = weight.shape
    q = -(-k // stride)
    w = F.pad(weight, (0, q * stride - k, 0, q * stride - k))
    # kernel row a*s + i, column b*s + j -> channel c*s^2 + i*s + j, tap (a, b)
    w = w.reshape(o, c, q, stride, q, stride).permute(0, 1, 3, 5, 2, 4)
    return w.reshape(o, c * stride * stride, q, q).contiguous()


def conv_s2d(
    x: torch.Tensor, weight_s2d: torch.Tensor, bias: torch.Tensor, *, k: int, stride: int, padding: int
) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride, padding)`` for a (O, C, k, k) kernel computed as a
    stride-1 convolution over ``pixel_unshuffle`` of the zero-padded input (the same products,
    summed in another order). ``weight_s2d`` is :func:`s2d_weight` of the kernel."""
    h, w = x.shape[2:]
    q = weight_s2d.shape[2]
    ho = (h + 2 * padding - k) // stride + 1
    wo = (w + 2 * padding - k) // stride + 1
    # rows/columns the stride-1 conv reads: (ho + q - 1) * stride (zeros past the frame; rows
    # no output reaches are cut, as a negative pad)
    hp, wp = (ho + q - 1) * stride, (wo + q - 1) * stride
    xp = F.pad(x, (padding, wp - w - padding, padding, hp - h - padding))
    return F.conv2d(F.pixel_unshuffle(xp, stride), weight_s2d, bias)


class LPIPS(nn.Module):
    """LPIPS v0.1 with a split API: :meth:`features` once per frame, :meth:`distance` per pair.

    ``LPIPS(net="alex", device=None)``; weights are loaded (and hash-checked) from the cache.
    Inputs of :meth:`features` and :meth:`forward` are batches ``(N, 3, H, W)``, uint8 or
    float in [0, 1]. :meth:`distance` takes two feature lists and returns ``(N,)``.
    """

    def __init__(self, net: str = "alex", device=None):
        super().__init__()
        if net not in NETS:
            raise MetricInputError(f"net: expected one of {', '.join(NETS)}, found {net!r}")
        self.net_name = net
        specs, cuts, chns = (
            (_ALEX, _ALEX_CUTS, _ALEX_CHANNELS)
            if net == "alex"
            else (_vgg16_layers(), _VGG_CUTS, _VGG_CHANNELS)
        )
        slices, start = [], 0
        for k, cut in enumerate(cuts):
            sl = nn.Sequential()
            for i in range(start, cut):
                sl.add_module(str(i), _make(specs[i]))
            slices.append(sl)
            start = cut
        self.slices = nn.ModuleList(slices)
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in chns)
        self.register_buffer("shift", torch.tensor(_SHIFT).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(_SCALE).view(1, 3, 1, 1))
        self._load(load_state_dict(net))
        self.requires_grad_(False)
        self.eval()
        if device is not None:
            self.to(device)

    def _load(self, sd: dict) -> None:
        mine = {}
        for key, value in sd.items():
            if key.startswith("net.slice"):
                rest = key[len("net.slice") :]  # "1.0.weight"
                k, tail = rest.split(".", 1)
                mine[f"slices.{int(k) - 1}.{tail}"] = value
            elif key.startswith("lin") and ".model.1." in key:
                k = key[3 : key.index(".")]
                mine[f"lins.{int(k)}.weight"] = value
        missing, unexpected = self.load_state_dict(mine, strict=False)
        missing = [m for m in missing if m not in ("shift", "scale")]
        if missing or unexpected:
            from ._errors import WeightsUnavailable
            from .weights import SETUP_COMMAND

            raise WeightsUnavailable(
                f"LPIPS {self.net_name} weights: keys do not match "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]}); run {SETUP_COMMAND}"
            )

    @property
    def device(self) -> torch.device:
        return self.shift.device

    def features(self, x, *, normalised: bool = True) -> list[torch.Tensor]:
        """Trunk features of each frame (five tensors, one per slice), unit-normalised per pixel
        (``normalised=False``: the raw slice outputs, for :meth:`distance` with the same flag)."""
        if min(x.shape[2], x.shape[3]) < MIN_SIDE[self.net_name]:
            raise MetricInputError(
                f"frames: {x.shape[3]}x{x.shape[2]} is too small for LPIPS-"
                f"{self.net_name}; expected both sides >= {MIN_SIDE[self.net_name]}"
            )
        with precise():
            x = to_unit(x.to(self.device))
            h = ((x * 2 - 1) - self.shift) / self.scale
            if self.device.type == "cpu":
                h = h.contiguous(memory_format=torch.channels_last)
            feats = []
            for k, sl in enumerate(self.slices):
                if k == 0 and self._use_s2d():
                    conv = sl[0]
                    h = torch.relu_(
                        conv_s2d(
                            h,
                            self._conv1_s2d(),
                            conv.bias,
                            k=conv.kernel_size[0],
                            stride=conv.stride[0],
                            padding=conv.padding[0],
                        )
                    )
                else:
                    h = sl(h)  # no slice starts with an in-place op: a raw h stays as it is
                feats.append(_normalise(h) if normalised else h)
            return feats

    def _use_s2d(self) -> bool:
        # AlexNet's conv1 (11x11, stride 4, 3 channels) by space-to-depth: on CUDA, cuDNN runs
        # it with a slow implicit GEMM under deterministic mode; as a 3x3 conv over 48
        # channels it gets the fast kernels of the other layers. On the CPU the plain conv
        # is faster (benchmarks/bench_chain.py), so it stays there unless a fast_paths() block
        # turns the path on (tests check it against the lpips package on the CPU).
        forced = fast_path_forced("conv1_s2d")
        on = forced if forced is not None else self.device.type == "cuda" and fast_path("conv1_s2d")
        return self.net_name == "alex" and on

    def _conv1_s2d(self) -> torch.Tensor:
        conv = self.slices[0][0]
        cached = getattr(self, "_s2d_cache", None)
        if cached is None or cached[0] is not conv.weight or cached[1].device != conv.weight.device:
            cached = self._s2d_cache = (conv.weight, s2d_weight(conv.weight, conv.stride[0]))
        return cached[1]

    def _head_kernel(self):
        forced = fast_path_forced("triton_lpips")
        on = forced if forced is not None else self.device.type == "cuda" and fast_path("triton_lpips")
        return TRITON_LPIPS.kernel() if on else None

    def fused(self) -> bool:
        """Whether :meth:`distance` of raw features runs as one Triton pass per layer here (on
        CUDA unless turned off: ``EVALKIT_TRITON=0``, ``EVALKIT_TRITON_LPIPS=0`` or
        ``fast_paths(triton_lpips=False)``; a ``fast_paths`` block can turn it on anywhere)."""
        return self._head_kernel() is not None

    def distance(
        self, fa: list[torch.Tensor], fb: list[torch.Tensor], *, normalised: bool = True
    ) -> torch.Tensor:
        """LPIPS between two feature lists of equal batch size -> ``(N,)`` float32.
        ``normalised``: how both lists came from :meth:`features`; raw features go through the
        Triton head where :meth:`fused` (the same numbers up to the order of float32 sums), else
        are normalised here first."""
        if normalised:
            return self._distance(fa, fb)

        def torch_path() -> torch.Tensor:
            with precise():
                return self._distance([_normalise(t) for t in fa], [_normalise(t) for t in fb])

        fn = self._head_kernel()
        if fn is None:
            return torch_path()
        with precise():
            return TRITON_LPIPS.run(
                lambda: fn(fa, fb, [lin.weight.reshape(-1) for lin in self.lins], _EPS), torch_path
            )

    def _distance(self, fa: list[torch.Tensor], fb: list[torch.Tensor]) -> torch.Tensor:
        with precise():
            total = None
            for lin, x, y in zip(self.lins, fa, fb):
                d = (x - y) ** 2
                v = lin(d).mean((1, 2, 3))
                total = v if total is None else total + v
            return total

    def forward(self, a, b) -> torch.Tensor:
        a, b = check_pair(a, b, device=self.device)
        n = a.shape[0]
        raw = self.fused()
        f = self.features(torch.cat([to_unit(a), to_unit(b)], 0), normalised=not raw)
        return self.distance([t[:n] for t in f], [t[n:] for t in f], normalised=not raw)


_MODELS: dict[tuple[str, str], LPIPS] = {}
_LOCK = threading.Lock()


def get_model(net: str = "alex", device=None) -> LPIPS:
    """A cached :class:`LPIPS` for ``(net, device)`` (loaded once per process)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    key = (net, str(dev))
    with _LOCK:
        m = _MODELS.get(key)
        if m is None:
            m = _MODELS[key] = LPIPS(net, device=dev)
    return m


def lpips(a, b, *, net: str = "alex") -> torch.Tensor:
    """Per-frame LPIPS v0.1 of two batches ``(N, 3, H, W)``, shape ``(N,)``, on the frames' device.

    net: ``"alex"`` (default; the variant the LPIPS authors recommend as a forward metric and
    the one in the calibration table) or ``"vgg"``.
    """
    a, b = check_pair(a, b)
    return get_model(net, a.device)(a, b)
