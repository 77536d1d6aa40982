"""The render flow: a suite's jobs rendered on one or more backends into run folders.

- :mod:`.backend`: backend specs (``cuda,dtype=bf16,...``), applying them, machine fingerprints
- :mod:`.driver`: the job loop (resume, atomic writes, results recorded)
- :mod:`.local_executor`: the local executor (and the executor interface); :mod:`.sources`:
  the jobs' source clips; :mod:`.progress`: the bars; :mod:`.results`: the types handed over
- the Ray executor (optional extra) is :mod:`evalkit.executor.ray`
- :mod:`.renderers`: one file per renderer (base protocol, diffusers, canary, command, import)
"""

__all__ = ["render_suite", "run_dir_name"]


def __getattr__(name: str):
    """``render_suite`` and ``run_dir_name`` from :mod:`.driver`, imported on first use (the
    package imports nothing heavy until a render needs it)."""
    if name in __all__:
        from evalkit.render import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
