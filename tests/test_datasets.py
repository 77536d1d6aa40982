"""The committed source clips of datasets/ (smoke, canary) and their generator.

Real files, no mocks: decode the committed FFV1 clips, regenerate the smoke suite and compare
byte-for-byte, check the suite YAML files' structure (the suite loader has its own tests).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml

from evalkit.video import ClipReader

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "datasets"
SCRIPT = DATASETS / "make_clips.py"

EXPECTED = {  # suite -> (clip count, frames, size, fps)
    "smoke": (2, 8, 64, 24),
    "canary": (8, 24, 256, 24),
}
CANARY_STYLES = [
    "pencil sketch",
    "watercolor",
    "cartoon",
    "detail enhanced",
    "night",
    "golden hour",
    "black and white film",
    "thermal camera",
]
ID_RE = re.compile(r"^[a-z0-9_-]+$")


@pytest.fixture(scope="module")
def make_clips():
    name = "datasets_make_clips"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def _suite(name: str) -> dict:
    with open(DATASETS / name / "suite.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


_FRAMES: dict[Path, np.ndarray] = {}


def _frames(path: Path) -> np.ndarray:
    if path not in _FRAMES:
        _FRAMES[path] = ClipReader(path).read()
    return _FRAMES[path]


def _clip_paths(name: str) -> list[Path]:
    doc = _suite(name)
    return [DATASETS / name / c["path"] for c in doc["clips"]]


ALL_CLIPS = [(s, p) for s in EXPECTED for p in _clip_paths(s)]


# -- suite files ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_suite_yaml_structure(name, make_clips):
    doc = _suite(name)
    allowed = {
        "schema_version",
        "name",
        "description",
        "renderer",
        "clips",
        "params",
        "prompts",
        "seeds",
        "jobs",
    }
    assert set(doc) <= allowed, f"unknown keys {set(doc) - allowed}"
    assert doc["schema_version"] == 1
    assert doc["name"] == name
    assert isinstance(doc["description"], str) and doc["description"].strip()
    assert isinstance(doc.get("renderer", ""), str)

    clips = doc["clips"]
    ids = [c["id"] for c in clips]
    assert len(ids) == len(set(ids)), f"duplicate clip ids: {ids}"
    assert len(ids) == EXPECTED[name][0]
    for c in clips:
        assert set(c) <= {"id", "path", "description"}
        assert ID_RE.match(c["id"]), c["id"]
        path = DATASETS / name / c["path"]
        assert path.is_file(), f"{name}: clip {c['id']} path {c['path']} does not exist"
        assert path.stem == c["id"]
    # the suite lists exactly the clips the generator makes, and no stray files are committed
    assert tuple(ids) == make_clips.SUITES[name].clips
    on_disk = sorted(p.stem for p in (DATASETS / name / "clips").glob("*.mkv"))
    assert on_disk == sorted(ids)

    params = doc["params"]
    assert isinstance(params, dict) and params
    assert all(isinstance(v, (str, int, float, bool)) for v in params.values())
    assert ("jobs" in doc) != ("prompts" in doc or "seeds" in doc), "product form XOR jobs"


def test_smoke_suite_is_product_form():
    doc = _suite("smoke")
    assert doc["prompts"] == ["watercolor"]
    assert doc["seeds"] == [0]
    assert doc["params"] == {"strength": 0.6, "steps": 4, "guidance": 3.0}
    assert "jobs" not in doc


def test_canary_suite_is_explicit_jobs():
    doc = _suite("canary")
    assert doc["params"] == {"strength": 0.6, "steps": 12, "guidance": 4.0}
    jobs = doc["jobs"]
    ids = [c["id"] for c in doc["clips"]]
    assert [j["clip"] for j in jobs] == ids, "one job per clip, in clip order"
    assert [j["prompt"] for j in jobs] == CANARY_STYLES
    for j in jobs:
        assert set(j) <= {"clip", "prompt", "seed", "params"}
        assert isinstance(j["seed"], int) and not isinstance(j["seed"], bool)
        assert isinstance(j.get("params", {}), dict)
    assert sum(j["seed"] != 0 for j in jobs) <= 2


def test_canary_clips_use_different_photos_and_motions(make_clips):
    shots = [make_clips.SHOTS[c] for c in make_clips.SUITES["canary"].clips]
    assert len({s.photo for s in shots}) == 8
    assert len({s.motion for s in shots}) == 8


# -- committed clips ---------------------------------------------------------------------------


@pytest.mark.parametrize("suite,path", ALL_CLIPS, ids=[f"{s}/{p.stem}" for s, p in ALL_CLIPS])
def test_committed_clip_decodes(suite, path):
    _, n, size, fps = EXPECTED[suite]
    reader = ClipReader(path)
    info = reader.info
    assert info.codec == "ffv1"
    assert (info.width, info.height) == (size, size)
    assert info.fps == Fraction(fps)
    frames = _frames(path)
    assert frames.shape == (n, size, size, 3) and frames.dtype == np.uint8


@pytest.mark.parametrize("suite,path", ALL_CLIPS, ids=[f"{s}/{p.stem}" for s, p in ALL_CLIPS])
def test_committed_clip_has_real_motion(suite, path):
    frames = _frames(path).astype(np.int16)
    for i, f in enumerate(frames):
        # not constant, and real image content (not a flat or near-flat frame)
        assert f.std() > 10, f"frame {i} is (nearly) constant"
    diffs = np.abs(np.diff(frames, axis=0)).mean(axis=(1, 2, 3))
    assert (diffs > 0.5).all(), f"consecutive frames barely differ: {diffs.round(2).tolist()}"
    # smooth, not jumpy: no step between frames is much larger than the typical one
    assert diffs.max() < 4 * np.median(diffs) + 2, diffs.round(2).tolist()


def test_canary_size_is_modest():
    total = sum(p.stat().st_size for p in (DATASETS / "canary" / "clips").glob("*.mkv"))
    assert total < 25_000_000, f"canary clips take {total} bytes"


# -- generator -------------------------------------------------------------------------------


def test_generator_reproduces_smoke_clips(make_clips, tmp_path):
    make_clips.generate("smoke", tmp_path)
    spec = make_clips.SUITES["smoke"]
    for cid in spec.clips:
        new = ClipReader(make_clips.clip_path(tmp_path, "smoke", cid))
        old_path = make_clips.clip_path(DATASETS, "smoke", cid)
        assert new.info.fps == ClipReader(old_path).info.fps
        a, b = new.read(), _frames(old_path)
        assert a.shape == b.shape
        assert np.array_equal(a, b), f"smoke/{cid}: regenerated frames differ from committed"
    assert make_clips.compare("smoke", tmp_path, DATASETS) == []


def test_generator_is_deterministic_and_canary_frames_match(make_clips):
    # render a canary clip twice in one process (caches warm) and compare with the committed
    # file: the same function builds both suites, so this covers the 256x256 path cheaply
    spec = make_clips.SUITES["canary"]
    a = make_clips.render_clip("hubble_object", spec.size, spec.frames, spec.fps)
    b = make_clips.render_clip("hubble_object", spec.size, spec.frames, spec.fps)
    assert np.array_equal(a, b)
    committed = _frames(make_clips.clip_path(DATASETS, "canary", "hubble_object"))
    assert np.array_equal(a, committed)


def test_check_cli_detects_mismatch(tmp_path):
    """`--check` passes on an exact copy and fails, with a message, on a changed clip."""
    import shutil

    from evalkit.video import write_lossless

    root = tmp_path / "root"
    shutil.copytree(DATASETS / "smoke", root / "smoke")
    cmd = [sys.executable, str(SCRIPT), "--suite", "smoke", "--check", "--out", str(root)]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "identical" in ok.stdout

    victim = root / "smoke" / "clips" / "hubble_object.mkv"
    frames = ClipReader(victim).read()
    frames[3, 10, 10, 0] ^= 1
    write_lossless(victim, frames, 24)
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "hubble_object" in bad.stderr and "frames [3]" in bad.stderr
