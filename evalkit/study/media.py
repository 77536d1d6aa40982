"""Browser copies for raters, stored by content: ``MEDIA/<sha256>.mp4``.

Single copies (:func:`store_browser_copy`): both sides and every degraded catch version are
encoded with the one shared :data:`evalkit.video.BROWSER_ENCODING` (bit-exact muxing, no
metadata), so neither the file name, the path nor the file's bytes say which backend, run or
job a video comes from. What they do not hide: the file's size (the smoother clip compresses
smaller, per frame too: a script can read ``stsz``), and that two encodes of the same frames are
the same bytes.

Matched sets (:func:`store_matched_set`), for trials whose clips must not be told apart by
their files (ABX):

- **Equal lengths, equal layout.** Every file of a set has the same length and the same bytes
  before the frame data (``ftyp``, ``moov``: the same sample table, sample sizes, key frames,
  time stamps and ``avcC``); every frame's sample has the same size in every file. Each frame
  is padded up to the largest of the set with an H.264 filler-data NAL unit (type 12), which
  decoders skip: the decoded pixels are exactly those of the unpadded encode.
- **No shared bytes between variants.** An item is ``(frames, variant)``; variant 0 is the
  primary encoding, variants 1 and 2 are encodings of the same quality class whose coded
  frames are unrelated, byte for byte, to variant 0's (and to each other's) from the slice
  header's ``cabac_init_idc`` or QP on, so an X that is a second copy of A or B shares no run of
  bytes with it beyond the first few bytes of each slice header (:data:`VARIANT_X264` says
  how). Their SPS/PPS are byte-identical, checked.
- **No labels.** x264's SEI (its options string, which would name the variant) is removed;
  no encoder string, date or other metadata that differs between files.
- **Reproducible.** The same set gives the same files (on one kind of CPU: x264's SIMD code is
  not bit-exact with its C code).

- **Nothing outside the coded picture data depends on the content.** Padding does not just
  append: each frame's slice grows by ``cabac_zero_word`` units to the set's common size and a
  6-8 byte filler unit takes the rest, so the NAL length fields say only the coded size modulo
  3 (a plain filler unit would leave the slice's own length, i.e. its coded size, in the 4
  bytes before it: a byte-wise comparison of two files then told the larger coded frame, the
  sharper backend, 48 times in 48). Constant QP and no weighted prediction keep the slice
  headers free of fields chosen from the content (:data:`MATCHED_X264`).

What remains is the coded picture data itself: a script that parses or decodes the H.264
slices (finding where the CABAC data ends, or comparing decoded pixels) compares the videos'
content, which is the task raters are asked to do; no encoding of different pictures can hide
that they differ.

Cost: every file of a set is as long as the sum of the per-frame maxima over the set, 2..6%
over its largest item's own encode in the tests; the smallest item grows by the size gap
(+30% at 96x64, +70% at 640x360 for a blurred backend against a sharp one).
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..fsutil import hold, mkstemp, remove_stale_temporaries, sha256_file
from ..video import BROWSER_ENCODING, BrowserEncoding, read_frames, write_browser

#: x264 settings of every clip of a matched set, on top of :data:`BROWSER_ENCODING`:
#: ``scenecut=0``: key frames exactly every 12th frame (BROWSER_ENCODING may add one at a scene
#: cut, at a frame that differs between clips; the files of a set must share their key frames).
#: ``no-mbtree=1``: x264's MB-tree code on AVX-512 CPUs reads memory it never wrote for some
#: frame widths (seen at 64, 96, 160, 720 and 848 px, not at 128, 192, 640 or 1280): the same
#: frames then encode to different bytes from run to run (about 1 encode in 100 to 700 here),
#: which would break content addressing (limiting x264 to AVX2, ``asm=AVX2``, also cures it,
#: but would need a CPU check: x264 does not check flags it is given). Without MB-tree, CRF 12
#: spends more bits, for equal or slightly higher PSNR: +1.5..3% on 640x360 moving texture,
#: +67% (+0.5 dB) on a 512x384 panned photo, +35..75% on 96x64 test clips. ``threads=1``:
#: x264's output depends on its thread count (auto: the number of cores);
#: :func:`store_matched_set` runs the items' encodes side by side instead.
#: ``qp=12`` (constant QP instead of CRF 12) and ``weightp=0``: a slice header then carries no
#: field chosen from the content (CRF moves each frame's QP with its complexity, weighted
#: prediction writes weights from the content), so a script reading slice headers learns nothing.
MATCHED_X264 = "scenecut=0:no-mbtree=1:qp=12:weightp=0"
#: x264 settings of the alternate encodings (variants 1 and 2; variant 0 has none), chosen so
#: that no part of a coded frame matches variant 0's, while the SPS/PPS (``avcC``) stay the same
#: (none of these is coded there) and the quality stays that of QP 12:
#:
#: - ``cabac-idc``: the CABAC context tables of P slices (``cabac_init_idc`` in each slice
#:   header; x264 always uses 0): the arithmetic coder starts from other probabilities, so P
#:   frames' bytes diverge right after the slice header, whatever the content.
#: - ``ipratio``: I frames at one QP lower (variant 1) or higher (variant 2) than the default
#:   1.4 gives (1.4 * 2**(+-1/6)); the CABAC tables of I slices depend only on the slice QP.
#: - ``deadzone-inter``/``deadzone-intra`` (defaults 21, 11): with trellis off (``veryfast``) they
#:   decide whether coefficients near a quantisation threshold round up or down, in every block,
#:   so the coded residuals differ too (alone they leave the first bytes of each frame shared:
#:   same slice header, same first macroblocks).
#:
#: Measured on 24-frame clips (textured, blurred, panned photo, flat noise, gradients), the share
#: of an alternate's 64-byte runs found anywhere in variant 0's: 0-0.1%; up to 3.6% on a pure
#: synthetic gradient, whose I frames can come out identical (almost no residual, and its I QP
#: did not move). Against variant 0: size -3..+6% (up to +14% on gradients), PSNR within 0.2 dB.
#: Rejected: ``psy-rd``, ``no-fast-pskip``, ``subme`` 3 (no effect at ``veryfast``: the same
#: bytes), ``aq-strength`` (no effect on flat areas), ``crf`` (below 12 it moves
#: ``pic_init_qp`` in the PPS; 12.x leaves most frames' QP as is).
VARIANT_X264: dict[int, dict[str, str]] = {
    0: {},
    1: {"deadzone-inter": "18", "deadzone-intra": "9", "cabac-idc": "1", "ipratio": "1.5714"},
    2: {"deadzone-inter": "23", "deadzone-intra": "7", "cabac-idc": "2", "ipratio": "1.2473"},
}
#: A filler-data NAL unit in an MP4 sample: 4-byte length, header 0x0C (nal_ref_idc 0, type
#: 12), ``0xFF`` payload bytes, the rbsp trailing byte 0x80. At least 6 bytes.
_FILLER_MIN = 6
_NAL_SEI = 6


def matched_encoding(variant: int) -> BrowserEncoding:
    """The encoding of ``variant`` (0, 1, 2) in a matched set: :data:`BROWSER_ENCODING`
    (``veryfast``, GOP 12, no B-frames, High profile) with :data:`MATCHED_X264` (constant QP 12
    instead of CRF 12) and one x264 thread; variants 1 and 2 add :data:`VARIANT_X264`."""
    if isinstance(variant, bool) or variant not in VARIANT_X264:
        raise ValueError(f"variant: expected 0, 1 or 2, found {variant!r}")
    params = ":".join([MATCHED_X264] + [f"{k}={v}" for k, v in VARIANT_X264[variant].items()])
    return replace(BROWSER_ENCODING, options={**BROWSER_ENCODING.options, "threads": "1",
                                              "x264-params": params})


def media_workers() -> int:
    """Clips whose media a study encodes at once: one per core, at most 4 (each holds its
    decoded frames and catch versions in memory; each matched set runs one x264 thread per
    item besides)."""
    return max(1, min(4, os.cpu_count() or 1))


def ordered_map(fn, items, workers: int | None = None):
    """Yield ``fn(item)`` for each item, in order, computed in a pool of ``workers`` threads
    (default :func:`media_workers`) with at most ``workers`` items in flight (memory stays
    bounded). PyAV, x264, numpy and scipy let go of the GIL for the heavy parts. An exception
    of ``fn`` is raised when its item's turn comes; the items not started yet are cancelled."""
    workers = max(1, int(workers or media_workers()))
    if workers == 1:
        for item in items:
            yield fn(item)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="evalkit-media") as pool:
        futs: collections.deque = collections.deque()
        try:
            for item in items:
                futs.append(pool.submit(fn, item))
                if len(futs) >= workers:
                    yield futs.popleft().result()
            while futs:
                yield futs.popleft().result()
        finally:
            for f in futs:
                f.cancel()


def store_browser_copy(frames: np.ndarray, fps, media_dir: Path) -> str:
    """Encode ``frames`` as a browser copy into ``media_dir``; return its sha256 (file name
    ``<sha256>.mp4``). Writing the same frames twice usually gives the same file, not always:
    x264's output depends on its thread count, which :data:`BROWSER_ENCODING` leaves to the
    number of cores, and on AVX-512 CPUs its MB-tree code makes some frame widths encode
    differently now and then (see :data:`MATCHED_X264`; matched sets avoid both)."""
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(media_dir)        # what a killed create left
    fd, tmp = mkstemp(prefix=".tmp-", suffix=".mp4", dir=media_dir)
    hold(fd)
    tmp = Path(tmp)
    try:
        write_browser(tmp, frames, fps, BROWSER_ENCODING)
        digest = sha256_file(tmp)
        os.replace(tmp, media_dir / f"{digest}.mp4")
    finally:
        tmp.unlink(missing_ok=True)
        os.close(fd)
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
        out = np.empty_like(frames)
        for i in range(0, len(frames), 8):      # a few frames at a time: float32 memory bounded
            part = frames[i:i + 8]
            out[i:i + 8] = np.clip(gaussian_filter(part.astype(np.float32), sigma=(0, s, s, 0))
                                   + 0.5, 0, 255).astype(np.uint8)
        return out
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
                or int(variant) not in VARIANT_X264:
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


def _pad_target(sizes: list[int], salt: bytes = b"") -> int:
    """The frame size every item of a set is padded to: room for the smallest filler unit on
    top of the largest (every sample gets one, see :func:`_pad_sample`), plus 0, 1 or 2 bytes
    drawn from ``salt`` (a hash of the frame's coded samples). Without the draw the largest
    frame would always get the 6-byte filler unit and so the longest slice: the draw makes the
    filler sizes, and so which file has the longest slice, unrelated to which frame is largest."""
    import hashlib

    return max(sizes) + _FILLER_MIN + hashlib.sha256(salt).digest()[0] % 3


_VCL = (1, 5)                 # coded slice NAL unit types (non-IDR, IDR)
_CABAC_ZERO_WORD = b"\x00\x00\x03"   # cabac_zero_word 0x0000 with its emulation prevention byte


def _pad_sample(sample: bytes, target: int) -> bytes:
    """``sample`` padded to exactly ``target`` bytes (``target - len(sample) >= 6``) so that its
    NAL lengths say nothing about the coded size: the last slice NAL unit grows by
    ``cabac_zero_word`` units (H.264 7.3.2.10, ``rbsp_slice_trailing_bits``: CABAC slices may end
    with any number of them; decoders stop at ``end_of_slice_flag``), and a filler-data NAL unit
    of 6, 7 or 8 bytes takes the remainder. A frame's slice length is then ``target`` less 10,
    11 or 12 bytes: it tells only the coded size modulo 3, not the size."""
    gap = target - len(sample)
    if gap < _FILLER_MIN:
        raise ValueError(f"padding: gap of {gap} bytes is below {_FILLER_MIN}")
    f = _FILLER_MIN + gap % 3
    words = (gap - f) // 3
    nals = avcc_nal_units(sample)
    last = max((i for i, n in enumerate(nals) if n[0] & 0x1F in _VCL), default=None)
    if last is None:
        raise ValueError("padding: sample has no coded slice")
    nals[last] = nals[last] + _CABAC_ZERO_WORD * words
    out = b"".join(len(n).to_bytes(4, "big") + n for n in nals) + _filler(f)
    assert len(out) == target
    return out


def _uses_cabac(extradata: bytes) -> bool:
    """Whether the PPS in an ``avcC`` selects CABAC (``entropy_coding_mode_flag``)."""
    n_sps = extradata[5] & 0x1F
    i = 6
    for _ in range(n_sps):
        i += 2 + int.from_bytes(extradata[i:i + 2], "big")
    i += 1                                   # numOfPictureParameterSets
    length = int.from_bytes(extradata[i:i + 2], "big")
    pps = extradata[i + 3:i + 2 + length]    # after the NAL header byte
    bits = "".join(f"{b:08b}" for b in pps[:8])
    pos = 0
    for _ in range(2):                       # pic_parameter_set_id, seq_parameter_set_id: ue(v)
        zeros = 0
        while bits[pos] == "0":
            zeros += 1
            pos += 1
        pos += zeros + 1
    return bits[pos] == "1"


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
    # x264 says in its options string which settings it applied: it ignores the deadzones with
    # trellis quantisation (``medium`` and slower presets), and without them or MB-tree off a set
    # would share bytes or not be reproducible. Check, rather than trust the preset.
    said = set((options or "").split())
    want = {"mbtree=0", "scenecut=0", "threads=1", "rc=cqp", "weightp=0"}
    x = VARIANT_X264[variant]
    if x:
        want |= {"trellis=0", f"deadzone={x['deadzone-inter']},{x['deadzone-intra']}",
                 f"ip_ratio={float(x['ipratio']):.2f}"}
    if want - said:
        raise RuntimeError(f"variant {variant}: x264 did not apply {sorted(want - said)} "
                           f"(its options: {options!r})")
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
    bytes are unrelated to variant 0's (:func:`matched_encoding`). Variant 0 is
    :data:`BROWSER_ENCODING` (``veryfast``, GOP 12, no B-frames, High profile) with these
    changes, made for every item of every set (:data:`MATCHED_X264`): constant QP 12 instead of
    CRF 12 and no weighted prediction (no slice header field chosen from the content), no
    scene-cut key frames (key frames are frames 0, 12, 24, ... in every clip), MB-tree off and
    one x264 thread (for reproducible bytes). So variant 0 is *not* the same file as
    :func:`store_browser_copy` of the same frames, and is somewhat larger.

    Each item is encoded once, unpadded; x264's SEI is dropped; then frame ``i`` of every item
    is padded to the largest frame ``i`` of the set plus 6 bytes (:func:`_pad_sample`:
    ``cabac_zero_word`` units in the slice, then a filler NAL unit), and the samples are muxed with
    the same time stamps, key-frame flags and ``avcC``. Decoding gives exactly the frames of the
    unpadded encode. The same set (same items, same order, same fps) gives the same files. The
    padding depends on the whole set: an item stored in two different sets gives two files.
    Every file is written to a temporary name in ``media_dir``, then renamed.

    Raises ``RuntimeError`` if x264 did not apply the settings (e.g. a slower preset in
    BROWSER_ENCODING, whose trellis quantisation ignores the deadzones), if the encodes of the
    set do not share SPS/PPS, time stamps or key frames, or if the files would still differ in
    length or layout (never expected)."""
    import av

    items = _check_items(items)
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(media_dir)        # what a killed create left
    with tempfile.TemporaryDirectory(prefix="evalkit-matched-") as d:
        def encode(k: int) -> dict:
            frames, variant = items[k]
            path = Path(d) / f"{k}.mp4"
            write_browser(path, frames, fps, matched_encoding(variant))
            return _demux(path, variant)

        # one x264 thread per encode (reproducible bytes), the items side by side (PyAV lets go
        # of the GIL while encoding)
        workers = max(1, min(len(items), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            encodes = list(pool.map(encode, range(len(items))))
        first = encodes[0]
        for k, e in enumerate(encodes[1:], 1):
            if e["extradata"] != first["extradata"]:
                raise RuntimeError(f"items[{k}]: SPS/PPS (avcC) differ from items[0]'s; the "
                                   "files could not share one layout")
            if e["timing"] != first["timing"]:
                raise RuntimeError(f"items[{k}]: time stamps or key frames differ from "
                                   "items[0]'s")
        if not _uses_cabac(first["extradata"]):
            raise RuntimeError("matched sets need CABAC (High profile): the padding of slices "
                               "with cabac_zero_words is CABAC syntax")
        n = len(first["samples"])
        padded = [[] for _ in encodes]
        for i in range(n):
            sizes = [len(e["samples"][i]) for e in encodes]
            target = _pad_target(sizes, b"".join(e["samples"][i] for e in encodes))
            for k, e in enumerate(encodes):
                padded[k].append(_pad_sample(e["samples"][i], target))

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
            fd, tmp = mkstemp(prefix=".tmp-", suffix=".mp4", dir=media_dir)
            hold(fd)
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
                os.close(fd)
            digests.append(digest)
    return digests
