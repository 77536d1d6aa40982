"""compare's overlapped work (issue 48 item 1): each pair's offset probed while the job before
it is measured, each job's report parts made as soon as it is measured; and an import's
lossless clip encoded in parts as it streams (item 2). The files are unchanged."""

from __future__ import annotations

import threading

import pytest
from conftest import DATASETS

from evalkit.render.driver import render_suite

SMOKE = DATASETS / "smoke" / "suite.yaml"
INVERT = "evalkit.testing.renderers:Invert"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    render_suite(
        SMOKE, ["cpu", "cpu,dtype=bf16"], root, renderer=INVERT, options={"noise": "32"}, progress=False
    )
    return root / "cpu", root / "cpu_dtype-bf16"


def test_the_next_pairs_offset_is_probed_while_a_job_is_measured(runs, monkeypatch):
    """The second pair's offset probe starts while the first job is still being measured (the
    first job's frames wait for it: with the probe run between the jobs, they would wait in
    vain), and each job is handed on (``on_measured``) as soon as it is complete, in order."""
    import evalkit.compare.pairing as pairing
    from evalkit.compare.run import open_run

    a, b = open_run(runs[0], "RUN_A"), open_run(runs[1], "RUN_B")
    pairs, problems = pairing.pair_jobs(a, b, same_seed=True)
    assert len(pairs) == 2 and not problems
    second_probed = threading.Event()
    threads, events = [], []
    real = pairing.resolve_offset

    def probe(path_a, path_b, offset="auto"):
        threads.append(threading.current_thread().name)
        if path_a == pairs[1].path_a:
            second_probed.set()
        return real(path_a, path_b, offset)

    monkeypatch.setattr(pairing, "resolve_offset", probe)

    class Frames:  # the progress bar: each frame's record
        def update(self, n):
            if not events:  # job 1's first record: job 2's probe must be under way
                events.append(("job 2 probed during job 1", second_probed.wait(30)))

    session = pairing.LocalCompareSession(device="cpu")
    try:
        measures = session.measure(
            pairs, progress=Frames(), on_measured=lambda m: events.append(("measured", m.pair.job_id))
        )
    finally:
        session.close()
    assert events == [
        ("job 2 probed during job 1", True),
        ("measured", pairs[0].job_id),
        ("measured", pairs[1].job_id),
    ]
    assert threads == ["evalkit-offset"] * 2
    for m in measures:  # the same alignment as a probe on the spot
        assert m.alignment == real(m.pair.path_a, m.pair.path_b, "auto")


def test_a_probe_error_is_raised_by_the_measure_and_closes_the_decoder(runs, monkeypatch):
    import evalkit.compare.pairing as pairing
    from evalkit.compare.run import open_run

    a, b = open_run(runs[0], "RUN_A"), open_run(runs[1], "RUN_B")
    pairs, _ = pairing.pair_jobs(a, b, same_seed=True)

    def broken(*_a, **_k):
        raise pairing.PairMismatch("job x: the probe failed")

    monkeypatch.setattr(pairing, "resolve_offset", broken)
    closed = []
    real_close = pairing.PairDecoder.close
    monkeypatch.setattr(pairing.PairDecoder, "close", lambda self: (closed.append(1), real_close(self)))
    from evalkit.metrics.stream import PairEvaluator

    with pytest.raises(pairing.PairMismatch, match="the probe failed"):
        pairing.measure_pair(PairEvaluator(device="cpu"), pairs[0])
    assert closed == [1]


def test_report_parts_made_while_measuring_are_the_same_files(runs, tmp_path):
    """A compare writes its worst-frame PNGs from bytes encoded while the later jobs were
    measured (:class:`evalkit.compare.report.ReportParts`): the report is byte for byte the one
    written from the measures afterwards, with nothing made ahead."""
    from evalkit.compare.report import ReportParts, write_report
    from evalkit.compare.run import compare_runs

    res = compare_runs(runs[0], runs[1], tmp_path / "r1", device="cpu", progress=False)
    assert all(m.worst_a is not None for m in res.measures)
    summary = {k: v for k, v in res.summary.items() if k != "files"}
    write_report(tmp_path / "r2", dict(summary), res.measures)  # nothing made ahead
    parts = ReportParts()
    try:
        for m in res.measures:
            parts.add(m)
        assert all(parts.pngs_of(m) is not None for m in res.measures)
        write_report(tmp_path / "r3", dict(summary), res.measures, parts)
    finally:
        parts.close()
    files = sorted(p.relative_to(tmp_path / "r1") for p in (tmp_path / "r1").rglob("*") if p.is_file())
    assert len([f for f in files if f.suffix == ".png"]) == 4 * len(res.measures)
    for other in ("r2", "r3"):
        got = sorted(p.relative_to(tmp_path / other) for p in (tmp_path / other).rglob("*") if p.is_file())
        assert got == files
        for f in files:
            if f.name == "summary.json":  # its "created" stamp is the compare's
                continue
            assert (tmp_path / other / f).read_bytes() == (tmp_path / "r1" / f).read_bytes(), (other, f)


def test_the_kernel_modules_are_loaded_once_on_a_thread_of_their_own():
    """An evaluator for CUDA starts loading Triton and the kernel modules as it is made
    (:func:`evalkit.metrics.stream.preload_kernel_modules`); the warm-up waits for that one load."""
    import sys

    from evalkit.metrics import stream

    first = stream.preload_kernel_modules()
    assert stream.preload_kernel_modules() is first
    first.result(timeout=300)
    pytest.importorskip("triton")
    for name in stream.KERNEL_MODULES:
        assert f"{stream.__package__}.{name}" in sys.modules, name


@pytest.mark.parametrize("codec", ["utvideo", "ffv1"])
def test_a_streamed_lossless_clip_in_parts_is_one_encoders_bytes(tmp_path, codec):
    """An import's lossless clip encoded chunk by chunk on several encoders at once
    (``write_streamed(parts=3)``: chunks of uneven sizes, an odd frame size) is byte for byte
    the clip one encoder writes; a reader that fails halfway leaves no file."""
    import numpy as np

    from evalkit import video
    from evalkit.fsutil import sha256_file
    from evalkit.render.clipwriter import write_streamed

    rng = np.random.default_rng(48)
    frames = rng.integers(0, 256, size=(37, 21, 33, 3), dtype=np.uint8)
    frames[:, :10] //= 3  # some structure for the predictors, not noise only
    ext = video.lossless_format(codec).ext
    cuts = [0, 16, 17, 32, 33, 37]
    chunks = [frames[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    n, h, w, sha = write_streamed(
        iter(chunks), tmp_path / f"c{ext}", tmp_path / "p.mp4", 24, codec=codec, parts=3
    )
    assert (n, h, w) == (37, 21, 33) and sha == sha256_file(tmp_path / f"c{ext}")
    video.write_lossless(tmp_path / f"ref{ext}", frames, 24, codec=codec)
    assert (tmp_path / f"c{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    back, _ = video.read_frames(tmp_path / f"c{ext}")
    assert np.array_equal(back, frames)

    def failing():
        yield frames[:16]
        yield frames[16:32]
        raise RuntimeError("disk gone")

    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(RuntimeError, match="disk gone"):
        write_streamed(failing(), bad / f"c{ext}", bad / "p.mp4", 24, codec=codec, parts=3)
    assert list(bad.iterdir()) == []
