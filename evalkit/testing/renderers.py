"""Renderers for tests of the render harness: a fake transport, no GPU or model needed.

Found by the harness through the ``module:attr`` renderer path (``evalkit.testing.renderers:Invert``).
"""

from __future__ import annotations

import time

import numpy as np

from evalkit.render.renderers import Renderer


class Invert(Renderer):
    """255 - source, plus seed-dependent noise drawn from the request's CPU generator."""

    name = "invert"
    version = "1"
    options_help = {
        "sleep": "seconds to sleep per job",
        "bad": "failure mode for prompt 'bad'",
        "noise": "the seed noise's range, 0 to this - 1 code values (default 3)",
        "wait_for": "a file: each job waits until it exists (holds a render mid-run)",
    }

    def render(self, request):
        import os

        import torch

        time.sleep(float(self.options.get("sleep", 0)))
        while self.options.get("wait_for") and not os.path.exists(self.options["wait_for"]):
            time.sleep(0.02)
        if request.job.prompt == "bad":
            mode = self.options.get("bad", "raise")
            if mode == "raise":
                raise RuntimeError("the pipeline exploded")
            if mode == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
            if mode == "shape":
                return request.source[..., :2]
            if mode == "dtype":
                return request.source.astype(np.float32)
            if mode == "count":
                return request.source[:-1]
        noise = torch.randint(
            0, int(self.options.get("noise", 3)), request.source.shape, generator=request.generator()
        )
        if self.runtime is not None and self.runtime.spec.dtype != "fp32":
            noise = noise + torch.randint(0, 4, request.source.shape, generator=request.generator())
        for i in range(3):
            request.progress(i + 1, 3)
        out = 255 - request.source.astype(np.int16) + noise.numpy().astype(np.int16)
        return np.clip(out, 0, 255).astype(np.uint8)


class Pattern(Renderer):
    """The source on ``fp32``; on any other dtype the source plus a known difference (option
    ``diff``): ``checker`` (+-1 code value on every channel in a one-pixel checkerboard: finer
    than a browser stream's quantizer, which erases it: the delivery-fidelity masking case) or
    ``square`` (+``amount``, default 24, in the clip's central square: a difference any stream
    carries)."""

    name = "pattern"
    version = "1"
    options_help = {"diff": "checker or square", "amount": "square: code values added"}

    def render(self, request):
        out = request.source.astype(np.int16)
        if self.runtime is None or self.runtime.spec.dtype == "fp32":
            return request.source
        h, w = out.shape[1:3]
        if self.options.get("diff", "checker") == "checker":
            yy, xx = np.mgrid[0:h, 0:w]
            out += np.where((yy + xx) % 2 == 0, 1, -1).astype(np.int16)[None, :, :, None]
        else:
            out[:, h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] += int(self.options.get("amount", 24))
        return np.clip(out, 0, 255).astype(np.uint8)


class GpuWork(Renderer):
    """A stand-in video pipeline (``benchmarks/bench_render_scale.py``): per chunk of 16 frames,
    ``steps`` denoising-like steps of 3x3 convolutions (``channels`` wide, in the backend's
    dtype) at 1/8 of the frame size, launched one by one from the Python thread as a diffusion
    loop launches its kernels; returns the source upside down. Fixed work per job."""

    name = "gpu-work"
    version = "1"
    options_help = {
        "steps": "steps per chunk of 16 frames (default 30)",
        "channels": "width of the convolutions (default 320)",
    }

    def load(self, runtime) -> None:
        import torch

        super().load(runtime)
        c = int(self.options.get("channels", 320))
        g = torch.Generator().manual_seed(0)
        self.w_in = (torch.randn(c, 3, 1, 1, generator=g) * 0.5).to(runtime.device, runtime.dtype)
        self.w = [
            (torch.randn(c, c, 3, 3, generator=g) / (3 * c**0.5)).to(runtime.device, runtime.dtype)
            for _ in range(2)
        ]

    def render(self, request):
        import torch
        import torch.nn.functional as F

        device = self.runtime.device
        steps = int(self.options.get("steps", 30))
        src = request.source
        out = np.empty_like(src)
        chunks = range(0, len(src), 16)
        for k, i in enumerate(chunks):
            x = torch.from_numpy(np.ascontiguousarray(src[i : i + 16])).to(device)
            h = F.avg_pool2d(x.permute(0, 3, 1, 2).to(self.w_in.dtype), 8)
            h = F.conv2d(h, self.w_in)
            for s in range(steps):
                r = F.conv2d(F.silu(h), self.w[s % 2], padding=1)
                h = h + 0.1 * r
                h = h * torch.rsqrt(h.pow(2).mean(dim=(1, 2, 3), keepdim=True) + 1e-6)
            keep = (h.float().abs().sum() >= 0).to(torch.uint8)  # 1: the work is waited on
            out[i : i + 16] = (x.flip(1) * keep).cpu().numpy()
            request.progress(k + 1, len(chunks))
        return out
