"""Regression gates: a YAML of thresholds on the compare report's aggregates.

Shape::

    lpips: {mean: {max: 0.05}, worst: {max: 0.2}}      # absolute, per metric and aggregate
    psnr: {mean: {min: 35}}
    floor_ratio:                                       # relative to a noise floor
      lpips: {mean: {max: 0.5}}
    floor: seed                                        # which floor the ratios use: seed (default
                                                       # when present), rerender, or a floor's name
    conventions: {flow: "dis,fast,...", ssim: ...}     # optional: what the thresholds were set
                                                       # under (evalkit gate --pin writes them)
    max_missing_jobs: 0                                # jobs not compared (missing, failed, corrupt)
    max_offset_frames: 0                               # largest temporal offset of B (default 0:
                                                       # any offset fails)
    block_psnr: {worst: {min: 25}}                     # the worst block of any frame (a local glitch)
    human_threshold:                                   # optional: people set this gate
      {metric: lpips, value: 0.05, ci: [0.04, 0.063], study: s1, safety_factor: 2,
       criterion: 0.75}

Aggregates are over all compared frames of all jobs: ``mean``; ``p95`` (95th percentile of the
per-frame values, or the 5th for metrics where higher is better: ssim, psnr); ``worst`` (max, or
min for ssim and psnr). Ratios divide the cross-backend aggregate by the floor's (for ssim:
of 1 - ssim; for psnr and block_psnr: of the MSE). ``block_psnr`` is the PSNR of each frame's
worst block (:mod:`evalkit.compare.local`): its ``worst`` bounds the worst local glitch of any
clip. ``max_offset_frames`` bounds the temporal offset B's clips were found at (summary.json's
``alignment``): by default a gate fails on any offset. ``human_threshold`` records a threshold study's result
(:func:`evalkit.study.psychometric.gate_from_analysis` writes it); it gates nothing itself, the
compare report draws it on the metric's per-frame plots. Unknown keys are errors naming the
file and field. An
optional ``schema_version: 1`` may come first. The rules are those of
:class:`evalkit.formats.models.GateFile`.

The metric keys a gate may name come from the caller (:mod:`evalkit.compare` passes those of
:mod:`evalkit.metrics.catalogue`, where the definitions above live): this room reads files and
imports only the core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml
from pydantic import ValidationError

from evalkit.errors import InputFileError, SchemaVersionError
from evalkit.formats.models import GATE_SCHEMA_VERSION, GateFile, first_problem, found, version_problem
from evalkit.formats.yaml_load import problem as yaml_problem
from evalkit.formats.yaml_load import safe_load


class GateError(InputFileError):
    def __init__(self, path, field, problem):
        self.field = field
        super().__init__(path, f"field '{field}': {problem}" if field else problem)


class GateVersionError(GateError, SchemaVersionError):
    """A gate file of a schema version this evalkit cannot read."""


@dataclass
class Gate:
    path: Path
    absolute: dict  # metric -> aggregate -> bound -> value
    ratios: dict  # metric -> aggregate -> bound -> value
    floor: str | None
    max_missing_jobs: int
    #: the ``human_threshold`` block (metric, value, ci, study, safety_factor, criterion,
    #: aggregate, bound) when people set the gate, else None
    human_threshold: dict | None = None
    #: the conventions the thresholds were set under (a report's ``conventions`` entries), or None
    conventions: dict | None = None
    #: the largest temporal offset (frames, either way) a clip of B may be compared at
    max_offset_frames: int = 0

    @property
    def metric_keys(self) -> list[str]:
        """The metrics the gate bounds, absolute or as floor ratios, each once."""
        return list(dict.fromkeys([*self.absolute, *self.ratios]))

    def convention_problem(self, report_conventions: dict) -> tuple[str, str] | None:
        """``(field, problem)`` when a report measured under ``report_conventions`` cannot be
        judged by this gate (a convention it records differs, or the report records none)."""
        for key, want in (self.conventions or {}).items():
            got = report_conventions.get(key)
            if got != want:
                shown = "none" if got is None else repr(got)
                return (
                    f"conventions.{key}",
                    f"the gate was set under {want!r}, the report was "
                    f"measured under {shown} (measure under the gate's conventions, or pass "
                    "--ignore-conventions)",
                )
        return None

    def evaluate(
        self, aggregates: dict, floor_ratios: dict, missing: int, offsets: dict | None = None
    ) -> dict:
        """{"verdict": "pass"|"fail", "reasons": [...], "checks": [...]}. ``offsets``: job ->
        the temporal offset B's clip was compared at (summary.json's ``alignment.shifted``;
        None: not known, no offset check)."""
        checks = []

        def check(label, value, bound, limit):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                ok, shown = False, "undefined"
            else:
                ok = value <= limit if bound == "max" else value >= limit
                shown = f"{value:.6g}"
            checks.append(
                {
                    "check": label,
                    "value": value,
                    bound: limit,
                    "pass": ok,
                    "text": f"{label} = {shown} ({'<=' if bound == 'max' else '>='} {limit:g})",
                }
            )

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
                        check(f"{metric} {agg} / {name} floor", ratios.get(metric, {}).get(agg), bound, limit)
        ok_missing = missing <= self.max_missing_jobs
        checks.append(
            {
                "check": "jobs not compared",
                "value": missing,
                "max": self.max_missing_jobs,
                "pass": ok_missing,
                "text": f"jobs not compared = {missing} (<= {self.max_missing_jobs})",
            }
        )
        if offsets is not None:
            moved = {j: int(o) for j, o in offsets.items() if o}
            big = max((abs(o) for o in moved.values()), default=0)
            ok = big <= self.max_offset_frames
            named = ", ".join(f"{j} {o:+d}" for j, o in moved.items())
            checks.append(
                {
                    "check": "temporal offset",
                    "value": big,
                    "max": self.max_offset_frames,
                    "pass": ok,
                    "offsets": moved,
                    "text": f"temporal offset = {big} frame{'' if big == 1 else 's'} "
                    f"(<= {self.max_offset_frames})" + (f": {named}" if moved else ""),
                }
            )
        failed = [c["text"] for c in checks if not c["pass"]]
        out = {
            "verdict": "fail" if failed else "pass",
            "reasons": failed,
            "checks": checks,
            "gate_file": str(self.path),
        }
        if self.human_threshold is not None:
            out["human_threshold"] = dict(self.human_threshold)
        return out


def load_gate(path, *, metrics: Sequence[str], ratio_metrics: Sequence[str]) -> Gate:
    """Read and check a gate YAML (:class:`~evalkit.formats.models.GateFile`). ``metrics``: the
    keys absolute thresholds may name; ``ratio_metrics``: those ``floor_ratio`` thresholds may
    name (in the order error messages list them; :mod:`evalkit.compare` passes the catalogue's
    ``keys(compares=True)`` and ``keys(ratio=True)``)."""
    path = Path(path)
    if not path.is_file():
        raise GateError(path, None, "file not found (expected a gate YAML)")
    try:
        doc = safe_load(path.read_bytes())
    except yaml.YAMLError as e:
        raise GateError(path, None, yaml_problem(e)) from None
    if not isinstance(doc, dict) or not doc:
        raise GateError(path, None, f"expected a mapping of thresholds, found {found(doc)}")
    problem = version_problem(doc, GATE_SCHEMA_VERSION, default=GATE_SCHEMA_VERSION)
    if problem:
        raise GateVersionError(path, "schema_version", problem)
    try:
        model = GateFile.model_validate(
            doc, context={"metrics": tuple(metrics), "ratio_metrics": tuple(ratio_metrics)}
        )
    except ValidationError as e:
        raise GateError(path, *first_problem(e)) from None
    # pydantic has made every limit a float (35 -> 35.0); the mappings keep the file's order
    human = model.human_threshold.model_dump() if model.human_threshold is not None else None
    return Gate(
        path,
        model.metrics,
        model.floor_ratio or {},
        model.floor,
        model.max_missing_jobs,
        human,
        model.conventions,
        model.max_offset_frames,
    )
