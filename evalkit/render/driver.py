"""``evalkit render``: run a suite's jobs on one or more backends into run folders.

The driver (this module) owns the run folders: it decides what is left to do (jobs whose clip is
missing or does not match its recorded sha256), hands jobs to an executor, and records each
result as it arrives (clip, preview, manifest; all atomic). The executor only turns jobs into
frames: :class:`evalkit.render.local_executor.LocalExecutor` in this process, one backend after
the other, loading the pipeline once per backend; a cluster executor dispatches the same tasks
elsewhere and hands the results back to the same driver
(:class:`evalkit.executor.ray.RayExecutor`: Ray actors, one per GPU or CPU slot, return encoded
clips that this driver writes the same way). The executor interface is described in
:mod:`evalkit.render.local_executor`; the types handed between the steps are in
:mod:`evalkit.render.results`, the source clips in :mod:`evalkit.render.sources`, the
progress bars in :mod:`evalkit.render.progress`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import InputFileError, UserError
from evalkit.formats.run import RunDir
from evalkit.formats.suite import Job, Suite, load_suite
from evalkit.lossless import LOSSLESS_FORMATS, new_run_format
from evalkit.render.adopt import plan_identity
from evalkit.render.backend import BackendSpec, fingerprint
from evalkit.render.clipwriter import MAX_CLIP_PARTS, ClipWriter, clip_parts  # noqa: F401  (driver.clip_parts: tests, benchmarks)
from evalkit.render.local_executor import LocalExecutor, failure_text
from evalkit.render.progress import Progress
from evalkit.render.renderers import Renderer, WrittenClip, get_renderer
from evalkit.render.results import BackendTask, JobResult, RenderSummary
from evalkit.render.sources import SourceCache
from evalkit.video import shape_only


def on_device(runs) -> bool:
    """Whether one of ``runs`` (anything with ``spec`` and ``apply``: a :class:`BackendTask`, a
    :class:`evalkit.render.adopt.RunIdentity`) renders on a device other than the CPU (its spec
    applied)."""
    return any(r.apply and r.spec is not None and r.spec.device.split(":")[0] != "cpu" for r in runs)


def run_dir_name(spec: BackendSpec, seed_offset: int = 0) -> str:
    """Folder name of a backend's run: ``cuda-0_dtype-bf16`` style, plus ``_seed+N``."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", spec.device).strip("-")
    for key, value in spec.options():
        name += "_" + re.sub(r"[^A-Za-z0-9.]+", "-", f"{key}={value}")
    return name + (f"_seed+{seed_offset}" if seed_offset else "")


def run_folder_name(spec: BackendSpec | None, label: str | None = None, seed_offset: int = 0) -> str:
    """A run's folder: its label (``render --label``), else its backend spec
    (:func:`run_dir_name`); plus ``_seed+N`` for a ``--seed-offset N`` run."""
    if label is None:
        return run_dir_name(spec, seed_offset)
    return label + (f"_seed+{seed_offset}" if seed_offset else "")


#: cluster executors: the least time between two manifest saves of one run (seconds)
MANIFEST_SAVE_INTERVAL = 2.0


def accelerator_here() -> bool:
    """Whether this machine has a GPU torch can use (CUDA or ROCm): the compare of a run
    imported here is then likely to run here too, decode-bound on FFV1."""
    import torch

    return bool(torch.cuda.is_available())


def lossless_of_new_run(ident) -> str:
    """A new run's format when ``--lossless`` names none: the fast one for a run rendered on a
    device, or imported on a machine with one (:func:`accelerator_here`); FFV1 otherwise
    (:func:`evalkit.lossless.new_run_format`)."""
    return new_run_format(on_device([ident]) or (not ident.apply and accelerator_here()))


#: a run folder's lock file (``flock``; held while a render writes into the folder)
LOCK_FILE = ".lock"
#: a run folder's scratch space: renderers' temporary files (the ``command`` renderer's work
#: folders), removed when the next render takes the lock
WORK_DIR = ".work"


def lock_run_folder(path: Path) -> int:
    """Take the run folder's lock, before anything in it is written: return the lock's fd (keep
    it open while writing). A folder another render holds is refused at once, untouched (only
    the folder itself and its empty lock file are made when missing)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputFileError(path, "exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(
            f"{path}: another evalkit render holds this run folder (it is writing "
            "to it); wait for it to finish or choose another --out folder"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def clean_run_folder(run: RunDir) -> None:
    """Remove what a killed render left in its run folder (lock held): temporary files, work
    folders."""
    run.cleanup_temporary()
    shutil.rmtree(run.path / WORK_DIR, ignore_errors=True)


def select_jobs(suite: Suite, wanted: list[str] | None) -> list[Job]:
    """All jobs, or those named (by id, id prefix, or clip id), in suite order."""
    if not wanted:
        return list(suite.jobs)
    chosen = []
    for w in wanted:
        hits = [j for j in suite.jobs if j.id == w or j.id.startswith(w) or j.clip == w]
        if not hits:
            raise UserError(
                f"--jobs: {w!r} matches no job of suite {suite.name!r} (ids look like {suite.jobs[0].id})"
            )
        chosen.extend(h for h in hits if h not in chosen)
    return [j for j in suite.jobs if j in chosen]


def render_suite(
    suite_path,
    backends: list[str | BackendSpec],
    out,
    *,
    renderer: str | Renderer | None = None,
    options: dict | None = None,
    jobs: list[str] | None = None,
    seed_offset: int = 0,
    executor=None,
    progress: bool = True,
    label: str | None = None,
    fingerprint_file=None,
    lossless: str | None = None,
) -> list[RenderSummary]:
    """Render a suite on each backend into ``out/<backend>/`` (``out/<label>/`` with a
    ``label``); resumable and atomic. ``backends``: specs, as text (``cpu,dtype=bf16``) or
    already parsed (:func:`evalkit.render.backend.parse_spec`: a front door parses them once). ``fingerprint_file``: the fingerprint of the machine that
    really rendered (:mod:`evalkit.formats.fingerprint`), recorded instead of this one's. A
    renderer that adopts renders made elsewhere (``import``) needs no backend when it has a
    label (or a fingerprint file that names one): the spec is recorded, never applied.
    ``lossless``: the format of the clips (:data:`evalkit.lossless.LOSSLESS_FORMATS`, ``render
    --lossless``); None: for a new run ``utvideo`` when it renders on a device, else ``ffv1``
    (:func:`lossless_of_new_run`: also for an import on a machine with a GPU), its own for a
    resumed one (another one for a resumed run is a user error)."""
    suite = load_suite(suite_path, check_clips=False)
    executor = executor or LocalExecutor()
    rend = _renderer_of(suite, renderer, options)
    _check_render_options(seed_offset, lossless)
    idents = plan_identity(
        list(backends or []),
        renderer=rend,
        label=label,
        fingerprint_file=fingerprint_file,
        executor_name=executor.name,
    )
    executor.check([i.spec for i in idents if i.apply])
    selected = select_jobs(suite, jobs)
    rend.check_jobs(suite, selected)  # before anything loads (frame/size rules)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder (--out)")

    # an import or a command needs the sources' shapes only (the renderer streams them itself)
    sources = SourceCache(suite, shape_only=rend.streams_clips)
    with contextlib.ExitStack() as locks:
        locks.callback(sources.close)
        _lock_run_folders(locks, out, idents, seed_offset)
        runs = _open_runs(idents, out, suite, rend, executor, sources, selected, seed_offset, lossless)
        total = sum(len(task.jobs) for task, _ in runs)
        try:
            return _render_runs(executor, rend, sources, runs, total, selected, seed_offset, progress)
        finally:
            for _, run in runs:
                shutil.rmtree(run.path / WORK_DIR, ignore_errors=True)


def _renderer_of(suite: Suite, renderer: str | Renderer | None, options: dict | None) -> Renderer:
    """The renderer: an instance as given, else the one named (``--renderer``, or the suite's
    ``renderer:``) made with ``options``."""
    if isinstance(renderer, Renderer):
        return renderer  # an instance (tests, benchmarks, a cluster driver)
    renderer_name = renderer or suite.renderer
    if not renderer_name:
        raise UserError(f"{suite.path}: no renderer (give --renderer or 'renderer:' in the suite)")
    return get_renderer(renderer_name, options)


def _check_render_options(seed_offset: int, lossless: str | None) -> None:
    """``--seed-offset`` and ``--lossless``, each refused with a message naming its option."""
    if seed_offset < 0:
        raise UserError(f"--seed-offset: expected a non-negative integer, found {seed_offset}")
    if lossless is not None and lossless not in LOSSLESS_FORMATS:
        raise UserError(f"--lossless: expected one of {', '.join(LOSSLESS_FORMATS)}, found {lossless!r}")


def _lock_run_folders(
    locks: contextlib.ExitStack,
    out: Path,
    idents: list,
    seed_offset: int,
) -> None:
    """Every run folder's lock first (released by ``locks``): a render refused by one has
    written nothing anywhere (a folder it made for another backend is removed again)."""
    made: list[Path] = []
    try:
        for ident in idents:
            path = out / run_folder_name(ident.spec, ident.label, seed_offset)
            if not path.exists():
                made.append(path)
            locks.callback(os.close, lock_run_folder(path))
    except BaseException:
        locks.close()
        for path in made:
            with contextlib.suppress(OSError):
                (path / LOCK_FILE).unlink()
                path.rmdir()
        raise


def _open_runs(
    idents: list,
    out: Path,
    suite: Suite,
    rend: Renderer,
    executor,
    sources: SourceCache,
    selected: list[Job],
    seed_offset: int,
    lossless: str | None,
) -> list[tuple[BackendTask, RunDir]]:
    """Each backend's run folder opened (:func:`_open_run`) with the jobs it still has to
    render. An executor that decodes sources starts decoding the first job's source while the
    runs are set up: at once for a new run, else at the first run with a job to do."""
    runs: list[tuple[BackendTask, RunDir]] = []
    early = executor.decodes_sources and bool(selected)
    if (
        early
        and idents
        and not (
            out / run_folder_name(idents[0].spec, idents[0].label, seed_offset) / "manifest.json"
        ).exists()
    ):
        # a new run renders every selected job: the first one's source is decoded while
        # the runs are set up (fingerprint, manifest)
        sources.prefetch(selected[0].clip)
        early = False
    for ident in idents:
        spec = ident.spec or BackendSpec()
        path = out / run_folder_name(ident.spec, ident.label, seed_offset)
        run = _open_run(ident, spec, path, suite, rend, executor, seed_offset, lossless)
        todo = [j for j in selected if not run.is_done(j.id, verify=True)]
        rend.check_done(run, [j for j in selected if j not in todo], seed_offset)
        if early and todo:  # a resumed run: its first job still to do
            sources.prefetch(todo[0].clip)
            early = False
        runs.append(
            (
                BackendTask(
                    spec,
                    todo,
                    seed_offset,
                    work_dir=run.path / WORK_DIR,
                    apply=ident.apply,
                    name=ident.name,
                    lossless=run.lossless,
                ),
                run,
            )
        )
    return runs


def _open_run(
    ident,
    spec: BackendSpec,
    path: Path,
    suite: Suite,
    rend: Renderer,
    executor,
    seed_offset: int,
    lossless: str | None,
) -> RunDir:
    """One backend's run folder, created or resumed with the fingerprint it records
    (:func:`_run_fingerprint`) and cleaned of what a killed render left."""
    adopted = ident.adopted
    fp, here = _run_fingerprint(ident, spec, path, executor)
    if adopted is not None:
        adopted = {**adopted, "local_fingerprint": here}
    run = RunDir.create(
        path,
        suite=suite,
        renderer=rend.describe(),
        backend=ident.backend_record(),
        fingerprint=fp,
        notes={"seed_offset": seed_offset, "executor": executor.name},
        label=ident.label,
        adopted=adopted,
        lossless=lossless,
        new_lossless=lossless_of_new_run(ident),
    )
    clean_run_folder(run)
    return run


def _run_fingerprint(ident, spec: BackendSpec, path: Path, executor) -> tuple:
    """The fingerprint a run records (the adopted one, else this machine's under the backend
    applied, else the run's own until a worker reports one) and this machine's."""
    if ident.apply:
        here = executor.fingerprint(spec)
    else:  # nothing is applied: this machine as it is
        here = fingerprint()
    fp = ident.fingerprint or here
    if fp is None:  # reported by the workers that render; until then keep what was there
        old = RunDir.open(path).manifest["fingerprint"] if (path / "manifest.json").exists() else None
        fp = old or {"pending": "set from the worker that renders the first job"}
    return fp, here


@dataclass
class RunState:
    """What the driver knows of one run while its results arrive (the recorder thread's)."""

    task: BackendTask
    run: RunDir
    #: job id -> its error, for the jobs that failed this time
    failures: dict[str, str] = field(default_factory=dict)
    done: int = 0
    #: the cluster nodes that rendered a job of this run so far
    nodes: set = field(default_factory=set)
    #: when the manifest was last saved (monotonic seconds), and whether it has unsaved records
    saved: float = float("-inf")
    dirty: bool = False

    def summary(self, selected: int) -> "RenderSummary":
        return RenderSummary(
            self.task.name or self.task.spec.spec,
            self.run.path,
            self.done,
            len(self.failures),
            selected - len(self.task.jobs),
            self.failures,
        )


def _render_runs(
    executor, rend, sources, runs, total, selected, seed_offset, progress
) -> list[RenderSummary]:
    """Render every run's pending jobs (their run folders locked by the caller; ``sources``
    closed by the caller).

    Results are written while the next jobs render: each job's lossless clip and browser copy
    are encoded side by side on encoder threads, and one recorder thread marks the jobs done in
    the manifest in the order they came, each once both its files are in place. At most
    :data:`WRITE_AHEAD` results wait to be written (memory). A cluster executor's results come
    encoded: only their records are written here."""
    bars = Progress(total, enabled=progress)
    states = [RunState(task, run) for task, run in runs]
    encoders = ThreadPoolExecutor(max_workers=encoder_threads(), thread_name_prefix="evalkit-encode")
    recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalkit-writer")
    # with many cores each lossless clip is encoded in parts at once (clipwriter: same bytes)
    writer = ClipWriter(clip_parts(), WRITE_AHEAD)
    pending: collections.deque = collections.deque()
    try:
        for task, result in executor.run_all(rend, [st.task for st in states], sources, bars):
            st = next(st for st in states if st.task is task)
            while len(pending) >= WRITE_AHEAD:
                pending.popleft().result()
            files = _encode(encoders, st.run, result, writer)
            pending.append(recorder.submit(_record, st, result, seed_offset, files))
        while pending:
            pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        recorder.shutdown(wait=True)
        encoders.shutdown(wait=True, cancel_futures=True)
        writer.close()
        for st in states:  # results whose manifest save was deferred
            if st.dirty:
                st.run.save()
        bars.close()
    return [st.summary(len(selected)) for st in states]


#: results rendered but not yet recorded, at most (each holds its frames until written)
WRITE_AHEAD = 2


def encoder_threads() -> int:
    """Encoder threads of a local render: two per job in flight (clip and preview), at most
    one per core (x264 runs its own threads besides)."""
    return max(2, min(2 * WRITE_AHEAD, os.cpu_count() or 1))


def _encode(pool: ThreadPoolExecutor, run: RunDir, result: JobResult, writer: ClipWriter) -> list[Future]:
    """Start writing a rendered job's lossless clip and browser copy (atomic files) on the
    encoder threads ``pool``; a renderer's own files are moved into place instead."""
    if result.error is None and result.written is not None:
        return [pool.submit(_move_written, run, result.job.id, result.written)]
    if result.error is not None or result.encoded is not None or result.frames is None:
        return []
    jid = result.job.id
    return [
        pool.submit(writer.write, run.clip_path(jid), result.frames, result.fps, run.lossless),
        pool.submit(writer.write_browser, run.preview_path(jid), result.frames, result.fps),
    ]


def _move_written(run: RunDir, jid: str, w: WrittenClip) -> str:
    """A renderer's own files moved into the run folder (clip, then preview: renames on the
    run folder's file system, or copies from elsewhere); the clip's sha256."""
    for src, dst in ((w.clip, run.clip_path(jid)), (w.preview, run.preview_path(jid))):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))
    with contextlib.suppress(OSError):
        Path(w.clip).parent.rmdir()
    return w.sha256


def _write_error(files: list[Future]) -> str | None:
    """Wait for a job's files; the first writer error as a job error (None: both written)."""
    error = None
    for f in files:
        try:
            f.result()
        except Exception as e:
            error = error or f"writing the clip failed: {failure_text(e)}"
    return error


def _clip_sha256(files: list[Future]) -> str | None:
    """The lossless clip's sha256 from its writer (:meth:`ClipWriter.write`; None: none
    written)."""
    return files[0].result() if files else None


def _record(st: RunState, result: JobResult, seed_offset: int, files: list[Future] = ()) -> None:
    """Record one result in its run folder (on the recorder thread), once ``files`` (its clip
    and preview being written by the encoder threads) are in place; a writer's error fails the
    job (its files, if any, are removed: a done job always has both)."""
    run = st.run
    if result.error is None:
        error = _write_error(list(files))
        if error is not None:
            for p in (run.clip_path(result.job.id), run.preview_path(result.job.id)):
                with contextlib.suppress(OSError):
                    p.unlink()
            result = dataclasses.replace(result, frames=None, error=error)
    if result.error is None:
        st.done += 1
    else:
        st.failures[result.job.id] = result.error
    if result.fingerprint is not None:
        # the fingerprint is the rendering node's: the first one seen this time becomes the
        # run's; every node that rendered a job is listed with its own under "nodes"
        node = result.extra.get("node", {})
        if not st.nodes:
            run.manifest["fingerprint"] = result.fingerprint
        if node.get("id") and node["id"] not in st.nodes:
            st.nodes.add(node["id"])
            run.manifest.setdefault("nodes", {})[node["id"]] = {
                "host": node.get("host"),
                "ip": node.get("ip"),
                "fingerprint": result.fingerprint,
            }
    if result.error is None:
        extra = {"effective_seed": result.job.seed + seed_offset, **result.extra}
        if result.encoded is not None:
            # a cluster's results come fast: the manifest (rewritten whole, about 1 KB per job)
            # is saved at most every MANIFEST_SAVE_INTERVAL seconds; the clip is always in place
            # first, so a crash in between only leaves finished jobs pending (rendered again)
            e = result.encoded
            now = time.monotonic()
            save = now - st.saved >= MANIFEST_SAVE_INTERVAL
            run.record_done_encoded(
                result.job.id,
                e["clip"],
                e.get("preview"),
                frames=e["frames"],
                width=e["width"],
                height=e["height"],
                fps=result.fps,
                timing=result.timing,
                extra=extra,
                save=save,
            )
            st.dirty = not save
            if save:
                st.saved = now
        else:
            frames = (
                result.frames
                if result.written is None
                else shape_only(result.written.frames, result.written.height, result.written.width)
            )
            run.record_done(
                result.job.id,
                frames,
                result.fps,
                timing=result.timing,
                extra=extra,
                written=bool(files),
                sha256=_clip_sha256(files),
            )
            st.dirty = False
    else:
        run.record_failed(result.job.id, result.error, timing=result.timing, extra=result.extra or None)
        st.dirty = False
