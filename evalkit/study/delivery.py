"""Delivery: how a study's trials reach raters (the browser stream or lossless,
:func:`choose_delivery`) and whether the stream keeps the difference under test (delivery
fidelity).

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

**Why local.** A difference is rarely spread evenly: a glitch is a few blocks of a few frames,
a flicker lives where the picture is bright. Over the whole frame the stream's error (on every
textured block of both sides) swamps such a difference though the stream keeps it where it is:
a global rule (the one before this, ``headroom_db >= 10 dB``) refused a +-3% flicker whose
delivered difference correlated 0.88-0.92 with the real one, and a 32-pixel glitch (50.6 dB
PSNR) kept at correlation 0.98 in its blocks. So the rule looks where the difference is.

**The rule** (:class:`Sums`, :func:`acceptable`). The delivered difference ``D' = B' - A'`` is
split, in each window of :data:`BLOCK` x :data:`BLOCK` pixels (a macroblock: the unit the
encoder decides on) x :data:`WINDOW_FRAMES` frames (the stream's key frame interval) of every
(A tile, B tile) pair, into its part along the real difference ``D = B - A`` (the projection:
gain ``g = <D', D> / |D|^2``) and the rest. A window *keeps* the difference when

- the correlation ``c = <D', D> / (|D'| |D|)`` is at least :func:`min_correlation` of
  ``margin_db`` (default :data:`MARGIN_DB` = 0 dB: ``c >= 0.71``, the part along ``D`` holds at
  least half of the delivered difference's energy, the encoder's own part no more), and
- the gain lies within :data:`GAIN_MIN`-:data:`GAIN_MAX` (0.5-2: the retained difference
  within one step of the threshold ladder, a factor of 2, of the real one).

A row passes when the windows that keep the difference hold at least :data:`KEEP_MIN` (0.9) of
its energy ``|D|^2`` (windows without a difference weigh nothing), on the worst of its trial
streams (every stream is shown to some rater). A row whose sides are identical (``D = 0``) has
nothing to mask: accepted. The sums are exact integers (int64 per-block sums of int32
products); each window's test is then taken in float64 on them.

Measured (``benchmarks/bench_localrule.py``, the 8 canary clips, QP 12, docs/studies.md): a
+-3% flicker keeps 0.95-1.0 of its energy (7 clips; on a dark clip, a flicker of 0-1 code
values, 0.68), crf32 0.97-1.0, a 12-code-value glitch 1.0 (accepted); crf16 0.0-0.84 and a bf16
rounding pattern 0.0-0.17 (refused).

**Reported, not ruled on**: the global figures (``ab_lossless_db``, ``ab_delivered_db``,
``difference_error_db``, ``headroom_db``: how far the encode's error on the whole difference
lies below it; ``correlation``, ``gain`` and ``amplitude`` of the whole) and the per-side error
``encode_db``: a 4:2:0 stream's own error on natural pictures (40-50 dB PSNR at any QP) is the
same degradation on both sides, no difference between them.

**Deciding before encoding** (:func:`predict`, :func:`choose_delivery`): from a compare
report's per-frame PSNR, share of differing pixels and flicker (block-mean luma): frames whose
difference is large where the pair differs (:data:`PREDICT_RMS_MIN` code values RMS, 3.5x the
stream's error on a difference) or mostly smooth over macroblocks (:data:`PREDICT_BLOCK_MIN`)
must hold :data:`KEEP_MIN` of the energy, else the stream is predicted to mask the row and
lossless delivery is chosen. Conservative: a fine difference the stream keeps anyway may be
predicted masked; where it predicts "keeps", the rule above still measures the encode.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..video import open_clip

#: the default ``margin_db`` of the rule: in each window the retained part of the delivered
#: difference at least this far (dB) above the rest of it (see the module's text)
MARGIN_DB = 0.0
#: the retained gain allowed in a window: the delivered difference's component along the real
#: one between half and twice it (one step of the threshold ladder either way)
GAIN_MIN, GAIN_MAX = 0.5, 2.0
#: the share of the difference's energy that must lie in windows that keep it
KEEP_MIN = 0.9
#: a window: ``BLOCK`` x ``BLOCK`` pixels (the encoder's macroblock) x ``WINDOW_FRAMES``
#: frames (half a second at 24 fps; the trial stream's key frame interval)
BLOCK = 16
WINDOW_FRAMES = 12
#: what a PSNR is relative to
PEAK = 255.0

_SUMS = ("n", "ab", "ab_delivered", "enc_a", "enc_b", "diff_err", "cross", "kept", "windows", "windows_kept")


def min_correlation(margin_db: float) -> float:
    """The least correlation of ``D'`` with ``D`` in a window for its retained part to lie
    ``margin_db`` above the rest: ``c**2 / (1 - c**2) >= 10**(margin_db / 10)``."""
    r = 10 ** (margin_db / 10)
    return math.sqrt(r / (1 + r))


class Sums:
    """Exact running sums over windows of frames (:meth:`add`): the global sums of squared
    differences, and the local rule's, per window of :data:`BLOCK` x :data:`BLOCK` pixels x
    :data:`WINDOW_FRAMES` frames (each (A tile, B tile) pair its own windows; memory: one
    window's per-block sums a pair)."""

    def __init__(self, margin_db: float = MARGIN_DB):
        self.s = dict.fromkeys(_SUMS, 0)
        r = 10 ** (margin_db / 10)
        self.c2 = r / (1 + r)  # min_correlation(margin_db) ** 2, exactly
        self.margin_db = margin_db
        self._open: dict = {}  # pair -> [frames, sdd, spp, sdp] of its open window
        self._corr = 0.0  # sum of SSE(D)_w * c_w (the energy-weighted mean)

    def add(self, a: np.ndarray, b: np.ndarray, a2: np.ndarray, b2: np.ndarray) -> None:
        """Frames of one pair: lossless ``a``, ``b`` and delivered ``a2``, ``b2`` (uint8, one
        shape: ``(n, H, W, 3)`` frames, or one ``(H, W, 3)`` frame); consecutive calls are
        consecutive frames."""
        if not (a.shape == b.shape == a2.shape == b2.shape):
            raise ValueError(
                f"frames: expected four arrays of one shape, found {a.shape}, "
                f"{b.shape}, {a2.shape}, {b2.shape}"
            )
        if a.ndim == 3:
            a, b, a2, b2 = a[None], b[None], a2[None], b2[None]
        for f in range(len(a)):
            fa, fb, fa2, fb2 = (_exact(x[f]) for x in (a, b, a2, b2))
            d = fb - fa
            self.add_pair(fa, fb, d, fa2, fb2, _sse(fa2 - fa), _sse(fb2 - fb), block_sums(d * d))

    def add_pair(self, a, b, d, a2, b2, enc_a: int, enc_b: int, dd=None, pair=0) -> None:
        """One frame of one (A tile, B tile) pair as :func:`_exact` arrays, with the lossless
        difference ``d = b - a``, each tile's error sum and ``dd`` (:func:`block_sums` of
        ``d * d``) given (shared between pairs); ``pair``: which pair (its own windows)."""
        d2 = b2 - a2
        s = self.s
        s["n"] += a.size
        if dd is None:
            dd = block_sums(d * d)
        pp, dp = block_sums(d2 * d2), block_sums(d * d2)
        sdd, spp, sdp = int(dd.sum()), int(pp.sum()), int(dp.sum())
        s["ab"] += sdd
        s["ab_delivered"] += spp
        s["enc_a"] += enc_a
        s["enc_b"] += enc_b
        s["diff_err"] += spp - 2 * sdp + sdd  # |D' - D|^2, exactly
        w = self._open.get(pair)
        if w is None:
            w = self._open[pair] = [0, np.zeros_like(dd), np.zeros_like(dd), np.zeros_like(dd)]
        w[0] += 1
        w[1] += dd
        w[2] += pp
        w[3] += dp
        if w[0] == WINDOW_FRAMES:
            self._close(pair)

    def _close(self, pair) -> None:
        _, sdd, spp, sdp = self._open.pop(pair)
        s = self.s
        s["cross"] += int(sdp.sum())
        has = sdd > 0
        if not has.any():
            return
        sdd, spp, sdp = (x[has].astype(np.float64) for x in (sdd, spp, sdp))
        ok = (
            (sdp > 0) & (sdp * sdp >= self.c2 * sdd * spp) & (sdp >= GAIN_MIN * sdd) & (sdp <= GAIN_MAX * sdd)
        )
        s["kept"] += int(sdd[ok].sum())
        s["windows"] += int(has.sum())
        s["windows_kept"] += int(ok.sum())
        self._corr += float((sdd * np.where(spp > 0, sdp / np.sqrt(sdd * np.maximum(spp, 1)), 0.0)).sum())

    def figures(self) -> dict:
        """The figures (dB PSNR, None where undefined), the local rule's (``kept``: the share
        of the difference's energy in windows that keep it; ``local_correlation``: the
        windows' correlations weighted by their difference energy; ``correlation`` and
        ``gain`` of the whole) and the integer sums they come from."""
        for pair in list(self._open):  # a clip's last, shorter window
            self._close(pair)
        s = self.s
        n = s["n"]
        ab, dd2 = s["ab"], s["ab_delivered"]
        out = {
            "ab_lossless_db": psnr(s["ab"], n),
            "ab_delivered_db": psnr(s["ab_delivered"], n),
            "encode_db": psnr(s["enc_a"] + s["enc_b"], 2 * n),
            "encode_a_db": psnr(s["enc_a"], n),
            "encode_b_db": psnr(s["enc_b"], n),
            "difference_error_db": psnr(s["diff_err"], n),
            "headroom_db": headroom(s["ab"], s["diff_err"]),
            "kept": s["kept"] / ab if ab else None,
            "local_correlation": self._corr / ab if ab else None,
            "correlation": s["cross"] / math.sqrt(ab * dd2) if ab and dd2 else None,
            "gain": s["cross"] / ab if ab else None,
            "amplitude": math.sqrt(dd2 / ab) if ab else None,
            "windows": s["windows"],
            "windows_kept": s["windows_kept"],
            "sums": dict(s),
        }
        return out


def block_sums(x: np.ndarray) -> np.ndarray:
    """Per-block sums (int64, ``(ceil(H / BLOCK), ceil(W / BLOCK))``) of an ``(H, W, 3)``
    int32 array of values up to 260,100 in magnitude (a partial block at the right or bottom
    edge sums what it holds). Rows of a block first (in int32: at most 16 x 3 x 260,100), then
    columns with the channels, as contiguous runs (20x faster than one strided sum)."""
    h, w, c = x.shape
    ph, pw = -h % BLOCK, -w % BLOCK
    if ph or pw:
        x = np.pad(x, ((0, ph), (0, pw), (0, 0)))
        h, w = h + ph, w + pw
    rows = x.reshape(h // BLOCK, BLOCK, w * c).sum(axis=1, dtype=np.int32)
    return rows.reshape(h // BLOCK, w // BLOCK, BLOCK * c).sum(axis=2, dtype=np.int64)


def _exact(x: np.ndarray) -> np.ndarray:
    """A frame as an int32 array: its differences (of differences: at most 510) and products
    (at most 260,100) fit, and :func:`_sse` and :func:`block_sums` sum them in int64: exact
    integers, no tolerance. (Not float64 through BLAS: its threads stall on a busy machine,
    8x slower.)"""
    return np.asarray(x, np.int32)


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


def acceptable(sums: dict) -> bool:
    """The rule on a row's integer ``sums`` (:meth:`Sums.figures`'s, each window judged at the
    margin the sums were taken at): at least :data:`KEEP_MIN` of the difference's energy in
    windows that keep it; a row with ``D = 0`` passes."""
    if sums["ab"] == 0:
        return True
    return sums["kept"] >= KEEP_MIN * sums["ab"]


def _resize(tile: np.ndarray, w: int, h: int) -> np.ndarray:
    import cv2

    return cv2.resize(tile, (w, h), interpolation=cv2.INTER_LINEAR)


def measure_streams(streams: list[tuple], rects: list, windows, margin_db: float = MARGIN_DB) -> list[Sums]:
    """Each trial stream's figures (a :class:`Sums` per stream, in order, its windows judged
    at ``margin_db``).

    ``streams``: ``(path, key)`` of each stored stream (``key``: its arrangement, letter ``i``
    is tile ``i``'s content, :func:`.design.stream_keys`); ``rects``: [x, y, w, h] of each
    tile; ``windows``: the lossless contents as an iterable of ``{"a": frames, "b": frames}``
    (``(n, H, W, 3)`` uint8, consecutive windows of the clip; one dict of whole clips will do).
    Every (A tile, B tile) pair counts. The streams are decoded side by side, one frame at a
    time (memory: a window of the contents, one frame per stream and the per-block sums of a
    window per pair); a tile stored downscaled is scaled back to the lossless size."""
    out = [Sums(margin_db) for _ in streams]
    readers = [iter(open_clip(Path(path), threads=1)) for path, _ in streams]
    pairs = [
        ([i for i, ch in enumerate(key) if ch == "a"], [i for i, ch in enumerate(key) if ch == "b"])
        for _, key in streams
    ]
    t, windows = 0, iter(windows)
    for win in windows:
        fa, fb = win["a"], win["b"]
        h, w = fa.shape[1:3]
        for f in range(len(fa)):
            a, b = _exact(fa[f]), _exact(fb[f])
            d = b - a
            dd = block_sums(d * d)
            for (path, _), reader, (ia, ib), sums in zip(streams, readers, pairs, out):
                frame = next(reader, None)
                if frame is None:
                    total = t + len(fa) + sum(len(x["a"]) for x in windows)
                    raise ValueError(f"{path}: expected {total} frames, found {t + f}")
                tiles, err = {}, {}
                for i in ia + ib:
                    x, y, tw, th = rects[i]
                    tile = frame[y : y + th, x : x + tw]
                    tiles[i] = _exact(tile if (tw, th) == (w, h) else _resize(tile, w, h))
                    err[i] = _sse(tiles[i] - (a if i in ia else b))
                for i in ia:
                    for j in ib:
                        sums.add_pair(a, b, d, tiles[i], tiles[j], err[i], err[j], dd, (i, j))
        t += len(fa)
    for (path, _), reader in zip(streams, readers):
        if next(reader, None) is not None:
            raise ValueError(f"{path}: expected {t} frames, found more")
    return out


def row_figures(media_dir, streams: dict, windows, margin_db: float = MARGIN_DB) -> dict:
    """A row's delivery figures over all its trial streams (``streams``: ``{"rects", "files":
    {key: sha256}}`` as :mod:`.create` stores them; ``windows``: the row's lossless contents,
    :func:`measure_streams`): those of the stream that keeps least of the difference (every
    stream is shown to some rater), with ``streams`` (how many were measured), ``margin_db``
    and ``sums`` (that stream's integer sums, for :func:`judge`)."""
    if isinstance(windows, dict):
        windows = [windows]
    files = sorted(streams["files"].items())
    worst = None
    for sums in measure_streams(
        [(Path(media_dir) / f"{sha}.mp4", key) for key, sha in files], streams["rects"], windows, margin_db
    ):
        f = sums.figures()
        if worst is None or _worse(f, worst):
            worst = f
    worst["streams"] = len(files)
    worst["margin_db"] = margin_db
    return worst


def judge(fig: dict, margin_db: float | None = None) -> dict:
    """``fig`` (:func:`row_figures`) as stored: ``ok`` (:func:`acceptable`), ``margin_db``,
    ``identical`` (the sides are equal: nothing to mask), dB figures rounded to 0.01 dB
    (``inf``, an exact delivery, as None) and the local figures to 0.0001; the sums dropped.
    ``margin_db``, if given, must be the one the figures were measured at."""
    if margin_db is not None and fig.get("margin_db", MARGIN_DB) != margin_db:
        raise ValueError(
            f"margin_db: the figures were measured at {fig.get('margin_db')} dB, not {margin_db}"
        )
    sums = fig["sums"]
    out = {k: json_number(v, 4 if k in _RATIOS else 2) for k, v in fig.items() if k != "sums"}
    out.update(ok=acceptable(sums), margin_db=fig.get("margin_db", MARGIN_DB), identical=sums["ab"] == 0)
    return out


_RATIOS = ("kept", "local_correlation", "correlation", "gain", "amplitude")


def _worse(f: dict, than: dict) -> bool:
    """Whether figures ``f`` keep less of the difference than ``than`` (a smaller share of its
    energy in windows that keep it; between identical rows, the larger delivered difference)."""
    a, b = f["sums"], than["sums"]
    if a["ab"] == 0 or b["ab"] == 0:
        return a["ab_delivered"] > b["ab_delivered"] if a["ab"] == b["ab"] else a["ab"] != 0
    return a["kept"] * b["ab"] < b["kept"] * a["ab"]


def json_number(v, digits: int = 2):
    """A figure as stored: floats rounded to ``digits`` (0.01 dB), ``inf`` as None (JSON has
    none)."""
    if isinstance(v, float):
        return round(v, digits) if math.isfinite(v) else None
    return v


def db_text(v) -> str:
    """A dB figure for people: ``inf`` / None as ``exact``."""
    return "exact" if v is None or (isinstance(v, float) and math.isinf(v)) else f"{v:.1f} dB"


def share_text(v) -> str:
    """A share (0-1) for people, as a percentage."""
    return "n/a" if v is None else f"{100 * v:.0f}%"


def refusal(label: str, fig: dict) -> str:
    """The one line of a refused row: the clip, how much of the difference the stream keeps
    against the rule, and the figures behind it."""
    return (
        f"delivery fidelity: {label}: the browser stream keeps "
        f"{share_text(fig['kept'])} of the A-B difference "
        f"({db_text(fig['ab_lossless_db'])} PSNR lossless), not {share_text(KEEP_MIN)}: "
        f"delivered, it correlates {fig['correlation']:.2f} with the real one at "
        f"{fig['amplitude']:.2f}x its amplitude (windows {BLOCK}x{BLOCK} px x "
        f"{WINDOW_FRAMES} frames, each kept at correlation "
        f">= {min_correlation(fig['margin_db']):.2f} and gain {GAIN_MIN:g}-{GAIN_MAX:g}): "
        "raters would judge the encoder; --allow-masking creates the study anyway "
        "(recorded)"
    )


def summary(rows: list[dict], margin_db: float, allow_masking: bool) -> dict:
    """A study's delivery record (its config's ``delivery``): the rule, whether the owner
    allowed masking, each row's figures (:func:`judge`, in row order), how many rows failed the
    rule (``masked``) and the row that keeps least of its difference (``worst``; None if all
    identical)."""
    measured = [r for r in rows if not r["identical"]]
    worst = min(measured, key=lambda r: r["kept"], default=None)
    return {
        "measure": RULE_TEXT,
        "margin_db": margin_db,
        "keep_min": KEEP_MIN,
        "allow_masking": bool(allow_masking),
        "masked": sum(not r["ok"] for r in rows),
        "rows": rows,
        "worst": worst,
    }


RULE_TEXT = (
    f"local: in windows of {BLOCK}x{BLOCK} pixels x {WINDOW_FRAMES} frames of every "
    "(A tile, B tile) pair, the delivered difference B'-A' keeps the real one B-A "
    "(correlation at least that of margin_db: its part along B-A margin_db above the "
    f"rest; gain, the projection of B'-A' on B-A, {GAIN_MIN:g}-{GAIN_MAX:g}); at least "
    f"keep_min ({KEEP_MIN:g}) of the difference's energy in windows that keep it, on "
    "every trial stream of a row (the worst)"
)


def per_clip_headroom(per_clip: list[dict], delivery: dict | None) -> None:
    """Add each clip's ``delivery_headroom_db`` (the global figure, reported; None: identical
    sides, an exact delivery, or not measured), ``delivery_kept`` (the share the local rule
    keeps; None where not measured) and ``delivery_ok`` to a verdict's ``per_clip`` rows (by
    job)."""
    rows = {r["job"]: r for r in (delivery or {}).get("rows") or []}
    for c in per_clip:
        r = rows.get(c.get("job"))
        c["delivery_headroom_db"] = r["headroom_db"] if r else None
        c["delivery_kept"] = r.get("kept") if r else None
        c["delivery_ok"] = r["ok"] if r else None


def media_bytes(media_dir, streams: list[dict], ext: str = ".mp4") -> dict:
    """Bytes of the trial streams a study stored (one stream is one trial's media, its files
    ``<sha256><ext>``): ``{"streams", "total", "median", "max"}``."""
    sizes = sorted(
        {
            sha: (Path(media_dir) / f"{sha}{ext}").stat().st_size
            for s in streams
            for sha in s["files"].values()
        }.values()
    )
    return {
        "streams": len(sizes),
        "total": sum(sizes),
        "median": int(np.median(sizes)) if sizes else 0,
        "max": max(sizes, default=0),
    }


def bytes_text(n: int) -> str:
    """A byte count for people: B, kB, MB (decimal)."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.2f} MB"


def lines(config: dict) -> list[str]:
    """The study's delivery and media lines for ``study results`` and the admin page (from its
    config; a study made before delivery was measured says so, one judged by the global rule
    before the local one names it; one made with ``study create`` choosing its delivery says
    which and why first: ``delivery_choice``)."""
    d = (config or {}).get("delivery")
    mb = (config or {}).get("media_bytes")
    choice = (config or {}).get("delivery_choice")
    out = [choice["text"]] if choice and choice.get("text") else []
    if not d:
        out.append("delivery: not measured (study made before delivery fidelity was checked)")
    elif d.get("exact"):  # lossless delivery (.lossless): nothing measured
        out.append(f"delivery: {d['measure']}")
    elif "keep_min" not in d:
        out.extend(_global_lines(d))
    else:
        n = len(d["rows"])
        w = d.get("worst")
        worst = (
            ""
            if w is None
            else f"; least kept: clip {w['job']}"
            + ("" if w.get("level") is None else f" at level {w['level']:g}")
            + f", {share_text(w['kept'])} of the difference "
            f"({db_text(w['ab_lossless_db'])}) kept, delivered correlation "
            f"{w['correlation']:.2f} at {w['amplitude']:.2f}x amplitude"
        )
        if d["masked"]:
            out.append(
                f"DELIVERY MASKED: {d['masked']} of {n} rows fail the delivery rule (the "
                f"stream keeps less than {share_text(d['keep_min'])} of the difference), "
                f"created with --allow-masking: raters may have judged the encoder" + worst
            )
            out.append(
                "masked rows (difference / kept / delivered correlation): "
                + ", ".join(
                    f"{r['job']}"
                    + ("" if r.get("level") is None else f" x{r['level']:g}")
                    + f" {db_text(r['ab_lossless_db'])} / {share_text(r['kept'])} / "
                    f"{r['correlation']:.2f}"
                    for r in d["rows"]
                    if not r["ok"]
                )
            )
        else:
            out.append(
                f"delivery: the stream keeps at least {share_text(d['keep_min'])} of "
                f"every row's A-B difference ({n} rows)" + worst
            )
    if mb:
        out.append(
            f"media: {mb['streams']} trial streams, {bytes_text(mb['total'])} in all; "
            f"per trial median {bytes_text(mb['median'])}, max {bytes_text(mb['max'])}"
        )
    return out


def _global_lines(d: dict) -> list[str]:
    """The delivery lines of a study judged by the global rule (before the local one): the
    encode's error on the whole difference at least ``margin_db`` below it."""
    n = len(d["rows"])
    w = d.get("worst")
    worst = (
        ""
        if w is None
        else f"; least headroom: clip {w['job']}"
        + ("" if w.get("level") is None else f" at level {w['level']:g}")
        + f", encode error on the difference {db_text(w['difference_error_db'])} "
        f"against the difference {db_text(w['ab_lossless_db'])} "
        f"({db_text(w['ab_delivered_db'])} as delivered, encode error per side "
        f"{db_text(w['encode_db'])})"
    )
    if not d["masked"]:
        return [
            f"delivery (global rule): every row's encode error on the A-B difference is at "
            f"least {d['margin_db']:g} dB below the difference ({n} rows)" + worst
        ]
    return [
        f"DELIVERY MASKED: {d['masked']} of {n} rows fail the global delivery rule (encode "
        f"error on the difference not {d['margin_db']:g} dB below it), created with "
        "--allow-masking: raters may have judged the encoder" + worst,
        "masked rows (difference / encode error on it): "
        + ", ".join(
            f"{r['job']}"
            + ("" if r.get("level") is None else f" x{r['level']:g}")
            + f" {db_text(r['ab_lossless_db'])} / {db_text(r['difference_error_db'])}"
            for r in d["rows"]
            if not r["ok"]
        ),
    ]


# -- deciding before encoding ------------------------------------------------------------------

#: the trial stream's error on a difference (QP 12): RMS code values of ``B'-A' - (B-A)`` at
#: 41 dB PSNR, the largest measured on natural footage (41-44 dB, ``bench_delivery.py``)
STREAM_ERROR_RMS = PEAK * 10 ** (-41 / 20)
#: the least local RMS amplitude (code values, where the pair differs) a difference needs for
#: the predictor to expect the stream to keep it: 8, 3.5x the stream's error on a difference.
#: The rule's correlation of 0.71 needs a window's difference at least as large as the error
#: there, but the error is larger on textured blocks and fine (noise-like) differences lose
#: gain: crf16's compression noise was masked at up to 6.1 code values RMS (flower_rotate,
#: ``benchmarks/results/localrule_cpu2.txt``), a flicker kept from 3.5
PREDICT_RMS_MIN = 8.0


def local_rms(frame: dict) -> float | None:
    """The RMS difference (code values) where a frame's pair differs, from a compare report's
    per-frame figures (``frames.csv``: ``psnr`` over every value, ``diff_fraction`` over pixel
    positions): ``sqrt(MSE / diff_fraction)``; None where the frame is identical."""
    p, frac = _num(frame.get("psnr")), _num(frame.get("diff_fraction"))
    if p is None or frac is None or math.isinf(p) or frac <= 0:
        return None
    return math.sqrt(PEAK * PEAK * 10 ** (-p / 10) / frac)


def _num(v) -> float | None:
    if v is None or v == "":
        return None
    v = float(v)
    return None if math.isnan(v) else v


#: a frame's difference predicted kept by its structure: its 16 x 16 block means (the report's
#: ``flicker``: mean |change of block-mean luma difference| between frames, halved: the block
#: means' amplitude, for a difference that changes sign) at least ``PREDICT_BLOCK_MIN`` code
#: values (the stream codes a macroblock's mean to a fraction of a code value at QP 12) and
#: holding at least ``PREDICT_BLOCK_SHARE`` of the frame's difference energy (the rule's
#: correlation of 0.71: half the energy). Measured: a +-3% flicker 2.4-4.1 code values, 0.61-0.94
#: of the energy; crf16, crf32, bf16 at most 0.4 code values and 0.00 of it
PREDICT_BLOCK_MIN = 1.0
PREDICT_BLOCK_SHARE = 0.5


def predict(frames: list[dict], level: float | None = None) -> dict:
    """Whether the trial stream would mask a row's difference, from its report figures
    alone (``frames``: its rows of ``frames.csv`` in frame order, or of ``clips.csv`` with
    ``psnr_mean``, ``diff_fraction_mean`` and ``flicker_mean`` as ``psnr``, ``diff_fraction``
    and ``flicker``). A frame is predicted kept when its difference is large where the pair
    differs (RMS at least :data:`PREDICT_RMS_MIN` code values, :func:`local_rms`) or smooth
    (block means of at least :data:`PREDICT_BLOCK_MIN` holding :data:`PREDICT_BLOCK_SHARE` of
    its energy); the frames predicted kept must hold :data:`KEEP_MIN` of the difference's
    energy, as the rule asks of its windows. ``level``: a threshold study's amplification (the
    amplitudes scaled by it). Pure and conservative: a fine difference of small amplitude
    that the stream keeps anyway is predicted masked; a frame without the figures counts as
    masked. Returns ``{"masks", "energy", "kept", "local_rms"}`` (``kept``: the share of
    energy in frames predicted kept; ``local_rms``: the energy-weighted median frame's)."""
    k = 1.0 if level is None else float(level)
    flick = [_num(f.get("flicker")) for f in frames]
    total = kept = 0.0
    weighted = []
    for i, f in enumerate(frames):
        p = _num(f.get("psnr"))
        if p is not None and math.isinf(p):
            continue  # an identical frame: nothing to mask
        if p is None:
            return {"masks": True, "energy": None, "kept": None, "local_rms": None}
        e = PEAK * PEAK * 10 ** (-p / 10) * k * k  # mean square, as amplified
        r = local_rms(f)
        r = None if r is None else r * k
        # the block means' amplitude: both transitions around the frame (the smaller), halved
        around = [
            x
            for x in (flick[i] if i else None, flick[i + 1] if i + 1 < len(frames) else None)
            if x is not None
        ]
        if len(frames) == 1:
            around = [flick[0]] if flick[0] is not None else []
        blocks = min(around) / 2 * k if around else 0.0
        total += e
        if (r is not None and r >= PREDICT_RMS_MIN) or (
            blocks >= PREDICT_BLOCK_MIN and blocks * blocks >= PREDICT_BLOCK_SHARE * e
        ):
            kept += e
        weighted.append((r or 0.0, e))
    if total == 0:
        return {"masks": False, "energy": 0.0, "kept": None, "local_rms": None}
    weighted.sort()
    acc, med = 0.0, None
    for r, e in weighted:
        acc += e
        if acc >= total / 2:
            med = r
            break
    return {
        "masks": kept < KEEP_MIN * total,
        "energy": total,
        "kept": kept / total,
        "local_rms": round(med, 2),
    }


def report_frames(report, jobs) -> dict:
    """The rows of a compare report's ``frames.csv`` for ``jobs`` (job -> list of rows; read
    one line at a time, in file order: frame order), or where the report has no
    ``frames.csv`` one row per job from ``clips.csv`` (``psnr_mean``, ``diff_fraction_mean``,
    ``flicker_mean``)."""
    import csv

    report, jobs = Path(report), set(jobs)
    out = {j: [] for j in jobs}
    path = report / "frames.csv"
    if path.is_file():
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row.get("job") in jobs:
                    out[row["job"]].append(row)
        return out
    with (report / "clips.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("job") in jobs:
                # each metric's clip mean stands for its frames (``psnr_mean`` -> ``psnr``)
                out[row["job"]].append({k[: -len("_mean")]: v for k, v in row.items() if k.endswith("_mean")})
    return out


def delivery_rows(
    chosen: list[dict], ladder: list, kind: str = "amplify", cut: dict | None = None
) -> list[dict]:
    """The rows :func:`choose_delivery` judges for a study about to be made, from what
    ``create_study`` knows before encoding: the chosen clips (``{"job"}`` each), the ladder
    (``[None]``: one row per clip; else the threshold levels), its kind (``amplify`` or
    ``blur``) and the excerpt plan (:func:`.excerpt.plan`: each clip's window of frames)."""
    rows = []
    for c in chosen:
        w = (cut or {}).get("windows", {}).get(c["job"])
        for k in ladder:
            row = {"job": c["job"], "level": k}
            if k is not None:
                row["ladder"] = kind
            if w:
                row["frames"] = (w["start"], w["start"] + w["frames"])
            rows.append(row)
    return rows


def choose_delivery(rows: list[dict], report) -> tuple[str, str]:
    """The delivery for a study of ``rows`` (each ``{"job"}``, with ``"level"`` for a
    threshold level, ``"frames"``: (start, stop) for an excerpt; a row with ``"ladder":
    "blur"`` has no report figures and counts as masked) from the compare ``report`` (its
    folder, or job -> frame rows): ``"lossless"`` where :func:`predict` says the stream would
    mask any row, else ``"stream"``; with the reason in one line."""
    jobs = sorted({r["job"] for r in rows})
    frames = report if isinstance(report, dict) else report_frames(report, jobs)
    masked, least = [], None
    for r in rows:
        label = r["job"] + ("" if r.get("level") is None else f" x{r['level']:g}")
        if r.get("ladder") == "blur":
            masked.append((label, None))
            continue
        fr = frames.get(r["job"]) or []
        if r.get("frames"):
            a, b = r["frames"]
            fr = [f for i, f in enumerate(fr) if a <= int(f.get("frame", i)) < b]
        p = predict(fr, r.get("level"))
        if p["masks"]:
            masked.append((label, p["local_rms"]))
        elif p["local_rms"] is not None and (least is None or p["local_rms"] < least[1]):
            least = (label, p["local_rms"])
    if masked:
        label, rms = min(masked, key=lambda m: -1 if m[1] is None else m[1])
        why = (
            "no report figures for its stimulus"
            if rms is None
            else f"its difference {rms:.1f} code values RMS where the pair differs, below "
            f"{PREDICT_RMS_MIN:.1f}"
        )
        return "lossless", (
            f"delivery: lossless (the H.264 stream would mask {len(masked)} of "
            f"{len(rows)} rows; e.g. {label}: {why})"
        )
    tail = (
        ""
        if least is None
        else (
            f"; least: {least[0]}, {least[1]:.1f} code values RMS "
            f"where the pair differs, at least {PREDICT_RMS_MIN:.1f}"
        )
    )
    return "stream", f"delivery: stream (H.264 keeps every row's difference{tail})"
