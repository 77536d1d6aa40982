"""Delivery fidelity: does the browser stream keep the difference under test?

Raters see the *delivered* frames (the trial stream decoded, each tile cropped, scaled back
where the layout downscaled), not the lossless ones. For each row of a study (a clip, or a
threshold level's stimulus pair) :func:`measure_stream` compares, over every (A tile, B tile)
pair of each of the row's trial streams:

- ``ab_lossless_db``: the backend difference, PSNR of A against B (lossless);
- ``ab_delivered_db``: the same, after the encode (delivered A' against delivered B');
- ``encode_db``: the encode's own error, PSNR of each side against its delivered copy (A vs
  A', B vs B', pooled; ``encode_a_db`` and ``encode_b_db`` each);
- ``difference_error_db``: the encode's error *on the difference*: PSNR of the delivered
  difference ``D' = B' - A'`` against the lossless one ``D = B - A``;
- ``headroom_db = difference_error_db - ab_lossless_db = 10 log10(|D|^2 / |D' - D|^2)``: how
  far the encode's error on the difference lies below the difference itself.

**The measure.** What a rater judges is the difference between the two sides. The encode's
error splits into a part common to both sides (the same content coded the same way: it is no
difference between them) and the part that is not, ``e_B - e_A = D' - D``: the difference
raters see is the backend's plus that. ``D' - D`` is what can mask (an encode that erases the
difference: ``D' = 0``, headroom 0 dB) or invent one. The per-side error ``encode_db`` is
reported, not ruled on: a 4:2:0 stream's own error on natural pictures (40-50 dB PSNR at any
QP: chroma is halved in both directions) lies above backend differences people never see
(50 dB and more), so a rule on it would refuse every such study while the difference itself is
delivered intact; a common error this small is itself invisible, and cannot hide a difference
by visual masking.

**The rule** (:func:`acceptable`): ``headroom_db >= margin_db``, default :data:`MARGIN_DB`
= 10 dB. An error on the difference 10 dB below it has at most ``10**(-10/20) = 0.32`` of the
difference's RMS amplitude, so whatever its direction the delivered difference's RMS amplitude
lies within 0.68-1.32 of the lossless one's: less than one step of the threshold ladder (a
factor of 2), and a one-tenth energy change if the error is unrelated to the difference. A
row whose two sides are identical (``D = 0``) has nothing to mask: accepted, with ``headroom_db``
None and the delivered difference reported.

All sums are exact integers (uint8 differences, squared in int64): no float tolerance is
involved until the final logarithm, and the rule compares the integer sums
(``SSE(D) >= SSE(D' - D) * 10**(margin_db/10)``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..video import open_clip

#: the least ``headroom_db`` (dB) a row's delivered difference needs (see the module's text)
MARGIN_DB = 10.0
#: what a PSNR is relative to
PEAK = 255.0

_SUMS = ("n", "ab", "ab_delivered", "enc_a", "enc_b", "diff_err")


class Sums:
    """Exact running sums of squared differences over windows of frames (:meth:`add`)."""

    def __init__(self):
        self.s = dict.fromkeys(_SUMS, 0)

    def add(self, a: np.ndarray, b: np.ndarray, a2: np.ndarray, b2: np.ndarray) -> None:
        """One window: lossless ``a``, ``b`` and delivered ``a2``, ``b2`` (uint8, one shape)."""
        if not (a.shape == b.shape == a2.shape == b2.shape):
            raise ValueError(f"frames: expected four arrays of one shape, found {a.shape}, "
                             f"{b.shape}, {a2.shape}, {b2.shape}")
        fa, fb, fa2, fb2 = (_exact(x) for x in (a, b, a2, b2))
        self.add_pair(fa, fb, fb - fa, fa2, fb2, _sse(fa2 - fa), _sse(fb2 - fb))

    def add_pair(self, a, b, d, a2, b2, enc_a: int, enc_b: int) -> None:
        """One (A tile, B tile) pair of a window as :func:`_exact` arrays, with the lossless
        difference ``d = b - a`` and each tile's error sum given (shared between pairs)."""
        d2 = b2 - a2
        s = self.s
        s["n"] += a.size
        s["ab"] += _sse(d)
        s["ab_delivered"] += _sse(d2)
        s["enc_a"] += enc_a
        s["enc_b"] += enc_b
        s["diff_err"] += _sse(d2 - d)

    def figures(self) -> dict:
        """The figures (dB PSNR, None where undefined) and the integer sums they come from."""
        s = self.s
        n = s["n"]
        out = {"ab_lossless_db": psnr(s["ab"], n), "ab_delivered_db": psnr(s["ab_delivered"], n),
               "encode_db": psnr(s["enc_a"] + s["enc_b"], 2 * n),
               "encode_a_db": psnr(s["enc_a"], n), "encode_b_db": psnr(s["enc_b"], n),
               "difference_error_db": psnr(s["diff_err"], n),
               "headroom_db": headroom(s["ab"], s["diff_err"]), "sums": dict(s)}
        return out


def _exact(x: np.ndarray) -> np.ndarray:
    """Frames as a flat int32 array: their differences (of differences: at most 510) and
    squares (at most 260,100) fit, and :func:`_sse` sums them in int64: exact integers, no
    tolerance. (Not float64 through BLAS: its threads stall on a busy machine, 8x slower.)"""
    return np.asarray(x, np.int32).ravel()


def _sse(x: np.ndarray) -> int:
    return int(np.square(x).sum(dtype=np.int64))


def psnr(sse: int, n: int) -> float | None:
    """PSNR (dB) of a sum of squared errors over ``n`` values; None for no values, ``inf``
    when the sum is 0 (JSON-safe callers store it as None)."""
    if n <= 0:
        return None
    if sse == 0:
        return math.inf
    return 10 * math.log10(PEAK * PEAK * n / sse)


def headroom(sse_difference: int, sse_error: int) -> float | None:
    """``10 log10(SSE(D) / SSE(D' - D))``: None when ``D = 0`` (nothing to mask), ``inf`` when
    the delivered difference is exact."""
    if sse_difference == 0:
        return None
    if sse_error == 0:
        return math.inf
    return 10 * math.log10(sse_difference / sse_error)


def acceptable(sums: dict, margin_db: float = MARGIN_DB) -> bool:
    """The rule on a row's integer ``sums`` (:meth:`Sums.figures`'s): the encode's error on the
    difference at least ``margin_db`` below the difference, compared exactly
    (``SSE(D) >= SSE(D' - D) * 10**(margin_db / 10)``); a row with ``D = 0`` passes."""
    if sums["ab"] == 0:
        return True
    return sums["ab"] >= sums["diff_err"] * 10 ** (margin_db / 10)


def _resize(tile: np.ndarray, w: int, h: int) -> np.ndarray:
    import cv2

    return cv2.resize(tile, (w, h), interpolation=cv2.INTER_LINEAR)


def measure_streams(streams: list[tuple], rects: list, windows) -> list[Sums]:
    """Each trial stream's figures (a :class:`Sums` per stream, in order).

    ``streams``: ``(path, key)`` of each stored stream (``key``: its arrangement, letter ``i``
    is tile ``i``'s content, :func:`.design.stream_keys`); ``rects``: [x, y, w, h] of each
    tile; ``windows``: the lossless contents as an iterable of ``{"a": frames, "b": frames}``
    (``(n, H, W, 3)`` uint8, consecutive windows of the clip; one dict of whole clips will do).
    Every (A tile, B tile) pair counts. The streams are decoded side by side, one frame at a
    time (memory: a window of the contents and one frame per stream); a tile stored downscaled
    is scaled back to the lossless size."""
    out = [Sums() for _ in streams]
    readers = [iter(open_clip(Path(path), threads=1)) for path, _ in streams]
    pairs = [([i for i, ch in enumerate(key) if ch == "a"], [i for i, ch in enumerate(key)
                                                               if ch == "b"]) for _, key in streams]
    t, windows = 0, iter(windows)
    for win in windows:
        fa, fb = win["a"], win["b"]
        h, w = fa.shape[1:3]
        for f in range(len(fa)):
            a, b = _exact(fa[f]), _exact(fb[f])
            d = b - a
            for (path, _), reader, (ia, ib), sums in zip(streams, readers, pairs, out):
                frame = next(reader, None)
                if frame is None:
                    total = t + len(fa) + sum(len(x["a"]) for x in windows)
                    raise ValueError(f"{path}: expected {total} frames, found {t + f}")
                tiles, err = {}, {}
                for i in ia + ib:
                    x, y, tw, th = rects[i]
                    tile = frame[y:y + th, x:x + tw]
                    tiles[i] = _exact(tile if (tw, th) == (w, h) else _resize(tile, w, h))
                    err[i] = _sse(tiles[i] - (a if i in ia else b))
                for i in ia:
                    for j in ib:
                        sums.add_pair(a, b, d, tiles[i], tiles[j], err[i], err[j])
        t += len(fa)
    for (path, _), reader in zip(streams, readers):
        if next(reader, None) is not None:
            raise ValueError(f"{path}: expected {t} frames, found more")
    return out


def row_figures(media_dir, streams: dict, windows) -> dict:
    """A row's delivery figures over all its trial streams (``streams``: ``{"rects", "files":
    {key: sha256}}`` as :mod:`.api` stores them; ``windows``: the row's lossless contents,
    :func:`measure_streams`): those of the stream with the least headroom (every stream is
    shown to some rater), with ``streams`` (how many were measured) and ``sums`` (that
    stream's integer sums, for :func:`judge`)."""
    if isinstance(windows, dict):
        windows = [windows]
    files = sorted(streams["files"].items())
    worst = None
    for sums in measure_streams([(Path(media_dir) / f"{sha}.mp4", key) for key, sha in files],
                                streams["rects"], windows):
        f = sums.figures()
        if worst is None or _worse(f, worst):
            worst = f
    worst["streams"] = len(files)
    return worst


def judge(fig: dict, margin_db: float = MARGIN_DB) -> dict:
    """``fig`` (:func:`row_figures`) as stored: ``ok`` (:func:`acceptable` at ``margin_db``),
    ``margin_db``, ``identical`` (the sides are equal: nothing to mask), figures rounded to
    0.01 dB (``inf``, an exact delivery, as None); the sums dropped."""
    sums = fig["sums"]
    out = {k: json_number(v) for k, v in fig.items() if k != "sums"}
    out.update(ok=acceptable(sums, margin_db), margin_db=margin_db, identical=sums["ab"] == 0)
    return out


def _worse(f: dict, than: dict) -> bool:
    a, b = f["sums"], than["sums"]
    if a["ab"] == 0 or b["ab"] == 0:
        return a["diff_err"] > b["diff_err"]
    return a["diff_err"] * b["ab"] > b["diff_err"] * a["ab"]     # a lower SSE(D)/SSE(D'-D)


def json_number(v):
    """A figure as stored: floats rounded to 0.01 dB, ``inf`` as None (JSON has none)."""
    if isinstance(v, float):
        return round(v, 2) if math.isfinite(v) else None
    return v


def db_text(v) -> str:
    """A dB figure for people: ``inf`` / None as ``exact``."""
    return "exact" if v is None or (isinstance(v, float) and math.isinf(v)) else f"{v:.1f} dB"


def refusal(label: str, fig: dict) -> str:
    """The one line of a refused row: the clip, the backend difference and the encode's error
    on it (and the rest of the figures)."""
    return (f"delivery fidelity: {label}: the browser encode's error on the A-B difference is "
            f"{db_text(fig['difference_error_db'])} PSNR, not {fig['margin_db']:g} dB below the "
            f"backend difference ({db_text(fig['ab_lossless_db'])} PSNR lossless, "
            f"{db_text(fig['ab_delivered_db'])} as delivered; encode error per side "
            f"{db_text(fig['encode_db'])}): raters would judge the encoder; --allow-masking "
            "creates the study anyway (recorded)")


def summary(rows: list[dict], margin_db: float, allow_masking: bool) -> dict:
    """A study's delivery record (its config's ``delivery``): the rule, whether the owner
    allowed masking, each row's figures (:func:`judge`, in row order), how many rows failed the
    rule (``masked``) and the row with the least headroom (``worst``; None if all identical)."""
    measured = [r for r in rows if not r["identical"]]
    worst = min(measured, key=lambda r: math.inf if r["headroom_db"] is None
                else r["headroom_db"], default=None)
    return {"measure": RULE_TEXT, "margin_db": margin_db, "allow_masking": bool(allow_masking),
            "masked": sum(not r["ok"] for r in rows), "rows": rows, "worst": worst}


RULE_TEXT = ("the browser encode's error on the A-B difference (PSNR of B'-A' against B-A, "
             "every trial stream of a row, the worst) at least margin_db below the difference "
             "(PSNR of A against B, lossless)")


def per_clip_headroom(per_clip: list[dict], delivery: dict | None) -> None:
    """Add each clip's ``delivery_headroom_db`` (None: identical sides, an exact delivery, or
    not measured) and ``delivery_ok`` to a verdict's ``per_clip`` rows (by job)."""
    rows = {r["job"]: r for r in (delivery or {}).get("rows") or []}
    for c in per_clip:
        r = rows.get(c.get("job"))
        c["delivery_headroom_db"] = r["headroom_db"] if r else None
        c["delivery_ok"] = r["ok"] if r else None


def media_bytes(media_dir, streams: list[dict], ext: str = ".mp4") -> dict:
    """Bytes of the trial streams a study stored (one stream is one trial's media, its files
    ``<sha256><ext>``): ``{"streams", "total", "median", "max"}``."""
    sizes = sorted({sha: (Path(media_dir) / f"{sha}{ext}").stat().st_size
                    for s in streams for sha in s["files"].values()}.values())
    return {"streams": len(sizes), "total": sum(sizes),
            "median": int(np.median(sizes)) if sizes else 0, "max": max(sizes, default=0)}


def bytes_text(n: int) -> str:
    """A byte count for people: B, kB, MB (decimal)."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.2f} MB"


def lines(config: dict) -> list[str]:
    """The study's delivery and media lines for ``study results`` and the admin page (from its
    config; a study made before delivery was measured says so)."""
    d = (config or {}).get("delivery")
    mb = (config or {}).get("media_bytes")
    out = []
    if not d:
        out.append("delivery: not measured (study made before delivery fidelity was checked)")
    elif d.get("exact"):                       # lossless delivery (.lossless): nothing measured
        out.append(f"delivery: {d['measure']}")
    else:
        n = len(d["rows"])
        w = d.get("worst")
        worst = ("" if w is None else
                 f"; least headroom: clip {w['job']}"
                 + ("" if w.get("level") is None else f" at level {w['level']:g}")
                 + f", encode error on the difference {db_text(w['difference_error_db'])} "
                 f"against the difference {db_text(w['ab_lossless_db'])} "
                 f"({db_text(w['ab_delivered_db'])} as delivered, encode error per side "
                 f"{db_text(w['encode_db'])})")
        if d["masked"]:
            out.append(f"DELIVERY MASKED: {d['masked']} of {n} rows fail the delivery rule "
                       f"(encode error on the difference not {d['margin_db']:g} dB below it), "
                       f"created with --allow-masking: raters may have judged the encoder"
                       + worst)
            out.append("masked rows (difference / encode error on it): " + ", ".join(
                f"{r['job']}" + ("" if r.get("level") is None else f" x{r['level']:g}")
                + f" {db_text(r['ab_lossless_db'])} / {db_text(r['difference_error_db'])}"
                for r in d["rows"] if not r["ok"]))
        else:
            out.append(f"delivery: every row's encode error on the A-B difference is at least "
                       f"{d['margin_db']:g} dB below the difference ({n} rows)" + worst)
    if mb:
        out.append(f"media: {mb['streams']} trial streams, {bytes_text(mb['total'])} in all; "
                   f"per trial median {bytes_text(mb['median'])}, max {bytes_text(mb['max'])}")
    return out
