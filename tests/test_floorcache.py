"""Issue 46 item 5: a floor run is measured once per (clips, metric settings, code) and reused by
the next compare, which says so; a changed input is measured again (evalkit.compare.floorcache)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import DATASETS

from evalkit.compare.floorcache import cache_root, code_files, code_version
from evalkit.compare.options import MetricOptions
from evalkit.compare.pairing import LocalCompareSession
from evalkit.compare.run import compare_runs
from evalkit.fsutil import sha256_file
from evalkit.render.driver import render_suite

SMOKE = DATASETS / "smoke" / "suite.yaml"
INVERT = "evalkit.testing.renderers:Invert"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A (fp32), B (bf16) and two floors of A's backend: seeds +1 and +2."""
    root = tmp_path_factory.mktemp("runs")
    opts = {"noise": "32"}
    render_suite(SMOKE, ["cpu", "cpu,dtype=bf16"], root, renderer=INVERT, options=opts, progress=False)
    for off in (1, 2):
        render_suite(SMOKE, ["cpu"], root, renderer=INVERT, options=opts, seed_offset=off, progress=False)
    return {
        "a": root / "cpu",
        "b": root / "cpu_dtype-bf16",
        "seed": root / "cpu_seed+1",
        "seed2": root / "cpu_seed+2",
    }


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "floorcache"
    monkeypatch.setenv("EVALKIT_FLOOR_CACHE", str(path))
    return path


class Counting:
    """An executor whose sessions are real local sessions that note every pair they measure
    (job id, B-side clip): which floor jobs a compare measured, and which it did not."""

    def __init__(self):
        self.measured: list[tuple[str, str]] = []

    def compare_session(self, device=None, metrics=None):
        session = LocalCompareSession(device=device, metrics=metrics)
        measure = session.measure

        def counted(pairs, **kw):
            self.measured += [(p.job_id, str(p.path_b)) for p in pairs]
            return measure(pairs, **kw)

        session.measure = counted
        return session

    def floor_jobs(self, floor) -> list[str]:
        return sorted(j for j, path in self.measured if path.startswith(str(floor)))


def _compare(runs, out, floor, **kw):
    ex = Counting()
    kw.setdefault("offset", 0)
    res = compare_runs(runs["a"], runs["b"], out, floors=[floor], progress=False, executor=ex, **kw)
    return res.summary, ex


def test_second_compare_reuses_the_floor_and_says_so(runs, cache, tmp_path, cli):
    s1, ex1 = _compare(runs, tmp_path / "r1", runs["seed"])
    jobs = sorted(s1["jobs"]["compared"])
    assert len(jobs) == 2 and ex1.floor_jobs(runs["seed"]) == jobs
    assert s1["floors"]["seed"]["cache"]["measured"] == jobs
    assert s1["floors"]["seed"]["cache"]["reused"] == []

    s2, ex2 = _compare(runs, tmp_path / "r2", runs["seed"])
    assert ex2.floor_jobs(runs["seed"]) == []  # not measured again
    assert sorted(ex2.measured) == sorted(ex1.measured[:2])  # only A against B
    c = s2["floors"]["seed"]["cache"]
    assert sorted(c["reused"]) == jobs and c["measured"] == []
    assert c["from"][0]["report"] == str((tmp_path / "r1").resolve())
    assert c["text"].startswith(f"floor seed: reused from the compare into {tmp_path / 'r1'}")
    # the same numbers, to the last bit: the report reads them back from the cache
    assert s2["floors"]["seed"]["aggregates"] == s1["floors"]["seed"]["aggregates"]
    assert s2["floor_ratios"] == s1["floor_ratios"]
    assert [f["text"] for f in s2["clip_findings"]] == [f["text"] for f in s1["clip_findings"]]
    assert s2["headline"] == s1["headline"]
    html = (tmp_path / "r2" / "index.html").read_text()
    assert "floor seed: reused from the compare into" in html

    # the command line says it too; an entry that cannot be read is measured again
    entries = sorted(cache.rglob("*.json"))
    assert len(entries) == 2
    entries[0].write_text("{not json")
    code, out, _ = cli(
        "compare",
        runs["a"],
        runs["b"],
        "--floor",
        runs["seed"],
        "--offset",
        "0",
        "--out",
        tmp_path / "r3",
        "--quiet",
    )
    assert code == 0 and "floor seed: reused from the compare into" in out
    assert "(1 of 2 jobs; 1 measured again" in out
    s3 = json.loads((tmp_path / "r3" / "summary.json").read_text())
    assert s3["floor_ratios"] == s1["floor_ratios"]
    # --remeasure-floor measures every floor job again
    code, out, _ = cli(
        "compare",
        runs["a"],
        runs["b"],
        "--floor",
        runs["seed"],
        "--offset",
        "0",
        "--out",
        tmp_path / "r4",
        "--quiet",
        "--remeasure-floor",
    )
    assert code == 0 and "floor seed: measured (2 jobs; floor cache off)" in out
    assert json.loads((tmp_path / "r4" / "summary.json").read_text())["floor_ratios"] == s1["floor_ratios"]


def test_a_changed_input_is_measured_again(runs, cache, tmp_path):
    s1, _ = _compare(runs, tmp_path / "r1", runs["seed"])
    jobs = sorted(s1["jobs"]["compared"])

    # another metric setting: every floor job again
    s2, ex = _compare(runs, tmp_path / "r2", runs["seed"], metrics=MetricOptions(temporal=False))
    assert ex.floor_jobs(runs["seed"]) == jobs
    assert "tof" not in s2["floors"]["seed"]["aggregates"]

    # another offset rule: again
    _, ex = _compare(
        runs, tmp_path / "r2b", runs["seed"], metrics=MetricOptions(temporal=False), offset="auto"
    )
    assert ex.floor_jobs(runs["seed"]) == jobs

    # one floor clip re-rendered (the floor's manifest says so): that job only
    floor = shutil.copytree(runs["seed"], tmp_path / "cpu_seed+1")
    m = json.loads((floor / "manifest.json").read_text())
    other = json.loads((runs["seed2"] / "manifest.json").read_text())
    job = jobs[0]
    rec = next(j for j in m["jobs"] if j["id"] == job)
    src = next(j for j in other["jobs"] if j["id"] == job)
    shutil.copyfile(runs["seed2"] / src["output"]["path"], floor / rec["output"]["path"])
    rec["output"]["sha256"] = sha256_file(floor / rec["output"]["path"])
    (floor / "manifest.json").write_text(json.dumps(m, indent=2))
    s3, ex = _compare(runs, tmp_path / "r3", floor)
    assert ex.floor_jobs(floor) == [job]
    c = s3["floors"]["seed"]["cache"]
    assert c["measured"] == [job] and c["reused"] == jobs[1:]
    assert "1 measured again" in c["text"]
    assert s3["floors"]["seed"]["aggregates"] != s1["floors"]["seed"]["aggregates"]
    # the changed job's floor is the seed+2 clip's: keyed by the clips' bytes, a compare
    # against seed+2 reuses that job's measurement and measures only the other
    s4, ex = _compare(runs, tmp_path / "r4", runs["seed2"])
    assert ex.floor_jobs(runs["seed2"]) == jobs[1:]
    assert s4["floors"]["seed"]["cache"]["reused"] == [job]
    assert s4["floors"]["seed"]["cache"]["from"][0]["report"] == str((tmp_path / "r3").resolve())
    f3 = {f["clip"]: f for f in s3["clip_findings"]}
    f4 = {f["clip"]: f for f in s4["clip_findings"]}
    assert f3[job]["text"] == f4[job]["text"]


def test_a_cache_that_cannot_be_written_only_costs_time(runs, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EVALKIT_FLOOR_CACHE", str(blocker / "floors"))
    s, ex = _compare(runs, tmp_path / "r1", runs["seed"], metrics=MetricOptions(temporal=False))
    assert len(ex.floor_jobs(runs["seed"])) == 2
    assert s["floors"]["seed"]["cache"]["reused"] == [] and s["floors"]["seed"]["jobs_compared"] == 2
    assert blocker.read_text() == "not a folder"


def test_code_version_follows_the_metrics_source(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALKIT_FLOOR_CACHE", "off")
    assert cache_root() is None
    monkeypatch.setenv("EVALKIT_FLOOR_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    files = []
    for p in code_files():
        q = tmp_path / p.name
        q.write_bytes(p.read_bytes())
        files.append(q)
    assert any(p.name == "perceptual.py" for p in files)
    before = code_version(files)
    assert code_version(files) == before
    lp = next(p for p in files if p.name == "perceptual.py")
    lp.write_text(lp.read_text() + "\n# changed\n")
    assert code_version(files) != before
