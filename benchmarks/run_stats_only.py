"""Run a benchmark that needs only ``evalkit.study.stats`` (numpy and scipy) on a machine
without the rest of evalkit's dependencies: the packages ``evalkit`` and ``evalkit.study`` are
registered empty, then ``stats.py`` is loaded from this checkout and the script is run.

    python benchmarks/run_stats_only.py benchmarks/bench_study_sim.py --sections 10
"""
from __future__ import annotations

import importlib.util
import runpy
import sys
import types
from pathlib import Path

root = Path(__file__).resolve().parents[1]
for name, path in (("evalkit", root / "evalkit"), ("evalkit.study", root / "evalkit" / "study")):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod
spec = importlib.util.spec_from_file_location("evalkit.study.stats",
                                              root / "evalkit" / "study" / "stats.py")
stats = importlib.util.module_from_spec(spec)
sys.modules["evalkit.study.stats"] = stats
spec.loader.exec_module(stats)
sys.modules["evalkit.study"].stats = stats
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
