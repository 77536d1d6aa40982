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
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, old_study_db
from sqlalchemy import func, select

from evalkit import study
from evalkit.study import store
from evalkit.testing.studies import answer, current, hidden, progress, rate


@pytest.fixture(scope="module")
def report(reports):
    return reports()


def _answers(db, token, pick):
    """Answer every trial of a rater like a browser, time driven by a fake clock."""
    return len(answer(db, token, pick))


def test_cli_end_to_end_abx_media_and_csv(report, tmp_path, cli):
    db = tmp_path / "s.db"
    code, out, err = cli(
        "study",
        "create",
        "--allow-masking",
        report,
        "--db",
        db,
        "--protocol",
        "abx",
        "--clips",
        "worst:4",
        "--raters",
        "3",
        "--seed",
        "3",
    )
    assert code == 0, err
    # 4 clips: 5 easy catch trials per rater (the fewest the screening takes at alpha 0.05,
    # over the catch share's bound of half, said), no graded: exactly 5 easy versions, 1 or 2
    # per clip (every rater gets each once, never one twice)
    assert out.startswith("study 1: abx, 4 clips, 5 catch versions")
    assert ("each rater: 9 trials, 4 test and 5 catch (56%; 5 easy, 0 graded): above the 50% bound") in out
    # a design below the planner's floors is created, with a warning for each shortfall
    assert "warning: 4 clips is below the 15" in err and "warning: --raters 3 is below" in err
    summary = json.loads((report / "summary.json").read_text())
    lp = {r["job"]: float(r["lpips_mean"]) for r in csv.DictReader(open(report / "clips.csv"))}
    worst = sorted(lp, key=lp.get, reverse=True)[:4]
    con = sqlite3.connect(db)
    assert sorted(r[0] for r in con.execute("select job from clips")) == sorted(worst)
    assert con.execute("pragma journal_mode").fetchone()[0] == "wal"
    # media: content-hash file names on disk (never sent to raters), nothing about backend,
    # run or job in the bytes; one stream per file of the design (issue 44): X always in the
    # middle tile, its match in tile 0 or 2, either content as X: 4 per clip (aab, baa, bba,
    # abb) and 4 per catch version (rrd, drr, ddr, rdd), as common as test files
    from evalkit.study import design

    assert design.stream_keys("abx") == ["aab", "baa", "bba", "abb"]
    assert design.stream_keys("abx", catch=True) == ["rrd", "drr", "ddr", "rdd"]
    media = sorted((tmp_path / "s.media").iterdir())
    assert len(media) == 4 * 4 + 5 * 4 and not (tmp_path / "media").exists()  # its own folder
    names = [summary["runs"]["a"]["path"], summary["runs"]["b"]["path"], "bf16", "cpu_dtype", *lp]
    import hashlib

    for f in media:
        assert f.suffix == ".mp4" and len(f.stem) == 64
        data = f.read_bytes()
        assert hashlib.sha256(data).hexdigest() == f.stem
        for n in names:  # (3-byte names like "cpu" occur in coded data by chance: ~2% a run)
            if len(Path(n).name) >= 4:
                assert Path(n).name.encode() not in data, (f, n)
    import av

    with av.open(str(media[0])) as c:
        assert not {
            k: v
            for k, v in c.metadata.items()
            if k not in ("major_brand", "minor_version", "compatible_brands", "encoder")
        }
        s = c.streams.video[0]
        assert (s.codec_context.name, s.codec_context.pix_fmt) == ("h264", "yuv420p")
    code, out, err = cli("study", "invite", "--db", db, "--study", "1", "--count", "4")
    assert code == 0, err
    tokens = [ln.rsplit("token=", 1)[1] for ln in out.splitlines()]
    assert len(tokens) == 4
    stored = {r[0] for r in con.execute("select token_sha256 from raters")}
    assert all(t not in stored and study.live.token_hash(t) in stored for t in tokens)
    # the public trial: one opaque per-trial name, and the tile of each slot
    t = current(str(db), tokens[0])
    assert set(t["tiles"]) == {"X", "A", "B"} and t["answers"] == ["A", "B"]
    assert list(t["media"]) == ["video"]
    assert not any((tmp_path / "s.media" / m).exists() for m in t["media"].values())
    # the random media names masked: 40 hex digits hold "bf16" by chance
    public = json.dumps({**t, "media": {k: "NAME" for k in t["media"]}})
    assert not any(w in public for w in ("bf16", "cpu", "sources", "expected", *lp))
    # before anyone finished: no verdict, no figure
    code, out, err = cli("study", "results", "--db", db, "--study", "1", "--json")
    res = json.loads(out)
    assert res["status"] == "no ratings" and "accuracy" not in res and "per_clip" not in res
    # raters 0-2 answer perfectly on catch trials and at chance on test trials; 3 fails catches
    opened = {r[0]: hidden(db, r[0]) for r in con.execute("select id from trials")}  # unsealed
    rows = {i: h["sources"] for i, h in opened.items()}
    exp = {i: h["expected"] for i, h in opened.items()}
    kind = {i: h["kind"] for i, h in opened.items()}
    for i, tok in enumerate(tokens):

        def pick(t, i=i):
            if kind[t["trial"]] == "catch":
                right = exp[t["trial"]]
                return right if i < 3 else ("A" if right == "B" else "B")
            # always A: a rater's answers are A in exactly half of its test trials (its
            # balanced label bits), so 50% right whatever the secret design; by trial id
            # parity the answers followed the draws and said "distinguishable" once in CI
            return "A"

        assert _answers(str(db), tok, pick) == len(rows) // 4
        if i == 1:  # 2 of 3 planned raters: interim, nothing that shows a trend
            code, out, err = cli("study", "results", "--db", db, "--study", "1", "--json")
            res = json.loads(out)
            assert res["status"] == "interim" and res["verdict"] == "interim"
            assert "accuracy" not in res and "per_clip" not in res and "p_value" not in res
            code, out, err = cli("study", "results", "--db", db, "--study", "1")
            assert "interim: 2 of 3 planned included raters" in out and "accuracy" not in out
    assert progress(str(db), tokens[0]) == {"done": len(rows) // 4, "total": len(rows) // 4, "finished": True}
    code, out, err = cli(
        "study", "results", "--db", db, "--study", "1", "--json", "--csv", tmp_path / "r.csv", "--reps", "300"
    )
    assert code == 0, err
    res = json.loads(out)
    assert res["raters_invited"] == 4 and res["raters_included"] == 3
    assert res["excluded_raters"][0]["catch_correct"] == 0
    assert res["n"] == 12 and len(res["per_clip"]) == 4 and res["status"] == "complete"
    assert res["verdict"] == "inconclusive"  # 12 ratings at chance can show nothing
    assert res["without_exclusions"]["raters"] == 3
    assert 0 <= res["accuracy"] <= 1 and res["upper_bound"] >= res["accuracy"]
    raw = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert len(raw) == len(rows)
    r0 = raw[0]
    assert set(json.loads(r0["backend_per_side"])) == {"X", "A", "B"}
    assert r0["response_ms"] == "10000" and r0["client_ms"] == ""  # measured by the server
    assert r0["correct"] in ("0", "1") and r0["rater"] and r0["trial"]
    s = list(csv.DictReader(open(tmp_path / "r.summary.csv")))
    assert s[0]["scope"] == "study" and s[0]["verdict"] == "inconclusive" and len(s) == 5
    code, out, err = cli("study", "results", "--db", db, "--study", "1")
    assert code == 0 and "verdict: INCONCLUSIVE" in out and "excluded rater" in out
    assert "rule: DISTINGUISHABLE if" in out


def test_preference_results_count_ties(report, tmp_path):
    db = str(tmp_path / "p.db")
    sid = study.create_study(report, db, protocol="preference", seed=1, raters_planned=2, allow_masking=True)[
        "study"
    ]
    toks = [r["token"] for r in study.invite(db, sid, 2)]
    con = sqlite3.connect(tmp_path / "p.db")
    tr = {
        r[0]: (h["kind"], h["expected"], h["sources"])
        for r in con.execute("select id from trials")
        for h in [hidden(db, r[0])]
    }  # unsealed
    for tok in toks:  # catch: correct; test: pick B's side, except ties on every third trial

        def pick(t):
            k, e, src = tr[t["trial"]]
            if k == "catch":
                return e
            return "same" if t["trial"] % 3 == 0 else [s for s, v in src.items() if v == "b"][0]

        _answers(db, tok, pick)
    res = study.results(db, sid, reps=200)
    assert res["wins_a"] == 0 and res["wins_b"] + res["ties"] == res["n"] == 12
    assert res["ties"] > 0 and res["win_rate_b"] == 1.0
    assert res["tie_rate"] == pytest.approx(res["ties"] / 12)
    # every decisive answer for B: a preference, never "indistinguishable"
    assert res["verdict"] in ("B preferred", "no preference shown")
    assert "indistinguishable" not in json.dumps({k: v for k, v in res.items() if k not in ("rule", "claim")})
    assert res["krippendorff_alpha"] is not None


def test_answer_is_idempotent_written_once_and_timed_by_the_server(report, tmp_path):
    db = str(tmp_path / "i.db")
    sid = study.create_study(report, db, protocol="abx", clips_spec="sample:2", allow_masking=True)["study"]
    tok = study.invite(db, sid, 1)[0]["token"]
    clock = study.FakeClock()
    with study.RaterService(db, clock=clock) as svc:
        t = svc.state_sync(tok)["trial"]
        for name in t["media"].values():
            svc.media_sync(tok, name)
        clock.advance(2.5)
        first = svc.answer_sync(tok, t["trial"], "A", 812)
        clock.advance(1)
        again = svc.answer_sync(tok, t["trial"], "A", 999)
        assert first["saved"] and not again["saved"]
        with pytest.raises(study.RatingConflict, match=f"trial {t['trial']}: already answered 'A'"):
            svc.answer_sync(tok, t["trial"], "B", 5)
        assert svc.state_sync(tok)["trial"]["trial"] != t["trial"]
    con = sqlite3.connect(tmp_path / "i.db")
    assert con.execute("select count(*), max(response_ms), max(client_ms) from ratings").fetchone() == (
        1,
        2500,
        812,
    )


def test_bad_input(report, tmp_path, cli):
    db = tmp_path / "b.db"
    assert (
        cli(
            "study",
            "create",
            "--allow-masking",
            report,
            "--db",
            db,
            "--protocol",
            "abx",
            "--clips",
            "sample:1",
        )[0]
        == 0
    )
    code, out, _ = cli("study", "invite", "--db", db, "--study", "1", "--count", "2")
    t1, t2 = [ln.rsplit("token=", 1)[1] for ln in out.splitlines()]
    code, _, err = cli("study", "results", "--db", db, "--study", "9")
    assert code == 2
    assert_one_line_error(err, "study 9", "no such study")
    code, _, err = cli("study", "invite", "--db", db, "--study", "x")
    assert code == 2
    assert_one_line_error(err, "study x")
    code, _, err = cli(
        "study",
        "create",
        "--allow-masking",
        report,
        "--db",
        db,
        "--protocol",
        "abx",
        "--catch-alpha",
        "0.001",
    )  # 8 catch trials cannot show that
    assert code == 2
    assert_one_line_error(err, "--catch-alpha", "8 catch trials")
    code, _, err = cli("study", "results", "--db", db, "--study", "1", "--reps", "0")
    assert code == 2
    assert_one_line_error(err, "--reps", "found 0")
    with study.RaterService(str(db), clock=study.FakeClock()) as svc:
        with pytest.raises(study.UnknownToken, match="rater token: no rater"):
            svc.state_sync("not-a-token")
        with pytest.raises(study.UnknownToken):
            svc.answer_sync("nope", 1, "A")
        with pytest.raises(study.UnknownTrial, match="trial 9999: no such trial"):
            svc.answer_sync(t1, 9999, "A")
        other = svc.state_sync(t2)["trial"]["trial"]
        with pytest.raises(study.TrialNotAssigned, match=f"trial {other}: not assigned to rater"):
            svc.answer_sync(t1, other, "A")
        mine = svc.state_sync(t1)["trial"]["trial"]
        with pytest.raises(study.BadAnswer, match="field 'answer'"):
            svc.answer_sync(t1, mine, "left")
        with pytest.raises(study.BadAnswer, match="field 'response_ms'"):
            svc.answer_sync(t1, mine, "A", "soon")
    assert sqlite3.connect(db).execute("select count(*) from ratings").fetchone() == (0,)
    # report folders: without clips, missing, not a report
    broken = tmp_path / "broken"
    shutil.copytree(report, broken)
    s = json.loads((broken / "summary.json").read_text())
    s["runs"]["b"]["path"] = str(tmp_path / "gone")
    (broken / "summary.json").write_text(json.dumps(s))
    code, _, err = cli("study", "create", "--allow-masking", broken, "--db", db, "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, str(tmp_path / "gone" / "clips"), "not found")
    s["jobs"]["compared"] = []
    (broken / "summary.json").write_text(json.dumps(s))
    code, _, err = cli("study", "create", "--allow-masking", broken, "--db", db, "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, "jobs.compared", "no compared jobs")
    code, _, err = cli("study", "create", "--allow-masking", tmp_path, "--db", db, "--protocol", "abx")
    assert code == 2
    assert_one_line_error(err, "summary.json", "not found")
    code, _, err = cli(
        "study", "create", "--allow-masking", report, "--db", db, "--protocol", "abx", "--clips", "best:3"
    )
    assert code == 2
    assert_one_line_error(err, "--clips", "best:3")


def test_invite_links_from_the_server_base_url(report, tmp_path, cli):
    db = tmp_path / "l.db"
    assert (
        cli(
            "study",
            "create",
            "--allow-masking",
            report,
            "--db",
            db,
            "--protocol",
            "abx",
            "--clips",
            "sample:1",
        )[0]
        == 0
    )
    for base, prefix in (
        ("http://h:8000", "http://h:8000/?token="),
        ("http://h:8000/", "http://h:8000/?token="),
        ("https://h/evalkit", "https://h/evalkit/?token="),
        ("http://h:1/?token=", "http://h:1/?token="),
    ):
        code, out, _ = cli("study", "invite", "--db", db, "--study", "1", "--base-url", base)
        assert code == 0 and out.split(": ", 1)[1].rsplit("token=", 1)[0] + "token=" == prefix, out
    code, out, _ = cli("study", "invite", "--db", db, "--study", "1")
    assert out.split(": ", 1)[1].startswith("http://localhost:7860/?token=")
    code, _, err = cli("study", "invite", "--db", db, "--study", "1", "--base-url", "h:8000")
    assert code == 2
    assert_one_line_error(err, "--base-url", "h:8000")


def test_plan_command(cli):
    code, out, err = cli("study", "plan", "--protocol", "abx", "--margin", "0.1", "--power", "0.8", "--json")
    assert code == 0, err
    p = json.loads(out)
    assert p["raters"] >= 12 and p["clips"] >= 15 and p["invite"] >= p["raters"]
    code, out, err = cli("study", "plan", "--protocol", "abx", "--margin", "0.1")
    assert code == 0 and f"{p['raters']} included raters x {p['clips']} clips" in out
    code, _, err = cli("study", "plan", "--protocol", "abx", "--margin", "0.7")
    assert code == 2
    assert_one_line_error(err, "margin")


def test_schema_upgrades_in_place_and_refuses_newer(report, tmp_path):
    path = tmp_path / "u.db"
    sid = old_study_db(report, path, 1)
    d = store.StudyDB(store.sqlite_url(path))
    assert d.schema_version() == store.SCHEMA_VERSION == 6
    for table, col in (
        ("ratings", "client"),
        ("ratings", "client_ms"),
        ("trials", "served"),
        ("trials", "fetched"),
        ("clips", "media_a_alt"),
        ("trials", "delivered"),
    ):
        assert col in [r[1] for r in sqlite3.connect(path).execute(f"pragma table_info({table})")]
    cfg = json.loads(sqlite3.connect(path).execute("select config from studies").fetchone()[0])
    assert len(cfg["media_key"]) == 64
    tok = study.invite(d, sid, 1)[0]["token"]
    assert _answers(d, tok, lambda t: "A") > 0
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
    """10 raters, each driven by 5 threads at once through one rater service (every answer
    sent up to 5 times): every rating stored exactly once, no thread sees an error."""
    sid = study.create_study(report, db, protocol="abx", media_dir=media, allow_masking=True)["study"]
    toks = [r["token"] for r in study.invite(db, sid, 10)]
    ticks = iter(range(0, 10**9, 100))  # every request 100 s after the previous one
    svc = study.RaterService(db, clock=lambda: next(ticks))
    barrier = threading.Barrier(n_threads)
    errors = []

    def worker(i):
        tok = toks[i % len(toks)]
        barrier.wait()
        try:
            while (t := svc.state_sync(tok)["trial"]) is not None:
                for name in t["media"].values():
                    svc.media_sync(tok, name)
                try:
                    svc.answer_sync(tok, t["trial"], "A", 100 + i)
                except study.OutOfOrder:  # another thread answered it meanwhile
                    pass
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        svc.close()
    assert errors == []
    d = study.open_db(db)
    with d.engine.connect() as conn:
        n_trials = conn.execute(
            select(func.count()).select_from(store.trials).where(store.trials.c.study_id == sid)
        ).scalar_one()
        got = conn.execute(
            select(store.ratings.c.rater_id, store.ratings.c.trial_id).where(store.ratings.c.study_id == sid)
        ).all()
    assert len(got) == len(set(got)) == n_trials
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
    subprocess.run(
        user
        + [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        user
        + [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(root / "log"),
            "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(
            user
            + [
                str(bindir.parent / "bin" / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "studies",
            ],
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/studies"
    finally:
        store.close_all()
        subprocess.run(
            user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow  # PostgreSQL
def test_50_threads_postgresql_lose_none_duplicate_none(report, postgres, cli, tmp_path):
    sid = _hammer(postgres, report, tmp_path / "media")
    code, out, err = cli("study", "results", "--db", postgres, "--study", sid, "--json", "--reps", "100")
    assert code == 0, err
    assert json.loads(out)["ratings"] > 0
    code, _, err = cli("study", "results", "--db", postgres, "--study", "999")
    assert code == 2
    assert_one_line_error(err, "study 999")


@pytest.mark.slow  # PostgreSQL
def test_unblinding_on_postgresql(report, postgres, cli, tmp_path):
    sid = study.create_study(
        report,
        postgres,
        protocol="abx",
        clips_spec="sample:1",
        media_dir=tmp_path / "media",
        allow_masking=True,
    )["study"]
    code, out, err = cli(
        "study", "unblind", "--db", postgres, "--study", sid, "--reason", "pilot", "--who", "dana"
    )
    assert code == 0, err
    res = study.results(postgres, sid, reps=100)
    assert res["unblinding"]["who"] == "dana" and res["unblinding"]["raters_included"] == 0
    assert study.unblinding_log(postgres, sid)[0]["reason"] == "pilot"


@pytest.mark.slow  # PostgreSQL
def test_schema_6_upgrade_seals_a_postgresql_database(report, postgres, tmp_path):
    """A PostgreSQL database of schema 5 (the key in plain columns) is sealed when opened: a key
    file beside its media folder, the plain columns emptied, the tables rewritten (VACUUM FULL),
    the same figures."""
    from sqlalchemy import create_engine, text

    from evalkit.study import design, seal

    admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text("CREATE DATABASE sealup"))
    admin.dispose()
    url = postgres.rsplit("/", 1)[0] + "/sealup"
    sid = study.create_study(
        report,
        url,
        protocol="abx",
        clips_spec="sample:2",
        raters_planned=1,
        media_dir=tmp_path / "media",
        allow_masking=True,
    )["study"]
    key_file = tmp_path / "media.key"
    assert seal.load(key_file)  # beside the media folder
    tok = study.invite(url, sid, 1)[0]["token"]

    def pick(t):  # catches right, test trials mixed
        h = hidden(url, t["trial"])
        return h["expected"] if h["kind"] == "catch" or t["trial"] % 2 else t["answers"][0]

    answer(url, tok, pick)
    before = study.results(url, sid, reps=100)
    assert before["status"] == "complete"
    with store.open_db(url).engine.begin() as conn:  # back to schema 5: the key in plain
        cfg0 = conn.execute(select(store.studies.c.config)).scalar_one()
        cfg = seal.unseal_config(sid, cfg0)
        for k in ("seal", "design_seed", "runs"):
            cfg.pop(k)
        for cid, (sw, x) in cfg.pop("bits").items():
            conn.execute(
                store.clips.update().where(store.clips.c.id == int(cid)).values(base_swap=sw, base_x=x)
            )
        conn.execute(store.studies.update().values(config=cfg))
        for t in seal.open_trials(cfg0, conn.execute(select(store.trials)).mappings()):
            conn.execute(
                store.trials.update()
                .where(store.trials.c.id == t["id"])
                .values(shown=t["shown"], sources=t["sources"], expected=t["expected"])
            )
            for rid, rater, ans in conn.execute(
                select(store.ratings.c.id, store.ratings.c.rater_id, store.ratings.c.answer).where(
                    store.ratings.c.trial_id == t["id"]
                )
            ).all():
                ans = seal.open_answer(seal.study_key(cfg0), rater, t["id"], ans)
                conn.execute(
                    store.ratings.update()
                    .where(store.ratings.c.id == rid)
                    .values(
                        shown=t["shown"],
                        sources=t["sources"],
                        answer=ans,
                        correct=design.score("abx", t, ans)[0],
                    )
                )
        conn.execute(text("ALTER TABLE trials DROP COLUMN sealed"))
        conn.execute(text("ALTER TABLE ratings ALTER COLUMN answer TYPE VARCHAR(16)"))
        conn.execute(store.meta.update().values(value="5"))
    store.close_all()
    key_file.unlink()
    after = study.results(url, sid, reps=100)  # opened: upgraded and sealed
    assert store.open_db(url).schema_version() == store.SCHEMA_VERSION
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert {k: after[k] for k in ("verdict", "n", "accuracy", "p_value", "upper_bound")} == {
        k: before[k] for k in ("verdict", "n", "accuracy", "p_value", "upper_bound")
    }
    assert after["seal"]["rebuildable_from_seed"]
    with store.open_db(url).engine.connect() as conn:
        trs = conn.execute(
            select(
                store.trials.c.kind, store.trials.c.sources, store.trials.c.expected, store.trials.c.sealed
            )
        ).all()
        correct = (
            conn.execute(
                select(store.ratings.c.correct)
                .join(store.trials, store.trials.c.id == store.ratings.c.trial_id)
                .where(store.trials.c.kind == "test")
            )
            .scalars()
            .all()
        )
        answers = conn.execute(select(store.ratings.c.answer)).scalars().all()
    assert all(
        src == {} and (kind == "catch" or exp is None) and sealed.startswith("s1:")
        for kind, src, exp, sealed in trs
    )
    assert correct and all(c is None for c in correct)
    assert answers and all(a.startswith("s1:") for a in answers)  # answers sealed too
    store.close_all()


WRITER = """
import sys
from evalkit import study
db, sid = sys.argv[1], int(sys.argv[2])
toks = sys.stdin.read().split()
clock = study.FakeClock()
with study.RaterService(db, clock=clock) as svc:
    for tok in toks:
        while (t := svc.state_sync(tok)["trial"]) is not None:
            for name in t["media"].values():
                svc.media_sync(tok, name)
            clock.advance(10)
            assert svc.answer_sync(tok, t["trial"], "B")["saved"]
            print(t["trial"], flush=True)
print("done", flush=True)
"""


def test_killed_writer_loses_nothing_acknowledged(report, tmp_path):
    db = str(tmp_path / "k.db")
    sid = study.create_study(report, db, protocol="abx", media_dir=tmp_path / "media", allow_masking=True)[
        "study"
    ]
    toks = [r["token"] for r in study.invite(db, sid, 30)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER, db, str(sid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    p.stdin.write("\n".join(toks))
    p.stdin.close()
    acked = []
    while len(acked) < 40:
        line = p.stdout.readline()
        assert line and line != "done\n", "writer finished before it could be killed"
        acked.append(int(line))
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL and len(acked) == 40
    con = sqlite3.connect(db)
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    stored = {r[0] for r in con.execute("select trial_id from ratings").fetchall()}
    assert set(acked) <= stored
    # and the database keeps working
    store.close_all()
    assert _answers(db, toks[-1], lambda t: "A") > 0


# -- frame rate, and the web app's rater service (group commit, play-through gate) ------------


def test_study_records_fps_and_refuses_mixed_frame_rates(report, tmp_path, cli):
    db = tmp_path / "f.db"
    sid = study.create_study(report, db, protocol="preference", clips_spec="worst:2", allow_masking=True)[
        "study"
    ]
    with store.open_db(db).engine.connect() as conn:
        cfg = conn.execute(select(store.studies.c.config)).scalar_one()
    assert cfg["fps"] == 24.0 and cfg["fps_fraction"] == "24"
    assert set(cfg["media_seconds"].values()) == {round(8 / 24, 6)}  # 8 frames at 24 fps
    tok = study.invite(db, sid, 1)[0]["token"]
    with study.RaterService(db) as svc:
        t = svc.state_sync(tok)["trial"]
        files = {svc.media_sync(tok, n).stem for n in t["media"].values()}
    assert t["fps"] == 24.0 and files <= set(cfg["media_seconds"])
    # a study made before the frame rate was stored: the page is told 24
    with store.open_db(db).engine.begin() as conn:
        conn.execute(
            store.studies.update().values(config={k: cfg[k] for k in ("sealed", "seal", "media_key")})
        )  # the sealed key parts stay
    assert current(db, tok)["fps"] == 24.0
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
    code, _, err = cli(
        "study", "create", "--allow-masking", broken, "--db", tmp_path / "g.db", "--protocol", "abx"
    )
    assert code == 2
    assert_one_line_error(err, str(clip), "field 'fps'", "expected 24 fps", "found 30")


def _service_study(db, report, media, n=4):
    sid = study.create_study(
        report, db, protocol="abx", clips_spec="worst:2", media_dir=media, allow_masking=True
    )["study"]
    return sid, [r["token"] for r in study.invite(db, sid, n)]


def test_rater_service_gate_and_answers(report, tmp_path):
    """The gate, with time driven by a fake clock: a trial is answerable only when it is the
    current one, handed out, all its videos requested, and one play-through (8 frames at 24
    fps, less one frame) has passed since; the response time is the server's."""
    db = str(tmp_path / "g.db")
    sid, (tok, tok2) = _service_study(db, report, tmp_path / "media", 2)
    clock = study.FakeClock()
    svc = study.RaterService(db, completion_code="DONE", clock=clock)
    post = svc.answer_sync
    try:
        # an answer to a trial never handed out: refused, and it starts nothing
        first_of_2 = svc_trials(db, tok2)[0]
        with pytest.raises(study.OutOfOrder):
            post(tok2, first_of_2, "A")
        assert hidden(db, first_of_2)["served"] is None
        s = svc.state_sync(tok)
        t = s["trial"]
        assert s["progress"] == {"done": 0, "total": t["total"], "finished": False}
        assert t["fps"] == 24.0 and "sources" not in t and "expected" not in t
        assert hidden(db, t["trial"])["served"] == clock.now
        # handed out, videos not requested: refused whatever the time
        clock.advance(60)
        with pytest.raises(study.NotLoaded, match="videos of this trial were not loaded"):
            post(tok, t["trial"], "A")
        names = list(t["media"].values())
        assert len(names) == 1  # one stream per trial
        with pytest.raises(study.UnknownMedia):  # not a name of this rater's trials
            svc.media_sync(tok2, names[0])
        with pytest.raises(study.NotLoaded):  # still not requested by its rater
            post(tok, t["trial"], "A")
        svc.media_sync(tok, names[0])
        assert hidden(db, t["trial"])["fetched"] == clock.now
        need = 8 / 24 - 1 / 24
        clock.advance(need - 0.01)
        with pytest.raises(study.TooSoon, match=r"came 0\.3 s after the videos were loaded") as e:
            post(tok, t["trial"], "A")
        assert 10 <= e.value.wait_ms <= 11  # 10 ms to go, rounded up
        with pytest.raises(study.TrialNotAssigned):
            post(tok, first_of_2, "A")
        with pytest.raises(study.UnknownToken):
            svc.state_sync("nope")
        with pytest.raises(study.BadAnswer, match="field 'answer'"):
            post(tok, t["trial"], "left")
        clock.advance(0.02)
        r = post(tok, t["trial"], "A", 10, "agent/1")
        assert r["saved"] is True and r["progress"]["done"] == 1
        assert post(tok, t["trial"], "A", 10)["saved"] is False
        with pytest.raises(study.RatingConflict):
            post(tok, t["trial"], "B", 10)
        nxt = r["trial"]
        with pytest.raises(study.OutOfOrder):  # a later trial, not the current one
            later = [x for x in svc_trials(db, tok) if x > nxt["trial"]][0]
            post(tok, later, "A")
        rate(svc, tok, lambda t: "B", clock, watch=need)
        assert svc.progress(tok)["finished"]
        assert svc.state_sync(tok)["completion_code"] == "DONE"
    finally:
        svc.close()
    con = sqlite3.connect(db)
    ms = [r[0] for r in con.execute("select response_ms from ratings order by id")]
    assert ms[0] == round(1000 * (need + 0.01)) and set(ms[1:]) == {round(1000 * need)}
    assert con.execute("select client, client_ms from ratings order by id").fetchone() == ("agent/1", 10)
    rows = list(csv.DictReader(io.StringIO(study.ratings_csv(db, sid))))
    assert len(rows) == len(ms)


def svc_trials(db, tok):
    with store.open_db(db).engine.connect() as conn:
        return [
            r[0]
            for r in conn.execute(
                select(store.trials.c.id)
                .join(store.raters, store.raters.c.id == store.trials.c.rater_id)
                .where(store.raters.c.token_sha256 == study.live.token_hash(tok))
                .order_by(store.trials.c.ord)
            )
        ]


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

    sid, toks = _service_study(db, report, media, 25)
    clock = study.FakeClock()
    svc = study.RaterService(db, clock=clock)

    async def run():
        first = await asyncio.gather(*[svc.state(t) for t in toks])
        await asyncio.gather(
            *[svc.media(t, n) for t, s in zip(toks, first) for n in s["trial"]["media"].values()]
        )
        clock.advance(10)
        b0 = svc.batches
        both = [(t, s["trial"]["trial"]) for t, s in zip(toks, first)] * 4  # each 4 times
        out = await asyncio.gather(*[svc.answer(t, tid, "A", 5) for t, tid in both])
        return out, svc.batches - b0

    try:
        out, batches = _run_async(run())
    finally:
        svc.close()
    assert sum(o["saved"] for o in out) == len(toks)  # written once each
    assert batches < len(out) / 4  # grouped into few commits
    d = study.open_db(db)
    with d.engine.connect() as conn:
        n = conn.execute(
            select(func.count()).select_from(store.ratings).where(store.ratings.c.study_id == sid)
        ).scalar_one()
    assert n == len(toks)


def test_rater_service_group_commit_sqlite(report, tmp_path):
    _group_commit(str(tmp_path / "gc.db"), report, tmp_path / "media")


@pytest.mark.slow  # PostgreSQL
def test_rater_service_group_commit_postgresql(report, postgres, tmp_path):
    _group_commit(postgres, report, tmp_path / "media")


def _byte_gate(db, report, media):
    """The gate in the database: nothing and one byte of each video open nothing; the bytes
    of every video sent by two services (two server processes' writers, each its own
    transactions) in interleaved halves still open nothing, nor does an acknowledgement before
    the last byte was sent; the page's acknowledgements, one through each service, open it at
    the last of them (issue 44: the clock from the last byte received, not the first sent),
    whichever service the answer then reaches."""
    import zlib
    from concurrent.futures import wait

    sid, (tok,) = _service_study(db, report, media, 1)
    clock = study.FakeClock()
    one = study.RaterService(db, clock=clock)
    two = study.RaterService(db, clock=clock)
    try:
        t = one.state_sync(tok)["trial"]
        names = list(t["media"].values())
        paths = {n: _run_async(one.open_media(tok, n)) for n in names}
        sizes = {n: p.stat().st_size for n, p in paths.items()}
        crcs = {n: zlib.crc32(p.read_bytes()) for n, p in paths.items()}
        clock.advance(60)
        with pytest.raises(study.NotLoaded):  # opened (as a HEAD does): nothing sent
            one.answer_sync(tok, t["trial"], "A")
        began = clock.now
        wait([one.delivered(tok, n, 0, 1) for n in names])
        with pytest.raises(study.NotLoaded):  # one byte of each
            two.answer_sync(tok, t["trial"], "A")
        futs = []
        for n in names:  # halves from both, the last byte left out
            half = sizes[n] // 2
            futs += [
                one.delivered(tok, n, half, sizes[n] - (n == names[-1])),
                two.delivered(tok, n, 0, half + 1),
            ]
        wait(futs)
        assert all(f.exception() is None for f in futs)
        assert hidden(db, t["trial"])["fetched"] is None
        with pytest.raises(study.NotLoaded):
            one.answer_sync(tok, t["trial"], "A")
        last = names[-1]
        with pytest.raises(study.BadAcknowledgement, match="never sent"):  # a byte missing
            two.acknowledge_sync(tok, last, sizes[last], crcs[last])
        clock.advance(0.1)
        two.delivered(tok, last, sizes[last] - 1, 10**12).result()
        # every byte sent, none acknowledged: still not loaded, however long it waits
        clock.advance(60)
        assert hidden(db, t["trial"])["fetched"] is None
        with pytest.raises(study.NotLoaded):
            two.answer_sync(tok, t["trial"], "A")
        # acknowledged by the page, alternately through either service; the clock starts at
        # the last acknowledgement, not at the first byte sent (``began``, a minute earlier)
        for i, n in enumerate(names):
            clock.advance(0.05)
            (one, two)[i % 2].acknowledge_sync(tok, n, sizes[n], crcs[n])
        acked = clock.now
        assert acked - began > 60
        assert hidden(db, t["trial"])["fetched"] == pytest.approx(acked)
        clock.advance(0.1)
        with pytest.raises(study.TooSoon):  # 0.1 s of 0.29 s
            one.answer_sync(tok, t["trial"], "A")
        clock.advance(0.2)
        assert one.answer_sync(tok, t["trial"], "A")["saved"] is True
        with pytest.raises(study.UnknownMedia):  # a name of no trial of this rater
            two.delivered(tok, "0" * 40 + ".mp4", 0, 1).result()
    finally:
        one.close()
        two.close()


def test_byte_gate_in_the_database_sqlite(report, tmp_path):
    _byte_gate(str(tmp_path / "b.db"), report, tmp_path / "media")


@pytest.mark.slow  # PostgreSQL
def test_byte_gate_in_the_database_postgresql(report, postgres, tmp_path):
    _byte_gate(postgres, report, tmp_path / "media")


def test_merge_ranges():
    from evalkit.study.live import covers, merge_ranges

    assert merge_ranges([[5, 10], [0, 5], [20, 30], [25, 40], [7, 7]]) == [[0, 10], [20, 40]]
    assert covers(merge_ranges([[0, 3], [3, 8]]), 8) and not covers([[0, 7]], 8)
    assert not covers([[0, 4], [5, 8]], 8) and not covers([], 8)


@pytest.mark.slow  # PostgreSQL
def test_byte_gate_two_real_servers_postgresql(report, postgres, tmp_path):
    """Two real `evalkit serve` processes on one PostgreSQL database: half of every video from
    each; the answer is accepted (waiting the play-through the server asks for)."""
    import time

    import httpx

    from evalkit.testing.server import Server
    from evalkit.testing.studies import acknowledge

    sid, (tok,) = _service_study(postgres, report, tmp_path / "media", 1)
    a, b = Server(postgres).start(), Server(postgres).start()
    try:
        with httpx.Client(base_url=a.url, timeout=30) as c1, httpx.Client(base_url=b.url, timeout=30) as c2:
            t = c1.get("/api/trial", params={"token": tok}).json()["trial"]
            for name in t["media"].values():
                q = {"token": tok}
                size = int(c1.head(f"/media/{name}", params=q).headers["content-length"])
                assert (
                    c1.get(
                        f"/media/{name}", params=q, headers={"range": f"bytes=0-{size // 2 - 1}"}
                    ).status_code
                    == 206
                )
                rest = c2.get(f"/media/{name}", params=q, headers={"range": f"bytes={size // 2}-"})
                assert rest.status_code == 206
                data = (
                    c1.get(f"/media/{name}", params=q, headers={"range": f"bytes=0-{size // 2 - 1}"}).content
                    + rest.content
                )
                for _ in range(50):  # acknowledged once both servers recorded their bytes
                    if acknowledge(c2, tok, name, data).status_code == 200:
                        break
                    time.sleep(0.1)
            for _ in range(100):  # recorded once sent, then the play-through
                r = c2.post("/api/answer", json={"token": tok, "trial": t["trial"], "answer": "A"})
                if r.status_code != 425:
                    break
                time.sleep(max(0.05, r.json()["wait_ms"] / 1000))
            assert r.status_code == 200 and r.json()["saved"] is True, r.text
    finally:
        a.stop()
        b.stop()


def test_a_study_made_before_trial_streams_refuses_new_raters_in_one_line(report, tmp_path, cli):
    """`study invite` on a study an older evalkit made (schema 4, a video per side: no trial
    streams in its config, e.g. commit 35d4eb1): one line naming the fix, exit code 2, no
    rater made (the sweep's KeyError: 'streams')."""
    path = tmp_path / "v4.db"
    sid = old_study_db(report, path, 4)
    con = sqlite3.connect(path)  # as 35d4eb1 wrote it: no streams in the config
    cfg = json.loads(con.execute("select config from studies where id = ?", (sid,)).fetchone()[0])
    cfg.pop("streams")
    for p in cfg["catch_pool"]:
        p.pop("streams", None)
    con.execute("update studies set config = ? where id = ?", (json.dumps(cfg), sid))
    con.commit()
    con.close()
    code, out, err = cli("study", "invite", "--db", path, "--study", sid, "--count", "2")
    assert code == 2, (out, err)
    assert_one_line_error(
        err, f"study {sid}", "older evalkit", "cannot take new raters", "evalkit study create"
    )
    assert sqlite3.connect(path).execute("select count(*) from raters").fetchone()[0] == 0
