"""The stream metrics' settings of a compare, one frozen value (no dict of keywords).

:class:`MetricOptions` travels from the front door (``evalkit compare``'s flags, a library call)
to whatever measures the pairs: :class:`evalkit.compare.pairing.LocalCompareSession` here, an
executor's ``compare_session(device=, metrics=)`` elsewhere (the Ray executor's workers).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricOptions:
    """``temporal``: the temporal metrics (flow, warping error, flicker); ``flow``: their
    optical flow (``dis``, ``farneback``, ``torch`` or ``auto``:
    :func:`evalkit.metrics.flow.resolve_flow`); ``flow_preset``: DIS's preset, None for the
    evaluator's default (:data:`evalkit.metrics.flow.DEFAULT_PRESET`)."""

    temporal: bool = True
    flow: str = "dis"
    flow_preset: str | None = None

    def evaluator_kwargs(self) -> dict:
        """The keywords of :class:`evalkit.metrics.stream.PairEvaluator` these options set."""
        kw = {"temporal": self.temporal, "flow": self.flow}
        if self.flow_preset is not None:
            kw["flow_preset"] = self.flow_preset
        return kw
