"""Executors that run the render and compare flows' work elsewhere than this process.

- :mod:`.ray`: the Ray executor (optional extra): renders jobs and measures pairs on a cluster,
  handing the results back to the render driver and the compare loop of this process.
"""
