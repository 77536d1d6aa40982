"""``canary`` renderer: the built-in reference pipeline shipped in ``models/canary``.

A shortcut for ``--renderer diffusers --renderer-opt model=models/canary``; the pipeline class
lives in :mod:`evalkit.canary`. The folder is found by :func:`evalkit.fsutil.canary_model_dir`
(the copy inside the installed package, else the repository checkout).
"""

from __future__ import annotations

from pathlib import Path

from evalkit.fsutil import canary_model_dir
from evalkit.render.renderers.base import RendererError
from evalkit.render.renderers.diffusers import DiffusersRenderer

MODEL_DIR = canary_model_dir()


class CanaryRenderer(DiffusersRenderer):
    name = "canary"
    options_help = {"model": f"pipeline folder (default: {MODEL_DIR})"}

    def __init__(self, **options):
        options.setdefault("model", str(MODEL_DIR))
        super().__init__(**options)

    def load(self, runtime) -> None:
        if not (Path(self.options["model"]) / "model_index.json").is_file():
            raise RendererError(
                f"{self.options['model']}: the canary pipeline is not there (expected model_index.json)"
            )
        try:
            import evalkit.canary  # noqa: F401  registers the pipeline classes
        except ImportError as e:
            raise RendererError(f"renderer 'canary': cannot import evalkit.canary ({e})") from None
        super().load(runtime)
