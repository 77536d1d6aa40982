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
    """What ran, in order, from every thread: ``(kind, name, "start" | "end")``."""

    def __init__(self):
        self.log: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def add(self, kind, name, when):
        with self._lock:
            self.log.append((kind, name, when))

    def wrap(self, kind, fn, name_of):
        def wrapped(*args, **kw):
            self.add(kind, name_of(*args, **kw), "start")
            try:
                return fn(*args, **kw)
            finally:
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
    run = tmp_path / "o" / "cpu"
    jobs = read_manifest(run)["jobs"]
    done = [j["id"] for j in jobs if j["status"] == "done"]
    assert done == [j["id"] for j in jobs[:2]]
    assert all(j["status"] == "pending" for j in jobs[2:])
    assert sorted(p.name for p in (run / "clips").iterdir()) == sorted(f"{i}.mkv" for i in done)
    assert sorted(p.name for p in (run / "preview").iterdir()) == sorted(f"{i}.mp4" for i in done)
    assert not list(run.rglob(".tmp-*"))
    again = render(suite, tmp_path / "o", "batch", monkeypatch, Interrupt(at="none"))
    assert (again.done, again.skipped, again.failed) == (4, 2, 0)
    whole = render(suite, tmp_path / "w", "overlap", monkeypatch, Interrupt(at="none"))
    assert_same_run(run, whole.path)


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
    """Unset: ``overlap`` on the CPU, ``auto`` on a device; a value set wins either way."""
    monkeypatch.delenv("EVALKIT_RENDER_WRITES", raising=False)
    assert writes_mode() == "overlap" and writes_mode(on_device=True) == "auto"
    for mode in ("overlap", "batch", "auto"):
        monkeypatch.setenv("EVALKIT_RENDER_WRITES", mode)
        assert writes_mode() == mode == writes_mode(on_device=True)
    monkeypatch.setenv("EVALKIT_RENDER_WRITES", "later")
    with pytest.raises(UserError, match=r"^EVALKIT_RENDER_WRITES: expected one of overlap, "
                                        r"batch, auto, found 'later'$"):
        writes_mode()


def test_bench_render_compares_overlap_and_batch_on_a_fake_gpu(tmp_path):
    """The benchmark's smoke run on the CPU: one harness run per --writes value a repeat."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRADIO_ANALYTICS_ENABLED="False")
    env.pop("EVALKIT_RENDER_WRITES", None)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_render.py"),
                        "--suite", str(DATASETS / "smoke" / "suite.yaml"), "--fake-gpu", "0.02",
                        "--fake-python", "0.002", "--repeats", "1", "--no-progress",
                        "--writes", "overlap", "batch", "--writer-processes", "0"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in ("writes overlap, writers: threads (0)", "writes batch, writers: threads (0)"):
        assert f"{name}: median" in r.stdout and f"  {name}: " in r.stderr
    assert r.stdout.count("harness overhead:") == 2
