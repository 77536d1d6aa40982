"""Aggregates of per-frame metric values, and their ratio to a noise floor (pure functions)."""
from __future__ import annotations

import math

import numpy as np

from evalkit.formats.gate import HIGHER_IS_BETTER, RATIO_METRICS


def _finite(values):
    return [v for v in values if v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))]


def aggregate(values: list, metric: str) -> dict:
    """mean, p95 and worst of per-frame values (see evalkit.formats.gate for the definitions)."""
    vals = _finite(values)
    if not vals:
        inf = metric == "psnr" and any(v == math.inf for v in values)
        v = math.inf if inf else None
        return {"mean": v, "p95": v, "worst": v, "frames": 0}
    arr = np.asarray(vals, dtype=np.float64)
    higher = metric in HIGHER_IS_BETTER
    return {"mean": float(arr.mean()),
            "p95": float(np.percentile(arr, 5 if higher else 95)),
            "worst": float(arr.min() if higher else arr.max()),
            "frames": int(arr.size)}


def floor_ratio(cross: dict, floor: dict) -> dict:
    """Cross-backend aggregate / floor aggregate per metric (ssim: of 1 - ssim; psnr: of MSE)."""
    out = {}
    for metric in RATIO_METRICS:
        if metric not in cross or metric not in floor:
            continue
        out[metric] = {}
        for agg in ("mean", "p95", "worst"):
            c, f = cross[metric].get(agg), floor[metric].get(agg)
            if metric == "ssim" and c is not None and f is not None:
                c, f = 1 - c, 1 - f
            elif metric == "psnr":
                c = 0.0 if c == math.inf else (10 ** (-c / 10) if c is not None else None)
                f = 0.0 if f == math.inf else (10 ** (-f / 10) if f is not None else None)
            if c is None or f is None:
                out[metric][agg] = None
            elif f == 0:
                out[metric][agg] = 0.0 if c == 0 else math.inf
            else:
                out[metric][agg] = c / f
    return out
