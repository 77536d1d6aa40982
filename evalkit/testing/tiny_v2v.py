"""A tiny diffusers video-to-video pipeline built from configs (random weights, no download).

Structure of the real ones, in miniature: a UNet denoiser conditioned on the prompt (a class
embedding from a hash of the prompt), a DDIM scheduler, strength (start step), classifier-free
guidance, and starting noise drawn with the caller's CPU generator (``randn_tensor``), shared by
all frames.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from diffusers import DDIMScheduler, DiffusionPipeline, UNet2DModel
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

NUM_CLASSES = 16


class TinyOutput(BaseOutput):
    frames: np.ndarray


class TinyVideoToVideoPipeline(DiffusionPipeline):
    def __init__(self, unet: UNet2DModel, scheduler: DDIMScheduler):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)

    @torch.no_grad()
    def __call__(
        self,
        prompt,
        video,
        strength=0.6,
        num_inference_steps=4,
        guidance_scale=2.0,
        generator=None,
        output_type="np",
        callback_on_step_end=None,
    ):
        device, dtype = self.unet.device, self.unet.dtype
        src = torch.from_numpy(np.stack([np.asarray(f) for f in video])).permute(0, 3, 1, 2)
        src = (src.float() / 127.5 - 1).to(device, dtype)
        n = src.shape[0]
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        start = int(num_inference_steps * (1 - strength))
        timesteps = self.scheduler.timesteps[start:]
        noise = randn_tensor((1, *src.shape[1:]), generator=generator, device=device, dtype=dtype)
        x = self.scheduler.add_noise(src, noise.expand_as(src), timesteps[:1].repeat(n))
        label = zlib.crc32(prompt.encode()) % (NUM_CLASSES - 1) + 1
        labels = torch.tensor([label] * n + [0] * n, device=device)
        for i, t in enumerate(timesteps):
            eps = self.unet(torch.cat([x, x]), t, class_labels=labels).sample
            cond, uncond = eps.chunk(2)
            eps = uncond + guidance_scale * (cond - uncond)
            x = self.scheduler.step(eps, t, x).prev_sample
            if callback_on_step_end is not None:
                callback_on_step_end(self, i, t, {})
        frames = (x.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
        return TinyOutput(frames=frames[None])


def build(path) -> None:
    """Make the pipeline from configs with seeded random weights and save it to ``path``."""
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        num_class_embeds=NUM_CLASSES,
    )
    pipe = TinyVideoToVideoPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=100))
    pipe.save_pretrained(path)
