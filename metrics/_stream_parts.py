"""The parts of :class:`evalkit.metrics.stream.PairEvaluator`, one job each.

:class:`HostRing` stages frames for the device and brings results back; :class:`Chunk` is one
chunk on its way through the evaluator; :class:`FlowThreads` runs OpenCV flows beside the
tensor work; :class:`Flows` computes a chunk's optical flows (on the device, or through the
host and the flow threads) and its warping errors; :class:`Lpips` and :class:`Flicker` are the
metrics that carry state from one chunk to the next; :class:`Totals` keeps the running sums of
the summary; :func:`timed` adds a stage's wall time to the evaluator's ``timings``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch

from .fidelity import psnr_from_mse
from .flow import device_flows, flow_into
from .temporal import lowpass_luma, temporal_from_flows


@contextlib.contextmanager
def timed(timings: dict, key: str):
    """Add the wall seconds of the ``with`` block to ``timings[key]`` (not when it raises)."""
    t_start = time.perf_counter()
    yield
    timings[key] += time.perf_counter() - t_start


class HostRing:
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
        if (
            buf is None
            or buf.dtype != dtype
            or tuple(buf.shape[1:]) != tuple(shape[1:])
            or buf.shape[0] < shape[0]
        ):
            slot["buf"] = None  # let the old one go first
            slot["buf"] = self._alloc(shape, dtype)
        return slot

    def _alloc(self, shape, dtype) -> torch.Tensor:
        if self.pin:
            try:
                return torch.empty(shape, dtype=dtype, pin_memory=True)
            except RuntimeError:  # no page-locked memory to be had: pageable, synchronous copies
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
        host = slot["buf"][: x.numel()]
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


class Chunk:
    """One chunk on its way through :class:`~evalkit.metrics.stream.PairEvaluator` (prepare -> launch
    -> finish -> records)."""

    __slots__ = (
        "t0",
        "n",
        "has_prev",
        "temporal",
        "a",
        "b",
        "u",
        "ua",
        "ub",
        "ya",
        "yb",
        "pa",
        "pb",
        "m",
        "flow_slot",
        "flow_dev",
        "futures",
        "out",
        "first",
        "mse",
        "numel",
        "keys",
        "sizes",
        "flat",
        "result_slot",
        "finished",
    )

    def __init__(self):
        self.futures = []
        self.finished = False
        self.result_slot = None


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


class FlowThreads:
    """``workers`` OpenCV flow threads running alongside the tensor work (0: flows computed
    inline); with more than one, OpenCV's own threading is set to 1 until :meth:`close`."""

    def __init__(self, workers: int):
        self._pool = None
        self._cv_held = False
        if workers > 0:
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="metrics-flow")
            if workers > 1:
                _cv_threads_acquire()
                self._cv_held = True

    def start(self, host: np.ndarray, pairs: list, flow: tuple) -> list:
        """Each of ``pairs``' flow (:func:`evalkit.metrics.flow.flow_into` with the ``flow`` settings)
        written into ``host[i]``: the threads' futures, or ``[]`` when computed inline."""
        if self._pool is not None:
            return [self._pool.submit(flow_into, host[i], s, d, *flow) for i, (s, d) in enumerate(pairs)]
        for i, (s, d) in enumerate(pairs):
            flow_into(host[i], s, d, *flow)
        return []

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._cv_held:
            _cv_threads_release()
            self._cv_held = False


def _u8(y: torch.Tensor) -> np.ndarray:
    """Rounded luma planes (N, 1, H, W) float -> (N, H, W) uint8 numpy (OpenCV flow input)."""
    return y.clamp(0, 255).to(torch.uint8)[:, 0].cpu().numpy()


class Flows:
    """A chunk's optical flows (forward and backward between successive frames, on each clip)
    and the warping errors and tOF computed from them, carrying the last frame's grey image
    and [0, 1] pixels to the next chunk. ``flow``: (method, preset, scale); the ``"torch"``
    flow runs on the device, queued with the rest; the others through host memory (``ring``)
    in ``threads``."""

    def __init__(self, flow: tuple, ring: HostRing, threads: FlowThreads):
        self.flow, self.ring, self.threads = flow, ring, threads
        self.reset()

    def reset(self) -> None:
        self.grey = self.unit = None

    def start(self, job: Chunk) -> None:
        """Start ``job``'s flows (its frames staged: ``ya``, ``yb``, ``ua``, ``ub``) and keep
        what the next chunk needs."""
        if job.temporal and self.flow[0] == "torch":
            self._on_device(job)
        elif job.temporal:
            self._through_host(job)
        elif self.flow[0] == "torch":  # a first chunk of one frame
            self.grey = (job.ya[-1:].clone(), job.yb[-1:].clone())
        else:  # a first chunk of one frame
            g = _u8(torch.cat([job.ya[-1:], job.yb[-1:]]))
            self.grey = (g[0].copy(), g[1].copy())
        self.unit = (job.ua[-1:].clone(), job.ub[-1:].clone())

    def _on_device(self, job: Chunk) -> None:
        """The ``"torch"`` flows, queued on the device (no host round trip)."""
        ya, yb = job.ya, job.yb
        if job.has_prev:
            ya = torch.cat([self.grey[0], ya])
            yb = torch.cat([self.grey[1], yb])
        job.m = ya.shape[0] - 1
        # fwd a, bwd a, fwd b, bwd b, from slices: an index list would be copied to the
        # device from pageable memory, and the host would wait for the queue to drain
        src = torch.cat([ya[:-1], ya[1:], yb[:-1], yb[1:]])
        dst = torch.cat([ya[1:], ya[:-1], yb[1:], yb[:-1]])
        job.flow_dev = device_flows(src, dst, self.flow[2])
        job.futures = []
        self._warped(job)
        self.grey = (ya[-1:].clone(), yb[-1:].clone())

    def _through_host(self, job: Chunk) -> None:
        """OpenCV's flows on the grey frames (the one wait of the chunk), written into a host
        buffer by the flow threads (or inline)."""
        n = job.n
        g = _u8(torch.cat([job.ya, job.yb]))  # the one wait of the chunk
        ga, gb = g[:n], g[n:]
        if job.has_prev:
            ga = np.concatenate([self.grey[0][None], ga])
            gb = np.concatenate([self.grey[1][None], gb])
        pairs = []
        for gr in (ga, gb):
            pairs += [(gr[i - 1], gr[i]) for i in range(1, len(gr))]  # forward t-1 -> t
            pairs += [(gr[i], gr[i - 1]) for i in range(1, len(gr))]  # backward t -> t-1
        job.m = len(ga) - 1
        h, w = job.a.shape[2], job.a.shape[3]
        slot = self.ring.get("flow", (len(pairs), h, w, 2), torch.float32)
        job.futures = self.threads.start(slot["buf"].numpy(), pairs, self.flow)
        if job.futures:
            slot["futures"] = job.futures
        job.flow_slot = slot
        self._warped(job)
        self.grey = (ga[-1].copy(), gb[-1].copy())

    def _warped(self, job: Chunk) -> None:
        """The frames the flows warp: the chunk's, after the previous chunk's last."""
        if job.has_prev:
            job.pa = torch.cat([self.unit[0], job.ua])
            job.pb = torch.cat([self.unit[1], job.ub])
        else:
            job.pa, job.pb = job.ua, job.ub

    @staticmethod
    def wait(job: Chunk) -> None:
        """Wait for ``job``'s flow threads (re-raises a flow thread's error)."""
        for fu in job.futures:
            fu.result()

    def warp_errors(self, job: Chunk, out: dict, precise: Callable) -> None:
        """``job``'s warping errors and tOF into ``out`` (its flows on the device in one copy,
        warped and masked there; ``precise``: the evaluator's numeric context)."""
        m = job.m
        if job.flow_dev is None:
            fl = self.ring.to_device(job.flow_slot, job.flow_slot["buf"][: 4 * m])
        with precise():
            if job.flow_dev is None:
                fl = fl.permute(0, 3, 1, 2).contiguous()  # (4m, 2, H, W)
            else:
                fl, job.flow_dev = job.flow_dev, None
            fwd_a, bwd_a, fwd_b, bwd_b = fl[:m], fl[m : 2 * m], fl[2 * m : 3 * m], fl[3 * m :]
            # on CUDA one Triton pass per clip (evalkit.metrics._triton_temporal), else torch
            out["warp_error_a"], out["warp_error_b"], out["tof"] = temporal_from_flows(
                job.pa, job.pb, fwd_a, bwd_a, fwd_b, bwd_b
            )
            out["warp_error_diff"] = out["warp_error_b"] - out["warp_error_a"]
        del fl, fwd_a, bwd_a, fwd_b, bwd_b
        job.pa = job.pb = None


class Lpips:
    """LPIPS of each frame pair and tLP (from the same trunk pass), carrying the last frame's
    features to the next chunk. Where the Triton head runs (picked at a clip's first chunk: the
    carried features match), the features stay raw and each distance normalises them in its
    one pass."""

    def __init__(self, model):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.feats = None
        self.raw = False  # LPIPS features raw for the Triton head (set per clip)

    def launch(self, job: Chunk, out: dict, *, two_passes: bool, carry: bool) -> None:
        """Queue ``job``'s LPIPS (and tLP when the chunk is temporal) into ``out``; one trunk
        pass per frame (A and B in one batch, or in two when ``two_passes``); ``carry``: keep
        the last frame's features."""
        n = job.n
        if not job.has_prev:
            self.raw = self.model.fused()
        raw = self.raw
        if two_passes:
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
            pf = self.feats
            da = self._successive(pf[0] if job.has_prev else None, fa, raw)
            db = self._successive(pf[1] if job.has_prev else None, fb, raw)
            out["tlp"] = (da - db).abs()
        if carry:
            # clones: views would keep the whole chunk's features alive
            self.feats = ([t[-1:].clone() for t in fa], [t[-1:].clone() for t in fb])
        del fa, fb

    def _successive(self, prev_feats, feats, raw: bool = False) -> torch.Tensor:
        """LPIPS(x_t, x_t-1) for each frame of the chunk that has a predecessor (no copies);
        ``raw``: the features are raw trunk outputs."""
        parts = []
        if prev_feats is not None:
            parts.append(self.model.distance([f[:1] for f in feats], prev_feats, normalised=not raw))
        if feats[0].shape[0] > 1:
            parts.append(
                self.model.distance([f[1:] for f in feats], [f[:-1] for f in feats], normalised=not raw)
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class Flicker:
    """Flicker on block-averaged luma, carrying the last two low-passed frames."""

    def __init__(self, block: int):
        self.block = block
        self.reset()

    def reset(self) -> None:
        self.low = None

    def launch(self, job: Chunk, out: dict, first: dict) -> None:
        """Queue ``job``'s flicker (and, from frame 2, each clip's) into ``out``; ``first``:
        the frame number of each array's element 0."""
        n, t0 = job.n, job.t0
        la, lb = lowpass_luma(job.a, self.block), lowpass_luma(job.b, self.block)
        if job.has_prev:
            la, lb = torch.cat([self.low[0], la]), torch.cat([self.low[1], lb])
        l_first = t0 + n - la.shape[0]  # frame number of la[0]
        if la.shape[0] >= 2:
            da_, db_ = la[1:] - la[:-1], lb[1:] - lb[:-1]
            fl_pair = (da_ - db_).abs().mean((1, 2, 3))
            out["flicker"] = fl_pair[max(0, t0 - (l_first + 1)) :]
            if la.shape[0] >= 3:
                out["flicker_a"] = (da_[1:] - da_[:-1]).abs().mean((1, 2, 3))
                out["flicker_b"] = (db_[1:] - db_[:-1]).abs().mean((1, 2, 3))
                first["flicker_a"] = first["flicker_b"] = l_first + 2
        self.low = (la[-2:].clone(), lb[-2:].clone())


class Totals:
    """The running sums of a clip's records, for the summary: per key the sum and count of
    its finite values (``psnr``: of the frames not identical), identical frames, the pooled
    squared error and the PSNR peak (set from the first chunk)."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.identical = 0
        self.sq_total = 0.0  # pooled squared error (8-bit or [0,1] units) for psnr_pooled
        self.px_total = 0
        self.peak = None

    def set_peak(self, a: torch.Tensor, b: torch.Tensor, data_range: float | None) -> None:
        """The PSNR peak, once: ``data_range``, else 255 for uint8 frames and 1 otherwise."""
        if self.peak is None:
            u8 = a.dtype == torch.uint8 and b.dtype == torch.uint8
            self.peak = (255.0 if u8 else 1.0) if data_range is None else float(data_range)

    def add(self, rec: dict, mse: float, numel: int) -> None:
        """One frame's record and its mean squared error over ``numel`` values."""
        if rec["identical"]:
            self.identical += 1
        for k, v in rec.items():
            if k in ("frame", "identical") or not isinstance(v, float) or math.isnan(v):
                continue
            if k == "psnr" and math.isinf(v):
                continue
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1
        self.sq_total += mse * numel
        self.px_total += numel

    def means(self, keys, frames: int) -> dict[str, float | None]:
        """The mean of each of ``keys`` (None where no frame has it); ``psnr`` ``inf`` when all
        ``frames`` are identical; ``warp_error_diff`` the difference of the two means."""
        means: dict[str, float | None] = {}
        for k in keys:
            c = self.counts.get(k, 0)
            means[k] = self.sums[k] / c if c else None
        if means["psnr"] is None and self.identical == frames:
            means["psnr"] = math.inf
        if means.get("warp_error_a") is not None and means.get("warp_error_b") is not None:
            means["warp_error_diff"] = means["warp_error_b"] - means["warp_error_a"]
        return means

    def pooled_psnr(self) -> float | None:
        """The PSNR of the squared error pooled over every frame (None before any)."""
        if self.px_total and self.peak:
            return psnr_from_mse(self.sq_total / self.px_total, self.peak)
        return None
