"""The metric catalogue: every per-frame metric key, once, with what it means.

This is the one list of metric keys. The stream evaluator (:mod:`evalkit.metrics.stream`), the compare
report (CSV columns, aggregates, floor ratios), ``evalkit metrics A B``, the gate and the CLI
take their keys, units, directions and aggregate rules from here. It imports nothing (no
torch): importing it is cheap.

:data:`METRICS` maps each key to its :class:`Metric`, in the order of the CSV columns
(``frames.csv``, ``clips.csv``, ``evalkit metrics --csv``)::

    key              direction  from frame  compares a/b  floor ratio of
    lpips            lower      0           yes           the value
    ssim             higher     0           yes           1 - ssim
    psnr             higher     0           yes           the MSE (10 ** (-psnr / 10))
    max_abs_diff     lower      0           yes           -
    diff_fraction    lower      0           yes           -
    tlp              lower      1           yes           the value
    tof              lower      1           yes           the value
    warp_error_a     lower      1           no (clip a)   -
    warp_error_b     lower      1           no (clip b)   -
    warp_error_diff  lower      1           yes           -
    flicker          lower      1           yes           the value
    flicker_a        lower      2           no (clip a)   -
    flicker_b        lower      2           no (clip b)   -
    block_psnr       higher     0           yes           the MSE        optional (compare)
    vmaf             higher     0           yes           -              optional (--vmaf)

Aggregates over per-frame values (:data:`AGGREGATES`): ``mean`` of the finite values;
``p95`` the 95th percentile, or the 5th where higher is better; ``worst`` the largest value, or
the smallest where higher is better. A metric's ``temporal`` values exist from frame
``first_frame`` on (they need frames t-1, or t-2 and t-1). Metrics that compare clip a with
clip b (``compares``) are the ones a gate may set thresholds on; ``flicker_a`` and the like
describe one clip. ``optional`` metrics (``vmaf``) are computed only on request, by a
separate pass (:mod:`evalkit.metrics.vmaf`), not by the stream evaluator (``block_psnr``: by
``evalkit compare`` from the frames it streams, :mod:`evalkit.compare.local`); report columns list them only
when they were computed. The noise-floor ratio divides a cross-backend aggregate by a floor's
aggregate, each first mapped by :meth:`Metric.ratio_operand`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping

HIGHER = "higher"
LOWER = "lower"

#: Noise-floor ratio kinds: of the value itself, of 1 - value (a similarity turned into a
#: dissimilarity), or of the MSE behind a PSNR in dB.
RATIO_VALUE = "value"
RATIO_ONE_MINUS = "1-value"
RATIO_MSE = "mse"

#: The aggregates of per-frame values, in report order, with their definitions.
AGGREGATES: Mapping[str, str] = {
    "mean": "mean of the finite per-frame values",
    "p95": "95th percentile of the per-frame values (the 5th where higher is better)",
    "worst": "largest per-frame value (the smallest where higher is better)",
}


@dataclass(frozen=True)
class Metric:
    """One per-frame metric. ``description`` is what :data:`evalkit.metrics.stream.UNITS` and a compare
    report's ``summary.json["units"]`` say of it."""

    key: str
    name: str  # for people: "LPIPS", "tOF"
    unit: str  # short unit: "dB", "pixels", "unitless"
    direction: str  # HIGHER or LOWER: which way is better (closer, more consistent)
    first_frame: int  # 0: every frame; 1: from frame 1 (needs t-1); 2: from frame 2
    compares: bool  # a against b (True), or one clip's own property (the *_a, *_b)
    ratio: str | None  # noise-floor ratio: RATIO_VALUE, RATIO_ONE_MINUS, RATIO_MSE or None
    description: str  # one line: what the number means, in which units
    headline: bool = False  # shown in the one-screen summary of ``evalkit compare``
    optional: bool = False  # only on request (a separate pass), not from the stream evaluator

    @property
    def higher_is_better(self) -> bool:
        return self.direction == HIGHER

    @property
    def temporal(self) -> bool:
        return self.first_frame > 0

    @property
    def p95_percentile(self) -> float:
        """The percentile the ``p95`` aggregate takes: the bad tail, 95 or 5."""
        return 5.0 if self.higher_is_better else 95.0

    @property
    def worst(self) -> str:
        """``"min"`` or ``"max"``: which extreme the ``worst`` aggregate takes."""
        return "min" if self.higher_is_better else "max"

    def ratio_operand(self, value):
        """``value`` (an aggregate) as the noise-floor ratio divides it: the value, 1 - value
        (ssim) or the MSE relative to the peak (psnr: 0 for inf). None stays None."""
        if self.ratio is None:
            raise ValueError(f"{self.key}: no noise-floor ratio is defined")
        if value is None or self.ratio == RATIO_VALUE:
            return value
        if self.ratio == RATIO_ONE_MINUS:
            return 1 - value
        return 0.0 if value == math.inf else 10 ** (-value / 10)


def _m(key, name, unit, direction, first_frame, compares, ratio, description, headline=False, optional=False):
    return Metric(key, name, unit, direction, first_frame, compares, ratio, description, headline, optional)


#: Every metric key, in CSV column order.
METRICS: Mapping[str, Metric] = {
    m.key: m
    for m in (
        _m(
            "lpips",
            "LPIPS",
            "unitless",
            LOWER,
            0,
            True,
            RATIO_VALUE,
            "LPIPS v0.1 distance (unitless, 0 = same); inputs scaled to [-1, 1]",
            headline=True,
        ),
        _m(
            "ssim",
            "SSIM",
            "unitless",
            HIGHER,
            0,
            True,
            RATIO_ONE_MINUS,
            "SSIM index (unitless, 1 = same)",
            headline=True,
        ),
        _m(
            "psnr",
            "PSNR",
            "dB",
            HIGHER,
            0,
            True,
            RATIO_MSE,
            "dB, peak 255 on 8-bit RGB; inf (JSON null) for identical frames",
            headline=True,
        ),
        _m(
            "max_abs_diff",
            "max |a - b|",
            "8-bit levels",
            LOWER,
            0,
            True,
            None,
            "largest |a - b| of any channel value, 8-bit units (0..255)",
        ),
        _m(
            "diff_fraction",
            "differing pixels",
            "fraction",
            LOWER,
            0,
            True,
            None,
            "share of pixel positions where any channel differs (0..1)",
        ),
        _m(
            "tlp",
            "tLP",
            "LPIPS units",
            LOWER,
            1,
            True,
            RATIO_VALUE,
            "|LPIPS(a_t, a_t-1) - LPIPS(b_t, b_t-1)|, LPIPS units (TecoGAN tables show x100)",
        ),
        _m(
            "tof",
            "tOF",
            "pixels",
            LOWER,
            1,
            True,
            RATIO_VALUE,
            "mean end-point distance of the t-1->t flows of a and b, pixels (TecoGAN shows x10)",
        ),
        _m(
            "warp_error_a",
            "warping error of a",
            "MSE, RGB in [0, 1]",
            LOWER,
            1,
            False,
            None,
            "MSE of frame t-1 warped onto t (own flow, fwd-bwd masked), RGB in [0, 1] "
            "units (x65025 for 8-bit units)",
        ),
        _m(
            "warp_error_b",
            "warping error of b",
            "MSE, RGB in [0, 1]",
            LOWER,
            1,
            False,
            None,
            "as warp_error_a, for clip b",
        ),
        _m(
            "warp_error_diff",
            "warping error b - a",
            "MSE, RGB in [0, 1]",
            LOWER,
            1,
            True,
            None,
            "warp_error_b - warp_error_a (positive: b less temporally consistent)",
        ),
        _m(
            "flicker",
            "flicker",
            "8-bit levels",
            LOWER,
            1,
            True,
            RATIO_VALUE,
            "mean |dLa_t - dLb_t| of 16x16-block-averaged luma, 8-bit units",
        ),
        _m(
            "flicker_a",
            "flicker of a",
            "8-bit levels",
            LOWER,
            2,
            False,
            None,
            "mean |dL_t - dL_t-1| of clip a's block-averaged luma, 8-bit units",
        ),
        _m("flicker_b", "flicker of b", "8-bit levels", LOWER, 2, False, None, "as flicker_a, for clip b"),
        _m(
            "block_psnr",
            "worst block PSNR",
            "dB",
            HIGHER,
            0,
            True,
            RATIO_MSE,
            "PSNR of the frame's worst square block (side min(H,W)/8, stride half a side), dB, peak "
            "255: a local glitch; measured by evalkit compare",
            optional=True,
        ),
        _m(
            "vmaf",
            "VMAF",
            "VMAF score (0..100)",
            HIGHER,
            0,
            True,
            None,
            "VMAF of b against reference a (libvmaf, model vmaf_v0.6.1; 0..100, 100 = best; "
            "identical frames score 97.43 to 100 depending on motion); only with --vmaf",
            headline=True,
            optional=True,
        ),
    )
}

#: Every metric key, in CSV column order.
KEYS: tuple[str, ...] = tuple(METRICS)

#: The conventions (keys of :meth:`evalkit.metrics.stream.PairEvaluator.conventions`, recorded in a
#: compare report's ``summary.json["conventions"]``) each metric's numbers depend on: the same
#: frames give other numbers under another (tOF with the torch flow against DIS: a median ratio
#: of 1.45 on real clips). A gate that records them refuses a report measured under others.
CONVENTIONS: Mapping[str, tuple[str, ...]] = {
    "lpips": ("lpips",),
    "ssim": ("ssim",),
    "psnr": ("psnr",),
    "max_abs_diff": ("exactness",),
    "diff_fraction": ("exactness",),
    "tlp": ("lpips", "tlp"),
    "tof": ("flow", "tof"),
    "warp_error_a": ("flow", "warp_error"),
    "warp_error_b": ("flow", "warp_error"),
    "warp_error_diff": ("flow", "warp_error"),
    "flicker": ("flicker",),
    "flicker_a": ("flicker",),
    "flicker_b": ("flicker",),
    "vmaf": ("vmaf",),
    "block_psnr": ("block",),
}


#: The metric families a headline names, and what a ratio above 1 means to a release manager.
FAMILIES = {
    "fidelity": ("lpips", "ssim", "psnr"),
    "temporal": ("tlp", "tof", "flicker"),
    "local": ("block_psnr",),
}
MEANING = {
    "lpips": "frames look different (perceptual distance)",
    "ssim": "frames differ in structure",
    "psnr": "pixels differ more",
    "tlp": "frames change differently over time",
    "tof": "things move differently",
    "flicker": "brightness flickers: people notice flicker",
    "block_psnr": "one part of the picture differs: a local glitch",
}


def conventions_of(metric_keys) -> tuple[str, ...]:
    """The convention keys the numbers of ``metric_keys`` depend on, each once, in order."""
    out: list[str] = []
    for k in metric_keys:
        out += [c for c in CONVENTIONS[metric(k).key] if c not in out]
    return tuple(out)


def metric(key: str) -> Metric:
    """The catalogue entry of ``key``; KeyError naming the known keys otherwise."""
    try:
        return METRICS[key]
    except KeyError:
        raise KeyError(f"unknown metric {key!r} (known: {', '.join(KEYS)})") from None


def keys(
    *,
    temporal: bool | None = None,
    compares: bool | None = None,
    ratio: bool | None = None,
    headline: bool | None = None,
    higher_is_better: bool | None = None,
    optional: bool | None = None,
) -> tuple[str, ...]:
    """Metric keys in CSV column order, filtered by each criterion that is not None:
    ``temporal`` (exists only from frame 1 or 2), ``compares`` (a against b; what a gate may
    check), ``ratio`` (a noise-floor ratio is defined), ``headline``, ``higher_is_better``,
    ``optional`` (computed only on request, not by the stream evaluator)."""

    def ok(m: Metric) -> bool:
        return (
            (temporal is None or m.temporal == temporal)
            and (optional is None or m.optional == optional)
            and (compares is None or m.compares == compares)
            and (ratio is None or (m.ratio is not None) == ratio)
            and (headline is None or m.headline == headline)
            and (higher_is_better is None or m.higher_is_better == higher_is_better)
        )

    return tuple(k for k, m in METRICS.items() if ok(m))


def higher_is_better(key: str) -> bool:
    return metric(key).higher_is_better


def units() -> dict[str, str]:
    """key -> description (what the number means, in which units), in CSV column order."""
    return {k: m.description for k, m in METRICS.items()}


# -- numbers for people ----------------------------------------------------------------------


def fmt(
    value, digits: int = 4, *, fixed: bool = False, none: str = "n/a", inf: str = "inf", nan: str = "nan"
) -> str:
    """A number for people: ``digits`` significant digits (``:.4g``), or with ``fixed``
    ``digits`` decimals (``:.4f``). None, nan and infinities print as ``none``, ``nan`` and
    ``inf`` (``-`` + ``inf`` below zero); integers (not bools) print exactly; anything else
    as ``str``."""
    if value is None:
        return none
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return nan
    if math.isinf(value):
        return inf if value > 0 else "-" + inf
    return f"{value:.{digits}{'f' if fixed else 'g'}}"
