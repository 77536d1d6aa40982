"""$EVALKIT_WRITER_CPUS: which cores a render's writers get (evalkit.render.affinity)."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from evalkit.errors import UserError
from evalkit.render import affinity
from evalkit.render.affinity import parse_cpu_list, siblings_map, writer_cpus

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")


def smt(n: int) -> dict[int, frozenset[int]]:
    """n logical CPUs, 2 per core, siblings c and c + n/2 (as on most x86 machines)."""
    h = n // 2
    return {c: frozenset({c % h, c % h + h}) for c in range(n)}


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    assert parse_cpu_list("") == set()


def test_writer_cpus_leave_the_pipeline_core_and_its_siblings():
    assert writer_cpus(range(16), smt(16), 3) == frozenset(set(range(16)) - {3, 11})
    assert writer_cpus(range(16), smt(16), 11) == frozenset(set(range(16)) - {3, 11})
    no_smt = {c: frozenset({c}) for c in range(4)}
    assert writer_cpus(range(4), no_smt, 0) == frozenset({1, 2, 3})
    # an allowed set that is not every CPU: only allowed ones, a sibling outside it is no matter
    assert writer_cpus({2, 3, 10, 12}, smt(16), 2) == frozenset({3, 12})
    # a sibling map without the CPU: itself alone
    assert writer_cpus({0, 1, 2}, {}, 0) == frozenset({1, 2})


def test_writer_cpus_none_when_too_few_or_unknown():
    assert writer_cpus({0, 1}, {0: frozenset({0}), 1: frozenset({1})}, 0) is None   # 1 left
    assert writer_cpus({0, 1, 2}, smt(4), 0) is None      # 0 and 2 siblings: 1 left
    assert writer_cpus(range(4), smt(4), 0) == frozenset({1, 3})
    assert writer_cpus(range(16), smt(16), None) is None
    assert writer_cpus({0, 1, 2, 3}, smt(8), 5) is None    # the pipeline's CPU not allowed


def test_siblings_map_reads_sysfs(tmp_path):
    for c, text in ((0, "0,4\n"), (4, "0,4\n"), (1, "1-2\n")):
        d = tmp_path / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text)
    m = siblings_map({0, 1, 4, 7}, root=tmp_path)
    assert m == {0: {0, 4}, 4: {0, 4}, 1: {1, 2}, 7: {7}}          # 7: unreadable, itself


def test_setting(monkeypatch):
    monkeypatch.delenv(affinity.ENV, raising=False)
    assert affinity.setting() == "off"
    assert affinity.render_writer_cpus() is None
    monkeypatch.setenv(affinity.ENV, " AUTO ")
    assert affinity.setting() == "auto"
    monkeypatch.setenv(affinity.ENV, "0-3")
    with pytest.raises(UserError, match="EVALKIT_WRITER_CPUS: expected auto or off, found '0-3'"):
        affinity.setting()


@linux
def test_render_writer_cpus_auto(monkeypatch):
    monkeypatch.setenv(affinity.ENV, "auto")
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(affinity, "siblings_map", lambda cpus: smt(8))
    monkeypatch.setattr(affinity, "current_cpu", lambda: 6)
    assert affinity.render_writer_cpus() == frozenset({0, 1, 3, 4, 5, 7})
    monkeypatch.setattr(affinity, "current_cpu", lambda: None)
    assert affinity.render_writer_cpus() is None


def test_current_cpu_is_allowed():
    c = affinity.current_cpu()
    if c is not None:
        assert c in os.sched_getaffinity(0)


@linux
def test_pinned_threads_and_writer_processes():
    cpu = max(os.sched_getaffinity(0))
    with ThreadPoolExecutor(1, initializer=affinity.pin_thread, initargs=({cpu},)) as pool:
        assert pool.submit(os.sched_getaffinity, 0).result() == {cpu}
    assert os.sched_getaffinity(0) != {cpu} or len(os.sched_getaffinity(0)) == 1  # caller kept

    from evalkit.render.procwrite import WriterPool

    def started(pool) -> None:      # the worker pins itself first thing, before its imports
        pool.start(1)
        for _ in range(600):
            if pool.started():
                return
            time.sleep(0.05)
        raise AssertionError("the writer process did not start")

    pool = WriterPool(cpus=frozenset({cpu}))
    try:
        started(pool)
        assert os.sched_getaffinity(pool._all[0].process.pid) == {cpu}
    finally:
        pool.close()
    pool = WriterPool()
    try:
        started(pool)
        assert os.sched_getaffinity(pool._all[0].process.pid) == os.sched_getaffinity(0)
    finally:
        pool.close()


@linux
def test_a_render_pins_its_writers_not_its_rendering_thread(tmp_path, monkeypatch):
    """With the writers' cores chosen (here: the last allowed CPU), the encoder threads, the
    clip's part encoders and the recorder run there; the rendering thread keeps its cores."""
    from conftest import DATASETS
    from evalkit import video
    from evalkit.render import clipwriter, driver

    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    seen = {}
    write, part_packets, browser = (clipwriter.ClipWriter.write, clipwriter._part_packets,
                                    video.write_browser)
    record = driver._record

    def spy(name, f):
        def g(*args, **kw):
            seen.setdefault(name, set()).add(frozenset(os.sched_getaffinity(0)))
            return f(*args, **kw)
        return g

    monkeypatch.setattr(clipwriter.ClipWriter, "write", spy("clip", write))
    monkeypatch.setattr(clipwriter, "_part_packets", spy("part", part_packets))
    monkeypatch.setattr(video, "write_browser", spy("preview", browser))
    monkeypatch.setattr(driver, "_record", spy("recorder", record))
    monkeypatch.setattr(driver, "clip_parts", lambda: 2)
    monkeypatch.setattr(driver, "render_writer_cpus", lambda: frozenset({cpu}))
    monkeypatch.delenv("EVALKIT_WRITER_PROCESSES", raising=False)
    [s] = driver.render_suite(DATASETS / "smoke" / "suite.yaml", ["cpu"], tmp_path / "o",
                              renderer="evalkit.testing.renderers:Invert", progress=False)
    assert s.done == 2
    assert seen == {k: {frozenset({cpu})} for k in ("clip", "part", "preview", "recorder")}
    assert os.sched_getaffinity(0) == allowed
