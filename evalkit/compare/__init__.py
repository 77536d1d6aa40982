"""The compare flow: two run folders (and noise-floor runs) measured on one device into a report.

- :mod:`.run`: ``compare_runs``, the front door: check, measure, floors, summary
- :mod:`.options`: ``MetricOptions``, the stream metrics' settings of a compare
- :mod:`.pairing`: pairing jobs by id, measuring each pair
- :mod:`.aggregate`: per-metric aggregates and floor ratios (pure)
- :mod:`.report`: the report folder (frames.csv, clips.csv, summary.json, index.html)
- :mod:`.clips`: ``evalkit metrics A B``, two clips without run folders
"""

from evalkit.compare.options import MetricOptions
from evalkit.compare.pairing import measure_pair
from evalkit.compare.run import compare_runs

__all__ = ["MetricOptions", "compare_runs", "measure_pair"]
