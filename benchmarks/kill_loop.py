"""SIGKILL `evalkit render` and `evalkit compare` at random moments, then check what is on disk.

Seeded; each kill is either timed (SIGKILL after a delay drawn uniformly from a little before the
first write of a clean run of the same command to its end: earlier, a kill only interrupts the
imports) or at a crash point (``EVALKIT_KILL_AT``: the process kills itself at its Nth
atomic-write step, drawn uniformly over the steps of a whole run; see
evalkit.fsutil.crash_point), half and half.

- render: the command renderer (a Python program per job, work folders under the run's .work/)
  renders a 6-job suite. An episode starts from an empty folder and kills render again and
  again (each time resuming the last) until a render finishes. After every kill the run folder's
  manifest is absent or valid and every job it marks done has its verified clip; at the end of
  each episode the clips and previews are byte-identical to a clean run's and no temporary file
  or work folder is left.
- compare: a 2-job report (with --no-temporal) over an older, different report of the same
  folder. An episode puts the old report back, kills compare 1-3 times, then lets it finish.
  After every kill the report folder is the complete old report or the complete new one (every
  file, every image the HTML names, summary.json, nothing else); at the end of each episode it is
  the new one, identical to a clean run's, and nothing temporary is left next to it.

Also counts evalkit-cmd-* folders in the system temporary folder before and after.

    python benchmarks/kill_loop.py [--kills 24] [--seed 19] > benchmarks/results/kill_loop.txt
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import random
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIPS = ROOT / "datasets" / "smoke" / "clips"

RENDER_SCRIPT = """\
import os, sys
from pathlib import Path
import numpy as np
from PIL import Image
out = Path(os.environ["EVALKIT_OUTPUT_DIR"])
for p in sorted(Path(os.environ["EVALKIT_INPUT_FRAMES"]).iterdir()):
    Image.fromarray(255 - np.asarray(Image.open(p))).save(out / p.name)
"""


def log(*a) -> None:
    print(*a, flush=True)


def system_temp_entries() -> set[str]:
    """The command renderer's work folders in the system temporary folder (before the fix)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("evalkit-cmd-*")}


def timed_clean_run(cmd, first_write) -> tuple[float, float]:
    """Run ``cmd`` to its end: (seconds until ``first_write()`` held, seconds in all)."""
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = None
    while proc.poll() is None:
        if first is None and first_write():
            first = time.perf_counter() - t0
        time.sleep(0.01)
    total = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr.read()
    return (first if first is not None else total), total


def draw_kill(rng: random.Random, window: tuple[float, float], points: int) -> dict:
    """Half timed (a delay uniform over the clean run's writing time: from a little before its
    first write to its end; earlier kills only interrupt imports), half at a crash point."""
    if rng.random() < 0.5:
        return {"mode": "timed", "delay": round(rng.uniform(*window), 3)}
    return {"mode": "point", "kill_at": rng.randint(1, points)}


def run_killed(crash, cmd, kill: dict):
    return crash.run(cmd, kill_at=kill.get("kill_at"), delay=kill.get("delay"))


def describe(kill: dict) -> str:
    return f"delay {kill['delay']:.2f} s" if kill["mode"] == "timed" else f"point {kill['kill_at']}"


def render_loop(crash, work: Path, rng: random.Random, kills: int) -> dict:
    script = work / "render.py"
    script.write_text(RENDER_SCRIPT)
    suite = work / "suite.yaml"
    suite.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: killloop
        clips:
          - {{id: pan, path: {CLIPS / "astronaut_pan.mkv"}}}
          - {{id: obj, path: {CLIPS / "hubble_object.mkv"}}}
        prompts: ["a", "b", "c"]
        seeds: [0]
    """)
    )

    def cmd(out):
        return crash.evalkit_cmd(
            "render",
            suite,
            "--backend",
            "cpu",
            "--out",
            out,
            "--renderer",
            "command",
            "-O",
            f"cmd={sys.executable} {script}",
            "--quiet",
        )

    for clean in ("warmup", "clean"):  # the second, with warm caches, is timed
        first, length = timed_clean_run(
            cmd(work / clean), lambda: (work / clean / "cpu" / "manifest.json").exists()
        )
    window = (0.8 * first, length)
    reference = crash.clips(work / "clean" / "cpu")
    points = 2 + 8 * 6  # manifest; per job: source clip in .work, clip, preview, manifest
    log(
        f"render: clean run {length:.1f} s (first write at {first:.1f} s), {len(reference)} clips "
        f"and previews, {points} crash points; timed kills at {window[0]:.1f}-{window[1]:.1f} s"
    )

    stats = collections.Counter()
    landed = collections.Counter()
    problems: list[str] = []
    episode = 0
    done_kills = 0
    while done_kills < kills:
        episode += 1
        out = work / f"render{episode}"
        run = out / "cpu"
        while True:
            # a resumed render has fewer jobs to do: the timed window shrinks in proportion;
            # once every job is done the episode ends with a run that is not killed
            try:
                left = 6 - crash.check_run(run)["done"]
            except Exception:  # reported as a problem after the kill that caused it
                left = 6
            win = (window[0], window[0] + (window[1] - window[0]) * left / 6)
            kill = draw_kill(rng, win, points) if done_kills < kills and left else {"mode": "none"}
            res = run_killed(crash, cmd(out), kill)
            if res.returncode != -9:
                if kill["mode"] != "none":
                    stats["finished first"] += 1
                    log(f"  render run (episode {episode}, {describe(kill)}) finished before its kill")
                break
            done_kills += 1
            stats[kill["mode"]] += 1
            try:
                state = crash.check_run(run)
            except Exception as e:  # an invalid manifest, a done job without its clip
                problems.append(f"kill {done_kills}: {type(e).__name__}: {e}")
                state = {"manifest": "INVALID", "done": "?", "temporaries": "?"}
            where = (
                f"{state['done']}/6 done"
                if state["manifest"] is True
                else "no manifest yet"
                if state["manifest"] is False
                else "INVALID"
            )
            landed[
                "no manifest yet" if state["manifest"] is False else f"{state['done']} of 6 jobs done"
            ] += 1
            log(
                f"  render kill {done_kills:2d} (episode {episode}, {describe(kill)}): {where}, "
                f"{state['temporaries']} temporary files or folders left"
            )
        if res.returncode != 0:
            problems.append(
                f"episode {episode}: the finishing render exited {res.returncode}: "
                f"{res.stderr.strip()[-300:]}"
            )
            continue
        same = crash.clips(run) == reference
        left = crash.temporaries(run)
        stats["episodes"] += 1
        stats["identical"] += same
        stats["clean"] += not left
        if not same:
            problems.append(f"episode {episode}: clips differ from a clean run")
        if left:
            problems.append(f"episode {episode}: temporaries left: {left}")
        log(
            f"  render episode {episode} finished: {res.stdout.strip().splitlines()[-1]}; "
            f"identical to a clean run: {same}; temporaries left: {len(left)}"
        )
    return {"stats": stats, "landed": landed, "problems": problems}


def compare_loop(crash, work: Path, rng: random.Random, kills: int) -> dict:
    from evalkit.render.driver import render_suite

    suite = work / "csuite.yaml"
    suite.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: killloopcmp
        clips: [{{id: pan, path: {CLIPS / "astronaut_pan.mkv"}}}]
        prompts: ["a"]
        seeds: [0, 1]
    """)
    )
    render_suite(
        suite,
        ["cpu", "cpu,dtype=bf16"],
        work / "runs",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )
    a, b = work / "runs" / "cpu", work / "runs" / "cpu_dtype-bf16"

    def cmd(x, y, out):
        return crash.evalkit_cmd("compare", x, y, "--out", out, "--device", "cpu", "--no-temporal", "--quiet")

    old = crash.run(cmd(b, a, work / "old"))  # the older report: B against A
    assert old.returncode == 0, old.stderr
    for clean in ("warmup", "new"):  # the second, with warm caches, is timed
        first, length = timed_clean_run(
            cmd(a, b, work / clean), lambda: bool(crash.dir_leftovers(work / clean))
        )
    window = (0.8 * first, length)
    known = {"old": crash.report_digest(work / "old"), "new": crash.report_digest(work / "new")}
    assert known["old"] and known["new"] and known["old"] != known["new"]
    points = 26  # 12 files x 2, then the exchange: before it, after it
    log(
        f"compare: clean run {length:.1f} s (report folder started at {first:.1f} s), "
        f"{points} crash points; timed kills at {window[0]:.1f}-{window[1]:.1f} s"
    )

    stats = collections.Counter()
    landed = collections.Counter()
    problems: list[str] = []
    out = work / "report"
    episode = 0
    done_kills = 0
    while done_kills < kills:
        episode += 1
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(work / "old", out)
        for _ in range(rng.randint(1, 3)):
            if done_kills >= kills:
                break
            kill = draw_kill(rng, window, points)
            was = crash.report_state(out, known)
            res = run_killed(crash, cmd(a, b, out), kill)
            if res.returncode != -9:  # finished before the kill (a late delay or point)
                stats["finished first"] += 1
                log(
                    f"  compare run (episode {episode}, {describe(kill)}) finished before its "
                    "kill: the report is new from here on"
                )
                continue
            done_kills += 1
            stats[kill["mode"]] += 1
            state = crash.report_state(out, known)
            landed[f"{state} (was {was})"] += 1
            if state not in ("old", "new"):
                problems.append(f"kill {done_kills}: report folder is {state}")
            left = crash.temporaries(out)
            log(
                f"  compare kill {done_kills:2d} (episode {episode}, {describe(kill)}): report "
                f"is the {state} one (was {was}), {len(left)} temporary folders next to it"
            )
        res = crash.run(cmd(a, b, out))
        if res.returncode != 0:
            problems.append(f"episode {episode}: the finishing compare exited {res.returncode}")
            continue
        state = crash.report_state(out, known)
        left = crash.temporaries(out)
        stats["episodes"] += 1
        stats["identical"] += state == "new"
        stats["clean"] += not left
        if state != "new":
            problems.append(f"episode {episode}: after the re-run the report is {state}")
        if left:
            problems.append(f"episode {episode}: temporaries left: {left}")
        log(f"  compare episode {episode} finished: report is the {state} one; temporaries left: {len(left)}")
    return {"stats": stats, "landed": landed, "problems": problems}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=24, help="kills of each command (default 24)")
    p.add_argument("--seed", type=int, default=19)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from evalkit.testing import crash

    rng = random.Random(a.seed)
    log(
        f"kill_loop: {a.kills} kills of each, seed {a.seed}; {platform.node()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}"
    )
    before = system_temp_entries()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kill-loop-") as tmp:
        tmp = Path(tmp)
        (tmp / "r").mkdir()
        (tmp / "c").mkdir()
        r = render_loop(crash, tmp / "r", rng, a.kills)
        c = compare_loop(crash, tmp / "c", rng, a.kills)
    new_temp = sorted(system_temp_entries() - before)
    log("")
    for name, res in (("render", r), ("compare", c)):
        s = res["stats"]
        log(
            f"{name}: {s['timed'] + s['point']} kills ({s['timed']} timed, {s['point']} at crash "
            f"points; {s['finished first']} more runs finished before their kill); where they "
            "landed: " + ", ".join(f"{k}: {v}" for k, v in sorted(res["landed"].items()))
        )
        log(
            f"{name}: {s['episodes']} episodes finished; identical to a clean run: "
            f"{s['identical']}/{s['episodes']}; no temporaries left: {s['clean']}/{s['episodes']}"
        )
        log(f"{name}: problems: {len(res['problems'])}")
        for prob in res["problems"]:
            log(f"  {prob}")
    log(f"new evalkit-cmd-* entries in {tempfile.gettempdir()}: {len(new_temp)} {new_temp or ''}")
    log(f"wall time {time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f}")
    ok = not r["problems"] and not c["problems"] and not new_temp
    log("RESULT: " + ("every kill left a consistent state" if ok else "PROBLEMS FOUND"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
