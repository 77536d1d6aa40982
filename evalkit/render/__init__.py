"""The render flow: a suite's jobs rendered on one or more backends into run folders.

- :mod:`.backend`: backend specs (``cuda,dtype=bf16,...``), applying them, machine fingerprints
- :mod:`.driver`: the job loop (resume, progress, atomic writes) and the local executor
- :mod:`.ray`: the Ray executor (optional extra)
- :mod:`.renderers`: one file per renderer (base protocol, diffusers, canary, command, import)
"""
from evalkit.render.driver import render_suite, run_dir_name

__all__ = ["render_suite", "run_dir_name"]
