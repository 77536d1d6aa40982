"""Streaming pair evaluation: two frame iterators in, one record per frame out.

:class:`PairEvaluator` is the stateful layer over the functional modules (torchmetrics
style): :meth:`~PairEvaluator.update` takes the next chunk of both clips and returns their
per-frame records, carrying only what the next chunk needs (the last frame's LPIPS features,
grey image, pixels and low-passed luma); :meth:`~PairEvaluator.compute` gives the summary.
:func:`stream_pair` drives it from two iterators, :func:`evaluate_pair` collects everything.

Per-frame record keys (the metric keys, units and first frames are those of
:mod:`evalkit.metrics.catalogue`; units also in :data:`UNITS`)::

    frame, lpips, ssim, psnr, max_abs_diff, diff_fraction, identical
    from frame 1 (temporal=True):  tlp, tof, warp_error_a, warp_error_b, warp_error_diff, flicker
    from frame 2:                  flicker_a, flicker_b

``psnr`` is ``inf`` for identical frames (``math.inf``; JSON writers must map it, see
:func:`json_safe`). Summary means: the mean over frames that have the key, ignoring
``nan`` (a warping error with no consistent pixel); ``psnr`` is the mean over frames that are
not identical (identical frames are counted in ``identical_frames``), ``inf`` if every frame
is identical; ``psnr_pooled`` is the PSNR of the MSE pooled over all frames.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ._common import PEAK8, as_frames, fast_path, fast_path_forced, precise, resolve_device
from ._errors import MetricInputError
from .catalogue import METRICS, keys, units
from .fidelity import (SSIM_CHANNELS, luma_kernel, mse_exactness_kernel, psnr_convention, psnr_from_mse, ssim_convention,
                       ssim_kernel)
from .flow import (DEFAULT_PRESET, check_flow_options, device_flows, flow_convention, flow_into,
                   resolve_flow)
from .perceptual import get_model
from .temporal import FLICKER_BLOCK, check_block, lowpass_luma, temporal_from_flows

ALIGN_MODES = ("error", "shortest")

#: cuDNN autotuning's candidates per convolution (``torch.backends.cudnn.benchmark_limit``;
#: PyTorch's own default is 10). See :class:`PairEvaluator` (``cudnn_benchmark_limit``).
CUDNN_BENCHMARK_LIMIT = 10


def _cudnn_limit(value: int | None) -> int:
    """``value``, else the default; a non-negative integer (0: all)."""
    if value is None:
        return CUDNN_BENCHMARK_LIMIT
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = -1
    if limit < 0:
        raise MetricInputError(f"cudnn_benchmark_limit: expected a non-negative integer "
                               f"(0: all), found {value!r}")
    return limit


#: the modules of the Triton kernels the stream launches on CUDA
KERNEL_MODULES = ("_triton_pixels", "_triton_ssim", "_triton_temporal", "_triton_lpips",
                  "_triton_flow", "_triton_pyramid")


def _load_kernel_modules() -> None:
    """What the first kernel launches would otherwise do on the thread that feeds the device:
    import Triton, compute its cache key (a hash of its own files, once per process: 0.4 s on
    the H200) and import :data:`KERNEL_MODULES` (Triton parses each kernel's source). Best
    effort: whatever fails here is left to the launches, which report it as before."""
    import importlib

    try:
        from triton.runtime import cache

        key = getattr(cache, "triton_key", None)    # Triton 3.x; cached for the process
        if key is not None:
            key()
        for name in KERNEL_MODULES:
            importlib.import_module(f"{__package__}.{name}")
    except Exception:       # no Triton, another version's layout: the launches load it
        pass


def _u8(y: torch.Tensor) -> np.ndarray:
    """Rounded luma planes (N, 1, H, W) float -> (N, H, W) uint8 numpy (OpenCV flow input)."""
    return y.clamp(0, 255).to(torch.uint8)[:, 0].cpu().numpy()

#: What each number means (key -> description, from :mod:`evalkit.metrics.catalogue`). Every value
#: in records and summaries is in these units.
UNITS = units()

FIDELITY_KEYS = keys(temporal=False, optional=False)     # optional ones (vmaf): evalkit.metrics.vmaf
TEMPORAL_KEYS = keys(temporal=True, optional=False)


def cpu_count() -> int:
    """CPU cores this process may run on (the affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_flow_workers(device) -> int:
    """OpenCV flow threads for metrics on ``device``: 0 (inline) on the CPU, where the tensor
    work already takes every core; on a GPU one per CPU core but one (the thread that feeds
    the GPU and stages frames)."""
    return 0 if torch.device(device).type == "cpu" else max(1, min(64, cpu_count() - 1))


# With a pool of flow threads, each flow should run on one core: OpenCV's own thread pool
# inside every flow thread only oversubscribes the CPU. The OpenCV setting is process-wide,
# so evaluators that hold a pool count themselves in and the last one out restores it.
_CV_LOCK = threading.Lock()
_CV_USERS = 0
_CV_SAVED: int | None = None


def _cv_threads_acquire() -> None:
    global _CV_USERS, _CV_SAVED
    import cv2

    with _CV_LOCK:
        if _CV_USERS == 0:
            _CV_SAVED = cv2.getNumThreads()
            cv2.setNumThreads(1)
        _CV_USERS += 1


def _cv_threads_release() -> None:
    global _CV_USERS
    import cv2

    with _CV_LOCK:
        _CV_USERS -= 1
        if _CV_USERS == 0 and _CV_SAVED is not None:
            cv2.setNumThreads(_CV_SAVED)


def unit_into(x: torch.Tensor, dst: torch.Tensor) -> None:
    """Frames ``x`` (uint8 or [0, 1] float) as float32 in [0, 1] written into ``dst``."""
    # one pass on CUDA; on the CPU torch's converting division is slower than copy + divide
    forced = fast_path_forced("one_pass_unit")
    one_pass = forced if forced is not None else x.device.type == "cuda" and fast_path("one_pass_unit")
    if x.dtype == torch.uint8 and one_pass:
        torch.div(x, PEAK8, out=dst)       # the same float32 division as below, in one pass
        return
    dst.copy_(x)
    if x.dtype == torch.uint8:
        dst.div_(PEAK8)


class _HostRing:
    """Host buffers that stage data for the device, and results coming back from it: two per
    key, handed out in turn.

    On a GPU they are pinned, so copies either way run asynchronously (``non_blocking``);
    a buffer is handed out again only when everything that used it has finished: the flow
    threads writing it (their futures) and the copy reading or writing it (a CUDA event). On the CPU the
    "device copy" is the buffer itself; the stream's pipeline (at most two chunks in flight)
    guarantees that a buffer is consumed before its turn comes again.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.pin = device.type == "cuda"
        self._slots: dict[str, list[dict]] = {}
        self._turn: dict[str, int] = {}

    def get(self, key: str, shape: tuple, dtype: torch.dtype) -> dict:
        """A slot ``{"buf": tensor, ...}`` whose buffer holds at least ``shape``; use ``buf[:shape[0]]``."""
        slots = self._slots.setdefault(key, [{}, {}])
        i = self._turn.get(key, 0)
        self._turn[key] = 1 - i
        slot = slots[i]
        self._wait(slot)
        buf = slot.get("buf")
        if (buf is None or buf.dtype != dtype or tuple(buf.shape[1:]) != tuple(shape[1:])
                or buf.shape[0] < shape[0]):
            slot["buf"] = None    # let the old one go first
            slot["buf"] = self._alloc(shape, dtype)
        return slot

    def _alloc(self, shape, dtype) -> torch.Tensor:
        if self.pin:
            try:
                return torch.empty(shape, dtype=dtype, pin_memory=True)
            except RuntimeError:    # no page-locked memory to be had: pageable, synchronous copies
                self.pin = False
        return torch.empty(shape, dtype=dtype)

    @staticmethod
    def _wait(slot: dict) -> None:
        futures = slot.pop("futures", None)
        if futures:
            concurrent.futures.wait(futures)
        event = slot.pop("event", None)
        if event is not None:
            event.synchronize()

    def to_device(self, slot: dict, host: torch.Tensor) -> torch.Tensor:
        """``host`` (a view of ``slot``'s buffer) on the device; one asynchronous copy on a GPU."""
        if self.device.type == "cpu":
            return host
        out = host.to(self.device, non_blocking=self.pin)
        self._mark(slot)
        return out

    def to_host(self, key: str, x: torch.Tensor) -> tuple[torch.Tensor, dict | None]:
        """``x`` (1-D, on the device) in ``key``'s next buffer -> ``(host view, slot)``; one
        asynchronous copy on a GPU (wait for it with :meth:`ready`). On the CPU ``x`` itself
        and no slot."""
        if self.device.type == "cpu":
            return x, None
        slot = self.get(key, (x.numel(),), x.dtype)
        host = slot["buf"][:x.numel()]
        host.copy_(x, non_blocking=self.pin)
        self._mark(slot)
        return host, slot

    def ready(self, slot: dict | None) -> None:
        """Wait until everything that uses ``slot``'s buffer has finished (None: nothing)."""
        if slot is not None:
            self._wait(slot)

    def _mark(self, slot: dict) -> None:
        """Record the end of the copy just queued (pinned buffers on CUDA only: otherwise
        the copy was synchronous)."""
        if self.pin and self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            slot["event"] = event

    def clear(self) -> None:
        for slots in self._slots.values():
            for slot in slots:
                self._wait(slot)
        self._slots.clear()


class _Job:
    """One chunk on its way through :class:`PairEvaluator` (prepare -> launch -> finish -> records)."""

    __slots__ = ("t0", "n", "has_prev", "temporal", "a", "b", "u", "ua", "ub", "ya", "yb", "pa", "pb",
                 "m", "flow_slot", "flow_dev", "futures", "out", "first", "mse", "numel",
                 "keys", "sizes", "flat", "result_slot", "finished")

    def __init__(self):
        self.futures = []
        self.finished = False
        self.result_slot = None


class PairEvaluator:
    """Full-reference and temporal metrics of two clips, fed chunk by chunk.

    Settings that change scores (all named in :attr:`conventions`):
    net (``"alex"``/``"vgg"``), ssim_channel (``"luma"``/``"rgb"``), ssim_round_luma,
    ssim_win_size, ssim_sigma, ssim_data_range, psnr_data_range, flow (``"dis"``/``"farneback"``/
    ``"torch"``: on the evaluator's device, no flow threads; ``"auto"``: ``"torch"`` on a GPU,
    ``"dis"`` elsewhere, :func:`evalkit.metrics.flow.resolve_flow`),
    flow_preset (DIS preset, default ``"fast"``: see :mod:`evalkit.metrics.flow`), flow_scale,
    flicker_block, temporal (compute temporal metrics).

    device: where the metrics run (default: CUDA if available, else CPU); float32 with TF32 off.
    flow_workers: OpenCV flow threads running alongside the tensor work (default
    :func:`default_flow_workers`: inline on the CPU, one per CPU core but one when the metrics
    run on a GPU; with a pool, OpenCV's own threading is set to 1 until :meth:`close`).
    Results do not depend on it.
    cudnn_benchmark: let cuDNN autotune the LPIPS and SSIM convolutions (default: on for CUDA).
    Only deterministic algorithms are candidates and TF32 stays off; two processes may still
    pick different algorithms, which moves LPIPS by float32 rounding (~1e-7).
    cudnn_benchmark_limit: how many candidate algorithms autotuning times per convolution
    (``torch.backends.cudnn.benchmark_limit``, 0: all; default :data:`CUDNN_BENCHMARK_LIMIT`).
    Fewer shorten the warm-up.

    How a chunk flows (see :func:`stream_pair`, which keeps two chunks in flight): *prepare*
    copies the frames to the device once (uint8, pinned host memory, asynchronous), computes
    the rounded luma there and hands the small grey frames to the flow threads (4 flows per
    frame pair: forward and backward on each clip); *launch* queues the LPIPS trunk (one pass
    per frame, A and B in one batch, features reused by tLP), SSIM, PSNR, exactness and
    flicker on the device without waiting; *collect* waits for the flows, copies them to the
    device in one piece, warps and masks there, and brings every per-frame number of the chunk
    to the host in one copy.
    """

    def __init__(self, *, device=None, net: str = "alex", ssim_channel: str = "luma",
                 ssim_round_luma: bool = True, ssim_win_size: int = 11, ssim_sigma: float = 1.5,
                 ssim_data_range: float | None = None, psnr_data_range: float | None = None,
                 temporal: bool = True, flow: str = "dis", flow_preset: str = DEFAULT_PRESET,
                 flow_scale: float = 1.0, flicker_block: int = FLICKER_BLOCK,
                 flow_workers: int | None = None, cudnn_benchmark: bool | None = None,
                 cudnn_benchmark_limit: int | None = None):
        if ssim_channel not in SSIM_CHANNELS:
            raise MetricInputError(f"ssim_channel: expected one of {', '.join(SSIM_CHANNELS)}, "
                                   f"found {ssim_channel!r}")
        self.device = resolve_device(device)
        flow = resolve_flow(flow, self.device)
        if temporal:
            check_flow_options(flow, flow_preset, flow_scale)
            check_block(flicker_block)
        self.net = net
        self.model = get_model(net, self.device)
        self.ssim_kw = dict(channel=ssim_channel, round_luma=ssim_round_luma,
                            win_size=ssim_win_size, sigma=ssim_sigma, data_range=ssim_data_range)
        self.psnr_data_range = psnr_data_range
        self.temporal = temporal
        self.flow = (flow, flow_preset, flow_scale)
        self.flicker_block = flicker_block
        self.cudnn_benchmark = (self.device.type == "cuda") if cudnn_benchmark is None else bool(cudnn_benchmark)
        self.cudnn_benchmark_limit = _cudnn_limit(cudnn_benchmark_limit)
        if flow_workers is None:
            flow_workers = default_flow_workers(self.device)
        self.flow_workers = flow_workers if temporal and flow != "torch" else 0
        self._pool = None
        self._cv_held = False
        if self.flow_workers > 0:
            self._pool = ThreadPoolExecutor(self.flow_workers, thread_name_prefix="metrics-flow")
            if self.flow_workers > 1:
                _cv_threads_acquire()
                self._cv_held = True
        self._ring = _HostRing(self.device)
        self.alignment: dict[str, Any] = {"mode": "error"}
        self.reset()

    # -- description -------------------------------------------------------------------------
    @property
    def conventions(self) -> dict[str, str]:
        c = {
            "lpips": f"v0.1,{self.net},inputs[-1,1]",
            "ssim": ssim_convention(**self.ssim_kw),
            "psnr": psnr_convention(data_range=self.psnr_data_range),
            "exactness": "8-bit units; diff_fraction over pixel positions",
            "compute": f"float32,{self.device.type},tf32-off" + (",cudnn-autotune" if self.cudnn_benchmark else ""),
        }
        if self.temporal:
            c.update({
                "flow": flow_convention(*self.flow),
                "warp_error": "mse,rgb[0,1],backward-warp t-1->t with own flow,fwd-bwd-masked(0.01,0.5)",
                "tlp": "abs-diff of lpips(t,t-1), lpips units",
                "tof": "mean end-point distance, pixels",
                "flicker": f"luma-unrounded,block{self.flicker_block},8-bit units",
            })
        return c

    def reset(self) -> None:
        """Forget the clips seen so far (the model, threads and staging buffers stay)."""
        self.n = 0               # frames whose records were returned
        self._next = 0           # frames handed in (prepared); > n while a chunk is in flight
        self.size: tuple[int, int] | None = None
        # carries from the previous chunk: grey frames and [0, 1] frames (prepare), LPIPS
        # features and low-passed luma (launch)
        self._carry_grey = self._carry_unit = self._carry_feats = self._carry_low = None
        self._lpips_raw = False  # LPIPS features raw for the Triton head (set per clip)
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._identical = 0
        self._sq_total = 0.0     # pooled squared error (8-bit or [0,1] units) for psnr_pooled
        self._px_total = 0
        self._peak = None
        #: wall seconds spent in each stage since the last reset (diagnostics for benchmarks):
        #: read (iterators and staging copies), prepare, launch, flow_wait (waiting for the flow
        #: threads), collect (the rest of collect, including the wait for the device).
        self.timings = dict.fromkeys(("read", "prepare", "launch", "flow_wait", "collect"), 0.0)

    def warm_up(self, height: int, width: int, chunk: int) -> None:
        """Run one chunk of black ``height`` x ``width`` frames through :func:`stream_pair`
        and forget it: cuDNN's autotuning, Triton's kernel loading and the staging buffers
        happen now (at start-up) rather than in the first clip. The records are unchanged:
        every clip starts from :meth:`reset`. On CUDA the trunk's autotuning runs first, while
        a thread imports Triton and the kernel modules (:func:`_load_kernel_modules`)."""
        frames = np.zeros((chunk, height, width, 3), np.uint8)
        if self.device.type == "cuda":
            # two start-up costs at once: cuDNN autotunes the LPIPS trunk for this frame size
            # here (the device times its algorithms, the interpreter lock is free meanwhile)
            # while a thread loads Triton and the kernel modules (_load_kernel_modules)
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics-warm") as pool:
                loading = pool.submit(_load_kernel_modules)
                if self.cudnn_benchmark:
                    with precise(True, self.cudnn_benchmark_limit):
                        self.model.features(torch.zeros((chunk, 3, height, width), device=self.device),
                                            normalised=False)
                loading.result()
        for _ in stream_pair(iter([frames]), iter([frames]), evaluator=self, chunk=chunk):
            pass
        self.reset()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._cv_held:
            _cv_threads_release()
            self._cv_held = False
        self._ring.clear()
        if self.device.type == "cuda":
            from .torchflow import FLOW_GRAPHS
            FLOW_GRAPHS.clear()               # the graphs' memory pool back to the allocator

    # -- work ----------------------------------------------------------------------------------
    def update(self, a, b) -> list[dict]:
        """Add the next ``(n, 3, H, W)`` frames of both clips; return their n records."""
        job = self._prepare(a, b)
        self._launch(job)
        return self._collect(job)

    def _prepare(self, a, b) -> _Job:
        """Check and stage a chunk; start its optical flows (in the flow threads, if any)."""
        t_start = time.perf_counter()
        a = as_frames(a, "a", device=self.device, offset=self._next)
        b = as_frames(b, "b", device=self.device, offset=self._next)
        size = (a.shape[3], a.shape[2])
        for name, x in (("a", a), ("b", b)):
            if (x.shape[3], x.shape[2]) != (self.size or size):
                w, h = self.size or size
                raise MetricInputError(f"{name}: frame {self._next} is {x.shape[3]}x{x.shape[2]}, "
                                       f"expected {w}x{h} like frame 0 of a")
        if a.shape[0] != b.shape[0]:
            raise MetricInputError(f"b: chunk of {b.shape[0]} frames, expected {a.shape[0]} like a")
        self.size = size
        n, h, w = a.shape[0], a.shape[2], a.shape[3]
        job = _Job()
        job.t0, job.n, job.a, job.b = self._next, n, a, b
        job.has_prev = self.temporal and self._next > 0
        job.temporal = self.temporal and (job.has_prev or n > 1)
        job.numel = a[0].numel()
        with precise():
            # both clips in one [0, 1] float32 batch (the LPIPS input), contiguous NCHW
            u = torch.empty((2 * n, 3, h, w), dtype=torch.float32, device=self.device)
            unit_into(a, u[:n])
            unit_into(b, u[n:])
            job.u, job.ua, job.ub = u, u[:n], u[n:]
            job.ya, job.yb = luma_kernel(a), luma_kernel(b)   # rounded luma: SSIM (default) and flow input
            job.flow_dev = None
            if job.temporal and self.flow[0] == "torch":
                # flows on the device, queued with the rest (no host round trip)
                ya, yb = job.ya, job.yb
                if job.has_prev:
                    ya = torch.cat([self._carry_grey[0], ya])
                    yb = torch.cat([self._carry_grey[1], yb])
                job.m = ya.shape[0] - 1
                # fwd a, bwd a, fwd b, bwd b, from slices: an index list would be copied to the
                # device from pageable memory, and the host would wait for the queue to drain
                src = torch.cat([ya[:-1], ya[1:], yb[:-1], yb[1:]])
                dst = torch.cat([ya[1:], ya[:-1], yb[1:], yb[:-1]])
                job.flow_dev = device_flows(src, dst, self.flow[2])
                job.futures = []
                if job.has_prev:
                    job.pa = torch.cat([self._carry_unit[0], job.ua])
                    job.pb = torch.cat([self._carry_unit[1], job.ub])
                else:
                    job.pa, job.pb = job.ua, job.ub
                self._carry_grey = (ya[-1:].clone(), yb[-1:].clone())
            elif job.temporal and self.flow[0] != "torch":
                g = _u8(torch.cat([job.ya, job.yb]))          # the one wait of the chunk
                ga, gb = g[:n], g[n:]
                if job.has_prev:
                    ga = np.concatenate([self._carry_grey[0][None], ga])
                    gb = np.concatenate([self._carry_grey[1][None], gb])
                pairs = []
                for gr in (ga, gb):
                    pairs += [(gr[i - 1], gr[i]) for i in range(1, len(gr))]   # forward t-1 -> t
                    pairs += [(gr[i], gr[i - 1]) for i in range(1, len(gr))]   # backward t -> t-1
                job.m = len(ga) - 1
                slot = self._ring.get("flow", (len(pairs), h, w, 2), torch.float32)
                host = slot["buf"].numpy()
                if self._pool is not None:
                    job.futures = slot["futures"] = [
                        self._pool.submit(flow_into, host[i], s, d, *self.flow)
                        for i, (s, d) in enumerate(pairs)]
                else:
                    for i, (s, d) in enumerate(pairs):
                        flow_into(host[i], s, d, *self.flow)
                    job.futures = []
                job.flow_slot = slot
                if job.has_prev:
                    job.pa = torch.cat([self._carry_unit[0], job.ua])
                    job.pb = torch.cat([self._carry_unit[1], job.ub])
                else:
                    job.pa, job.pb = job.ua, job.ub
                self._carry_grey = (ga[-1].copy(), gb[-1].copy())
            elif self.temporal and self.flow[0] == "torch":    # a first chunk of one frame
                self._carry_grey = (job.ya[-1:].clone(), job.yb[-1:].clone())
            elif self.temporal:                                # a first chunk of one frame
                g = _u8(torch.cat([job.ya[-1:], job.yb[-1:]]))
                self._carry_grey = (g[0].copy(), g[1].copy())
            if self.temporal:
                self._carry_unit = (job.ua[-1:].clone(), job.ub[-1:].clone())
        self._next += n
        self.timings["prepare"] += time.perf_counter() - t_start
        return job

    def _launch(self, job: _Job) -> None:
        """Queue the chunk's LPIPS, tLP, SSIM, PSNR, exactness and flicker (no host wait)."""
        t_start = time.perf_counter()
        n, t0 = job.n, job.t0
        out: dict[str, torch.Tensor] = {}
        first: dict[str, int] = {}                    # frame number of each array's element 0
        with precise(self.cudnn_benchmark, self.cudnn_benchmark_limit):
            # LPIPS: one trunk pass per frame (A and B in one batch, or in two passes when
            # autotuned: below), reused by tLP. Where the Triton head runs (picked at a clip's first chunk: the carried features match),
            # the features stay raw and each distance normalises them in its one pass.
            if not job.has_prev:
                self._lpips_raw = self.model.fused()
            raw = self._lpips_raw
            if self.cudnn_benchmark and self.device.type == "cuda":
                # A and B in two passes: autotuning times each algorithm on the whole batch, so
                # half the batch halves its share of the warm-up (H200, 720p: 1.2 s against
                # 2.2 s) for a trunk 3% slower (1,279 against 1,316 images/s)
                fa = self.model.features(job.u[:n], normalised=not raw)
                fb = self.model.features(job.u[n:], normalised=not raw)
            else:
                f = self.model.features(job.u, normalised=not raw)
                fa, fb = [t[:n] for t in f], [t[n:] for t in f]
                del f
            out["lpips"] = self.model.distance(fa, fb, normalised=not raw)
            if job.temporal:
                pf = self._carry_feats
                da = self._successive(pf[0] if job.has_prev else None, fa, raw)
                db = self._successive(pf[1] if job.has_prev else None, fb, raw)
                out["tlp"] = (da - db).abs()
            if self.temporal:
                # clones: views would keep the whole chunk's features alive
                self._carry_feats = ([t[-1:].clone() for t in fa], [t[-1:].clone() for t in fb])
            del fa, fb
            # pixel fidelity
            lumas = (job.ya, job.yb) if self.ssim_kw["channel"] == "luma" and self.ssim_kw["round_luma"] else None
            out["ssim"] = ssim_kernel(job.a, job.b, **self.ssim_kw, lumas=lumas)
            job.mse, ex = mse_exactness_kernel(job.a, job.b)
            out["max_abs_diff"], out["diff_fraction"] = ex["max_abs_diff"], ex["diff_fraction"]
            # flicker on block-averaged luma (carry: the last two low-passed frames)
            if self.temporal:
                la, lb = lowpass_luma(job.a, self.flicker_block), lowpass_luma(job.b, self.flicker_block)
                if job.has_prev:
                    la, lb = torch.cat([self._carry_low[0], la]), torch.cat([self._carry_low[1], lb])
                l_first = t0 + n - la.shape[0]            # frame number of la[0]
                if la.shape[0] >= 2:
                    da_, db_ = la[1:] - la[:-1], lb[1:] - lb[:-1]
                    fl_pair = (da_ - db_).abs().mean((1, 2, 3))
                    out["flicker"] = fl_pair[max(0, t0 - (l_first + 1)):]
                    if la.shape[0] >= 3:
                        out["flicker_a"] = (da_[1:] - da_[:-1]).abs().mean((1, 2, 3))
                        out["flicker_b"] = (db_[1:] - db_[:-1]).abs().mean((1, 2, 3))
                        first["flicker_a"] = first["flicker_b"] = l_first + 2
                self._carry_low = (la[-2:].clone(), lb[-2:].clone())
        if self._peak is None:
            u8 = job.a.dtype == torch.uint8 and job.b.dtype == torch.uint8
            self._peak = (255.0 if u8 else 1.0) if self.psnr_data_range is None else float(self.psnr_data_range)
        job.out, job.first = out, first
        # the frames themselves are no longer needed (the staging buffer may be reused)
        job.a = job.b = job.ya = job.yb = job.u = job.ua = job.ub = None
        self.timings["launch"] += time.perf_counter() - t_start

    def _waits_for_threads(self, job: _Job) -> bool:
        """Whether finishing ``job`` waits for flow threads (then give them time first)."""
        return bool(job.futures)

    def _finish(self, job: _Job) -> None:
        """Queue the chunk's warping errors and tOF (from its flows) and the copy of all its
        per-frame numbers to the host. Waits only for the flow threads, if any: on a GPU the
        copy is asynchronous (pinned memory), so the next chunk's work can be queued before
        :meth:`_records` waits for this one."""
        if job.finished:
            return
        out = job.out
        t_start = time.perf_counter()
        if job.temporal:
            for fu in job.futures:
                fu.result()                                # re-raises a flow thread's error
            t_flows = time.perf_counter()
            self.timings["flow_wait"] += t_flows - t_start
            t_start = t_flows
            m = job.m
            if job.flow_dev is None:
                fl = self._ring.to_device(job.flow_slot, job.flow_slot["buf"][:4 * m])
            with precise(self.cudnn_benchmark, self.cudnn_benchmark_limit):
                if job.flow_dev is None:
                    fl = fl.permute(0, 3, 1, 2).contiguous()   # (4m, 2, H, W)
                else:
                    fl, job.flow_dev = job.flow_dev, None
                fwd_a, bwd_a, fwd_b, bwd_b = fl[:m], fl[m:2 * m], fl[2 * m:3 * m], fl[3 * m:]
                # on CUDA one Triton pass per clip (evalkit.metrics._triton_temporal), else torch
                out["warp_error_a"], out["warp_error_b"], out["tof"] = temporal_from_flows(
                    job.pa, job.pb, fwd_a, bwd_a, fwd_b, bwd_b)
                out["warp_error_diff"] = out["warp_error_b"] - out["warp_error_a"]
            del fl, fwd_a, bwd_a, fwd_b, bwd_b
            job.pa = job.pb = None
        # one copy to the host for the whole chunk
        job.keys = list(out)
        with torch.inference_mode():
            flat = torch.cat([out[k].reshape(-1).double() for k in job.keys] + [job.mse.double()])
            job.flat, job.result_slot = self._ring.to_host("results", flat)
        job.sizes = {k: out[k].numel() for k in job.keys}
        job.out = job.mse = None
        job.finished = True
        self.timings["collect"] += time.perf_counter() - t_start

    def _collect(self, job: _Job) -> list[dict]:
        """Finish the chunk (:meth:`_finish`) and return its records."""
        self._finish(job)
        return self._records(job)

    def _records(self, job: _Job) -> list[dict]:
        """Wait for the chunk's numbers on the host and return its records."""
        t_start = time.perf_counter()
        self._ring.ready(job.result_slot)
        flat = job.flat.numpy()
        n, t0, keys = job.n, job.t0, job.keys
        host, at = {}, 0
        for k in keys:
            size = job.sizes[k]
            host[k] = flat[at:at + size]
            at += size
        mse_h = flat[at:at + n]
        first = job.first
        t_first = t0 if job.has_prev else t0 + 1    # first frame with a t-1 -> t transition
        records = []
        for i in range(n):
            t = t0 + i
            e = float(mse_h[i])
            rec: dict[str, Any] = {"frame": t,
                                   "lpips": float(host["lpips"][i]),
                                   "ssim": float(host["ssim"][i]),
                                   "psnr": psnr_from_mse(e, self._peak),
                                   "max_abs_diff": float(host["max_abs_diff"][i]),
                                   "diff_fraction": float(host["diff_fraction"][i])}
            rec["identical"] = rec["max_abs_diff"] == 0.0
            for k in TEMPORAL_KEYS:
                if k in host:
                    j = t - first.get(k, t_first)
                    if 0 <= j < len(host[k]):
                        rec[k] = float(host[k][j])
            records.append(rec)
            self._accumulate(rec)
            self._sq_total += e * job.numel
            self._px_total += job.numel
        self.n += n
        self.timings["collect"] += time.perf_counter() - t_start
        return records

    def _successive(self, prev_feats, feats, raw: bool = False) -> torch.Tensor:
        """LPIPS(x_t, x_t-1) for each frame of the chunk that has a predecessor (no copies);
        ``raw``: the features are raw trunk outputs (see :meth:`_launch`)."""
        parts = []
        if prev_feats is not None:
            parts.append(self.model.distance([f[:1] for f in feats], prev_feats, normalised=not raw))
        if feats[0].shape[0] > 1:
            parts.append(self.model.distance([f[1:] for f in feats], [f[:-1] for f in feats],
                                             normalised=not raw))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _accumulate(self, rec: dict) -> None:
        if rec["identical"]:
            self._identical += 1
        for k, v in rec.items():
            if k in ("frame", "identical") or not isinstance(v, float) or math.isnan(v):
                continue
            if k == "psnr" and math.isinf(v):
                continue
            self._sums[k] = self._sums.get(k, 0.0) + v
            self._counts[k] = self._counts.get(k, 0) + 1

    def compute(self) -> dict:
        """Summary: means (see module doc), counts, identity, conventions, units, alignment."""
        if self.n == 0:
            raise MetricInputError("a: no frames were compared")
        means: dict[str, float | None] = {}
        for k in FIDELITY_KEYS + (TEMPORAL_KEYS if self.temporal else ()):
            c = self._counts.get(k, 0)
            means[k] = self._sums[k] / c if c else None
        if means["psnr"] is None and self._identical == self.n:
            means["psnr"] = math.inf
        if self.temporal and means.get("warp_error_a") is not None and means.get("warp_error_b") is not None:
            means["warp_error_diff"] = means["warp_error_b"] - means["warp_error_a"]
        if self._px_total and self._peak:
            pooled = psnr_from_mse(self._sq_total / self._px_total, self._peak)
        else:
            pooled = None
        w, h = self.size
        return {
            "frames": self.n, "width": w, "height": h, "device": str(self.device),
            "means": means,
            "psnr_pooled": pooled,
            "identical": self._identical == self.n,
            "identical_frames": self._identical,
            "nan_counts": {k: self.n_expected(k) - self._counts.get(k, 0)
                           for k in ("warp_error_a", "warp_error_b") if self.temporal
                           and self.n_expected(k) - self._counts.get(k, 0) > 0},
            "conventions": self.conventions,
            "alignment": dict(self.alignment),
        }

    def n_expected(self, key: str) -> int:
        """Frames that have ``key``: all but the first ``first_frame`` (see the catalogue)."""
        return max(self.n - METRICS[key].first_frame, 0)



# -- driving from iterators ------------------------------------------------------------------

def _frames_of(item, name: str, index: int) -> torch.Tensor:
    """One item of a frame iterator -> (n, 3, H, W) tensor.

    numpy arrays are channels-last, as decoders give them: (H, W, 3) or (n, H, W, 3);
    torch tensors are channels-first: (3, H, W) or (n, 3, H, W).
    """
    if isinstance(item, np.ndarray):
        return torch.from_numpy(_hwc_of(item, name, index)).permute(0, 3, 1, 2)
    if isinstance(item, torch.Tensor):
        if item.ndim == 3:
            item = item[None]
        if item.ndim != 4 or item.shape[1] != 3:
            raise MetricInputError(f"{name}: frame {index}: expected a tensor (3, H, W) frame or "
                                   f"(n, 3, H, W) chunk, found shape {tuple(item.shape)}")
        return item
    raise MetricInputError(f"{name}: frame {index}: expected a numpy array or torch tensor, "
                           f"found {type(item).__name__}")


def _hwc_of(item: np.ndarray, name: str, index: int) -> np.ndarray:
    if item.ndim == 3:
        item = item[None]
    if item.ndim != 4 or item.shape[3] != 3:
        raise MetricInputError(f"{name}: frame {index}: expected a numpy (H, W, 3) frame or "
                               f"(n, H, W, 3) chunk, found shape {item.shape}")
    return np.ascontiguousarray(item) if any(s < 0 for s in item.strides) else item


def _rechunk(frames: Iterable, name: str, size: int, ring: _HostRing,
             threaded_copy: bool = False) -> Iterator[tuple]:
    """Regroup the items of a frame iterator into chunks of ``size`` frames.

    Frames in host memory (numpy arrays, CPU tensors) are copied once, channels-last as they
    come, into a staging buffer of ``ring`` (pinned when the metrics run on a GPU) that goes to
    the device in one copy; the device does the permutation to channels-first. Tensors on
    another device are concatenated there. Yields ``(frames, slot)``: ``(n, H, W, 3)`` frames
    and their ring slot, or ``(n, 3, H, W)`` frames and ``None``.

    ``threaded_copy``: stage with torch's copy on its intra-op threads rather than one numpy
    copy. Measured on an H200 machine (16 cores) at 720p: without temporal metrics it cut the
    main thread's staging time from 1.9 s to 0.7 s per 2,000 pairs (334 -> 408 pairs/s); with
    them its threads fought the optical-flow pool (staging 1.2 s -> 8.7 s), so it is used only
    when no flows run.
    """
    key = f"frames_{name}"
    slot, have, index = None, 0, 0
    parts: list[torch.Tensor] = []          # device tensors of the chunk being gathered
    first_hw = None
    for item in frames:
        if isinstance(item, torch.Tensor) and item.device.type != "cpu" and slot is None:
            x, on_host = _frames_of(item, name, index), False
            hw = (x.shape[2], x.shape[3])
        elif isinstance(item, torch.Tensor):
            x, on_host = _frames_of(item, name, index).permute(0, 2, 3, 1).cpu().numpy(), True
            hw = x.shape[1:3]
        else:
            x, on_host = (_hwc_of(item, name, index) if isinstance(item, np.ndarray)
                          else _frames_of(item, name, index)), True
            hw = x.shape[1:3]
        if first_hw is None:
            first_hw = hw
        elif hw != first_hw:
            raise MetricInputError(f"{name}: frame {index} is {hw[1]}x{hw[0]}, expected "
                                   f"{first_hw[1]}x{first_hw[0]} like frame 0 of {name}")
        if on_host and parts:               # a chunk gathered on the device goes on there
            x, on_host = torch.from_numpy(np.ascontiguousarray(x)).to(parts[0].device).permute(0, 3, 1, 2), False
        index += x.shape[0]
        while x.shape[0]:
            take = min(size - have, x.shape[0])
            if on_host:
                if slot is None:
                    dtype = torch.from_numpy(x[:0]).dtype
                    slot = ring.get(key, (size, *hw, 3), dtype)
                buf = slot["buf"]
                if torch.from_numpy(x[:0]).dtype != buf.dtype:
                    raise MetricInputError(f"{name}: frame {index - x.shape[0]} is "
                                           f"{x.dtype}, expected {str(buf.dtype).replace('torch.', '')} "
                                           "like the frames before it")
                if threaded_copy:
                    buf[have:have + take].copy_(torch.from_numpy(x[:take]))
                else:
                    np.copyto(buf[have:have + take].numpy(), x[:take])
            else:
                parts.append(x[:take])
            have += take
            x = x[take:]
            if have == size:
                yield _chunk_out(slot, parts, have)
                slot, parts, have = None, [], 0
    if have:
        yield _chunk_out(slot, parts, have)


def _chunk_out(slot, parts, have):
    if slot is not None:
        return slot["buf"][:have], slot
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), None


def _on_device(ev: PairEvaluator, chunk: tuple) -> torch.Tensor:
    """A chunk from :func:`_rechunk` as (n, 3, H, W) frames on the evaluator's device."""
    frames, slot = chunk
    if slot is None:
        return frames
    return ev._ring.to_device(slot, frames).permute(0, 3, 1, 2)


def auto_chunk(height: int, width: int, device=None, host_flows: bool = True) -> int:
    """Frames per batch: 8 at 256x256 and 2 at 720p on the CPU (resident memory stays near
    2 GB at 720p); on a GPU 16 at 720p without flows on the host and 8 with them (host memory
    holds uint8 frames and, with OpenCV's flows, 4 float32 flows per frame for two chunks in
    flight, pinned: 16 frames put a 2,000-frame 720p stream at 3.5 GB resident on an H200
    machine). ``host_flows``: whether flows come through the host (temporal metrics with an
    OpenCV flow: :func:`flows_on_host`; :func:`evaluator_chunk` passes it for an evaluator: the
    ``"torch"`` flow stays on the device, and chunks of 16 ran at 222-224 full-set pairs/s on
    an H200 against 197-205 with 8). Never more than 16: :func:`stream_pair` reads at most one chunk ahead of the records it
    yields, and callers that keep recent frames size their memory on that."""
    return _chunk_for(resolve_device(device).type, height, width, host_flows)


def _chunk_for(device_type: str, height: int, width: int, host_flows: bool) -> int:
    budget = ((8e6 if host_flows else 16e6) if device_type == "cuda"
              else 2.2e6)                               # pixels per side per batch
    return int(max(1, min(16 if device_type == "cuda" else 8, budget // (height * width))))


def flows_on_host(ev: "PairEvaluator") -> bool:
    """Whether ``ev``'s flows come through host memory (temporal metrics with an OpenCV flow)."""
    return ev.temporal and ev.flow[0] != "torch"


def evaluator_chunk(height: int, width: int, ev: "PairEvaluator") -> int:
    """:func:`auto_chunk` for frames of ``height`` x ``width`` measured by ``ev``."""
    return auto_chunk(height, width, ev.device, flows_on_host(ev))


def _count(chunks: Iterator[tuple]) -> int:
    return sum(c[0].shape[0] for c in chunks)


def stream_pair(frames_a: Iterable, frames_b: Iterable, *, evaluator: PairEvaluator | None = None,
                chunk: int | None = None, align: str = "error", **options) -> Iterator[dict]:
    """Yield one record per frame of two clips given as iterators; memory stays O(chunk).

    Items of the iterators: numpy ``(H, W, 3)`` frames or ``(n, H, W, 3)`` chunks (channels
    last, as :class:`evalkit.video.ClipReader` gives them), or torch ``(3, H, W)`` /
    ``(n, 3, H, W)``. ``align``: ``"error"`` (default) raises :class:`MetricInputError` when
    the clips' frame counts differ (after counting both, so the message is exact);
    ``chunk``: frames per batch, default :func:`auto_chunk` of the frame size and device.
    ``"shortest"`` compares the first min(Na, Nb) frames and records both counts in
    ``evaluator.alignment`` (hence in the summary). Options go to :class:`PairEvaluator`.
    Call ``evaluator.compute()`` afterwards for the summary.

    Two chunks are in flight: chunk k+1 is read, staged and its optical flows started before
    the records of chunk k are finished and yielded, so the flow threads never run dry and
    the device works while the next frames are read. Without flow threads all of chunk k+1's
    device work (flows included) is queued before the host waits for chunk k's numbers. The
    iterators are therefore read at most one chunk ahead of the records yielded (never more).
    """
    if align not in ALIGN_MODES:
        raise MetricInputError(f"align: expected one of {', '.join(ALIGN_MODES)}, found {align!r}")
    if not (chunk is None or (isinstance(chunk, int) and chunk >= 1)):
        raise MetricInputError(f"chunk: expected a positive integer or None, found {chunk!r}")
    ev = evaluator if evaluator is not None else PairEvaluator(**options)
    if chunk is None:
        frames_a = iter(frames_a)
        first = next(frames_a, None)
        if first is not None:
            x = _frames_of(first, "a", 0)
            chunk = evaluator_chunk(x.shape[2], x.shape[3], ev)
            frames_a = itertools.chain([first], frames_a)
        else:
            chunk = 1
    threaded = not ev.temporal
    ia = _rechunk(frames_a, "a", chunk, ev._ring, threaded)
    ib = _rechunk(frames_b, "b", chunk, ev._ring, threaded)
    pending = None
    while True:
        t_read = time.perf_counter()
        ca, cb = next(ia, None), next(ib, None)
        ev.timings["read"] += time.perf_counter() - t_read
        if ca is None and cb is None:
            break
        na = ev._next + (ca[0].shape[0] if ca is not None else 0)
        nb = ev._next + (cb[0].shape[0] if cb is not None else 0)
        if na != nb:
            if pending is not None:
                yield from ev._collect(pending)
                pending = None
            # on the device (a copy) before counting reuses the staging buffers
            da = _on_device(ev, ca).clone() if ca is not None else None
            db = _on_device(ev, cb).clone() if cb is not None else None
            na += _count(ia)
            nb += _count(ib)
            if align == "error":
                raise MetricInputError(f"b: {nb} frames, expected {na} like a (frame counts differ; "
                                       "use align='shortest' to compare the common prefix)")
            m = min(na, nb) - ev._next
            if m > 0:
                yield from ev.update(da[:m], db[:m])
            ev.alignment = {"mode": align, "frames_a": na, "frames_b": nb, "compared": ev.n,
                            "dropped_a": na - ev.n, "dropped_b": nb - ev.n}
            return
        try:
            job = ev._prepare(_on_device(ev, ca), _on_device(ev, cb))
        except MetricInputError:
            if pending is not None:         # the frames before the bad chunk still count
                yield from ev._collect(pending)
            raise
        if pending is not None and ev._waits_for_threads(pending):
            # flow threads: they get this chunk's reading and staging time before the wait
            yield from ev._collect(pending)
            pending = None
        ev._launch(job)
        if not ev._waits_for_threads(job):
            # everything of this chunk is queued on the device before the host waits for the
            # previous chunk's numbers: the device never idles while records are handed out
            ev._finish(job)
        if pending is not None:
            yield from ev._records(pending)
        pending = job
    if pending is not None:
        yield from ev._collect(pending)
    ev.alignment = {"mode": align, "frames_a": ev.n, "frames_b": ev.n, "compared": ev.n}


def evaluate_pair(frames_a: Iterable, frames_b: Iterable, *, chunk: int | None = None, align: str = "error",
                  keep_records: bool = True, **options) -> dict:
    """Run :func:`stream_pair` to the end; return the summary plus ``records`` (list or None)."""
    ev = PairEvaluator(**options)
    try:
        records = []
        for rec in stream_pair(frames_a, frames_b, evaluator=ev, chunk=chunk, align=align):
            if keep_records:
                records.append(rec)
        summary = ev.compute()
    finally:
        ev.close()
    summary["records"] = records if keep_records else None
    return summary


def json_safe(value):
    """Replace non-finite floats by ``None`` (JSON has no inf/nan) -- recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
