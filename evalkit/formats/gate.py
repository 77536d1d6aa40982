"""Regression gates: a YAML of thresholds on the compare report's aggregates.

Shape::

    lpips: {mean: {max: 0.05}, worst: {max: 0.2}}      # absolute, per metric and aggregate
    psnr: {mean: {min: 35}}
    floor_ratio:                                       # relative to a noise floor
      lpips: {mean: {max: 0.5}}
    floor: seed                                        # which floor the ratios use: seed (default
                                                       # when present), rerender, or a floor's name
    max_missing_jobs: 0                                # jobs not compared (missing, failed, corrupt)

Aggregates are over all compared frames of all jobs: ``mean``; ``p95`` (95th percentile of the
per-frame values, or the 5th for metrics where higher is better: ssim, psnr); ``worst`` (max, or
min for ssim and psnr). Ratios divide the cross-backend aggregate by the floor's (for ssim:
of 1 - ssim; for psnr: of the MSE). Unknown keys are errors naming the file and field.

The metric keys a gate may name come from the caller (:mod:`evalkit.compare` passes those of
:mod:`metrics.catalogue`, where the definitions above live): this room reads files and
imports only the core.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml

from evalkit.errors import InputFileError

AGGREGATES = ("mean", "p95", "worst")
BOUNDS = ("max", "min")


class GateError(InputFileError):
    def __init__(self, path, field, problem):
        super().__init__(path, f"field '{field}': {problem}" if field else problem)


@dataclass
class Gate:
    path: Path
    absolute: dict      # metric -> aggregate -> bound -> value
    ratios: dict        # metric -> aggregate -> bound -> value
    floor: str | None
    max_missing_jobs: int

    def evaluate(self, aggregates: dict, floor_ratios: dict, missing: int) -> dict:
        """{"verdict": "pass"|"fail", "reasons": [...], "checks": [...]}"""
        checks = []

        def check(label, value, bound, limit):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                ok, shown = False, "undefined"
            else:
                ok = value <= limit if bound == "max" else value >= limit
                shown = f"{value:.6g}"
            checks.append({"check": label, "value": value, bound: limit, "pass": ok,
                           "text": f"{label} = {shown} ({'<=' if bound == 'max' else '>='} {limit:g})"})

        for metric, aggs in self.absolute.items():
            for agg, bounds in aggs.items():
                for bound, limit in bounds.items():
                    check(f"{metric} {agg}", aggregates.get(metric, {}).get(agg), bound, limit)
        if self.ratios:
            name = self.floor
            if name is None:
                name = "seed" if "seed" in floor_ratios else next(iter(floor_ratios), None)
            ratios = floor_ratios.get(name, {})
            for metric, aggs in self.ratios.items():
                for agg, bounds in aggs.items():
                    for bound, limit in bounds.items():
                        check(f"{metric} {agg} / {name} floor", ratios.get(metric, {}).get(agg),
                              bound, limit)
        ok_missing = missing <= self.max_missing_jobs
        checks.append({"check": "jobs not compared", "value": missing, "max": self.max_missing_jobs,
                       "pass": ok_missing,
                       "text": f"jobs not compared = {missing} (<= {self.max_missing_jobs})"})
        failed = [c["text"] for c in checks if not c["pass"]]
        return {"verdict": "fail" if failed else "pass", "reasons": failed, "checks": checks,
                "gate_file": str(self.path)}


def _bounds(path, field, value) -> dict:
    if not isinstance(value, dict) or not value:
        raise GateError(path, field, f"expected a mapping like {{max: 0.05}}, found {value!r}")
    out = {}
    for bound, limit in value.items():
        if bound not in BOUNDS:
            raise GateError(path, f"{field}.{bound}", "unknown bound (expected max or min)")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            raise GateError(path, f"{field}.{bound}", f"expected a number, found {limit!r}")
        out[bound] = float(limit)
    return out


def _metric_block(path, field, value, metrics) -> dict:
    if not isinstance(value, dict):
        raise GateError(path, field, f"expected a mapping of metrics, found {value!r}")
    out = {}
    for metric, aggs in value.items():
        if metric not in metrics:
            raise GateError(path, f"{field}{metric}", f"unknown metric (expected one of: "
                            f"{', '.join(metrics)})")
        if not isinstance(aggs, dict) or not aggs:
            raise GateError(path, f"{field}{metric}",
                            f"expected a mapping like {{mean: {{max: 0.05}}}}, found {aggs!r}")
        out[metric] = {}
        for agg, bounds in aggs.items():
            if agg not in AGGREGATES:
                raise GateError(path, f"{field}{metric}.{agg}",
                                f"unknown aggregate (expected one of: {', '.join(AGGREGATES)})")
            out[metric][agg] = _bounds(path, f"{field}{metric}.{agg}", bounds)
    return out


def load_gate(path, *, metrics: Sequence[str], ratio_metrics: Sequence[str]) -> Gate:
    """Read and check a gate YAML. ``metrics``: the keys absolute thresholds may name;
    ``ratio_metrics``: those ``floor_ratio`` thresholds may name (in the order error messages
    list them; :mod:`evalkit.compare` passes the catalogue's ``keys(compares=True)`` and
    ``keys(ratio=True)``)."""
    path = Path(path)
    if not path.is_file():
        raise GateError(path, None, "file not found (expected a gate YAML)")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise GateError(path, None, f"invalid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not doc:
        raise GateError(path, None, f"expected a mapping of thresholds, found {type(doc).__name__}")
    doc = dict(doc)
    ratios = doc.pop("floor_ratio", None)
    floor = doc.pop("floor", None)
    missing = doc.pop("max_missing_jobs", 0)
    if floor is not None and not isinstance(floor, str):
        raise GateError(path, "floor", f"expected a floor name (seed, rerender...), found {floor!r}")
    if isinstance(missing, bool) or not isinstance(missing, int) or missing < 0:
        raise GateError(path, "max_missing_jobs", f"expected a non-negative integer, found {missing!r}")
    absolute = _metric_block(path, "", doc, tuple(metrics))
    ratio_block = (_metric_block(path, "floor_ratio.", ratios, tuple(ratio_metrics))
                   if ratios is not None else {})
    return Gate(path, absolute, ratio_block, floor, missing)
