"""Excerpts: a study that shows every clip's one window of ``seconds`` instead of the whole clip
(``study create --excerpt SECONDS [--excerpt-at START|worst]``), so a rater loads less and
judges what differs.

The window is one per clip (job): both sides, every arrangement, the catch versions and the
threshold stimuli of that clip are cut from the same frames, so the window predicts nothing
about the answer. ``worst`` (the default) is the window of the highest mean per-frame LPIPS in
the report's ``frames.csv`` (:func:`worst_start`), within the clip; a number is the owner's
start time in seconds, the same for every clip. The windows are recorded in the study's config
(``config["excerpt"]``) and shown with its results.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from ..video import open_clip
from .errors import StudyError

WORST = "worst"
#: the longest window and latest start ``--excerpt``/``--excerpt-at`` take (a week: far past any
#: clip; a larger number would overflow a frame count)
MAX_SECONDS = 7 * 24 * 3600.0


def parse(seconds, at) -> tuple[float | None, float | str]:
    """Check ``--excerpt`` and ``--excerpt-at``: ``(seconds or None, "worst" or a start >= 0)``.
    A bad value is one :class:`.errors.StudyError` line naming the option."""
    if seconds is None:
        if at is not None:
            raise StudyError(f"--excerpt-at: only with --excerpt SECONDS, found --excerpt-at {at}")
        return None, WORST
    s = _number(seconds)
    if s is None or not s > 0:
        raise StudyError(f"--excerpt: expected a number of seconds > 0, found {seconds!r}")
    if s > MAX_SECONDS:
        raise StudyError(f"--excerpt: expected at most {MAX_SECONDS:g} seconds (a week), found {seconds!r}")
    if at is None or (isinstance(at, str) and at.strip().lower() == WORST):
        return s, WORST
    a = _number(at)
    if a is None or a < 0:
        raise StudyError(f"--excerpt-at: expected 'worst' or a start time in seconds >= 0, found {at!r}")
    if a > MAX_SECONDS:
        raise StudyError(
            f"--excerpt-at: expected a start at most {MAX_SECONDS:g} seconds (a week), found {at!r}"
        )
    return s, a


def _number(v) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def frame_lpips(report) -> dict[str, dict[int, float]]:
    """Per job, A's frame number -> LPIPS from the report's ``frames.csv`` (frames whose LPIPS
    is empty left out). Errors name the file."""
    path = Path(report) / "frames.csv"
    if not path.is_file():
        raise InputFileError(
            path,
            "not found: --excerpt-at worst needs the report's per-frame "
            "LPIPS (give --excerpt-at START in seconds instead)",
        )
    out: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        missing = {"job", "frame", "lpips"} - set(rows.fieldnames or ())
        if missing:
            raise InputFileError(
                path, f"expected columns job, frame and lpips, found no {', '.join(sorted(missing))}"
            )
        for k, r in enumerate(rows, 2):
            v = (r["lpips"] or "").strip()
            if not v:
                continue
            try:
                frame, x = int(r["frame"]), float(v)
            except ValueError:
                raise InputFileError(
                    path,
                    f"line {k}: expected an integer frame and a number lpips, found {r['frame']!r} and {v!r}",
                ) from None
            if frame < 0 or not math.isfinite(x):
                raise InputFileError(
                    path, f"line {k}: expected a frame >= 0 and a finite lpips, found {frame} and {v}"
                )
            out.setdefault(r["job"], {})[frame] = x
    return out


def worst_start(per_frame: dict[int, float], n: int, total: int | None = None) -> int:
    """The first frame of the ``n``-frame window with the highest mean per-frame value, among
    the windows inside ``[0, total)`` (``total``: the clip's frame count; default the last
    measured frame + 1). Frames without a value do not count towards a window's mean; a window
    with none is never chosen over one with some; ties go to the earliest. A clip shorter than
    ``n`` gives 0 (the caller refuses it)."""
    if n < 1:
        raise ValueError(f"n: expected at least 1 frame, found {n}")
    if not per_frame:
        return 0
    total = max(per_frame) + 1 if total is None else int(total)
    if total <= n:
        return 0
    vals = np.zeros(total, np.float64)
    have = np.zeros(total, np.int64)
    for f, x in per_frame.items():
        if 0 <= f < total:
            vals[f], have[f] = x, 1
    cv = np.concatenate([[0.0], np.cumsum(vals)])
    ch = np.concatenate([[0], np.cumsum(have)])
    sums, counts = cv[n:] - cv[:-n], ch[n:] - ch[:-n]
    means = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
    best = means.max()
    if not np.isfinite(best):
        return 0
    # equal windows are equal within the cumulative sums' rounding (about total float64 ulps)
    tol = 4 * total * np.finfo(np.float64).eps * float(np.abs(vals).max())
    return int(np.flatnonzero(means >= best - tol)[0])


def plan(report, jobs: list[dict], seconds: float | None, at) -> dict | None:
    """The excerpt of each of ``jobs`` (the chosen clips of :func:`.create.read_report`), before
    any encoding: ``None`` without ``seconds``, else ``{"seconds", "at", "frames", "fps",
    "windows": {job: {"start", "frames", "start_s", "end_s", "lpips_window"}}}`` (frames of
    A's clip; the clip's frame rate from its header). A window longer than a clip, or past its
    end, is refused naming the clip (from the header's frame count or duration where it has
    one; :func:`pair_windows` checks again as it decodes)."""
    if seconds is None:
        return None
    per = frame_lpips(report) if at == WORST else {}
    windows, n_all, fps_all = {}, None, None
    for c in jobs:
        info = open_clip(c["path_a"]).info
        fps = float(info.fps)
        n = max(1, round(seconds * fps))
        if n_all is None:
            n_all, fps_all = n, fps
        total = info.frames or (round(info.duration * fps) if info.duration else None)
        if at == WORST:
            lp = per.get(c["job"], {})
            if not lp:
                raise InputFileError(
                    Path(report) / "frames.csv",
                    f"no per-frame lpips of job {c['job']} (give --excerpt-at START in seconds instead)",
                )
            start = worst_start(lp, n, total)
            inside = [lp[f] for f in range(start, start + n) if f in lp]
            lpw = float(np.mean(inside)) if inside else None
        else:
            start, lpw = round(at * fps), None
        if total is not None:
            check(c["path_a"], start, n, total, fps, seconds, at)
        windows[c["job"]] = {
            "start": start,
            "frames": n,
            "start_s": start / fps,
            "end_s": (start + n) / fps,
            "lpips_window": lpw,
        }
    return {"seconds": seconds, "at": at, "frames": n_all, "fps": fps_all, "windows": windows}


def check(path, start: int, n: int, total: int, fps: float, seconds: float, at) -> None:
    """Refuse a window of ``n`` frames from ``start`` that does not fit in ``total`` frames."""
    if n > total:
        raise StudyError(
            f"{path}: --excerpt {seconds:g}: expected at most the clip's length "
            f"({total / fps:g} s, {total} frames at {fps:g} fps), found {n} frames"
        )
    if start + n > total:
        given = at if isinstance(at, str) else f"{at:g}"
        raise StudyError(
            f"{path}: --excerpt-at {given}: expected a start at most "
            f"{(total - n) / fps:g} s (the {seconds:g} s window within the clip's "
            f"{total / fps:g} s), found {start / fps:g} s"
        )


#: frames a study's media hold per clip side at once (:func:`pair_windows`), at most, and the
#: bytes a window of one side holds at most (fewer frames when they are large: 8 at 1280x720,
#: 4 at 1920x1080)
WINDOW = 8
WINDOW_BYTES = 24 * 2**20


def window_frames(height: int, width: int) -> int:
    """Frames of a window of ``height`` x ``width`` RGB frames (:data:`WINDOW`,
    :data:`WINDOW_BYTES`)."""
    return max(1, min(WINDOW, WINDOW_BYTES // max(1, height * width * 3)))


def _window_chunks(r, window: dict | None, size: int, seen: dict):
    """``(n, H, W, 3)`` chunks of at most ``size`` frames of ``window`` of the clip ``r`` (a
    :class:`evalkit.video.ClipReader`; every frame without a window). The clip is decoded to its
    end (its length checked like any read); ``seen["total"]``: its frame count, once done."""
    start, n = (0, None) if window is None else (window["start"], window["frames"])
    buf, total = [], 0
    for frame in r:
        if start <= total and (n is None or total < start + n):
            buf.append(frame)
            if len(buf) == size:
                yield np.stack(buf)
                buf = []
        total += 1
    if buf:
        yield np.stack(buf)
    seen["total"] = total


def _check_window(r, window: dict | None, total: int, seconds, at) -> None:
    if window is not None:
        fps = float(r.info.fps)
        n = window["frames"]
        check(r.path, window["start"], n, total, fps, seconds or n / fps, at)


def side_windows(path, window: dict | None, seconds=None, at=WORST):
    """One side of :func:`pair_windows`: ``(n, H, W, 3)`` chunks of the clip's shown frames
    (the same chunks), the window checked at the end."""
    r, seen = open_clip(path), {}
    yield from _window_chunks(r, window, window_frames(r.info.height, r.info.width), seen)
    _check_window(r, window, seen["total"], seconds, at)


def pair_windows(path_a, path_b, window: dict | None, seconds=None, at=WORST):
    """Both sides of a clip as shown (``window``, or the whole clip), decoded side by side:
    yields ``(a, b)``, ``(n, H, W, 3)`` uint8 chunks of :func:`window_frames`, the same frames
    of each side, so memory holds a window of frames whatever the clip's length. Both clips are
    decoded to their end; A's window is checked before B's (:func:`check`), then the sides'
    frame counts and sizes: a :class:`ShapeError` naming both files (before anything is
    yielded when the headers' sizes differ)."""
    ra, rb = open_clip(path_a), open_clip(path_b)
    seen_a, seen_b = {}, {}
    sa, sb = (ra.info.height, ra.info.width), (rb.info.height, rb.info.width)
    size = window_frames(*sa)
    ia, ib = _window_chunks(ra, window, size, seen_a), _window_chunks(rb, window, size, seen_b)
    na = nb = 0
    while sa == sb:
        a, b = next(ia, None), next(ib, None)
        if a is not None and b is not None and a.shape == b.shape:
            na, nb = na + len(a), nb + len(b)
            yield a, b
            continue
        for c, side in ((a, "a"), (b, "b")):
            if c is not None:
                if side == "a":
                    na, sa = na + len(c), c.shape[1:3]
                else:
                    nb, sb = nb + len(c), c.shape[1:3]
        break
    na += sum(len(c) for c in ia)
    nb += sum(len(c) for c in ib)
    _check_window(ra, window, seen_a["total"], seconds, at)
    _check_window(rb, window, seen_b["total"], seconds, at)
    if (na, sa) != (nb, sb):
        raise ShapeError(
            f"{path_b}: expected {na} frames of {sa[1]}x{sa[0]} like {path_a}, found {nb} of {sb[1]}x{sb[0]}"
        )


class ShapeError(StudyError):
    """The two sides of a clip differ in frame count or size."""
