"""Exceptions of evalkit.metrics (it imports no other part of evalkit).

MetricsError            base
├── MetricInputError    frames of the wrong shape, dtype, range or count (also a ValueError)
├── WeightsUnavailable  LPIPS weights missing or corrupt in the cache; names the set-up command
└── VmafUnavailable     no ffmpeg binary with the libvmaf filter (evalkit.metrics.vmaf)
"""


class MetricsError(Exception):
    """Base of every error the metrics package raises on purpose."""


class MetricInputError(MetricsError, ValueError):
    """Inputs that the metrics cannot accept; the message names the argument and what it got.

    Structured, for callers that word it for their own inputs (no parsing of the message):
    ``field``, the input it is about where a call names it apart (``"a"``, ``"b"``: the two
    sides of a pair), else None (the message begins with the argument's name); ``detail``,
    what was expected and found; ``hint``, what to do, or None. The message is
    ``"field: detail (hint)"``, its parts present."""

    def __init__(self, detail: str, *, field: str | None = None, hint: str | None = None):
        self.field, self.detail, self.hint = field, detail, hint
        text = f"{field}: {detail}" if field else detail
        super().__init__(f"{text} ({hint})" if hint else text)

    def __reduce__(self):  # pickled whole (worker processes, Ray): its parts kept
        return (_metric_input_error, (type(self), self.detail, self.field, self.hint))


def _metric_input_error(cls, detail, field, hint):
    return cls(detail, field=field, hint=hint)


class WeightsUnavailable(MetricsError):
    """LPIPS weights are missing or corrupt; the message says how to provision them."""


class VmafUnavailable(MetricsError):
    """No ffmpeg binary with the ``libvmaf`` filter; the message says what is missing."""
