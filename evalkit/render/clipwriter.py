"""A job's lossless clip encoded in parts at once: the same bytes as one encoder's, sooner.

Every lossless format of run clips (:data:`evalkit.lossless.LOSSLESS_FORMATS`) codes each frame
on its own (FFV1 with a key frame every frame, UT Video always): an encoder's packet for a frame
depends on that frame only. So contiguous parts of a clip can be encoded by separate encoders on
separate cores and their packets muxed in order into one file, which is byte for byte the file
:func:`evalkit.video.write_lossless` writes (same container and codec options, ``bitexact``
flags, time base; ``tests/test_render.py`` checks the bytes for every format, odd sizes and
NTSC rates included). FFV1 level 3 encodes its 4 slices on at most 4 threads: on a machine with
16 cores, 4 parts make a clip about 4x sooner, which matters most for the last job of a render
(nothing left to overlap its writing with).
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np

from evalkit.fsutil import atomic_path


def clip_parts() -> int:
    """Parts a local render or import encodes each lossless clip in at once: one per 4 usable
    cores (FFV1 level 3 has 4 slices, each on its own thread), at most :data:`MAX_CLIP_PARTS`;
    1 (one encoder, :func:`evalkit.video.write_lossless`) below 8 cores."""
    from evalkit.video import usable_cores

    return max(1, min(MAX_CLIP_PARTS, usable_cores() // 4))


#: the most parts a lossless clip is encoded in at once (:func:`clip_parts`)
MAX_CLIP_PARTS = 4

#: frames per part at least (below that, one encoder: starting one costs more than it saves)
MIN_PART_FRAMES = 4


def split_points(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` frame ranges of ``n`` frames, fewer when a part
    would have under :data:`MIN_PART_FRAMES` frames (at least one range)."""
    parts = max(1, min(int(parts), n // MIN_PART_FRAMES))
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _part_packets(fmt, frames: np.ndarray, fps: Fraction, start: int, threads: int) -> list:
    """Encode ``frames`` (the clip's from frame ``start``) with an encoder of its own."""
    import av

    ctx = av.CodecContext.create(fmt.codec, "w")
    ctx.width, ctx.height = frames.shape[2], frames.shape[1]
    ctx.pix_fmt = fmt.pix_fmt
    ctx.time_base = 1 / fps
    ctx.framerate = fps
    ctx.thread_count = threads
    ctx.options = {"flags": "+bitexact", **fmt.options}
    packets = []
    for i, f in enumerate(frames):
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
        vf.pts = start + i
        vf.time_base = 1 / fps
        packets.extend(ctx.encode(vf))
    packets.extend(ctx.encode(None))
    return packets


def write_lossless_parts(
    path, frames: np.ndarray, fps, *, codec: str, pool: Executor, parts: int, threads: int = 0
) -> int:
    """Write ``frames`` ((N, H, W, 3) uint8) as :func:`evalkit.video.write_lossless` does,
    atomically, the parts (:func:`split_points`) encoded on ``pool`` at once (``threads``: each
    encoder's own threads, 0: FFmpeg's choice). One part, or no frames: that function itself.
    Returns the number of frames."""
    import av

    from evalkit.video import lossless_target, write_lossless, writer_fps

    ranges = split_points(len(frames), parts) if len(frames) else []
    if len(ranges) <= 1 or frames.ndim != 4 or frames.dtype != np.uint8 or frames.shape[3] != 3:
        return write_lossless(path, frames, fps, codec=codec)
    fmt, path = lossless_target(path, codec)
    fps = writer_fps(fps)
    futures = [pool.submit(_part_packets, fmt, frames[a:b], fps, a, threads) for a, b in ranges]
    try:
        with atomic_path(path) as tmp:
            with av.open(str(tmp), "w", format=fmt.container, options={"fflags": "+bitexact"}) as c:
                stream = c.add_stream(fmt.codec, rate=fps, options={"flags": "+bitexact", **fmt.options})
                stream.width, stream.height = frames.shape[2], frames.shape[1]
                stream.pix_fmt = fmt.pix_fmt
                for f in futures:  # in order: part 0 is muxed while the
                    for packet in f.result():  # others are still encoding
                        packet.stream = stream
                        c.mux(packet)
    finally:
        for f in futures:
            f.cancel()
    return len(frames)


def write_lossless_streamed(path, chunks, fps, *, codec: str, pool: Executor, ahead: int) -> int:
    """Write the frames of ``chunks`` (an iterator of ``(n, H, W, 3)`` uint8 arrays) as
    :func:`evalkit.video.write_lossless` does, atomically, each chunk encoded by an encoder of
    its own on ``pool`` as it arrives (at most ``ahead`` chunks encoding at once: memory stays
    a window of chunks) and the packets muxed in order: the same bytes as one encoder, since
    every frame of a lossless clip is coded on its own (:func:`write_lossless_parts`' rule).
    Returns the number of frames."""
    import collections

    import av

    from evalkit.video import lossless_target, writer_fps

    fmt, path = lossless_target(path, codec)
    fps = writer_fps(fps)
    futures: collections.deque = collections.deque()
    n, size = 0, None
    try:
        with atomic_path(path) as tmp:
            with av.open(str(tmp), "w", format=fmt.container, options={"fflags": "+bitexact"}) as c:
                stream = None

                def mux(future) -> None:
                    for packet in future.result():
                        packet.stream = stream
                        c.mux(packet)

                for chunk in chunks:
                    if not len(chunk):
                        continue
                    if stream is None:
                        size = chunk.shape[1:]
                        stream = c.add_stream(
                            fmt.codec, rate=fps, options={"flags": "+bitexact", **fmt.options}
                        )
                        stream.width, stream.height = chunk.shape[2], chunk.shape[1]
                        stream.pix_fmt = fmt.pix_fmt
                    elif chunk.shape[1:] != size:
                        raise ValueError(
                            f"frames[{n}]: size {chunk.shape[2]}x{chunk.shape[1]} differs from "
                            f"frame 0 ({size[1]}x{size[0]})"
                        )
                    futures.append(pool.submit(_part_packets, fmt, chunk, fps, n, 1))
                    n += len(chunk)
                    while len(futures) > max(0, int(ahead) - 1):
                        mux(futures.popleft())
                if stream is None:
                    raise ValueError("frames: expected at least one frame, found none")
                while futures:
                    mux(futures.popleft())
    finally:
        for f in futures:
            f.cancel()
    return n


class ClipWriter:
    """Writes a render's lossless clips (:meth:`write`), each in ``parts`` at once on a pool of
    its own when ``parts`` > 1 (``jobs``: clips written at once, which sizes the pool). The
    render's encoder threads use one (:mod:`evalkit.render.driver`)."""

    def __init__(self, parts: int, jobs: int = 1):
        self.parts = max(1, int(parts))
        self.pool = None
        if self.parts > 1:
            self.pool = ThreadPoolExecutor(
                max_workers=self.parts * max(1, int(jobs)), thread_name_prefix="evalkit-encode-part"
            )

    def write(self, path: Path, frames: np.ndarray, fps, codec: str) -> str:
        """Write a job's lossless clip (atomically); return its sha256 (hashed here, beside
        the browser copy's encoding, not after it on the recorder)."""
        from evalkit.fsutil import sha256_file
        from evalkit.video import usable_cores, write_lossless

        if self.pool is None:
            write_lossless(path, frames, fps, codec=codec)
        else:
            write_lossless_parts(
                path,
                frames,
                fps,
                codec=codec,
                pool=self.pool,
                parts=self.parts,
                threads=max(1, usable_cores() // self.parts),
            )
        return sha256_file(path)

    @staticmethod
    def write_browser(path: Path, frames: np.ndarray, fps) -> int:
        """Write a job's browser copy (:func:`evalkit.video.write_browser`)."""
        from evalkit.video import write_browser

        return write_browser(path, frames, fps)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


#: chunks a streamed write (:func:`write_streamed`) holds between its reader and each encoder
STREAM_DEPTH = 2


def write_streamed(
    chunks,
    clip_path: Path,
    preview_path: Path | None,
    fps,
    *,
    codec: str,
    depth: int = STREAM_DEPTH,
    parts: int | None = None,
) -> tuple[int, int, int, str]:
    """A lossless clip (:func:`evalkit.video.write_lossless`) and its browser copy
    (:func:`evalkit.video.write_browser`; ``preview_path`` None: none) written from ``chunks``
    (an iterator of ``(n, H, W, 3)`` uint8 arrays, e.g. a clip being decoded), each chunk read
    once and handed to both encoders (each on a thread of its own), so memory holds at most
    ``depth`` chunks per encoder, whatever the clip's length. The files are byte for byte those
    of the two writers given the whole clip, each atomic: an error of the reader (raised here)
    or of an encoder leaves neither file. ``parts``: chunks of the lossless clip encoded at once
    (:func:`write_lossless_streamed`, the same bytes; default
    :func:`clip_parts`: one per 4 cores, at most 4; 1: one encoder, as
    :func:`evalkit.video.write_lossless`), since one UT Video encoder (71 frames/s at 720p on
    the H100 machine) is an import's longest chain. Returns ``(frames, height, width, sha256
    of the clip file)``."""
    from evalkit.concurrency import fan_out
    from evalkit.fsutil import sha256_file
    from evalkit.video import INDEPENDENT_FRAMES, write_browser, write_lossless

    if parts is None:
        parts = clip_parts()

    def frames_to(write):  # a consumer: chunks in, the writer fed frames
        return lambda chunks_in: write(f for c in chunks_in for f in c)

    pool = None
    if parts > 1 and codec in INDEPENDENT_FRAMES:
        pool = ThreadPoolExecutor(max_workers=parts, thread_name_prefix="evalkit-encode-part")
        targets = [
            lambda chunks_in: write_lossless_streamed(
                clip_path, chunks_in, fps, codec=codec, pool=pool, ahead=parts
            )
        ]
    else:
        targets = [frames_to(lambda f: write_lossless(clip_path, f, fps, codec=codec))]
    if preview_path is not None:
        targets.append(frames_to(lambda f: write_browser(preview_path, f, fps)))
    seen = {"n": 0, "shape": None}

    def counted():
        for c in chunks:
            if seen["shape"] is None:
                seen["shape"] = c.shape[1:3]
            seen["n"] += len(c)
            yield c

    # each encoder on a thread of its own, at most ``depth`` chunks queued for it; an error of
    # the reader or of an encoder stops the others (their files are not kept) and is raised
    try:
        fan_out(counted(), targets, depth=depth, name="evalkit-encode-stream")
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    n, shape = seen["n"], seen["shape"]
    if shape is None:
        raise ValueError("frames: expected at least one frame, found none")
    return n, int(shape[0]), int(shape[1]), sha256_file(clip_path)
