"""Study storage on SQLAlchemy Core: SQLite (embedded default) or PostgreSQL, same schema.

SQLite runs in WAL mode with a busy timeout and ``synchronous=FULL``; every transaction starts
with ``BEGIN IMMEDIATE`` so concurrent writers queue on the busy timeout instead of failing on a
lock upgrade. A rating is acknowledged only after its transaction commits.

Schema (``meta.schema_version`` = :data:`SCHEMA_VERSION`; older versions upgrade in place when
opened, newer ones are refused):

- ``studies``: id, protocol, margin, seed, clips_spec, raters_planned, catch_threshold, alpha,
  report, run_a, run_b, media_dir, created, config (JSON)
- ``clips``: id, study_id, ord, job, clip, prompt, seed, lpips_mean, media_a, media_b (empty
  since trial streams: a row's streams are in ``studies.config["streams"]``), base_swap, base_x
  (counterbalancing bits), media_a_alt, media_b_alt (NULL since trial streams)
- ``raters``: id, study_id, idx (0, 1, ... in invitation order), token_sha256 (unique), label,
  seed, created
- ``trials``: id, study_id, rater_id, ord, kind (test/catch), clip_id, catch_kind, shown (JSON,
  ``{}`` since version 6:
  ``{"media": the trial's stream sha256, "tiles": slot -> [x, y, w, h]}``), sources (JSON: slot -> a/b/reference/degraded), expected, served
  (seconds since the epoch when the web app first showed the trial to its rater; NULL until
  then; added in schema version 3), fetched (seconds since the epoch when the last of the
  trial's videos began to be delivered, stored once every byte of each went to the rater:
  ``delivered``; version 4), delivered (JSON, version 5: slot -> ``{"ranges": [[start, stop),
  ...], "first": t}``, the union of the byte ranges of that video sent to the rater and when the
  first response carrying them began; ``fetched`` is the latest ``first`` once every video is
  covered whole, as a browser plays while it loads); unique (rater_id, ord)
- ``ratings``: id, study_id, rater_id, trial_id, answer, correct, response_ms (measured by the
  server: from ``fetched`` to the answer's arrival), shown, sources (the hidden mapping as
  shown), client, created, client_ms (the page's own response time, as sent; version 4);
  unique (rater_id, trial_id)
- ``unblindings`` (version 5): id, study_id, who, reason, created, raters_included (included
  raters complete when the key was opened), raters_planned: the owner's logged look at the key
  before the planned design was complete (``evalkit study unblind``); every later verdict and
  CSV reports it
- version 6 (:mod:`.seal`): ``trials.sealed`` holds each trial's shown, sources and expected
  (the plain columns ``{}``/NULL; a catch trial keeps ``expected``); ``ratings`` keep the answer
  sealed (``correct`` for catch trials only; shown and sources ``{}``); ``studies.config["sealed"]``
  holds the streams, catch pool, clips' bits (``clips.base_swap``/``base_x`` 0) and design seed
  (``raters.seed`` 0), ``config["seal"]`` the key file's path and id; ``ratings.answer`` is
  sealed (TEXT)
- ``studies.config`` (JSON) holds, among others, ``media_key``: the per-study secret that makes
  every trial's media names (HMAC of trial and slot) unlinkable across raters, trials, studies
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
from pathlib import Path

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    exc,
    inspect,
    select,
    text,
)

from ..errors import SchemaVersionError
from ..fsutil import file_kind
from .errors import StudyError, UnknownStudy

SCHEMA_VERSION = 6

metadata = MetaData()

meta = Table(
    "meta", metadata, Column("key", String(64), primary_key=True), Column("value", Text, nullable=False)
)

studies = Table(
    "studies",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("protocol", String(16), nullable=False),
    Column("margin", Float, nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("clips_spec", String(64), nullable=False),
    Column("raters_planned", Integer, nullable=False),
    Column("catch_threshold", Float, nullable=False),
    Column("alpha", Float, nullable=False),
    Column("report", Text, nullable=False),
    Column("run_a", Text, nullable=False),
    Column("run_b", Text, nullable=False),
    Column("media_dir", Text, nullable=False),
    Column("created", String(40), nullable=False),
    Column("config", JSON, nullable=False),
)

clips = Table(
    "clips",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_id", Integer, ForeignKey("studies.id"), nullable=False, index=True),
    Column("ord", Integer, nullable=False),
    Column("job", Text, nullable=False),
    Column("clip", Text, nullable=False),
    Column("prompt", Text, nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("lpips_mean", Float),
    Column("media_a", String(64), nullable=False),
    Column("media_b", String(64), nullable=False),
    Column("base_swap", Integer, nullable=False),
    Column("base_x", Integer, nullable=False),
    Column("media_a_alt", String(64)),  # added in schema version 4
    Column("media_b_alt", String(64)),  # added in schema version 4
)

raters = Table(
    "raters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_id", Integer, ForeignKey("studies.id"), nullable=False, index=True),
    Column("idx", Integer, nullable=False),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("label", Text),
    Column("seed", BigInteger, nullable=False),
    Column("created", String(40), nullable=False),
    UniqueConstraint("study_id", "idx", name="uq_rater_idx"),
)

trials = Table(
    "trials",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_id", Integer, ForeignKey("studies.id"), nullable=False, index=True),
    Column("rater_id", Integer, ForeignKey("raters.id"), nullable=False, index=True),
    Column("ord", Integer, nullable=False),
    Column("kind", String(8), nullable=False),
    Column("clip_id", Integer, ForeignKey("clips.id")),
    Column("catch_kind", String(16)),
    Column("shown", JSON, nullable=False),
    Column("sources", JSON, nullable=False),
    Column("expected", String(16)),
    Column("served", Float),  # added in schema version 3
    Column("fetched", Float),  # added in schema version 4
    Column("delivered", JSON),  # added in schema version 5
    Column("sealed", Text),  # added in schema version 6 (:mod:`.seal`)
    UniqueConstraint("rater_id", "ord", name="uq_trial_order"),
)

ratings = Table(
    "ratings",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_id", Integer, ForeignKey("studies.id"), nullable=False, index=True),
    Column("rater_id", Integer, ForeignKey("raters.id"), nullable=False),
    Column("trial_id", Integer, ForeignKey("trials.id"), nullable=False),
    Column("answer", Text, nullable=False),  # sealed since version 6 (VARCHAR(16) before)
    Column("correct", Integer),
    Column("response_ms", Integer, nullable=False),
    Column("shown", JSON, nullable=False),
    Column("sources", JSON, nullable=False),
    Column("client", String(200)),  # added in schema version 2
    Column("created", String(40), nullable=False),
    Column("client_ms", Integer),  # added in schema version 4
    UniqueConstraint("rater_id", "trial_id", name="uq_rating_once"),
)

unblindings = Table(
    "unblindings",
    metadata,  # added in schema version 5
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("study_id", Integer, ForeignKey("studies.id"), nullable=False, index=True),
    Column("who", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("created", String(40), nullable=False),
    Column("raters_included", Integer, nullable=False),
    Column("raters_planned", Integer, nullable=False),
)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _upgrade_1_to_2(conn) -> None:
    conn.execute(text("ALTER TABLE ratings ADD COLUMN client VARCHAR(200)"))


def _upgrade_2_to_3(conn) -> None:
    conn.execute(text("ALTER TABLE trials ADD COLUMN served FLOAT"))


def _upgrade_3_to_4(conn) -> None:
    conn.execute(text("ALTER TABLE clips ADD COLUMN media_a_alt VARCHAR(64)"))
    conn.execute(text("ALTER TABLE clips ADD COLUMN media_b_alt VARCHAR(64)"))
    conn.execute(text("ALTER TABLE trials ADD COLUMN fetched FLOAT"))
    conn.execute(text("ALTER TABLE ratings ADD COLUMN client_ms INTEGER"))
    for sid, cfg in conn.execute(select(studies.c.id, studies.c.config)).all():
        cfg = dict(cfg or {})
        cfg.setdefault("media_key", new_media_key())
        conn.execute(studies.update().where(studies.c.id == sid).values(config=cfg))


#: schema version -> the tables it added (an older database lacks them until upgraded)
ADDED_TABLES = {5: ("unblindings",)}


def _upgrade_4_to_5(conn) -> None:
    unblindings.create(conn, checkfirst=True)
    if "delivered" not in {c["name"] for c in inspect(conn).get_columns("trials")}:
        conn.execute(text("ALTER TABLE trials ADD COLUMN delivered JSON"))


def _upgrade_5_to_6(conn, db: "StudyDB") -> None:
    """Seal what lets a reader compute correctness (:mod:`.seal`): each study gets its key file
    (made beside the database if missing), its streams, catch pool and clips' bits move into
    ``config["sealed"]``, each trial's shown/sources/expected into ``trials.sealed``; ratings
    keep the answer, sealed (and a catch trial's ``correct``). Such a study's design was drawn from its
    seed, which the owner knows: ``config["design_from_seed"]`` says so and results report it."""
    from . import seal

    if "sealed" not in {c["name"] for c in inspect(conn).get_columns("trials")}:
        conn.execute(text("ALTER TABLE trials ADD COLUMN sealed TEXT"))
    if not db.is_sqlite:  # a sealed answer is longer than VARCHAR(16)
        conn.execute(text("ALTER TABLE ratings ALTER COLUMN answer TYPE TEXT"))
    for sid, cfg, media_dir in conn.execute(
        select(studies.c.id, studies.c.config, studies.c.media_dir)
    ).all():
        cfg = dict(cfg or {})
        if "sealed" in cfg:
            continue
        key = seal.create_or_load(seal.default_path(db.path, media_dir))
        cfg["bits"] = {
            str(i): [int(s), int(x)]
            for i, s, x in conn.execute(
                select(clips.c.id, clips.c.base_swap, clips.c.base_x).where(clips.c.study_id == sid)
            )
        }
        cfg["design_from_seed"] = True
        conn.execute(
            studies.update().where(studies.c.id == sid).values(config=seal.seal_config(key, sid, cfg))
        )
        conn.execute(clips.update().where(clips.c.study_id == sid).values(base_swap=0, base_x=0))
        conn.execute(raters.update().where(raters.c.study_id == sid).values(seed=0))
        rows = (
            conn.execute(
                select(
                    trials.c.id,
                    trials.c.rater_id,
                    trials.c.ord,
                    trials.c.kind,
                    trials.c.shown,
                    trials.c.sources,
                    trials.c.expected,
                ).where(trials.c.study_id == sid)
            )
            .mappings()
            .all()
        )
        for r in rows:
            new = seal.seal_trial(key, r["rater_id"], dict(r))
            conn.execute(
                trials.update()
                .where(trials.c.id == r["id"])
                .values(sealed=new["sealed"], shown={}, sources={}, expected=new["expected"])
            )
        for rid, rater, trial, ans in conn.execute(
            select(ratings.c.id, ratings.c.rater_id, ratings.c.trial_id, ratings.c.answer).where(
                ratings.c.study_id == sid
            )
        ).all():
            conn.execute(
                ratings.update()
                .where(ratings.c.id == rid)
                .values(answer=seal.seal_answer(key, rater, trial, ans))
            )
        tests = select(trials.c.id).where(trials.c.study_id == sid, trials.c.kind != "catch")
        conn.execute(ratings.update().where(ratings.c.study_id == sid).values(shown={}, sources={}))
        conn.execute(ratings.update().where(ratings.c.trial_id.in_(tests)).values(correct=None))


#: upgrades that need the open database (where its key file goes), not the connection alone
NEEDS_DB = {5}


def new_media_key() -> str:
    """A study's media secret (256 bits)."""
    return secrets.token_hex(32)


#: version -> function upgrading a database from that version to the next
UPGRADES = {
    1: _upgrade_1_to_2,
    2: _upgrade_2_to_3,
    3: _upgrade_3_to_4,
    4: _upgrade_4_to_5,
    5: _upgrade_5_to_6,
}


#: the database kinds ``--db`` takes (an SQLAlchemy URL's dialect, before any ``+driver``)
DIALECTS = ("sqlite", "postgresql")


def shown_url(url: str) -> str:
    """A database URL as error messages show it: password hidden."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
        return url if parsed.password is None else parsed.render_as_string(hide_password=True)
    except Exception:  # not a URL at all: as given
        return url


def storage_problem(path: Path) -> str | None:
    """Why SQLite cannot write the database ``path`` (it writes the file and its ``-wal`` and
    ``-shm`` beside it, even to read), or None: a read-only file system, no permission, or no
    room left on the disk."""
    folder = path.parent if path.parent.is_dir() else Path(".")
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return (
            f"cannot be written: its folder {folder} is on a read-only file system (SQLite "
            "writes the database and its -wal and -shm files beside it, even to read "
            "results); copy the database somewhere writable"
        )
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        return (
            f"cannot be written: no permission to write it or its folder {folder} (SQLite "
            "writes the database and its -wal and -shm files beside it)"
        )
    if st.f_bavail * st.f_frsize < 1024 * 1024:
        return (
            f"cannot be written: no space left on the disk of {folder} "
            f"({st.f_bavail * st.f_frsize:,} bytes free); make room and run the command again"
        )
    return None


def _first_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e  # the driver's own error under SQLAlchemy's
    lines = str(orig).strip().splitlines()
    return lines[0].strip() if lines else type(orig).__name__


class StudyDB:
    """An open study database (an SQLAlchemy engine plus where media go by default).
    ``create``: make the tables in a new or empty database; without it a missing file or a
    database without evalkit's tables is an error naming ``--db`` (commands that read a study
    must not leave an empty database behind a mistyped name)."""

    def __init__(self, url: str, *, create: bool = True, given: str | None = None):
        self.url = str(url)
        self._where = where = f"--db {shown_url(given or self.url)}"  # as the user wrote it
        scheme = self.url.split("://", 1)[0].lower() if "://" in self.url else ""
        if scheme.split("+", 1)[0] not in DIALECTS:
            raise StudyError(
                f"{where}: expected an SQLite file, sqlite:///PATH or a "
                f"postgresql+psycopg:// URL, found the scheme {scheme or 'none'!r}"
            )
        self.is_sqlite = scheme.startswith("sqlite")
        kw = {}
        if self.is_sqlite:
            self.path = _sqlite_path(self.url, where)
            if self.path is not None:
                if self.path.is_dir():
                    raise StudyError(f"{where}: expected an SQLite file, found a folder")
                if self.path.exists() and not self.path.is_file():
                    raise StudyError(f"{where}: expected an SQLite file, found {file_kind(self.path)}")
                if not self.path.exists() and not create:
                    raise StudyError(
                        f"{where}: no study database there (file not found; `evalkit study create` makes one)"
                    )
                if not self.path.parent.is_dir():  # nothing is made but what the user named
                    raise StudyError(
                        f"{where}: the folder {self.path.parent} does not exist "
                        "(make it first, or name a file in an existing folder)"
                    )
            kw["connect_args"] = {"timeout": 60, "check_same_thread": False}
        else:
            self.path = None
            kw["pool_size"] = 10
            kw["max_overflow"] = 60
        try:
            self.engine = create_engine(self.url, future=True, **kw)
        except exc.NoSuchModuleError as e:
            raise StudyError(f"{where}: unknown database driver ({_first_line(e)})") from e
        except (exc.ArgumentError, ValueError) as e:
            raise StudyError(f"{where}: not a valid database URL ({_first_line(e)})") from e
        except ImportError as e:
            hint = "" if self.is_sqlite else "; for PostgreSQL: pip install 'evalkit[postgres]'"
            raise StudyError(f"{where}: its database driver is not installed ({_first_line(e)}{hint})") from e
        if self.is_sqlite:

            @event.listens_for(self.engine, "connect")
            def _on_connect(dbapi_conn, _record):
                dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA busy_timeout = 60000")
                cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = FULL")
                cur.execute("PRAGMA foreign_keys = ON")
                cur.execute("PRAGMA secure_delete = ON")  # freed pages zeroed (no old key)
                cur.close()

            @event.listens_for(self.engine, "begin")
            def _on_begin(conn):
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        try:
            if self._prepare(create):
                self._scrub()
        except StudyError:
            self.engine.dispose()
            raise
        except exc.SQLAlchemyError as e:
            self.engine.dispose()
            what = (
                "not an SQLite study database"
                if self.is_sqlite and self.path is not None and self.path.is_file()
                else "cannot open the database"
            )
            if self.path is not None:  # a sound file that cannot be written is not damaged
                what = storage_problem(self.path) or what
            raise StudyError(f"{where}: {what} ({_first_line(e)})") from e

    @property
    def default_media_dir(self) -> Path | None:
        """``<name>.media/`` beside a SQLite file (``studies.db`` -> ``studies.media/``): one
        folder per database, never shared by two databases in one folder."""
        return self.path.with_name(self.path.stem + ".media") if self.path is not None else None

    def _scrub(self) -> None:
        """After sealing an older database: rewrite it so no freed page or old row version
        still holds the plain key (SQLite ``VACUUM`` and a WAL checkpoint; PostgreSQL
        ``VACUUM FULL`` of the sealed tables)."""
        raw = self.engine.raw_connection()
        try:
            if self.is_sqlite:
                raw.driver_connection.execute("VACUUM")
                raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            else:  # VACUUM runs outside a transaction
                raw.driver_connection.rollback()
                raw.driver_connection.autocommit = True
                try:
                    raw.driver_connection.execute("VACUUM FULL trials, ratings, clips, studies, raters")
                finally:
                    raw.driver_connection.autocommit = False
        finally:
            raw.close()

    def _prepare(self, create: bool) -> bool:
        """Make or upgrade the tables; True when an upgrade sealed an older database."""
        with self.engine.begin() as conn:
            have = set(inspect(conn).get_table_names())
            ours = set(metadata.tables)
            if not have & ours:
                if not create:
                    raise StudyError(
                        f"{self._where}: not a study database (no "
                        "evalkit tables; `evalkit study create` makes them)"
                    )
                metadata.create_all(conn)
                conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
                return False
            version = self._version(conn) if "meta" in have else 0
            # damaged: never re-created empty (they held ratings); tables a later version adds
            # are made by its upgrade
            missing = ours - have - {t for v, ts in ADDED_TABLES.items() if v > version for t in ts}
            if missing:
                raise StudyError(
                    f"{self._where}: a damaged study database: table(s) "
                    f"{', '.join(sorted(missing))} missing (found "
                    f"{', '.join(sorted(have & ours))}); restore it from a backup"
                )
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    self.url,
                    f"study database schema version {version} is "
                    f"newer than this evalkit's ({SCHEMA_VERSION})",
                )
            sealed = version < 6
            while version < SCHEMA_VERSION:
                if version in NEEDS_DB:
                    UPGRADES[version](conn, self)
                else:
                    UPGRADES[version](conn)
                version += 1
                conn.execute(meta.update().where(meta.c.key == "schema_version").values(value=str(version)))
            metadata.create_all(conn)  # tables added by later versions
        return sealed

    def _version(self, conn) -> int:
        """``meta.schema_version``: an integer from 1 (a StudyError naming it otherwise)."""
        value = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar_one_or_none()
        if value is None or not str(value).strip().isdigit() or int(value) < 1:
            raise StudyError(
                f"{self._where}: a damaged study database: meta.schema_version: "
                f"expected an integer 1-{SCHEMA_VERSION}, found "
                f"{'nothing' if value is None else repr(str(value)[:40])}"
            )
        return int(value)

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return self._version(conn)

    def dispose(self) -> None:
        self.engine.dispose()


_OPEN: dict[str, StudyDB] = {}


def _sqlite_path(url: str, where: str) -> Path | None:
    """The file of an ``sqlite://`` URL (None: in memory): ``sqlite:///relative/path`` or
    ``sqlite:////absolute/path``, nothing else (no host, no query, no further slashes)."""
    rest = url.split("://", 1)[1]
    form = "expected sqlite:///relative/path or sqlite:////absolute/path"
    if rest == "":
        return None
    if not rest.startswith("/"):
        raise StudyError(f"{where}: {form}, found the host {rest.split('/', 1)[0]!r}")
    path = rest[1:]
    if path in ("", ":memory:"):
        return None
    if path.startswith("//"):
        raise StudyError(
            f"{where}: {form}, found {len(rest) - len(rest.lstrip('/')) + 2} slashes after 'sqlite:'"
        )
    if "?" in path:
        raise StudyError(f"{where}: {form}, found a query ({path[path.index('?') :][:40]!r})")
    return Path(path)


def sqlite_url(path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def open_db(db, *, create: bool = False) -> StudyDB:
    """A :class:`StudyDB` from a URL (``sqlite:///path``, ``postgresql+psycopg://...``), a path
    to an SQLite file, or an open StudyDB. Engines are cached per URL within a process.
    ``create``: make a new database (``study create``); otherwise it must exist and hold a
    study database (errors name ``--db``)."""
    if isinstance(db, StudyDB):
        return db
    url = str(db)
    if not url.strip():
        raise StudyError("--db: expected an SQLite file or a database URL, found an empty string")
    if "://" not in url:
        url = sqlite_url(url)
    if url not in _OPEN:
        _OPEN[url] = StudyDB(url, create=create, given=str(db))
    return _OPEN[url]


def close_all() -> None:
    for d in _OPEN.values():
        d.dispose()
    _OPEN.clear()


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True)


def load_study(conn, study) -> dict:
    try:
        sid = int(study)
    except (TypeError, ValueError):
        raise UnknownStudy(study) from None
    if not 0 < sid < 2**63:  # no such id; the driver would overflow on a larger one
        raise UnknownStudy(study)
    row = conn.execute(select(studies).where(studies.c.id == sid)).mappings().first()
    if row is None:
        raise UnknownStudy(study)
    return dict(row)
