"""``diffusers`` renderer: any diffusers video-to-video pipeline, local folder or hub id.

Options: ``model`` (required: a folder made by ``save_pretrained`` or a hub id; hub ids need
the model in the local Hugging Face cache on machines without network), ``pipeline_class``
(``module:Class``; default: whatever ``model_index.json`` names, via ``DiffusionPipeline``),
``variant`` (e.g. ``fp16`` weights files).

Each job calls the pipeline the way diffusers' video-to-video pipelines (AnimateDiff, CogVideoX,
Wan) take their inputs::

    pipe(prompt=job.prompt, video=[PIL frames], strength=params["strength"],
         num_inference_steps=params["steps"], guidance_scale=params["guidance"],
         generator=torch.Generator("cpu").manual_seed(seed), output_type="np")

Other job params are passed by their own name when the pipeline's ``__call__`` accepts them.
The CPU generator makes diffusers draw the starting noise on the CPU and move it to the device.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from evalkit.render.renderers.base import JobError, RenderRequest, Renderer, RendererError, import_object, to_uint8_frames

#: job param -> pipeline argument
PARAM_NAMES = {"strength": "strength", "steps": "num_inference_steps",
               "guidance": "guidance_scale"}
_DENOISERS = ("unet", "transformer", "denoiser")


def model_digest(folder: Path, whole_up_to: int = 256 << 20, part: int = 16 << 20) -> str:
    """sha256 identifying a local pipeline folder's contents, so that a run folder is never
    resumed with other weights under the same path: every file's relative path, size and
    content hash (files over ``whole_up_to`` bytes: their first and last ``part`` bytes, which
    keeps the cost bounded for multi-GB checkpoints). README and other ``.md`` files are left
    out (documentation does not change outputs)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".md"):
        size = f.stat().st_size
        fh = hashlib.sha256()
        with open(f, "rb") as fp:
            if size <= whole_up_to:
                for block in iter(lambda: fp.read(1 << 20), b""):
                    fh.update(block)
            else:
                fh.update(fp.read(part))
                fp.seek(size - part)
                fh.update(fp.read(part))
        h.update(f"{f.relative_to(folder).as_posix()}\0{size}\0{fh.hexdigest()}\n".encode())
    return h.hexdigest()


class DiffusersRenderer(Renderer):
    name = "diffusers"
    options_help = {
        "model": "folder made by save_pretrained, or a hub id in the local cache",
        "pipeline_class": "module:Class used to load the pipeline (default: from model_index.json)",
        "variant": "weights variant to load, e.g. fp16",
    }

    def __init__(self, **options):
        super().__init__(**options)
        if not self.options.get("model"):
            raise RendererError(f"renderer {self.name!r}: option 'model' is required "
                                "(--renderer-opt model=PATH_OR_HUB_ID)")
        self.pipe = None
        self._accepts: set[str] = set()
        self._var_kw = False

    def describe(self) -> dict:
        import diffusers

        d = super().describe()
        d["version"] = f"diffusers {diffusers.__version__}"
        d["model"] = str(self.options["model"])
        folder = Path(str(self.options["model"]))
        index = folder / "model_index.json"
        if index.is_file():
            import hashlib

            d["model_index_sha256"] = hashlib.sha256(index.read_bytes()).hexdigest()
            d["model_sha256"] = model_digest(folder)
        return d

    def _pipeline_class(self):
        target = self.options.get("pipeline_class")
        if not target:
            from diffusers import DiffusionPipeline

            return DiffusionPipeline
        return import_object(target, f"renderer {self.name!r}: option pipeline_class")

    def load(self, runtime) -> None:
        super().load(runtime)
        model = str(self.options["model"])
        local = Path(model)
        if (model.startswith((".", "/", "~")) or local.exists()) and not (local / "model_index.json").is_file():
            raise RendererError(f"{local}: not a diffusers pipeline folder (no model_index.json)")
        from diffusers.utils import deprecation_utils, logging as dlogging

        # diffusers >= 0.42 renamed torch_dtype to dtype
        dtype_key = "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"
        kwargs = {dtype_key: runtime.dtype}
        if self.options.get("variant"):
            kwargs["variant"] = self.options["variant"]
        verbosity = dlogging.get_verbosity()
        dlogging.set_verbosity_error()       # our own progress bars; no loading chatter
        dlogging.disable_progress_bar()
        try:
            pipe = self._pipeline_class().from_pretrained(model, **kwargs)
        except (OSError, ValueError) as e:
            raise RendererError(f"renderer {self.name!r}: cannot load {model!r}: "
                                f"{str(e).strip().splitlines()[0]}") from None
        finally:
            dlogging.set_verbosity(verbosity)
            dlogging.enable_progress_bar()
        pipe.to(runtime.device)
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)
        if runtime.compile:
            import torch

            for attr in _DENOISERS:
                if getattr(pipe, attr, None) is not None:
                    setattr(pipe, attr, torch.compile(getattr(pipe, attr)))
        self.pipe = pipe
        params = inspect.signature(pipe.__call__).parameters
        self._accepts = set(params)
        self._var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def _kwargs(self, request: RenderRequest) -> dict:
        from PIL import Image

        kwargs = {"prompt": request.job.prompt,
                  "video": [Image.fromarray(f) for f in request.source],
                  "generator": request.generator(), "output_type": "np"}
        for key, value in request.job.params.items():
            arg = PARAM_NAMES.get(key, key)
            if arg not in self._accepts and not self._var_kw:
                raise JobError(f"params.{key}: the pipeline {type(self.pipe).__name__} takes no "
                               f"argument {arg!r}")
            kwargs[arg] = value
        total = int(kwargs.get("num_inference_steps", 0) or 0)
        if "callback_on_step_end" in self._accepts:
            def on_step(pipe, step, timestep, callback_kwargs):
                # strength < 1 runs fewer steps than asked; pipelines record how many
                request.progress(step + 1, getattr(pipe, "_num_timesteps", None) or total)
                return callback_kwargs

            kwargs["callback_on_step_end"] = on_step
        return kwargs

    def render(self, request: RenderRequest) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.pipe(**self._kwargs(request))
        frames = getattr(out, "frames", None)
        if frames is None:
            frames = out[0] if isinstance(out, (tuple, list)) else out
        # diffusers returns a batch of videos: (B, N, H, W, 3) arrays or tensors, or a list of
        # videos (each a list of PIL images or an (N, H, W, 3) array); we asked for one
        if isinstance(frames, (list, tuple)) and frames and (
                isinstance(frames[0], (list, tuple)) or getattr(frames[0], "ndim", 0) == 4):
            frames = frames[0]
        elif getattr(frames, "ndim", 0) == 5:
            frames = frames[0]
        return to_uint8_frames(frames, what=f"{type(self.pipe).__name__} output")

    def unload(self) -> None:
        self.pipe = None
        super().unload()
