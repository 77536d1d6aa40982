"""``diffusers`` renderer: any diffusers video-to-video pipeline, local folder or hub id.

Options: ``model`` (required: a folder made by ``save_pretrained`` or a hub id; hub ids need
the model in the local Hugging Face cache on machines without network), ``pipeline_class``
(``module:Class``; default: whatever ``model_index.json`` names, via ``DiffusionPipeline``),
``variant`` (e.g. ``fp16`` weights files), and the memory and attention options of
:attr:`DiffusersRenderer.options_help` (all recorded in the manifest with the other options).

Each job calls the pipeline the way its family takes inputs
(:mod:`evalkit.render.renderers.diffusers_families`: Wan, Wan VACE, CogVideoX, LTX-Video,
SkyReels-V2, AnimateDiff); any other pipeline is called the generic way::

    pipe(prompt=job.prompt, video=[PIL frames], strength=params["strength"],
         num_inference_steps=params["steps"], guidance_scale=params["guidance"],
         generator=torch.Generator("cpu").manual_seed(seed), output_type="np")

Other job params are passed by their own name when the pipeline's ``__call__`` accepts them.
The CPU generator makes diffusers draw the starting noise on the CPU and move it to the device.
Each job's manifest record holds ``pipeline_call`` (the plain-valued arguments), ``attention``
(what computed attention) and ``memory`` (offload and VAE options in effect).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from evalkit.errors import UserError
from evalkit.render.renderers import diffusers_families as families
from evalkit.render.renderers.base import (
    JobError,
    Renderer,
    RendererError,
    RenderRequest,
    import_object,
    to_uint8_frames,
)

#: job param -> pipeline argument
PARAM_NAMES = families.PARAM_NAMES
_DENOISERS = ("unet", "transformer", "transformer_2", "denoiser")
#: backend spec ``attn`` -> diffusers' attention-dispatcher backend (PyTorch SDPA kernels)
DISPATCH_BACKENDS = {
    "auto": "native",
    "flash": "_native_flash",
    "efficient": "_native_efficient",
    "math": "_native_math",
    "cudnn": "_native_cudnn",
}
_OFFLOAD = ("0", "1", "model", "sequential")
_FLAGS = ("0", "1")


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


def _free_sdpa(pipe) -> list[str]:
    """Let the pipeline's models other than its denoisers choose their SDPA kernel: their
    ``forward``/``encode``/``decode`` run under ``sdpa_kernel(<every kernel>)``, which overrides
    the backend's restriction inside them. Returns the components so wrapped."""
    import functools

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    every = [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ]
    done = []
    for name, comp in getattr(pipe, "components", {}).items():
        if name in _DENOISERS or not isinstance(comp, torch.nn.Module):
            continue
        for method in ("forward", "encode", "decode"):
            fn = getattr(comp, method, None)
            if fn is None or getattr(fn, "_evalkit_free_sdpa", False):
                continue

            def wrapped(*args, _fn=fn, **kwargs):
                with sdpa_kernel(every):
                    return _fn(*args, **kwargs)

            functools.update_wrapper(wrapped, fn)
            wrapped._evalkit_free_sdpa = True
            setattr(comp, method, wrapped)
        done.append(name)
    return done


class DiffusersRenderer(Renderer):
    name = "diffusers"
    options_help = {
        "model": "folder made by save_pretrained, or a hub id in the local cache",
        "pipeline_class": "module:Class used to load the pipeline (default: from model_index.json)",
        "variant": "weights variant to load, e.g. fp16",
        "cpu_offload": "0 (default), 1 or model: enable_model_cpu_offload; sequential: "
        "enable_sequential_cpu_offload (slowest, least device memory)",
        "vae_tiling": "1: decode/encode the VAE in tiles (vae.enable_tiling)",
        "vae_slicing": "1: decode/encode the VAE one video at a time (vae.enable_slicing)",
        "attention_backend": "a diffusers attention-dispatcher backend (e.g. flash, sage, "
        "_native_cudnn) for families that dispatch (Wan, SkyReels, LTX); "
        "default: the PyTorch SDPA kernel of the backend's attn key",
    }

    def __init__(self, **options):
        super().__init__(**options)
        if not self.options.get("model"):
            raise RendererError(
                f"renderer {self.name!r}: option 'model' is required (--renderer-opt model=PATH_OR_HUB_ID)"
            )
        if "variant" in self.options and not str(self.options["variant"]).strip():
            raise RendererError(
                f"renderer {self.name!r}: option variant: expected a weights "
                "variant such as fp16, found an empty value (leave the option "
                "out for the default weights)"
            )
        for key, allowed in (("cpu_offload", _OFFLOAD), ("vae_tiling", _FLAGS), ("vae_slicing", _FLAGS)):
            if key in self.options:
                value = self.options[key] = str(self.options[key]).lower()
                if value not in allowed:
                    raise RendererError(
                        f"renderer {self.name!r}: option {key}={value!r} is not one of {', '.join(allowed)}"
                    )
        backend = self.options.get("attention_backend")
        if backend:
            from diffusers.models.attention_dispatch import AttentionBackendName

            names = [b.value for b in AttentionBackendName]
            if backend not in names:
                raise RendererError(
                    f"renderer {self.name!r}: option attention_backend="
                    f"{backend!r} is not a diffusers attention backend (one of "
                    f"{', '.join(names)})"
                )
        self.pipe = None
        self.family: families.Family | None = None
        self._accepts: set[str] = set()
        self._var_kw = False
        self._attention: dict = {}
        self._memory: dict = {}
        self._last_call: dict = {}

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
        cls = self._resolved_class()
        if cls is not None:
            fam = families.family_for(cls)
            d["pipeline"] = cls.__name__
            d["family"] = fam.name if fam else "generic"
        return d

    def _pipeline_class(self):
        target = self.options.get("pipeline_class")
        if not target:
            from diffusers import DiffusionPipeline

            return DiffusionPipeline
        return import_object(target, f"renderer {self.name!r}: option pipeline_class")

    def _resolved_class(self):
        """The pipeline class that will load, known without loading weights (None: a hub id
        whose model_index.json is not local)."""
        if self.options.get("pipeline_class"):
            return self._pipeline_class()
        index = Path(str(self.options["model"])) / "model_index.json"
        if not index.is_file():
            return None
        import json

        import diffusers

        try:
            name = json.loads(index.read_text()).get("_class_name")
        except (OSError, ValueError):
            return None
        return getattr(diffusers, str(name), None)

    def check_jobs(self, suite, jobs) -> None:
        """Before anything loads: refuse jobs whose clip the family cannot take (frame count,
        size) or whose params the pipeline does not take."""
        cls = self._resolved_class()
        if cls is None:
            return
        fam = families.family_for(cls)
        if fam is None:
            return
        if self.options.get("attention_backend") and not fam.dispatcher:
            raise RendererError(self._no_dispatcher(cls.__name__))
        from evalkit.video import ClipReader, VideoError

        info = {}
        for clip_id in dict.fromkeys(j.clip for j in jobs):
            path = suite.clips[clip_id].path
            try:
                reader = ClipReader(path)
                info[clip_id] = (reader.count_frames(), reader.info.height, reader.info.width)
            except VideoError as e:
                raise UserError(str(e)) from None
        params = inspect.signature(cls.__call__).parameters
        families.check_jobs(
            fam, cls.__name__, jobs, info, set(params), any(p.kind is p.VAR_KEYWORD for p in params.values())
        )

    def load(self, runtime) -> None:
        super().load(runtime)
        model = str(self.options["model"])
        local = Path(model)
        if (model.startswith((".", "/", "~")) or local.exists()) and not (
            local / "model_index.json"
        ).is_file():
            raise RendererError(f"{local}: not a diffusers pipeline folder (no model_index.json)")
        from diffusers.utils import DummyObject, deprecation_utils
        from diffusers.utils import logging as dlogging

        cls = self._resolved_class()
        if isinstance(cls, DummyObject):  # diffusers' stand-in for a class missing a package
            raise RendererError(
                f"renderer {self.name!r}: {model}: {cls.__name__} needs "
                f"{' and '.join(getattr(cls, '_backends', []))}: "
                "pip install 'evalkit[video-families]'"
            )

        # diffusers >= 0.42 renamed torch_dtype to dtype
        dtype_key = "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"
        kwargs = {dtype_key: runtime.dtype}
        if self.options.get("variant"):
            kwargs["variant"] = self.options["variant"]
        verbosity = dlogging.get_verbosity()
        dlogging.set_verbosity_error()  # our own progress bars; no loading chatter
        dlogging.disable_progress_bar()
        try:  # the video-families extra: only pipelines with text encoders need transformers
            from transformers.utils import logging as tlogging
        except ImportError:
            tlogging = None
        if tlogging is not None:
            tlogging.disable_progress_bar()
        try:
            pipe = self._pipeline_class().from_pretrained(model, **kwargs)
        except (OSError, ValueError) as e:
            raise RendererError(
                f"renderer {self.name!r}: cannot load {model!r}: {str(e).strip().splitlines()[0]}"
            ) from None
        except ImportError as e:
            raise RendererError(
                f"renderer {self.name!r}: cannot load {model!r}: "
                f"{str(e).strip().splitlines()[0]} (pipelines with text encoders "
                f"need pip install 'evalkit[video-families]')"
            ) from None
        finally:
            dlogging.set_verbosity(verbosity)
            dlogging.enable_progress_bar()
            if tlogging is not None:
                tlogging.enable_progress_bar()
        self.setup(pipe, runtime)

    def setup(self, pipe, runtime) -> None:
        """Place a loaded pipeline on the backend's device with the memory and attention
        options (a benchmark that builds its pipeline in memory calls this directly)."""
        self.runtime = runtime
        self._memory = self._place(pipe, runtime)
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)
        self._attention = self._set_attention(pipe, runtime)
        if runtime.compile:
            import torch

            for attr in _DENOISERS:
                if getattr(pipe, attr, None) is not None:
                    setattr(pipe, attr, torch.compile(getattr(pipe, attr)))
        self.pipe = pipe
        self.family = families.family_for(type(pipe))
        params = inspect.signature(pipe.__call__).parameters
        self._accepts = set(params)
        self._var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def _place(self, pipe, runtime) -> dict:
        offload = self.options.get("cpu_offload", "0")
        mem = {"cpu_offload": {"0": "off", "1": "model"}.get(offload, offload)}
        if offload == "0" or runtime.device.type == "cpu":
            if offload != "0":
                mem["cpu_offload"] = "off (the device is the CPU)"
            pipe.to(runtime.device)
        elif offload == "sequential":
            pipe.enable_sequential_cpu_offload(device=runtime.device)
        else:
            pipe.enable_model_cpu_offload(device=runtime.device)
        vae = getattr(pipe, "vae", None)
        for key, method in (("vae_tiling", "enable_tiling"), ("vae_slicing", "enable_slicing")):
            if self.options.get(key, "0") == "1":
                if vae is None or not hasattr(vae, method):
                    raise RendererError(
                        f"renderer {self.name!r}: option {key}=1: the pipeline's "
                        f"VAE ({type(vae).__name__}) has no {method}()"
                    )
                getattr(vae, method)()
            mem[key] = "on" if self.options.get(key, "0") == "1" else "off"
        return mem

    def _set_attention(self, pipe, runtime) -> dict:
        """Route the spec's ``attn`` (or the attention_backend option) to what each denoiser
        uses: diffusers' dispatcher where its attention processors dispatch, PyTorch's SDPA
        kernel choice (set by the backend) where they call SDPA directly."""
        attn = runtime.spec.attn
        wanted = self.options.get("attention_backend")
        out = {"spec_attn": attn, "sdpa_kernels": "PyTorch's choice" if attn == "auto" else attn}
        if attn != "auto":
            # the spec's kernel is for the denoiser; text encoders and VAEs (masked attention,
            # head sizes over 256 that flash attention cannot take) keep PyTorch's choice
            others = _free_sdpa(pipe)
            if others:
                out["sdpa_kernels_elsewhere"] = {name: "PyTorch's choice" for name in others}
        dispatching = []
        for attr in _DENOISERS:
            model = getattr(pipe, attr, None)
            if model is None or not hasattr(model, "attn_processors"):
                continue
            procs = list(model.attn_processors.values())
            kinds = sorted({type(p).__name__ for p in procs})
            uses = [p for p in procs if hasattr(p, "_attention_backend")]
            entry = {"processors": kinds}
            if uses and hasattr(model, "set_attention_backend"):
                name = wanted or DISPATCH_BACKENDS[attn]
                try:
                    model.set_attention_backend(name)
                except (ValueError, RuntimeError, ImportError) as e:
                    raise RendererError(
                        f"renderer {self.name!r}: attention backend {name!r} "
                        f"for the {attr}: {str(e).strip().splitlines()[0]}"
                    ) from None
                entry["dispatcher"] = name
                dispatching.append(attr)
            else:
                entry["dispatcher"] = None
                entry["calls"] = "torch.nn.functional.scaled_dot_product_attention"
            out[attr] = entry
        if wanted and not dispatching:
            raise RendererError(self._no_dispatcher(type(pipe).__name__))
        return out

    def _no_dispatcher(self, pipeline: str) -> str:
        return (
            f"renderer {self.name!r}: option attention_backend="
            f"{self.options['attention_backend']!r}: {pipeline}'s attention does not go "
            "through diffusers' dispatcher (it calls PyTorch SDPA; use the backend spec's "
            "attn= key)"
        )

    def job_info(self) -> dict:
        """What the manifest records with each job: the call, attention and memory."""
        return {
            "pipeline_call": dict(self._last_call),
            "attention": dict(self._attention),
            "memory": dict(self._memory),
        }

    def _kwargs(self, request: RenderRequest) -> dict:
        for key in request.job.params:
            arg = PARAM_NAMES.get(key, key)
            if key == "strength" and self.family is not None:
                if self.family.strength_arg is None:
                    raise JobError(f"params.strength: {type(self.pipe).__name__} takes no strength")
                continue
            if arg not in self._accepts and not self._var_kw:
                raise JobError(
                    f"params.{key}: the pipeline {type(self.pipe).__name__} takes no argument {arg!r}"
                )
        kwargs, self._last_call = families.call_kwargs(
            self.family,
            self.pipe,
            request.source,
            request.job.prompt,
            request.job.params,
            request.generator(),
        )
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

        self._last_call = {}
        try:
            with torch.inference_mode():
                out = self.pipe(**self._kwargs(request))
        except torch.OutOfMemoryError as e:
            raise JobError(self._oom_message(request, e)) from None
        frames = getattr(out, "frames", None)
        if frames is None:
            frames = out[0] if isinstance(out, (tuple, list)) else out
        # diffusers returns a batch of videos: (B, N, H, W, 3) arrays or tensors, or a list of
        # videos (each a list of PIL images or an (N, H, W, 3) array); we asked for one
        if (
            isinstance(frames, (list, tuple))
            and frames
            and (isinstance(frames[0], (list, tuple)) or getattr(frames[0], "ndim", 0) == 4)
        ):
            frames = frames[0]
        elif getattr(frames, "ndim", 0) == 5:
            frames = frames[0]
        frames = families.output_frames(self.family, frames, len(request.source))
        return to_uint8_frames(frames, what=f"{type(self.pipe).__name__} output")

    def _oom_message(self, request: RenderRequest, e: BaseException) -> str:
        import torch

        dev = self.runtime.device if self.runtime is not None else "the device"
        where = str(dev)
        if getattr(dev, "type", "") == "cuda":
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            peak = torch.cuda.max_memory_allocated(idx)
            where += (
                f" ({props.name}, {props.total_memory / 2**30:.0f} GiB; peak "
                f"{peak / 2**30:.1f} GiB allocated)"
            )
            torch.cuda.empty_cache()
        call = self._last_call
        n = call.get("num_frames", call.get("source_frames", len(request.source)))
        size = f"{call.get('width', request.source.shape[2])}x{call.get('height', request.source.shape[1])}"
        hints = [f"-O {k}=1" for k in ("cpu_offload", "vae_tiling") if self.options.get(k, "0") == "0"]
        return (
            f"out of memory on {where} rendering {n} frames at {size}, "
            f"{self.runtime.spec.dtype if self.runtime else '?'}"
            + (f" (try {', '.join(hints)})" if hints else "")
            + f": {str(e).strip().splitlines()[0][:200]}"
        )

    def unload(self) -> None:
        import gc

        self.pipe = None
        self.family = None
        super().unload()
        gc.collect()  # the SDPA wrappers make reference cycles: free the weights now
