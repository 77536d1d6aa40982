"""Pairing and measuring for ``evalkit compare`` (the front door is :mod:`evalkit.compare.run`):
two runs' jobs paired by id and checked (:func:`pair_jobs`), each pair measured
(:func:`measure_pair`), the pairs of a run measured in order (:class:`LocalCompareSession`).

Every clip is decoded once and streamed through one :class:`evalkit.metrics.PairEvaluator` (the LPIPS
model is loaded once for the whole comparison); the frames needed for the report's thumbnails
(the worst frame of each job) are kept while streaming, never decoded again. Both clips of a
pair decode in background threads, a bounded number of chunks ahead, and the next job's clips
start decoding while the current job is measured (:class:`PairDecoder`).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evalkit.compare.alignment import Alignment, rate_mismatch, resolve_offset, skip_frames
from evalkit.compare.options import MetricOptions
from evalkit.errors import UserError
from evalkit.formats.run import RunDir, sha256_file
from evalkit.video import ClipReader, usable_cores

#: fields of a job that must agree for two renders to be comparable
_SAME = ("clip", "prompt", "params")


@dataclass
class Pair:
    job_id: str
    rec_a: dict
    rec_b: dict
    path_a: Path
    path_b: Path
    #: temporal offset of B: "auto" (tested: :mod:`evalkit.compare.alignment`) or frames, untested
    offset: str | int = "auto"


@dataclass
class JobMeasure:
    pair: Pair
    records: list[dict]
    summary: dict
    worst_frame: int
    worst_a: np.ndarray | None = None
    worst_b: np.ndarray | None = None
    #: the pair's temporal alignment (:class:`evalkit.compare.alignment.Alignment`)
    alignment: Alignment | None = None
    #: the clip's worst block and its burst (:meth:`evalkit.compare.local.LocalTrack.summary`)
    local: dict | None = None


def pair_jobs(a: RunDir, b: RunDir, *, same_seed: bool) -> tuple[list[Pair], dict[str, str]]:
    """Pairs of done, verified, comparable jobs; and, for every other job, why not. The clips'
    hashes are checked on threads at once (hashlib releases the interpreter lock: 16 pairs of
    720p UT Video clips are 11 GB to hash)."""
    problems: dict[str, str] = {}
    candidates: list[tuple[str, dict, dict]] = []
    by_a = {j["id"]: j for j in a.jobs}
    by_b = {j["id"]: j for j in b.jobs}
    for jid in list(by_a) + [i for i in by_b if i not in by_a]:
        ra, rb = by_a.get(jid), by_b.get(jid)
        if ra is None or rb is None:
            side = "A" if ra is None else "B"
            problems[jid] = f"missing in run {side} ({(a if ra is None else b).path})"
            continue
        bad = [s for s, r, run in (("A", ra, a), ("B", rb, b)) if r["status"] != "done"]
        if bad:
            r = ra if bad[0] == "A" else rb
            problems[jid] = f"not rendered in run {bad[0]} (status {r['status']}" + (
                f": {r['error']})" if r.get("error") else ")"
            )
            continue
        diffs = [f"{k}: A {ra.get(k)!r}, B {rb.get(k)!r}" for k in _SAME if ra.get(k) != rb.get(k)]
        seed_a = ra.get("effective_seed", ra.get("seed"))
        seed_b = rb.get("effective_seed", rb.get("seed"))
        if same_seed and seed_a != seed_b:
            diffs.append(f"seed: A {seed_a}, B {seed_b}")
        if diffs:
            problems[jid] = "not comparable: " + "; ".join(diffs)
            continue
        candidates.append((jid, ra, rb))
    hashes = _hashes(
        [run.path / rec["output"]["path"] for _, ra, rb in candidates for run, rec in ((a, ra), (b, rb))]
    )
    pairs: list[Pair] = []
    for jid, ra, rb in candidates:
        paths = []
        for side, run, rec in (("A", a, ra), ("B", b, rb)):
            p = run.path / rec["output"]["path"]
            found = hashes[p]
            if found is None:
                problems[jid] = f"{p}: clip file missing (run {side})"
                break
            if found != rec["output"]["sha256"]:
                problems[jid] = (
                    f"{p}: clip fails its hash (sha256 {found[:12]}..., manifest says "
                    f"{rec['output']['sha256'][:12]}...); re-render it"
                )
                break
            paths.append(p)
        else:
            shapes = [_shape(rec) for rec in (ra, rb)]
            if None not in shapes and shapes[0] != shapes[1]:
                problems[jid] = (
                    f"not comparable: A {paths[0]} is {_shown(shapes[0])}, B "
                    f"{paths[1]} is {_shown(shapes[1])} (the frames pair one by one; "
                    "`evalkit metrics --align shortest A B` compares the common "
                    "frames of two such clips)"
                )
                continue
            rates = rate_mismatch(*((rec.get("output") or {}).get("fps") for rec in (ra, rb)))
            if rates:
                problems[jid] = f"not comparable: {rates}"
                continue
            pairs.append(Pair(jid, ra, rb, paths[0], paths[1]))
    # problems in the runs' job order, as before
    order = {jid: i for i, jid in enumerate(list(by_a) + [i for i in by_b if i not in by_a])}
    return pairs, dict(sorted(problems.items(), key=lambda kv: order[kv[0]]))


def _hashes(paths: list[Path]) -> dict[Path, str | None]:
    """sha256 of each file (None: not a file), on up to :func:`usable_cores` threads."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p: Path) -> str | None:
        return sha256_file(p) if p.is_file() else None

    if len(paths) < 2:
        return {p: one(p) for p in paths}
    with ThreadPoolExecutor(min(len(paths), usable_cores()), thread_name_prefix="evalkit-hash") as pool:
        return dict(zip(paths, pool.map(one, paths)))


def _chunks_with_memory(chunks, keep: collections.deque):
    """Pass chunks on, keeping the last few as ``(first frame index, chunk)``."""
    i = 0
    for c in chunks:
        keep.append((i, c))
        i += len(c)
        yield c


def _recall(mem: collections.deque, frame: int):
    for start, c in mem:
        if start <= frame < start + len(c):
            return c[frame - start]
    return None


def _copy(frame):
    return None if frame is None else np.array(frame)


def _shape(rec: dict) -> tuple[int, int, int] | None:
    """A done job's (frames, width, height) as its manifest records them (None: not all)."""
    out = rec.get("output") or {}
    shape = (out.get("frames"), out.get("width"), out.get("height"))
    return shape if all(isinstance(v, int) for v in shape) else None


def _shown(shape: tuple[int, int, int]) -> str:
    return f"{shape[0]} frames of {shape[1]}x{shape[2]}"


class PairMismatch(UserError):
    """A pair's clips turned out not to pair frame by frame (their manifests said they would)."""


def _pair_chunk(evaluator, pair: Pair, chunk: int | None) -> int:
    """Frames per batch for ``pair``: ``chunk``, else what :func:`evalkit.metrics.stream.stream_pair`
    would pick from its first frame (:func:`evalkit.metrics.stream.evaluator_chunk`)."""
    if chunk:
        return int(chunk)
    from evalkit.metrics.stream import evaluator_chunk

    h, w = _pair_size(pair)
    return evaluator_chunk(h, w, evaluator)


def _pair_size(pair: Pair) -> tuple[int, int]:
    """(height, width) of the pair's frames: the manifest's, else the clip's own."""
    out = pair.rec_a.get("output") or {}
    h, w = out.get("height"), out.get("width")
    if not (h and w):
        info = ClipReader(pair.path_a).info
        h, w = info.height, info.width
    return int(h), int(w)


def decode_threads(processes: bool = False) -> int:
    """Decoding threads of each clip reader of a compare: a quarter of the cores (at least 2),
    since four readers run at once (both clips of a pair, the next pair ahead); half of them for
    readers in worker processes (``processes``), since those of the next pair soon wait for
    room in their rings (figures: benchmarks/README.md, "Real scale")."""
    return max(2, usable_cores() // (2 if processes else 4))


class PairDecoder:
    """Both clips of a pair decoding in the background, each at most
    :func:`evalkit.compare.clips.prefetch_depth` chunks ahead: in worker processes of ``pool``
    (:class:`evalkit.procdecode.DecoderPool`), else in threads (:class:`evalkit.video.Prefetch`).
    Made ahead of time, it decodes the next job while the current one is measured, and finds
    the pair's temporal offset meanwhile (:meth:`alignment`: the clips' first frames probed on
    a thread of its own, :func:`evalkit.compare.alignment.resolve_offset`)."""

    def __init__(self, pair: Pair, chunk: int, pool=None):
        from concurrent.futures import Future

        from evalkit.compare.clips import prefetch_depth
        from evalkit.procdecode import prefetch_chunks

        self.pair, self.chunk = pair, chunk
        self._alignment: Future = Future()
        threading.Thread(
            target=self._probe, name="evalkit-offset", daemon=True
        ).start()  # small: the first frames of each clip, read by a reader of its own
        h, w = _pair_size(pair)
        depth = prefetch_depth(chunk, frame_bytes=h * w * 3)
        threads = decode_threads()
        self.a = prefetch_chunks(
            pair.path_a, chunk, depth, threads=threads, pool=pool, name="evalkit-decode-a"
        )
        try:
            self.b = prefetch_chunks(
                pair.path_b, chunk, depth, threads=threads, pool=pool, name="evalkit-decode-b"
            )
        except BaseException:
            self.a.close()
            raise

    def _probe(self) -> None:
        try:
            self._alignment.set_result(resolve_offset(self.pair.path_a, self.pair.path_b, self.pair.offset))
        except BaseException as e:  # raised where the alignment is asked for
            self._alignment.set_exception(e)

    def alignment(self) -> Alignment:
        """The pair's :class:`evalkit.compare.alignment.Alignment` (waits for the probe; its
        error, if any, is raised here)."""
        return self._alignment.result()

    def close(self) -> None:
        self.a.close()
        self.b.close()


def measure_pair(
    evaluator,
    pair: Pair,
    *,
    chunk: int | None = None,
    keep_worst: bool = True,
    decoder: PairDecoder | None = None,
    on_frame=None,
) -> JobMeasure:
    """Stream one pair of clips through the evaluator; keep the worst frame (by LPIPS); measure
    each frame's worst block (``block_psnr``, :mod:`evalkit.compare.local`) from the same frames.

    ``decoder``: the pair already decoding (:class:`PairDecoder`, made with the same chunk);
    else one is made here. ``on_frame``: called with 1 after each frame's record."""
    from evalkit.metrics import MetricInputError
    from evalkit.metrics.stream import stream_pair

    evaluator.reset()
    chunk = _pair_chunk(evaluator, pair, chunk)
    if decoder is None:
        decoder = PairDecoder(pair, chunk)
    try:  # the clips' first frames, small: their offset; and their frame rates (probed
        al = decoder.alignment()  # while the job before was measured)
        if al.finding == "rate":
            raise PairMismatch(
                f"job {pair.job_id}: A {pair.path_a} and B {pair.path_b}: "
                f"{al.reason} (not what their manifests say)"
            )
    except BaseException:
        decoder.close()
        raise
    # stream_pair reads at most one chunk ahead of the records it yields; a chunk decoded in a
    # worker process is valid until two more are read (evalkit.procdecode): keep copies
    mem_a, mem_b = collections.deque(maxlen=2), collections.deque(maxlen=2)
    from evalkit.compare.local import LocalTrack

    records = []
    track = LocalTrack.empty()
    worst, worst_val, worst_a, worst_b = 0, -1.0, None, None
    try:
        gen = stream_pair(
            _chunks_with_memory(skip_frames(decoder.a, al.skip_a), mem_a),
            _chunks_with_memory(skip_frames(decoder.b, al.skip_b), mem_b),
            evaluator=evaluator,
            chunk=chunk,
            align="shortest" if al.offset else "error",
        )
        try:
            for rec in gen:
                fa, fb = _recall(mem_a, rec["frame"]), _recall(mem_b, rec["frame"])
                if fa is not None and fb is not None:
                    rec["block_psnr"] = track.add(rec["frame"] + al.skip_a, fa, fb)
                if rec["lpips"] > worst_val:
                    worst, worst_val = rec["frame"] + al.skip_a, rec["lpips"]
                    if keep_worst:
                        worst_a, worst_b = _copy(fa), _copy(fb)
                rec["frame"] += al.skip_a  # A's frame number
                records.append(rec)
                if on_frame is not None:
                    on_frame(1)
        except MetricInputError as e:  # the clips' frames differ in count or size
            what = f"{e.field}: {e.detail}" if e.field else str(e)  # without its hint
            raise PairMismatch(
                f"job {pair.job_id}: A {pair.path_a} and B {pair.path_b} do not pair frame by "
                f"frame ({what}; not what their manifests say): render or import it again "
                "(`evalkit metrics --align shortest A B`: their common frames)"
            ) from None
    finally:
        mem_a.clear()  # no chunk outlives the clip: the decoders' rings are reused
        mem_b.clear()
        decoder.close()
    h, w = _pair_size(pair)
    return JobMeasure(pair, records, evaluator.compute(), worst, worst_a, worst_b, al, track.summary(w, h))


class LocalCompareSession:
    """Measures pairs in this process with one evaluator (the LPIPS model loaded once).

    An executor's ``compare_session(device=, metrics=)`` returns an object with the same
    ``measure``, ``conventions``, ``device``, ``progress_unit`` and ``close``; the Ray
    executor's spreads the pairs over workers (:mod:`evalkit.executor.ray`).
    """

    def __init__(self, *, device=None, metrics: MetricOptions | None = None):
        from evalkit.metrics.stream import PairEvaluator
        from evalkit.procdecode import DecoderPool, use_processes

        #: worker processes decoding the clips (:mod:`evalkit.procdecode`), or None: threads
        self.pool = DecoderPool(decode_threads(processes=True)) if use_processes() else None
        self._warm: set = set()  # (height, width, chunk) the evaluator has seen
        if self.pool is not None:  # they boot while the metric models load
            self.pool.start(2 * (self.jobs_ahead + 1))
        try:
            self.evaluator = PairEvaluator(device=device, **(metrics or MetricOptions()).evaluator_kwargs())
        except BaseException:
            if self.pool is not None:
                self.pool.close()
            raise

    @property
    def conventions(self) -> dict:
        return self.evaluator.conventions

    @property
    def device(self) -> str:
        return str(self.evaluator.device)

    #: progress counts frames (the Ray session's counts jobs)
    progress_unit = "frame"
    #: jobs decoding ahead of the one being measured (both clips each, in threads)
    jobs_ahead = 1

    def measure(
        self,
        pairs: list[Pair],
        *,
        chunk=None,
        keep_worst: bool = True,
        progress=None,
        on_measured=None,
    ) -> list[JobMeasure]:
        """Measure ``pairs`` in order; the next :attr:`jobs_ahead` jobs decode meanwhile.
        ``progress``: a bar updated per frame; ``on_measured``: called with each job's
        :class:`JobMeasure` once it is complete (the report's parts start while the next jobs
        are measured). On a GPU the evaluator is warmed up first
        (:meth:`evalkit.metrics.stream.PairEvaluator.warm_up`, once per frame size) while the first
        clips decode."""
        out = []
        ahead: collections.deque = collections.deque()
        nxt = 0
        try:
            for p in pairs:
                while nxt < len(pairs) and len(ahead) <= self.jobs_ahead:
                    q = pairs[nxt]
                    ahead.append(PairDecoder(q, _pair_chunk(self.evaluator, q, chunk), self.pool))
                    nxt += 1
                dec = ahead.popleft()
                self._warm_up(p, dec.chunk)
                out.append(
                    measure_pair(
                        self.evaluator,
                        p,
                        chunk=dec.chunk,
                        keep_worst=keep_worst,
                        decoder=dec,
                        on_frame=progress.update if progress else None,
                    )
                )
                if on_measured is not None:
                    on_measured(out[-1])
        finally:
            for dec in ahead:
                dec.close()
        return out

    def _warm_up(self, pair: Pair, chunk: int) -> None:
        if self.evaluator.device.type != "cuda":
            return
        size = (*_pair_size(pair), chunk)
        if size not in self._warm:
            self._warm.add(size)
            self.evaluator.warm_up(*size)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        self.evaluator.close()
