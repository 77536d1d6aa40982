"""``benchmarks/render_trace.py`` (``bench_render.py --trace``): it times the harness's own work
during a real render and puts every function back afterwards; its report splits the time
outside the pipeline calls into stretches and says what each waited for."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from conftest import DATASETS

from evalkit.render import clipwriter, driver
from evalkit.render.driver import render_suite
from evalkit.testing.renderers import Invert

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from render_trace import TIMED, Trace, _owner  # noqa: E402


def test_report_splits_the_time_outside_the_calls():
    t = Trace()
    t.events[:] = [
        ("decode", "s0", 0.01, 0.05),
        ("clip", "e0", 0.30, 0.34),
        ("browser", "e1", 0.30, 0.36),
        ("decode", "s0", 0.31, 0.40),
        ("save", "Main", 0.41, 0.42),
        ("decode", "s1", 0.50, 0.60),
    ]
    calls = [(0.05, 0.30), (0.42, 0.70)]
    head, gap, tail, inside = t.report(0.0, 0.80, calls)
    assert head.startswith("head (0.000 s): 0.050 s") and "decode x1 0.040-0.040" in head
    assert gap.startswith("gap after call 1 (0.300 s): 0.120 s")
    assert "decode x1 0.090-0.090 s (sum 0.090), first starts +0.010, last ends +0.100" in gap
    assert "clip x1" in gap and "browser x1" in gap and "save x1" in gap
    assert tail.startswith("tail (0.700 s): 0.100 s") and "decode" not in tail
    assert inside == "started during a call: decode x1"


def test_a_traced_render_records_its_work_and_leaves_everything_as_it_was(tmp_path):
    before = {(m, p): inspect.getattr_static(*_owner(m, p)) for m, p, _ in TIMED if _has(m, p)}
    assert isinstance(inspect.getattr_static(clipwriter.ClipWriter, "write_browser"), staticmethod)
    t = Trace()
    t.on()
    try:
        [s] = render_suite(
            DATASETS / "smoke" / "suite.yaml", ["cpu"], tmp_path / "o", renderer=Invert(), progress=False
        )
    finally:
        t.off()
    assert s.done > 0 and s.failed == 0
    kinds = {e[0] for e in t.events}
    assert {"decode", "clip", "browser", "record", "save"} <= kinds
    assert sum(e[0] == "record" for e in t.events) == s.done
    assert all(b >= a for _, _, a, b in t.events)
    after = {(m, p): inspect.getattr_static(*_owner(m, p)) for m, p in before}
    assert after == before and driver._record is before[("evalkit.render.driver", "_record")]


def _has(module, path) -> bool:
    try:
        inspect.getattr_static(*_owner(module, path))
        return True
    except (ImportError, AttributeError):
        return False
