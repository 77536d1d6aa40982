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
                    "noise": "the seed noise's range, 0 to this - 1 code values (default 3)",
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
        noise = torch.randint(0, int(self.options.get("noise", 3)), request.source.shape,
                              generator=request.generator())
        if self.runtime is not None and self.runtime.spec.dtype != "fp32":
            noise = noise + torch.randint(0, 4, request.source.shape, generator=request.generator())
        for i in range(3):
            request.progress(i + 1, 3)
        out = 255 - request.source.astype(np.int16) + noise.numpy().astype(np.int16)
        return np.clip(out, 0, 255).astype(np.uint8)
