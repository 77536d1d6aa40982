"""Study storage and commands: real SQLite files, a real PostgreSQL server, real media."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from evalkit import study
from evalkit.study import store

from conftest import ROOT, assert_one_line_error
from study_helpers import make_report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return make_report(tmp_path_factory.mktemp("study"))


def _answers(db, token, pick):
    """Answer every trial of a rater: ``pick(public_trial) -> answer``."""
    n = 0
    while (t := study.next_trial(db, token)) is not None:
        study.submit(db, token, t["trial"], pick(t), 1000 + n)
        n += 1
    return n


def test_cli_end_to_end_abx_media_and_csv(report, tmp_path, cli):
    db = tmp_path / "s.db"
    code, out, err = cli("study", "create", report, "--db", db, "--protocol", "abx",
                         "--clips", "worst:4", "--raters", "4", "--seed", "3")
    assert code == 0, err
    assert out.startswith("study 1: abx, 4 clips, 4 catch versions")
    summary = json.loads((report / "summary.json").read_text())
    lp = {r["job"]: float(r["lpips_mean"]) for r in csv.DictReader(open(report / "clips.csv"))}
    worst = sorted(lp, key=lp.get, reverse=True)[:4]
    con = sqlite3.connect(db)
    assert sorted(r[0] for r in con.execute("select job from clips")) == sorted(worst)
    assert con.execute("pragma journal_mode").fetchone()[0] == "wal"
    # media: opaque content-hash names, nothing about backend, run or job in name or bytes
    media = sorted((tmp_path / "media").iterdir())
    assert len(media) == 4 * 2 + 4
    names = [summary["runs"]["a"]["path"], summary["runs"]["b"]["path"], "bf16", "cpu_dtype",
             *lp]
    import hashlib
    for f in media:
        assert f.suffix == ".mp4" and len(f.stem) == 64
        data = f.read_bytes()
        assert hashlib.sha256(data).hexdigest() == f.stem
        for n in names:
            assert Path(n).name.encode() not in data, (f, n)
    import av
    with av.open(str(media[0])) as c:
        assert not {k: v for k, v in c.metadata.items() if k not in ("major_brand", "minor_version",
                    "compatible_brands", "encoder")}
        s = c.streams.video[0]
        assert (s.codec_context.name, s.codec_context.pix_fmt) == ("h264", "yuv420p")
    code, out, err = cli("study", "invite", "--db", db, "--study", "1", "--count", "4")
    assert code == 0, err
    tokens = [ln.rsplit("token=", 1)[1] for ln in out.splitlines()]
    assert len(tokens) == 4
    stored = {r[0] for r in con.execute("select token_sha256 from raters")}
    assert all(t not in stored and study.api.token_hash(t) in stored for t in tokens)
    # the public trial: media file names and slots only
    t = study.next_trial(str(db), tokens[0])
    assert set(t["media"]) == {"X", "A", "B"} and t["answers"] == ["A", "B"]
    assert all((tmp_path / "media" / m).is_file() for m in t["media"].values())
    assert not any(w in json.dumps(t) for w in ("bf16", "cpu", "sources", "expected", *lp))
    # raters 0-2 answer perfectly on catch trials and at chance on test trials; 3 fails catches
    rows = {r[0]: json.loads(r[1]) for r in con.execute("select id, sources from trials")}
    exp = {r[0]: r[1] for r in con.execute("select id, expected from trials")}
    kind = {r[0]: r[1] for r in con.execute("select id, kind from trials")}
    for i, tok in enumerate(tokens):
        def pick(t, i=i):
            if kind[t["trial"]] == "catch":
                right = exp[t["trial"]]
                return right if i < 3 else ("A" if right == "B" else "B")
            return "A" if t["trial"] % 2 else "B"
        assert _answers(str(db), tok, pick) == len(rows) // 4
    assert study.progress(str(db), tokens[0]) == {"done": len(rows) // 4, "total": len(rows) // 4,
                                                  "finished": True}
    code, out, err = cli("study", "results", "--db", db, "--study", "1", "--json",
                         "--csv", tmp_path / "r.csv", "--reps", "300")
    assert code == 0, err
    res = json.loads(out)
    assert res["raters"] == 4 and res["raters_included"] == 3
    assert res["excluded_raters"][0]["catch_accuracy"] == 0.0
    assert res["trials"] == 12 and len(res["per_clip"]) == 4
    assert res["verdict"] == "not shown"   # 12 ratings cannot show anything
    assert 0 <= res["accuracy"] <= 1 and res["upper_bound"] >= res["accuracy"]
    raw = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert len(raw) == len(rows)
    r0 = raw[0]
    assert set(json.loads(r0["backend_per_side"])) == {"X", "A", "B"}
    assert r0["response_ms"] and r0["correct"] in ("0", "1") and r0["rater"] and r0["trial"]
    s = list(csv.DictReader(open(tmp_path / "r.summary.csv")))
    assert s[0]["scope"] == "study" and s[0]["verdict"] == "not shown" and len(s) == 5
    code, out, err = cli("study", "results", "--db", db, "--study", "1")
    assert code == 0 and "verdict: NOT SHOWN" in out and "excluded rater" in out


def test_preference_results_count_ties(report, tmp_path):
    db = str(tmp_path / "p.db")
    sid = study.create_study(report, db, protocol="preference", seed=1)["study"]
    toks = [r["token"] for r in study.invite(db, sid, 2)]
    con = sqlite3.connect(tmp_path / "p.db")
    tr = {r[0]: (r[1], r[2], json.loads(r[3])) for r in
          con.execute("select id, kind, expected, sources from trials")}
    for tok in toks:   # catch: correct; test: pick B's side, except ties on odd trial ids
        def pick(t):
            k, e, src = tr[t["trial"]]
            if k == "catch":
                return e
            return "same" if t["trial"] % 3 == 0 else [s for s, v in src.items() if v == "b"][0]
        _answers(db, tok, pick)
    res = study.results(db, sid, reps=200)
    assert res["wins_a"] == 0 and res["wins_b"] + res["ties"] == res["trials"] == 12
    assert res["ties"] > 0 and res["win_rate_b"] == 1.0
    assert res["score_b"] == pytest.approx((res["wins_b"] + res["ties"] / 2) / 12, abs=1e-4)
    assert res["verdict"] == "not shown" and res["krippendorff_alpha"] is not None


def test_submit_is_idempotent_and_written_once(report, tmp_path):
    db = str(tmp_path / "i.db")
    sid = study.create_study(report, db, protocol="abx", clips_spec="sample:2")["study"]
    tok = study.invite(db, sid, 1)[0]["token"]
    t = study.next_trial(db, tok)
    first = study.submit(db, tok, t["trial"], "A", 812)
    again = study.submit(db, tok, t["trial"], "A", 999)
    assert first["new"] and not again["new"] and again["rating"] == first["rating"]
    with pytest.raises(study.RatingConflict, match=f"trial {t['trial']}: already answered 'A'"):
        study.submit(db, tok, t["trial"], "B", 5)
    con = sqlite3.connect(tmp_path / "i.db")
    assert con.execute("select count(*), max(response_ms) from ratings").fetchone() == (1, 812)
    assert study.next_trial(db, tok)["trial"] != t["trial"]


def test_bad_input(report, tmp_path, cli):
    db = tmp_path / "b.db"
    assert cli("study", "create", report, "--db", db, "--protocol", "abx", "--clips", "sample:1")[0] == 0
    code, out, _ = cli("study", "invite", "--db", db, "--study", "1", "--count", "2")
    t1, t2 = [ln.rsplit("token=", 1)[1] for ln in out.splitlines()]
    code, _, err = cli("study", "results", "--db", db, "--study", "9")
    assert code == 2
    assert_one_line_error(err, "study 9", "no such study")
    code, _, err = cli("study", "invite", "--db", db, "--study", "x")
    assert code == 2
    assert_one_line_error(err, "study x")
    with pytest.raises(study.UnknownToken, match="rater token: no rater"):
        study.next_trial(str(db), "not-a-token")
    with pytest.raises(study.UnknownToken):
        study.submit(str(db), "nope", 1, "A", 10)
    with pytest.raises(study.UnknownTrial, match="trial 9999: no such trial"):
        study.submit(str(db), t1, 9999, "A", 10)
    other = study.next_trial(str(db), t2)["trial"]
    with pytest.raises(study.TrialNotAssigned, match=f"trial {other}: not assigned to rater"):
        study.submit(str(db), t1, other, "A", 10)
    mine = study.next_trial(str(db), t1)["trial"]
    with pytest.raises(study.BadAnswer, match="field 'answer'"):
        study.submit(str(db), t1, mine, "left", 10)
    with pytest.raises(study.BadAnswer, match="field 'response_ms'"):
        study.submit(str(db), t1, mine, "A", "soon")
    assert sqlite3.connect(db).execute("select count(*) from ratings").fetchone() == (0,)
    # report folders: without clips, missing, not a report
    broken = tmp_path / "broken"
    shutil.copytree(report, broken)
    s = json.loads((broken / "summary.json").read_text())
    s["runs"]["b"]["path"] = str(tmp_path / "gone")
    (broken / "summary.json").write_text(json.dumps(s))
    code, _, err = cli("study", "create", broken, "--db", db, "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, str(tmp_path / "gone" / "clips"), "not found")
    s["jobs"]["compared"] = []
    (broken / "summary.json").write_text(json.dumps(s))
    code, _, err = cli("study", "create", broken, "--db", db, "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, "jobs.compared", "no compared jobs")
    code, _, err = cli("study", "create", tmp_path, "--db", db, "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, "summary.json", "not found")
    code, _, err = cli("study", "create", report, "--db", db, "--protocol", "abx", "--clips", "best:3")
    assert code == 2
    assert_one_line_error(err, "--clips", "best:3")


def test_plan_command(cli):
    code, out, err = cli("study", "plan", "--protocol", "abx", "--margin", "0.1", "--power", "0.8",
                         "--json")
    assert code == 0, err
    p = json.loads(out)
    assert p["raters"] * p["clips_per_rater"] == p["trials"] and p["simulated_power"] >= 0.8
    code, _, err = cli("study", "plan", "--protocol", "abx", "--margin", "0.7")
    assert code == 2
    assert_one_line_error(err, "margin")


def test_schema_upgrades_in_place_and_refuses_newer(report, tmp_path):
    path = tmp_path / "u.db"
    sid = study.create_study(report, str(path), protocol="abx", clips_spec="sample:1")["study"]
    store.close_all()
    con = sqlite3.connect(path)   # make it a version 1 database
    con.execute("alter table ratings drop column client")
    con.execute("alter table trials drop column served")
    con.execute("update meta set value='1' where key='schema_version'")
    con.commit()
    con.close()
    d = store.StudyDB(store.sqlite_url(path))
    assert d.schema_version() == store.SCHEMA_VERSION == 3
    cols = [r[1] for r in sqlite3.connect(path).execute("pragma table_info(ratings)")]
    assert "client" in cols
    cols = [r[1] for r in sqlite3.connect(path).execute("pragma table_info(trials)")]
    assert "served" in cols
    tok = study.invite(d, sid, 1)[0]["token"]
    t = study.next_trial(d, tok)
    study.submit(d, tok, t["trial"], "A", 10, client="test")
    d.dispose()
    con = sqlite3.connect(path)
    con.execute("update meta set value='99' where key='schema_version'")
    con.commit()
    con.close()
    from evalkit.errors import SchemaVersionError
    with pytest.raises(SchemaVersionError, match="schema version 99 is newer"):
        store.StudyDB(store.sqlite_url(path))


# -- concurrency and durability ----------------------------------------------------------------

def _hammer(db, report, media, n_threads=50):
    sid = study.create_study(report, db, protocol="abx", media_dir=media)["study"]
    toks = [r["token"] for r in study.invite(db, sid, 10)]
    # every (token, trial) of every rater, each submitted twice by different threads
    d = study.open_db(db)
    with d.engine.connect() as conn:
        from evalkit.study.store import raters, trials
        pairs = [(tok, tid) for tok in toks for (tid,) in conn.execute(
            select(trials.c.id).join(raters, raters.c.id == trials.c.rater_id)
            .where(raters.c.token_sha256 == study.api.token_hash(tok)))]
    jobs = pairs + pairs[::-1]
    barrier = threading.Barrier(n_threads)
    errors = []

    def worker(i):
        barrier.wait()
        try:
            for tok, tid in jobs[i::n_threads]:
                study.submit(db, tok, tid, "A", 100 + i)
        except Exception as e:   # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    with d.engine.connect() as conn:
        from evalkit.study.store import ratings
        got = conn.execute(select(ratings.c.rater_id, ratings.c.trial_id)
                           .where(ratings.c.study_id == sid)).all()
    assert len(got) == len(set(got)) == len(pairs)
    return sid


def test_50_threads_sqlite_lose_none_duplicate_none(report, tmp_path):
    _hammer(str(tmp_path / "c.db"), report, tmp_path / "media")
    con = sqlite3.connect(tmp_path / "c.db")
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (Debian's package, installed by make test),
    run as the unprivileged postgres user."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    assert bins, "Debian's postgresql is missing: run `make test` (it installs it)"
    bindir = bins[-1].parent
    root = Path(tempfile.mkdtemp(prefix="evalkit-pg-"))
    os.chmod(root, 0o755)
    data = root / "data"
    user = [] if os.getuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if os.getuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(user + [str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                           "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True)
    subprocess.run(user + [str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log"),
                           "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
                           "-c max_connections=200 -c fsync=on", "start"],
                   check=True, capture_output=True)
    try:
        subprocess.run(user + [str(bindir.parent / "bin" / "createdb"), "-h", "127.0.0.1",
                               "-p", str(port), "-U", "postgres", "studies"],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/studies"
    finally:
        store.close_all()
        subprocess.run(user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_50_threads_postgresql_lose_none_duplicate_none(report, postgres, cli, tmp_path):
    sid = _hammer(postgres, report, tmp_path / "media")
    code, out, err = cli("study", "results", "--db", postgres, "--study", sid, "--json",
                         "--reps", "100")
    assert code == 0, err
    assert json.loads(out)["ratings"] > 0
    code, _, err = cli("study", "results", "--db", postgres, "--study", "999")
    assert code == 2
    assert_one_line_error(err, "study 999")


WRITER = """
import sys
from evalkit import study
db, sid = sys.argv[1], int(sys.argv[2])
toks = sys.stdin.read().split()
for tok in toks:
    while (t := study.next_trial(db, tok)) is not None:
        r = study.submit(db, tok, t["trial"], "B", 321)
        print(r["rating"], r["trial"], flush=True)
print("done", flush=True)
"""


def test_killed_writer_loses_nothing_acknowledged(report, tmp_path):
    db = str(tmp_path / "k.db")
    sid = study.create_study(report, db, protocol="abx", media_dir=tmp_path / "media")["study"]
    toks = [r["token"] for r in study.invite(db, sid, 30)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", WRITER, db, str(sid)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    p.stdin.write("\n".join(toks))
    p.stdin.close()
    acked = []
    deadline = time.time() + 60
    while len(acked) < 40 and time.time() < deadline:
        line = p.stdout.readline()
        assert line and line != "done\n", "writer finished before it could be killed"
        acked.append(tuple(map(int, line.split())))
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL and len(acked) == 40
    con = sqlite3.connect(db)
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    stored = set(con.execute("select id, trial_id from ratings").fetchall())
    assert set(acked) <= stored
    # and the database keeps working
    store.close_all()
    t = study.next_trial(db, toks[-1])
    assert study.submit(db, toks[-1], t["trial"], "A", 1)["new"]


# -- frame rate, and the web app's rater service (group commit, play-through gate) ------------

def test_study_records_fps_and_refuses_mixed_frame_rates(report, tmp_path, cli):
    db = tmp_path / "f.db"
    sid = study.create_study(report, db, protocol="preference", clips_spec="worst:2")["study"]
    with store.open_db(db).engine.connect() as conn:
        cfg = conn.execute(select(store.studies.c.config)).scalar_one()
    assert cfg["fps"] == 24.0 and cfg["fps_fraction"] == "24"
    assert set(cfg["media_seconds"].values()) == {round(8 / 24, 6)}  # 8 frames at 24 fps
    tok = study.invite(db, sid, 1)[0]["token"]
    t = study.next_trial(db, tok)
    assert t["fps"] == 24.0 and set(t["media"].values()) <= {f"{k}.mp4" for k in cfg["media_seconds"]}
    # a study made before the frame rate was stored: the page is told 24
    with store.open_db(db).engine.begin() as conn:
        conn.execute(store.studies.update().values(config={"catch_pool": cfg["catch_pool"]}))
    assert study.next_trial(db, tok)["fps"] == 24.0
    # one clip re-timed to 30 fps: creation is refused, naming the file and the field
    broken = tmp_path / "broken"
    shutil.copytree(report, broken)
    s = json.loads((broken / "summary.json").read_text())
    run_b = tmp_path / "run_b"
    shutil.copytree(Path(s["runs"]["b"]["path"]), run_b)
    s["runs"]["b"]["path"] = str(run_b)
    (broken / "summary.json").write_text(json.dumps(s))
    from evalkit.video import read_frames, write_lossless
    clip = run_b / "clips" / f"{s['jobs']['compared'][0]}.mkv"
    write_lossless(clip, read_frames(clip)[0], 30)
    code, _, err = cli("study", "create", broken, "--db", tmp_path / "g.db", "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, str(clip), "field 'fps'", "expected 24 fps", "found 30")


def _service_study(db, report, media, n=4):
    sid = study.create_study(report, db, protocol="abx", clips_spec="worst:2",
                             media_dir=media)["study"]
    return sid, [r["token"] for r in study.invite(db, sid, n)]


def test_rater_service_gate_and_answers(report, tmp_path):
    import asyncio

    from evalkit.study.live import RaterService

    db = str(tmp_path / "g.db")
    sid, (tok, tok2) = _service_study(db, report, tmp_path / "media", 2)
    svc = RaterService(db, completion_code="DONE")

    async def run():
        s = await svc.state(tok)
        t = s["trial"]
        assert s["progress"] == {"done": 0, "total": t["total"], "finished": False}
        assert t["fps"] == 24.0 and "sources" not in t and "expected" not in t
        with pytest.raises(study.TooSoon, match=r"field 'answer': came 0\.\d s after"):
            await svc.answer(tok, t["trial"], "A", 10)
        other = study.next_trial(db, tok2)                        # never served
        with pytest.raises(study.TooSoon, match="before the trial was shown"):
            await svc.answer(tok2, other["trial"], "A", 10)
        with pytest.raises(study.TrialNotAssigned):
            await svc.answer(tok, other["trial"], "A", 10)
        with pytest.raises(study.UnknownToken):
            await svc.state("nope")
        with pytest.raises(study.BadAnswer, match="field 'answer'"):
            await svc.answer(tok, t["trial"], "left", 10)
        await asyncio.sleep(8 / 24)                                # one play-through
        r = await svc.answer(tok, t["trial"], "A", 10, "agent/1")
        assert r["saved"] is True and r["progress"]["done"] == 1
        assert (await svc.answer(tok, t["trial"], "A", 10))["saved"] is False
        with pytest.raises(study.RatingConflict):
            await svc.answer(tok, t["trial"], "B", 10)
        r2 = await svc.answer(tok2, other["trial"], "B", 10)       # marked shown when refused
        assert r2["saved"] is True
        while r["trial"] is not None:                              # the rest, at play-through pace
            await asyncio.sleep(8 / 24)
            r = await svc.answer(tok, r["trial"]["trial"], "B", 10)
        assert r["progress"]["finished"] and r["completion_code"] == "DONE"

    try:
        _run_async(run())
    finally:
        svc.close()
    assert study.progress(db, tok)["finished"]
    con = sqlite3.connect(db)
    assert con.execute("select count(*) from trials where rater_id = (select rater_id from "
                       "ratings where client = 'agent/1') and served is null").fetchone() == (0,)
    rows = list(csv.DictReader(io.StringIO(study.ratings_csv(db, sid))))
    assert len(rows) == study.progress(db, tok)["total"] + 1


def _run_async(coro):
    """asyncio.run on a thread of its own: Playwright's sync API (the session's browser, once a
    browser test ran) keeps an event loop running on the main thread."""
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _group_commit(db, report, media):
    """100 answers at once through one RaterService: all stored once, in few transactions."""
    import asyncio

    from evalkit.study.live import RaterService

    sid, toks = _service_study(db, report, media, 25)
    svc = RaterService(db)

    async def run():
        first = await asyncio.gather(*[svc.state(t) for t in toks])
        await asyncio.sleep(8 / 24)
        b0 = svc.batches
        both = [(t, s["trial"]["trial"]) for t, s in zip(toks, first)] * 4   # each 4 times
        out = await asyncio.gather(*[svc.answer(t, tid, "A", 5) for t, tid in both])
        return out, svc.batches - b0

    try:
        out, batches = _run_async(run())
    finally:
        svc.close()
    assert sum(o["saved"] for o in out) == len(toks)               # written once each
    assert batches < len(out) / 4                                   # grouped into few commits
    d = study.open_db(db)
    with d.engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(store.ratings)
                         .where(store.ratings.c.study_id == sid)).scalar_one()
    assert n == len(toks)


def test_rater_service_group_commit_sqlite(report, tmp_path):
    _group_commit(str(tmp_path / "gc.db"), report, tmp_path / "media")


def test_rater_service_group_commit_postgresql(report, postgres, tmp_path):
    _group_commit(postgres, report, tmp_path / "media")
