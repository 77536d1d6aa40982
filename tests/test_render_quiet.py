"""Quiet phases (``EVALKIT_RENDER_WRITES=batch``, evalkit.render.quiet): the same run folder as
an overlapping render, windows bounded by bytes and time, nothing decoded or written while a
pipeline call runs, an interrupt mid-window leaves only recorded jobs, and the benchmark's
``--writes`` switch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from evalkit import video
from evalkit.errors import UserError
from evalkit.formats.run import read_manifest, sha256_file
from evalkit.render import quiet
from evalkit.render.driver import render_suite
from evalkit.render.quiet import Windows, writes_mode
from evalkit.testing.renderers import Invert

from conftest import DATASETS

ROOT = Path(__file__).resolve().parents[1]
CLIPS = DATASETS / "smoke" / "clips"
#: bytes of one smoke clip's frames (8 frames of 64x64 RGB), as of each job's result
CLIP_BYTES = 8 * 64 * 64 * 3
#: the jobs' clips, in suite order (jobs grouped by clip or not: both occur)
ORDER = ["pan", "pan", "hub", "pan", "hub", "hub"]


def two_clip_suite(tmp_path: Path, prompts=None) -> Path:
    prompts = prompts or [f"p{i}" for i in range(len(ORDER))]
    jobs = "\n".join(f"  - {{clip: {c}, prompt: {p}, seed: {i}}}"
                     for i, (c, p) in enumerate(zip(ORDER, prompts)))
    path = tmp_path / "suite.yaml"
    path.write_text(textwrap.dedent(f"""\
        schema_version: 1
        name: q
        clips:
          - {{id: pan, path: {CLIPS / 'astronaut_pan.mkv'}}}
          - {{id: hub, path: {CLIPS / 'hubble_object.mkv'}}}
        jobs:
        """) + jobs + "\n")
    return path


def render(suite, out, mode, monkeypatch, renderer=None, **kw):
    monkeypatch.setenv("EVALKIT_RENDER_WRITES", mode)
    [s] = render_suite(suite, ["cpu"], out, renderer=renderer or Invert(), progress=False, **kw)
    return s


def records(run: Path) -> list[dict]:
    """The manifest's job records without their timings."""
    return [{k: v for k, v in j.items() if k not in ("timing", "finished", "started")}
            for j in read_manifest(run)["jobs"]]


def assert_same_run(a: Path, b: Path) -> None:
    assert records(a) == records(b)
    for j in read_manifest(a)["jobs"]:
        if j["status"] != "done":
            continue
        assert sha256_file(a / j["output"]["path"]) == sha256_file(b / j["output"]["path"])
        assert np.array_equal(video.read_frames(a / j["preview"])[0],
                              video.read_frames(b / j["preview"])[0])
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())


@pytest.mark.parametrize("processes", ["0", "1"])
def test_batch_writes_the_run_folder_an_overlapping_render_writes(processes, tmp_path,
                                                                 monkeypatch):
    """Several windows (a byte budget of about two jobs), a failed job among them, writers
    on threads or in processes: the same records, clips, previews and files."""
    suite = two_clip_suite(tmp_path, prompts=["a", "b", "bad", "c", "d", "e"])
    monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", processes)
    monkeypatch.setattr(quiet, "held_budget", lambda: int(4.5 * CLIP_BYTES))
    a = render(suite, tmp_path / "a", "overlap", monkeypatch, Invert(bad="raise"))
    b = render(suite, tmp_path / "b", "batch", monkeypatch, Invert(bad="raise"))
    assert (a.done, a.failed) == (b.done, b.failed) == (5, 1)
    assert a.failures == b.failures
    assert_same_run(a.path, b.path)


def test_an_executor_that_renders_job_by_job_still_gets_every_job_written(tmp_path,
                                                                          monkeypatch):
    """An executor that calls ``render_job`` itself (as bench_diffusers' does), in batch mode:
    each result is written when handed over (nothing held without windows), the same folder."""
    from evalkit.render.backend import apply_backend
    from evalkit.render.driver import LocalExecutor

    class JobByJob(LocalExecutor):
        def run(self, rend, task, sources, progress):
            with apply_backend(task.spec) as runtime:
                rend.load(runtime)
                for job in task.jobs:
                    assert sources.held == []
                    yield self.render_job(rend, runtime, job, sources, task.seed_offset,
                                          progress)

    suite = two_clip_suite(tmp_path)
    a = render(suite, tmp_path / "a", "overlap", monkeypatch)
    b = render(suite, tmp_path / "b", "batch", monkeypatch, executor=JobByJob())
    assert (b.done, b.failed) == (6, 0)
    assert_same_run(a.path, b.path)


class Events:
    """What ran, in order, from every thread: ``(kind, name, "start" | "end")``. A gate holds
    the end of what it matches until the log shows something else (a handshake that proves two
    things overlapped; a gate that waits in vain, 5 s, is listed in ``timeouts``)."""

    def __init__(self):
        self.log: list[tuple[str, str, str]] = []
        self._cond = threading.Condition()
        #: (kind, does the name match, is the log ready): the end of a match waits for ready
        self.gates: list[tuple[str, Callable, Callable]] = []
        self.timeouts: list[tuple[str, str]] = []

    def add(self, kind, name, when):
        with self._cond:
            self.log.append((kind, name, when))
            self._cond.notify_all()

    def gate(self, kind, name):
        for k, match, ready in self.gates:
            if k == kind and match(name):
                with self._cond:
                    if not self._cond.wait_for(lambda: ready(self.log), timeout=5):
                        self.timeouts.append((kind, name))

    def wrap(self, kind, fn, name_of):
        def wrapped(*args, **kw):
            self.add(kind, name_of(*args, **kw), "start")
            try:
                return fn(*args, **kw)
            finally:
                self.gate(kind, name_of(*args, **kw))
                self.add(kind, name_of(*args, **kw), "end")
        return wrapped

    def windows(self) -> list[list[str]]:
        """The pipeline calls, grouped: calls with nothing else in between form one window."""
        out, last_end = [], False
        for kind, name, when in self.log:
            if kind == "call" and when == "start":
                if not last_end:
                    out.append([])
                out[-1].append(name)
            last_end = kind == "call" and when == "end"
        return out


@pytest.fixture
def events(monkeypatch):
    """Every source decoded, clip and preview written and pipeline call, logged."""
    from evalkit.render import clipwriter

    ev = Events()
    monkeypatch.setattr(quiet.QuietSources, "_decode",
                        ev.wrap("decode", quiet.QuietSources._decode, lambda s, c, t: c))
    monkeypatch.setattr(clipwriter.ClipWriter, "write", ev.wrap(
        "write", clipwriter.ClipWriter.write, lambda s, path, *a: Path(path).stem))
    monkeypatch.setattr(video, "write_browser", ev.wrap(
        "write", video.write_browser, lambda path, *a: Path(path).stem + ".preview"))

    class Logged(Invert):
        def render(self, request):
            ev.add("call", request.job.prompt, "start")
            try:
                return super().render(request)
            finally:
                ev.gate("call", request.job.prompt)
                ev.add("call", request.job.prompt, "end")

    ev.renderer = Logged
    return ev


def check_quiet(ev: Events, jobs: list[str]) -> None:
    """Nothing starts or ends during a call; each call's source was decoded before it, and its
    job's clip and preview (once each) are written after it."""
    log = ev.log
    for i, (kind, name, when) in enumerate(log):
        if kind == "call" and when == "start":
            assert log[i + 1] == ("call", name, "end"), log[i:i + 3]
            clip = ORDER[int(name[1:])]
            assert ("decode", clip, "end") in log[:i]
            mine = [n for k, n, w in log if k == "write" and w == "start" and f"-{name}-" in n]
            assert len(mine) == 2 and log.index(("write", mine[0], "start")) > i
    assert [n for k, n, w in log if k == "call" and w == "start"] == jobs
    writes = [n for k, n, w in log if k == "write" and w == "start"]
    assert len(writes) == len(set(writes)) == 2 * len(jobs)


def test_windows_split_by_the_byte_budget_and_run_quietly(tmp_path, monkeypatch, events):
    """A budget of 4.5 clips (a job: its source once, its result about as big): windows of
    2 jobs; every window's sources decoded before its first call, its files written after its
    last, the next window's sources decoded in the same burst; each clip decoded once per
    window that needs it."""
    suite = two_clip_suite(tmp_path)
    monkeypatch.setattr(quiet, "held_budget", lambda: int(4.5 * CLIP_BYTES))
    s = render(suite, tmp_path / "o", "batch", monkeypatch, events.renderer())
    assert (s.done, s.failed) == (6, 0)
    jobs = [f"p{i}" for i in range(6)]
    assert events.windows() == [jobs[0:2], jobs[2:4], jobs[4:6]]
    check_quiet(events, jobs)
    log = events.log
    first_call = log.index(("call", "p0", "start"))
    # window 1 (pan, pan): pan decoded before it; window 2 (hub, pan): hub; pan kept at hand
    assert [n for k, n, w in log[:first_call] if k == "decode" and w == "end"] == ["pan"]
    burst1 = log[log.index(("call", "p1", "end")):log.index(("call", "p2", "start"))]
    assert {n for k, n, w in burst1 if k == "decode"} == {"hub"}
    written = [n for k, n, w in burst1 if k == "write" and w == "end"]
    assert len(written) == 4                 # both jobs' clips and previews, in that burst
    burst2 = log[log.index(("call", "p3", "end")):log.index(("call", "p4", "start"))]
    assert {n for k, n, w in burst2 if k == "decode"} == set()     # hub at hand already
    tail = log[log.index(("call", "p5", "end")):]
    assert len([1 for k, n, w in tail if k == "write" and w == "end"]) == 4
    run = read_manifest(s.path)
    assert [j["status"] for j in run["jobs"]] == ["done"] * 6


def test_windows_split_by_held_time(tmp_path, monkeypatch, events):
    """No byte limit: with BATCH_SECONDS below any call's time each job is a window of its own
    (render, write, next); with a first window of 4 jobs and all the time in the world, the
    rest are one window."""
    suite = two_clip_suite(tmp_path)
    jobs = [f"p{i}" for i in range(6)]
    monkeypatch.setattr(quiet, "BATCH_SECONDS", 1e-9)
    render(suite, tmp_path / "a", "batch", monkeypatch, events.renderer(sleep=0.001))
    assert events.windows() == [[j] for j in jobs]
    check_quiet(events, jobs)
    events.log.clear()
    monkeypatch.setattr(quiet, "BATCH_SECONDS", 1e9)
    monkeypatch.setattr(quiet, "FIRST_WINDOW_JOBS", 4)
    render(suite, tmp_path / "b", "batch", monkeypatch, events.renderer())
    assert events.windows() == [jobs[:4], jobs[4:]]
    check_quiet(events, jobs)


def test_the_window_planner_from_given_sizes_and_times():
    """The first window: up to ``first`` jobs within the budget; then BATCH_SECONDS over the
    mean call time; results larger than their sources count as measured; a window is full at
    its time or bytes."""
    mb = 2**20
    sizes = {"a": mb, "b": 2 * mb}
    w = Windows(budget=10 * mb, seconds=10.0, first=3)
    assert w.size(["a"] * 8, sizes.get) == 3                  # 2+1+1 MB: the job limit
    assert w.size(["a", "b", "b", "a"], sizes.get) == 3       # 2, +4, +2 = 8; +1 = 9 but limit
    assert w.size(["b", "a", "b", "a"], sizes.get) == 3       # 4, +2 = 6, +2 = 8
    assert w.size(["b"] * 3, lambda c: 20 * mb) == 1          # too big alone: one job anyway
    for seconds in (2.0, 3.0):                                # mean 2.5 s: 4 jobs a window
        w.ran(seconds, mb, mb)
    assert w.jobs_limit() == 4 and w.size(["a"] * 8, sizes.get) == 4
    w.ran(4.0, 7 * mb, mb)                                    # results 3x their sources now
    assert w.ratio == 3.0 and w.jobs_limit() == 3
    assert w.size(["a"] * 8, sizes.get) == 3                  # 1+3, +3 = 7, +3 = 10
    assert w.size(["b"] * 8, sizes.get) == 1                  # 2+6 = 8, +6 > 10
    w.ran(100.0, mb, mb)
    assert w.jobs_limit() == 1
    assert w.full(10.0, 0) and w.full(0.0, 10 * mb, 1) and not w.full(9.9, 10 * mb)


class Interrupt(Invert):
    """Ctrl-C while rendering the job with prompt ``at``."""

    options_help = {**Invert.options_help, "at": "the prompt whose call is interrupted"}

    def render(self, request):
        if request.job.prompt == self.options.get("at"):
            raise KeyboardInterrupt
        return super().render(request)


def test_ctrl_c_mid_window_keeps_the_recorded_jobs_and_a_resume_completes(tmp_path,
                                                                         monkeypatch):
    """Windows of two jobs, Ctrl-C in the second job of the second window: the first window's
    jobs are done (written in the burst before), the held one and the rest are not, no file of
    theirs, no temporary file; a resumed render does the rest, identical to an uninterrupted
    render."""
    suite = two_clip_suite(tmp_path)
    monkeypatch.setattr(quiet, "held_budget", lambda: int(4.5 * CLIP_BYTES))
    with pytest.raises(KeyboardInterrupt):
        render(suite, tmp_path / "o", "batch", monkeypatch, Interrupt(at="p3"))
    assert_interrupted_then_resumed(suite, tmp_path, "batch", 2, monkeypatch)


def test_a_broken_source_ends_the_window_before_its_job_and_fails_as_without_windows(
        tmp_path, monkeypatch):
    """The third job's clip does not decode: the jobs before it are written and recorded,
    then the render fails with the clip's one-line error, as in an overlapping render."""
    suite = two_clip_suite(tmp_path)
    bad = tmp_path / "broken.mkv"
    bad.write_bytes(b"not a video")
    suite.write_text(suite.read_text().replace(str(CLIPS / "hubble_object.mkv"), str(bad)))
    for mode in ("overlap", "batch"):
        with pytest.raises(Exception) as e:
            render(suite, tmp_path / mode, "batch" if mode == "batch" else "overlap",
                   monkeypatch)
        assert "broken.mkv" in str(e.value) and "\n" not in str(e.value)
    jobs = read_manifest(tmp_path / "batch" / "cpu")["jobs"]
    assert [j["status"] for j in jobs] == ["done", "done"] + ["pending"] * 4


def test_the_switch(monkeypatch):
    """Unset: ``overlap`` on the CPU; on a device :data:`quiet.DEVICE_DEFAULT` (``overlap``)
    with PyAV's writers, :data:`quiet.PROGRAMS_DEVICE_DEFAULT` (``auto``) with FFmpeg
    programs; a value set wins either way."""
    monkeypatch.delenv("EVALKIT_RENDER_WRITES", raising=False)
    assert writes_mode() == "overlap" == writes_mode(on_device=True) == quiet.DEVICE_DEFAULT
    assert writes_mode(programs=True) == "overlap"
    assert writes_mode(True, programs=True) == "auto" == quiet.PROGRAMS_DEVICE_DEFAULT
    monkeypatch.setattr(quiet, "DEVICE_DEFAULT", "auto")
    assert writes_mode() == "overlap" and writes_mode(on_device=True) == "auto"
    for mode in ("overlap", "batch", "auto"):
        monkeypatch.setenv("EVALKIT_RENDER_WRITES", mode)
        assert writes_mode() == mode == writes_mode(on_device=True) == writes_mode(True, True)
    monkeypatch.setenv("EVALKIT_RENDER_WRITES", "later")
    with pytest.raises(UserError, match=r"^EVALKIT_RENDER_WRITES: expected one of overlap, "
                                        r"batch, auto, found 'later'$"):
        writes_mode()


@pytest.mark.slow  # the render benchmark's three modes
def test_bench_render_compares_overlap_batch_and_auto_on_a_fake_gpu(tmp_path):
    """The benchmark's smoke run on the CPU: one harness run per --writes value a repeat."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRADIO_ANALYTICS_ENABLED="False")
    env.pop("EVALKIT_RENDER_WRITES", None)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_render.py"),
                        "--suite", str(DATASETS / "smoke" / "suite.yaml"), "--fake-gpu", "0.02",
                        "--fake-python", "0.002", "--repeats", "1", "--no-progress",
                        "--writes", "overlap", "batch", "auto", "--writer-processes", "0"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    for mode in ("overlap", "batch", "auto"):
        name = f"writes {mode}, writers: threads (0)"
        assert f"{name}: median" in r.stdout and f"  {name}: " in r.stderr
    assert r.stdout.count("harness overhead:") == 3


# -- auto: batch while the calls are short, overlap once they are long ---------------------------
SHORT, LONG = 0.01, 5.0         # injected call times (seconds), against LONG_CALL_SECONDS = 2


def call_times(monkeypatch, seconds: Callable[[str], float]) -> None:
    """Each job's call time as the windows see it: ``seconds(prompt)`` (its timing only; the
    calls themselves take what they take)."""
    from evalkit.render.driver import LocalExecutor

    real = LocalExecutor.render_job

    def render_job(*args, **kw):
        result = real(*args, **kw)
        result.timing["seconds"] = seconds(result.job.prompt)
        return result

    monkeypatch.setattr(LocalExecutor, "render_job", staticmethod(render_job))


def of(prompt: str) -> Callable[[str], bool]:
    """Matches a call's name (the prompt) or a write's (the job id holds the prompt)."""
    return lambda name: name == prompt or f"-{prompt}-" in name


def ended(kind: str, prompt: str, count: int = 1) -> Callable[[list], bool]:
    return lambda log: sum(1 for k, n, w in log
                           if k == kind and w == "end" and of(prompt)(n)) >= count


def started(kind: str, prompt: str) -> Callable[[list], bool]:
    return lambda log: any(k == kind and w == "start" and of(prompt)(n) for k, n, w in log)


def overlapped(ev: Events, written: str, call: str) -> None:
    """Gates: the writes of job ``written`` end only once the call of ``call`` has started, and
    that call ends only once both have ended (so they ran at the same time, or time out)."""
    ev.gates.append(("write", of(written), started("call", call)))
    ev.gates.append(("call", of(call), ended("write", written, 2)))


def quiet_between(log, first: str, last: str) -> None:
    """Nothing but calls from the start of ``first``'s call to the end of ``last``'s."""
    span = log[log.index(("call", first, "start")):log.index(("call", last, "end")) + 1]
    assert {k for k, n, w in span} == {"call"}, span


@pytest.mark.parametrize("calls", ["short", "long", "switch", "warm-up"])
def test_auto_writes_the_run_folder_an_overlapping_render_writes(calls, tmp_path, monkeypatch):
    """Short calls (windows of two jobs by bytes), long ones, short then long, a slow first
    call then short ones: a failed job among them; the same records, clips, previews and files
    as ``overlap``."""
    suite = two_clip_suite(tmp_path, prompts=["a", "b", "bad", "c", "d", "e"])
    monkeypatch.setattr(quiet, "held_budget", lambda: int(4.5 * CLIP_BYTES))
    times = {"short": lambda p: SHORT, "long": lambda p: LONG,
             "switch": lambda p: SHORT if p in ("a", "b") else LONG,
             "warm-up": lambda p: 4.0 if p == "a" else SHORT}[calls]
    call_times(monkeypatch, times)
    a = render(suite, tmp_path / "a", "overlap", monkeypatch, Invert(bad="raise"))
    b = render(suite, tmp_path / "b", "auto", monkeypatch, Invert(bad="raise"))
    assert (a.done, a.failed) == (b.done, b.failed) == (5, 1)
    assert a.failures == b.failures
    assert_same_run(a.path, b.path)


def test_auto_with_short_calls_runs_as_batch(tmp_path, monkeypatch, events):
    """Short calls: the first job alone (its time decides), then the windows of ``batch`` (two
    jobs by bytes), nothing decoded or written during a call."""
    suite = two_clip_suite(tmp_path)
    monkeypatch.setattr(quiet, "held_budget", lambda: int(4.5 * CLIP_BYTES))
    call_times(monkeypatch, lambda p: SHORT)
    s = render(suite, tmp_path / "o", "auto", monkeypatch, events.renderer())
    assert (s.done, s.failed) == (6, 0)
    jobs = [f"p{i}" for i in range(6)]
    assert events.windows() == [jobs[0:1], jobs[1:3], jobs[3:5], jobs[5:6]]
    check_quiet(events, jobs)


def test_auto_with_long_calls_writes_each_job_while_the_next_renders(tmp_path, monkeypatch,
                                                                     events):
    """Long calls: the first job alone, quiet, only its source decoded before it; from then on
    the writes of job k run during the call of job k + 1 (a handshake: neither ends before the
    other has started), one job's writes at a time, the last job's after its call; the next
    job's source decoded during the call before it (another handshake), each once; every job
    done, each file written once."""
    suite = two_clip_suite(tmp_path)
    call_times(monkeypatch, lambda p: LONG)
    for k in range(5):
        overlapped(events, f"p{k}", f"p{k + 1}")
    # pan (p0, p1), hub (p2): hub decoded during p1; then each next source is at hand
    events.gates.append(("decode", lambda n: n == "hub", started("call", "p1")))
    events.gates.append(("call", of("p1"), ended("decode", "hub")))
    s = render(suite, tmp_path / "o", "auto", monkeypatch, events.renderer())
    assert events.timeouts == []
    assert (s.done, s.failed) == (6, 0)
    log = events.log
    first = log.index(("call", "p0", "start"))
    assert [n for k, n, w in log[:first] if k == "decode"] == ["pan", "pan"]   # start, end
    quiet_between(log, "p0", "p0")
    assert [n for k, n, w in log if k == "decode" and w == "start"] == ["pan", "hub"]
    for k in range(1, 6):     # job k-1's writes start after call k-1, job k-2's before call k
        start = log.index(("call", f"p{k}", "start"))
        assert started("write", f"p{k - 2}")(log[:start]) if k > 1 else True
        assert not started("write", f"p{k - 1}")(log[:log.index(("call", f"p{k - 1}", "end"))])
        assert not started("write", f"p{k}")(log[:log.index(("call", f"p{k}", "end"))])
    tail = log[log.index(("call", "p5", "end")):]
    assert ended("write", "p5", 2)(tail) and not started("write", "p4")(tail)
    writes = [n for k, n, w in log if k == "write" and w == "start"]
    assert len(writes) == len(set(writes)) == 12
    assert [j["status"] for j in read_manifest(s.path)["jobs"]] == ["done"] * 6


def test_a_switch_from_short_to_long_calls_mid_window_loses_nothing(tmp_path, monkeypatch,
                                                                    events):
    """Two short jobs (p0 alone, then a window planned for the other five, no limit on its
    time), then long ones: the window ends once the mean reaches LONG_CALL_SECONDS (after p3:
    2.5 s), its three jobs written in the background during p4, p4's during p5; the same
    folder as ``overlap``."""
    suite = two_clip_suite(tmp_path)
    monkeypatch.setattr(quiet, "BATCH_SECONDS", 1e9)
    call_times(monkeypatch, lambda p: SHORT if p in ("p0", "p1") else LONG)
    for k in (1, 2, 3):
        overlapped(events, f"p{k}", "p4")
    overlapped(events, "p4", "p5")
    s = render(suite, tmp_path / "o", "auto", monkeypatch, events.renderer())
    assert events.timeouts == []
    assert (s.done, s.failed) == (6, 0)
    log = events.log
    quiet_between(log, "p0", "p0")
    quiet_between(log, "p1", "p3")
    burst = log[log.index(("call", "p0", "end")):log.index(("call", "p1", "start"))]
    assert ended("write", "p0", 2)(burst)
    assert {n for k, n, w in burst if k == "decode"} == {"hub"}
    writes = [n for k, n, w in log if k == "write" and w == "start"]
    assert len(writes) == len(set(writes)) == 12
    whole = render(suite, tmp_path / "w", "overlap", monkeypatch)
    assert_same_run(s.path, whole.path)


def test_after_a_slow_first_call_the_windows_come_back(tmp_path, monkeypatch, events):
    """A first call of 4 s (a warm-up), then short ones: p1 and p2 run as overlap (the mean
    still at 2 s or more before each), then the mean is 1.34 s: the rest is one quiet window;
    nothing lost."""
    suite = two_clip_suite(tmp_path)
    call_times(monkeypatch, lambda p: 4.0 if p == "p0" else SHORT)
    overlapped(events, "p1", "p2")
    s = render(suite, tmp_path / "o", "auto", monkeypatch, events.renderer())
    assert events.timeouts == []
    assert (s.done, s.failed) == (6, 0)
    log = events.log
    quiet_between(log, "p3", "p5")
    burst = log[log.index(("call", "p2", "end")):log.index(("call", "p3", "start"))]
    assert ended("write", "p2", 2)(burst)       # the window's burst writes what was held
    writes = [n for k, n, w in log if k == "write" and w == "start"]
    assert len(writes) == len(set(writes)) == 12
    whole = render(suite, tmp_path / "w", "overlap", monkeypatch)
    assert_same_run(s.path, whole.path)


def test_ctrl_c_with_long_calls_keeps_the_recorded_jobs_and_a_resume_completes(tmp_path,
                                                                              monkeypatch):
    """Long calls, Ctrl-C in p3's call: p0-p2 are done (p2's background writes finish first),
    the rest pending, no file of theirs, no temporary file; a resumed render completes,
    identical to an uninterrupted one."""
    suite = two_clip_suite(tmp_path)
    call_times(monkeypatch, lambda p: LONG)
    with pytest.raises(KeyboardInterrupt):
        render(suite, tmp_path / "o", "auto", monkeypatch, Interrupt(at="p3"))
    assert_interrupted_then_resumed(suite, tmp_path, "auto", 3, monkeypatch)


@pytest.mark.parametrize("device", [False, True])
def test_unset_a_device_render_runs_the_device_default(device, tmp_path, monkeypatch):
    """``$EVALKIT_RENDER_WRITES`` unset: a render on a device (here pretended, as bench_render's
    fake GPU does) gets the device default, here set to ``auto`` (quiet sources), a CPU render
    the overlapping sources."""
    from evalkit.render import driver

    monkeypatch.setattr(quiet, "DEVICE_DEFAULT", "auto")

    made = []

    class Spy(quiet.QuietSources):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self.windows.long_seconds)

    monkeypatch.setattr(driver, "QuietSources", Spy)
    if device:
        monkeypatch.setattr(driver, "on_device", lambda runs: True)
    monkeypatch.delenv("EVALKIT_RENDER_WRITES", raising=False)
    [s] = render_suite(two_clip_suite(tmp_path), ["cpu"], tmp_path / "o", renderer=Invert(),
                       progress=False)
    assert (s.done, s.failed) == (6, 0)
    assert made == ([quiet.LONG_CALL_SECONDS] if device else [])


def test_on_device():
    from evalkit.render.backend import parse_spec
    from evalkit.render.driver import BackendTask
    from evalkit.render.procwrite import on_device

    def task(spec, apply=True):
        return BackendTask(parse_spec(spec), [], apply=apply)

    assert not on_device([task("cpu"), task("cpu,dtype=bf16")])
    assert on_device([task("cpu"), task("cuda:1,dtype=bf16")])
    assert not on_device([task("cuda", apply=False)])       # adopted: recorded, not applied


def assert_interrupted_then_resumed(suite, tmp_path, mode, recorded, monkeypatch):
    """After a render into ``tmp_path/o`` was interrupted: exactly its first ``recorded`` jobs
    are done, with their files and no others, no temporary file; resuming in ``mode`` renders
    the rest, and the folder is then the one an uninterrupted overlapping render writes."""
    run = tmp_path / "o" / "cpu"
    jobs = read_manifest(run)["jobs"]
    done = [j["id"] for j in jobs if j["status"] == "done"]
    assert done == [j["id"] for j in jobs[:recorded]]
    assert all(j["status"] == "pending" for j in jobs[recorded:])
    assert sorted(p.name for p in (run / "clips").iterdir()) == sorted(f"{i}.mkv" for i in done)
    assert sorted(p.name for p in (run / "preview").iterdir()) == sorted(f"{i}.mp4" for i in done)
    assert not list(run.rglob(".tmp-*"))
    again = render(suite, tmp_path / "o", mode, monkeypatch, Interrupt(at="none"))
    assert (again.done, again.skipped, again.failed) == (len(jobs) - recorded, recorded, 0)
    whole = render(suite, tmp_path / "w", "overlap", monkeypatch, Interrupt(at="none"))
    assert_same_run(run, whole.path)
