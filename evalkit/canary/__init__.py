"""The canary: a small video-to-video latent diffusion pipeline trained and shipped with evalkit.

Weights live in ``models/canary/`` at the repository root (diffusers ``save_pretrained``
layout; an installed wheel carries the same folder as ``evalkit/models/canary/``, and
``MODEL_DIR`` points at whichever is there). Importing this package registers the pipeline class with diffusers, so that after
``import evalkit.canary`` both ``CanaryPipeline.from_pretrained(path)`` and
``diffusers.DiffusionPipeline.from_pretrained(path)`` load it (no network is touched; the
components are declared as ``["evalkit.canary", "<Class>"]`` in ``model_index.json``).

See ``models/canary/README.md`` (the model card) for data, training, figures and limits.
"""

from __future__ import annotations

from pathlib import Path

import diffusers
from diffusers import DDIMScheduler
from diffusers.configuration_utils import ConfigMixin
from diffusers.models.modeling_utils import ModelMixin
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from ..fsutil import canary_model_dir
from .models import CanaryAutoencoder, CanaryTextEncoder, CanaryUNet, PromptError
from .pipeline import CanaryPipeline, CanaryPipelineOutput
from .styles import STYLES, apply_style, apply_style_frames

#: The shipped pipeline folder: ``evalkit/models/canary`` inside the installed package, or
#: ``models/canary`` at the root of the repository checkout (see :func:`evalkit.fsutil.canary_model_dir`).
MODEL_DIR = canary_model_dir()

# diffusers records a component as (library, class) with library = the class's module; point it
# at this package so model_index.json reads ["evalkit.canary", "CanaryUNet"].
for _cls in (CanaryAutoencoder, CanaryTextEncoder, CanaryUNet, CanaryPipeline):
    _cls.__module__ = __name__
# DiffusionPipeline.from_pretrained looks the pipeline class up by name in the diffusers module.
setattr(diffusers, "CanaryPipeline", CanaryPipeline)

# load_sub_model finds the load method through these names in the component's library module.
__all__ = [
    "MODEL_DIR",
    "STYLES",
    "CanaryAutoencoder",
    "CanaryPipeline",
    "CanaryPipelineOutput",
    "CanaryTextEncoder",
    "CanaryUNet",
    "ConfigMixin",
    "DDIMScheduler",
    "ModelMixin",
    "PromptError",
    "SchedulerMixin",
    "apply_style",
    "apply_style_frames",
    "load_pipeline",
]


def load_pipeline(path: str | Path | None = None, device: str = "cpu", dtype=None):
    """Load the shipped canary pipeline (``models/canary``) onto ``device`` in ``dtype``."""
    import torch

    path = Path(path) if path is not None else MODEL_DIR
    if not (path / "model_index.json").is_file():
        from ..errors import InputFileError

        raise InputFileError(path, "no model_index.json: not a canary pipeline folder")
    pipe = CanaryPipeline.from_pretrained(
        str(path), torch_dtype=dtype or torch.float32, local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
