"""Shared fixtures: run the real CLI in-process or as a subprocess."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT / "datasets"
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# compare keeps floor measurements between runs (evalkit.compare.floorcache): the tests keep
# theirs for this session only, never in the user's cache
_FLOORS = tempfile.mkdtemp(prefix="evalkit-test-floors-")
os.environ.setdefault("EVALKIT_FLOOR_CACHE", _FLOORS)
atexit.register(shutil.rmtree, _FLOORS, True)


@pytest.fixture
def cli(capsys):
    """Run ``evalkit`` in-process: ``code, out, err = cli("info", "--json")``."""
    from evalkit.cli import main

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def run_interpreted(script: str, *, path=(), drop=(), **env) -> dict:
    """``script`` in a fresh interpreter under Triton's interpreter (``TRITON_INTERPRET=1`` must
    be set before triton is imported), from the repository with ``path`` after it on
    ``PYTHONPATH``, ``env`` added and the variables in ``drop`` removed; its last line of
    output as JSON (NaN parses as nan)."""
    import json

    full = dict(
        os.environ, TRITON_INTERPRET="1", **env, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, path)])
    )
    for name in drop:
        full.pop(name, None)
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_evalkit(*args, **kw) -> subprocess.CompletedProcess:
    """Run the installed ``evalkit`` entry point as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "evalkit", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=kw.pop("cwd", ROOT),
        **kw,
    )


def assert_one_line_error(err: str, *needles: str) -> None:
    """A user error is exactly one line, starts with 'error: ', has no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def _unseal_to_version_5(con, path) -> None:
    """The key back in plain columns as schema 5 kept it (trials' shown, sources and expected;
    ratings' answers, copies and correctness; clips' bits; the config's streams and catch pool), the
    design seed dropped (a schema 5 study drew its design from its seed) and the key file
    removed."""
    import json
    from pathlib import Path

    from evalkit.study import design, seal

    for sid, config, protocol in con.execute("select id, config, protocol from studies").fetchall():
        cfg = seal.unseal_config(sid, json.loads(config))
        key_file = Path(cfg.pop("seal")["key_file"])
        for cid, (swap, x) in cfg.pop("bits").items():
            con.execute("update clips set base_swap = ?, base_x = ? where id = ?", (swap, x, int(cid)))
        cfg.pop("design_seed", None)
        cfg.pop("runs", None)
        con.execute("update studies set config = ? where id = ?", (json.dumps(cfg), sid))
        key = seal.study_key({"seal": {"key_file": str(key_file)}})
        for tid, rid, o, sealed in con.execute(
            "select id, rater_id, ord, sealed from trials where study_id = ?", (sid,)
        ).fetchall():
            t = key.unseal(sealed, seal.trial_aad(rid, o))
            con.execute(
                "update trials set shown = ?, sources = ?, expected = ? where id = ?",
                (json.dumps(t["shown"]), json.dumps(t["sources"]), t["expected"], tid),
            )
            for rating, answer in con.execute(
                "select id, answer from ratings where trial_id = ?", (tid,)
            ).fetchall():
                answer = seal.open_answer(key, rid, tid, answer)
                correct = design.score(protocol, {"kind": None, **t}, answer)[0]
                con.execute(
                    "update ratings set shown = ?, sources = ?, correct = ?, answer = ? where id = ?",
                    (json.dumps(t["shown"]), json.dumps(t["sources"]), correct, answer, rating),
                )
        key_file.unlink(missing_ok=True)


#: schema version v -> the SQL that turns a version v+1 study database back into version v (the
#: reverse of evalkit.study.store.UPGRADES[v]; version 3 also loses the studies' media keys)
DOWNGRADES = {
    5: ("alter table trials drop column sealed",),
    4: ("drop table unblindings", "alter table trials drop column delivered"),
    3: (
        "alter table clips drop column media_a_alt",
        "alter table clips drop column media_b_alt",
        "alter table trials drop column fetched",
        "alter table ratings drop column client_ms",
    ),
    2: ("alter table trials drop column served",),
    1: ("alter table ratings drop column client",),
}


def old_study_db(report, path, version: int) -> int:
    """A SQLite study database at ``path`` as schema ``version`` wrote it: one ABX study of one
    clip of ``report`` made by this evalkit, then taken back down step by step; its study id."""
    import json
    import sqlite3

    from evalkit import study
    from evalkit.study import store

    sid = study.create_study(report, str(path), protocol="abx", clips_spec="sample:1", allow_masking=True)[
        "study"
    ]
    store.close_all()
    con = sqlite3.connect(path)
    for v in range(store.SCHEMA_VERSION - 1, version - 1, -1):
        if v == 5:
            _unseal_to_version_5(con, path)
        for sql in DOWNGRADES[v]:
            con.execute(sql)
        if v == 3:
            for row, config in con.execute("select id, config from studies").fetchall():
                cfg = json.loads(config)
                del cfg["media_key"]
                con.execute("update studies set config = ? where id = ?", (json.dumps(cfg), row))
    con.execute("update meta set value = ? where key = 'schema_version'", (str(version),))
    con.commit()
    con.close()
    return sid


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium driven by Playwright (installed by `make test`; never downloaded)."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: run `make test` (it installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def reports(tmp_path_factory):
    """``reports(seeds=..., fps=...)``: :func:`evalkit.testing.studies.make_report` made once per
    session for each (seeds, fps) and shared by the modules that ask for the same one (a report
    takes about a second a clip to render and compare). Shared read-only: tests make their
    studies from it (each study's media lie beside its own database), never change it."""
    from evalkit.testing.studies import make_report

    made = {}

    def get(seeds=(0, 1, 2), fps=None):
        key = (tuple(seeds), fps)
        if key not in made:
            made[key] = make_report(tmp_path_factory.mktemp("report"), seeds=key[0], fps=fps)
        return made[key]

    return get


def load_tool(name: str):
    """A script of ``tools/`` as a module (they are not part of the installed package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
