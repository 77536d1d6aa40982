"""Browser copies for raters, stored by content: ``MEDIA/<sha256>.mp4``.

Single copies (:func:`store_browser_copy`): both sides and every degraded catch version are
encoded with the one shared :data:`evalkit.video.BROWSER_ENCODING` (bit-exact muxing, no
metadata), so neither the file name, the path nor the file's bytes say which backend, run or
job a video comes from. What they do not hide: the file's size (the smoother clip compresses
smaller, per frame too: a script can read ``stsz``), and that two encodes of the same frames are
the same bytes.

Matched sets (:func:`store_matched_set`), for trials whose clips must not be told apart by
anything but watching them (ABX):

- **Equal lengths, equal layout.** Every file of a set has the same length and the same bytes
  before the frame data (``ftyp``, ``moov``: the same sample table, sample sizes, key frames,
  time stamps and ``avcC``); every frame's sample has the same size in every file. Each frame
  is padded up to the largest of the set with an H.264 filler-data NAL unit (type 12), which
  decoders skip: the decoded pixels are exactly those of the unpadded encode.
- **No shared bytes between variants.** An item is ``(frames, variant)``; variant 0 is the
  primary encoding, variants 1 and 2 are encodings of the same quality class whose bitstreams
  are unrelated, byte for byte, to variant 0's (and to each other's), so an X that is a second
  copy of A or B shares no bytes with it. Their SPS/PPS are byte-identical, checked.
- **No labels.** x264's SEI (its options string, which would name the variant) is removed;
  no encoder string, date or other metadata that differs between files.

What a matched set does not hide: a script that parses the NAL units inside each sample can
measure the filler and so recover each frame's unpadded size. The set hides sizes from the
container level (file length, ``stsz``, byte ranges a player fetches), not from an H.264 parser.
Every file of a set also costs the sum of the per-frame maxima (a few % over the largest item's
own encode; the smallest item grows by the size gap, e.g. +20..35% for a blurred backend).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..fsutil import sha256_file
from ..video import BROWSER_ENCODING, BrowserEncoding, read_frames, write_browser

#: x264's quantiser deadzones (``deadzone-inter``, ``deadzone-intra``; defaults 21 and 11; larger
#: rounds more small coefficients down) of the alternate encodings of a matched set. Why this
#: option: at our preset (``veryfast``: trellis off, so x264 uses them) the deadzones decide, in
#: every block of every frame, intra and inter, whether a coefficient near a quantisation
#: threshold rounds up or down; moving them flips some such coefficients in the first
#: macroblocks of a frame, and CABAC then codes all the rest of the frame differently. Measured
#: on 24-frame clips, the share of one variant's 64-byte runs found anywhere in another's: under
#: 1% on textured, panned or noisy clips, up to 5% on a pure synthetic gradient (frames with next
#: to no residual, e.g. all-skip frames of a static clip, can still coincide). They are not
#: coded in the SPS/PPS (unlike ``cqm``, ``8x8dct``, ``weightp``, or the chroma QP offset that
#: ``psy-rd`` below 0.25 moves), and they keep the quality class: at CRF 12, size -2..+3% and
#: PSNR within 0.15 dB on textured clips (up to +9% size on flat noise). Rejected: ``psy-rd``,
#: ``no-fast-pskip`` (no effect at ``veryfast``: the same bytes), ``subme`` 3 (on some clips
#: the same bytes), ``aq-strength`` (no effect on flat areas: all bytes shared on a smooth gradient), ``crf`` (below 12 it moves
#: ``pic_init_qp`` in the PPS; 12.3 shares all bytes on a smooth gradient, whose frame QP still
#: rounds to 12). Variant 1 rounds finer (18, 9); variant 2 coarser inter, finer intra (23, 7),
#: so 1 and 2 also differ from each other. x264 ignores deadzones with trellis quantisation
#: (presets ``medium`` and slower): :func:`store_matched_set` reads x264's options string and
#: refuses a set whose variants did not get them.
VARIANT_DEADZONES: dict[int, tuple[int, int] | None] = {0: None, 1: (18, 9), 2: (23, 7)}
#: x264 threads of matched sets: fixed, since x264's output depends on its thread count (with
#: ``threads`` left to auto, the bytes would depend on the machine's core count).
MATCHED_THREADS = 1
#: A filler-data NAL unit in an MP4 sample: 4-byte length, header 0x0C (nal_ref_idc 0, type
#: 12), ``0xFF`` payload bytes, the rbsp trailing byte 0x80. At least 6 bytes.
_FILLER_MIN = 6
_NAL_SEI = 6


def matched_encoding(variant: int) -> BrowserEncoding:
    """The encoding of ``variant`` (0, 1, 2) in a matched set: :data:`BROWSER_ENCODING` (CRF 12,
    ``veryfast``, GOP 12, no B-frames, High profile) plus ``scenecut=0`` (key frames only every
    12th frame, so every clip of a set has them at the same frames; BROWSER_ENCODING alone may
    add one at a scene cut, which would differ between clips) and a fixed thread count; variants
    1 and 2 also move x264's deadzones (:data:`VARIANT_DEADZONES`)."""
    if variant not in VARIANT_DEADZONES:
        raise ValueError(f"variant: expected 0, 1 or 2, found {variant!r}")
    params = ["scenecut=0"]
    dz = VARIANT_DEADZONES[variant]
    if dz is not None:
        params.append(f"deadzone-inter={dz[0]}:deadzone-intra={dz[1]}")
    return replace(BROWSER_ENCODING, options={**BROWSER_ENCODING.options,
                                              "threads": str(MATCHED_THREADS),
                                              "x264-params": ":".join(params)})


def store_browser_copy(frames: np.ndarray, fps, media_dir: Path) -> str:
    """Encode ``frames`` as a browser copy into ``media_dir``; return its sha256 (file name
    ``<sha256>.mp4``). Writing the same frames twice on one machine gives the same file (x264's
    output depends on its thread count, which :data:`BROWSER_ENCODING` leaves to the number of
    cores; matched sets fix it)."""
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".mp4", dir=media_dir)
    os.close(fd)
    tmp = Path(tmp)
    try:
        write_browser(tmp, frames, fps, BROWSER_ENCODING)
        digest = sha256_file(tmp)
        os.replace(tmp, media_dir / f"{digest}.mp4")
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def degrade(frames: np.ndarray, fps, kind: str) -> np.ndarray:
    """A degraded copy for catch trials. Easy (obvious; the exclusion rule uses them): ``blur``
    (Gaussian, sigma 1/20 of the short side, at least 2 px), ``compression`` (H.264 at CRF 51,
    decoded), ``dropped_frames`` (only every third frame kept, each held three times). Graded
    (mild, near what raters can just see; reported, never used to exclude): ``blur_mild``
    (sigma 1/160 of the short side, at least 0.7 px), ``compression_mild`` (CRF 36)."""
    if kind in ("blur", "blur_mild"):
        from scipy.ndimage import gaussian_filter

        short = min(frames.shape[1:3])
        s = max(2.0, short / 20) if kind == "blur" else max(0.7, short / 160)
        return np.clip(gaussian_filter(frames.astype(np.float32), sigma=(0, s, s, 0)) + 0.5,
                       0, 255).astype(np.uint8)
    if kind in ("compression", "compression_mild"):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "c.mp4"
            write_browser(p, frames, fps, BrowserEncoding(crf=51 if kind == "compression" else 36))
            out = read_frames(p)[0][:, :frames.shape[1], :frames.shape[2]]
        return np.ascontiguousarray(out)
    if kind == "dropped_frames":
        idx = np.arange(len(frames))
        return frames[idx - idx % 3]
    raise ValueError("kind: expected blur, compression, dropped_frames, blur_mild or "
                     f"compression_mild, found {kind!r}")


# -- matched sets ----------------------------------------------------------------------------

def _check_items(items) -> list[tuple[np.ndarray, int]]:
    items = list(items)
    if not items:
        raise ValueError("items: expected at least one (frames, variant) item, found none")
    out = []
    for k, item in enumerate(items):
        try:
            frames, variant = item
        except (TypeError, ValueError):
            raise ValueError(f"items[{k}]: expected a (frames, variant) pair") from None
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            raise ValueError(f"items[{k}]: frames: expected (T, H, W, 3) uint8 RGB, found "
                             f"{frames.dtype} {frames.shape}")
        if frames.shape[0] == 0:
            raise ValueError(f"items[{k}]: frames: expected at least one frame, found none")
        if isinstance(variant, bool) or not isinstance(variant, (int, np.integer)) \
                or int(variant) not in VARIANT_DEADZONES:
            raise ValueError(f"items[{k}]: variant: expected 0, 1 or 2, found {variant!r}")
        out.append((frames, int(variant)))
    t0, h0, w0 = out[0][0].shape[:3]
    for k, (frames, _) in enumerate(out[1:], 1):
        t, h, w = frames.shape[:3]
        diffs = [f"{name} {v} (items[0]: {v0})" for name, v, v0 in
                 (("frame count", t, t0), ("height", h, h0), ("width", w, w0)) if v != v0]
        if diffs:
            raise ValueError(f"items[{k}]: every item of a matched set has the same frame count, "
                             f"height and width; differs in " + ", ".join(diffs))
    return out


def avcc_nal_units(sample: bytes) -> list[bytes]:
    """Split an MP4 (AVCC, 4-byte length prefixed) H.264 sample into its NAL units."""
    nals, i = [], 0
    while i < len(sample):
        if i + 4 > len(sample):
            raise ValueError(f"sample: truncated NAL length at byte {i}")
        n = int.from_bytes(sample[i:i + 4], "big")
        if n == 0 or i + 4 + n > len(sample):
            raise ValueError(f"sample: bad NAL length {n} at byte {i} of {len(sample)}")
        nals.append(sample[i + 4:i + 4 + n])
        i += 4 + n
    return nals


def _filler(size: int) -> bytes:
    """A filler-data NAL unit of exactly ``size`` bytes in AVCC form (``size`` >= 6)."""
    body = b"\x0c" + b"\xff" * (size - _FILLER_MIN) + b"\x80"
    return len(body).to_bytes(4, "big") + body


def _pad_target(sizes: list[int]) -> int:
    """The smallest size >= max(sizes) that every size reaches exactly or with >= 6 bytes."""
    target = max(sizes)
    while any(0 < target - s < _FILLER_MIN for s in sizes):
        target += 1
    return target


def _x264_options(sei: bytes) -> str | None:
    m = re.search(rb"options: ([ -~]*)", sei)
    return m.group(1).decode("ascii") if m else None


def _demux(path: Path, variant: int) -> dict:
    """Samples (SEI removed), timing and ``avcC`` of an MP4 written by :func:`write_browser`."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        extradata = bytes(s.codec_context.extradata or b"")
        samples, timing, options = [], [], None
        for pkt in c.demux(s):
            if pkt.size == 0:   # the demuxer's end-of-stream marker
                continue
            nals = avcc_nal_units(bytes(pkt))
            for nal in nals:
                if nal[0] & 0x1F == _NAL_SEI and options is None:
                    options = _x264_options(nal)
            kept = [n for n in nals if n[0] & 0x1F != _NAL_SEI]
            samples.append(b"".join(len(n).to_bytes(4, "big") + n for n in kept))
            timing.append((pkt.pts, pkt.dts, pkt.duration, bool(pkt.is_keyframe)))
    if len(extradata) < 7 or extradata[0] != 1 or extradata[4] & 3 != 3:
        raise RuntimeError(f"{path.name}: expected an avcC with 4-byte NAL lengths")
    dz = VARIANT_DEADZONES[variant]
    if dz is not None:
        # The alternate bitstreams differ from variant 0 only if x264 applies the deadzones
        # (it ignores them with trellis quantisation, e.g. at slower presets): check what it says.
        want = f"deadzone={dz[0]},{dz[1]}"
        if options is None or want not in options.split() or "trellis=0" not in options.split():
            raise RuntimeError(f"variant {variant}: x264 did not apply {want} (its options: "
                               f"{options!r}); the variants would share bytes")
    return {"extradata": extradata, "samples": samples, "timing": timing}


def _mux(path: Path, template, samples: list[bytes], timing) -> None:
    """Write ``samples`` as the one video stream of a +faststart MP4 (stream copy)."""
    import av

    with av.open(str(path), "w", format="mp4",
                 options={"fflags": "+bitexact", "movflags": "+faststart"}) as out:
        stream = out.add_stream_from_template(template)
        for data, (pts, dts, duration, key) in zip(samples, timing):
            pkt = av.Packet(data)
            pkt.pts, pkt.dts, pkt.duration = pts, dts, duration
            pkt.time_base = template.time_base
            pkt.is_keyframe = key
            pkt.stream = stream
            out.mux(pkt)


def mp4_header(path) -> bytes:
    """The bytes of an MP4 file up to its ``mdat`` payload (``ftyp``, ``moov``, ``free``, the
    ``mdat`` box header): with +faststart, everything but the frame data."""
    with open(path, "rb") as f:
        pos = 0
        while True:
            f.seek(pos)
            head = f.read(16)
            if len(head) < 8:
                raise ValueError(f"{Path(path).name}: no mdat box")
            size, kind, n = int.from_bytes(head[:4], "big"), head[4:8], 8
            if size == 1:
                size, n = int.from_bytes(head[8:16], "big"), 16
            if kind == b"mdat":
                f.seek(0)
                return f.read(pos + n)
            if size < n:
                raise ValueError(f"{Path(path).name}: bad box size {size} at byte {pos}")
            pos += size


def store_matched_set(items: list[tuple[np.ndarray, int]], fps, media_dir) -> list[str]:
    """Encode every ``(frames, variant)`` item as a browser copy whose file length, MP4 box
    layout and every per-frame sample size are identical across the set; return each file's
    sha256 (file name ``<sha256>.mp4`` in ``media_dir``), in order.

    ``frames``: ``(T, H, W, 3)`` uint8 RGB, the same T, H and W for every item (else
    ``ValueError`` naming what differs); odd sizes are padded to even like :func:`write_browser`.
    ``variant``: 0 is the primary encoding, 1 and 2 are alternates of the same quality whose
    bytes are unrelated to variant 0's (see :func:`matched_encoding`: all variants, 0 included,
    use ``scenecut=0`` and a fixed thread count, so variant 0 here is *not* the same bytes as
    :func:`store_browser_copy` of the same frames, and key frames are every 12th frame in every
    clip of the set).

    Each item is encoded once, unpadded; x264's SEI is dropped; then frame ``i`` of every item
    is padded with a filler NAL unit to the largest frame ``i`` of the set (a little more when a
    gap would be under the 6 bytes of the smallest filler unit), and the samples are muxed with
    the same time stamps, key-frame flags and ``avcC``. Decoding gives exactly the frames of the
    unpadded encode. The same set (same items, same order, same fps) gives the same files. The
    padding depends on the whole set: an item stored in two different sets gives two files.
    Raises ``RuntimeError`` if the encodes of the set do not share SPS/PPS, time stamps or key
    frames, or if the files would still differ in length or layout (never expected)."""
    import av

    items = _check_items(items)
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="evalkit-matched-") as d:
        encodes = []
        for k, (frames, variant) in enumerate(items):
            path = Path(d) / f"{k}.mp4"
            write_browser(path, frames, fps, matched_encoding(variant))
            encodes.append(_demux(path, variant))
        first = encodes[0]
        for k, e in enumerate(encodes[1:], 1):
            if e["extradata"] != first["extradata"]:
                raise RuntimeError(f"items[{k}]: SPS/PPS (avcC) differ from items[0]'s; the "
                                   "files could not share one layout")
            if e["timing"] != first["timing"]:
                raise RuntimeError(f"items[{k}]: time stamps or key frames differ from "
                                   "items[0]'s")
        n = len(first["samples"])
        padded = [[] for _ in encodes]
        for i in range(n):
            sizes = [len(e["samples"][i]) for e in encodes]
            target = _pad_target(sizes)
            for k, e in enumerate(encodes):
                gap = target - sizes[k]
                padded[k].append(e["samples"][i] + (_filler(gap) if gap else b""))

        with av.open(str(Path(d) / "0.mp4")) as template_file:
            template = template_file.streams.video[0]
            outs = []
            for k in range(len(items)):
                path = Path(d) / f"out-{k}.mp4"
                _mux(path, template, padded[k], first["timing"])
                outs.append(path)
        head = mp4_header(outs[0])
        length = outs[0].stat().st_size
        for k, path in enumerate(outs[1:], 1):
            if path.stat().st_size != length or mp4_header(path) != head:
                raise RuntimeError(f"items[{k}]: the padded file differs from items[0]'s in "
                                   "length or layout")

        digests = []
        for path in outs:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".mp4", dir=media_dir)
            os.close(fd)
            tmp = Path(tmp)
            try:
                with open(path, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                    dst.flush()
                    os.fsync(dst.fileno())
                digest = sha256_file(tmp)
                os.replace(tmp, media_dir / f"{digest}.mp4")
            finally:
                tmp.unlink(missing_ok=True)
            digests.append(digest)
    return digests
