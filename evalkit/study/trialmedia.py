"""One clip's trial media, made window by window: memory bounded by a window of frames, not by
the clip's length (issue 36).

For each row of the clip (the clip itself, or one threshold level) the clip is read window by
window (:func:`.excerpt.pair_windows`, :func:`.excerpt.window_frames` frames at a time, both
sides side by side) in these passes:

1. *encode*, one pass or more: each window's contents (the row's sides as shown; each catch
   version's reference and degraded copy) are built once and handed to every trial stream the
   pass makes, each encoded on a thread of its own (:func:`.media.store_tiled_streams`): the
   row's streams, then its catch versions', at most :data:`STREAMS_PER_PASS` streams a pass (a
   pass of catch versions alone decodes only the side they come from);
2. *measure*: the row's delivery fidelity, its streams decoded side by side against the
   lossless contents (:func:`.delivery_rule.row_figures`), and for a threshold level the
   stimulus's metrics (:func:`.threshold.measure_windows`) in the same pass.

A threshold study first measures the clip's real difference (one more pass). Every file, figure
and metric is the one the whole clip in memory gave (``benchmarks/study_identity.py``): the
frames fed to each encoder are the same, the fidelity sums are exact integers and the metrics
batch their frames alike.
"""

from __future__ import annotations

import math

import numpy as np

from ..concurrency import fan_out
from ..video import open_clip
from . import delivery as delivery_rule
from . import design, excerpt, threshold
from .lossless import exact_row
from .media import degrade, store_tiled_streams

#: bytes read from each end of a clip file for its :func:`fingerprint`
FINGERPRINT_BYTES = 1 << 16


def fingerprint(path) -> str:
    """A clip file's content fingerprint (what :func:`.design.catch_plan` draws a row's catch
    versions from): SHA-256 of its size and its first and last :data:`FINGERPRINT_BYTES` bytes
    (a lossless clip's first frame and its last; reading the whole file would cost a pass over
    every clip). The same file gives the same fingerprint in every study, wherever it lies."""
    import hashlib
    import os

    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(size.to_bytes(8, "big"))
        h.update(f.read(FINGERPRINT_BYTES))
        f.seek(max(0, size - FINGERPRINT_BYTES))
        h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()


def measured(m: dict) -> dict:
    """A stimulus's metrics as stored: finite floats at full precision (JSON has no inf)."""
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in m.items()}


def clip_media(
    c: dict,
    rows: list,
    *,
    window=None,
    kind,
    forced,
    media,
    offs,
    swap,
    xbit,
    metrics_device,
    measure_reference: bool,
    delivery_margin_db: float = delivery_rule.MARGIN_DB,
    delivery: str = "stream",
) -> dict:
    """One clip's media (run in a worker thread): each of its rows' matched set (and stimulus
    metrics) and catch versions; ``rows``: (row index, level or None, [(catch kind, from B, colour offset)]);
    ``window``: (the clip's excerpt window, seconds, at) or None (the whole clip);
    ``delivery_margin_db``: the delivery rule's (:mod:`.delivery`); ``delivery``: ``stream``
    (H.264, its fidelity measured) or ``lossless`` (animated lossless WebP, :mod:`.lossless`:
    exact, nothing measured). Returns
    ``{"fps_a", "fps_b", "seconds", "rows", "stimuli", "catches"}`` (``"reference"`` when
    measured; ``"error"``: the sides differ in frame count or size); nothing is encoded when
    the frame rates differ (the caller's rule)."""
    fps, fps_b = open_clip(c["path_a"]).info.fps, open_clip(c["path_b"]).info.fps
    out = {"fps_a": fps, "fps_b": fps_b, "seconds": {}, "rows": [], "stimuli": [], "catches": []}
    if fps != fps_b:  # reported by the caller, in clip order, as a study-wide rule
        return out

    args = window or (None,)

    def pairs():
        return excerpt.pair_windows(c["path_a"], c["path_b"], *args)

    def side(from_b: bool):
        return excerpt.side_windows(c["path_b"] if from_b else c["path_a"], *args)

    try:
        if measure_reference:
            out["reference"] = measured(threshold.measure_windows(pairs(), device=metrics_device))
        # this clip's catch references: each its own colour offset (:func:`.design.catch_plan`:
        # a permutation per clip, drawn from its content), so no two share a picture
        for i, k, catches in rows:
            refs = [(kind_, from_b, tuple(off)) for kind_, from_b, off in catches]
            _row(
                i,
                c,
                k,
                offs.get(k),
                refs,
                pairs,
                side,
                fps,
                kind=kind,
                forced=forced,
                media=media,
                swap=swap,
                xbit=xbit,
                out=out,
                metrics_device=metrics_device,
                margin_db=delivery_margin_db,
                delivery=delivery,
            )
    except excerpt.ShapeError as e:
        out["error"] = str(e)
    return out


def _shown(a, b_real, level, offset, kind, same: list | None = None) -> dict:
    """A row's two sides as shown in one window: A and B (level None), or A and the level's
    stimulus, both shifted by the level's colour offset (:func:`.threshold.shifted`);
    ``same``: [whether the stimulus has equalled B so far], updated."""
    if level is None:
        return {"a": a, "b": b_real}
    fb = threshold.stimulus(kind, a, b_real, level)
    if same is not None:
        same[0] = same[0] and np.array_equal(fb, b_real)
    return {"a": threshold.shifted(a, offset), "b": threshold.shifted(fb, offset)}


#: trial streams one pass encodes at once, at most: each is an x264 encoder holding frames of
#: its own, so a row with many catch versions (a study of one clip has 9) is encoded in several
#: passes, not all at once
STREAMS_PER_PASS = 6


def _passes(n_row: int, n_catch: int, refs: list) -> list[list]:
    """The units (None: the row; ``j``: catch version ``j``) each encoding pass makes, in
    order: the row first, then catch versions, at most :data:`STREAMS_PER_PASS` streams a pass
    (one unit at least)."""
    out, cur, n = [], [None], n_row
    for j in range(len(refs)):
        if n + n_catch > STREAMS_PER_PASS:
            out.append(cur)
            cur, n = [], 0
        cur.append(j)
        n += n_catch
    return out + [cur]


def _row(
    i,
    c,
    level,
    offset,
    refs,
    pairs,
    side,
    fps,
    *,
    kind,
    forced,
    media,
    swap,
    xbit,
    out,
    metrics_device,
    margin_db=delivery_rule.MARGIN_DB,
    delivery="stream",
) -> None:
    """Row ``i`` of the clips table and its catch versions (``refs``: (kind, reference from B,
    colour offset) each). Each catch reference is its source mirrored left to right and
    shifted by its offset (:data:`.threshold.CATCH_OFFSETS`), so no two catch versions of a
    clip share a reference picture, nor a test trial's (a colour offset alone left the chroma,
    and so runs of coded bytes, the same as the clip's test trial's: a script matched a catch
    to its clip by shared byte runs); its degraded copy is :func:`.media.degrade`'s."""
    protocol = "abx" if forced else "preference"
    x = design.X_TILE[delivery]
    one = design.ONE_PLACE[delivery]
    # the answer's place is a bit of each row (design.row_keys), drawn from what the row shows
    # (design.row_bits: the same files in every study of the same runs), a bit of its own for
    # each catch version
    bit, catch_bits = design.row_bits(
        (fingerprint(c["path_a"]), fingerprint(c["path_b"])),
        (level, None if offset is None else tuple(int(v) for v in offset)),
        len(refs),
    )
    row_keys = design.row_keys(protocol, x=x, bit=bit, one_place=one)
    catch_keys = [design.row_keys(protocol, catch=True, x=x, one_place=one, bit=b) for b in catch_bits]
    extra = {"x": x} if forced and one else {}
    same = [True]
    made = {}  # unit -> {"rects", "scale", "files"}

    def sides(units):
        """The windows a pass needs: both sides for the row, else its catches' sources."""
        if None in units or len({refs[j][1] for j in units}) == 2:
            yield from pairs()
            return
        from_b = refs[units[0]][1]
        for x in side(from_b):
            yield (None, x) if from_b else (x, None)

    for units in _passes(len(row_keys), len(design.row_keys(protocol, True, x, 0, one)), refs):

        def contents(units=units):
            for a, b in sides(units):
                item = _shown(a, b, level, offset, kind, same) if None in units else {}
                for j in units:
                    if j is not None:
                        ck, from_b, off = refs[j]
                        ref = threshold.shifted((b if from_b else a)[:, :, ::-1], off)
                        item[f"r{j}"], item[f"d{j}"] = ref, degrade(ref, fps, ck)
                yield item

        specs, keys = [], []
        for j in units:
            ks = row_keys if j is None else catch_keys[j]
            specs += [list(k) if j is None else [f"{ch}{j}" for ch in k] for k in ks]
            keys += [(j, k) for k in ks]
        for (j, key), (sha, layout, n) in zip(
            keys, store_tiled_streams(contents(), specs, fps, media, delivery)
        ):
            s = made.setdefault(j, {"rects": layout["rects"], "scale": layout["scale"], **extra, "files": {}})
            s["files"][key] = sha
            out["seconds"][sha] = n / fps

    def shown():
        for a, b in pairs():
            yield _shown(a, b, level, offset, kind)

    lp = c["lpips_mean"]
    if delivery == "lossless":  # exact by construction: nothing to measure
        fig = exact_row(c["job"], level)
        if level is not None:
            m = threshold.measure_windows(((x["a"], x["b"]) for x in shown()), device=metrics_device)
    elif level is None:
        fig = delivery_rule.row_figures(media, made[None], shown(), margin_db)
    else:
        fig, m = fan_out(
            shown(),
            [
                lambda items: delivery_rule.row_figures(media, made[None], items, margin_db),
                lambda items: threshold.measure_windows(
                    ((x["a"], x["b"]) for x in items), device=metrics_device
                ),
            ],
            name="evalkit-media-measure",
        )
    if level is not None:
        m = measured(m)
        m.pop("conventions", None)
        out["stimuli"].append(
            {
                "ord": i,
                "job": c["job"],
                "level": level,
                "metrics": m,
                "offset": list(offset),
                "identical_to_b": bool(same[0]),
            }
        )
        lp = m["lpips"]
    # media_a/media_b (one file per side) are unused since trials are streams: left empty
    out["rows"].append(
        {
            "ord": i,
            "job": c["job"],
            "clip": c["clip"],
            "prompt": c["prompt"],
            "seed": c["seed"],
            "lpips_mean": lp,
            "media_a": "",
            "media_b": "",
            "media_a_alt": None,
            "media_b_alt": None,
            "base_swap": swap[i],
            "base_x": xbit[i],
            "streams": made[None],
            "delivery": {"job": c["job"], "level": level, **fig},
        }
    )
    for j, (ck, _, _) in enumerate(refs):
        out["catches"].append({"ord": i, "kind": ck, "streams": made[j]})
