"""``evalkit compare``: pair two runs by job id, measure them, set them against noise floors,
gate, and write the report (frames.csv, clips.csv, summary.json, index.html).

Every clip is decoded once and streamed through one :class:`evalkit.metrics.PairEvaluator` (the LPIPS
model is loaded once for the whole comparison); the frames needed for the report's thumbnails
(the worst frame of each job) are kept while streaming, never decoded again. Both clips of a
pair decode in background threads, a bounded number of chunks ahead, and the next job's clips
start decoding while the current job is measured (:class:`PairDecoder`).
"""
from __future__ import annotations

import collections
import contextlib
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalkit import __version__
from evalkit.errors import InputFileError, UserError
from evalkit.compare.aggregate import (aggregate, clip_finding, floor_ratio, headline, with_gate, with_locals,
                                       with_offsets)
from evalkit.compare.alignment import Alignment, rate_mismatch, resolve_offset, skip_frames
from evalkit.compare.floors import floor_kind, floor_refusal, identical_floor
from evalkit.compare.gating import check_conventions, open_gate
from evalkit.compare.local import BLOCK_CONVENTION
from evalkit.formats.run import RunDir, sha256_file
from evalkit.compare.report import (SUMMARY_SCHEMA_VERSION, check_report_folder, floor_notice, plot_axes, run_entry,
                                    same_run_warnings, write_report)
from evalkit.formats.run import run_name
from evalkit.fsutil import cleanup_dir_leftovers
from evalkit.video import ClipReader, usable_cores
from evalkit.metrics.catalogue import KEYS, units

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


@dataclass
class CompareResult:
    summary: dict
    out: Path
    exit_code: int
    measures: list[JobMeasure] = field(default_factory=list)


def _open_run(path, role: str) -> RunDir:
    path = Path(path)
    if not path.exists():
        raise InputFileError(path, f"run folder not found ({role})")
    if not path.is_dir():
        raise InputFileError(path, f"not a folder ({role}: expected a run folder with manifest.json)")
    run = RunDir.open(path)
    run.path = run.path.resolve()   # absolute: the report records it, read from anywhere later
    return run


def _seed_offset(run: RunDir) -> int:
    return int((run.manifest.get("notes") or {}).get("seed_offset", 0))


def check_same_suite(a: RunDir, b: RunDir) -> None:
    sa, sb = a.manifest["suite"], b.manifest["suite"]
    if sa.get("name") != sb.get("name") or sa.get("sha256") != sb.get("sha256"):
        raise UserError(
            f"{b.path}: not comparable with {a.path}: runs of different suites "
            f"({sa.get('name')!r} sha256 {str(sa.get('sha256'))[:12]} vs "
            f"{sb.get('name')!r} sha256 {str(sb.get('sha256'))[:12]})")


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
            problems[jid] = f"not rendered in run {bad[0]} (status {r['status']}" + \
                (f": {r['error']})" if r.get("error") else ")")
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
    hashes = _hashes([run.path / rec["output"]["path"] for _, ra, rb in candidates
                      for run, rec in ((a, ra), (b, rb))])
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
                problems[jid] = (f"{p}: clip fails its hash (sha256 {found[:12]}..., manifest says "
                                 f"{rec['output']['sha256'][:12]}...); re-render it")
                break
            paths.append(p)
        else:
            shapes = [_shape(rec) for rec in (ra, rb)]
            if None not in shapes and shapes[0] != shapes[1]:
                problems[jid] = (f"not comparable: A {paths[0]} is {_shown(shapes[0])}, B "
                                 f"{paths[1]} is {_shown(shapes[1])} (the frames pair one by one; "
                                 "`evalkit metrics --align shortest A B` compares the common "
                                 "frames of two such clips)")
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
    with ThreadPoolExecutor(min(len(paths), usable_cores()),
                            thread_name_prefix="evalkit-hash") as pool:
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
    Made ahead of time, it decodes the next job while the current one is measured."""

    def __init__(self, pair: Pair, chunk: int, pool=None):
        from evalkit.compare.clips import prefetch_depth
        from evalkit.procdecode import prefetch_chunks

        self.pair, self.chunk = pair, chunk
        h, w = _pair_size(pair)
        depth = prefetch_depth(chunk, frame_bytes=h * w * 3)
        threads = decode_threads()
        self.a = prefetch_chunks(pair.path_a, chunk, depth, threads=threads, pool=pool,
                                 name="evalkit-decode-a")
        try:
            self.b = prefetch_chunks(pair.path_b, chunk, depth, threads=threads, pool=pool,
                                     name="evalkit-decode-b")
        except BaseException:
            self.a.close()
            raise

    def close(self) -> None:
        self.a.close()
        self.b.close()


def measure_pair(evaluator, pair: Pair, *, chunk: int | None = None,
                 keep_worst: bool = True, decoder: PairDecoder | None = None,
                 on_frame=None) -> JobMeasure:
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
    try:       # the clips' first frames, small: their offset; and their frame rates
        al = resolve_offset(pair.path_a, pair.path_b, pair.offset)
        if al.finding == "rate":
            raise PairMismatch(f"job {pair.job_id}: A {pair.path_a} and B {pair.path_b}: "
                               f"{al.reason} (not what their manifests say)")
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
        gen = stream_pair(_chunks_with_memory(skip_frames(decoder.a, al.skip_a), mem_a),
                          _chunks_with_memory(skip_frames(decoder.b, al.skip_b), mem_b),
                          evaluator=evaluator, chunk=chunk,
                          align="shortest" if al.offset else "error")
        try:
            for rec in gen:
                fa, fb = _recall(mem_a, rec["frame"]), _recall(mem_b, rec["frame"])
                if fa is not None and fb is not None:
                    rec["block_psnr"] = track.add(rec["frame"] + al.skip_a, fa, fb)
                if rec["lpips"] > worst_val:
                    worst, worst_val = rec["frame"] + al.skip_a, rec["lpips"]
                    if keep_worst:
                        worst_a, worst_b = _copy(fa), _copy(fb)
                rec["frame"] += al.skip_a       # A's frame number
                records.append(rec)
                if on_frame is not None:
                    on_frame(1)
        except MetricInputError as e:       # the clips' frames differ in count or size
            what = str(e).split(" (frame counts differ")[0]
            raise PairMismatch(
                f"job {pair.job_id}: A {pair.path_a} and B {pair.path_b} do not pair frame by "
                f"frame ({what}; not what their manifests say): render or import it again "
                "(`evalkit metrics --align shortest A B`: their common frames)"
            ) from None
    finally:
        mem_a.clear()       # no chunk outlives the clip: the decoders' rings are reused
        mem_b.clear()
        decoder.close()
    h, w = _pair_size(pair)
    return JobMeasure(pair, records, evaluator.compute(), worst, worst_a, worst_b, al,
                      track.summary(w, h))


def alignment_of(measures: list[JobMeasure]) -> dict:
    """summary.json's ``alignment``: the rule, the jobs compared at an offset (``shifted``:
    job -> offset) and each job's finding (:meth:`evalkit.compare.alignment.Alignment.as_dict`)."""
    from evalkit.compare.alignment import RULE

    jobs = {m.pair.job_id: m.alignment.as_dict(compared=len(m.records))
            for m in measures if m.alignment is not None}
    return {"rule": RULE, "shifted": {j: a["offset"] for j, a in jobs.items() if a["offset"]},
            "jobs": jobs}


def aggregates_of(measures: list[JobMeasure]) -> dict:
    """Aggregates per metric key (catalogue order) over every frame of every measured job."""
    return {k: aggregate([r.get(k) for m in measures for r in m.records], k) for k in KEYS
            if any(k in r for m in measures for r in m.records)}


def clip_findings(measures: list[JobMeasure], floor_jobs: dict, alignment: dict,
                  floor: str | None = None, gate=None) -> list[dict]:
    """summary.json's ``clip_findings``: each compared job's worst finding against its own
    floor jobs (:func:`evalkit.compare.aggregate.clip_finding`), worst first. ``floor_jobs``:
    floor name -> job id -> the floor job's aggregates; ``gate``: the compare's gate, judged on
    each clip alone too."""
    out = []
    for m in measures:
        jid = m.pair.job_id
        agg = aggregates_of([m])
        ratios = {name: floor_ratio(agg, per[jid]) for name, per in floor_jobs.items() if jid in per}
        f = clip_finding(jid, ratios, floor, alignment["jobs"].get(jid),
                         (agg.get("lpips") or {}).get("mean"), _vmaf_of(agg, floor_jobs, jid, floor),
                         gate.evaluate(agg, ratios, 0, {jid: m.alignment.offset if m.alignment else 0})
                         if gate is not None else None,
                         local=m.local, aggregates=agg,
                         floor_aggregates={name: per[jid] for name, per in floor_jobs.items()
                                           if jid in per})
        out.append(f)
    return sorted(out, key=lambda f: -f["rank"])


def run_headline(measures, ratios: dict, aggregates: dict, floor_info: dict, findings: list,
                 verdict: dict | None, floor: str | None) -> dict | None:
    """summary.json's ``headline``: the clips at an offset first, then the worst family over
    all clips (or that the run is below what the floor resolves, with its dB), every local
    glitch with its frames and place, and the gate's verdict
    (:mod:`evalkit.compare.aggregate`)."""
    from evalkit.compare.local import mse_of

    worst = None        # the clip whose worst block is the run's
    for m in measures:
        if m.local and (worst is None or mse_of(m.local["block_psnr"]) > mse_of(worst.local["block_psnr"])):
            worst = m
    local = dict(worst.local, clip=worst.pair.job_id) if worst is not None else None
    head = headline(ratios, floor, aggregates=aggregates, local=local,
                    floor_aggregates={n: i["aggregates"] for n, i in floor_info.items()})
    return with_gate(with_locals(with_offsets(head, findings), findings), verdict)


def _vmaf_of(agg: dict, floor_jobs: dict, jid: str, floor: str | None):
    """(B's VMAF mean, the chosen floor job's or None) of one job, None without VMAF."""
    if "vmaf" not in agg:
        return None
    name = floor if floor in floor_jobs else ("seed" if "seed" in floor_jobs else next(iter(floor_jobs), None))
    fagg = (floor_jobs.get(name) or {}).get(jid) or {}
    return agg["vmaf"]["mean"], (fagg.get("vmaf") or {}).get("mean")


def _vmaf_pass(measures: list[JobMeasure], desc: str, on: bool, threads, progress) -> str | None:
    """The optional VMAF pass over measured pairs (:mod:`evalkit.compare.vmaf`)."""
    if not on or not measures:
        return None
    from tqdm import tqdm

    from evalkit.compare.vmaf import add_vmaf_to_measures

    with tqdm(total=len(measures), desc=desc, unit="job", disable=not progress) as bar:
        return add_vmaf_to_measures(measures, n_threads=threads, progress=bar)


def _floor_name(a: RunDir, f: RunDir, taken: set) -> str:
    # the same backend: the same run name (label, else spec), and the same spec
    same_backend = (run_name(a.manifest) == run_name(f.manifest)
                    and a.manifest["backend"].get("spec") == f.manifest["backend"].get("spec"))
    if floor_kind(f.manifest):
        name = floor_kind(f.manifest)
    elif same_backend and _seed_offset(a) != _seed_offset(f):
        name = "seed"
    elif same_backend:
        name = "rerender"
    else:
        name = "backend-" + run_name(f.manifest)
    base, i = name, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


def _fingerprint_diff(a: dict, b: dict) -> dict:
    skip = {"host"}
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
            if k not in skip and a.get(k) != b.get(k)}


def _session_and_pairs(pairing, start_session):
    """``(start_session(), pairing())``, the two at once: the clips' hash checks (files read and
    hashed on threads, which hold the interpreter lock only between blocks) run while the
    session starts (``import torch``, the device, the LPIPS weights: seconds). An error of
    either is raised once both have ended; a session already started is then closed."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="evalkit-pairing") as pool:
        paired = pool.submit(pairing)
        try:
            session = start_session()
        except BaseException:
            paired.cancel()
            with contextlib.suppress(BaseException):
                paired.result()
            raise
        try:
            pairs = paired.result()
        except BaseException:
            session.close()
            raise
    return session, pairs


class LocalCompareSession:
    """Measures pairs in this process with one evaluator (the LPIPS model loaded once).

    An executor's ``compare_session(device=, metric_options=)`` returns an object with the same
    ``measure``, ``conventions``, ``device`` and ``close``; the Ray executor's spreads the pairs
    over workers (:mod:`evalkit.executor.ray`).
    """

    def __init__(self, *, device=None, metric_options: dict | None = None):
        from evalkit.procdecode import DecoderPool, use_processes
        from evalkit.metrics.stream import PairEvaluator

        #: worker processes decoding the clips (:mod:`evalkit.procdecode`), or None: threads
        self.pool = DecoderPool(decode_threads(processes=True)) if use_processes() else None
        self._warm: set = set()         # (height, width, chunk) the evaluator has seen
        if self.pool is not None:       # they boot while the metric models load
            self.pool.start(2 * (self.jobs_ahead + 1))
        try:
            self.evaluator = PairEvaluator(device=device, **(metric_options or {}))
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

    def measure(self, pairs: list[Pair], *, chunk=None, keep_worst: bool = True,
                progress=None) -> list[JobMeasure]:
        """Measure ``pairs`` in order; the next :attr:`jobs_ahead` jobs decode meanwhile.
        ``progress``: a bar updated per frame. On a GPU the evaluator is warmed up first
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
                out.append(measure_pair(self.evaluator, p, chunk=dec.chunk, keep_worst=keep_worst,
                                        decoder=dec, on_frame=progress.update if progress else None))
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


def compare_runs(run_a, run_b, out, *, gate=None, floors=(), device=None, chunk=None,
                 metric_options: dict | None = None, progress: bool = True,
                 executor=None, vmaf: bool = False, vmaf_threads: int | None = None,
                 ignore_conventions: bool = False, offset="auto",
                 floor_cache: bool = True) -> CompareResult:
    """``offset``: ``"auto"`` tests every pair for a temporal offset and compares at one found
    (:mod:`evalkit.compare.alignment`; summary.json's ``alignment``), ``0`` pairs frames one by
    one untested. ``vmaf``: also score VMAF (a separate pass after the stream metrics, on the
    cross-backend pairs and the floors: :mod:`evalkit.compare.vmaf`); ``vmaf_threads``:
    libvmaf's threads (default every usable core); ``ignore_conventions``: judge with a gate
    that records other conventions than this compare's (:mod:`evalkit.compare.gating`).
    ``floor_cache``: reuse the floor runs' measurements kept by an earlier compare, and keep
    this one's (:mod:`evalkit.compare.floorcache`); False measures every floor job again."""
    from tqdm import tqdm

    from evalkit.compare.floorcache import FloorCache

    a, b = _open_run(run_a, "RUN_A"), _open_run(run_b, "RUN_B")
    check_same_suite(a, b)
    floor_runs = [_open_run(f, "--floor") for f in floors]
    for f in floor_runs:
        for run, role in ((a, "RUN_A"), (b, "RUN_B")):
            if f.path == run.path:
                raise UserError(f"--floor {f.path}: is {role} itself (a floor is another render "
                                "of A's jobs: a re-render, or other seeds with --seed-offset)")
        check_same_suite(a, f)
    floor_names: list[str] = []
    for f in floor_runs:
        floor_names.append(_floor_name(a, f, set(floor_names)))
    gate_obj = open_gate(gate) if gate else None
    if gate_obj and gate_obj.ratios and not floor_runs:
        raise UserError(f"{gate_obj.path}: the gate sets floor_ratio thresholds but no --floor run "
                        "was given")
    if gate_obj and gate_obj.ratios and gate_obj.floor and gate_obj.floor not in floor_names:
        raise UserError(f"{gate_obj.path}: field 'floor': no floor {gate_obj.floor!r} in this "
                        f"compare (its --floor runs are: {', '.join(floor_names)})")
    for f in floor_runs:
        why = floor_refusal(a, b, f)
        if why:
            raise UserError(why)
    optional = [k for k in gate_obj.absolute if k == "vmaf"] if gate_obj else []
    if optional and not vmaf:
        raise UserError(f"{gate_obj.path}: field '{optional[0]}': the gate checks a metric that "
                        f"compare computes only on request; add --{optional[0]}")
    if vmaf:
        from evalkit.metrics.vmaf import check_available

        check_available()       # before any work: no ffmpeg with libvmaf is one line, now
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder (--out)")
    cleanup_dir_leftovers(out)  # what a killed compare left next to the report (or the old one)
    check_report_folder(out)

    session, (pairs, problems) = _session_and_pairs(
        lambda: pair_jobs(a, b, same_seed=True),
        lambda: (LocalCompareSession(device=device, metric_options=metric_options)
                 if executor is None else
                 executor.compare_session(device=device, metric_options=metric_options)))
    try:
        if gate_obj is not None and not ignore_conventions:   # before any work
            check_conventions(gate_obj, {**session.conventions, "block": BLOCK_CONVENTION})
        unit = getattr(session, "progress_unit", "job")

        def bar_of(pairs_, desc):
            total = (sum(int((p.rec_a.get("output") or {}).get("frames") or 0) for p in pairs_)
                     if unit == "frame" else len(pairs_))
            return tqdm(total=total, desc=desc, unit=unit, disable=not progress, mininterval=0.5)

        for p in pairs:
            p.offset = offset
        with bar_of(pairs, "compare") as bar:
            measures = session.measure(pairs, chunk=chunk, progress=bar)
        vmaf_convention = _vmaf_pass(measures, "vmaf", vmaf, vmaf_threads, progress)
        floor_info, floor_jobs = {}, {}
        cache = FloorCache(conventions={**session.conventions, "block": BLOCK_CONVENTION},
                           offset=offset, vmaf=vmaf, report=out, measure_type=JobMeasure,
                           enabled=floor_cache)
        for f, name in zip(floor_runs, floor_names):
            fpairs, fproblems = pair_jobs(a, f, same_seed=False)
            for p in fpairs:
                p.offset = offset
            reused, todo, sources = cache.split(fpairs)     # measured once, reused (floorcache)
            new = {}
            if todo:
                with bar_of(todo, f"floor {name}") as bar:
                    new = {m.pair.job_id: m for m in session.measure(
                        todo, chunk=chunk, keep_worst=False, progress=bar)}
            fm = [reused[p.job_id] if p.job_id in reused else new[p.job_id] for p in fpairs]
            why = identical_floor(f.path, fm)
            if why:
                raise UserError(why)
            _vmaf_pass([m for m in fm if m.pair.job_id not in reused], f"vmaf floor {name}", vmaf,
                       vmaf_threads, progress)
            cache.store([m for m in fm if m.pair.job_id not in reused], f.path)
            floor_jobs[name] = {m.pair.job_id: aggregates_of([m]) for m in fm}
            floor_info[name] = {"run": str(f.path), "backend": f.manifest["backend"].get("spec"),
                                "name": run_name(f.manifest), "seed_offset": _seed_offset(f), "jobs_compared": len(fm),
                                "jobs_not_compared": fproblems, "aggregates": aggregates_of(fm),
                                "cache": cache.provenance(name, fpairs, sources)}
            if any(m.alignment is not None and m.alignment.offset for m in fm):
                floor_info[name]["alignment"] = alignment_of(fm)
        conventions = dict(session.conventions)
        conventions["block"] = BLOCK_CONVENTION
        if vmaf:
            from evalkit.metrics.vmaf import vmaf_convention as _default

            conventions["vmaf"] = vmaf_convention or _default()
        metrics_device = session.device
    finally:
        session.close()

    aggregates = aggregates_of(measures)
    ratios = {name: floor_ratio(aggregates, info["aggregates"]) for name, info in floor_info.items()}
    alignment = alignment_of(measures)
    verdict = (gate_obj.evaluate(aggregates, ratios, len(problems), alignment["shifted"])
               if gate_obj else None)
    findings = clip_findings(measures, floor_jobs, alignment, gate_obj.floor if gate_obj else None,
                             gate_obj)
    fa, fb = a.manifest["fingerprint"], b.manifest["fingerprint"]
    summary = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "evalkit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": {"name": a.manifest["suite"].get("name"), "sha256": a.manifest["suite"].get("sha256")},
        "runs": {"a": run_entry(a), "b": run_entry(b)},
        "fingerprint_differences": _fingerprint_diff(fa, fb),
        "metrics_device": metrics_device,
        "conventions": conventions,
        "units": units(),
        "jobs": {"compared": [m.pair.job_id for m in measures], "not_compared": problems},
        "alignment": alignment,
        "aggregates": aggregates,
        "floors": floor_info,
        "floor_ratios": ratios,
        "headline": run_headline(measures, ratios, aggregates, floor_info, findings, verdict,
                                 gate_obj.floor if gate_obj else None),
        "clip_findings": findings,
        "plots": plot_axes(measures, floor_jobs, findings),
        "floor_notice": floor_notice(floor_info),
        "gate": verdict,
    }
    warnings = same_run_warnings(a.manifest, b.manifest, summary["fingerprint_differences"])
    if warnings:
        summary["warnings"] = warnings

    write_report(out, summary, measures)
    code = 0 if verdict is None or verdict["verdict"] == "pass" else 1
    return CompareResult(summary, out, code, measures)
