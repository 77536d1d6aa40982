"""Shared plumbing: device choice, precise-arithmetic context, input checks and conversions.

Every metric takes frames as ``(N, 3, H, W)`` tensors (or numpy arrays), either ``uint8`` in
[0, 255] or floating point in [0, 1], and computes in float32 on the frames' device.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from typing import Any, Callable

import numpy as np
import torch

from ._errors import MetricInputError

#: 8-bit full scale; the unit that SSIM, flicker and the exactness figures are expressed in.
PEAK8 = 255.0


def default_device() -> torch.device:
    """The device metrics run on unless the caller picks one: ``cuda`` if present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: Any = None) -> torch.device:
    if device is None or device == "auto":
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise MetricInputError(f"device: expected 'cpu', 'cuda', 'cuda:N' or 'auto', found {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise MetricInputError(f"device: {device!r} requested but no CUDA device is available here")
    return dev


# Whether cuDNN may autotune inside :func:`precise` (set by an enclosing ``precise(True)``).
_AUTOTUNE: contextvars.ContextVar[bool] = contextvars.ContextVar("metrics_cudnn_autotune", default=False)


@contextlib.contextmanager
def precise(cudnn_benchmark: bool | None = None, benchmark_limit: int | None = None):
    """float32 for real: TF32 off, deterministic cuDNN (restored on exit).

    ``cudnn_benchmark``: let cuDNN time its algorithms and keep the fastest (only deterministic
    ones are candidates, TF32 stays off). ``None`` (default) inherits the setting of an
    enclosing ``precise`` block, else off. An autotuned process may pick another deterministic
    algorithm than the next one, which moves results by float32 rounding (~1e-7) only.
    ``benchmark_limit``: how many of cuDNN's candidate algorithms autotuning times
    (``torch.backends.cudnn.benchmark_limit``; 0: all; None: leave it as it is).
    """
    bench = _AUTOTUNE.get() if cudnn_benchmark is None else bool(cudnn_benchmark)
    token = _AUTOTUNE.set(bench)
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.benchmark_limit,
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = bench
    if benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = int(benchmark_limit)
    try:
        with torch.inference_mode():
            yield
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.benchmark_limit,
        ) = saved
        _AUTOTUNE.reset(token)


#: Faster kernels for the same numbers on CUDA, each with the environment variable(s) that turn
#: it off ("0"; None: none, :func:`fast_paths` only): SSIM, the pixel checks (MSE, exactness), the rounded luma, the warping
#: error with tOF and LPIPS's head (normalisation and distance; also ``EVALKIT_TRITON_LPIPS``)
#: as Triton kernels, AlexNet's first convolution by space-to-depth, the stream's uint8 ->
#: [0, 1] conversion in one pass (the last two, the warping error and the LPIPS head: also on
#: the CPU inside a ``fast_paths`` block that turns them on, the Triton ones for their
#: interpreter in tests). Same conventions: values move by float32 rounding at most (exactly
#: equal for MSE, exactness, luma and the conversion). Nothing records which one ran.
FAST_PATHS = {
    "triton_ssim": "EVALKIT_TRITON",
    "triton_pixels": "EVALKIT_TRITON",
    "triton_luma": "EVALKIT_TRITON",
    "triton_temporal": "EVALKIT_TRITON",
    "triton_lpips": ("EVALKIT_TRITON", "EVALKIT_TRITON_LPIPS"),
    "conv1_s2d": None,
    "one_pass_unit": None,
}
_FAST: contextvars.ContextVar[dict | None] = contextvars.ContextVar("metrics_fast_paths", default=None)


def fast_path(name: str) -> bool:
    """Whether the fast path ``name`` (a key of :data:`FAST_PATHS`) may be used now."""
    override = _FAST.get()
    if override is not None and name in override:
        return override[name]
    env = FAST_PATHS[name]
    if env is None:
        return True
    return all(os.environ.get(v, "1") != "0" for v in ((env,) if isinstance(env, str) else env))


def fast_path_forced(name: str) -> bool | None:
    """The setting of an enclosing :func:`fast_paths` block for ``name`` (None: not set there).
    A path that is used on CUDA only by default runs on any device where a block turns it on."""
    override = _FAST.get()
    return None if override is None else override.get(name)


@contextlib.contextmanager
def fast_paths(**enabled: bool):
    """Turn fast paths on or off inside the block, e.g. ``fast_paths(triton_ssim=False)``
    (benchmarks compare both in one process); ``fast_paths(all=False)`` for every one."""
    if "all" in enabled:
        v = bool(enabled.pop("all"))
        enabled = {**dict.fromkeys(FAST_PATHS, v), **enabled}
    unknown = set(enabled) - set(FAST_PATHS)
    if unknown:
        raise ValueError(f"fast_paths: unknown {sorted(unknown)}; expected {sorted(FAST_PATHS)}")
    token = _FAST.set({**(_FAST.get() or {}), **{k: bool(v) for k, v in enabled.items()}})
    try:
        yield
    finally:
        _FAST.reset(token)


class TritonFallback:
    """One family of Triton kernels (one module entry point, e.g. the SSIM kernels or the fused
    flow) that may not run on a user's machine, and the torch path that gives the same numbers.

    ``load`` imports the entry point (an ``ImportError``: Triton is not installed here).
    :meth:`kernel` is that entry point, or None where it does not import or has failed in this
    process. :meth:`run` runs ``call()``; when it raises (not out of memory) it warns once,
    naming the family, the error and that the torch path is used, remembers the failure
    (:attr:`failed`, from then on :meth:`kernel` is None: callers take the torch path without a
    warning) and returns ``fallback()``. A failure is what a kernel that does not compile on
    this GPU or Triton build looks like (a ROCm card, an older driver). ``strict``: once
    ``call`` has succeeded in this process, a later failure is a real error and is raised.
    The switches (``EVALKIT_TRITON=0``, :func:`fast_paths`) are read by the callers, which only
    ask for :meth:`kernel` when their path is on.
    """

    def __init__(self, family: str, load: Callable[[], Any], *, strict: bool = True):
        self.family = family
        self.strict = strict
        self.load = load
        self._fn: Any = None
        self._loaded = False
        #: ``"ErrorType: first line of the message"`` once the family failed here, else None
        self.failed: str | None = None
        #: whether a call has succeeded in this process
        self.ran = False

    def kernel(self) -> Any:
        """The family's entry point, or None (Triton does not import here, or it failed)."""
        if self.failed is not None:
            return None
        if not self._loaded:
            try:
                self._fn = self.load()
            except ImportError:
                self._fn = None
            self._loaded = True
        return self._fn

    def run(self, call: Callable[[], Any], fallback: Callable[[], Any], *, stacklevel: int = 3) -> Any:
        """``call()``, or ``fallback()`` after a warning when it fails (see the class)."""
        try:
            out = call()
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 -- a kernel that cannot run here: the torch path
            if self.strict and self.ran:
                raise
            if self.failed is not None:  # another call failed first and warned
                return fallback()
            first = (str(e).strip().splitlines() or [""])[0][:300]
            self.failed = f"{type(e).__name__}: {first}"
            warnings.warn(
                f"metrics: the Triton {self.family} failed on this machine ({self.failed}); "
                "using the torch path (EVALKIT_TRITON=0 silences this)",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
            return fallback()
        self.ran = True
        return out


def as_frames(x: Any, name: str, *, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    """Check ``x`` is a batch ``(N, 3, H, W)`` of uint8 or [0, 1] float frames; return a tensor.

    ``offset`` is added to frame indices in messages (streams pass the global frame number).
    """
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    elif not isinstance(x, torch.Tensor):
        raise MetricInputError(
            f"expected a tensor or array of frames (N, 3, H, W), found {type(x).__name__}", field=name
        )
    if x.ndim != 4 or x.shape[1] != 3:
        raise MetricInputError(f"expected frames of shape (N, 3, H, W), found {tuple(x.shape)}", field=name)
    if x.shape[0] == 0 or x.shape[2] == 0 or x.shape[3] == 0:
        raise MetricInputError(
            f"expected at least one non-empty frame, found shape {tuple(x.shape)}", field=name
        )
    if device is not None and x.device != device:
        x = x.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        return x
    if not x.is_floating_point():
        raise MetricInputError(
            f"expected uint8 in [0, 255] or float in [0, 1], found dtype "
            f"{str(x.dtype).replace('torch.', '')}",
            field=name,
        )
    flat = x.reshape(x.shape[0], -1)
    finite = torch.isfinite(flat).all(1)
    if not bool(finite.all()):
        i = int((~finite).nonzero()[0, 0])
        bad = flat[i][~torch.isfinite(flat[i])][0].item()
        raise MetricInputError(
            f"frame {i + offset} holds {bad} values; expected finite values in [0, 1]", field=name
        )
    lo, hi = flat.amin(1), flat.amax(1)
    out = (lo < 0) | (hi > 1)
    if bool(out.any()):
        i = int(out.nonzero()[0, 0])
        raise MetricInputError(
            f"frame {i + offset} has values in [{lo[i].item():.4g}, "
            f"{hi[i].item():.4g}]; expected float frames in [0, 1] (or uint8)",
            field=name,
        )
    return x


def check_pair(a: Any, b: Any, *, names=("a", "b"), device=None, offset: int = 0):
    """Validate two batches of frames and check they agree in size and count."""
    a = as_frames(a, names[0], device=device, offset=offset)
    b = as_frames(b, names[1], device=device if device is not None else a.device, offset=offset)
    if a.shape[2:] != b.shape[2:]:
        raise MetricInputError(
            f"frames are {b.shape[3]}x{b.shape[2]}, expected {a.shape[3]}x{a.shape[2]} like {names[0]}",
            field=names[1],
        )
    if a.shape[0] != b.shape[0]:
        raise MetricInputError(
            f"{b.shape[0]} frames, expected {a.shape[0]} like {names[0]} (frame counts must match)",
            field=names[1],
        )
    if a.device != b.device:
        b = b.to(a.device)
    return a, b


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1]."""
    if x.dtype == torch.uint8:
        return x.float().div_(PEAK8)
    return x.float()


def to_8bit_scale(x: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 255] (no rounding)."""
    if x.dtype == torch.uint8:
        return x.float()
    return x.float() * PEAK8


# ITU-R BT.601 luma weights, as MATLAB rgb2gray / the original SSIM code and OpenCV use them.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


def luma(x: torch.Tensor, *, rounded: bool = True) -> torch.Tensor:
    """BT.601 luma ``0.299 R + 0.587 G + 0.114 B`` in 8-bit units, shape (N, 1, H, W), float32.

    ``rounded``: round to integers exactly as ``numpy.round(0.299*R + 0.587*G + 0.114*B)`` on
    the 8-bit values: evaluated in float64 in that order, ties to even. The result is an exact
    integer, identical on every IEEE device. (Rounding halves up with integer arithmetic
    instead moves the calibration pair I03 from 0.69935 to 0.69936: the half-unit cases
    matter at the fourth decimal.)
    """
    if rounded:
        x8 = x.double() if x.dtype == torch.uint8 else x.double() * PEAK8
    else:
        x8 = to_8bit_scale(x)
    y = x8[:, 0:1] * LUMA_WEIGHTS[0] + x8[:, 1:2] * LUMA_WEIGHTS[1] + x8[:, 2:3] * LUMA_WEIGHTS[2]
    return torch.round(y).float() if rounded else y


def luma_u8(x: torch.Tensor) -> np.ndarray:
    """Rounded luma as a (N, H, W) uint8 numpy array on the CPU (input of OpenCV optical flow)."""
    return luma(x, rounded=True).clamp_(0, 255).to(torch.uint8)[:, 0].cpu().numpy()
