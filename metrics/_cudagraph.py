"""Replaying a fixed-shape device computation as a CUDA graph (one launch instead of hundreds).

The fused optical flow (:mod:`evalkit.metrics.torchflow`) issues about 350 kernels per batch of frame
pairs, most of them small (the coarse pyramid levels): launching them from Python costs the
thread that feeds the GPU more time than some of them take on it. :class:`GraphCache` captures
such a computation once per input shape (after one eager run, which compiles and loads its
Triton kernels) and replays it afterwards: the same kernels on the same inputs, so the same
numbers bit for bit (``torch.cuda.CUDAGraph``, "CUDA Graphs" in PyTorch's CUDA semantics notes).

The graphs share one memory pool. Each replay's result lives in that pool and is overwritten by
the next replay of any graph: :meth:`GraphCache.run` hands it to a ``sink`` that copies it out
before returning. ``EVALKIT_CUDA_GRAPHS=0`` turns graphs off (eager launches); if a capture
fails on a machine (a driver or kernel that cannot be captured), the cache warns once and runs
eagerly from then on.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from typing import Callable

import torch

#: Shapes kept per cache (least recently used evicted): a stream's chunks give two or three.
MAX_GRAPHS = 4


def graphs_enabled() -> bool:
    """``EVALKIT_CUDA_GRAPHS`` is not ``0`` (read per call, like the other switches)."""
    return os.environ.get("EVALKIT_CUDA_GRAPHS", "1") != "0"


class GraphCache:
    """CUDA graphs of ``fn(*inputs) -> tensor``, one per key and input shapes (see the module).

    ``fn`` must be a pure device computation of its inputs: no host synchronisation, no new
    host-to-device copies after its first (eager) run, the same kernels for the same shapes.
    """

    def __init__(self, name: str, max_graphs: int = MAX_GRAPHS):
        self.name = name
        self.max_graphs = max_graphs
        self._graphs: OrderedDict = OrderedDict()
        self._pool = None
        #: ``"ErrorType: message"`` once a capture failed here (graphs are off from then on)
        self.failed: str | None = None
        #: captures and replays so far (for tests and benchmarks)
        self.captures = 0
        self.replays = 0

    def usable(self, *inputs: torch.Tensor) -> bool:
        return (
            self.failed is None
            and graphs_enabled()
            and all(t.device.type == "cuda" for t in inputs)
            and not torch.cuda.is_current_stream_capturing()
        )

    def run(
        self, fn: Callable[..., torch.Tensor], inputs: tuple, key, sink: Callable[[torch.Tensor], None]
    ) -> None:
        """``sink(fn(*inputs))``, by a graph replay when :meth:`usable`, else eagerly."""
        if not self.usable(*inputs):
            sink(fn(*inputs))
            return
        k = (key, tuple((tuple(t.shape), t.dtype, t.device) for t in inputs))
        entry = self._graphs.get(k)
        if entry is None:  # first time: eager (its result used), then capture
            sink(self._capture(fn, inputs, k))
            return
        self._graphs.move_to_end(k)
        graph, static, out = entry
        for s, t in zip(static, inputs):
            s.copy_(t)
        graph.replay()
        self.replays += 1
        sink(out)

    def _capture(self, fn, inputs, k) -> torch.Tensor:
        """Run ``fn`` eagerly (Triton compiles, caches fill) and return its result; then capture
        it for the next calls (not run: a capture only records)."""
        result = fn(*inputs)
        dev = inputs[0].device
        static = tuple(t.clone() for t in inputs)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        try:
            with torch.cuda.stream(side):  # the capture's own warm-up, as PyTorch advises
                fn(*static)
            torch.cuda.current_stream(dev).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = fn(*static)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 -- cannot capture here: launch eagerly
            first = (str(e).strip().splitlines() or [""])[0][:300]
            self.failed = f"{type(e).__name__}: {first}"
            self._graphs.clear()
            warnings.warn(
                f"metrics: CUDA graphs of the {self.name} failed on this machine "
                f"({self.failed}); launching its kernels one by one "
                "(EVALKIT_CUDA_GRAPHS=0 silences this)",
                RuntimeWarning,
                stacklevel=4,
            )
            return result
        self.captures += 1
        self._graphs[k] = (graph, static, out)
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return result

    def clear(self) -> None:
        """Drop every graph (their memory goes back to torch's allocator)."""
        self._graphs.clear()
        self._pool = None
