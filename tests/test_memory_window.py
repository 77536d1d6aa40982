"""Memory bounded by a window of frames, not by the clip (issue 36): ``render -r import``,
``metrics A B`` and ``compare`` (report included) on clips of N and 2N frames.

Design: no clock, no resident-set sampling. Every decoded frame the harness holds comes out of
:class:`evalkit.video.ClipReader`: frame by frame (``iter``), in chunks (``chunks``), or whole
(``read``). :class:`FramesAlive` wraps those three so that each array they hand out is counted
(its frames) while it lives, through ``weakref.finalize`` (CPython frees an array the moment
its last reference goes, so the count is exact, not sampled), and keeps the largest count seen.
A path that holds a whole clip (a list of every frame, ``read()``, the chunks kept) peaks at
the clip's frame count or more; a streaming one at its window (a few chunks), the same for N
and 2N frames. The assertions: the peak with 2N frames is below N (half the clip), and at
most one chunk above the peak with N frames (threads may hand a chunk over a little earlier
or later). Copies made from the frames (the report's worst frame, kept on purpose) are not
counted: they are single frames. Decoding runs in threads here (``procdecode.PROCESS_MIN_CORES`` set high)
so every reader is in this process. The whole commands' peak resident memory at real scale is
``benchmarks/bench_memory.py``'s (benchmarks/README.md).

The clips are small (48x32) so that a 2N-frame run takes a few seconds; the windows do not
depend on the frame size (chunks of frames), so the count says the same at 1080p.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from evalkit import video
from evalkit.formats.run import RunDir
from evalkit.formats.suite import load_suite
from evalkit.fsutil import sha256_file
from evalkit.testing.suites import write_suite

N = 160  # frames of the short clip; the long one has 2N (a window is <= ~100 frames)
W, H = 48, 32
CHUNK = 16  # the largest chunk any of these paths reads (iter_expected's default)


class FramesAlive:
    """Counts the frames of the arrays ClipReader hands out while they are alive."""

    def __init__(self, monkeypatch):
        self.alive = 0
        self.peak = 0
        self._lock = threading.Lock()
        orig_iter, orig_chunks, orig_read = (
            video.ClipReader.__iter__,
            video.ClipReader.chunks,
            video.ClipReader.read,
        )
        counter = self

        def track(arr):
            n = 1 if arr.ndim == 3 else len(arr)
            with counter._lock:
                counter.alive += n
                counter.peak = max(counter.peak, counter.alive)
            weakref.finalize(arr, counter._gone, n)
            return arr

        def it(self):
            for f in orig_iter(self):
                yield track(f)

        def chunks(self, size=16):
            for c in orig_chunks(self, size):
                yield track(c)

        def read(self):
            return track(orig_read(self))

        monkeypatch.setattr(video.ClipReader, "__iter__", it)
        monkeypatch.setattr(video.ClipReader, "chunks", chunks)
        monkeypatch.setattr(video.ClipReader, "read", read)
        monkeypatch.setattr("evalkit.procdecode.PROCESS_MIN_CORES", 10**6)  # threads

    def _gone(self, n: int) -> None:
        with self._lock:
            self.alive -= n

    def reset(self) -> None:
        with self._lock:
            self.peak = self.alive


def clip_frames(n: int, brighter: int = 0):
    """A texture panning one pixel a frame; ``brighter``: every value raised by that much (a
    difference that is not a time shift, which compare would align)."""
    rng = np.random.default_rng(3)
    tex = rng.integers(0, 256 - brighter, (H, W + n + 8, 3), dtype=np.uint8) + np.uint8(brighter)
    for t in range(n):
        yield np.ascontiguousarray(tex[:, t : t + W])


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """For N and 2N frames: a suite of one clip, and the job's render by two farms."""
    from evalkit.render.renderers.imported import import_name

    out = {}
    for n in (N, 2 * N):
        root = tmp_path_factory.mktemp(f"mem{n}")
        src = root / "source.mkv"
        video.write_lossless(src, clip_frames(n), 24)
        suite = write_suite(root, src, prompts=("window",), seeds=(0,))
        job = load_suite(suite).jobs[0]
        farms = {}
        for label, shift in (("a", 0), ("b", 3)):
            d = root / f"farm_{label}"
            d.mkdir()
            video.write_lossless(d / f"{import_name(job, job.seed)}.mkv", clip_frames(n, shift), 24)
            farms[label] = d
        out[n] = {"root": root, "suite": suite, "farms": farms, "job": job.id}
    return out


def import_runs(s: dict, counter: FramesAlive) -> int:
    from evalkit.render.driver import render_suite

    counter.reset()
    for label in ("a", "b"):
        render_suite(
            s["suite"],
            [],
            s["root"] / "runs",
            renderer="import",
            options={"dir": str(s["farms"][label])},
            label=label,
            progress=False,
        )
    return counter.peak


def check_window(peaks: dict) -> None:
    short, long_ = peaks[N], peaks[2 * N]
    assert long_ < N, f"{long_} frames alive at once for a {2 * N}-frame clip: the whole clip"
    assert long_ <= short + CHUNK, f"the window grew with the clip: {short} -> {long_} frames"


def test_import_streams_and_keeps_the_files(sets, monkeypatch):
    """The import holds a window, and its files are those of the writers given the whole
    clip (the same bytes: the clip; the same pictures: the preview), the manifest's sha256 that of the clip's bytes."""
    counter = FramesAlive(monkeypatch)
    peaks = {n: import_runs(sets[n], counter) for n in (N, 2 * N)}
    check_window(peaks)
    s = sets[2 * N]
    run = RunDir.open(s["root"] / "runs" / "a")
    rec = run.job(s["job"])
    assert rec["status"] == "done" and rec["output"]["frames"] == 2 * N
    assert (rec["output"]["width"], rec["output"]["height"]) == (W, H)
    ref = s["root"] / "ref"
    ref.mkdir()
    frames = np.stack(list(clip_frames(2 * N)))
    video.write_lossless(ref / "clip.mkv", frames, 24)
    video.write_browser(ref / "p.mp4", frames, 24)
    clip = run.clip_path(s["job"])
    assert clip.read_bytes() == (ref / "clip.mkv").read_bytes()
    assert_same_preview(run.preview_path(s["job"]), ref / "p.mp4", frames)
    assert rec["output"]["sha256"] == sha256_file(clip)
    assert not (run.path / ".work").exists()


COPY_PROGRAM = """import os, shutil
shutil.copy(os.environ["EVALKIT_INPUT"], os.path.join(os.environ["EVALKIT_OUTPUT_DIR"], "out.mkv"))
"""


@pytest.mark.slow  # a program run per job, clips of N and 2N frames
def test_command_renderer_streams_its_input_and_output(sets, monkeypatch):
    """The ``command`` renderer writes the program's inputs (a lossless clip and PNG frames)
    and reads its output a window at a time: the harness's frames alive do not grow with the
    clip; the run's clip is the program's output (here: the source, copied)."""
    import sys

    from evalkit.render.driver import render_suite

    counter = FramesAlive(monkeypatch)
    peaks = {}
    for n in (N, 2 * N):
        s = sets[n]
        script = s["root"] / "copy.py"
        script.write_text(COPY_PROGRAM)
        counter.reset()
        render_suite(
            s["suite"],
            ["cpu"],
            s["root"] / "cmd-runs",
            renderer="command",
            options={"cmd": f"{sys.executable} {script}"},
            progress=False,
        )
        peaks[n] = counter.peak
    check_window(peaks)
    s = sets[2 * N]
    run = RunDir.open(next((s["root"] / "cmd-runs").iterdir()))
    rec = run.job(s["job"])
    assert rec["status"] == "done" and rec["output"]["frames"] == 2 * N
    got = video.read_frames(run.clip_path(s["job"]))[0]
    assert np.array_equal(got, np.stack(list(clip_frames(2 * N))))
    assert rec["output"]["sha256"] == sha256_file(run.clip_path(s["job"]))
    assert not (run.path / ".work").exists()


@pytest.mark.parametrize(
    "frames, message",
    [
        (N - 3, f"returned {N - 3} frames, expected {N} (the source clip's count)"),
        (N + 20, f"more than {N} frames, expected {N} (the source clip's count)"),
    ],
)
def test_import_of_a_wrong_length_fails_and_leaves_nothing(sets, tmp_path, frames, message):
    """A file shorter or longer than the source: the job fails with one line, found late in
    the stream (no header says the count), and no clip or preview is left in the run."""
    from evalkit.render.driver import render_suite

    s = sets[N]
    farm = tmp_path / "farm"
    farm.mkdir()
    video.write_lossless(farm / f"{s['job']}.mkv", clip_frames(frames), 24)
    (summary,) = render_suite(
        s["suite"],
        [],
        tmp_path / "runs",
        renderer="import",
        options={"dir": str(farm)},
        label="short",
        progress=False,
    )
    assert summary.failed == 1 and message in summary.failures[s["job"]]
    run = RunDir.open(tmp_path / "runs" / "short")
    assert not run.clip_path(s["job"]).exists() and not run.preview_path(s["job"]).exists()
    assert not (run.path / ".work").exists()


def assert_same_preview(path, ref, frames):
    """Two H.264 previews of the same ``frames`` with the same settings: the same frame count
    and size, and per frame the same distance from the source within 5%. Not the same bytes:
    x264 here is not bit-reproducible under load (encodes of one clip differed from the second
    GOP on, 1 of 30 even on one thread; decoded, 1 code value apart on average against 45 from
    the source); the lossless clips, which the metrics read, are compared byte for byte."""
    (a, _), (b, _) = video.read_frames(path), video.read_frames(ref)
    assert a.shape == b.shape == frames.shape

    def err(x):
        return np.abs(x.astype(np.int16) - frames.astype(np.int16)).mean(axis=(1, 2, 3))

    ea, eb = err(a), err(b)
    assert np.all(np.abs(ea - eb) <= 0.05 * np.maximum(ea, eb) + 0.5), (ea, eb)


def test_streamed_write_is_atomic(tmp_path):
    """A reader that fails halfway: its error is raised, neither file is left (nor a
    temporary one); the same chunks whole: the files of the two writers given the clip."""
    from evalkit.render.clipwriter import write_streamed

    frames = np.stack(list(clip_frames(40)))

    def failing():
        yield frames[:16]
        yield frames[16:32]
        raise RuntimeError("disk gone")

    clip, preview = tmp_path / "c.mkv", tmp_path / "p.mp4"
    with pytest.raises(RuntimeError, match="disk gone"):
        write_streamed(failing(), clip, preview, 24, codec="ffv1")
    assert list(tmp_path.iterdir()) == []
    n, h, w, sha = write_streamed(
        iter([frames[:16], frames[16:]]), tmp_path / "c.nut", preview, 24, codec="utvideo"
    )
    assert (n, h, w) == (40, H, W) and sha == sha256_file(tmp_path / "c.nut")
    video.write_lossless(tmp_path / "ref.nut", frames, 24, codec="utvideo")
    video.write_browser(tmp_path / "ref.mp4", frames, 24)
    assert (tmp_path / "c.nut").read_bytes() == (tmp_path / "ref.nut").read_bytes()
    assert_same_preview(preview, tmp_path / "ref.mp4", frames)


@pytest.mark.slow  # clips of N and 2N frames measured
def test_metrics_streams(sets, monkeypatch):
    from evalkit.compare.clips import compare_clips

    counter = FramesAlive(monkeypatch)
    peaks = {}
    for n in (N, 2 * N):
        s = sets[n]
        a, b = (s["farms"][k] / f"{s['job']}.mkv" for k in ("a", "b"))
        counter.reset()
        out = compare_clips(a, b, device="cpu", temporal=False, chunk=8, csv_path=s["root"] / "frames.csv")
        assert out["frames"] == n and len(out["per_frame"]["lpips"]) == n
        peaks[n] = counter.peak
    check_window(peaks)


@pytest.mark.slow  # clips of N and 2N frames compared
def test_compare_streams(sets, monkeypatch):
    """compare, its report (worst-frame images, per-frame plots) included."""
    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs

    counter = FramesAlive(monkeypatch)
    peaks = {}
    for n in (N, 2 * N):
        s = sets[n]
        runs = s["root"] / "runs"
        if not (runs / "b" / "manifest.json").exists():
            import_runs(s, counter)
        counter.reset()
        compare_runs(
            runs / "a",
            runs / "b",
            s["root"] / "report",
            device="cpu",
            chunk=8,
            metrics=MetricOptions(temporal=False),
            progress=False,
        )
        assert (s["root"] / "report" / "index.html").exists()
        peaks[n] = counter.peak
    check_window(peaks)
