"""The compare flow: two run folders (and noise-floor runs) measured on one device into a report.

- :mod:`.pairing`: pairing jobs by id, measuring each pair, floors and the gate
- :mod:`.aggregate`: per-metric aggregates and floor ratios (pure)
- :mod:`.report`: the report folder (frames.csv, clips.csv, summary.json, index.html)
- :mod:`.clips`: ``evalkit metrics A B``, two clips without run folders
"""
from evalkit.compare.pairing import compare_runs, measure_pair

__all__ = ["compare_runs", "measure_pair"]
