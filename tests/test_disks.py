"""Read-only and full disks, for real (issue 47): every command that writes, run on a folder
bind-mounted read-only or on a tmpfs filled to the last block (:mod:`evalkit.testing.disks`:
user and mount namespaces, no root needed, nothing hooked in evalkit), answers one line
``error: ...`` saying what is wrong (read-only, no space) and exits 2: no traceback, and never
"not an SQLite study database" for a sound database. ``serve`` on a disk that fills while it
runs answers 503 with one log line per request, not a 500 and its tracebacks."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
from conftest import assert_one_line_error

from evalkit import study
from evalkit.study import store
from evalkit.testing import disks
from evalkit.testing.server import Server

pytestmark = [
    pytest.mark.slow,  # a process per command, each in its own namespaces
    pytest.mark.skipif(
        not disks.available(), reason="unprivileged user and mount namespaces not allowed here"
    ),
]

RENDER = ["-r", "evalkit.testing.renderers:Invert", "--quiet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder with a suite, two rendered runs, their compare report, a gate and a study
    database with a study and a rater: what the commands below read and write."""
    from evalkit.testing.studies import make_report

    root = tmp_path_factory.mktemp("disks")
    report = make_report(root, seeds=(0,))
    db = root / "s.db"
    sid = study.create_study(report, db, protocol="abx", clips_spec="sample:1", allow_masking=True)["study"]
    study.invite(db, sid, 1)
    store.close_all()
    (root / "g.yaml").write_text("lpips: {mean: {max: 5}}\n")
    return root


#: command -> its arguments (paths relative to the world folder)
COMMANDS = {
    "render-new-folder": ["render", "suite.yaml", "-b", "cpu", "-o", "out", *RENDER],
    "render-resume": ["render", "suite.yaml", "-b", "cpu,dtype=fp16", "-o", "runs", *RENDER],
    "compare": ["compare", "runs/cpu", "runs/cpu_dtype-bf16", "--out", "rep2", "--device", "cpu", "--quiet"],
    "floor": ["floor", "runs/cpu", "--out", "runs", "--quiet"],
    "gate-pin": ["gate", "report", "--gate", "g.yaml", "--pin"],
    "study-create": ["study", "create", "report", "--db", "new.db", "--protocol", "abx", "--allow-masking"],
    "study-results": ["study", "results", "--db", "s.db", "--study", "1"],
    "study-invite": ["study", "invite", "--db", "s.db", "--study", "1"],
    "study-unblind": ["study", "unblind", "--db", "s.db", "--study", "1", "--who", "me", "--reason", "check"],
}
READ_ONLY = [
    "render-new-folder",
    "render-resume",
    "compare",
    "floor",
    "gate-pin",
    "study-results",
    "study-invite",
    "study-unblind",
]
FULL = ["render-new-folder", "gate-pin", "study-create", "study-results"]


@pytest.mark.parametrize("name", READ_ONLY)
def test_commands_on_a_read_only_folder_say_so_in_one_line(world, name):
    r = disks.evalkit(*COMMANDS[name], readonly=[world], cwd=world)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-3000:])
    assert_one_line_error(r.stderr)
    line = r.stderr.strip().lower()
    assert "read-only" in line and "not an sqlite study database" not in line, line
    assert ".tmp-" not in line, line  # the place named, not an atomic write's temporary


@pytest.mark.parametrize("name", ["study-invite", "study-unblind"])
def test_writes_to_a_read_only_database_file_say_so_in_one_line(world, name):
    """The database file alone read-only (its folder writable: SQLite opens it and reads; the
    first write is refused)."""
    r = disks.evalkit(*COMMANDS[name], readonly=[world / "s.db"], cwd=world)
    store.open_db(world / "s.db")  # its -wal and -shm, left beside it, folded back in
    store.close_all()
    assert not (world / "s.db-wal").exists()
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-3000:])
    assert_one_line_error(r.stderr, "--db s.db", "cannot be written", "read-only")


@pytest.mark.parametrize("name", FULL)
def test_commands_on_a_full_disk_say_so_in_one_line(world, name):
    r = disks.evalkit(*COMMANDS[name], full=[world], cwd=world)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-3000:])
    assert_one_line_error(r.stderr)
    line = r.stderr.strip().lower()
    assert "no space left" in line and "make room" in line, line
    assert "not an sqlite study database" not in line, line


def test_serve_refuses_to_start_on_a_read_only_database_in_one_line(world):
    from evalkit.testing.server import free_port

    r = disks.evalkit("serve", "--db", "s.db", "--port", free_port(), readonly=[world], cwd=world)
    assert r.returncode == 2, r.stderr[-3000:]
    assert_one_line_error(r.stderr, "--db s.db", "read-only file system")


def test_serve_on_a_disk_that_fills_answers_503_with_one_log_line(world):
    """The database's disk fills while the server runs: a rater's request is answered 503
    (Retry-After) through the JSON API and a one-line message through the page's event, one
    log line each, no traceback; pages that need no write still load."""
    db = world / "s.db"
    n = 3
    toks = [r["token"] for r in study.invite(db, 1, n + 2)]  # a rater's first trial: a write
    store.close_all()
    server = Server(db, wrap=partial(disks.command, full=[world], fill=False)).start()
    u = server.url
    try:
        assert httpx.get(f"{u}/api/trial", params={"token": toks[0]}).status_code == 200
        assert disks.fill_up(server.proc.pid, world) > 0
        for tok in toks[1 : n + 1]:
            r = httpx.get(f"{u}/api/trial", params={"token": tok})
            assert r.status_code == 503 and r.headers["retry-after"] == "30", r.text
            assert "disk is full or read-only" in r.text and len(r.text) < 200
        r = httpx.post(f"{u}/gradio_api/run/trial?token={toks[-1]}", json={"data": []})
        assert r.status_code == 200, r.text[:300]
        assert "disk is full or read-only" in r.json()["data"][0]["fatal"]
        assert httpx.get(f"{u}/healthz").status_code == 200
    finally:
        server.stop()
    log = server.proc.stdout.read()
    assert "Traceback" not in log, log[-3000:]
    lines = [ln for ln in log.splitlines() if ln.strip()]
    assert sum("503" in ln for ln in lines) == n, log
    assert sum("unavailable" in ln for ln in lines) == 1, log
    assert len(lines) <= n + 2, log  # and the line saying it stopped
