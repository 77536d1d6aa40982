"""Library side of ``evalkit metrics A B``: metrics of two clips (or two images), streamed.

:func:`compare_clips` reads both inputs with :class:`evalkit.video.ClipReader` (video files,
single images, folders of images), decodes both ahead in background threads or worker processes (:mod:`evalkit.procdecode`), feeds
:func:`evalkit.metrics.stream.stream_pair` and returns one JSON-ready object (see
:func:`compare_clips`). Non-finite numbers become ``null`` there: PSNR of identical frames
(``inf``) and warping errors without any consistent pixel (``nan``). The metric keys, in
output order, are those of :mod:`evalkit.metrics.catalogue` that some frame has.
"""

from __future__ import annotations

from pathlib import Path

from evalkit import fsutil
from evalkit.compare.alignment import resolve_offset, skip_frames
from evalkit.errors import InputFileError, UserError
from evalkit.metrics.catalogue import KEYS, fmt, units
from evalkit.video import ClipReader

TEMPORAL_CONVENTION_KEYS = ("flow", "warp_error", "tlp", "tof", "flicker")


#: bytes of decoded frames a reader may hold ahead of the consumer: 32 frames of 1280x720 RGB
#: (88 MB; what every size got before, so 720p keeps its measured depth); fewer frames at 1080p
AHEAD_BYTES = 32 * 1280 * 720 * 3


def prefetch_depth(chunk: int, frames: int = 32, frame_bytes: int | None = None) -> int:
    """Chunks a decoder may run ahead: about ``frames`` frames (at least 2 chunks), so a
    decoder never waits on a small chunk while memory stays bounded; with ``frame_bytes``
    (bytes of one decoded frame) at most :data:`AHEAD_BYTES` of frames (still at least 2
    chunks): at 1080p 14 frames instead of 32, 230 MB less over a compare's four readers."""
    if frame_bytes:
        frames = min(frames, max(1, AHEAD_BYTES // int(frame_bytes)))
    return max(2, -(-frames // max(1, chunk)))


def compare_clips(
    path_a,
    path_b,
    *,
    device=None,
    net: str = "alex",
    chunk: int | None = None,
    align: str = "error",
    temporal: bool = True,
    flow: str = "dis",
    flow_preset: str | None = None,
    flow_scale: float = 1.0,
    ssim_channel: str = "luma",
    csv_path=None,
    keep_frames: bool = True,
    vmaf: bool = False,
    vmaf_threads: int | None = None,
    progress: bool = False,
    offset="auto",
) -> dict:
    """Metrics of clip (or image) ``path_a`` against ``path_b``.

    Returns a JSON-ready dict::

        {"a": str, "b": str, "frames": int, "width": int, "height": int, "device": str,
         "lpips": float, "ssim": float, "psnr": float|null, "max_abs_diff": float,
         "diff_fraction": float,
         # clips of 2+ frames with temporal=True:
         "tlp", "tof", "warp_error_a", "warp_error_b", "warp_error_diff", "flicker",
         "flicker_a", "flicker_b": float|null,
         "psnr_pooled": float|null, "identical": bool, "identical_frames": int,
         "per_frame": {"frame": [0, 1, ...], "lpips": [...], ...},  # lists aligned with frame
         "conventions": {...}, "units": {...}, "alignment": {...}, "nan_counts": {...}}

    ``psnr`` is the mean PSNR over the frames that differ, null if every frame is identical;
    per-frame ``psnr`` is null for an identical frame. ``csv_path`` also writes the per-frame
    table (one row per frame, empty cells where a metric is undefined, ``inf`` for PSNR of
    identical frames). ``vmaf``: also VMAF (``"vmaf"`` mean, per frame and convention; a
    separate pass over the compared frames, :mod:`evalkit.compare.vmaf`); ``vmaf_threads``:
    libvmaf's threads. ``progress``: a per-frame progress bar on stderr.

    ``offset``: ``"auto"`` (default) tests the clips for a temporal offset and a frame-rate
    mismatch first (:mod:`evalkit.compare.alignment`): a mismatch is an error, an offset is
    compared at, on the frames both clips share (``"offset"`` in the result says which; the
    records keep A's frame numbers); a whole number: that offset, untested (0: frame by frame).
    """
    from evalkit.metrics import MetricInputError

    paths = {"a": Path(path_a), "b": Path(path_b)}
    ra, rb = ClipReader(paths["a"]), ClipReader(paths["b"])
    ia, ib = ra.info, rb.info
    if (ia.width, ia.height) != (ib.width, ib.height):
        raise InputFileError(
            paths["b"],
            f"frames are {ib.width}x{ib.height}, expected {ia.width}x{ia.height} like {paths['a']}",
        )
    al = resolve_offset(paths["a"], paths["b"], offset)
    if al.finding == "rate":
        raise InputFileError(paths["b"], al.reason)
    if al.offset:
        align = "shortest"  # the frames both clips share at the offset
    if align == "error" and ia.frames and ib.frames and ia.frames != ib.frames:
        raise InputFileError(
            paths["b"],
            f"{ib.frames} frames, expected {ia.frames} like "
            f"{paths['a']} (frame counts differ; --align shortest compares "
            "the common prefix and records it)",
        )
    # torch (through the metric engine) only once both inputs are read and checked: a bad
    # input is reported in a fraction of a second (issue 48)
    from evalkit.metrics.flow import DEFAULT_PRESET
    from evalkit.metrics.stream import PairEvaluator, json_safe, stream_pair

    try:
        ev = PairEvaluator(
            device=device,
            net=net,
            temporal=temporal,
            flow=flow,
            flow_preset=flow_preset or DEFAULT_PRESET,
            flow_scale=flow_scale,
            ssim_channel=ssim_channel,
        )
    except MetricInputError as e:
        raise UserError(str(e)) from None
    if vmaf:
        from evalkit.metrics.vmaf import check_available

        check_available()
    if chunk is None:
        from evalkit.metrics.stream import evaluator_chunk

        chunk = evaluator_chunk(ia.height, ia.width, ev)
    from tqdm import tqdm

    from evalkit.procdecode import DecoderPool, prefetch_chunks, use_processes

    records = []
    depth = prefetch_depth(chunk, frame_bytes=ia.height * ia.width * 3)
    pool = DecoderPool() if use_processes() else None
    if pool is not None:
        pool.start(2)
    pa = pb = None
    ea, eb = ia.frames_estimate, ib.frames_estimate
    total = min(ea, eb) if ea and eb else None
    try:
        pa = prefetch_chunks(paths["a"], chunk, depth, pool=pool)
        pb = prefetch_chunks(paths["b"], chunk, depth, pool=pool)
        with tqdm(total=total, desc="metrics", unit="frame", disable=not progress, mininterval=0.5) as bar:
            for rec in stream_pair(
                skip_frames(pa, al.skip_a), skip_frames(pb, al.skip_b), evaluator=ev, chunk=chunk, align=align
            ):
                rec["frame"] += al.skip_a  # A's frame number
                records.append(rec)
                bar.update(1)
        summary = ev.compute()
    except MetricInputError as e:
        if e.field in paths:  # about one clip's frames: that file, in the command's words
            hint = e.hint and e.hint.replace("align='shortest'", "--align shortest")
            raise InputFileError(
                paths[e.field],
                e.detail.replace(" like a", f" like {paths['a']}") + (f" ({hint})" if hint else ""),
            ) from None
        raise
    finally:
        for p in (pa, pb, pool, ev):
            if p is not None:
                p.close()

    if vmaf and records:
        from evalkit.compare.vmaf import add_vmaf

        summary["conventions"]["vmaf"] = add_vmaf(
            records, paths["a"], paths["b"], n_threads=vmaf_threads, skip=(al.skip_a, al.skip_b)
        )
        summary["means"]["vmaf"] = sum(r["vmaf"] for r in records) / len(records)
    if csv_path is not None:
        write_csv(csv_path, records)
    keys = [k for k in KEYS if any(k in r for r in records)]
    out = {
        "a": str(paths["a"]),
        "b": str(paths["b"]),
        "frames": summary["frames"],
        "width": summary["width"],
        "height": summary["height"],
        "device": summary["device"],
    }
    for k in keys:
        out[k] = summary["means"].get(k)
    out.update(
        {
            "psnr_pooled": summary["psnr_pooled"],
            "identical": summary["identical"],
            "identical_frames": summary["identical_frames"],
        }
    )
    if keep_frames:
        out["per_frame"] = {
            "frame": [r["frame"] for r in records],
            **{k: [r.get(k) for r in records] for k in keys},
        }
    temporal_present = any(k in TEMPORAL_CONVENTION_KEYS for k in keys)
    out["conventions"] = {
        k: v
        for k, v in summary["conventions"].items()
        if temporal_present or k not in TEMPORAL_CONVENTION_KEYS
    }
    descriptions = units()
    out["units"] = {k: descriptions[k] for k in keys}
    out["alignment"] = summary["alignment"]
    out["offset"] = al.as_dict(compared=summary["frames"])
    out["nan_counts"] = summary["nan_counts"]
    return json_safe(out)


def write_csv(path, records: list[dict]) -> None:
    """The per-frame table of ``evalkit metrics --csv``: frame, then the metric keys some frame
    has; empty cells where a metric is undefined. Lines end in CRLF (the csv module's default,
    which this file has always had; the compare report's CSVs end lines in LF)."""
    keys = [k for k in KEYS if any(k in r for r in records)]
    rows = ([r["frame"], *(None if r.get(k) is None else float(r[k]) for k in keys)] for r in records)
    fsutil.write_csv(path, ["frame", *keys], rows, lineterminator="\r\n")


def format_text(result: dict) -> str:
    """Human-readable summary of :func:`compare_clips`' result."""
    lines = [
        f"{result['a']}  vs  {result['b']}",
        f"{result['frames']} frame(s), {result['width']}x{result['height']}, on {result['device']}",
    ]
    if result["identical"]:
        lines.append("bit-identical: every frame is exactly the same")
    for k in KEYS:
        if k in result:
            v = result[k]
            if k == "psnr":  # null only for identical frames (JSON has no inf)
                shown = "inf (identical)" if v is None else fmt(v, 2, fixed=True) + " dB"
            else:
                shown = fmt(v, 4, fixed=True)
            lines.append(f"  {k:<16} {shown}")
    al = result.get("alignment", {})
    if al.get("mode") == "shortest" and (al.get("dropped_a") or al.get("dropped_b")):
        lines.append(
            f"alignment: compared the first {al['compared']} frames "
            f"(a has {al['frames_a']}, b has {al['frames_b']})"
        )
    off = result.get("offset") or {}
    if off.get("offset") or off.get("finding") in ("static", "short"):
        lines.append(f"offset: {off['text']}")
    conv = result["conventions"]
    lines.append("conventions: " + "; ".join(f"{k}={v}" for k, v in conv.items()))
    return "\n".join(lines)
