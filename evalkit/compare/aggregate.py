"""Aggregates of per-frame metric values, and their ratio to a noise floor (pure functions).

The definitions (directions, which percentile ``p95`` takes, which extreme ``worst`` is, how
each noise-floor ratio is taken) are those of :mod:`metrics.catalogue`.
"""
from __future__ import annotations

import math

import numpy as np

from metrics.catalogue import AGGREGATES, METRICS, keys


def _finite(values):
    return [v for v in values if v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))]


def aggregate(values: list, metric: str) -> dict:
    """mean, p95 and worst of per-frame values (see metrics.catalogue for the definitions)."""
    vals = _finite(values)
    if not vals:
        inf = metric == "psnr" and any(v == math.inf for v in values)
        v = math.inf if inf else None
        return {"mean": v, "p95": v, "worst": v, "frames": 0}
    arr = np.asarray(vals, dtype=np.float64)
    m = METRICS[metric]
    return {"mean": float(arr.mean()),
            "p95": float(np.percentile(arr, m.p95_percentile)),
            "worst": float(arr.min() if m.worst == "min" else arr.max()),
            "frames": int(arr.size)}


def floor_ratio(cross: dict, floor: dict) -> dict:
    """Cross-backend aggregate / floor aggregate per metric that has a noise-floor ratio in the
    catalogue (ssim: of 1 - ssim; psnr: of MSE)."""
    out = {}
    for metric in keys(ratio=True):
        if metric not in cross or metric not in floor:
            continue
        m = METRICS[metric]
        out[metric] = {}
        for agg in AGGREGATES:
            c = m.ratio_operand(cross[metric].get(agg))
            f = m.ratio_operand(floor[metric].get(agg))
            if c is None or f is None:
                out[metric][agg] = None
            elif f == 0:
                out[metric][agg] = 0.0 if c == 0 else math.inf
            else:
                out[metric][agg] = c / f
    return out
