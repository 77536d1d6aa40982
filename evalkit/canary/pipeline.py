"""CanaryPipeline: video-to-video style transfer with a small latent diffusion model.

Call contract (the same as other diffusers video-to-video pipelines)::

    pipe = CanaryPipeline.from_pretrained("models/canary", torch_dtype=torch.float32)
    pipe.to("cpu")
    out = pipe(prompt="watercolor", video=frames, strength=0.6, num_inference_steps=12,
               guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(0),
               output_type="np")
    out.frames[0]          # (N, H, W, 3) float32 in [0, 1]

Sampling: every frame is encoded to a latent (the source latent); one starting-noise tensor of
one frame's latent shape is drawn on the CPU from ``generator`` (``randn_tensor``) and shared by
all frames (no per-frame noise), then moved to the device and dtype; the source latents are
noised to the first timestep that ``strength`` selects (img2img) and denoised with DDIM
(eta 0), all frames and both halves of the classifier-free-guidance pair in one batch per step.
The denoiser sees the source latent of each frame (InstructPix2Pix-style) and, through
cross-frame attention, the first frame of the clip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.schedulers import DDIMScheduler
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from .models import CanaryAutoencoder, CanaryTextEncoder, CanaryUNet


@dataclass
class CanaryPipelineOutput(BaseOutput):
    """``frames``: a list with one clip, (N, H, W, 3) float32 in [0, 1] for ``output_type="np"``,
    a list of PIL images for ``"pil"``, a (N, 3, H, W) tensor in [0, 1] for ``"pt"``, the final
    latents for ``"latent"``."""

    frames: list


def _to_array(video) -> np.ndarray:
    if isinstance(video, np.ndarray):
        arr = video
    elif torch.is_tensor(video):
        arr = video.detach().cpu().numpy()
    else:
        arr = np.stack([np.asarray(f.convert("RGB") if hasattr(f, "convert") else f) for f in video])
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"video: expected (N, H, W, 3) frames, found shape {arr.shape}")
    if arr.dtype != np.uint8:
        arr = np.clip(np.asarray(arr, np.float32) * (255.0 if arr.max() <= 1.0 else 1.0), 0, 255)
        arr = (arr + 0.5).astype(np.uint8)
    return arr


class CanaryPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->vae->unet->vae"
    _optional_components: list = []

    #: frames per VAE batch (bounds memory at large sizes)
    vae_batch = 32

    def __init__(
        self,
        vae: CanaryAutoencoder,
        text_encoder: CanaryTextEncoder,
        unet: CanaryUNet,
        scheduler: DDIMScheduler,
        guidance_steps: int | None = 2,
    ):
        super().__init__()
        self.register_modules(vae=vae, text_encoder=text_encoder, unet=unet, scheduler=scheduler)
        # the default guidance interval travels in model_index.json (chosen at training time)
        self.register_to_config(guidance_steps=guidance_steps)

    # -- pieces --------------------------------------------------------------------------

    def encode_prompt(self, prompts, device):
        ids = self.text_encoder.tokenize(prompts).to(device)
        return self.text_encoder(ids)

    def encode_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        out = [
            self.vae.encode(pixels[i : i + self.vae_batch]).latents
            for i in range(0, pixels.shape[0], self.vae_batch)
        ]
        return (torch.cat(out) - cfg.shift_factor) * cfg.scaling_factor

    def decode_latents(self, latents: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
        """Latents -> images in [-1, 1]; ``source``: the source frames (N, 3, H, W) in [-1, 1],
        used by a source-conditioned decoder (``vae.config.source_channels``)."""
        cfg = self.vae.config
        z = latents / cfg.scaling_factor + cfg.shift_factor
        use_src = bool(getattr(cfg, "source_channels", 0)) and source is not None
        out = [
            self.vae.decode(
                z[i : i + self.vae_batch], source=source[i : i + self.vae_batch] if use_src else None
            ).sample
            for i in range(0, z.shape[0], self.vae_batch)
        ]
        return torch.cat(out)

    def get_timesteps(self, num_inference_steps: int, strength: float):
        init = min(int(num_inference_steps * strength), num_inference_steps)
        start = max(num_inference_steps - init, 0)
        return self.scheduler.timesteps[start * self.scheduler.order :]

    # -- call ----------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(
        self,
        prompt: str = "",
        video=None,
        strength: float = 0.6,
        num_inference_steps: int = 12,
        guidance_scale: float = 4.0,
        negative_prompt: str | None = None,
        generator: torch.Generator | None = None,
        guidance_steps: int | None | str = "default",
        output_type: str = "np",
        return_dict: bool = True,
        callback_on_step_end=None,
    ):
        if video is None:
            raise ValueError("video: the source frames are required (video-to-video pipeline)")
        if not 0.0 <= strength <= 1.0:
            raise ValueError(f"strength: expected a value in [0, 1], found {strength}")
        if isinstance(prompt, (list, tuple)):
            if len(prompt) != 1:
                raise ValueError("prompt: one prompt per call (one clip)")
            prompt = prompt[0]
        if isinstance(guidance_steps, str):
            if guidance_steps != "default":
                raise ValueError(
                    f"guidance_steps: expected an int, None or 'default', found {guidance_steps!r}"
                )
            guidance_steps = getattr(self.config, "guidance_steps", 2)
        device = self._execution_device
        dtype = self.unet.dtype
        # channels-last convolutions: 1.5-3x faster on CPUs (oneDNN) and good for tensor cores
        cl = torch.channels_last
        self.unet.to(memory_format=cl)
        self.vae.to(memory_format=cl)
        frames = _to_array(video)
        n, height, width, _ = frames.shape
        # pad to a multiple of 16 (4x autoencoder, 2x patch, 2x down) by reflection
        ph, pw = (-height) % 16, (-width) % 16
        pixels = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        if ph or pw:
            pixels = torch.nn.functional.pad(pixels, (0, pw, 0, ph), mode="reflect")
        pixels = pixels.to(device=device, dtype=self.vae.dtype).contiguous(memory_format=cl)

        do_cfg = guidance_scale > 1.0
        prompts = [prompt] + ([negative_prompt or ""] if do_cfg else [])
        text, pooled, mask = self.encode_prompt(prompts, device)
        text, pooled = text.to(dtype), pooled.to(dtype)

        src = self.encode_frames(pixels).to(dtype)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        timesteps = self.get_timesteps(num_inference_steps, strength)

        shape = (1,) + tuple(src.shape[1:])
        noise = randn_tensor(shape, generator=generator, device=torch.device("cpu"), dtype=torch.float32)
        noise = noise.to(device=device, dtype=dtype).expand_as(src).contiguous(memory_format=cl)
        if len(timesteps):
            latents = self.scheduler.add_noise(src, noise, timesteps[:1].repeat(n))
        else:
            latents = src

        if do_cfg:
            # batch: [cond frames..., uncond frames...]; each half is one clip for cross-frame
            text_b = torch.cat([text[:1].expand(n, -1, -1), text[1:].expand(n, -1, -1)])
            pooled_b = torch.cat([pooled[:1].expand(n, -1), pooled[1:].expand(n, -1)])
            mask_b = torch.cat([mask[:1].expand(n, -1), mask[1:].expand(n, -1)])
            src_b = torch.cat([src, src])
        else:
            text_b, pooled_b, mask_b, src_b = (
                text.expand(n, -1, -1),
                pooled.expand(n, -1),
                mask.expand(n, -1),
                src,
            )
        self._num_timesteps = len(timesteps)
        for i, t in enumerate(self.progress_bar(timesteps)):
            if do_cfg and guidance_steps is not None and i == guidance_steps:
                # guidance interval: later steps run the conditional branch alone
                do_cfg = False
                text_b, pooled_b, mask_b, src_b = (t_[:n] for t_ in (text_b, pooled_b, mask_b, src_b))
            model_in = torch.cat([latents, latents]) if do_cfg else latents
            pred = self.unet(model_in, t, src_b, text_b, pooled_b, mask_b, num_frames=n).sample
            if do_cfg:
                cond, uncond = pred.chunk(2)
                pred = uncond + guidance_scale * (cond - uncond)
            latents = self.scheduler.step(pred, t, latents, eta=0.0, return_dict=False)[0]
            if callback_on_step_end is not None:  # diffusers' convention: (pipe, step, t, kwargs)
                callback_on_step_end(self, i, t, {"latents": latents})

        if output_type == "latent":
            result = latents
        else:
            image = self.decode_latents(latents.to(self.vae.dtype), source=pixels)
            image = image[:, :, :height, :width]
            image = (image.float() / 2 + 0.5).clamp(0, 1)
            if output_type == "pt":
                result = image.cpu()
            else:
                arr = image.permute(0, 2, 3, 1).cpu().numpy()
                if output_type == "pil":
                    from PIL import Image

                    result = [Image.fromarray((a * 255 + 0.5).astype(np.uint8)) for a in arr]
                elif output_type == "np":
                    result = arr
                else:
                    raise ValueError(f"output_type: expected np, pil, pt or latent, found {output_type!r}")
        self.maybe_free_model_hooks()
        if not return_dict:
            return ([result],)
        return CanaryPipelineOutput(frames=[result])
