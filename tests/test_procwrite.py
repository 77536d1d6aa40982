"""A render's writers in worker processes (evalkit.render.procwrite): the writer threads' bytes
and errors, a killed writer fails only its job, memory bounded, nothing left behind (Ctrl-C,
a killed parent), and the fallback to threads when /dev/shm is full."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from evalkit.errors import UserError
from evalkit.formats.run import RunDir
from evalkit.render import driver
from evalkit.render.driver import WRITE_AHEAD, render_suite
from evalkit.render.procwrite import WriterPool, use_processes
from evalkit.testing.renderers import Invert
from evalkit.testing.suites import write_suite

from conftest import DATASETS

ROOT = Path(__file__).resolve().parents[1]
SMOKE = DATASETS / "smoke" / "suite.yaml"
PAN = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
INVERT = "evalkit.testing.renderers:Invert"


@pytest.fixture
def pools(monkeypatch):
    """The writer pools the driver makes, kept for the test to look at."""
    made = []

    class Seen(WriterPool):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(driver, "WriterPool", Seen)
    return made


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")     # a zombie: ended, reaped later
    except (FileNotFoundError, ProcessLookupError):
        return True


def _shm_left(names) -> list[str]:
    return [n for n in names if os.path.exists(f"/dev/shm/{n}")]


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.suffix in (".mkv", ".nut", ".mp4")}


@pytest.mark.parametrize("codec", ["ffv1", "utvideo"])
def test_writer_processes_write_the_writer_threads_bytes(codec, tmp_path, monkeypatch, pools):
    """4 jobs (more than WRITE_AHEAD), the lossless clips in 2 parts at once (FFV1) as with
    many cores: the same files and sha256 as the threads' render, at most WRITE_AHEAD jobs'
    frames in shared memory, no worker or segment left."""
    suite = write_suite(tmp_path, PAN, prompts=("a", "b", "c", "d"))
    if codec == "ffv1":
        monkeypatch.setattr(driver, "clip_parts", lambda: 2)       # 8 frames: 2 parts of 4
    runs = {}
    for value in ("0", "1"):
        monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", value)
        [s] = render_suite(suite, ["cpu"], tmp_path / value, renderer=INVERT, progress=False,
                           lossless=codec)
        assert (s.done, s.failed) == (4, 0)
        runs[value] = s.path
    [pool] = pools                                  # threads: no pool
    assert pool.parts == (2 if codec == "ffv1" else 1) and len(pool.made) == 4
    assert 1 <= pool.peak_segments <= WRITE_AHEAD
    assert pool.workers == 0 and not _shm_left(pool.made)
    threads, procs = _files(runs["0"]), _files(runs["1"])
    assert len(threads) == 8 and threads == procs
    for a, b in zip(RunDir.open(runs["0"]).jobs, RunDir.open(runs["1"]).jobs):
        assert a["output"]["sha256"] == b["output"]["sha256"]


def test_a_writers_error_is_the_jobs_error_as_on_threads(tmp_path, monkeypatch):
    """A clip that cannot be put in place (a folder has its name): the job fails with the
    same one line as on the writer threads, the other job is done."""
    from evalkit.formats.suite import load_suite

    errors = {}
    jid = load_suite(SMOKE).jobs[1].id
    for value in ("1", "0"):
        out = tmp_path / value
        (out / "cpu" / "clips" / f"{jid}.mkv").mkdir(parents=True)
        monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", value)
        [s] = render_suite(SMOKE, ["cpu"], out, renderer=INVERT, progress=False)
        assert (s.done, s.failed) == (1, 1)
        errors[value] = re.sub(r"\.tmp-[^']*'", ".tmp-X'", s.failures[jid].replace(str(out), "OUT"))
    assert errors["1"] == errors["0"]
    assert errors["1"].startswith("writing the clip failed: IsADirectoryError: ")
    assert errors["1"].endswith(")") and "\n" not in errors["1"]


class _KillWriters(Invert):
    """Job ``a``: stops every writer process (its files wait on them); job ``b``: once they
    have them, kills every writer (and leaves a temporary file of job a's clip, as a writer
    killed mid-file would)."""

    pools: list = []

    def render(self, request):
        pool = self.pools[0]
        if request.job.prompt == "a":
            self.first = request.job.id
            for w in pool._all:
                os.kill(w.process.pid, signal.SIGSTOP)
        else:
            deadline = time.monotonic() + 60
            while len(pool._all) - len(pool._idle) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            clips = request.work_dir.parent / "clips"
            clips.mkdir(exist_ok=True)
            (clips / f".tmp-{self.first}-0dead.mkv").write_bytes(b"partial")
            killed = list(pool._all)
            for w in killed:
                os.kill(w.process.pid, signal.SIGKILL)
            for w in killed:        # dead before job b's files are handed out (a kill is
                w.process.wait()    # asynchronous: an idle one could still look alive)
        return super().render(request)


def test_a_writer_killed_mid_job_fails_that_job_and_the_render_goes_on(tmp_path, monkeypatch,
                                                                       pools):
    suite = write_suite(tmp_path, PAN, prompts=("a", "b"))
    monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", "1")
    rend = _KillWriters()
    rend.pools = pools
    [s] = render_suite(suite, ["cpu"], tmp_path / "o", renderer=rend, progress=False)
    assert (s.done, s.failed) == (1, 1)
    run = RunDir.open(s.path)
    a, b = run.jobs
    assert s.failures == {a["id"]: f"writing the clip failed: the writer process died while "
                                   f"writing {a['id']}.mkv (killed by SIGKILL)"}
    assert not run.clip_path(a["id"]).exists() and not run.preview_path(a["id"]).exists()
    assert run.is_done(b["id"], verify=True)        # fresh writers wrote the next job
    assert not [p for p in s.path.rglob(".tmp-*")]
    assert pools[0].workers == 0 and not _shm_left(pools[0].made)


_PARENT = """
import os, signal, sys, time
os.environ["EVALKIT_WRITER_PROCESSES"] = "1"
from evalkit.render import driver
from evalkit.testing.renderers import Invert
from evalkit.testing.suites import write_suite

pools = []
class Pool(driver.WriterPool):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        pools.append(self)
driver.WriterPool = Pool

class Hold(Invert):
    def render(self, request):
        pool = pools[0]
        if request.job.prompt == "a":       # job a's files wait on stopped writers
            for w in pool._all:
                os.kill(w.process.pid, signal.SIGSTOP)
        else:
            while not pool._segments or len(pool._all) - len(pool._idle) < 2:
                time.sleep(0.005)
            print(*[w.process.pid for w in pool._all], *pool._segments.values(), flush=True)
            sys.stdin.readline()            # held: the test presses Ctrl-C or kills this
        return super().render(request)

suite = write_suite(sys.argv[1], sys.argv[2], prompts=("a", "b"))
driver.render_suite(suite, ["cpu"], sys.argv[1] + "/out", renderer=Hold(), progress=False)
"""


@pytest.mark.slow  # processes interrupted and killed
@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_ctrl_c_or_a_killed_parent_leaves_no_writer_or_shared_memory(how, tmp_path):
    """A render holding a job's frames in shared memory, its writers busy: Ctrl-C (SIGINT to
    the whole process group, as a terminal sends it: the writers ignore it and finish, the
    render stops them) or SIGKILL of the render (the writers end by themselves, its resource
    tracker unlinks the memory) leave no writer process and no shared memory."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(_PARENT))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("EVALKIT_WRITER_PROCESSES", None)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(PAN)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        line = parent.stdout.readline().split()
        assert line, parent.stderr.read()
        pids, segments = [int(p) for p in line if p.isdigit()], [p for p in line if not p.isdigit()]
        assert len(pids) == 2 * WRITE_AHEAD and len(segments) == 1
        assert _shm_left(segments) == segments
        if how == "ctrl-c":
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            os.killpg(parent.pid, signal.SIGINT)
            assert parent.wait(60) != 0
            assert "KeyboardInterrupt" in parent.stderr.read()
        else:
            parent.kill()
            assert parent.wait(60) == -signal.SIGKILL
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        for _ in range(300):
            if all(_gone(p) for p in pids) and not _shm_left(segments):
                break
            time.sleep(0.1)
        assert [p for p in pids if not _gone(p)] == [] and _shm_left(segments) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_without_room_in_shared_memory_it_warns_once_and_writes_in_threads(tmp_path,
                                                                           monkeypatch, pools):
    """/dev/shm full (64 KB free; a job's frames take 96 KB): one RuntimeWarning, every job
    written on threads; asked for processes (``=1``): a one-line user error."""
    monkeypatch.setattr("evalkit.render.procwrite.shm_free", lambda: 64 * 2**10)
    monkeypatch.setattr(driver, "use_processes", lambda tasks: True)    # as with a GPU
    monkeypatch.delenv("EVALKIT_WRITER_PROCESSES", raising=False)
    with pytest.warns(RuntimeWarning, match=r"^writing in threads: /dev/shm: 0 MB free, the "
                      r"writer processes need 0 MB .*--shm-size.*EVALKIT_WRITER_PROCESSES=0$") as w:
        [s] = render_suite(SMOKE, ["cpu"], tmp_path / "a", renderer=INVERT, progress=False)
    assert len([x for x in w if x.category is RuntimeWarning]) == 1
    assert (s.done, s.failed) == (2, 0) and pools[0].made == [] and pools[0].workers == 0
    monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", "1")
    with pytest.raises(UserError) as e:
        render_suite(SMOKE, ["cpu"], tmp_path / "b", renderer=INVERT, progress=False)
    assert "\n" not in str(e.value) and str(e.value).startswith("/dev/shm: 0 MB free")
    assert pools[1].workers == 0


def test_jobs_submitted_while_the_writers_start_go_to_threads_unless_asked_to_wait(tmp_path):
    """By default a job submitted before two workers have started is refused (Booting: the
    driver writes it on threads); with ``wait`` (EVALKIT_WRITER_PROCESSES=1) it waits for them.
    The clip's future gives its sha256, the preview's its frame count."""
    from concurrent.futures import ThreadPoolExecutor

    from evalkit.fsutil import sha256_file
    from evalkit.render.procwrite import Booting
    from evalkit.video import read_frames

    frames = read_frames(PAN)[0]
    with ThreadPoolExecutor(2) as encoders:
        with WriterPool() as pool:
            pool.start(2)
            with pytest.raises(Booting):
                pool.submit(encoders, tmp_path / "a.mkv", tmp_path / "a.mp4", frames, 24, "ffv1")
            assert pool.made == [] and not pool._reserved
            deadline = time.monotonic() + 60
            while pool.started() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            clip, preview = pool.submit(encoders, tmp_path / "a.mkv", tmp_path / "a.mp4",
                                        frames, 24, "ffv1")
            assert clip.result() == sha256_file(tmp_path / "a.mkv") and preview.result() == 8
        with WriterPool(wait=True) as pool:
            pool.start(2)
            clip, _ = pool.submit(encoders, tmp_path / "b.nut", tmp_path / "b.mp4", frames, 24,
                                  "utvideo")
            assert clip.result() == sha256_file(tmp_path / "b.nut")
    assert np.array_equal(read_frames(tmp_path / "b.nut")[0], frames)


def test_the_switch_and_its_default(monkeypatch):
    from evalkit.formats.suite import load_suite
    from evalkit.render.backend import parse_spec
    from evalkit.render.driver import BackendTask

    job = load_suite(SMOKE).jobs[0]

    def task(spec, jobs=(job,), apply=True):
        return BackendTask(parse_spec(spec), list(jobs), apply=apply)

    monkeypatch.delenv("EVALKIT_WRITER_PROCESSES", raising=False)
    # the default: threads everywhere (processes measured slower on the H200's canary render)
    assert not use_processes([task("cpu"), task("cuda:1,dtype=bf16")])
    assert not use_processes([task("mps")])
    # with processes the default for device renders (DEVICE_DEFAULT), only those use them
    monkeypatch.setattr("evalkit.render.procwrite.DEVICE_DEFAULT", True)
    assert not use_processes([task("cpu"), task("cpu,dtype=bf16")])
    assert use_processes([task("cpu"), task("cuda:1,dtype=bf16")]) == (os.name == "posix")
    assert use_processes([task("mps")]) == (os.name == "posix")
    assert not use_processes([task("cuda", jobs=())])          # nothing left to render
    assert not use_processes([task("cuda", apply=False)])      # adopted: nothing renders
    monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", "1")
    assert use_processes([task("cpu")])
    monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", "0")
    assert not use_processes([task("cuda")])
    monkeypatch.setenv("EVALKIT_WRITER_PROCESSES", "yes")
    with pytest.raises(UserError, match=r"^EVALKIT_WRITER_PROCESSES: expected 0 \(threads\) "
                                        r"or 1 \(processes\), found 'yes'$"):
        use_processes([task("cpu")])
