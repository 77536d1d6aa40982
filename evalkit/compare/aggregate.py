"""Aggregates of per-frame metric values, and their ratio to a noise floor (pure functions).

The definitions (directions, which percentile ``p95`` takes, which extreme ``worst`` is, how
each noise-floor ratio is taken) are those of :mod:`metrics.catalogue`.
"""
from __future__ import annotations

import math

import numpy as np

from metrics.catalogue import AGGREGATES, FAMILIES, MEANING, METRICS, keys


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


def _ratio_text(metric: str, ratio: float, floor: str) -> str:
    shown = "inf" if math.isinf(ratio) else f"{ratio:.3g}"
    return f"{METRICS[metric].name} {shown}x the {floor} floor's"


def headline(floor_ratios: dict, floor: str | None = None) -> dict | None:
    """The worst finding across the metric families, against a noise floor: for each family
    (fidelity: LPIPS, SSIM, PSNR; temporal: tLP, tOF, flicker) the metric whose mean is the
    largest multiple of the floor's, and one sentence naming the worst of all. ``floor``: the
    floor a gate uses (default: ``seed`` when present, else the first). None without a floor.

    A ratio above 1 means the two backends differ more than the floor run differs from A (for a
    seed floor: more than another seed changes the output): a change people may see."""
    name = floor if floor in floor_ratios else ("seed" if "seed" in floor_ratios else next(iter(floor_ratios), None))
    if name is None:
        return None
    ratios = floor_ratios[name]
    found = {}
    for family, members in FAMILIES.items():
        vals = [(k, ratios[k]["mean"]) for k in members if k in ratios and ratios[k].get("mean") is not None
                and not math.isnan(ratios[k]["mean"])]
        if vals:
            found[family] = max(vals, key=lambda kv: kv[1])
    if not found:
        return None
    family, (metric, ratio) = max(found.items(), key=lambda kv: kv[1][1])
    others = "; ".join(f"{fam}: {_ratio_text(k, r, name)}" for fam, (k, r) in found.items() if fam != family)
    if ratio > 1:
        text = (f"worst: {_ratio_text(metric, ratio, name)} ({MEANING[metric]}; the backends differ "
                f"more than the {name} floor run does)")
    else:
        text = (f"within the {name} floor: the largest is {_ratio_text(metric, ratio, name)} (the "
                f"backends differ less than the floor run does)")
    return {"floor": name, "family": family, "metric": metric, "ratio": ratio,
            "families": {fam: {"metric": k, "ratio": r} for fam, (k, r) in found.items()},
            "text": text + (f"; {others}" if others else "")}
