"""Full-reference and temporal video metrics over batched frames (N, 3, H, W).

This package knows nothing of runs, suites or studies; it never imports ``evalkit``.
"""
from ._errors import MetricInputError, MetricsError, WeightsUnavailable

__all__ = ["MetricsError", "MetricInputError", "WeightsUnavailable"]
