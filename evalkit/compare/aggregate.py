"""Aggregates of per-frame metric values, and their ratio to a noise floor (pure functions).

The definitions (directions, which percentile ``p95`` takes, which extreme ``worst`` is, how
each noise-floor ratio is taken) are those of :mod:`evalkit.metrics.catalogue`.
"""

from __future__ import annotations

import math

import numpy as np

from evalkit.metrics.catalogue import AGGREGATES, FAMILIES, MEANING, METRICS, keys


def _finite(values):
    return [
        v for v in values if v is not None and not (isinstance(v, float) and (math.isnan(v) or math.isinf(v)))
    ]


def aggregate(values: list, metric: str) -> dict:
    """mean, p95 and worst of per-frame values (see evalkit.metrics.catalogue for the definitions)."""
    vals = _finite(values)
    if not vals:
        inf = METRICS[metric].ratio == "mse" and any(v == math.inf for v in values)
        v = math.inf if inf else None
        return {"mean": v, "p95": v, "worst": v, "frames": 0}
    arr = np.asarray(vals, dtype=np.float64)
    m = METRICS[metric]
    return {
        "mean": float(arr.mean()),
        "p95": float(np.percentile(arr, m.p95_percentile)),
        "worst": float(arr.min() if m.worst == "min" else arr.max()),
        "frames": int(arr.size),
    }


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
        return (
            "the floor run does not differ from A at all, so no difference can be read "
            "against it (use a floor that varies: `evalkit floor`, docs/metrics.md)"
        )
    if ratio == 0:
        return "B does not differ from A in it"
    if ratio > 1:
        return f"B differs from A {_shown(ratio)}x more than the {floor} floor run does; {MEANING[metric]}"
    return (
        f"B differs from A {_shown(1 / ratio)}x less than the {floor} floor run does "
        "(within what the pipeline varies by itself)"
    )


def ratio_sentence(metric: str, ratio: float | None, floor: str) -> str:
    """A noise-floor ratio and what it means, in one sentence a release manager reads:
    ``"flicker 39x the seed floor's: B differs from A 39x more than the seed floor run does
    (brightness flickers: people notice flicker)"``."""
    head = _ratio_text(metric, ratio, floor) if ratio is not None else METRICS[metric].name
    return f"{head}: {ratio_meaning(metric, ratio, floor)}"


#: the aggregate each family is ranked by: a local glitch is as visible as its worst block
RANK_AGGREGATE = {"local": "worst"}


def _worst_by_family(ratios: dict) -> dict:
    """family -> (metric, ratio) of the family's largest finite-or-inf ratio (of the mean; of
    the worst for the local family: :data:`RANK_AGGREGATE`)."""
    found = {}
    for family, members in FAMILIES.items():
        agg = RANK_AGGREGATE.get(family, "mean")
        vals = [
            (k, ratios[k][agg])
            for k in members
            if k in ratios and ratios[k].get(agg) is not None and not math.isnan(ratios[k][agg])
        ]
        if vals:
            found[family] = max(vals, key=lambda kv: kv[1])
    return found


def _db(v) -> str:
    return "inf dB" if v is None or v == math.inf else f"{v:.1f} dB"


def below_floor(ratios: dict) -> bool:
    """B differs from A less than the floor run does in the pixels themselves: its PSNR's MSE
    and its worst block's are both at most the floor's. Temporal ratios above 1 then come from
    differences smaller than the floor's own (a re-encode floor barely moves), not findings."""
    psnr = (ratios.get("psnr") or {}).get("mean")
    block = (ratios.get("block_psnr") or {}).get("worst")
    return psnr is not None and psnr <= 1 and (block is None or block <= 1)


def below_floor_sentence(floor: str, aggregates: dict, floor_aggregates: dict, ratios: dict) -> str:
    """The one line that says a difference is below what the floor resolves, with its dB."""

    def get(agg, key, which):
        return (agg.get(key) or {}).get(which)

    if get(aggregates, "psnr", "mean") == math.inf:
        return "identical to A frame for frame"
    text = (
        f"below what the {floor} floor resolves: PSNR {_db(get(aggregates, 'psnr', 'mean'))} "
        f"against the floor's {_db(get(floor_aggregates, 'psnr', 'mean'))}"
    )
    if get(aggregates, "block_psnr", "worst") is not None:
        text += (
            f", worst block {_db(get(aggregates, 'block_psnr', 'worst'))} against "
            f"{_db(get(floor_aggregates, 'block_psnr', 'worst'))}"
        )
    above = [
        (k, r["mean"])
        for k in FAMILIES["temporal"]
        if (r := ratios.get(k)) and r.get("mean") is not None and r["mean"] > 1
    ]
    if above:
        text += (
            "; "
            + ", ".join(f"{METRICS[k].name} {_shown(v)}x" for k, v in above)
            + " over the floor's are read on differences smaller than the floor's own, "
            "not findings"
        )
    return text


def local_sentence(
    local: dict, ratio: float | None, floor: str | None, floor_block: float | None = None
) -> str:
    """A local or short-lived difference in words: its frames, its place and its dB."""
    lo, hi = local["burst"]
    when = (
        "throughout the clip"
        if local["throughout"]
        else (f"on frame {lo}" if lo == hi else f"on frames {lo}-{hi}")
        + f" ({local['burst_frames']} of {local['frames']})"
    )
    what = "a local glitch" if local["local"] else "a short-lived difference"
    text = (
        f"{what} {when}, worst at frame {local['frame']} in {local['where']}: that block "
        f"{_db(local['block_psnr'])} PSNR, the whole frame {_db(local['frame_psnr'])}"
    )
    if ratio is not None and floor is not None:
        text += (
            f"; worst block {_shown(ratio)}x the {floor} floor's"
            + (f" ({_db(floor_block)})" if floor_block is not None else "")
            + " in MSE"
        )
    return text


def local_counts(local: dict | None) -> bool:
    """A clip's worst block is a finding of its own: held in one place, or in a burst."""
    return bool(local) and (local["local"] or not local["throughout"])


def _pick_floor(floor_ratios: dict, floor: str | None) -> str | None:
    return (
        floor
        if floor in floor_ratios
        else ("seed" if "seed" in floor_ratios else next(iter(floor_ratios), None))
    )


def _ranked(ratios: dict, local: dict | None) -> dict:
    """The ratios a finding is ranked by: the worst block's only when it is a finding of its own
    (:func:`local_counts`); an evenly spread difference is read by the frame-wide metrics."""
    return ratios if local_counts(local) else {k: v for k, v in ratios.items() if k != "block_psnr"}


def headline(
    floor_ratios: dict,
    floor: str | None = None,
    *,
    aggregates: dict | None = None,
    floor_aggregates: dict | None = None,
    local: dict | None = None,
) -> dict | None:
    """The worst finding across the metric families, against a noise floor: for each family
    (fidelity: LPIPS, SSIM, PSNR; temporal: tLP, tOF, flicker; local: the worst block) the
    metric whose mean (the local family: worst) is the largest multiple of the floor's, and one
    sentence naming the worst of all. ``floor``: the floor a gate uses (default: ``seed`` when
    present, else the first). None without a floor. ``aggregates``, ``floor_aggregates``: B's
    and the floors' (name -> aggregates), for the dB of a difference below the floor;
    ``local``: the worst local finding of any clip (its clip's summary), or None.

    A ratio above 1 means the two backends differ more than the floor run differs from A (for a
    seed floor: more than another seed changes the output): a change people may see; a run
    whose pixels differ less than the floor's (:func:`below_floor`) is said to be below what
    the floor resolves, with its dB, whatever its temporal ratios."""
    name = _pick_floor(floor_ratios, floor)
    if name is None:
        return None
    ratios = _ranked(floor_ratios[name], local)
    found = _worst_by_family(ratios)
    if not found:
        return None
    family, (metric, ratio) = max(found.items(), key=lambda kv: kv[1][1])
    others = "; ".join(f"{fam}: {_ratio_text(k, r, name)}" for fam, (k, r) in found.items() if fam != family)
    below = below_floor(ratios) and aggregates is not None
    if below:
        text = below_floor_sentence(name, aggregates, (floor_aggregates or {}).get(name) or {}, ratios)
        family, metric, ratio = "fidelity", "psnr", ratios["psnr"]["mean"]
        others = ""
    elif ratio > 1:
        text = (
            f"worst: {_ratio_text(metric, ratio, name)} ({MEANING[metric]}; the backends differ "
            f"more than the {name} floor run does)"
        )
        if family == "local" and local:
            text = f"worst: {local['clip']}: {local_sentence(local, ratio, name)}"
    else:
        text = (
            f"within the {name} floor: the largest is {_ratio_text(metric, ratio, name)} (the "
            f"backends differ less than the floor run does)"
        )
    return {
        "floor": name,
        "family": family,
        "metric": metric,
        "ratio": ratio,
        "below_floor": below,
        "families": {fam: {"metric": k, "ratio": r} for fam, (k, r) in found.items()},
        "text": text + (f"; {others}" if others else ""),
    }


def clip_finding(
    clip: str,
    floor_ratios: dict,
    floor: str | None = None,
    offset: dict | None = None,
    lpips_mean: float | None = None,
    vmaf: tuple | None = None,
    gate: dict | None = None,
    *,
    local: dict | None = None,
    aggregates: dict | None = None,
    floor_aggregates: dict | None = None,
) -> dict:
    """One clip's worst finding, in one sentence: its temporal offset first when B's clip was
    shifted (named with the offset: a shift is a failure whatever the metrics say once
    aligned), then the metric with the largest ratio to the clip's own floor across the
    families, with what that ratio means (:func:`ratio_sentence`; a local glitch with its
    frames and place: :func:`local_sentence`), or that the clip differs less than its floor
    resolves (:func:`below_floor_sentence`, with its dB). ``floor_ratios``: floor name ->
    metric -> aggregate -> ratio, of this clip alone; ``offset``: the clip's alignment
    (``summary.json["alignment"]["jobs"][job]``). ``rank``: what sorts the clips, worst first
    (a shift ranks above every ratio; the local family's ratio is of the worst block).
    ``local``: the clip's worst block (:meth:`evalkit.compare.local.LocalTrack.summary`);
    ``aggregates``, ``floor_aggregates``: the clip's and its floor jobs' (floor name ->
    aggregates). ``vmaf``: (B's VMAF mean, the floor job's or None) when VMAF was asked for:
    said after the worst finding (VMAF has no ratio: a floor identical to A scores 97.4 to
    100). ``gate``: the gate's verdict on this clip alone (``Gate.evaluate``): the checks it
    fails are named last, or that it is within the gate."""
    name = _pick_floor(floor_ratios, floor)
    ratios = _ranked(floor_ratios[name], local) if name else {}
    found = _worst_by_family(ratios)
    parts, out = (
        [],
        {"clip": clip, "floor": name, "metric": None, "ratio": None, "offset": 0, "below_floor": False},
    )
    if local:
        out["local"] = dict(local)
    if offset and offset.get("offset"):
        n = int(offset["offset"])
        out["offset"] = n
        parts.append(
            f"B is {abs(n)} frame{'s' if abs(n) > 1 else ''} "
            f"{'late' if n > 0 else 'early'} (offset {n:+d}; compared at that offset): "
            "picture and sound or cuts would be out of step"
        )
    fagg = (floor_aggregates or {}).get(name) or {}
    if found and aggregates is not None and below_floor(ratios):
        out.update(metric="psnr", ratio=ratios["psnr"]["mean"], below_floor=True)
        parts.append(
            ("once aligned, " if parts else "") + below_floor_sentence(name, aggregates, fagg, ratios)
        )
    elif found:
        family, (metric, ratio) = max(found.items(), key=lambda kv: kv[1][1])
        out.update(metric=metric, ratio=ratio)
        lead = "once aligned, " if parts else ""
        floor_block = (fagg.get("block_psnr") or {}).get("worst")
        if family == "local":
            parts.append(lead + local_sentence(local, ratio, name, floor_block))
        else:
            parts.append(lead + ratio_sentence(metric, ratio, name))
            if "local" in found and found["local"][1] > 1:
                parts.append("also " + local_sentence(local, found["local"][1], name, floor_block))
    elif lpips_mean is not None:
        parts.append(f"LPIPS mean {lpips_mean:.3g}, with no floor to read it against")
        if local_counts(local):
            parts.append(local_sentence(local, None, None))
    if vmaf and vmaf[0] is not None:
        out["vmaf"] = vmaf[0]
        parts.append(
            f"VMAF {vmaf[0]:.3g}"
            + (f" (the {name} floor's {vmaf[1]:.3g})" if vmaf[1] is not None else "")
            + " of 100"
        )
    if gate is not None:
        failed = [c["text"] for c in gate["checks"] if not c["pass"]]
        out["gate_failed"] = failed
        parts.append(
            ("over the gate on this clip alone: " + ", ".join(failed)) if failed else "within the gate"
        )
    out["rank"] = math.inf if out["offset"] else (out["ratio"] if out["ratio"] is not None else -1.0)
    out["text"] = f"{clip}: " + "; ".join(parts) if parts else f"{clip}: nothing measured"
    return out


def with_offsets(head: dict | None, findings: list[dict]) -> dict | None:
    """The report's headline with the clips compared at a temporal offset named first (a shift
    is the worst finding whatever the metrics say once aligned); None when neither exists."""
    shifted = [f for f in findings if f.get("offset")]
    if not shifted:
        return head
    words = ", ".join(
        f"{f['clip']} (B {abs(f['offset'])} frame{'s' if abs(f['offset']) > 1 else ''} "
        f"{'late' if f['offset'] > 0 else 'early'}, offset {f['offset']:+d})"
        for f in shifted
    )
    text = (
        f"temporal offset: {len(shifted)} clip{'s' if len(shifted) > 1 else ''} out of step "
        f"with A: {words}, compared at the offset"
    )
    out = dict(head or {"floor": None, "family": None, "metric": None, "ratio": math.inf, "families": {}})
    out["offsets"] = {f["clip"]: f["offset"] for f in shifted}
    out["text"] = text + (f"; then {head['text']}" if head else "")
    return out


def with_locals(head: dict | None, findings: list[dict]) -> dict | None:
    """The headline with every clip whose worst finding is a local or short-lived difference
    above the floor named, with its frames and place (unless the headline names it already)."""
    glitches = [
        f
        for f in findings
        if f.get("metric") == "block_psnr" and f.get("ratio") and f["ratio"] > 1 and not f.get("below_floor")
    ]
    if not glitches or head is None:
        return head
    out = dict(head)
    extra = [
        f"{f['clip']}: {local_sentence(f['local'], f['ratio'], f['floor'])}"
        for f in glitches
        if f"{f['clip']}: " not in head["text"]
    ]
    if extra:
        out["text"] = head["text"] + "; local: " + "; ".join(extra)
    out["locals"] = {
        f["clip"]: {
            "burst": f["local"]["burst"],
            "where": f["local"]["where"],
            "block_psnr": f["local"]["block_psnr"],
        }
        for f in glitches
    }
    return out


def with_gate(head: dict | None, verdict: dict | None) -> dict | None:
    """The headline ending with the gate's verdict, so that the two cannot disagree unseen: a
    failing gate's first reason, or a passing gate next to a finding above the floor said to
    bound none of it."""
    if head is None or verdict is None:
        return head
    out = dict(head)
    if verdict["verdict"] == "fail":
        reasons = verdict["reasons"]
        out["text"] = (
            head["text"]
            + f"; gate: FAIL ({reasons[0]}"
            + (f", and {len(reasons) - 1} more" if len(reasons) > 1 else "")
            + ")"
        )
    elif head.get("offsets") or (
        head.get("ratio") is not None and head["ratio"] > 1 and not head.get("below_floor")
    ):
        out["text"] = head["text"] + "; gate: PASS, though its bounds do not cover this finding"
    else:
        out["text"] = head["text"] + "; gate: PASS"
    return out
