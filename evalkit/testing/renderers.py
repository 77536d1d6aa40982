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
    options_help = {"sleep": "seconds to sleep per job", "bad": "failure mode for prompt 'bad'",
                    "wait_for": "a file: each job waits until it exists (holds a render mid-run)"}

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
        noise = torch.randint(0, 3, request.source.shape, generator=request.generator())
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
            out[:, h // 4:3 * h // 4, w // 4:3 * w // 4] += int(self.options.get("amount", 24))
        return np.clip(out, 0, 255).astype(np.uint8)
