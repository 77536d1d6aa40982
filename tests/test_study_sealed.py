"""The study key sealed at rest (issue 44 item 5): a reader of every table and column of the
SQLite file at interim cannot compute correctness; results once complete (or after a logged
unblinding) are those of the plain key; an older database is sealed by its upgrade; every study
of the same runs is named in each one's results. Real SQLite files, real media, the real rater
service; the key file is a real 0600 file beside the database."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import stat

import pytest
from conftest import DOWNGRADES, _unseal_to_version_5, assert_one_line_error, run_evalkit

from evalkit import study
from evalkit.study import design, seal, store
from evalkit.testing.studies import answer, hidden, study_config


@pytest.fixture(scope="module")
def report(reports):
    return reports()


def _dump(path) -> dict:
    """Every table of an SQLite file, every column, as a reader of the file sees it."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = {}
    for (name,) in con.execute("select name from sqlite_master where type = 'table'"):
        cur = con.execute(f"select * from {name}")
        cols = [c[0] for c in cur.description]
        out[name] = [dict(zip(cols, row)) for row in cur.fetchall()]
    con.close()
    return out


def _right(db):
    """A rater who is always right (the test holds the key file: an oracle)."""
    return lambda t: hidden(db, t["trial"])["expected"]


def _rebuild(protocol, clip_rows, cfg, seed, raters):
    """Every rater's trials as :func:`.design.assign` draws them when the counterbalancing, the
    rater seeds and the catch versions' bits come from ``seed`` (the design before schema 6), for a generous attacker
    given even the sealed streams and catch pool."""
    swap, xbit = design.base_bits(len(clip_rows), seed)
    cl = [
        dict(c, base_swap=s, base_x=x, streams=cfg["streams"][str(c["id"])])
        for c, s, x in zip(clip_rows, swap, xbit)
    ]
    return [
        design.assign(protocol, cl, cfg["catch_pool"], k, design.rater_seed(seed, k), seed)
        for k in range(raters)
    ]


def test_interim_reader_of_every_column_cannot_compute_correctness(report, tmp_path):
    db = tmp_path / "s.db"
    made = study.create_study(report, db, protocol="abx", seed=5, raters_planned=3, allow_masking=True)
    sid = made["study"]
    key_file = tmp_path / "s.db.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600  # made 0600, beside the db
    toks = [r["token"] for r in study.invite(db, sid, 3)]
    for tok in toks[:2]:  # two raters right on every trial: interim accuracy 1.0
        answer(db, tok, _right(db))
    res = study.results(db, sid, reps=100)
    assert res["status"] == "interim" and "accuracy" not in res
    store.close_all()

    tables = _dump(db)
    tests = {t["id"] for t in tables["trials"] if t["kind"] == "test"}
    rated = [r for r in tables["ratings"] if r["trial_id"] in tests]
    assert len(rated) == 2 * made["clips"]
    # the plain key columns are gone: no expected answer, correctness, backend or tile position
    assert all(t["expected"] is None for t in tables["trials"] if t["id"] in tests)
    assert all(r["correct"] is None for r in rated)
    assert all(json.loads(t["shown"]) == {} and json.loads(t["sources"]) == {} for t in tables["trials"])
    assert all(json.loads(r["shown"]) == {} and json.loads(r["sources"]) == {} for r in tables["ratings"])
    assert all(t["sealed"].startswith("s1:") for t in tables["trials"])
    # the answers too: aligned by a public counterbalancing (before issue 44 item 1 rater k's key
    # on a clip was rater 0's flipped by k mod 2 and k div 2 mod 2), how well raters agree would
    # show how well they tell the sides apart
    assert all(r["answer"].startswith("s1:") for r in tables["ratings"])
    assert {(c["base_swap"], c["base_x"]) for c in tables["clips"]} == {(0, 0)}
    assert {r["seed"] for r in tables["raters"]} == {0}
    cfg = json.loads(tables["studies"][0]["config"])
    assert not set(seal.CONFIG_FIELDS) & set(cfg) and cfg["sealed"].startswith("s1:")
    assert cfg["seal"]["key_file"] == str(key_file.resolve())
    # no trial or rating names its stream (which file a trial plays reveals its arrangement)
    shas = {p.stem for p in (tmp_path / "s.media").glob("*.mp4")}
    cells = json.dumps({k: tables[k] for k in ("trials", "ratings", "clips", "raters")})
    assert shas and not any(s in cells for s in shas)
    # nor is the key anywhere in the file, its write-ahead log or its shared memory
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*") if p != key_file)
    secret = key_file.read_text().strip()
    assert secret.encode() not in raw and bytes.fromhex(secret) not in raw
    # catch trials keep their answers in plain text (the interim screening needs them)
    catch = [t for t in tables["trials"] if t["kind"] == "catch"]
    assert catch and all(t["expected"] in ("A", "B") for t in catch)

    # rebuilding from the study's seed fails: with the sealed design seed (read with the key
    # file) the rebuild gives every stored trial exactly, with the study's own seed it does not
    opened = study_config(db, sid)
    assert opened["design_seed"] != 5
    clip_rows = sorted(tables["clips"], key=lambda c: c["ord"])
    stored = {}
    for t in tables["trials"]:
        h = hidden(db, t["id"])
        stored.setdefault(t["rater_id"], []).append(
            {k: h[k] for k in ("kind", "clip_id", "catch_kind", "shown", "sources", "expected")}
        )
    stored = [stored[r["id"]] for r in sorted(tables["raters"], key=lambda r: r["idx"])]
    assert _rebuild("abx", clip_rows, opened, opened["design_seed"], 3) == stored
    from_seed = _rebuild("abx", clip_rows, opened, 5, 3)
    assert all(a != b for a, b in zip(from_seed, stored))
    # the catch versions' bits too (design.assign's study_seed): with every rater seed right but
    # those bits from --seed, the catch trials' files differ
    swap, xbit = zip(*(opened["bits"][str(c["id"])] for c in clip_rows))
    cl = [
        dict(c, base_swap=s, base_x=x, streams=opened["streams"][str(c["id"])])
        for c, s, x in zip(clip_rows, swap, xbit)
    ]
    catch_from_seed = [
        design.assign("abx", cl, opened["catch_pool"], k, design.rater_seed(opened["design_seed"], k), 5)
        for k in range(3)
    ]
    assert [[t for t in p if t["kind"] == "test"] for p in catch_from_seed] == [
        [t for t in p if t["kind"] == "test"] for p in stored
    ]
    assert all(a != b for a, b in zip(catch_from_seed, stored))
    # the one function that returns unsealed rows refuses while the key is sealed
    with pytest.raises(study.StudyError, match="sealed until 3 planned included raters"):
        study.unsealed_ratings(db, sid)


def _figures(res: dict) -> dict:
    keep = (
        "status",
        "verdict",
        "n",
        "accuracy",
        "p_value",
        "upper_bound",
        "flagged",
        "rater_count",
        "clip_count",
        "per_clip",
        "raters_used",
        "excluded_raters",
    )
    return {k: res.get(k) for k in keep}


def test_complete_results_are_the_plain_keys_and_an_old_database_is_sealed(report, tmp_path):
    """A complete study's figures through the seal equal those of the same ratings kept in the
    plain columns of schema 5, which the upgrade then seals (and scrubs from the file)."""
    db = tmp_path / "c.db"
    sid = study.create_study(report, db, protocol="abx", seed=2, raters_planned=3, allow_masking=True)[
        "study"
    ]
    toks = [r["token"] for r in study.invite(db, sid, 3)]
    for i, tok in enumerate(toks):  # right on catches; test trials right, wrong, mixed

        def pick(t, i=i):
            h = hidden(db, t["trial"])
            other = "B" if h["expected"] == "A" else "A"
            return h["expected"] if h["kind"] == "catch" or (i + t["trial"]) % 3 else other

        answer(db, tok, pick)
    sealed = study.results(db, sid, reps=200)
    assert sealed["status"] == "complete" and sealed["n"] > 0
    csv_sealed = study.ratings_csv(db, sid)
    store.close_all()

    old = tmp_path / "old.db"  # the same database as schema 5 kept it
    shutil.copy(db, old)
    shutil.copy(tmp_path / "c.db.key", tmp_path / "old.db.key")
    con = sqlite3.connect(old)
    cfg = json.loads(con.execute("select config from studies").fetchone()[0])
    cfg["seal"]["key_file"] = str(tmp_path / "old.db.key")
    con.execute("update studies set config = ?", (json.dumps(cfg),))
    _unseal_to_version_5(con, old)
    for sql in DOWNGRADES[5]:
        con.execute(sql)
    con.execute("update meta set value = '5' where key = 'schema_version'")
    con.commit()
    plain = con.execute(
        "select r.rater_id, r.correct from ratings r join trials t on t.id = r.trial_id where t.kind = 'test'"
    ).fetchall()
    con.close()
    assert not (tmp_path / "old.db.key").exists()
    assert b'"X": "' in old.read_bytes()  # the plain key, in the file
    correct = sum(c for _, c in plain)
    assert sealed["accuracy"] == pytest.approx(correct / len(plain)) and sealed["n"] == len(plain)

    upgraded = study.results(old, sid, reps=200)  # opening it upgrades and seals it
    assert store.open_db(old).schema_version() == store.SCHEMA_VERSION
    assert _figures(upgraded) == _figures(sealed)
    assert upgraded["seal"]["rebuildable_from_seed"] and not sealed["seal"]["rebuildable_from_seed"]
    key = tmp_path / "old.db.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert study.ratings_csv(old, sid).replace("old.db", "c.db") == csv_sealed
    store.close_all()
    tables = _dump(old)
    assert all(json.loads(t["sources"]) == {} for t in tables["trials"])
    assert all(
        r["correct"] is None
        for r in tables["ratings"]
        if r["trial_id"] in {t["id"] for t in tables["trials"] if t["kind"] == "test"}
    )
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("old.db*") if p != key)
    assert b'"X": "' not in raw  # scrubbed: no freed page keeps the plain key


def test_unblinding_opens_the_key_logged(report, tmp_path):
    db = tmp_path / "u.db"
    sid = study.create_study(
        report, db, protocol="abx", clips_spec="sample:2", raters_planned=4, allow_masking=True
    )["study"]
    tok = study.invite(db, sid, 1)[0]["token"]
    answer(db, tok, _right(db))
    rows = list(__import__("csv").DictReader(study.ratings_csv(db, sid).splitlines()))
    assert rows and all(r["correct"] == "" and r["expected"] == "" for r in rows)
    study.unblind(db, sid, reason="pilot look", who="dana")
    st, got = study.unsealed_ratings(db, sid)
    assert all(r["correct"] == 1 for r in got)  # answered right, computed now
    rows = list(__import__("csv").DictReader(study.ratings_csv(db, sid).splitlines()))
    assert all(r["correct"] == "1" for r in rows)
    res = study.results(db, sid, reps=100)
    assert res["pilot"]["accuracy"] == 1.0 and "dana" in res["pilot"]["label"]


def test_missing_or_wrong_key_file_is_one_line_naming_it(report, tmp_path, cli):
    db = tmp_path / "k.db"
    sid = study.create_study(
        report, db, protocol="abx", clips_spec="sample:1", raters_planned=1, allow_masking=True
    )["study"]
    key = tmp_path / "k.db.key"
    moved = tmp_path / "elsewhere.key"
    key.rename(moved)
    store.close_all()
    # counts and progress need no key file
    assert study.study_progress(db, sid)["raters_invited"] == 0
    assert study.results(db, sid, reps=100)["status"] == "no ratings"
    code, _, err = cli("study", "invite", "--db", db, "--study", sid)
    assert code == 2
    assert_one_line_error(err, str(key), "study key file not found", "EVALKIT_STUDY_KEY")
    # the server refuses to start without it (a real process, before it listens)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = run_evalkit("serve", "--db", db, "--port", port, timeout=120)
    assert run.returncode == 2
    assert_one_line_error(run.stderr, str(key), "study key file not found")
    # the key file where the server runs: $EVALKIT_STUDY_KEY names it
    os.environ[seal.ENV] = str(moved)
    try:
        tok = study.invite(db, sid, 1)[0]["token"]
        assert len(answer(db, tok, _right(db))) > 0
    finally:
        del os.environ[seal.ENV]
    # another database's key: refused, naming it
    seal.create_or_load(key_other := tmp_path / "other.key")
    os.environ[seal.ENV] = str(key_other)
    try:
        code, _, err = cli("study", "invite", "--db", db, "--study", sid)
    finally:
        del os.environ[seal.ENV]
    assert code == 2
    assert_one_line_error(err, str(key_other), "not this study's key file")


def test_seal_round_trip_binding_and_tampering(tmp_path):
    key = seal.create_or_load(tmp_path / "a.key")
    assert seal.create_or_load(tmp_path / "a.key").id == key.id  # never overwritten
    value = {"expected": "A", "sources": {"X": "a", "A": "a", "B": "b"}}
    token = key.seal(value, "trial:1:0")
    assert key.unseal(token, "trial:1:0") == value
    assert key.seal(value, "trial:1:0") != token  # a fresh nonce each time
    assert '"a"' not in token and "expected" not in token
    with pytest.raises(study.StudyError, match="does not open"):
        key.unseal(token, "trial:2:0")  # moved to another row
    raw = bytearray(__import__("base64").urlsafe_b64decode(token[3:]))
    raw[20] ^= 1
    with pytest.raises(study.StudyError, match="does not open"):
        key.unseal("s1:" + __import__("base64").urlsafe_b64encode(bytes(raw)).decode(), "trial:1:0")
    other = seal.create_or_load(tmp_path / "b.key")
    with pytest.raises(study.StudyError, match="does not open"):
        other.unseal(token, "trial:1:0")
    (tmp_path / "c.key").write_text("not a key\n")
    with pytest.raises(study.StudyError, match="expected a study key"):
        seal.load(tmp_path / "c.key")


def test_results_name_every_study_of_the_same_runs(report, tmp_path):
    db = tmp_path / "n.db"
    ids = [
        study.create_study(
            report, db, protocol="abx", clips_spec="sample:1", seed=s, raters_planned=1, allow_masking=True
        )["study"]
        for s in range(3)
    ]
    for sid in ids:
        res = study.results(db, sid, reps=100)
        assert res["same_runs"]["studies"] == ids
        assert res["same_runs"]["text"].startswith("3 studies were made from these runs: 1, 2, 3")
    from evalkit.study.text import results_text

    assert "3 studies were made from these runs: 1, 2, 3" in results_text(res)
    alone = tmp_path / "alone.db"
    sid = study.create_study(
        report, alone, protocol="abx", clips_spec="sample:1", raters_planned=1, allow_masking=True
    )["study"]
    assert (
        study.results(alone, sid, reps=100)["same_runs"]["text"]
        == "1 study was made from these runs: 1 (this one)"
    )
