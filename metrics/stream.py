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
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ._common import PEAK8, as_frames, fast_path, fast_path_forced, precise, resolve_device
from ._errors import MetricInputError
from ._stream_parts import Chunk, Flicker, Flows, FlowThreads, HostRing, Lpips, Totals, timed
from .catalogue import METRICS, keys, units
from .fidelity import (
    SSIM_CHANNELS,
    luma_kernel,
    mse_exactness_kernel,
    psnr_convention,
    psnr_from_mse,
    ssim_convention,
    ssim_kernel,
)
from .flow import DEFAULT_PRESET, check_flow_options, flow_convention, resolve_flow
from .perceptual import get_model
from .temporal import FLICKER_BLOCK, check_block

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
        raise MetricInputError(
            f"cudnn_benchmark_limit: expected a non-negative integer (0: all), found {value!r}"
        )
    return limit


#: the modules of the Triton kernels the stream launches on CUDA
KERNEL_MODULES = (
    "_triton_pixels",
    "_triton_ssim",
    "_triton_temporal",
    "_triton_lpips",
    "_triton_flow",
    "_triton_pyramid",
)


def _load_kernel_modules() -> None:
    """What the first kernel launches would otherwise do on the thread that feeds the device:
    import Triton, compute its cache key (a hash of its own files, once per process: 0.4 s on
    the H200) and import :data:`KERNEL_MODULES` (Triton parses each kernel's source). Best
    effort: whatever fails here is left to the launches, which report it as before."""
    import importlib

    try:
        from triton.runtime import cache

        key = getattr(cache, "triton_key", None)  # Triton 3.x; cached for the process
        if key is not None:
            key()
        for name in KERNEL_MODULES:
            importlib.import_module(f"{__package__}.{name}")
    except Exception:  # no Triton, another version's layout: the launches load it
        pass


_PRELOAD: list = []  # the one thread of preload_kernel_modules, once started
_PRELOAD_LOCK = threading.Lock()


def preload_kernel_modules() -> concurrent.futures.Future:
    """Start :func:`_load_kernel_modules` on a thread of its own, once per process (later
    calls return the same future): an evaluator for CUDA asks for it as it is made, so Triton
    loads while the device starts and the LPIPS weights load, before :meth:`PairEvaluator.warm_up`
    needs it."""
    with _PRELOAD_LOCK:
        if not _PRELOAD:
            done: concurrent.futures.Future = concurrent.futures.Future()

            def run():
                try:
                    _load_kernel_modules()
                finally:
                    done.set_result(None)

            threading.Thread(target=run, name="metrics-preload", daemon=True).start()
            _PRELOAD.append(done)
        return _PRELOAD[0]


#: What each number means (key -> description, from :mod:`evalkit.metrics.catalogue`). Every value
#: in records and summaries is in these units.
UNITS = units()

FIDELITY_KEYS = keys(temporal=False, optional=False)  # optional ones (vmaf): evalkit.metrics.vmaf
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


def unit_into(x: torch.Tensor, dst: torch.Tensor) -> None:
    """Frames ``x`` (uint8 or [0, 1] float) as float32 in [0, 1] written into ``dst``."""
    # one pass on CUDA; on the CPU torch's converting division is slower than copy + divide
    forced = fast_path_forced("one_pass_unit")
    one_pass = forced if forced is not None else x.device.type == "cuda" and fast_path("one_pass_unit")
    if x.dtype == torch.uint8 and one_pass:
        torch.div(x, PEAK8, out=dst)  # the same float32 division as below, in one pass
        return
    dst.copy_(x)
    if x.dtype == torch.uint8:
        dst.div_(PEAK8)


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
    to the host in one copy. The parts, one job each, are in :mod:`evalkit.metrics._stream_parts`:
    the staging buffers (``HostRing``), the flow threads and the flows (``FlowThreads``,
    ``Flows``), the metrics that carry state across chunks (``Lpips``, ``Flicker``) and the
    summary's running sums (``Totals``).
    """

    def __init__(
        self,
        *,
        device=None,
        net: str = "alex",
        ssim_channel: str = "luma",
        ssim_round_luma: bool = True,
        ssim_win_size: int = 11,
        ssim_sigma: float = 1.5,
        ssim_data_range: float | None = None,
        psnr_data_range: float | None = None,
        temporal: bool = True,
        flow: str = "dis",
        flow_preset: str = DEFAULT_PRESET,
        flow_scale: float = 1.0,
        flicker_block: int = FLICKER_BLOCK,
        flow_workers: int | None = None,
        cudnn_benchmark: bool | None = None,
        cudnn_benchmark_limit: int | None = None,
    ):
        if ssim_channel not in SSIM_CHANNELS:
            raise MetricInputError(
                f"ssim_channel: expected one of {', '.join(SSIM_CHANNELS)}, found {ssim_channel!r}"
            )
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            preload_kernel_modules()  # Triton loads while the device starts and the weights load
        flow = resolve_flow(flow, self.device)
        if temporal:
            check_flow_options(flow, flow_preset, flow_scale)
            check_block(flicker_block)
        self.net = net
        self.model = get_model(net, self.device)
        self.ssim_kw = dict(
            channel=ssim_channel,
            round_luma=ssim_round_luma,
            win_size=ssim_win_size,
            sigma=ssim_sigma,
            data_range=ssim_data_range,
        )
        self.psnr_data_range = psnr_data_range
        self.temporal = temporal
        self.flow = (flow, flow_preset, flow_scale)
        self.flicker_block = flicker_block
        self.cudnn_benchmark = (
            (self.device.type == "cuda") if cudnn_benchmark is None else bool(cudnn_benchmark)
        )
        self.cudnn_benchmark_limit = _cudnn_limit(cudnn_benchmark_limit)
        if flow_workers is None:
            flow_workers = default_flow_workers(self.device)
        self.flow_workers = flow_workers if temporal and flow != "torch" else 0
        self._threads = FlowThreads(self.flow_workers)
        self._ring = HostRing(self.device)
        self._flows = Flows(self.flow, self._ring, self._threads)
        self._lpips = Lpips(self.model)
        self._flicker = Flicker(flicker_block)
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
            "compute": f"float32,{self.device.type},tf32-off"
            + (",cudnn-autotune" if self.cudnn_benchmark else ""),
        }
        if self.temporal:
            c.update(
                {
                    "flow": flow_convention(*self.flow),
                    "warp_error": "mse,rgb[0,1],backward-warp t-1->t with own flow,fwd-bwd-masked(0.01,0.5)",
                    "tlp": "abs-diff of lpips(t,t-1), lpips units",
                    "tof": "mean end-point distance, pixels",
                    "flicker": f"luma-unrounded,block{self.flicker_block},8-bit units",
                }
            )
        return c

    def reset(self) -> None:
        """Forget the clips seen so far (the model, threads and staging buffers stay)."""
        self.n = 0  # frames whose records were returned
        self._next = 0  # frames handed in (prepared); > n while a chunk is in flight
        self.size: tuple[int, int] | None = None
        # carries from the previous chunk: grey frames and [0, 1] frames (prepare), LPIPS
        # features and low-passed luma (launch)
        self._flows.reset()
        self._lpips.reset()
        self._flicker.reset()
        self._totals = Totals()
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
            loading = preload_kernel_modules()  # started as the evaluator was made
            if self.cudnn_benchmark:
                with precise(True, self.cudnn_benchmark_limit):
                    self.model.features(
                        torch.zeros((chunk, 3, height, width), device=self.device), normalised=False
                    )
            loading.result()
        for _ in stream_pair(iter([frames]), iter([frames]), evaluator=self, chunk=chunk):
            pass
        self.reset()

    def close(self) -> None:
        self._threads.close()
        self._ring.clear()
        if self.device.type == "cuda":
            from .torchflow import FLOW_GRAPHS

            FLOW_GRAPHS.clear()  # the graphs' memory pool back to the allocator

    def _precise(self):
        """The numeric context of the launches: float32, TF32 off, cuDNN as configured."""
        return precise(self.cudnn_benchmark, self.cudnn_benchmark_limit)

    # -- work ----------------------------------------------------------------------------------
    def update(self, a, b) -> list[dict]:
        """Add the next ``(n, 3, H, W)`` frames of both clips; return their n records."""
        job = self._prepare(a, b)
        self._launch(job)
        return self._collect(job)

    def _prepare(self, a, b) -> Chunk:
        """Check and stage a chunk; start its optical flows (in the flow threads, if any)."""
        with timed(self.timings, "prepare"):
            a, b = self._checked(a, b)
            job = Chunk()
            job.t0, job.n, job.a, job.b = self._next, a.shape[0], a, b
            job.has_prev = self.temporal and self._next > 0
            job.temporal = self.temporal and (job.has_prev or job.n > 1)
            job.numel = a[0].numel()
            with precise():
                self._stage(job)
                if self.temporal:
                    self._flows.start(job)
            self._next += job.n
        return job

    def _checked(self, a, b) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk of both clips as frames on the device, of one size (the first chunk's) and
        one count."""
        a = as_frames(a, "a", device=self.device, offset=self._next)
        b = as_frames(b, "b", device=self.device, offset=self._next)
        size = (a.shape[3], a.shape[2])
        for name, x in (("a", a), ("b", b)):
            if (x.shape[3], x.shape[2]) != (self.size or size):
                w, h = self.size or size
                raise MetricInputError(
                    f"frame {self._next} is {x.shape[3]}x{x.shape[2]}, expected {w}x{h} like frame 0 of a",
                    field=name,
                )
        if a.shape[0] != b.shape[0]:
            raise MetricInputError(f"chunk of {b.shape[0]} frames, expected {a.shape[0]} like a", field="b")
        self.size = size
        return a, b

    def _stage(self, job: Chunk) -> None:
        """Both clips in one [0, 1] float32 batch (the LPIPS input, contiguous NCHW) and their
        rounded luma (SSIM's default input and the flows')."""
        n, h, w = job.n, job.a.shape[2], job.a.shape[3]
        u = torch.empty((2 * n, 3, h, w), dtype=torch.float32, device=self.device)
        unit_into(job.a, u[:n])
        unit_into(job.b, u[n:])
        job.u, job.ua, job.ub = u, u[:n], u[n:]
        job.ya, job.yb = luma_kernel(job.a), luma_kernel(job.b)
        job.flow_dev = None

    def _launch(self, job: Chunk) -> None:
        """Queue the chunk's LPIPS, tLP, SSIM, PSNR, exactness and flicker (no host wait)."""
        with timed(self.timings, "launch"):
            out: dict[str, torch.Tensor] = {}
            first: dict[str, int] = {}  # frame number of each array's element 0
            with self._precise():
                self._lpips.launch(
                    job,
                    out,
                    carry=self.temporal,
                    two_passes=(self.cudnn_benchmark and self.device.type == "cuda"),
                )
                self._pixels(job, out)
                if self.temporal:
                    self._flicker.launch(job, out, first)
            self._totals.set_peak(job.a, job.b, self.psnr_data_range)
            job.out, job.first = out, first
            # the frames themselves are no longer needed (the staging buffer may be reused)
            job.a = job.b = job.ya = job.yb = job.u = job.ua = job.ub = None

    def _pixels(self, job: Chunk, out: dict) -> None:
        """Queue the chunk's pixel fidelity: SSIM, the squared error (PSNR) and exactness."""
        lumas = (job.ya, job.yb) if self.ssim_kw["channel"] == "luma" and self.ssim_kw["round_luma"] else None
        out["ssim"] = ssim_kernel(job.a, job.b, **self.ssim_kw, lumas=lumas)
        job.mse, ex = mse_exactness_kernel(job.a, job.b)
        out["max_abs_diff"], out["diff_fraction"] = ex["max_abs_diff"], ex["diff_fraction"]

    def _waits_for_threads(self, job: Chunk) -> bool:
        """Whether finishing ``job`` waits for flow threads (then give them time first)."""
        return bool(job.futures)

    def _finish(self, job: Chunk) -> None:
        """Queue the chunk's warping errors and tOF (from its flows) and the copy of all its
        per-frame numbers to the host. Waits only for the flow threads, if any: on a GPU the
        copy is asynchronous (pinned memory), so the next chunk's work can be queued before
        :meth:`_records` waits for this one."""
        if job.finished:
            return
        if job.temporal:
            with timed(self.timings, "flow_wait"):
                self._flows.wait(job)
        with timed(self.timings, "collect"):
            if job.temporal:
                self._flows.warp_errors(job, job.out, self._precise)
            self._to_host(job)

    def _to_host(self, job: Chunk) -> None:
        """Every per-frame number of the chunk to the host in one copy."""
        out = job.out
        job.keys = list(out)
        with torch.inference_mode():
            flat = torch.cat([out[k].reshape(-1).double() for k in job.keys] + [job.mse.double()])
            job.flat, job.result_slot = self._ring.to_host("results", flat)
        job.sizes = {k: out[k].numel() for k in job.keys}
        job.out = job.mse = None
        job.finished = True

    def _collect(self, job: Chunk) -> list[dict]:
        """Finish the chunk (:meth:`_finish`) and return its records."""
        self._finish(job)
        return self._records(job)

    def _records(self, job: Chunk) -> list[dict]:
        """Wait for the chunk's numbers on the host and return its records."""
        with timed(self.timings, "collect"):
            self._ring.ready(job.result_slot)
            host, mse_h = _unpacked(job)
            t_first = job.t0 if job.has_prev else job.t0 + 1  # first frame with a t-1 -> t transition
            records = []
            for i in range(job.n):
                e = float(mse_h[i])
                rec = self._record(job.t0 + i, i, host, e, job.first, t_first)
                records.append(rec)
                self._totals.add(rec, e, job.numel)
            self.n += job.n
        return records

    def _record(self, t: int, i: int, host: dict, e: float, first: dict, t_first: int) -> dict:
        """Frame ``t``'s record (element ``i`` of the chunk; ``e``: its mean squared error)."""
        rec: dict[str, Any] = {
            "frame": t,
            "lpips": float(host["lpips"][i]),
            "ssim": float(host["ssim"][i]),
            "psnr": psnr_from_mse(e, self._totals.peak),
            "max_abs_diff": float(host["max_abs_diff"][i]),
            "diff_fraction": float(host["diff_fraction"][i]),
        }
        rec["identical"] = rec["max_abs_diff"] == 0.0
        for k in TEMPORAL_KEYS:
            if k in host:
                j = t - first.get(k, t_first)
                if 0 <= j < len(host[k]):
                    rec[k] = float(host[k][j])
        return rec

    def compute(self) -> dict:
        """Summary: means (see module doc), counts, identity, conventions, units, alignment."""
        if self.n == 0:
            raise MetricInputError("no frames were compared", field="a")
        totals = self._totals
        w, h = self.size
        return {
            "frames": self.n,
            "width": w,
            "height": h,
            "device": str(self.device),
            "means": totals.means(FIDELITY_KEYS + (TEMPORAL_KEYS if self.temporal else ()), self.n),
            "psnr_pooled": totals.pooled_psnr(),
            "identical": totals.identical == self.n,
            "identical_frames": totals.identical,
            "nan_counts": {
                k: self.n_expected(k) - totals.counts.get(k, 0)
                for k in ("warp_error_a", "warp_error_b")
                if self.temporal and self.n_expected(k) - totals.counts.get(k, 0) > 0
            },
            "conventions": self.conventions,
            "alignment": dict(self.alignment),
        }

    def n_expected(self, key: str) -> int:
        """Frames that have ``key``: all but the first ``first_frame`` (see the catalogue)."""
        return max(self.n - METRICS[key].first_frame, 0)


def _unpacked(job: Chunk) -> tuple[dict, np.ndarray]:
    """A chunk's numbers on the host, split by key, and its per-frame squared errors."""
    flat = job.flat.numpy()
    host, at = {}, 0
    for k in job.keys:
        size = job.sizes[k]
        host[k] = flat[at : at + size]
        at += size
    return host, flat[at : at + job.n]


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
            raise MetricInputError(
                f"frame {index}: expected a tensor (3, H, W) frame or "
                f"(n, 3, H, W) chunk, found shape {tuple(item.shape)}",
                field=name,
            )
        return item
    raise MetricInputError(
        f"frame {index}: expected a numpy array or torch tensor, found {type(item).__name__}", field=name
    )


def _hwc_of(item: np.ndarray, name: str, index: int) -> np.ndarray:
    if item.ndim == 3:
        item = item[None]
    if item.ndim != 4 or item.shape[3] != 3:
        raise MetricInputError(
            f"frame {index}: expected a numpy (H, W, 3) frame or "
            f"(n, H, W, 3) chunk, found shape {item.shape}",
            field=name,
        )
    return np.ascontiguousarray(item) if any(s < 0 for s in item.strides) else item


def _rechunk(
    frames: Iterable, name: str, size: int, ring: HostRing, threaded_copy: bool = False
) -> Iterator[tuple]:
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
    parts: list[torch.Tensor] = []  # device tensors of the chunk being gathered
    first_hw = None
    for item in frames:
        if isinstance(item, torch.Tensor) and item.device.type != "cpu" and slot is None:
            x, on_host = _frames_of(item, name, index), False
            hw = (x.shape[2], x.shape[3])
        elif isinstance(item, torch.Tensor):
            x, on_host = _frames_of(item, name, index).permute(0, 2, 3, 1).cpu().numpy(), True
            hw = x.shape[1:3]
        else:
            x, on_host = (
                (
                    _hwc_of(item, name, index)
                    if isinstance(item, np.ndarray)
                    else _frames_of(item, name, index)
                ),
                True,
            )
            hw = x.shape[1:3]
        if first_hw is None:
            first_hw = hw
        elif hw != first_hw:
            raise MetricInputError(
                f"frame {index} is {hw[1]}x{hw[0]}, expected "
                f"{first_hw[1]}x{first_hw[0]} like frame 0 of {name}",
                field=name,
            )
        if on_host and parts:  # a chunk gathered on the device goes on there
            x, on_host = (
                torch.from_numpy(np.ascontiguousarray(x)).to(parts[0].device).permute(0, 3, 1, 2),
                False,
            )
        index += x.shape[0]
        while x.shape[0]:
            take = min(size - have, x.shape[0])
            if on_host:
                if slot is None:
                    dtype = torch.from_numpy(x[:0]).dtype
                    slot = ring.get(key, (size, *hw, 3), dtype)
                buf = slot["buf"]
                if torch.from_numpy(x[:0]).dtype != buf.dtype:
                    raise MetricInputError(
                        f"frame {index - x.shape[0]} is "
                        f"{x.dtype}, expected {str(buf.dtype).replace('torch.', '')} "
                        "like the frames before it",
                        field=name,
                    )
                if threaded_copy:
                    buf[have : have + take].copy_(torch.from_numpy(x[:take]))
                else:
                    np.copyto(buf[have : have + take].numpy(), x[:take])
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
    budget = (8e6 if host_flows else 16e6) if device_type == "cuda" else 2.2e6  # pixels per side per batch
    return int(max(1, min(16 if device_type == "cuda" else 8, budget // (height * width))))


def flows_on_host(ev: "PairEvaluator") -> bool:
    """Whether ``ev``'s flows come through host memory (temporal metrics with an OpenCV flow)."""
    return ev.temporal and ev.flow[0] != "torch"


def evaluator_chunk(height: int, width: int, ev: "PairEvaluator") -> int:
    """:func:`auto_chunk` for frames of ``height`` x ``width`` measured by ``ev``."""
    return auto_chunk(height, width, ev.device, flows_on_host(ev))


def _count(chunks: Iterator[tuple]) -> int:
    return sum(c[0].shape[0] for c in chunks)


def stream_pair(
    frames_a: Iterable,
    frames_b: Iterable,
    *,
    evaluator: PairEvaluator | None = None,
    chunk: int | None = None,
    align: str = "error",
    **options,
) -> Iterator[dict]:
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
                raise MetricInputError(
                    f"{nb} frames, expected {na} like a",
                    field="b",
                    hint="frame counts differ; use align='shortest' to compare the common prefix",
                )
            m = min(na, nb) - ev._next
            if m > 0:
                yield from ev.update(da[:m], db[:m])
            ev.alignment = {
                "mode": align,
                "frames_a": na,
                "frames_b": nb,
                "compared": ev.n,
                "dropped_a": na - ev.n,
                "dropped_b": nb - ev.n,
            }
            return
        try:
            job = ev._prepare(_on_device(ev, ca), _on_device(ev, cb))
        except MetricInputError:
            if pending is not None:  # the frames before the bad chunk still count
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


def evaluate_pair(
    frames_a: Iterable,
    frames_b: Iterable,
    *,
    chunk: int | None = None,
    align: str = "error",
    keep_records: bool = True,
    **options,
) -> dict:
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
