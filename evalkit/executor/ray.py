"""The Ray executor: ``evalkit render/compare --executor ray [--ray-address ADDRESS]``.

Render: one Ray actor per (backend, GPU or CPU slot). An actor loads the renderer once (on its
first job), applies the backend's settings for its whole life, renders jobs with exactly the
code path of :class:`evalkit.render.local_executor.LocalExecutor`, encodes the lossless clip and the browser
preview with the same :mod:`evalkit.video` writers, and returns the bytes, the job's timing, its
node and the node's fingerprint. The driver (:func:`evalkit.render.driver.render_suite`) writes the run
folders as it does for the local executor, so workers need no shared filesystem: source clips
travel once per clip through Ray's object store, results travel back as encoded bytes.

Placement: a GPU backend's actor asks for one GPU, a CPU backend's for ``cpus_per_worker`` CPUs;
a backend spec with ``resource=NAME`` also asks for a sliver (0.001) of the Ray custom resource
``NAME``, so it only runs on nodes started with that resource (``ray start --resources
'{"NAME": 1}'``). The number of actors per backend is what the matching nodes can hold (GPUs,
or CPUs / ``cpus_per_worker``), capped by ``max_workers`` and the number of jobs.

Faults: a worker process that dies (killed, crashed, out of memory) fails its in-flight jobs;
the actor is replaced and each such job goes back to the queue, to be picked up by whichever
worker is free next, at most ``max_retries`` more times, then it is recorded as failed. A driver
killed and restarted resumes from the run folders like the local executor (its actors die with
it). Each worker keeps the clips it receives and the files it encodes in a scratch folder of its
node's temp folder, which it removes when its pool closes; the folder of a killed worker is
removed by the next worker started on that host.

Compare: one actor per GPU (or CPU slot) holds a loaded :class:`evalkit.metrics.PairEvaluator`; clip
pairs travel to it as bytes, per-frame records come back; aggregation and the report stay on the
driver (:func:`evalkit.compare.run.compare_runs`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from evalkit.errors import EvalkitError, UserError

INSTALL_HINT = "pip install 'evalkit[ray]'"
#: how much of a custom resource one worker asks for: the resource acts as a node label
RESOURCE_SLIVER = 0.001
#: how long a closing pool waits for its workers to remove their scratch folders (a replaced
#: worker may still be starting)
SCRATCH_TIMEOUT_S = 60.0


class RayUnavailableError(UserError):
    """Ray is not installed, or the cluster cannot be reached."""


def import_ray(local: bool = False):
    """``import ray`` or a one-line error naming the extra to install."""
    if local and "ray" not in sys.modules:
        # a local instance stays on loopback (Ray otherwise advertises the machine's address)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as e:
        raise RayUnavailableError(
            f"--executor ray: Ray is not installed ({e}); install it with {INSTALL_HINT}"
        ) from None
    return ray


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """A host:port that does not answer fails at once (Ray itself would retry for minutes)."""
    import socket

    if "://" in address or address == "auto" or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise RayUnavailableError(
            f"--ray-address {address}: no Ray head answers there "
            f"({_first_line(e)}); start one with ray start --head"
        ) from None


class _Cluster:
    """Connects to Ray on first use; shuts down only an instance it started itself."""

    def __init__(self, address: str | None = None):
        self.address = address
        self.ray = None
        self.started = False

    def connect(self):
        if self.ray is not None:
            return self.ray
        ray = import_ray(local=self.address is None)
        if not ray.is_initialized():
            kw = dict(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
            try:
                if self.address is None:
                    # workers of a local instance can import what this process can
                    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
                    ray.init(address="local", runtime_env={"env_vars": {"PYTHONPATH": path}}, **kw)
                else:
                    _check_reachable(self.address)
                    ray.init(address=self.address, **kw)
            except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
                where = self.address or "a local instance"
                raise RayUnavailableError(
                    f"--ray-address {where}: cannot start or reach a Ray cluster ({_first_line(e)})"
                ) from None
            self.started = True
        self.ray = ray
        return ray

    def close(self) -> None:
        if self.started and self.ray is not None:
            self.ray.shutdown()
        self.started = False
        self.ray = None

    def nodes(self) -> list[dict]:
        return [n for n in self.connect().nodes() if n.get("Alive")]


def _node_info() -> dict:
    import ray

    ctx = ray.get_runtime_context()
    return {
        "id": ctx.get_node_id(),
        "host": platform.node(),
        "ip": ray.util.get_node_ip_address(),
        "worker_pid": os.getpid(),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
    }


def _worker_spec(spec):
    """On a worker Ray has picked the GPU (CUDA_VISIBLE_DEVICES): cuda:N means that one."""
    if spec.device.startswith("cuda"):
        return dataclasses.replace(spec, device="cuda")
    return spec


def _set_threads(threads: int | None) -> None:
    """CPU workers compute with as many threads as CPUs they were given. (float32 sums on the
    CPU can depend on the thread count: equal counts give bit-identical metrics.)"""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


# -- scratch folders ---------------------------------------------------------------------------

#: a worker's scratch folder: ``evalkit-ray-<kind>.<host>.<pid>.<random>`` in its node's temp folder
SCRATCH_PREFIX = "evalkit-ray-"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet waited for, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def sweep_scratch(tmp: str | None = None) -> list[Path]:
    """Remove the scratch folders that workers of this host left when they were killed (a
    worker removes its own when its pool closes; a killed one cannot): those whose process is
    gone. Run by every new worker; returns what it removed."""
    tmp = Path(tmp or tempfile.gettempdir())
    host = platform.node()
    gone = []
    for p in tmp.glob(f"{SCRATCH_PREFIX}*"):
        parts = p.name.rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or "." not in parts[0]:
            continue
        if parts[0].split(".", 1)[1] == host and not _alive(int(parts[1])):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


class _Scratch:
    """A worker's scratch folder (received clips, encoded results), removed by :meth:`remove`
    when its pool closes, or by a later worker's :func:`sweep_scratch` if it is killed."""

    def __init__(self, kind: str):
        sweep_scratch()
        name = f"{SCRATCH_PREFIX}{kind}.{platform.node()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self.dir = Path(tempfile.gettempdir()) / name
        self.dir.mkdir(mode=0o700)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# -- actors (plain classes, wrapped with ray.remote when used) -------------------------------


class _WorkerSources:
    """Source clips on a worker: fetched from the object store once, decoded once, the last
    four kept (their files too: a renderer may read its source file)."""

    def __init__(self, folder: Path):
        self.dir = folder
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self.refs: dict = {}

    def get(self, clip_id: str):
        import ray

        from evalkit.video import ClipReader

        if clip_id not in self._cache:
            name, ref = self.refs[clip_id]
            path = self.dir / f"src-{uuid.uuid4().hex[:8]}-{name}"
            path.write_bytes(ray.get(ref))
            reader = ClipReader(path)
            self._cache[clip_id] = (reader.read(), reader.info.fps, path)
            while len(self._cache) > 4:
                self._cache.popitem(last=False)[1][2].unlink(missing_ok=True)
        self._cache.move_to_end(clip_id)
        return self._cache[clip_id]


class _NoProgress:
    def start_job(self, label):
        return lambda done, total: None

    def end_job(self, ok):
        pass


class RenderWorker:
    """One backend on one GPU/CPU slot: loads the renderer on the first job, keeps it."""

    def __init__(self, renderer, spec, slot: str, threads: int | None = None):
        _set_threads(threads)
        self.renderer = renderer
        self.spec = spec
        self.slot = slot
        self.runtime = None
        self.fp = None
        self.scratch = _Scratch("render")
        self.sources = _WorkerSources(self.scratch.dir)
        self.out = self.scratch.dir

    def _load(self):
        from evalkit.render.backend import apply_backend, fingerprint

        spec = _worker_spec(self.spec)
        self._ctx = apply_backend(spec)  # held for the actor's life (a dedicated process)
        self.runtime = self._ctx.__enter__()
        self.fp = fingerprint(spec)
        self.renderer.load(self.runtime)
        self.node = {**_node_info(), "worker": self.slot}

    def render(
        self, job, clip: tuple, seed_offset: int, preview: bool = True, lossless: str = "ffv1"
    ) -> dict:
        """Render one job; its clip is encoded here in the run's ``lossless`` format."""
        from evalkit.render.local_executor import LocalExecutor
        from evalkit.video import lossless_format, write_browser, write_lossless

        if self.runtime is None:
            self._load()
        self.sources.refs[job.clip] = clip[0]  # (name, ObjectRef): not resolved by Ray
        result = LocalExecutor.render_job(
            self.renderer, self.runtime, job, self.sources, seed_offset, _NoProgress(), lossless=lossless
        )
        out = {
            "error": result.error,
            "timing": result.timing,
            "fps": result.fps,
            "node": self.node,
            "fingerprint": self.fp,
            "encoded": None,
            "extra": result.extra,
        }
        if result.error is None and result.written is not None:
            w = result.written  # a renderer that wrote its files (``command``)
            try:
                out["encoded"] = {
                    "clip": Path(w.clip).read_bytes(),
                    "preview": Path(w.preview).read_bytes() if preview else None,
                    "frames": w.frames,
                    "width": w.width,
                    "height": w.height,
                }
            finally:
                shutil.rmtree(Path(w.clip).parent, ignore_errors=True)
        elif result.error is None:
            frames = result.frames
            clip_path = self.out / f"clip{lossless_format(lossless).ext}"
            prev_path = self.out / "preview.mp4"
            n = write_lossless(clip_path, frames, result.fps, codec=lossless)
            if preview:
                write_browser(prev_path, frames, result.fps)
            out["encoded"] = {
                "clip": clip_path.read_bytes(),
                "preview": prev_path.read_bytes() if preview else None,
                "frames": n,
                "width": int(frames.shape[2]),
                "height": int(frames.shape[1]),
            }
        return out

    def pid(self) -> int:
        return os.getpid()

    def remove_scratch(self) -> None:
        self.scratch.remove()


class MeasureWorker:
    """One metric evaluator (LPIPS loaded once) on one GPU/CPU slot."""

    def __init__(self, device, metrics, threads: int | None = None):
        from evalkit.metrics.stream import PairEvaluator

        _set_threads(threads)
        self.evaluator = PairEvaluator(device=device, **metrics.evaluator_kwargs())
        self.scratch = _Scratch("compare")
        self.dir = self.scratch.dir

    def info(self) -> dict:
        return {
            "conventions": self.evaluator.conventions,
            "device": str(self.evaluator.device),
            "node": _node_info(),
        }

    def measure(self, pair, data: tuple, chunk, keep_worst: bool):
        import ray

        from evalkit.compare.pairing import measure_pair

        # the runs' own extensions (.mkv, .nut): the reader goes by the name
        a, b = self.dir / f"a{Path(pair.path_a).suffix}", self.dir / f"b{Path(pair.path_b).suffix}"
        a.write_bytes(ray.get(data[0]))
        b.write_bytes(ray.get(data[1]))
        local = dataclasses.replace(pair, path_a=a, path_b=b)
        m = measure_pair(self.evaluator, local, chunk=chunk, keep_worst=keep_worst)
        m.pair = pair
        return m

    def remove_scratch(self) -> None:
        self.scratch.remove()


# -- scheduling ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Item:
    pool: int
    payload: object
    attempts: int = 0
    deaths: list = dataclasses.field(default_factory=list)


class _Pool:
    """The actors of one backend (or of a compare): created at once, replaced when they die."""

    def __init__(self, ray, cls, args: tuple, options: dict, size: int, label: str):
        self.ray, self.cls, self.args, self.options, self.label = ray, cls, args, options, label
        self.remote_cls = ray.remote(cls)
        self.actors = [self._new(i) for i in range(size)]
        self.generation = [0] * size
        self.closed = False

    def _new(self, i: int):
        args = self.args(i) if callable(self.args) else self.args
        return self.remote_cls.options(max_restarts=0, max_task_retries=0, **self.options).remote(*args)

    def replace(self, i: int) -> None:
        try:
            self.ray.kill(self.actors[i], no_restart=True)
        except Exception:
            pass
        self.actors[i] = self._new(i)
        self.generation[i] += 1

    def close(self, grace: float = SCRATCH_TIMEOUT_S) -> None:
        """Kill the workers, each after removing its scratch folder (waiting at most ``grace``
        seconds: 0 on an error or Ctrl-C, when workers may be busy; a folder left then goes in
        the next worker's sweep)."""
        if not self.closed:
            refs = [a.remove_scratch.remote() for a in self.actors]
            self.ray.wait(refs, num_returns=len(refs), timeout=grace)
            for a in self.actors:
                try:
                    self.ray.kill(a, no_restart=True)
                except Exception:
                    pass
            self.closed = True


def _death_types(ray):
    ex = ray.exceptions
    return tuple(
        t
        for t in (
            getattr(ex, "RayActorError", None),
            getattr(ex, "WorkerCrashedError", None),
            getattr(ex, "OutOfMemoryError", None),
            getattr(ex, "ObjectLostError", None),
        )
        if t is not None
    )


def _schedule(
    ray, pools: list[_Pool], items: list[_Item], submit, *, max_retries: int, inflight: int, on_status=None
):
    """Feed each pool's actors from its queue (``inflight`` calls per actor); yield
    ``(item, value, None)`` or, after ``max_retries`` retries of worker deaths, ``(item, None,
    reason)``. A task error (the work itself raised on the worker) is re-raised here."""
    deaths = _death_types(ray)
    queues = [collections.deque() for _ in pools]
    for it in items:
        queues[it.pool].append(it)
    running: dict = {}
    load = {(p, s): 0 for p, pool in enumerate(pools) for s in range(len(pool.actors))}
    last_status = 0.0
    while running or any(queues):
        for p, pool in enumerate(pools):
            for level in range(1, inflight + 1):  # spread first: one call per actor, then more
                for s in range(len(pool.actors)):
                    if queues[p] and load[p, s] < level:
                        it = queues[p].popleft()
                        ref = submit(pool.actors[s], it)
                        running[ref] = (it, p, s, pool.generation[s])
                        load[p, s] += 1
            if not queues[p] and not any(v[1] == p for v in running.values()):
                pool.close()  # free its GPUs/CPUs for the other backends
        if on_status and time.monotonic() - last_status > 0.5:
            busy = sum(1 for k, v in load.items() if v)
            on_status(f"{len(running)} in flight on {busy} workers")
            last_status = time.monotonic()
        ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
        for ref in ready:
            it, p, s, gen = running.pop(ref)
            load[p, s] -= 1
            try:
                value = ray.get(ref)
            except deaths as e:
                it.attempts += 1
                it.deaths.append(_first_line(e)[:300])
                if pools[p].generation[s] == gen:
                    pools[p].replace(s)
                if it.attempts > max_retries:
                    yield (
                        it,
                        None,
                        (f"the worker died {it.attempts} times while on this job (last: {it.deaths[-1]})"),
                    )
                else:
                    queues[p].appendleft(it)
                continue
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, EvalkitError):
                    raise cause from None
                raise EvalkitError(
                    f"{pools[p].label}: a Ray worker failed: {_first_line(cause or e)}"
                ) from None
            yield it, value, None


# -- the executor ----------------------------------------------------------------------------


class RayExecutor:
    """Render (and compare) on a Ray cluster; see the module docstring."""

    name = "ray"
    #: the sources are decoded on the workers, not by the driver's SourceCache
    decodes_sources = False

    def __init__(
        self,
        address: str | None = None,
        *,
        max_workers: int | None = None,
        cpus_per_worker: float = 1,
        max_retries: int = 2,
        inflight: int = 2,
        preview: bool = True,
    ):
        if max_workers is not None and max_workers < 1:
            raise UserError(f"--ray-workers: expected a positive integer, found {max_workers}")
        if cpus_per_worker <= 0:
            raise UserError(f"--ray-cpus: expected a positive number, found {cpus_per_worker}")
        if max_retries < 0:
            raise UserError(f"--ray-retries: expected a non-negative integer, found {max_retries}")
        self.cluster = _Cluster(address)
        self.max_workers = max_workers
        self.cpus_per_worker = cpus_per_worker
        self.max_retries = max_retries
        self.inflight = inflight
        self.preview = preview

    # -- placement ---------------------------------------------------------------------------
    def _placement(self, spec) -> tuple[dict, int]:
        """Ray options of one worker of this backend, and how many fit on the cluster."""
        nodes = self.cluster.nodes()
        if spec.resource:
            nodes = [n for n in nodes if n["Resources"].get(spec.resource, 0) > 0]
            if not nodes:
                have = sorted(
                    {
                        k
                        for n in self.cluster.nodes()
                        for k in n["Resources"]
                        if not k.startswith("node:")
                        and k not in ("CPU", "GPU", "memory", "object_store_memory")
                    }
                )
                raise UserError(
                    f"backend {spec.spec!r}: no node of the Ray cluster offers resource "
                    f"{spec.resource!r} (custom resources: {', '.join(have) or 'none'}; "
                    "start nodes with ray start --resources '{\"NAME\": 1}')"
                )
        if spec.device.startswith("cuda"):
            opts = {"num_gpus": 1, "num_cpus": 1}
            capacity = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
            if not capacity:
                raise UserError(
                    f"backend {spec.spec!r}: no node of the Ray cluster has a GPU"
                    + (f" and resource {spec.resource!r}" if spec.resource else "")
                )
        else:
            opts = {"num_cpus": self.cpus_per_worker}
            capacity = sum(int(n["Resources"].get("CPU", 0) // self.cpus_per_worker) for n in nodes)
            if not capacity:
                raise UserError(
                    f"backend {spec.spec!r}: no node of the Ray cluster has "
                    f"{self.cpus_per_worker} free CPUs for a worker"
                )
        if spec.resource:
            opts["resources"] = {spec.resource: RESOURCE_SLIVER}
        if self.max_workers:
            capacity = min(capacity, self.max_workers)
        return opts, capacity

    def _threads(self, spec) -> int | None:
        return None if spec.device.startswith("cuda") else max(1, int(self.cpus_per_worker))

    # -- render ------------------------------------------------------------------------------
    def check(self, specs) -> None:
        from evalkit.render.backend import check_available

        self.cluster.connect()
        for spec in specs:
            if spec.device.startswith("cuda") or spec.device == "mps":
                self._placement(spec)  # GPUs are checked on the cluster, not here
            else:
                check_available(spec)
                self._placement(spec)

    def fingerprint(self, spec):
        return None  # each result carries its node's

    def run_all(self, renderer, tasks, sources, progress):
        from evalkit.render.results import JobResult

        ray = self.cluster.connect()
        pools, items = [], []
        clip_refs: dict = {}
        try:
            for task in tasks:
                if not task.jobs:
                    continue
                opts, capacity = self._placement(task.spec)
                size = max(1, min(capacity, len(task.jobs)))
                label = f"backend {task.spec.spec!r}"
                pools.append(
                    _Pool(
                        ray,
                        RenderWorker,
                        lambda i, t=task: (renderer, t.spec, f"{t.spec.spec}#{i}", self._threads(t.spec)),
                        opts,
                        size,
                        label,
                    )
                )
                for job in task.jobs:
                    if job.clip not in clip_refs:
                        path = Path(sources.suite.clips[job.clip].path)
                        clip_refs[job.clip] = (path.name, ray.put(path.read_bytes()))
                    items.append(_Item(len(pools) - 1, (task, job)))
            if not items:
                return
            progress.status(f"starting {sum(len(p.actors) for p in pools)} Ray workers")

            def submit(actor, it):
                task, job = it.payload
                return actor.render.remote(
                    job, (clip_refs[job.clip],), task.seed_offset, self.preview, task.lossless
                )

            for it, value, dead in _schedule(
                ray,
                pools,
                items,
                submit,
                max_retries=self.max_retries,
                inflight=self.inflight,
                on_status=progress.status,
            ):
                task, job = it.payload
                if value is None:
                    result = JobResult(job, None, None, dead, {}, extra={"attempts": it.attempts})
                else:
                    extra = {**value.get("extra", {}), "node": value["node"], "attempts": it.attempts + 1}
                    if it.deaths:
                        extra["worker_deaths"] = it.deaths
                    result = JobResult(
                        job,
                        None,
                        value["fps"],
                        value["error"],
                        value["timing"],
                        encoded=value["encoded"],
                        extra=extra,
                        fingerprint=value["fingerprint"],
                    )
                progress.end_job(result.error is None)
                yield task, result
        except BaseException:
            for pool in pools:
                pool.close(grace=0)
            raise
        finally:
            for pool in pools:
                pool.close()

    # -- compare -----------------------------------------------------------------------------
    def compare_session(self, *, device=None, metrics=None):
        """Pairs measured on the cluster with ``metrics``
        (:class:`evalkit.compare.options.MetricOptions`, default every metric)."""
        from evalkit.compare.options import MetricOptions

        return RayCompareSession(self, device, metrics or MetricOptions())

    def close(self) -> None:
        self.cluster.close()


class RayCompareSession:
    """Spreads clip pairs over MeasureWorker actors; results come back in input order."""

    #: progress counts jobs (the local session's counts frames)
    progress_unit = "job"

    def __init__(self, executor: RayExecutor, device, metrics):
        ray = executor.cluster.connect()
        self.ray, self.executor = ray, executor
        nodes = executor.cluster.nodes()
        gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
        want_gpu = (device or "auto") != "cpu" and gpus > 0
        if device and str(device).startswith("cuda") and not gpus:
            raise UserError(f"--device {device}: no node of the Ray cluster has a GPU")
        if want_gpu:
            opts, capacity = {"num_gpus": 1, "num_cpus": 1}, gpus
            worker_device = "cuda" if device in (None, "auto") or str(device).startswith("cuda") else device
        else:
            cpw = executor.cpus_per_worker
            opts = {"num_cpus": cpw}
            capacity = sum(int(n["Resources"].get("CPU", 0) // cpw) for n in nodes)
            worker_device = "cpu"
        if executor.max_workers:
            capacity = min(capacity, executor.max_workers)
        self.capacity = max(1, capacity)
        self.opts, self.worker_device, self.metrics = opts, worker_device, metrics
        self.pool = None
        self._info = None
        self._busy = False  # a measure() that raised: its workers may still be busy

    def _ensure(self, n: int):
        if self.pool is None:
            threads = None if self.worker_device != "cpu" else max(1, int(self.executor.cpus_per_worker))
            self.pool = _Pool(
                self.ray,
                MeasureWorker,
                (self.worker_device, self.metrics, threads),
                self.opts,
                max(1, min(self.capacity, n)),
                "compare",
            )
            try:
                self._info = self.ray.get(self.pool.actors[0].info.remote())
            except self.ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, EvalkitError):
                    raise cause from None
                raise EvalkitError(f"compare: a Ray worker failed: {_first_line(cause or e)}") from None
        return self.pool

    @property
    def conventions(self) -> dict:
        return self._ensure(1) and self._info["conventions"]

    @property
    def device(self) -> str:
        return self._ensure(1) and self._info["device"]

    def measure(self, pairs, *, chunk=None, keep_worst=True, progress=None, on_measured=None) -> list:
        if not pairs:
            return []
        ray = self.ray
        pool = self._ensure(len(pairs))
        pool.closed = False
        refs = {}

        def data(path):
            key = str(path)
            if key not in refs:
                refs[key] = ray.put(Path(path).read_bytes())
            return refs[key]

        items = [_Item(0, (i, p)) for i, p in enumerate(pairs)]
        out = [None] * len(pairs)

        def submit(actor, it):
            i, p = it.payload
            return actor.measure.remote(p, (data(p.path_a), data(p.path_b)), chunk, keep_worst)

        # the pool stays up between calls (main pairs, then each floor)
        orig_close, pool.close = pool.close, (lambda grace=0: None)
        self._busy = True
        try:
            for it, value, dead in _schedule(
                ray,
                [pool],
                items,
                submit,
                max_retries=self.executor.max_retries,
                inflight=self.executor.inflight,
            ):
                if value is None:
                    raise EvalkitError(f"compare: job {it.payload[1].job_id}: {dead}")
                out[it.payload[0]] = value
                if on_measured is not None:  # as each job arrives (in whatever order)
                    on_measured(value)
                if progress is not None:
                    progress.update(1)
            self._busy = False
        finally:
            pool.close = orig_close
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(grace=0 if self._busy else SCRATCH_TIMEOUT_S)
