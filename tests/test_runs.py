"""Run folders: manifest format, atomic recording, resume checks, schema versions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import DATASETS

from evalkit import video
from evalkit.errors import SchemaVersionError, UserError
from evalkit.formats.run import MANIFEST_SCHEMA_VERSION, RunDir, read_manifest, sha256_file
from evalkit.formats.suite import load_suite
from evalkit.render.backend import fingerprint, parse_spec

SMOKE = DATASETS / "smoke" / "suite.yaml"


def make_run(tmp_path, spec="cpu,dtype=fp32"):
    suite = load_suite(SMOKE)
    backend = parse_spec(spec)
    return suite, RunDir.create(
        tmp_path / "run",
        suite=suite,
        renderer={"name": "test", "version": "1"},
        backend=backend.to_dict(),
        fingerprint=fingerprint(backend),
    )


def frames(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)


def test_manifest_records_what_ran(tmp_path):
    suite, run = make_run(tmp_path)
    m = read_manifest(run.path)
    assert m["schema_version"] == MANIFEST_SCHEMA_VERSION
    assert m["suite"]["name"] == "smoke" and m["suite"]["sha256"] == suite.sha256
    assert m["backend"]["spec"] == "cpu" and m["backend"]["dtype"] == "fp32"
    for key in (
        "host",
        "os",
        "cpu",
        "device_name",
        "torch",
        "cuda",
        "hip",
        "dtype",
        "attention",
        "deterministic_algorithms",
        "matmul_tf32",
    ):
        assert key in m["fingerprint"], key
    assert [j["id"] for j in m["jobs"]] == [j.id for j in suite.jobs]
    assert {j["status"] for j in m["jobs"]} == {"pending"}


def test_record_done_writes_clip_preview_and_hash(tmp_path):
    suite, run = make_run(tmp_path)
    jid = suite.jobs[0].id
    rec = run.record_done(jid, frames(), 24, timing={"seconds": 1.5})
    assert rec["status"] == "done"
    clip = run.path / rec["output"]["path"]
    assert rec["output"]["sha256"] == sha256_file(clip)
    assert np.array_equal(video.read_frames(clip)[0], frames())
    assert video.ClipReader(run.path / rec["preview"]).info.codec == "h264"
    reopened = RunDir.open(run.path)
    assert reopened.is_done(jid)
    assert not reopened.is_done(suite.jobs[1].id)
    # a tampered clip no longer verifies: resume will re-render it
    data = bytearray(clip.read_bytes())
    data[-10] ^= 0xFF
    clip.write_bytes(bytes(data))
    assert not reopened.is_done(jid)
    assert reopened.is_done(jid, verify=False)


def test_a_crash_while_writing_never_leaves_a_clip_marked_done(tmp_path):
    suite, run = make_run(tmp_path)
    jid = suite.jobs[0].id

    def crashing():
        yield from frames()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.record_done(jid, list(crashing()), 24)  # list() raises before anything is written
    with pytest.raises(KeyboardInterrupt):
        video.write_lossless(run.clip_path(jid), crashing(), 24)
    assert not run.clip_path(jid).exists()
    assert list((run.path / "clips").iterdir()) == []
    assert RunDir.open(run.path).job(jid)["status"] == "pending"


def test_failed_jobs_are_recorded_and_others_untouched(tmp_path):
    suite, run = make_run(tmp_path)
    run.record_failed(suite.jobs[1].id, "CUDA out of memory", timing={"seconds": 0.1})
    m = read_manifest(run.path)
    assert m["jobs"][1]["status"] == "failed" and "out of memory" in m["jobs"][1]["error"]
    assert m["jobs"][0]["status"] == "pending"
    assert RunDir.open(run.path).counts() == {"pending": 1, "done": 0, "failed": 1}


def test_reopening_resumes_and_refuses_another_backend(tmp_path):
    suite, run = make_run(tmp_path)
    run.record_done(suite.jobs[0].id, frames(), 24)
    _, again = make_run(tmp_path)
    assert again.is_done(suite.jobs[0].id)
    with pytest.raises(UserError, match="already holds a different run.*backend"):
        make_run(tmp_path, "cpu,dtype=bf16")


def test_unknown_schema_version_is_a_clear_error(tmp_path):
    _, run = make_run(tmp_path)
    m = json.loads((run.path / "manifest.json").read_text())
    m["schema_version"] = 99
    (run.path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SchemaVersionError, match="manifest.json: manifest schema_version 99"):
        RunDir.open(run.path)


def test_clip_files_find_each_jobs_clip_through_the_manifest(tmp_path):
    """Readers outside render (a study over a compare report) find a job's clip through the
    run's manifest: a done job where its record says, any other where its format puts it."""
    from evalkit.errors import InputFileError
    from evalkit.formats.run import clip_files

    suite, run = make_run(tmp_path)
    done, pending = suite.jobs[0].id, suite.jobs[1].id
    run.record_done(done, frames(), 24)
    (run.path / "clips" / f"{done}.mkv").rename(run.path / "clips" / "moved.mkv")
    m = json.loads((run.path / "manifest.json").read_text())
    m["jobs"][0]["output"]["path"] = "clips/moved.mkv"  # the record wins over the layout
    (run.path / "manifest.json").write_text(json.dumps(m))
    find = clip_files(run.path)
    assert find(done) == run.path / "clips" / "moved.mkv" == RunDir.open(run.path).clip_file(done)
    assert find(pending) == run.path / "clips" / f"{pending}.mkv" == run.clip_path(pending)
    assert find("not-a-job") == run.path / "clips" / "not-a-job.mkv"
    # a folder of clips only: .mkv, or the .nut that is there
    bare = tmp_path / "bare"
    (bare / "clips").mkdir(parents=True)
    (bare / "clips" / "b.nut").write_bytes(b"x")
    assert clip_files(bare)("a") == bare / "clips" / "a.mkv"
    assert clip_files(bare)("b") == bare / "clips" / "b.nut"
    # a manifest that is not one is an error naming the file
    (run.path / "manifest.json").write_text("{not json")
    with pytest.raises(InputFileError, match="manifest.json: not valid JSON"):
        clip_files(run.path)
