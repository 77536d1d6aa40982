"""Crashes and concurrency: ``render`` and ``compare`` SIGKILLed at fixed crash points
(``EVALKIT_KILL_AT``: the process kills itself there, so no timing is involved), and a second
render started on a run folder that a first one holds.

benchmarks/kill_loop.py does the same with 20 or more kills of each, at random moments.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit.fsutil import atomic_dir, cleanup_dir_leftovers, dir_leftovers
from evalkit.render.driver import render_suite
from evalkit.testing import crash
from evalkit.testing.suites import write_suite

pytestmark = pytest.mark.slow  # processes killed at crash points

INVERT = "evalkit.testing.renderers:Invert"
CLIP = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"

# The command renderer's program: writes a marker, waits for a gate file, then inverts the frames.
HOLD_SCRIPT = """\
import os, sys, time
from pathlib import Path
import numpy as np
from PIL import Image
marker, gate = Path(sys.argv[1]), Path(sys.argv[2])
marker.touch()
while not gate.exists():
    time.sleep(0.02)
out = Path(os.environ["EVALKIT_OUTPUT_DIR"])
for p in sorted(Path(os.environ["EVALKIT_INPUT_FRAMES"]).iterdir()):
    Image.fromarray(255 - np.asarray(Image.open(p))).save(out / p.name)
"""


def make_suite(tmp_path, prompts=("a", "b"), seeds=(0,)):
    return write_suite(tmp_path, CLIP, name="crash", prompts=prompts, seeds=seeds)


# -- two renders on one run folder -----------------------------------------------------------


def test_a_second_render_on_a_held_run_folder_is_refused_and_touches_nothing(tmp_path):
    suite = make_suite(tmp_path)
    script = tmp_path / "hold.py"
    script.write_text(HOLD_SCRIPT)
    marker, gate = tmp_path / "started", tmp_path / "gate"
    cmd = f"{sys.executable} {script} {marker} {gate}"
    out = tmp_path / "out"
    render = crash.evalkit_cmd(
        "render",
        suite,
        "--backend",
        "cpu",
        "--out",
        out,
        "--renderer",
        "command",
        "-O",
        f"cmd={cmd}",
        "--quiet",
    )
    first = crash.subprocess.Popen(
        render, stdout=crash.subprocess.PIPE, stderr=crash.subprocess.PIPE, text=True
    )
    try:
        # the first render is inside its first job: manifest written, lock held, the job's
        # temporary work folder (source clip, frames, job.json) in flight under .work/
        crash.wait_for(marker.exists, what="the first render's first job")
        run = out / "cpu"
        before = crash.tree(run)
        assert (run / "manifest.json").is_file() and any(k.startswith(".work/") for k in before)

        second = crash.run(render)
        assert second.returncode == 2
        assert_one_line_error(second.stderr, str(run), "another evalkit render holds this run folder")
        assert crash.tree(run) == before  # not a byte, not a timestamp changed
        assert not marker.with_name("started2").exists()
    finally:
        gate.touch()
        stdout, stderr = first.communicate()
    assert first.returncode == 0, stderr
    assert "2 rendered, 0 already done, 0 failed" in stdout

    clean = render_suite(
        suite, ["cpu"], tmp_path / "clean", renderer="command", options={"cmd": cmd}, progress=False
    )[0]
    assert clean.done == 2
    assert crash.clips(out / "cpu") == crash.clips(clean.path) and len(crash.clips(clean.path)) == 4
    assert crash.temporaries(out / "cpu") == []


def test_a_render_refused_by_one_backend_folder_leaves_no_folder_for_another(tmp_path):
    from evalkit.errors import UserError
    from evalkit.render.driver import lock_run_folder

    suite = make_suite(tmp_path)
    held = lock_run_folder(tmp_path / "out" / "cpu_dtype-bf16")  # as another render would
    try:
        with pytest.raises(UserError, match="another evalkit render holds this run folder"):
            render_suite(suite, ["cpu", "cpu,dtype=bf16"], tmp_path / "out", renderer=INVERT, progress=False)
    finally:
        crash.os.close(held)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu_dtype-bf16"]
    assert [p.name for p in (tmp_path / "out" / "cpu_dtype-bf16").iterdir()] == [".lock"]


# -- render killed ---------------------------------------------------------------------------


def test_render_killed_at_crash_points_resumes_to_identical_clips(tmp_path):
    """Crash points (two per atomic file write: the temporary file complete, then renamed): 1-2
    the manifest; per job 2 for the source clip in its .work/ folder (the main thread), then 6
    for its clip and preview (encoder threads, side by side, while the next job renders) and
    its manifest record (the recorder thread, in job order, once both files are in place):
    26 in all. At 3 the first job's work folder is half made; at 25 (odd: a temporary file is
    in flight) the last job's manifest record is being written, which comes after everything
    else: exactly two jobs are recorded, whatever the threads' order."""
    suite = make_suite(tmp_path, prompts=("a", "b", "c"))
    script = tmp_path / "hold.py"
    script.write_text(HOLD_SCRIPT)
    (tmp_path / "gate").touch()
    cmd = f"{sys.executable} {script} {tmp_path / 'started'} {tmp_path / 'gate'}"
    out, run = tmp_path / "out", tmp_path / "out" / "cpu"
    render = crash.evalkit_cmd(
        "render",
        suite,
        "--backend",
        "cpu",
        "--out",
        out,
        "--renderer",
        "command",
        "-O",
        f"cmd={cmd}",
        "--quiet",
    )
    for kill_at, done, temporary in ((3, 0, "/.work/cmd-"), (25, 2, "/.tmp-")):
        killed = crash.run(render, kill_at=kill_at)
        assert killed.returncode == -9, killed.stderr
        state = crash.check_run(run)  # manifest valid, done jobs verified
        assert state["done"] == done
        assert any(temporary in t for t in crash.temporaries(run)), crash.temporaries(run)
    again = crash.run(render)
    assert again.returncode == 0, again.stderr
    assert "1 rendered, 2 already done, 0 failed" in again.stdout
    assert crash.temporaries(run) == []
    clean = render_suite(
        suite, ["cpu"], tmp_path / "clean", renderer="command", options={"cmd": cmd}, progress=False
    )[0]
    assert crash.clips(run) == crash.clips(clean.path) and len(crash.clips(run)) == 6


# -- compare killed --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash_runs")
    suite = make_suite(root, prompts=("a",), seeds=(0, 1))
    render_suite(suite, ["cpu", "cpu,dtype=bf16"], root / "runs", renderer=INVERT, progress=False)
    return {"a": root / "runs" / "cpu", "b": root / "runs" / "cpu_dtype-bf16"}


def compare_cmd(a, b, out):
    return crash.evalkit_cmd("compare", a, b, "--out", out, "--device", "cpu", "--no-temporal", "--quiet")


def test_compare_killed_leaves_the_old_or_the_new_report_whole(two_runs, tmp_path):
    """A report of 2 jobs is 12 files (24 crash points) written into a temporary folder, then
    25: before the exchange with the old report, 26: after it. At 7 the new report is half
    written; at 26 the old one, swapped out, is not yet removed."""
    r = two_runs
    out = tmp_path / "report"
    old = crash.run(compare_cmd(r["b"], r["a"], out))  # the older report: B against A
    assert old.returncode == 0, old.stderr
    known = {"old": crash.report_digest(out)}
    assert known["old"] is not None
    new = compare_cmd(r["a"], r["b"], out)

    for kill_at, state in ((7, "old"), (26, "new")):
        killed = crash.run(new, kill_at=kill_at)
        assert killed.returncode == -9, killed.stderr
        assert dir_leftovers(out), "the kill left its temporary folder"
        if state == "new":
            known["new"] = crash.report_digest(out)
            assert known["new"] is not None and known["new"] != known["old"]
        assert crash.report_state(out, known) == state
    again = crash.run(new)
    assert again.returncode == 0, again.stderr
    assert crash.report_state(out, known) == "new"  # identical to the killed one's
    assert crash.temporaries(out) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"]["b"]["path"].endswith("cpu_dtype-bf16")
    assert len(summary["jobs"]["compared"]) == 2


def test_a_kill_between_the_two_renames_is_undone_on_the_next_start(tmp_path, monkeypatch):
    """Where the filesystem cannot exchange two folders in one step, the old report is renamed
    aside, then the new one in; a kill in between leaves no report folder, which the next start
    puts back from the old one."""
    from evalkit import fsutil

    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.json").write_text("old\n")
    monkeypatch.setattr(fsutil, "_exchange", lambda a, b: False)
    with atomic_dir(out) as tmp:
        (tmp / "summary.json").write_text("new\n")
    assert (out / "summary.json").read_text() == "new\n" and not dir_leftovers(out)

    # the state a kill after the first rename leaves: the old folder aside, the new one unmoved
    aside = tmp_path / ".report.old-0123456789ab"
    out.rename(aside)
    (tmp_path / ".report.tmp-0123456789ab").mkdir()
    (tmp_path / ".report.tmp-0123456789ab" / "summary.json").write_text("newer\n")
    cleanup_dir_leftovers(out)
    assert (out / "summary.json").read_text() == "new\n" and not dir_leftovers(out)


def test_compare_refuses_an_out_folder_that_is_not_a_report(two_runs, tmp_path, cli):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    code, _, err = cli(
        "compare", two_runs["a"], two_runs["b"], "--out", out, "--quiet", "--device", "cpu", "--no-temporal"
    )
    assert code == 2
    assert_one_line_error(err, str(out), "'notes.txt'", "not part of a compare report")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    shutil.rmtree(out)


# -- no room to write ------------------------------------------------------------------------


def _limited(limit: int):
    """A child's ``preexec_fn``: files it writes may grow to ``limit`` bytes (``ulimit -f``), a
    write beyond fails with EFBIG ("File too large"), as a full disk's fails with ENOSPC."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal's kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _run_limited(cmd, limit):
    return crash.subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_limited(limit), timeout=600)


def test_render_without_room_for_its_manifest_says_which_file_and_loses_nothing(tmp_path):
    """Two jobs done; the rest rendered where no file may pass 2,000 bytes: each clip's write
    fails (that job fails), then the manifest's save (5 KB): one line naming it, exit 2, the
    manifest as it was, no temporary file left; the same command with room resumes."""
    suite = make_suite(tmp_path, prompts=("a", "b", "c"), seeds=(0, 1))
    out, run = tmp_path / "out", tmp_path / "out" / "cpu"
    render = crash.evalkit_cmd(
        "render", suite, "--backend", "cpu", "--out", out, "--renderer", INVERT, "--quiet"
    )
    first = crash.run([*render, "--jobs", "pan-a"])
    assert first.returncode == 0, first.stderr
    before = crash.tree(run)
    assert before["manifest.json"][1] > 2000

    full = _run_limited(render, 2000)
    assert full.returncode == 2, full.stderr
    assert_one_line_error(
        full.stderr,
        str(run / "manifest.json"),
        "could not be written",
        "File too large",
        "kept as it was",
        "nothing was lost",
    )
    assert {k: v for k, v in crash.tree(run).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }
    assert crash.temporaries(run) == []
    again = crash.run(render)
    assert again.returncode == 0, again.stderr
    assert "4 rendered, 2 already done, 0 failed" in again.stdout


def test_compare_without_room_for_its_report_keeps_the_old_one(two_runs, tmp_path):
    """A report of 2 jobs written where no file may pass 1,000 bytes: one line naming the
    report's file that did not fit, exit 2, the old report whole, nothing left beside it."""
    r, out = two_runs, tmp_path / "report"
    old = crash.run(compare_cmd(r["b"], r["a"], out))
    assert old.returncode == 0, old.stderr
    digest = crash.report_digest(out)
    full = _run_limited(compare_cmd(r["a"], r["b"], out), 1000)
    assert full.returncode == 2, full.stderr
    assert_one_line_error(
        full.stderr,
        str(out) + "/",
        "could not be written",
        "File too large",
        f"{out} is kept as it was",
        "nothing was lost",
    )
    assert crash.report_digest(out) == digest
    assert crash.temporaries(out) == [] and not dir_leftovers(out)


# -- study create killed ---------------------------------------------------------------------

TEMP_HOLDER = """\
import os, sys
from evalkit.fsutil import hold, mkstemp
fd, path = mkstemp(prefix=".tmp-", suffix=".mp4", dir=sys.argv[1])
hold(fd)                                   # as study create holds a browser copy it writes
os.write(fd, b"half a video")
print(path, flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), 9)                # killed mid-write: the file stays behind
sys.stdin.read()                           # still writing until told to stop
"""


def test_study_create_removes_what_a_killed_create_left_in_the_media_folder(reports, tmp_path):
    """A create killed while writing a browser copy leaves its ``.tmp-*.mp4``; the next create
    into that media folder removes it, and leaves alone one that a live process is writing."""
    media = tmp_path / "s.media"
    media.mkdir()
    cmd = [sys.executable, "-c", TEMP_HOLDER, str(media)]
    dead = crash.subprocess.run([*cmd, "die"], capture_output=True, text=True, timeout=60)
    assert dead.returncode == -9, dead.stderr
    stale = crash.Path(dead.stdout.strip())
    live = crash.subprocess.Popen(
        [*cmd, "live"], stdin=crash.subprocess.PIPE, stdout=crash.subprocess.PIPE, text=True
    )
    try:
        busy = crash.Path(live.stdout.readline().strip())
        assert stale.is_file() and busy.is_file()
        made = crash.run(
            crash.evalkit_cmd(
                "study",
                "create",
                "--allow-masking",
                reports(seeds=(0,)),
                "--db",
                tmp_path / "s.db",
                "--protocol",
                "abx",
                "--clips",
                "sample:1",
            )
        )
        assert made.returncode == 0, made.stderr
        assert not stale.exists()
        assert busy.is_file()
        assert [p.name for p in media.glob(".tmp-*")] == [busy.name]
        assert len(list(media.glob("*.mp4"))) > 1
    finally:
        live.communicate("")
