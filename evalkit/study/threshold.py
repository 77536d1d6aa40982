"""The threshold protocol's own parts: the ladder of amplified differences and its analysis data.

A threshold study asks how large a difference *of the kind the two backends make* people start
to notice. For each selected clip it shows graded stimuli

    S_k = clip(A + k (B - A))          (in float from the lossless frames, rounded to uint8)

so ``k = 1`` is backend B's frames exactly, ``k = 2`` doubles every pixel's difference, and
``k < 1`` shrinks it. Each stimulus is measured against A with the cheap full-reference metrics
(LPIPS, SSIM, PSNR; :func:`measure_windows`), exactly as ``compare`` measures a backend pair, and
raters do ABX trials (X is A or S_k) across all levels, interleaved (:mod:`.design`). The
analysis (:mod:`.psychometric`, pure) fits proportion correct against the measured metric and
reports the threshold, the real difference (``k = 1``) and their ratio, the headroom.

The assumption behind it (docs/studies.md): people see an amplified difference the way they
would see a natural difference of the same metric size. Pixel-wise amplification keeps the
difference's spatial and temporal pattern but not its statistics (a doubled noise pattern is
still that noise pattern; a real backend change twice as large could be a different pattern).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .errors import StudyError

#: the ladder ``study create --protocol threshold`` uses without ``--levels``
DEFAULT_LEVELS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: the metric the threshold is expressed in (the gate's metric)
METRIC = "lpips"
#: fewest levels a ladder may have (a psychometric function has at least two free parameters)
MIN_LEVELS = 3
#: most levels: each needs its own offset (:data:`OFFSETS`, 19), and a clip's catch versions
#: (at most its levels plus the graded ones) their own (:data:`CATCH_OFFSETS`, 16)
MAX_LEVELS = 12
MAX_LEVEL = 1000.0


#: the ladders a threshold study can show: ``amplify`` (the backend difference scaled by k, the
#: default) or ``blur`` (A blurred with a Gaussian of sigma k pixels: a known degradation, for
#: comparison: does a blur become noticeable at the LPIPS the amplified difference does?)
LADDERS = ("amplify", "blur")


def parse_levels(spec, ladder: str = "amplify") -> tuple[list[float], list[str]]:
    """``--levels`` (``"1,2,4,8"`` or a sequence of numbers) -> (levels, warnings).

    Levels are positive, finite, strictly increasing (so unique), at most :data:`MAX_LEVEL`,
    between :data:`MIN_LEVELS` and :data:`MAX_LEVELS` of them. A ladder without 1 is allowed
    with a warning: the real backend difference is then measured but not shown to raters, so
    the fit never sees the point the headroom is relative to. :class:`StudyError` names
    ``--levels`` and what it found."""
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",")]
        if not spec.strip() or any(not p for p in parts):
            raise StudyError(f"--levels: expected comma-separated numbers like 1,2,4,8, found {spec!r}")
        try:
            levels = [float(p) for p in parts]
        except ValueError:
            raise StudyError(
                f"--levels: expected comma-separated numbers like 1,2,4,8, found {spec!r}"
            ) from None
    else:
        try:
            levels = [float(v) for v in spec]
        except (TypeError, ValueError):
            raise StudyError(f"--levels: expected numbers, found {spec!r}") from None
    shown = ",".join(f"{v:g}" for v in levels)
    bad = [v for v in levels if not math.isfinite(v) or v <= 0 or v > MAX_LEVEL]
    if bad:
        raise StudyError(
            f"--levels: expected positive amplification factors up to "
            f"{MAX_LEVEL:g}, found {bad[0]:g} in {shown}"
        )
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise StudyError(f"--levels: expected increasing levels without repeats, found {shown}")
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise StudyError(
            f"--levels: expected {MIN_LEVELS} to {MAX_LEVELS} levels (a "
            f"psychometric fit needs several), found {len(levels)}: {shown}"
        )
    warnings = []
    if ladder == "amplify" and 1.0 not in levels:
        warnings.append(
            f"--levels {shown} has no level 1: raters never see the real backend "
            "difference; it is measured (the headroom's reference) but the curve "
            "is not checked there"
        )
    return levels, warnings


def amplify(a: np.ndarray, b: np.ndarray, k: float) -> np.ndarray:
    """``clip(A + k (B - A))`` in float32, rounded to the nearest uint8: the stimulus of level
    ``k``. ``k = 1`` returns B's frames exactly, ``k = 0`` A's."""
    if a.shape != b.shape or a.dtype != np.uint8 or b.dtype != np.uint8:
        raise ValueError(
            f"a, b: expected two uint8 arrays of one shape, found {a.dtype} {a.shape} and {b.dtype} {b.shape}"
        )
    fa = a.astype(np.float32)
    s = fa + np.float32(k) * (b.astype(np.float32) - fa)
    return np.clip(np.rint(s), 0, 255).astype(np.uint8)


#: per-level colour offsets (code values per R, G, B channel) added to *both* videos of a level,
#: so that A's copy is a different picture in every level's trial: without them A's coded frames
#: (and X's, when X is A) would recur byte for byte across a rater's trials of one clip, and a
#: script comparing files across trials could tell which X is A. At most 1 code value per
#: channel, on at most 2 channels (invisible; both sides of a trial shift alike, so the
#: difference is unchanged but for clipping at 0 and 255). (0, 0, 0) goes to level 1 (the real
#: B is shown as is).
OFFSETS = tuple(
    sorted(
        (o for o in itertools.product((0, 1, -1), repeat=3) if sum(map(abs, o)) <= 2),
        key=lambda o: (sum(map(abs, o)), [(-v, v == 0) for v in o]),
    )
)
#: the catch references' offsets in a threshold study, one per catch version of a clip (so no
#: two catch trials of a rater show the same reference picture, which would tell a script
#: which side is the reference): every channel moved by 1 (the ABX rule is (1, 1, 1)), then 2;
#: never a level's offset, so a catch reference is never a test trial's picture.
CATCH_OFFSETS = tuple(o for d in (1, 2) for o in itertools.product((d, -d), repeat=3))


def offsets(levels) -> dict[float, tuple[int, int, int]]:
    """level -> its colour offset (:data:`OFFSETS`): level 1 (else the first) gets none."""
    levels = list(levels)
    first = 1.0 if 1.0 in levels else levels[0]
    order = [first] + [k for k in levels if k != first]
    return {k: OFFSETS[j] for j, k in enumerate(order)}


def shifted(frames: np.ndarray, offset) -> np.ndarray:
    """``frames`` plus a per-channel offset, clipped to 0..255 (uint8)."""
    if not any(offset):
        return frames
    return np.clip(frames.astype(np.int16) + np.asarray(offset, np.int16), 0, 255).astype(np.uint8)


def stimulus(ladder: str, a: np.ndarray, b: np.ndarray, k: float) -> np.ndarray:
    """Level ``k`` of ``ladder``: :func:`amplify` (``A + k (B - A)``) or ``blur`` (A blurred with
    a Gaussian of sigma ``k`` pixels in space, not in time; rounded to uint8)."""
    if ladder == "amplify":
        return amplify(a, b, k)
    if ladder == "blur":
        from scipy.ndimage import gaussian_filter

        return np.clip(np.rint(gaussian_filter(a.astype(np.float32), sigma=(0, k, k, 0))), 0, 255).astype(
            np.uint8
        )
    raise ValueError(f"ladder: expected one of {', '.join(LADDERS)}, found {ladder!r}")


def measure_windows(pairs, *, device="cpu", net: str = "alex") -> dict:
    """Full-reference metrics of a stimulus against clip A, given as an iterable of ``(a, s)``
    windows (``(n, H, W, 3)`` uint8, consecutive; read once, held a window or two at a time):
    the per-clip means as ``compare`` reports them, ``{"lpips", "ssim", "psnr"}`` (``psnr``
    None for identical clips) plus ``max_abs_diff``, and the metrics' conventions; the same
    figures as the whole clips in memory gave (the metrics batch their frames alike)."""
    import collections

    from evalkit.metrics.stream import evaluate_pair

    it = iter(pairs)
    bufs = (collections.deque(), collections.deque())
    diff = [0]

    def pull() -> bool:
        p = next(it, None)
        if p is None:
            return False
        a, s = p
        if a.size and a.shape == s.shape:
            diff[0] = max(diff[0], int(np.abs(a.astype(np.int16) - s.astype(np.int16)).max()))
        bufs[0].append(a)
        bufs[1].append(s)
        return True

    def side(k: int):
        while bufs[k] or pull():
            if bufs[k]:
                yield bufs[k].popleft()

    out = evaluate_pair(side(0), side(1), temporal=False, device=device, net=net, keep_records=False)
    m = out["means"]

    def val(k):
        v = m.get(k)
        return None if v is None or not math.isfinite(v) else float(v)

    return {
        "lpips": val("lpips"),
        "ssim": val("ssim"),
        "psnr": val("psnr"),
        "max_abs_diff": diff[0],
        "conventions": out["conventions"],
    }


def analysis_trials(rows: list[dict], stimuli: dict, metric: str = METRIC) -> list[dict]:
    """The ``trials`` of :func:`.psychometric.threshold_analysis` from rating rows (test trials
    of the threshold protocol, each with ``rater``, ``clip_id`` and ``correct``) and the
    study's stimuli (clip row id as a string -> ``{"job", "level", "metrics"}``)."""
    out = []
    for r in rows:
        st = stimuli[str(r["clip_id"])]
        x = st["metrics"].get(metric)
        if x is None:
            continue
        out.append(
            {
                "rater": str(r["rater"]),
                "clip": st["job"],
                "level": float(st["level"]),
                "x": float(x),
                "correct": bool(r["correct"]),
            }
        )
    return out


def reference(study_config: dict, metric: str = METRIC) -> dict:
    """clip (job) -> the metric of the real backend difference (``k = 1``, B against A)."""
    ref = (study_config.get("threshold") or {}).get("reference") or {}
    return {job: float(m[metric]) for job, m in ref.items() if m.get(metric) is not None}


def per_level(rows: list[dict], stimuli: dict) -> list[dict]:
    """Accuracy per (clip, level): ``{"job", "level", "lpips", "n", "correct", "accuracy"}`` in
    clip and level order (the points the curve is fitted to, per clip)."""
    acc: dict[str, list] = {}
    for r in rows:
        acc.setdefault(str(r["clip_id"]), []).append(int(r["correct"]))
    out = []
    for cid, st in stimuli.items():
        v = acc.get(cid, [])
        out.append(
            {
                "job": st["job"],
                "level": st["level"],
                "lpips": st["metrics"].get("lpips"),
                "ssim": st["metrics"].get("ssim"),
                "psnr": st["metrics"].get("psnr"),
                "n": len(v),
                "correct": int(sum(v)),
                "accuracy": (sum(v) / len(v)) if v else None,
            }
        )
    return sorted(out, key=lambda e: (e["job"], e["level"]))


SUMMARY_COLUMNS = (
    "scope",
    "job",
    "level",
    "lpips",
    "n",
    "correct",
    "accuracy",
    "threshold",
    "ci_low",
    "ci_high",
    "slope",
    "lapse",
    "reference",
    "headroom",
    "headroom_low",
    "headroom_high",
    "gof_deviance",
    "gof_df",
    "gof_p",
    "n_raters",
    "status",
    "notes",
)


def summary_rows(res: dict) -> list[list]:
    """The threshold study's summary as CSV rows (:data:`SUMMARY_COLUMNS`): one ``pooled`` row,
    one ``clip`` row per clip (threshold fits), one ``level`` row per (clip, level) point.
    Before the design is complete only the ``pooled`` row, with the status and no figures."""
    if res.get("status") != "complete":
        row = {"scope": "pooled", "status": res.get("status"), "notes": res.get("verdict_text")}
        return [[row.get(k) for k in SUMMARY_COLUMNS]]
    a = res.get("threshold") or {}

    def fit_row(scope, job, f, ref, head):
        f = f or {}
        ci = f.get("ci") or [None, None]
        gof = f.get("gof") or {}
        hci = (head or {}).get("ci") or [None, None]
        return {
            "scope": scope,
            "job": job,
            "n": f.get("n_trials"),
            "threshold": f.get("threshold"),
            "ci_low": ci[0],
            "ci_high": ci[1],
            "slope": f.get("slope"),
            "lapse": f.get("lapse"),
            "reference": ref,
            "headroom": (head or {}).get("value"),
            "headroom_low": hci[0],
            "headroom_high": hci[1],
            "gof_deviance": gof.get("deviance"),
            "gof_df": gof.get("df"),
            "gof_p": gof.get("p"),
            "n_raters": f.get("n_raters"),
        }

    rows = [
        {
            **fit_row("pooled", "", a.get("pooled"), a.get("reference"), a.get("headroom")),
            "status": res.get("status"),
            "notes": "; ".join(a.get("notes") or []),
        }
    ]
    for job, f in sorted((a.get("clips") or {}).items()):
        rows.append(fit_row("clip", job, f, (f or {}).get("reference"), (f or {}).get("headroom")))
    for p in res.get("levels") or []:
        rows.append({"scope": "level", **p})
    return [[r.get(k) for k in SUMMARY_COLUMNS] for r in rows]
