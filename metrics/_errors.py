"""Exceptions of evalkit.metrics (it imports no other part of evalkit).

    MetricsError            base
    ├── MetricInputError    frames of the wrong shape, dtype, range or count (also a ValueError)
    ├── WeightsUnavailable  LPIPS weights missing or corrupt in the cache; names the set-up command
    └── VmafUnavailable     no ffmpeg binary with the libvmaf filter (evalkit.metrics.vmaf)
"""


class MetricsError(Exception):
    """Base of every error the metrics package raises on purpose."""


class MetricInputError(MetricsError, ValueError):
    """Inputs that the metrics cannot accept; the message names the argument and what it got."""


class WeightsUnavailable(MetricsError):
    """LPIPS weights are missing or corrupt; the message says how to provision them."""


class VmafUnavailable(MetricsError):
    """No ffmpeg binary with the ``libvmaf`` filter; the message says what is missing."""
