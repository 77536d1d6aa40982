"""The canary pipeline's own calls while other processes load the CPU.

    PYTHONPATH=. python benchmarks/bench_contention.py                     # cuda if available
    PYTHONPATH=. python benchmarks/bench_contention.py --backend cpu --repeats 1 --quick \\
        --jobs astronaut_pan --max-frames 4                                # smoke check
    PYTHONPATH=. python benchmarks/bench_contention.py --part affinity     # pinning, CUDA sync

Why: inside ``evalkit render`` the canary's pipeline calls take 1.5-1.9 s against 1.0-1.35 s
in a direct loop on one H200 (benchmarks/README.md, "Render overhead"), whether the writers run
on threads or in worker processes. This loads the canary renderer once under
:func:`evalkit.render.backend.apply_backend`, as ``bench_render.py`` does, and times only the
render calls of the suite's jobs (sources decoded beforehand; on CUDA synchronised after each
call), median of ``--repeats`` loops, under each condition in turn:

idle; torch threads 1; N/2 and N processes spinning in a busy loop (N: the CPU cores this
process may use); N at nice 19; N with torch threads 1 in this process; 2 encoder processes
(the first job's frames written by :func:`evalkit.video.write_lossless` and
:func:`evalkit.video.write_browser` in a loop, 4 threads each, as a render's writers do); the
same at nice 19; the same with torch threads 1; idle again (the drift of the machine).
``--quick``: idle, N busy, 2 encoders, idle again.

What it showed (benchmarks/results/render_contention_h200.txt, 16 cores): a launch-bound
pipeline (small kernels, one Python thread launching them) slows with any CPU load on the
machine, niced or not: idle 1.35 s, 8 busy processes 1.88 s, 16 busy 2.20 s (nice 19: 2.06 s),
2 encoder processes 1.91 s (nice 19: 1.64 s), torch threads 1 beside them 1.57 s. The busy
processes share no GIL and no GPU with the pipeline, and at nice 19 they get almost no CPU time
when it wants a core, yet it still slows: what they take from its launching thread is not CPU
time alone (wake-up latency, shared caches and cores' clocks are candidates; not measured apart).

The loading processes are started with ``spawn``, killed and joined when each condition ends
(also on errors, Ctrl-C or SIGTERM); the encoders write into a temporary folder removed at the end.

``--part affinity`` (session 11) separates the candidates. It prints the CPU topology first
(allowed CPUs, SMT siblings, cores, packages, NUMA nodes, clocks, the GPU's NUMA node and the
CUDA context's scheduling flags), then times: idle; the pipeline's (main) thread pinned to one
CPU ``C`` (``--pin-cpu``, default the one it is on); busy processes one per CPU other than ``C``
and its SMT siblings, the pipeline not pinned, then pinned to ``C``; busy processes on the
siblings too (with SMT); 2 encoder processes, the pipeline not pinned / pinned to ``C``, the
encoders free / kept off ``C`` and its siblings (the last is what a render whose writers were
kept off the pipeline's core would do: built in session 11 as ``EVALKIT_WRITER_CPUS=auto`` and
removed, since a real canary render measured the same with it, 1.968 against 1.983 s); then, each in a fresh process (the flag is read when the CUDA context is
made), the pipeline idle and beside 2 encoders with the CUDA runtime's default scheduling,
``cudaDeviceScheduleSpin`` and ``cudaDeviceScheduleBlockingSync`` (``cudaSetDeviceFlags``
through ctypes on the libcudart torch loaded; read back from the runtime and the driver's
primary context); idle again. ``--part all``: the first list, then these. Each line: the
median, its ratio to the first idle, and the launching thread's own counters in the render calls
(median per loop, ``/proc/self/task/TID``): ``cpu`` its time on a CPU, ``wait`` its time runnable
but waiting for one (wake-up and scheduling latency), ``sw`` voluntary/involuntary context
switches (it slept / it was preempted), ``migr`` moves between CPUs, ``cpus`` the CPUs it was
seen on, ``MHz`` the clock of its last CPU sampled under the load. Longer ``cpu`` at the same
``wait`` points at the core itself (SMT sibling, caches, clock); longer ``wait`` at the
scheduler.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: threads of each encoder process (a lossless clip and a browser copy at once, twice over)
ENCODER_THREADS = 4
#: cudaDeviceSchedule* flags of the fresh-process runs (None: the runtime's default, not set)
CUDA_SCHED = {"default": None, "spin": 1, "blocking-sync": 4}
_SCHED_NAMES = {0: "auto", 1: "spin", 2: "yield", 4: "blocking-sync"}


# -- the loading processes ----------------------------------------------------------------------
def _child_setup(cpus) -> None:
    """In a loading process: die with the parent (Linux PR_SET_PDEATHSIG), then keep to
    ``cpus`` (None: the affinity inherited)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if cpus:
        os.sched_setaffinity(0, cpus)


def spin(nice: int, cpus=None) -> None:
    """A busy loop at niceness ``nice`` on ``cpus`` (a child process's target)."""
    _child_setup(cpus)
    os.nice(nice)
    while True:
        pass


def encode_loop(nice: int, frames, folder: str, cpus=None) -> None:
    """``frames`` written as lossless clips and browser copies in a loop, ENCODER_THREADS at a
    time, at niceness ``nice`` on ``cpus`` (a child process's target; FFmpeg's threads inherit
    the affinity)."""
    _child_setup(cpus)
    from evalkit.video import write_browser, write_lossless

    os.nice(nice)
    d = tempfile.mkdtemp(dir=folder)
    with ThreadPoolExecutor(ENCODER_THREADS) as pool:
        i = 0
        while True:
            fs = [
                pool.submit(write_lossless, f"{d}/a{i % ENCODER_THREADS}.mkv", frames, 24),
                pool.submit(write_browser, f"{d}/b{i % ENCODER_THREADS}.mp4", frames, 24),
            ]
            for f in fs:
                f.result()
            i += 1


@dataclass
class Cond:
    """A condition: its loading processes ([(target, args)]), torch threads (None: as is), the
    CPU the pipeline's thread is pinned to (None: not pinned), why it is skipped (None: run),
    or the CUDA scheduling of a fresh process that times itself (``fresh``)."""

    label: str
    procs: list = field(default_factory=list)
    threads: int | None = None
    pin: int | None = None
    skip: str | None = None
    fresh: str | None = None


def conditions(n: int, frames, folder: str, quick: bool = False) -> list[Cond]:
    """The first list (session 10): load anywhere, nothing pinned."""

    def busy_n(k: int) -> str:
        return f"{k} busy process{'' if k == 1 else 'es'}"

    busy, niced = (spin, (0,)), (spin, (19,))
    enc, enc_niced = (encode_loop, (0, frames, folder)), (encode_loop, (19, frames, folder))
    every = [
        Cond("idle"),
        Cond("torch threads 1", threads=1),
        Cond(busy_n(n // 2), [busy] * (n // 2)),
        Cond(busy_n(n), [busy] * n),
        Cond(f"{busy_n(n)} nice 19", [niced] * n),
        Cond(f"{busy_n(n)}, torch threads 1", [busy] * n, threads=1),
        Cond(f"2 encoder processes ({ENCODER_THREADS} threads each)", [enc] * 2),
        Cond("2 encoder processes nice 19", [enc_niced] * 2),
        Cond("2 encoder processes, torch threads 1", [enc] * 2, threads=1),
        Cond("idle again"),
    ]
    if quick:
        keep = {"idle", busy_n(n), f"2 encoder processes ({ENCODER_THREADS} threads each)", "idle again"}
        every = [c for c in every if c.label in keep]
    return every


def affinity_conditions(allowed, siblings, c: int, frames, folder: str) -> list[Cond]:
    """``--part affinity`` without its idle runs: pipeline pinned to ``c`` or not, busy
    processes and encoders on other cores or on ``c``'s SMT siblings too, CUDA scheduling."""
    sib = set(siblings.get(c, {c})) & set(allowed)
    off = sorted(set(allowed) - sib)  # not c, not its siblings
    off_c = sorted(set(allowed) - {c})  # not c (its siblings included)
    need = (
        None
        if off
        else f"skipped: needs {len(sib) + 1} cores (cpu {c} and its SMT "
        f"siblings are all of the {len(allowed)})"
    )
    no_smt = None if len(sib) > 1 else f"skipped: cpu {c} has no SMT sibling"
    busy_on = lambda cpus: [(spin, (0, {x})) for x in cpus]  # noqa: E731
    enc = lambda cpus: [(encode_loop, (0, frames, folder, cpus))] * 2  # noqa: E731
    away = f"off cpu {c}+siblings" if len(sib) > 1 else f"off cpu {c}"
    return [
        Cond(f"pipeline pinned to cpu {c}", pin=c),
        Cond(f"{len(off)} busy {away} (1 per cpu), pipeline free", busy_on(off), skip=need),
        Cond(f"{len(off)} busy {away}, pipeline on cpu {c}", busy_on(off), pin=c, skip=need),
        Cond(
            f"{len(off_c)} busy off cpu {c}, siblings too, pipeline on {c}",
            busy_on(off_c),
            pin=c,
            skip=no_smt,
        ),
        Cond("2 encoders free, pipeline free", enc(None)),
        Cond(f"2 encoders free, pipeline on cpu {c}", enc(None), pin=c),
        Cond(f"2 encoders {away}, pipeline on cpu {c}", enc(frozenset(off)), pin=c, skip=need),
        Cond(f"2 encoders {away}, pipeline free", enc(frozenset(off)), skip=need),
        *[Cond(f"fresh process, CUDA sched {name}", fresh=name) for name in CUDA_SCHED],
    ]


# -- what the launching thread went through -----------------------------------------------------
def thread_counters() -> tuple | None:
    """The calling thread's (ns on a CPU, ns runnable waiting for one, voluntary switches,
    involuntary switches, migrations or None); None where /proc cannot tell."""
    task = f"/proc/self/task/{threading.get_native_id()}"
    try:
        run, wait = (int(x) for x in open(f"{task}/schedstat").read().split()[:2])
        st = dict(line.split(":", 1) for line in open(f"{task}/status") if ":" in line)
        vol, invol = int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"])
    except (OSError, ValueError, KeyError):
        return None
    migr = None
    try:
        for line in open(f"{task}/sched"):
            if line.startswith("se.nr_migrations"):
                migr = int(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return run, wait, vol, invol, migr


def cpu_mhz(cpu: int | None) -> float | None:
    """``cpu``'s clock now (cpufreq, else /proc/cpuinfo); None if unknown."""
    if cpu is None:
        return None
    try:
        return int(open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").read()) / 1e3
    except (OSError, ValueError):
        pass
    return cpuinfo()[1].get(cpu)


def cpuinfo() -> tuple[str | None, dict[int, float]]:
    """``/proc/cpuinfo``'s model name and each CPU's clock now (MHz); what it cannot tell is
    left out."""
    model, mhz, proc = None, {}, None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("processor"):
                proc = int(line.split(":")[1])
            elif line.startswith("cpu MHz"):
                mhz[proc] = float(line.split(":")[1])
    except (OSError, ValueError):
        pass
    return model, mhz


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list (``"0-3,8,10-11"``) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def siblings_map(cpus, root: Path = Path("/sys/devices/system/cpu")) -> dict[int, frozenset[int]]:
    """Each CPU of ``cpus``'s SMT siblings, itself included (sysfs ``thread_siblings_list``;
    a CPU whose list cannot be read: itself alone)."""
    out = {}
    for c in cpus:
        try:
            sib = parse_cpu_list((root / f"cpu{c}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            sib = set()
        out[c] = frozenset(sib | {c})
    return out


def current_cpu() -> int | None:
    """The CPU the calling thread is running on now (field 39 of its ``/proc`` stat), None
    where that cannot be read."""
    try:
        text = Path(f"/proc/self/task/{threading.get_native_id()}/stat").read_text()
        return int(text.rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def topology_lines(allowed) -> list[str]:
    """The CPU topology as printed first."""
    sys_cpu = "/sys/devices/system/cpu"
    model, mhz = cpuinfo()
    present = _read(f"{sys_cpu}/present")
    lines = [
        f"cpu model: {model}; online {_read(f'{sys_cpu}/online')}, present {present}; "
        f"allowed here ({len(allowed)}): {','.join(map(str, sorted(allowed)))}"
    ]
    sib = siblings_map(allowed)
    groups = sorted({tuple(sorted(s)) for s in sib.values()})
    lines.append(
        f"SMT control {_read(f'{sys_cpu}/smt/control')}, active "
        f"{_read(f'{sys_cpu}/smt/active')}; sibling groups ({len(groups)}): "
        + " ".join(",".join(map(str, g)) for g in groups)
    )
    cores = []
    for c in sorted(allowed):
        core = _read(f"{sys_cpu}/cpu{c}/topology/core_id")
        pkg = _read(f"{sys_cpu}/cpu{c}/topology/physical_package_id")
        cores.append(f"{c}:{core}/{pkg}")
    lines.append("cpu:core_id/package " + " ".join(cores))
    nodes = sorted(glob.glob("/sys/devices/system/node/node[0-9]*"))
    lines.append(
        "NUMA nodes: " + (" ".join(f"{Path(n).name}={_read(n + '/cpulist')}" for n in nodes) or "none listed")
    )
    gov = _read(f"{sys_cpu}/cpu{min(allowed)}/cpufreq/scaling_governor")
    freqs = [mhz[c] for c in allowed if c in mhz]
    lines.append(
        "clocks (/proc/cpuinfo, idle): "
        + (
            f"{min(freqs):.0f}-{max(freqs):.0f} MHz, mean {statistics.mean(freqs):.0f}"
            if freqs
            else "unknown"
        )
        + f"; cpufreq governor {gov}, driver "
        f"{_read(f'{sys_cpu}/cpu{min(allowed)}/cpufreq/scaling_driver')}; "
        f"cpuidle {_read(f'{sys_cpu}/cpuidle/current_driver')} "
        f"(governor {_read(f'{sys_cpu}/cpuidle/current_governor_ro') or _read(f'{sys_cpu}/cpuidle/current_governor')})"
    )
    return lines


# -- CUDA scheduling flags ----------------------------------------------------------------------
def cudart_path() -> str | None:
    """The libcudart this process's torch loaded (its memory map), else the one bundled with
    torch's wheels; None if neither."""
    try:
        for line in open("/proc/self/maps"):
            p = line.split()[-1]
            if "/libcudart.so" in p:
                return p
    except OSError:
        pass
    import torch

    base = Path(torch.__file__).resolve().parent
    for pattern in (
        "lib/libcudart.so*",
        "../nvidia/cuda_runtime/lib/libcudart.so*",
        "../nvidia/*/lib/libcudart.so*",
    ):
        found = sorted(glob.glob(str(base / pattern)))
        if found:
            return found[0]
    return None


def _sched(flags: int) -> str:
    return _SCHED_NAMES.get(flags & 7, f"0x{flags & 7:x}")


def cuda_flags_text(index: int) -> str:
    """The scheduling flags of this process's CUDA context, as the runtime (cudaGetDeviceFlags)
    and the driver (cuDevicePrimaryCtxGetState) tell them."""
    out = []
    path = cudart_path()
    if path is None:
        out.append("runtime: libcudart not found")
    else:
        try:
            rt = ctypes.CDLL(path)
            v = ctypes.c_uint()
            err = rt.cudaGetDeviceFlags(ctypes.byref(v))
            out.append(
                f"runtime cudaGetDeviceFlags ({Path(path).name}): "
                + (f"0x{v.value:x} (schedule {_sched(v.value)})" if err == 0 else f"error {err}")
            )
        except (OSError, AttributeError) as e:
            out.append(f"runtime: {e}")
    try:
        drv = ctypes.CDLL("libcuda.so.1")
        dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        err = drv.cuDeviceGet(ctypes.byref(dev), index)
        if err == 0:
            err = drv.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
        out.append(
            "driver primary context: "
            + (
                f"flags 0x{flags.value:x} (schedule {_sched(flags.value)}), active {active.value}"
                if err == 0
                else f"error {err}"
            )
        )
    except (OSError, AttributeError) as e:
        out.append(f"driver: {e}")
    return "; ".join(out)


def set_cuda_flags(flag: int, index: int) -> str:
    """cudaSetDeviceFlags(``flag``) on the libcudart torch loaded, before torch makes its
    context; what was done, in words."""
    path = cudart_path()
    if path is None:
        return "libcudart not found (torch links it statically?): flags not set"
    try:
        rt = ctypes.CDLL(path)
        if index:
            rt.cudaSetDevice(index)
        err = rt.cudaSetDeviceFlags(ctypes.c_uint(flag))
    except (OSError, AttributeError) as e:
        return f"{Path(path).name}: {e}: flags not set"
    return f"cudaSetDeviceFlags(0x{flag:x}) on {path}: " + ("ok" if err == 0 else f"error {err}")


# -- timing -------------------------------------------------------------------------------------
class Bench:
    """The renderer loaded once under the backend, the jobs' sources decoded; :meth:`loop`
    times the render calls of one loop over the jobs."""

    def __init__(self, a):
        import torch

        from evalkit.formats.suite import load_suite
        from evalkit.render.backend import apply_backend, parse_spec
        from evalkit.render.driver import select_jobs
        from evalkit.render.renderers import get_renderer
        from evalkit.render.sources import SourceCache

        self.torch = torch
        self.suite = load_suite(a.suite)
        self.jobs = select_jobs(self.suite, a.jobs)
        self.spec = parse_spec(a.backend)
        self.renderer = get_renderer(a.renderer, {})
        with apply_backend(self.spec) as runtime:
            self.renderer.load(runtime)
        sources = SourceCache(self.suite)
        self.data = {}
        for job in self.jobs:
            frames, fps, path = sources.get(job.clip)
            self.data[job.clip] = (frames[: a.max_frames] if a.max_frames else frames, fps, path)
        sources.close()
        self.on_cuda = runtime.device.type == "cuda"
        self.index = (runtime.device.index or 0) if self.on_cuda else None

    def loop(self) -> tuple[float, list, set]:
        """Seconds in the render calls of one loop over the jobs, the launching thread's
        counters over them (:func:`thread_counters` summed; None when unknown) and the CPUs
        it was seen on after each call."""
        from evalkit.render.backend import apply_backend
        from evalkit.render.renderers import RenderRequest

        t, sums, cpus = 0.0, [0, 0, 0, 0, 0], set()
        with apply_backend(self.spec):
            for job in self.jobs:
                frames, fps, path = self.data[job.clip]
                c0 = thread_counters()
                t0 = time.perf_counter()
                self.renderer.render(RenderRequest(job, frames, fps, job.seed, path))
                if self.on_cuda:
                    self.torch.cuda.synchronize()
                t += time.perf_counter() - t0
                c1 = thread_counters()
                for i in range(5):
                    if sums[i] is not None:
                        sums[i] = (
                            None if c0 is None or c1 is None or c0[i] is None else sums[i] + c1[i] - c0[i]
                        )
                cpus.add(current_cpu())
        return t, sums, cpus - {None}

    def measure(self, repeats: int) -> dict:
        """``repeats`` loops: seconds, the counters' medians, the CPUs seen, the clock of the
        last one (sampled now, under the load)."""
        runs = [self.loop() for _ in range(repeats)]
        med = [
            None if any(r[1][i] is None for r in runs) else statistics.median(r[1][i] for r in runs)
            for i in range(5)
        ]
        cpus = set().union(*(r[2] for r in runs))
        return {"ts": [r[0] for r in runs], "counters": med, "cpus": cpus, "mhz": cpu_mhz(current_cpu())}


def result_line(label: str, m: dict, idle: float | None) -> str:
    ts = m["ts"]
    med = statistics.median(ts)
    ratio = f"x{med / idle:.2f}" if idle else "x1.00"
    run, wait, vol, invol, migr = m["counters"]
    extra = []
    if run is not None:
        extra.append(f"cpu {run / 1e9:.3f} s, wait {wait / 1e9:.3f} s, sw {vol:.0f}/{invol:.0f}")
    if migr is not None:
        extra.append(f"migr {migr:.0f}")
    cs = sorted(m["cpus"])
    extra.append(f"cpus {len(cs)}" + (f" ({','.join(map(str, cs))})" if len(cs) <= 4 else ""))
    if m["mhz"] is not None:
        extra.append(f"MHz {m['mhz']:.0f}")
    return f"{label:52s} pipeline {med:.3f} s {ratio}  ({', '.join(f'{t:.3f}' for t in ts)})  " + "; ".join(
        extra
    )


class LoadProcs:
    """The loading processes of a condition, started with ``spawn`` from this thread with the
    affinity ``full`` (each child then sets its own), killed and joined on exit."""

    def __init__(self, ctx, procs, full):
        self.ps = [ctx.Process(target=f, args=args, daemon=True) for f, args in procs]
        self.full = full

    def __enter__(self):
        if self.ps:
            os.sched_setaffinity(0, self.full)
        for p in self.ps:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self.ps:
            if p.pid is not None:
                p.kill()
        for p in self.ps:
            if p.pid is not None:
                p.join()


def fresh_child(conn, opts: dict, name: str) -> None:
    """A fresh process (``spawn``): the CUDA scheduling flag ``name`` (:data:`CUDA_SCHED`) set
    before torch's context is made, the renderer loaded, its calls timed idle and beside 2
    encoder processes; sends ``("ok", [lines], idle, encoders)`` or ``("error", text)``."""

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        import torch  # noqa: F401 - loads libcudart (no context yet)

        from evalkit.render.backend import parse_spec

        a = argparse.Namespace(**opts)
        flag = CUDA_SCHED[name]
        spec = parse_spec(a.backend)
        notes = []
        if flag is not None:
            if spec.device.startswith("cuda"):
                idx = int(spec.device.split(":")[1]) if ":" in spec.device else 0
                notes.append(set_cuda_flags(flag, idx))
            else:
                notes.append(f"backend {spec.spec}: no CUDA flag to set")
        bench = Bench(a)
        if bench.on_cuda:
            notes.append("read back after the renderer loaded: " + cuda_flags_text(bench.index))
        for _ in range(a.warmup):
            bench.loop()
        idle = bench.measure(a.repeats)
        ctx = mp.get_context("spawn")
        with tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
            first = bench.data[bench.jobs[0].clip][0]
            with LoadProcs(ctx, [(encode_loop, (0, first, folder))] * 2, os.sched_getaffinity(0)):
                time.sleep(a.settle)
                enc = bench.measure(a.repeats)
        conn.send(("ok", notes, idle, enc))
    except Exception as e:  # noqa: BLE001 - reported by the parent, the run goes on
        conn.send(("error", f"{type(e).__name__}: {e}"))


def run_fresh(ctx, a, name: str, full, say, idle: float | None) -> None:
    """Run :func:`fresh_child` for ``name`` and print its lines."""
    parent, child = ctx.Pipe(duplex=False)
    opts = dict(vars(a))
    os.sched_setaffinity(0, full)
    p = ctx.Process(target=fresh_child, args=(child, opts, name))  # not daemon: it has children
    p.start()
    child.close()
    try:
        msg = parent.recv() if parent.poll(a.fresh_timeout) else ("error", "timed out")
    except EOFError:
        msg = ("error", f"it died (exit code {p.join(5) or p.exitcode})")
    finally:
        if p.is_alive():
            p.terminate()  # SIGTERM: its encoders are killed on the way out
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    label = f"fresh process, CUDA sched {name}"
    if msg[0] != "ok":
        say(f"{label:52s} failed: {msg[1]}")
        return
    _, notes, m_idle, m_enc = msg
    for n in notes:
        say(f"  [{name}] {n}")
    say(result_line(f"{label}: idle", m_idle, idle))
    say(
        result_line(f"{label}: 2 encoders", m_enc, idle)
        + f"  (x{statistics.median(m_enc['ts']) / statistics.median(m_idle['ts']):.2f} of its idle)"
    )


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--backend",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="backend spec (default: cuda if available, else cpu)",
    )
    p.add_argument("--suite", default=str(ROOT / "datasets" / "canary" / "suite.yaml"))
    p.add_argument("--renderer", default="canary")
    p.add_argument("--jobs", nargs="*", default=None, help="job ids (default: all of the suite)")
    p.add_argument("--max-frames", type=int, default=0, help="cut each source to this many frames")
    p.add_argument("--repeats", type=int, default=3, help="loops of the jobs per condition (median)")
    p.add_argument("--warmup", type=int, default=2, help="loops before the first condition")
    p.add_argument(
        "--settle", type=float, default=1.0, help="seconds between starting the loading processes and timing"
    )
    p.add_argument(
        "--quick", action="store_true", help="idle, N busy, 2 encoders, idle again only (of the first list)"
    )
    p.add_argument(
        "--part",
        choices=("contention", "affinity", "all"),
        default="contention",
        help="contention: the first list (session 10); affinity: idle, pinning, "
        "CUDA scheduling, idle again; all: both",
    )
    p.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        help="the CPU the pipeline is pinned to (default: the one its thread is on after the warm-up)",
    )
    p.add_argument(
        "--fresh-timeout",
        type=float,
        default=600.0,
        help="seconds a fresh process may take (load, warm-up, both timings)",
    )
    p.add_argument("--out", type=Path, default=None, help="also write what is printed to this file")
    a = p.parse_args(argv)

    out = open(a.out, "w") if a.out else None

    def say(line: str) -> None:
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    full = os.sched_getaffinity(0)
    if a.pin_cpu is not None and a.pin_cpu not in full:
        p.error(
            f"--pin-cpu: cpu {a.pin_cpu} is not one this process may use ({','.join(map(str, sorted(full)))})"
        )
    if a.part != "contention":
        for line in topology_lines(full):
            say(line)
    bench = Bench(a)
    if a.part != "contention" and bench.on_cuda:
        props = torch.cuda.get_device_properties(bench.index)
        bus = None
        if getattr(props, "pci_bus_id", None) is not None:
            bus = (
                f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:"
                f"{getattr(props, 'pci_device_id', 0):02x}.0"
            )
        where = ""
        if bus:
            dev = f"/sys/bus/pci/devices/{bus}"
            where = (
                f", PCI {bus}, NUMA node {_read(dev + '/numa_node')}, local cpus "
                f"{_read(dev + '/local_cpulist')}"
            )
        say(f"gpu {bench.index}: {props.name}{where}; torch {torch.__version__}, CUDA {torch.version.cuda}")
        say("this process: " + cuda_flags_text(bench.index))

    def stop(signum, frame):
        raise SystemExit(128 + signum)  # so the loading processes are killed (finally)

    signal.signal(signal.SIGTERM, stop)
    for _ in range(a.warmup):
        bench.loop()
    n = len(full)
    ctx = mp.get_context("spawn")
    pin = a.pin_cpu if a.pin_cpu is not None else current_cpu()
    if pin is None or pin not in full:
        pin = min(full)
    say(
        f"bench_contention | suite {bench.suite.name}, {len(bench.jobs)} jobs, backend "
        f"{bench.spec.spec}, renderer {a.renderer} | cores {n}, torch threads "
        f"{torch.get_num_threads()} | "
        + (f"part {a.part}, pin cpu {pin} | " if a.part != "contention" else "")
        + f"median of {a.repeats} | "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    if a.part != "contention":
        say(
            "columns: median, ratio to the first idle, each loop; the launching thread in the "
            "calls (median per loop): cpu = on a CPU, wait = runnable waiting for one, sw = "
            "voluntary/involuntary switches, migr = CPU changes, cpus = seen on, MHz = its last "
            "CPU's clock under the load"
        )
    idle = None
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
        first = bench.data[bench.jobs[0].clip][0]
        todo = []
        if a.part in ("contention", "all"):
            todo += conditions(n, first, folder, a.quick)
        if a.part in ("affinity", "all"):
            new = affinity_conditions(full, siblings_map(full), pin, first, folder)
            if todo:  # before the first list's idle again
                todo[-1:-1] = new
            else:
                todo = [Cond("idle"), *new, Cond("idle again")]
        for cond in todo:
            if cond.skip:
                say(f"{cond.label:52s} {cond.skip}")
                continue
            if cond.fresh and CUDA_SCHED[cond.fresh] is not None and not bench.on_cuda:
                say(f"{cond.label:52s} skipped: backend {bench.spec.spec} is not CUDA")
                continue
            if cond.fresh:
                run_fresh(ctx, a, cond.fresh, full, say, idle)
                continue
            old = torch.get_num_threads()
            try:
                with LoadProcs(ctx, cond.procs, full):
                    if cond.pin is not None:
                        os.sched_setaffinity(0, {cond.pin})
                    if cond.threads:
                        torch.set_num_threads(cond.threads)
                    if cond.procs:
                        time.sleep(a.settle)
                    m = bench.measure(a.repeats)
            finally:
                torch.set_num_threads(old)
                os.sched_setaffinity(0, full)
            if idle is None:
                idle = statistics.median(m["ts"])
            say(
                result_line(cond.label, m, idle)
                if a.part != "contention"
                else f"{cond.label:44s} pipeline {statistics.median(m['ts']):.3f} s  "
                f"({', '.join(f'{t:.3f}' for t in m['ts'])})"
            )
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
