"""Four known failures of one real clip, imported as two farms' runs (issue 38's "must show").

One canary clip (real photographs filmed by a virtual camera, ``datasets/canary``) is farm A's
render of six jobs whose prompts name what farm B did to it: ``crf16`` (H.264 at CRF 16 in
yuv420p: barely visible), ``crf32`` (CRF 32: clearly visible), ``flicker`` (brightness up and
down by :data:`FLICKER_GAIN` on alternate frames: hardly any change per frame, a flicker people
notice), ``shift1`` (a copy one frame late), ``block`` (a 48x48 square of garbage on four
frames, issue 46: :func:`block_box`) and ``lsb1`` (+-1 LSB of noise: 52 dB, a difference below
what the floor resolves). Both farms come in through ``render -r import``
with labels, A's floor is made by ``evalkit floor`` (footage without seeds), and ``compare``
must rank and name them: the shift with its offset, the block second with its frames and place,
the flicker by name, crf32 above crf16, and the LSB noise said to be below the floor.
Used by tests/test_story.py and tools/story_screenshots.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evalkit.testing.suites import write_suite

VARIANTS = ("crf16", "crf32", "flicker", "shift1", "block", "lsb1")
#: the flicker variant's brightness gain on odd frames (1 - gain on even ones)
FLICKER_GAIN = 0.03
#: the block variant's garbage square: its side in pixels at 384x288 (scaled with the frame's
#: shorter side), and the share of the clip its frames start at (frames 40-43 of 64)
BLOCK_SIDE, BLOCK_FRAMES = 48, 4
BLOCK_START = 40 / 64


def block_box(frames: int, height: int, width: int) -> tuple[int, int, int, int, int]:
    """``(first frame, last frame, x, y, side)`` of the block variant's garbage square: 48x48
    pixels at 384x288 (scaled to the frame), on frames 40-43 of 64 (scaled to the clip, at least
    one frame), its top left at 5/8 of the width and 1/4 of the height."""
    side = max(4, round(BLOCK_SIDE * min(height, width) / 288))
    n = max(1, round(BLOCK_FRAMES * frames / 64))
    first = min(frames - n, int(BLOCK_START * frames))
    return first, first + n - 1, int(width * 5 / 8), int(height / 4), side


def h264_roundtrip(frames: np.ndarray, fps, crf: int) -> np.ndarray:
    """``frames`` through libx264 (yuv420p, ``crf``) and back, in memory (PyAV)."""
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream(
            "libx264", rate=int(round(float(fps))), options={"crf": str(crf), "preset": "medium"}
        )
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
            vf.pts = i
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    buf.seek(0)
    with av.open(buf) as c:
        out = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    assert out.shape == frames.shape, (out.shape, frames.shape)
    return out


def variant(frames: np.ndarray, fps, name: str) -> np.ndarray:
    """Farm B's render of ``name`` (one of :data:`VARIANTS`) from farm A's ``frames``."""
    if name == "crf16":
        return h264_roundtrip(frames, fps, 16)
    if name == "crf32":
        return h264_roundtrip(frames, fps, 32)
    if name == "flicker":
        gain = np.where(np.arange(len(frames)) % 2 == 1, 1 + FLICKER_GAIN, 1 - FLICKER_GAIN)
        return np.clip(frames * gain[:, None, None, None] + 0.5, 0, 255).astype(np.uint8)
    if name == "shift1":
        return np.concatenate([frames[:1], frames[:-1]])
    if name == "block":  # a 48x48 square of seeded noise on four frames: a local glitch
        first, last, x, y, side = block_box(*frames.shape[:3])
        out = frames.copy()
        noise = np.random.default_rng(46).integers(0, 256, (last - first + 1, side, side, 3))
        out[first : last + 1, y : y + side, x : x + side] = noise.astype(np.uint8)
        return out
    if name == "lsb1":  # +-1 LSB of seeded noise: 52 dB, below what any floor resolves
        step = np.random.default_rng(1).integers(-1, 2, frames.shape, dtype=np.int16)
        return np.clip(frames.astype(np.int16) + step, 0, 255).astype(np.uint8)
    raise ValueError(f"name: expected one of {VARIANTS}, found {name!r}")


def make_variant_runs(root, clip, *, frames: int | None = None) -> dict:
    """Under ``root``: the suite, both farms' files, their imports (``runs/farm-a``,
    ``runs/farm-b``) and A's reencode floor (``runs/farm-a_reencode``), all through the real
    CLI. ``frames``: use the clip's first ``frames`` only. Returns the paths."""
    from evalkit.cli import main
    from evalkit.formats.suite import load_suite
    from evalkit.video import read_frames, write_lossless

    root = Path(root)
    src, fps = read_frames(clip)
    if frames:
        src = src[:frames]
    write_lossless(root / "source.mkv", src, fps)
    suite_path = write_suite(root, root / "source.mkv", name="story", prompts=VARIANTS)
    jobs = load_suite(suite_path).jobs
    for farm in ("farm_a", "farm_b"):
        (root / farm).mkdir(parents=True, exist_ok=True)
    for job in jobs:
        write_lossless(root / "farm_a" / f"{job.id}.mkv", src, fps)
        write_lossless(root / "farm_b" / f"{job.id}.mkv", variant(src, fps, job.prompt), fps)
    runs = root / "runs"
    for farm, label in (("farm_a", "farm-a"), ("farm_b", "farm-b")):
        code = main(
            [
                "render",
                str(suite_path),
                "-r",
                "import",
                "-O",
                f"dir={root / farm}",
                "--label",
                label,
                "--out",
                str(runs),
                "--quiet",
            ]
        )
        assert code == 0, f"import of {farm} exited {code}"
    assert main(["floor", str(runs / "farm-a"), "--out", str(runs), "--quiet"]) == 0
    return {
        "suite": suite_path,
        "a": runs / "farm-a",
        "b": runs / "farm-b",
        "floor": runs / "farm-a_reencode",
        "jobs": {j.prompt: j.id for j in jobs},
    }
