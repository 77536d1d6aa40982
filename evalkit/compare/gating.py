"""Gates on compare reports: the gate a compare checks, and ``evalkit gate`` judging a saved
report again (a changed gate needs no new compare: the verdict reads only ``summary.json``'s
aggregates, floor ratios and jobs not compared, as :meth:`evalkit.formats.gate.Gate.evaluate`
does at the end of a compare).

A gate may record the conventions its thresholds were set under (``conventions:``, the report's
``summary.json["conventions"]`` entries its metrics depend on: :data:`evalkit.metrics.catalogue.CONVENTIONS`);
a report measured under others (tOF with the torch flow against a gate set on DIS) is refused in
one line unless the caller says to ignore them. :func:`pin_conventions` writes them into a gate.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.compare.report import SUMMARY_SCHEMA_VERSION
from evalkit.errors import InputFileError
from evalkit.formats.gate import Gate, GateError, load_gate
from evalkit.formats.models import version_problem
from evalkit.fsutil import atomic_write_text
from evalkit.metrics.catalogue import conventions_of, keys


def open_gate(path) -> Gate:
    """A gate YAML checked against the metrics a compare report holds."""
    return load_gate(path, metrics=keys(compares=True), ratio_metrics=keys(ratio=True))


def check_conventions(gate: Gate, conventions: dict) -> None:
    """GateError (one line naming the gate file and the convention) when the gate records a
    convention the report (or the compare about to run) does not share."""
    problem = gate.convention_problem(conventions)
    if problem is not None:
        raise GateError(gate.path, *problem)


def read_summary(report) -> dict:
    """A compare report's ``summary.json``, its schema version checked; errors name the file."""
    report = Path(report)
    path = report / "summary.json" if report.is_dir() else report
    if not path.is_file():
        raise InputFileError(path, "not found (expected a compare report folder or its summary.json)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputFileError(path, "not a compare summary (JSON nested too deep)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputFileError(path, f"not JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(summary, dict):
        raise InputFileError(path, "expected a compare summary object")
    problem = version_problem(summary, SUMMARY_SCHEMA_VERSION)
    if problem:
        raise InputFileError(path, f"field 'schema_version': {problem}")
    for field, kind in (("aggregates", dict), ("floor_ratios", dict), ("jobs", dict), ("conventions", dict)):
        if not isinstance(summary.get(field), kind):
            raise InputFileError(
                path,
                f"field '{field}': expected an object, found "
                f"{type(summary.get(field)).__name__} (not a compare summary)",
            )
    if not isinstance(summary["jobs"].get("not_compared"), dict):
        raise InputFileError(path, "field 'jobs.not_compared': expected an object")
    _check_figures(path, "aggregates", summary["aggregates"])
    for name, ratios in summary["floor_ratios"].items():
        _check_figures(path, f"floor_ratios.{name}", ratios)
    return summary


def _check_figures(path, field: str, table) -> None:
    """``table`` is ``{metric: {aggregate: number or null}}`` (null: undefined, a NaN); else
    one line naming the first wrong field."""
    if not isinstance(table, dict):
        raise InputFileError(path, f"field '{field}': expected an object, found {type(table).__name__}")
    for metric, aggs in table.items():
        if not isinstance(aggs, dict):
            raise InputFileError(
                path,
                f"field '{field}.{metric}': expected an object of aggregates, found {type(aggs).__name__}",
            )
        for agg, v in aggs.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InputFileError(
                    path,
                    f"field '{field}.{metric}.{agg}': expected a number "
                    f"or null, found {type(v).__name__} {str(v)[:40]!r}",
                )


def judge_report(report, gate_path, *, ignore_conventions: bool = False) -> dict:
    """The verdict of the gate at ``gate_path`` on a saved compare report, as ``compare --gate``
    gives it (``{"verdict", "reasons", "checks", "gate_file"}``)."""
    summary = read_summary(report)
    gate = open_gate(gate_path)
    if gate.ratios and not summary["floor_ratios"]:
        raise GateError(
            gate.path,
            "floor_ratio",
            "the gate sets floor_ratio thresholds but the report has no noise floor (compare with --floor)",
        )
    if gate.ratios and gate.floor and gate.floor not in summary["floor_ratios"]:
        raise GateError(
            gate.path,
            "floor",
            f"no floor {gate.floor!r} in this report (its floors are: {', '.join(summary['floor_ratios'])})",
        )
    missing = [k for k in gate.absolute if k not in summary["aggregates"]]
    if missing:
        raise GateError(
            gate.path,
            missing[0],
            f"the gate checks a metric the report does not hold (compare with --{missing[0]})"
            if missing[0] == "vmaf"
            else "the gate checks a metric the report does not hold",
        )
    if not ignore_conventions:
        check_conventions(gate, summary["conventions"])
    return gate.evaluate(
        summary["aggregates"],
        summary["floor_ratios"],
        len(summary["jobs"]["not_compared"]),
        (summary.get("alignment") or {}).get("shifted") or {},
    )


def pin_conventions(report, gate_path) -> dict:
    """Write into the gate the report's conventions of the metrics it bounds (appended as a
    ``conventions:`` block, the rest of the file kept as written); the mapping written."""
    summary = read_summary(report)
    gate = open_gate(gate_path)
    wanted = [c for c in conventions_of(gate.metric_keys) if c != "vmaf"]
    missing = [c for c in wanted if c not in summary["conventions"]]
    if missing:
        raise InputFileError(
            Path(report),
            f"field 'conventions.{missing[0]}': the report records none (compared without temporal metrics?)",
        )
    pinned = {c: summary["conventions"][c] for c in wanted}
    if gate.conventions is not None:
        raise GateError(gate.path, "conventions", "already recorded; remove the block to pin again")
    text = gate.path.read_text(encoding="utf-8")
    block = "conventions:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in pinned.items())
    # a linked gate is pinned where it lies: the link stays a link (an atomic write replaces
    # the name it is given, which would leave the target unpinned)
    target = gate.path.resolve() if gate.path.is_symlink() else gate.path
    atomic_write_text(target, text + ("" if text.endswith("\n") else "\n") + block)
    open_gate(gate.path)  # what was written reads back
    return pinned
