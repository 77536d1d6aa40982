"""Streaming pair evaluation: two frame iterators in, one record per frame out.

:class:`PairEvaluator` is the stateful layer over the functional modules (torchmetrics
style): :meth:`~PairEvaluator.update` takes the next chunk of both clips and returns their
per-frame records, carrying only what the next chunk needs (the last frame's LPIPS features,
grey image, pixels and low-passed luma); :meth:`~PairEvaluator.compute` gives the summary.
:func:`stream_pair` drives it from two iterators, :func:`evaluate_pair` collects everything.

Per-frame record keys (units in :data:`UNITS`)::

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

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ._common import as_frames, luma, precise, resolve_device, to_unit
from ._errors import MetricInputError
from .fidelity import (SSIM_CHANNELS, _exactness, _mse, _ssim, psnr_convention, psnr_from_mse,
                       ssim_convention)
from .flow import check_flow_options, flow_convention, flows_u8, to_tensor_flow
from .perceptual import get_model
from .temporal import (FLICKER_BLOCK, _check_block, lowpass_luma, tof_from_flows,
                       warping_error_from_flows)

ALIGN_MODES = ("error", "shortest")


def _u8(y: torch.Tensor) -> np.ndarray:
    """Rounded luma planes (N, 1, H, W) float -> (N, H, W) uint8 numpy (OpenCV flow input)."""
    return y.clamp(0, 255).to(torch.uint8)[:, 0].cpu().numpy()

#: What each number means. Every value in records and summaries is in these units.
UNITS = {
    "lpips": "LPIPS v0.1 distance (unitless, 0 = same); inputs scaled to [-1, 1]",
    "ssim": "SSIM index (unitless, 1 = same)",
    "psnr": "dB, peak 255 on 8-bit RGB; inf (JSON null) for identical frames",
    "max_abs_diff": "largest |a - b| of any channel value, 8-bit units (0..255)",
    "diff_fraction": "share of pixel positions where any channel differs (0..1)",
    "tlp": "|LPIPS(a_t, a_t-1) - LPIPS(b_t, b_t-1)|, LPIPS units (TecoGAN tables show x100)",
    "tof": "mean end-point distance of the t-1->t flows of a and b, pixels (TecoGAN shows x10)",
    "warp_error_a": "MSE of frame t-1 warped onto t (own flow, fwd-bwd masked), RGB in [0, 1] "
                    "units (x65025 for 8-bit units)",
    "warp_error_b": "as warp_error_a, for clip b",
    "warp_error_diff": "warp_error_b - warp_error_a (positive: b less temporally consistent)",
    "flicker": "mean |dLa_t - dLb_t| of 16x16-block-averaged luma, 8-bit units",
    "flicker_a": "mean |dL_t - dL_t-1| of clip a's block-averaged luma, 8-bit units",
    "flicker_b": "as flicker_a, for clip b",
}

FIDELITY_KEYS = ("lpips", "ssim", "psnr", "max_abs_diff", "diff_fraction")
TEMPORAL_KEYS = ("tlp", "tof", "warp_error_a", "warp_error_b", "warp_error_diff", "flicker",
                 "flicker_a", "flicker_b")


class PairEvaluator:
    """Full-reference and temporal metrics of two clips, fed chunk by chunk.

    Settings that change scores (all named in :attr:`conventions`):
    net (``"alex"``/``"vgg"``), ssim_channel (``"luma"``/``"rgb"``), ssim_round_luma,
    ssim_win_size, ssim_sigma, ssim_data_range, psnr_data_range, flow (``"dis"``/``"farneback"``),
    flow_preset (DIS preset), flow_scale, flicker_block, temporal (compute temporal metrics).

    device: where the metrics run (default: CUDA if available, else CPU); float32 with TF32 off.
    flow_workers: OpenCV flow threads running alongside the tensor work (default: 0 -- inline --
    on the CPU, CPU count - 2 (at most 16) when the metrics run on a GPU). Results do not depend on it.
    """

    def __init__(self, *, device=None, net: str = "alex", ssim_channel: str = "luma",
                 ssim_round_luma: bool = True, ssim_win_size: int = 11, ssim_sigma: float = 1.5,
                 ssim_data_range: float | None = None, psnr_data_range: float | None = None,
                 temporal: bool = True, flow: str = "dis", flow_preset: str = "medium",
                 flow_scale: float = 1.0, flicker_block: int = FLICKER_BLOCK,
                 flow_workers: int | None = None):
        if ssim_channel not in SSIM_CHANNELS:
            raise MetricInputError(f"ssim_channel: expected one of {', '.join(SSIM_CHANNELS)}, "
                                   f"found {ssim_channel!r}")
        if temporal:
            check_flow_options(flow, flow_preset, flow_scale)
            _check_block(flicker_block)
        self.device = resolve_device(device)
        self.net = net
        self.model = get_model(net, self.device)
        self.ssim_kw = dict(channel=ssim_channel, round_luma=ssim_round_luma,
                            win_size=ssim_win_size, sigma=ssim_sigma, data_range=ssim_data_range)
        self.psnr_data_range = psnr_data_range
        self.temporal = temporal
        self.flow = (flow, flow_preset, flow_scale)
        self.flicker_block = flicker_block
        if flow_workers is None:
            flow_workers = 0 if self.device.type == "cpu" else max(1, min(16, (os.cpu_count() or 2) - 2))
        self.flow_workers = flow_workers
        self._pool = ThreadPoolExecutor(flow_workers) if flow_workers > 0 else None
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
            "compute": f"float32,{self.device.type},tf32-off",
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
        self.n = 0
        self.size: tuple[int, int] | None = None
        self._prev = None        # carry from the previous chunk
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._identical = 0
        self._sq_total = 0.0     # pooled squared error (8-bit or [0,1] units) for psnr_pooled
        self._px_total = 0
        self._peak = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- work ----------------------------------------------------------------------------------
    def update(self, a, b) -> list[dict]:
        """Add the next ``(n, 3, H, W)`` frames of both clips; return their n records."""
        a = as_frames(a, "a", device=self.device, offset=self.n)
        b = as_frames(b, "b", device=self.device, offset=self.n)
        size = (a.shape[3], a.shape[2])
        for name, x in (("a", a), ("b", b)):
            if (x.shape[3], x.shape[2]) != (self.size or size):
                w, h = self.size or size
                raise MetricInputError(f"{name}: frame {self.n} is {x.shape[3]}x{x.shape[2]}, "
                                       f"expected {w}x{h} like frame 0 of a")
        if a.shape[0] != b.shape[0]:
            raise MetricInputError(f"b: chunk of {b.shape[0]} frames, expected {a.shape[0]} like a")
        self.size = size
        n = a.shape[0]
        t0 = self.n
        prev = self._prev
        temporal = self.temporal and (prev is not None or n > 1)
        out: dict[str, torch.Tensor] = {}
        first: dict[str, int] = {}                    # frame number of each array's element 0
        with precise():
            ua, ub = to_unit(a), to_unit(b)
            # 1. flows first (OpenCV threads run while the tensor work below proceeds)
            ya, yb = luma(a), luma(b)        # rounded luma: SSIM (default) and flow input
            if temporal:
                ga, gb = _u8(ya), _u8(yb)
                if prev is not None:
                    ga = np.concatenate([prev["ga"][None], ga])
                    gb = np.concatenate([prev["gb"][None], gb])
                pairs = []
                for g in (ga, gb):
                    pairs += [(g[i - 1], g[i]) for i in range(1, len(g))]   # forward t-1 -> t
                    pairs += [(g[i], g[i - 1]) for i in range(1, len(g))]   # backward t -> t-1
                flows = flows_u8(pairs, *self.flow, executor=self._pool)
            # 2. LPIPS: one trunk pass per frame, reused by tLP
            f = self.model.features(torch.cat([ua, ub], 0))
            fa, fb = [t[:n] for t in f], [t[n:] for t in f]
            out["lpips"] = self.model.distance(fa, fb)
            if temporal:
                da = self._successive(prev["fa"] if prev else None, fa)
                db = self._successive(prev["fb"] if prev else None, fb)
                out["tlp"] = (da - db).abs()
            # clones: views would keep the whole chunk's features alive
            carry_fa = [t[-1:].clone() for t in fa]
            carry_fb = [t[-1:].clone() for t in fb]
            del f, fa, fb
            # 3. pixel fidelity
            lumas = (ya, yb) if self.ssim_kw["channel"] == "luma" and self.ssim_kw["round_luma"] else None
            out["ssim"] = _ssim(a, b, **self.ssim_kw, lumas=lumas)
            mse = _mse(a, b)
            ex = _exactness(a, b)
            out["max_abs_diff"], out["diff_fraction"] = ex["max_abs_diff"], ex["diff_fraction"]
            # 4. flicker on block-averaged luma (carry: the last two low-passed frames)
            if self.temporal:
                la, lb = lowpass_luma(a, self.flicker_block), lowpass_luma(b, self.flicker_block)
                if prev is not None:
                    la, lb = torch.cat([prev["la"], la]), torch.cat([prev["lb"], lb])
                l_first = t0 + n - la.shape[0]            # frame number of la[0]
                if la.shape[0] >= 2:
                    da_, db_ = la[1:] - la[:-1], lb[1:] - lb[:-1]
                    fl_pair = (da_ - db_).abs().mean((1, 2, 3))
                    out["flicker"] = fl_pair[max(0, t0 - (l_first + 1)):]
                    if la.shape[0] >= 3:
                        out["flicker_a"] = (da_[1:] - da_[:-1]).abs().mean((1, 2, 3))
                        out["flicker_b"] = (db_[1:] - db_[:-1]).abs().mean((1, 2, 3))
                        first["flicker_a"] = first["flicker_b"] = l_first + 2
            # 5. warping error and tOF from the flows
            if temporal:
                if self._pool is not None:
                    flows = [fu.result() for fu in flows]
                m = len(ga) - 1
                fl = to_tensor_flow(flows, self.device)
                fwd_a, bwd_a, fwd_b, bwd_b = fl[:m], fl[m:2 * m], fl[2 * m:3 * m], fl[3 * m:]
                pa = torch.cat([prev["ua"], ua]) if prev is not None else ua
                pb = torch.cat([prev["ub"], ub]) if prev is not None else ub
                out["warp_error_a"] = warping_error_from_flows(pa[:-1], pa[1:], bwd_a, fwd_a)
                out["warp_error_b"] = warping_error_from_flows(pb[:-1], pb[1:], bwd_b, fwd_b)
                out["warp_error_diff"] = out["warp_error_b"] - out["warp_error_a"]
                out["tof"] = tof_from_flows(fwd_a, fwd_b)
            # carry what the next chunk needs
            if self.temporal:
                self._prev = {
                    "fa": carry_fa, "fb": carry_fb,
                    "ga": ga[-1].copy() if temporal else _u8(ya[-1:])[0],
                    "gb": gb[-1].copy() if temporal else _u8(yb[-1:])[0],
                    "ua": ua[-1:].clone(), "ub": ub[-1:].clone(),
                    "la": la[-2:].clone(), "lb": lb[-2:].clone(),
                }
        # one transfer to the host for the whole chunk
        host = {k: v.double().cpu().numpy() for k, v in out.items()}
        mse_h = mse.cpu().numpy()
        if self._peak is None:
            u8 = a.dtype == torch.uint8 and b.dtype == torch.uint8
            self._peak = (255.0 if u8 else 1.0) if self.psnr_data_range is None else float(self.psnr_data_range)
        t_first = t0 if prev is not None else t0 + 1   # first frame with a t-1 -> t transition
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
            self._sq_total += e * a[0].numel()
            self._px_total += a[0].numel()
        self.n += n
        return records

    def _successive(self, prev_feats, feats) -> torch.Tensor:
        """LPIPS(x_t, x_t-1) for each frame of the chunk that has a predecessor (no copies)."""
        parts = []
        if prev_feats is not None:
            parts.append(self.model.distance([f[:1] for f in feats], prev_feats))
        if feats[0].shape[0] > 1:
            parts.append(self.model.distance([f[1:] for f in feats], [f[:-1] for f in feats]))
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
        return max(self.n - 1, 0) if key in TEMPORAL_KEYS else self.n


# -- driving from iterators ------------------------------------------------------------------

def _frames_of(item, name: str, index: int) -> torch.Tensor:
    """One item of a frame iterator -> (n, 3, H, W) tensor.

    numpy arrays are channels-last, as decoders give them: (H, W, 3) or (n, H, W, 3);
    torch tensors are channels-first: (3, H, W) or (n, 3, H, W).
    """
    if isinstance(item, np.ndarray):
        if item.ndim == 3:
            item = item[None]
        if item.ndim != 4 or item.shape[3] != 3:
            raise MetricInputError(f"{name}: frame {index}: expected a numpy (H, W, 3) frame or "
                                   f"(n, H, W, 3) chunk, found shape {item.shape}")
        return torch.from_numpy(np.ascontiguousarray(item)).permute(0, 3, 1, 2)
    if isinstance(item, torch.Tensor):
        if item.ndim == 3:
            item = item[None]
        if item.ndim != 4 or item.shape[1] != 3:
            raise MetricInputError(f"{name}: frame {index}: expected a tensor (3, H, W) frame or "
                                   f"(n, 3, H, W) chunk, found shape {tuple(item.shape)}")
        return item
    raise MetricInputError(f"{name}: frame {index}: expected a numpy array or torch tensor, "
                           f"found {type(item).__name__}")


def _rechunk(frames: Iterable, name: str, size: int) -> Iterator[torch.Tensor]:
    buf, have, index = [], 0, 0
    for item in frames:
        x = _frames_of(item, name, index)
        index += x.shape[0]
        while x.shape[0]:
            take = min(size - have, x.shape[0])
            buf.append(x[:take])
            have += take
            x = x[take:]
            if have == size:
                yield buf[0] if len(buf) == 1 else torch.cat(buf)
                buf, have = [], 0
    if buf:
        yield buf[0] if len(buf) == 1 else torch.cat(buf)


def auto_chunk(height: int, width: int, device=None) -> int:
    """Frames per batch: 8 at 256x256 and 2 at 720p on the CPU (resident memory stays near
    2 GB at 720p), 16 at 720p on a GPU (throughput; host memory holds only uint8 frames)."""
    dev = resolve_device(device)
    budget = 16e6 if dev.type == "cuda" else 2.2e6     # pixels per side per batch
    return int(max(1, min(16 if dev.type == "cuda" else 8, budget // (height * width))))


def _count(chunks: Iterator[torch.Tensor]) -> int:
    return sum(c.shape[0] for c in chunks)


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
            chunk = auto_chunk(x.shape[2], x.shape[3], ev.device)
            frames_a = itertools.chain([first], frames_a)
        else:
            chunk = 1
    ia, ib = _rechunk(frames_a, "a", chunk), _rechunk(frames_b, "b", chunk)
    while True:
        ca, cb = next(ia, None), next(ib, None)
        if ca is None and cb is None:
            ev.alignment = {"mode": align, "frames_a": ev.n, "frames_b": ev.n, "compared": ev.n}
            return
        na = ev.n + (ca.shape[0] if ca is not None else 0)
        nb = ev.n + (cb.shape[0] if cb is not None else 0)
        if na != nb:
            na += _count(ia)
            nb += _count(ib)
            if align == "error":
                raise MetricInputError(f"b: {nb} frames, expected {na} like a (frame counts differ; "
                                       "use align='shortest' to compare the common prefix)")
            m = min(na, nb) - ev.n
            if m > 0:
                yield from ev.update(ca[:m], cb[:m])
            ev.alignment = {"mode": align, "frames_a": na, "frames_b": nb, "compared": ev.n,
                            "dropped_a": na - ev.n, "dropped_b": nb - ev.n}
            return
        yield from ev.update(ca, cb)


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
