"""Clips decoded in worker processes (evalkit.procdecode): the same chunks and the same errors
as ClipReader, chunks valid for as long as promised, workers reused, stopped and not leaked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import DATASETS

from evalkit import procdecode
from evalkit.errors import VideoError
from evalkit.procdecode import DecoderPool, prefetch_chunks, use_processes
from evalkit.video import ClipReader, write_browser, write_lossless

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("procdecode")
    frames = np.random.default_rng(8).integers(0, 256, (23, 48, 64, 3), dtype=np.uint8)
    paths = {"ffv1": root / "a.mkv", "utvideo": root / "a.nut"}
    for codec, p in paths.items():
        write_lossless(p, frames, 24, codec=codec)
    paths["h264"] = root / "a.mp4"  # not intra-only: one decoder in the worker
    write_browser(paths["h264"], frames, 24)
    return frames, paths


@pytest.fixture
def pool():
    with DecoderPool(threads=2) as p:
        yield p


def _shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("codec", ["ffv1", "utvideo", "h264"])
def test_chunks_are_the_readers_chunks_and_nothing_is_left_behind(clips, codec, monkeypatch):
    frames, paths = clips
    # the segments this pool makes (real ones, their names noted): the other test worker's
    # pools come and go in /dev/shm meanwhile, so the folder as a whole is no measure
    made = []
    real = procdecode.shared_memory.SharedMemory

    def noting(*args, **kw):
        shm = real(*args, **kw)
        made.append(shm.name)
        return shm

    monkeypatch.setattr(procdecode.shared_memory, "SharedMemory", noting)
    expected = list(ClipReader(paths[codec]).chunks(5))
    with DecoderPool(threads=2) as pool:
        with pool.chunks(paths[codec], 5, 2) as it:
            got = [c.copy() for c in it]
        assert [len(c) for c in got] == [5, 5, 5, 5, 3]
        assert all(np.array_equal(g, e) for g, e in zip(got, expected))
        if codec != "h264":
            assert np.array_equal(np.concatenate(got), frames)
        assert pool.workers == 1 and not pool._open
    assert made and not (set(made) & _shm_names())  # closing the pool unlinked its rings


def test_a_workers_ring_is_reused_unless_a_chunk_outlives_its_clip(clips, pool):
    frames, paths = clips
    with pool.chunks(paths["ffv1"], 4, 2) as it:
        assert sum(len(c) for c in it) == 23
    ring = pool._all[0].segment.name
    with pool.chunks(paths["utvideo"], 4, 2) as it:
        kept = next(it)  # still referenced after close
    assert pool._all[0].segment is None or pool._all[0].segment.name != ring
    with pool.chunks(paths["ffv1"], 4, 2) as it:
        assert np.array_equal(np.concatenate([c.copy() for c in it]), frames)
    assert np.array_equal(kept, frames[:4])  # never written again
    assert pool.workers == 1


def test_a_chunk_stays_valid_until_hold_more_are_taken(clips, pool):
    frames, paths = clips
    views = []
    for c in pool.chunks(paths["utvideo"], 2, depth=1, hold=2):  # 3 slots, reused 4 times
        views.append(c)  # in place, not copied
        for k in range(max(0, len(views) - 2), len(views)):
            assert np.array_equal(views[k], frames[2 * k : 2 * k + len(views[k])])


def test_closing_early_stops_the_worker_which_serves_the_next_clip(clips, pool):
    frames, paths = clips
    it = pool.chunks(paths["ffv1"], 2, 2)
    assert np.array_equal(next(it), frames[:2])
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    with pool.chunks(paths["ffv1"], 4, 1, hold=1) as it:
        got = np.concatenate([c.copy() for c in it])
    assert np.array_equal(got, frames) and pool.workers == 1


def test_two_clips_at_once_get_two_workers(clips, pool):
    frames, paths = clips
    a, b = pool.chunks(paths["ffv1"], 3, 2), pool.chunks(paths["utvideo"], 3, 2)
    got = [(x.copy(), y.copy()) for x, y in zip(a, b)]
    a.close()
    b.close()
    assert pool.workers == 2
    assert np.array_equal(np.concatenate([x for x, _ in got]), np.concatenate([y for _, y in got]))


def test_a_readers_error_is_raised_by_the_consumer_unchanged(tmp_path, pool):
    good = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
    bad = tmp_path / "cut.mkv"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoError) as direct:
        list(ClipReader(bad).chunks(2))
    with pytest.raises(VideoError) as procs, pool.chunks(bad, 2, 2) as it:
        list(it)
    assert str(procs.value) == str(direct.value)
    with pool.chunks(good, 3) as it:
        assert len(list(it)) == 3  # 8 frames: 3 + 3 + 2
    assert pool.workers == 1


def test_a_worker_that_dies_is_that_clips_error_and_the_pool_goes_on(clips, pool):
    frames, paths = clips
    it = pool.chunks(paths["ffv1"], 2, 1, hold=1)
    next(it)
    pool._all[0].process.kill()
    with pytest.raises(VideoError, match=r"a\.mkv: the decoder process died while decoding it"):
        list(it)
    it.close()
    assert pool.workers == 0
    assert np.array_equal(np.concatenate([c.copy() for c in pool.chunks(paths["ffv1"], 8)]), frames)


def test_workers_ignore_ctrl_c_and_a_killed_parent_leaves_no_process_or_memory(clips, tmp_path):
    _, paths = clips
    script = tmp_path / "parent.py"
    # no __main__ guard: a worker is a fresh interpreter and never runs this file
    script.write_text(
        textwrap.dedent(f"""
        import os, signal, sys
        from evalkit.procdecode import DecoderPool
        pool = DecoderPool()
        it = pool.chunks({str(paths["ffv1"])!r}, 2, 1, hold=1)
        next(it)
        w = pool._all[0]
        print(w.process.pid, w.segment.name, flush=True)
        sys.stdin.readline()
        n = 2 + sum(len(c) for c in it)         # the worker still serves after a Ctrl-C
        print("served", n, flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)    # no clean-up: the worker must notice by itself
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    pid, ring = parent.stdout.readline().split()
    pid = int(pid)
    assert ring in _shm_names() or not os.path.isdir("/dev/shm")
    os.kill(pid, signal.SIGINT)  # ignored: Ctrl-C is the parent's to handle
    parent.stdin.write("\n")
    parent.stdin.flush()
    assert parent.stdout.readline().split() == ["served", "23"]
    parent.stdin.write("\n")
    parent.stdin.flush()
    assert parent.wait(60) == -signal.SIGKILL
    for _ in range(600):  # the worker sees its pipe close and ends; the
        gone = ring not in _shm_names()  # resource tracker unlinks the parent's ring
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                ended = f.read().split(") ")[1].startswith("Z")  # reaped by init later
        except (ProcessLookupError, FileNotFoundError):
            ended = True
        if ended and gone:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"worker {pid} alive: {not ended}; ring {ring} left: {not gone}")


def test_processes_from_eight_usable_cores(monkeypatch):
    import evalkit.procdecode as PD

    for cores, want in ((16, True), (8, True), (7, False), (2, False)):
        monkeypatch.setattr("evalkit.video.usable_cores", lambda: cores)
        assert use_processes() is (want and os.name == "posix")
    assert PD.PROCESS_MIN_CORES == 8
    monkeypatch.setattr(PD, "PROCESS_MIN_CORES", 0)  # how tests choose processes
    assert use_processes() is (os.name == "posix")


def test_images_are_read_in_a_thread_even_with_a_pool(pool, tmp_path):
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "f.png")
    it = prefetch_chunks(tmp_path / "f.png", 1, 1, pool=pool)
    assert len(list(it)) == 1 and pool.workers == 0
    it.close()


def test_without_room_in_shared_memory_it_says_so_and_decodes_in_threads(clips, pool, monkeypatch):
    from evalkit.procdecode import NoRoom
    from evalkit.video import Prefetch

    frames, paths = clips
    monkeypatch.setattr("evalkit.procdecode.shm_free", lambda: 64 * 2**10)  # 64 KB free
    with pytest.raises(
        NoRoom,
        match=r"^/dev/shm: 0 MB free, the decoder processes need \d+ MB "
        r".*--shm-size\)$",
    ):
        pool.chunks(paths["ffv1"], 4, 2)
    assert pool.workers == 0  # nothing taken, nothing started
    with pytest.warns(RuntimeWarning, match="decoding in threads: /dev/shm"):
        it = prefetch_chunks(paths["ffv1"], 4, 2, pool=pool)
    assert isinstance(it, Prefetch)
    assert np.array_equal(np.concatenate(list(it)), frames)
