"""The disk cache of simulated figures (plan, design_check): same value cached or not."""

from __future__ import annotations

import json

from evalkit.study import simcache


def test_cached_value_is_reused_and_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return {"raters": 39, "scenarios": (0.5, 0.6), "ok": True}

    first = simcache.cached("plan", {"margin": 0.1}, compute)
    second = simcache.cached("plan", {"margin": 0.1}, compute)
    assert calls == [1]
    assert first == second == {"raters": 39, "scenarios": [0.5, 0.6], "ok": True}
    other = simcache.cached("plan", {"margin": 0.05}, compute)
    assert calls == [1, 1] and other == first
    files = sorted((tmp_path / "sims").glob("plan-*.json"))
    assert len(files) == 2 and json.loads(files[0].read_text())["raters"] == 39


def test_a_cache_that_cannot_be_written_only_recomputes(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(blocker))
    calls = []
    for _ in range(2):
        assert simcache.cached("design_check", {"raters": 3}, lambda: calls.append(1) or 7) == 7
    assert calls == [1, 1]


def test_a_corrupt_cache_file_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path))
    path = simcache.path_for("plan", {"m": 1})
    path.parent.mkdir(parents=True)
    path.write_text("{truncated")
    assert simcache.cached("plan", {"m": 1}, lambda: {"v": 1}) == {"v": 1}
    assert json.loads(path.read_text()) == {"v": 1}


def test_a_plan_of_another_rule_version_is_not_served(tmp_path, monkeypatch):
    # the planner's rule changed (RULE_VERSION 2: clips for answers barely below chance): a
    # plan cached under the earlier rule, with the same arguments, must not come back
    from evalkit.study import stats

    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path))
    args = {"protocol": "abx", "margin": 0.1, "clips": 15, "alpha": 0.05}
    monkeypatch.setattr(stats, "RULE_VERSION", stats.RULE_VERSION - 1)
    old = simcache.path_for("plan", args)
    assert simcache.cached("plan", args, lambda: {"raters": 39, "clips": 15})["raters"] == 39
    monkeypatch.undo()
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path))
    assert simcache.path_for("plan", args) != old and old.exists()
    assert simcache.cached("plan", args, lambda: {"raters": 22, "clips": 41}) == {"raters": 22, "clips": 41}


def test_the_key_covers_the_protocol_objects(tmp_path, monkeypatch):
    # the planner's steps per protocol live in evalkit/study/protocols/: a change there (as in
    # stats, simulate or planning) must make a new key, never serve a plan of the old code
    from pathlib import Path

    import evalkit.study.protocols as protocols

    folder = Path(protocols.__file__).parent
    names = {p.name for p in simcache.sources()}
    assert {"stats.py", "simulate.py", "planning.py"} <= names
    assert {p.name for p in folder.glob("*.py")} <= names and "abx.py" in names
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path))
    args = {"protocol": "preference", "margin": 0.1, "clips": 15, "alpha": 0.05}
    before = simcache.path_for("plan", args)
    originals = simcache.sources()

    def key_of_copies(changed: str | None):
        copies = []
        for p in originals:
            c = tmp_path / (changed or "same") / p.parent.name / p.name
            c.parent.mkdir(parents=True, exist_ok=True)
            c.write_bytes(p.read_bytes() + (b"# changed\n" if p.name == changed else b""))
            copies.append(c)
        monkeypatch.setattr(simcache, "sources", lambda: copies)
        monkeypatch.setattr(simcache, "_SOURCE", None)
        return simcache.path_for("plan", args)

    assert key_of_copies(None) == before  # the same bytes: the same key
    assert key_of_copies("preference.py") != before
    assert key_of_copies("abx.py") != before
