"""VMAF through the ``libvmaf`` filter of the ffmpeg binary that ``imageio-ffmpeg`` ships.

VMAF -- Li, Aaron, Katsavounidis, Moorthy, Manohara, "Toward a practical perceptual video
quality metric", Netflix Technology Blog, 2016; model and features in Netflix's libvmaf
(https://github.com/Netflix/vmaf). A support-vector regression over VIF (Sheikh & Bovik, IEEE
TIP 15(2), 2006) at four scales, the detail-loss metric ADM (Li et al., IEEE TCSVT 21(10),
2011) and a motion feature (mean absolute difference of successive low-passed reference
frames), predicting a 0..100 opinion score. Reference: clip ``a``; distorted: clip ``b``.

:func:`vmaf` takes two RGB clips (uint8 frames, channels last, as decoders give them) and
returns one score per frame. The conversion to the YUV that libvmaf reads is ours, explicit
and recorded (:func:`vmaf_convention`), never ffmpeg's automatic one:

* matrix: BT.709 by default (``matrix="bt601"`` gives BT.601), the luma weights
  Kr, Kb = 0.2126, 0.0722 (0.299, 0.114);
* range: limited (``yuv_range="limited"``, default): Y = 16 + 219 E'y, Cb/Cr = 128 + 224 E'c
  (E' from R'G'B' in [0, 1]), computed exactly in integers and rounded half up; or full
  (Y = 255 E'y, C = 128 + 255 E'c);
* sampling: 4:4:4 (``yuv444p``, 8 bits): no chroma subsampling, so no chroma siting to choose.
  The features of the built-in models (VIF, ADM, motion) read only the luma plane: 4:2:0 input
  made from the same luma gives the same scores (checked once by hand; docs/metrics.md).

Frames go to ffmpeg through one pipe: each frame is the distorted frame stacked on the
reference frame (2H rows), which the filter graph crops apart exactly (``crop`` moves plane
pointers, no resampling); memory stays one frame. libvmaf writes its per-frame log as JSON
(six decimals: the scores are the values of that log). ``n_threads``: libvmaf's threads
(default: every CPU core this process may use).

VMAF is not 100 for identical clips in general: with ``vmaf_v0.6.1`` identical frames
(VIF = ADM = 1) score a value that depends on the motion feature only: about 97.43 at zero
motion (the first frame of a clip, a still clip) and 100 (the model's clip) once the
reference moves enough.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from ._errors import MetricInputError, VmafUnavailable

#: The model libvmaf uses unless told otherwise (``version=vmaf_v0.6.1``), and the ones built
#: into libvmaf (no model file needed: works offline).
DEFAULT_MODEL = "vmaf_v0.6.1"
BUILTIN_MODELS = ("vmaf_v0.6.1", "vmaf_v0.6.1neg", "vmaf_4k_v0.6.1", "vmaf_4k_v0.6.1neg")

#: Luma weights (Kr, Kb) of each matrix (ITU-R BT.709-6 and BT.601-7).
MATRICES = {"bt709": (0.2126, 0.0722), "bt601": (0.299, 0.114)}
RANGES = ("limited", "full")

#: Smallest frame side libvmaf takes here (16 crashes the filter; 32 leaves room for ADM's
#: four scales).
MIN_SIDE = 32


@dataclass(frozen=True)
class VmafResult:
    """Per-frame VMAF scores (float64, frame order) and what produced them."""

    scores: np.ndarray
    model: str
    libvmaf_version: str
    convention: str

    @property
    def mean(self) -> float:
        return float(self.scores.mean())


# -- the binary -------------------------------------------------------------------------------


def ffmpeg_exe(ffmpeg: str | None = None) -> str:
    """The ffmpeg binary: ``ffmpeg`` if given, else imageio-ffmpeg's (its ``IMAGEIO_FFMPEG_EXE``
    environment variable names another one). :class:`VmafUnavailable` if there is none."""
    where = "ffmpeg"
    if not ffmpeg:
        try:
            import imageio_ffmpeg
        except ImportError:
            raise VmafUnavailable(
                "VMAF needs the imageio-ffmpeg package: pip install 'evalkit[vmaf]'"
            ) from None
        try:
            ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
        except RuntimeError as e:
            raise VmafUnavailable(
                f"VMAF: no ffmpeg binary found by imageio-ffmpeg ({str(e).splitlines()[0]})"
            ) from None
        if os.environ.get("IMAGEIO_FFMPEG_EXE"):
            where = "IMAGEIO_FFMPEG_EXE"
    if not os.path.isfile(ffmpeg) or not os.access(ffmpeg, os.X_OK):
        raise VmafUnavailable(
            f"{where}: {ffmpeg}: not an executable file (VMAF needs an ffmpeg built with --enable-libvmaf)"
        )
    return ffmpeg


@functools.lru_cache(maxsize=8)
def _probe(exe: str) -> str:
    """``exe``'s version line; :class:`VmafUnavailable` if it has no ``libvmaf`` filter."""
    try:
        out = subprocess.run(
            [exe, "-hide_banner", "-nostdin", "-filters"], capture_output=True, text=True, timeout=60
        )
        ver = subprocess.run(
            [exe, "-hide_banner", "-nostdin", "-version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VmafUnavailable(f"ffmpeg: {exe}: cannot run it ({e})") from None
    if not any(line.split()[1:2] == ["libvmaf"] for line in out.stdout.splitlines()):
        raise VmafUnavailable(
            f"ffmpeg: {exe}: has no libvmaf filter (VMAF needs an ffmpeg built "
            "with --enable-libvmaf, such as imageio-ffmpeg's)"
        )
    first = (ver.stdout.splitlines() or ["ffmpeg version unknown"])[0]
    return first.split(" Copyright")[0].replace("ffmpeg version ", "")


def check_available(ffmpeg: str | None = None) -> str:
    """The ffmpeg binary VMAF would use, after checking it has the libvmaf filter."""
    exe = ffmpeg_exe(ffmpeg)
    _probe(exe)
    return exe


# -- colour conversion -----------------------------------------------------------------------


def _check_conversion(matrix: str, yuv_range: str) -> None:
    if matrix not in MATRICES:
        raise MetricInputError(f"matrix: expected one of {', '.join(MATRICES)}, found {matrix!r}")
    if yuv_range not in RANGES:
        raise MetricInputError(f"yuv_range: expected one of {', '.join(RANGES)}, found {yuv_range!r}")


def rgb_to_yuv444(frames, *, matrix: str = "bt709", yuv_range: str = "limited") -> np.ndarray:
    """8-bit RGB frames ``(n, H, W, 3)`` (or one ``(H, W, 3)``) -> planar 8-bit YUV 4:4:4
    ``(n, 3, H, W)``: the Y, Cb, Cr planes of each frame, in the order ``yuv444p`` stores them.

    Exact: the matrix's coefficients are 4-decimal numbers (BT.709: Kr 0.2126, Kb 0.0722), so
    each level is a ratio of integers, computed in int32 and rounded half up, then clipped to
    0..255 (only full-range chroma can reach 255.5)."""
    _check_conversion(matrix, yuv_range)
    x = np.asarray(frames)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[3] != 3 or x.dtype != np.uint8:
        raise MetricInputError(
            f"frames: expected uint8 RGB frames (n, H, W, 3), found {x.dtype} array of shape {x.shape}"
        )
    kr, kb = (round(k * 10000) for k in MATRICES[matrix])
    kg = 10000 - kr - kb
    ys, cs, yo = (219, 224, 16) if yuv_range == "limited" else (255, 255, 0)
    n, h, w, _ = x.shape
    out = np.empty((n, 3, h, w), np.uint8)
    # s = 10000 * 255 * E'y; every intermediate stays below 2**31
    r, g, b = (x[..., c].astype(np.int32) for c in range(3))
    s = kr * r
    s += kg * g
    s += kb * b
    den = 255 * 10000  # Y = yo + ys * s / den
    t = s * ys
    t += yo * den + den // 2
    t //= den
    out[:, 0] = t
    for plane, src, k in ((1, b, kb), (2, r, kr)):  # C = 128 + cs * (10000 src - s) / d
        d = 255 * 2 * (10000 - k)
        src *= 10000
        src -= s
        src *= cs
        src += 128 * d + d // 2
        src //= d
        np.clip(src, 0, 255, out=src)
        out[:, plane] = src
    return out


def vmaf_convention(
    *,
    model: str = DEFAULT_MODEL,
    matrix: str = "bt709",
    yuv_range: str = "limited",
    libvmaf_version: str | None = None,
    ffmpeg_version: str | None = None,
) -> str:
    """The one-line convention that reports record for VMAF."""
    kr, kb = MATRICES[matrix]
    lib = f"libvmaf {libvmaf_version}" if libvmaf_version else "libvmaf"
    if ffmpeg_version:
        lib += f" (ffmpeg {ffmpeg_version})"
    levels = "Y 16-235, C 16-240" if yuv_range == "limited" else "Y 0-255, C 0-255"
    return (
        f"{lib}, model {model} (built in); b distorted, a reference; rgb8 -> yuv444p 8-bit, "
        f"{matrix.upper().replace('BT', 'BT.')} matrix (Kr {kr}, Kb {kb}), {yuv_range} range "
        f"({levels}), exact, rounded half up, no chroma subsampling; scores as libvmaf's "
        "JSON log prints them (6 decimals)"
    )


# -- running libvmaf ---------------------------------------------------------------------------


def _frames(items: Iterable, name: str) -> Iterator[np.ndarray]:
    """One (H, W, 3) uint8 frame at a time from frames or (n, H, W, 3) chunks."""
    index = 0
    for item in items:
        x = np.asarray(item)
        if x.ndim == 3:
            x = x[None]
        if x.ndim != 4 or x.shape[3] != 3 or x.dtype != np.uint8:
            raise MetricInputError(
                f"frame {index}: expected uint8 RGB (H, W, 3) frames "
                f"or (n, H, W, 3) chunks, found {x.dtype} array of shape {x.shape}",
                field=name,
            )
        for f in x:
            yield f
            index += 1


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def vmaf(
    a,
    b,
    *,
    model: str = DEFAULT_MODEL,
    matrix: str = "bt709",
    yuv_range: str = "limited",
    n_threads: int | None = None,
    ffmpeg: str | None = None,
) -> VmafResult:
    """Per-frame VMAF of clip ``b`` (distorted) against clip ``a`` (reference).

    ``a``, ``b``: ``(n, H, W, 3)`` uint8 RGB arrays, or iterables of ``(H, W, 3)`` frames or
    ``(n, H, W, 3)`` chunks (read one frame ahead: a clip of any length streams through). Both
    clips must have the same frame size (at least 32x32) and frame count. ``model``: a built-in
    libvmaf model (:data:`BUILTIN_MODELS`). ``matrix``, ``yuv_range``: the RGB -> YUV
    conversion (module doc). ``n_threads``: libvmaf's threads (default: every usable core).
    ``ffmpeg``: the binary (default imageio-ffmpeg's).

    Raises :class:`MetricInputError` for bad frames and :class:`VmafUnavailable` when there is
    no ffmpeg with libvmaf.
    """
    _check_conversion(matrix, yuv_range)
    if model not in BUILTIN_MODELS:
        raise MetricInputError(
            f"model: expected a built-in libvmaf model ({', '.join(BUILTIN_MODELS)}), found {model!r}"
        )
    if n_threads is None:
        n_threads = _cpu_count()
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
        raise MetricInputError(f"n_threads: expected a positive integer, found {n_threads!r}")
    exe = ffmpeg_exe(ffmpeg)
    ffmpeg_version = _probe(exe)
    fa, fb = _frames(a, "a"), _frames(b, "b")
    first_a, first_b = next(fa, None), next(fb, None)
    if first_a is None or first_b is None:
        raise MetricInputError(f"{'a' if first_a is None else 'b'}: expected at least one frame, found none")
    h, w = first_a.shape[:2]
    if first_b.shape[:2] != (h, w):
        raise MetricInputError(
            f"frame 0 is {first_b.shape[1]}x{first_b.shape[0]}, expected {w}x{h} like a", field="b"
        )
    if min(h, w) < MIN_SIDE:
        raise MetricInputError(f"frames are {w}x{h}, VMAF needs at least {MIN_SIDE}x{MIN_SIDE}", field="a")

    with tempfile.TemporaryDirectory(prefix="evalkit-vmaf-") as tmp:
        graph = (
            f"[0:v]split=2[s0][s1];[s0]crop={w}:{h}:0:0[dist];[s1]crop={w}:{h}:0:{h}[ref];"
            f"[dist][ref]libvmaf=model=version={model}:log_fmt=json:log_path=vmaf.json:"
            f"n_threads={n_threads}"
        )
        cmd = [
            exe,
            "-hide_banner",
            "-loglevel",
            "error",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "yuv444p",
            "-s",
            f"{w}x{2 * h}",
            "-framerate",
            "25",
            "-i",
            "pipe:0",
            "-lavfi",
            graph,
            "-f",
            "null",
            "-",
        ]
        with open(os.path.join(tmp, "stderr.txt"), "w+b") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, cwd=tmp
            )
            n = 0
            try:
                buf = np.empty((3, 2 * h, w), dtype=np.uint8)
                fa_all = _chain(first_a, fa)
                fb_all = _chain(first_b, fb)
                while True:
                    xa, xb = next(fa_all, None), next(fb_all, None)
                    if xa is None or xb is None:
                        if xa is not None or xb is not None:
                            na = n + (xa is not None) + sum(1 for _ in fa_all)
                            nb = n + (xb is not None) + sum(1 for _ in fb_all)
                            raise MetricInputError(f"{nb} frames, expected {na} like a", field="b")
                        break
                    for name, x in (("a", xa), ("b", xb)):
                        if x.shape[:2] != (h, w):
                            raise MetricInputError(
                                f"frame {n} is {x.shape[1]}x{x.shape[0]}, expected {w}x{h} like frame 0 of a",
                                field=name,
                            )
                    buf[:, :h] = rgb_to_yuv444(xb, matrix=matrix, yuv_range=yuv_range)[0]
                    buf[:, h:] = rgb_to_yuv444(xa, matrix=matrix, yuv_range=yuv_range)[0]
                    try:
                        proc.stdin.write(buf.tobytes())
                    except BrokenPipeError:
                        break  # ffmpeg died: its exit code and message say why
                    n += 1
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            code = proc.wait()
            err.seek(0)
            message = err.read().decode("utf-8", "replace").strip()
        if code != 0:
            last = message.splitlines()[-1] if message else f"exit code {code}"
            raise MetricInputError(f"ffmpeg libvmaf failed on {w}x{h} frames: {last}")
        with open(os.path.join(tmp, "vmaf.json")) as f:
            log = json.load(f)
    frames = sorted(log["frames"], key=lambda fr: fr["frameNum"])
    if len(frames) != n:
        raise MetricInputError(f"ffmpeg libvmaf scored {len(frames)} frames, expected {n}")
    scores = np.array([fr["metrics"]["vmaf"] for fr in frames], dtype=np.float64)
    version = str(log.get("version", "unknown"))
    return VmafResult(
        scores,
        model,
        version,
        vmaf_convention(
            model=model,
            matrix=matrix,
            yuv_range=yuv_range,
            libvmaf_version=version,
            ffmpeg_version=ffmpeg_version,
        ),
    )


def _chain(first, rest) -> Iterator[np.ndarray]:
    yield first
    yield from rest
