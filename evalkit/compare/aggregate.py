"""Aggregates of per-frame metric values, and their ratio to a noise floor (pure functions).

The definitions (directions, which percentile ``p95`` takes, which extreme ``worst`` is, how
each noise-floor ratio is taken) are those of :mod:`evalkit.metrics.catalogue`.
"""
from __future__ import annotations

import math

import numpy as np

from evalkit.metrics.catalogue import AGGREGATES, FAMILIES, MEANING, METRICS, keys


def _finite(values):
    return [v for v in values if v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))]


def aggregate(values: list, metric: str) -> dict:
    """mean, p95 and worst of per-frame values (see evalkit.metrics.catalogue for the definitions)."""
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


def _shown(ratio: float) -> str:
    return "inf" if math.isinf(ratio) else f"{ratio:.3g}"


def _ratio_text(metric: str, ratio: float, floor: str) -> str:
    return f"{METRICS[metric].name} {_shown(ratio)}x the {floor} floor's"


def ratio_meaning(metric: str, ratio: float | None, floor: str) -> str:
    """What a noise-floor ratio means, in words (the part of :func:`ratio_sentence` after the
    number)."""
    if ratio is None:
        return "no ratio (the floor or B has no value for it)"
    if math.isinf(ratio):
        return ("the floor run does not differ from A at all, so no difference can be read "
                "against it (use a floor that varies: `evalkit floor`, docs/metrics.md)")
    if ratio == 0:
        return "B does not differ from A in it"
    if ratio > 1:
        return (f"B differs from A {_shown(ratio)}x more than the {floor} floor run does; "
                f"{MEANING[metric]}")
    return (f"B differs from A {_shown(1 / ratio)}x less than the {floor} floor run does "
            "(within what the pipeline varies by itself)")


def ratio_sentence(metric: str, ratio: float | None, floor: str) -> str:
    """A noise-floor ratio and what it means, in one sentence a release manager reads:
    ``"flicker 39x the seed floor's: B differs from A 39x more than the seed floor run does
    (brightness flickers: people notice flicker)"``."""
    head = _ratio_text(metric, ratio, floor) if ratio is not None else METRICS[metric].name
    return f"{head}: {ratio_meaning(metric, ratio, floor)}"


def _worst_by_family(ratios: dict) -> dict:
    """family -> (metric, mean ratio) of the family's largest finite-or-inf mean ratio."""
    found = {}
    for family, members in FAMILIES.items():
        vals = [(k, ratios[k]["mean"]) for k in members if k in ratios and ratios[k].get("mean") is not None
                and not math.isnan(ratios[k]["mean"])]
        if vals:
            found[family] = max(vals, key=lambda kv: kv[1])
    return found


def _pick_floor(floor_ratios: dict, floor: str | None) -> str | None:
    return floor if floor in floor_ratios else ("seed" if "seed" in floor_ratios else next(iter(floor_ratios), None))


def headline(floor_ratios: dict, floor: str | None = None) -> dict | None:
    """The worst finding across the metric families, against a noise floor: for each family
    (fidelity: LPIPS, SSIM, PSNR; temporal: tLP, tOF, flicker) the metric whose mean is the
    largest multiple of the floor's, and one sentence naming the worst of all. ``floor``: the
    floor a gate uses (default: ``seed`` when present, else the first). None without a floor.

    A ratio above 1 means the two backends differ more than the floor run differs from A (for a
    seed floor: more than another seed changes the output): a change people may see."""
    name = _pick_floor(floor_ratios, floor)
    if name is None:
        return None
    found = _worst_by_family(floor_ratios[name])
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


def clip_finding(clip: str, floor_ratios: dict, floor: str | None = None,
                 offset: dict | None = None, lpips_mean: float | None = None,
                 vmaf: tuple | None = None, gate: dict | None = None) -> dict:
    """One clip's worst finding, in one sentence: its temporal offset first when B's clip was
    shifted (named with the offset: a shift is a failure whatever the metrics say once
    aligned), then the metric with the largest mean ratio to the clip's own floor across the
    families, with what that ratio means (:func:`ratio_sentence`). ``floor_ratios``: floor name
    -> metric -> aggregate -> ratio, of this clip alone; ``offset``: the clip's alignment
    (``summary.json["alignment"]["jobs"][job]``). ``rank``: what sorts the clips, worst first
    (a shift ranks above every ratio). ``vmaf``: (B's VMAF mean, the floor job's or None) when
    VMAF was asked for: said after the worst finding (VMAF has no ratio: a floor identical to A
    scores 97.4 to 100). ``gate``: the gate's verdict on this clip alone (``Gate.evaluate``):
    the checks it fails are named last, or that it is within the gate."""
    name = _pick_floor(floor_ratios, floor)
    found = _worst_by_family(floor_ratios[name]) if name else {}
    parts, out = [], {"clip": clip, "floor": name, "metric": None, "ratio": None, "offset": 0}
    if offset and offset.get("offset"):
        n = int(offset["offset"])
        out["offset"] = n
        parts.append(f"B is {abs(n)} frame{'s' if abs(n) > 1 else ''} "
                     f"{'late' if n > 0 else 'early'} (offset {n:+d}; compared at that offset): "
                     "picture and sound or cuts would be out of step")
    if found:
        _family, (metric, ratio) = max(found.items(), key=lambda kv: kv[1][1])
        out.update(metric=metric, ratio=ratio)
        parts.append(("once aligned, " if parts else "") + ratio_sentence(metric, ratio, name))
    elif lpips_mean is not None:
        parts.append(f"LPIPS mean {lpips_mean:.3g}, with no floor to read it against")
    if vmaf and vmaf[0] is not None:
        out["vmaf"] = vmaf[0]
        parts.append(f"VMAF {vmaf[0]:.3g}" + (f" (the {name} floor's {vmaf[1]:.3g})" if vmaf[1] is not None
                                                else "") + " of 100")
    if gate is not None:
        failed = [c["text"] for c in gate["checks"] if not c["pass"]]
        out["gate_failed"] = failed
        parts.append(("over the gate on this clip alone: " + ", ".join(failed)) if failed
                     else "within the gate")
    out["rank"] = math.inf if out["offset"] else (out["ratio"] if out["ratio"] is not None else -1.0)
    out["text"] = f"{clip}: " + "; ".join(parts) if parts else f"{clip}: nothing measured"
    return out


def with_offsets(head: dict | None, findings: list[dict]) -> dict | None:
    """The report's headline with the clips compared at a temporal offset named first (a shift
    is the worst finding whatever the metrics say once aligned); None when neither exists."""
    shifted = [f for f in findings if f.get("offset")]
    if not shifted:
        return head
    words = ", ".join(f"{f['clip']} (B {abs(f['offset'])} frame{'s' if abs(f['offset']) > 1 else ''} "
                      f"{'late' if f['offset'] > 0 else 'early'}, offset {f['offset']:+d})" for f in shifted)
    text = (f"temporal offset: {len(shifted)} clip{'s' if len(shifted) > 1 else ''} out of step "
            f"with A: {words}, compared at the offset")
    out = dict(head or {"floor": None, "family": None, "metric": None, "ratio": math.inf,
                        "families": {}})
    out["offsets"] = {f["clip"]: f["offset"] for f in shifted}
    out["text"] = text + (f"; then {head['text']}" if head else "")
    return out
