"""The rater side of a study: the one implementation of *next trial*, *media*, *answer* and
*progress*. The web app, scripts and tests all go through :class:`RaterService`.

Blindness (what a rater's browser can learn):

- **One stream per trial.** A trial's videos are the tiles of one file (:mod:`.media`), named
  ``HMAC-SHA256(study media key, "trial id:video")`` (:func:`media_name`): unique to one trial of
  one rater, says nothing about its content, cannot be linked across raters, trials or studies.
  The server maps the name back to the stored file. No file, size or byte belongs to one side.
- **Tiles, not sides.** The page is told which rectangle of the stream each box shows
  (``tiles``: slot -> [x, y, w, h]); the positions are drawn at random per trial, so they say
  nothing about which side is which.
- **Nothing else.** The public trial carries only the trial id, its position, the protocol, the
  answer labels, the study's frame rate, the media name and the tiles.

Gate (server side, with an injected ``clock``: tests drive time, never sleep):

1. A trial can only be answered when it is the rater's *current* trial (the first unanswered, in
   order) and it was handed out (``served``); anything else is :class:`~.errors.OutOfOrder`,
   which changes nothing.
2. Every byte of its video (one stream per trial) must have been sent to the rater (the union
   of the byte ranges sent, per video: ``trials.delivered`` in the database, so the videos of
   one trial may come from several server processes; a ``HEAD`` sends nothing) *and*
   acknowledged by the page once it holds the whole file (:meth:`RaterService.acknowledge`: the
   file's size and CRC-32, which a client that read 64 bytes cannot know; refused with
   :class:`~.errors.BadAcknowledgement` if they differ or any byte was never sent). Only then
   is ``fetched`` stored: the time the acknowledgement arrived, the last byte received
   (issue 44: bytes written to a socket are not bytes received). Before that
   :class:`~.errors.NotLoaded`. A script in this process that reads the whole file
   (:meth:`RaterService.media`) counts as acknowledging it then.
3. One play-through of the longest video (less one frame) must have passed since ``fetched``;
   before that :class:`~.errors.TooSoon` with the wait.
4. ``response_ms`` is measured here (answer arrival minus ``fetched``); the page's own figure is
   kept as ``client_ms``.

Speed: every database operation runs on one writer thread that groups the requests queued
while the previous batch was committing into one transaction ("group commit"); an answer is
acknowledged only after its batch committed. Immutable data (raters, trial lists, study
settings) is cached per process; what changes (answers, served/fetched times) is read from the
database, so several server processes can share one database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import math
import queue
import threading
import time
import zlib
from pathlib import Path
from typing import Callable

from sqlalchemy import and_, bindparam, select

from ..errors import UserError
from . import design, seal
from .errors import (
    BadAcknowledgement,
    BadAnswer,
    NotLoaded,
    OutOfOrder,
    RatingConflict,
    StudyError,
    TooSoon,
    TrialNotAssigned,
    UnknownMedia,
    UnknownToken,
    UnknownTrial,
)
from .lossless import ext_of
from .store import now, open_db, raters, ratings, studies, trials

_STOP = object()
DEFAULT_FPS = 24.0  # frame rate assumed for studies created before it was recorded


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def media_name(key: str, trial_id: int, slot: str, ext: str = ".mp4") -> str:
    """The name a trial's video in ``slot`` is served under (160 bits of HMAC-SHA256), with the
    extension of the study's media (:data:`.lossless.EXT`: the same for every trial)."""
    mac = hmac.new(bytes.fromhex(key), f"{int(trial_id)}:{slot}".encode(), hashlib.sha256)
    return mac.hexdigest()[:40] + ext


MAX_TOKEN = 512  # characters; invite tokens are 43
MAX_ID = 2**63 - 1  # database ids are 64-bit
MAX_RANGES = 64  # disjoint byte ranges kept per video (a browser sends a few)


def merge_ranges(ranges) -> list[list[int]]:
    """Half-open byte ranges ``[start, stop)`` as their union: sorted, disjoint, adjacent ones
    joined, empty ones dropped."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges if int(b) > int(a)):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covers(ranges, size: int) -> bool:
    """Whether merged ``ranges`` hold every byte of a file of ``size`` bytes."""
    return size <= 0 or (len(ranges) == 1 and ranges[0][0] <= 0 and ranges[0][1] >= size)


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error lines that echo what was sent."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def check_token(token) -> str:
    """The token as given if it can be one (a non-empty str of at most ``MAX_TOKEN``
    characters, valid UTF-8), else :class:`UnknownToken` (which never echoes it)."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN:
        raise UnknownToken()
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from JSON's \ud800
        raise UnknownToken() from None
    return token


def check_trial_id(trial) -> int:
    """A trial id, strictly: an int (not a bool, not a float such as 1.9 or 1e30) or its decimal
    digits, in 1..2**63-1; anything else is :class:`UnknownTrial`."""
    if isinstance(trial, str) and trial.isascii() and trial.isdigit() and len(trial) <= 19:
        trial = int(trial)
    if isinstance(trial, bool) or not isinstance(trial, int) or not 0 < trial <= MAX_ID:
        raise UnknownTrial(shown(trial))
    return trial


def check_answer(trial_id, protocol: str, answer) -> None:
    """:class:`BadAnswer` naming the field unless ``answer`` is one of ``protocol``'s."""
    if not isinstance(answer, str) or answer not in design.ANSWERS[protocol]:
        raise BadAnswer(
            f"trial {trial_id}: field 'answer': expected one of "
            f"{', '.join(design.ANSWERS[protocol])}, found {shown(answer)}"
        )


def check_client_ms(trial_id, client_ms) -> int | None:
    """The page's response time: None, or a finite non-negative number of milliseconds (kept
    as an int, at most 2**31-1); a bool, NaN, infinity or text is :class:`BadAnswer`."""
    if client_ms is None:
        return None
    if (
        isinstance(client_ms, bool)
        or not isinstance(client_ms, (int, float))
        or (isinstance(client_ms, float) and not math.isfinite(client_ms))
    ):
        raise BadAnswer(
            f"trial {trial_id}: field 'response_ms': expected a finite number of "
            f"milliseconds, found {shown(client_ms)}"
        )
    if client_ms < 0:
        raise BadAnswer(f"trial {trial_id}: field 'response_ms': expected >= 0, found {shown(client_ms)}")
    return int(min(client_ms, 2**31 - 1))


class RaterService:
    """``state``, ``media``, ``answer`` and ``progress`` for raters (async for the web app, each
    with a ``*_sync`` twin for scripts and tests). ``state`` and ``answer`` return
    ``{"progress", "trial"[, "completion_code"]}`` (``answer`` adds ``saved``)."""

    def __init__(
        self,
        db,
        *,
        completion_code: str | None = None,
        max_batch: int = 512,
        clock: Callable[[], float] = time.time,
    ):
        self.db = open_db(db)
        self.completion_code = completion_code
        self.max_batch = max(1, int(max_batch))
        self.clock = clock
        self._raters: dict[str, dict] = {}  # token sha256 -> {"id", "study_id"}
        self._plans: dict[int, list[dict]] = {}  # rater id -> trials in order
        self._names: dict[int, dict] = {}  # rater id -> media name -> (trial id, slot, sha)
        self._studies: dict[int, dict] = {}  # study id -> protocol, fps, durations, media, key
        self._sizes: dict[str, int] = {}  # media sha256 -> bytes
        self._crcs: dict[str, int] = {}  # media sha256 -> CRC-32 of its bytes
        self._loaded: set[int] = set()  # trials whose ``fetched`` was read back (final)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        if self.db.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        # statements built once (building and cache-keying a statement costs more than running
        # it on SQLite); values come as bound parameters
        self._q_rater = select(raters.c.id, raters.c.study_id).where(raters.c.token_sha256 == bindparam("h"))
        self._q_live = (
            select(trials.c.id, trials.c.served, trials.c.fetched, ratings.c.answer)
            .select_from(
                trials.outerjoin(
                    ratings, and_(ratings.c.rater_id == trials.c.rater_id, ratings.c.trial_id == trials.c.id)
                )
            )
            .where(trials.c.rater_id == bindparam("rid"))
        )
        # locked (PostgreSQL; SQLite's BEGIN IMMEDIATE locks the database): deliveries of one
        # trial are merged one after another, whichever process sent them
        self._q_one = (
            select(trials.c.served, trials.c.fetched, trials.c.delivered)
            .where(trials.c.id == bindparam("tid"))
            .with_for_update()
        )
        self._u_got = (
            trials.update().where(trials.c.id == bindparam("tid")).values(delivered=bindparam("got"))
        )
        self._u_served = (
            trials.update()
            .where(trials.c.id == bindparam("tid"), trials.c.served.is_(None))
            .values(served=bindparam("at"))
        )
        self._u_fetched = (
            trials.update()
            .where(trials.c.id == bindparam("tid"), trials.c.fetched.is_(None))
            .values(fetched=bindparam("at"))
        )
        self._i_rating = (
            insert(ratings)
            .on_conflict_do_nothing(index_elements=["rater_id", "trial_id"])
            .returning(ratings.c.id)
        )
        self._q_prev = select(ratings.c.answer).where(
            ratings.c.rater_id == bindparam("rid"), ratings.c.trial_id == bindparam("tid")
        )
        self._q_owner = select(trials.c.rater_id).where(trials.c.id == bindparam("tid"))
        self.batches = 0  # counters (the benchmark prints them)
        self.jobs = 0
        self._thread = threading.Thread(target=self._run, name="evalkit-writer", daemon=True)
        self._thread.start()

    # -- public -------------------------------------------------------------------------------

    def submit_job(self, kind: str, *args) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((kind, args, self.clock(), fut))
        return fut

    async def state(self, token: str) -> dict:
        """Progress and the rater's current trial (handing it out: its ``served`` is stored)."""
        return await asyncio.wrap_future(self.submit_job("state", token))

    async def answer(self, token, trial, answer, client_ms=None, client=None) -> dict:
        return await asyncio.wrap_future(self.submit_job("answer", token, trial, answer, client_ms, client))

    async def open_media(self, token: str, name: str) -> Path:
        """The file behind a media name of one of the rater's handed-out trials, recording
        nothing (the web app then reports what it sent: :meth:`delivered`);
        :class:`~.errors.UnknownMedia` for anything else."""
        return await asyncio.wrap_future(self.submit_job("media", token, name, False))

    def delivered(
        self, token: str, name: str, start: int, stop: int, began: float | None = None
    ) -> concurrent.futures.Future:
        """Record that bytes ``[start, stop)`` of a media file went to the rater, by a response
        that ``began`` then (this service's clock; default now): the web app, once they were
        sent; nothing waits for it."""
        return self.submit_job("delivered", token, name, int(start), int(stop), began)

    async def acknowledge(self, token, name, size, crc32) -> dict:
        """The page holds the whole media file ``name``: its ``size`` in bytes and ``crc32``
        (of every byte, as :func:`zlib.crc32`). Checked against the file and against what was
        sent (every byte must have been); once every video of the trial is acknowledged the
        gate's clock starts (``fetched``: now). Returns ``{"acknowledged": True}``; a mismatch
        is :class:`~.errors.BadAcknowledgement` and changes nothing."""
        return await asyncio.wrap_future(self.submit_job("ack", token, name, size, crc32))

    def acknowledge_sync(self, token, name, size, crc32) -> dict:
        return self.submit_job("ack", token, name, size, crc32).result()

    async def media(self, token: str, name: str) -> Path:
        """As :meth:`open_media`, for a script that reads the whole file: every byte of it
        counts as delivered."""
        return await asyncio.wrap_future(self.submit_job("media", token, name, True))

    def state_sync(self, token: str) -> dict:
        return self.submit_job("state", token).result()

    def answer_sync(self, token, trial, answer, client_ms=None, client=None) -> dict:
        return self.submit_job("answer", token, trial, answer, client_ms, client).result()

    def media_sync(self, token: str, name: str) -> Path:
        return self.submit_job("media", token, name, True).result()

    def progress(self, token: str) -> dict:
        """``{"done", "total", "finished"}``; hands nothing out."""
        return self.submit_job("progress", token).result()

    def close(self, timeout: float = 30) -> None:
        """Handle what is queued, then stop the writer thread."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            job = self._q.get()
            if job is _STOP:
                break
            batch = [job]
            while len(batch) < self.max_batch:
                try:
                    job = self._q.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    stop = True
                    break
                batch.append(job)
            self._batch(batch)

    def _batch(self, batch: list) -> None:
        done = []
        try:
            with self.db.engine.begin() as conn:
                for job in batch:
                    done.append((job, *self._one(conn, job)))
            # committed: only now does anyone hear back
        except Exception:  # noqa: BLE001 - retry each request alone, each gets its own outcome
            done = []
            for job in batch:
                try:
                    with self.db.engine.begin() as conn:
                        out = self._one(conn, job)
                    done.append((job, *out))
                except Exception as e:  # noqa: BLE001
                    done.append((job, None, e))
        self.batches += 1
        self.jobs += len(batch)
        for (_, _, _, fut), result, error in done:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    def _one(self, conn, job) -> tuple[object, Exception | None]:
        """One request inside the batch's transaction. User errors are returned, not raised, so
        the transaction goes on (a refused request writes nothing)."""
        kind, args, arrived, _ = job
        try:
            if kind == "state":
                return self._state(conn, *args, at=arrived), None
            if kind == "media":
                return self._media(conn, *args, arrived=arrived), None
            if kind == "progress":
                return self._progress(conn, *args), None
            if kind == "delivered":
                return self._delivered(conn, *args, arrived=arrived), None
            if kind == "ack":
                return self._ack(conn, *args, arrived=arrived), None
            return self._answer(conn, *args, arrived=arrived), None
        except UserError as e:
            return None, e

    # -- cached immutable data ------------------------------------------------------------------

    def _rater(self, conn, token) -> dict:
        h = token_hash(check_token(token))
        r = self._raters.get(h)
        if r is None:
            row = conn.execute(self._q_rater, {"h": h}).first()
            if row is None:
                raise UnknownToken()
            r = self._raters.setdefault(h, {"id": row[0], "study_id": row[1]})
        return r

    def _study(self, conn, sid: int) -> dict:
        st = self._studies.get(sid)
        if st is None:
            row = conn.execute(
                select(studies.c.protocol, studies.c.config, studies.c.media_dir).where(studies.c.id == sid)
            ).one()
            cfg = row[1] or {}
            st = {
                "protocol": row[0],
                "fps": float(cfg.get("fps") or DEFAULT_FPS),
                "media_dir": row[2],
                "seconds": dict(cfg.get("media_seconds") or {}),
                "key": cfg["media_key"],  # every study has one (schema 4 upgrade)
                "ext": ext_of(cfg),
                # the study key file: a trial's stream and tiles are sealed (schema 6)
                "seal": seal.study_key(cfg) if "seal" in cfg else None,
            }
            self._studies[sid] = st
        return st

    def _plan(self, conn, r: dict) -> list[dict]:
        plan = self._plans.get(r["id"])
        if plan is None:
            rows = conn.execute(
                select(
                    trials.c.id,
                    trials.c.rater_id,
                    trials.c.ord,
                    trials.c.kind,
                    trials.c.shown,
                    trials.c.sources,
                    trials.c.expected,
                    trials.c.sealed,
                )
                .where(trials.c.rater_id == r["id"])
                .order_by(trials.c.ord)
            ).mappings()
            st = self._study(conn, r["study_id"])
            # the server serves the right stream and tiles: it unseals them (the key file
            # where the server runs); a test trial's expected answer is never used here
            plan = [seal.unseal_trial(st["seal"], dict(t)) if t["sealed"] else dict(t) for t in rows]
            key, ext = st["key"], st["ext"]
            names = {}
            for t in plan:
                if "media" not in t["shown"]:  # one file per video: made before streams
                    raise StudyError(
                        f"study {r['study_id']}: made before trial streams (one "
                        "file per video, which its sizes could tell apart); "
                        "create it again with `evalkit study create`"
                    )
                t["names"] = {"video": media_name(key, t["id"], "video", ext)}
                t["files"] = {"video": t["shown"]["media"]}
                for slot, name in t["names"].items():
                    names[name] = (t["id"], slot, t["shown"]["media"])
            self._names[r["id"]] = names
            self._plans[r["id"]] = plan
        return plan

    def _seconds(self, st: dict, trial: dict) -> float:
        """One play-through of a trial: its stream."""
        out = 0.0
        for sha in (trial["shown"]["media"],):
            s = st["seconds"].get(sha)
            if s is None:  # a study made before durations were stored
                s = st["seconds"][sha] = _probe_seconds(Path(st["media_dir"]) / f"{sha}{st['ext']}")
            out = max(out, s)
        return out

    # -- per request --------------------------------------------------------------------------

    def _live(self, conn, rid: int) -> dict[int, list]:
        """trial id -> [served, fetched, answer or None] for every trial of the rater."""
        return {i: [s, f, a] for i, s, f, a in conn.execute(self._q_live, {"rid": rid})}

    def _public(self, t: dict, st: dict, total: int) -> dict:
        # fps is shared by every video of a trial, so it says nothing about which is which
        return {
            "trial": t["id"],
            "index": t["ord"] + 1,
            "total": total,
            "protocol": design.page_protocol(st["protocol"]),
            "answers": list(design.ANSWERS[st["protocol"]]),
            "fps": st["fps"],
            "media": dict(t["names"]),
            "tiles": {slot: list(r) for slot, r in t["shown"]["tiles"].items()},
        }

    def _view(self, conn, st: dict, plan: list[dict], live: dict, at: float) -> dict:
        done = sum(1 for v in live.values() if v[2] is not None)
        nxt = next((t for t in plan if live[t["id"]][2] is None), None)
        out = {"progress": {"done": done, "total": len(plan), "finished": done >= len(plan)}, "trial": None}
        if nxt is None:
            if self.completion_code:
                out["completion_code"] = self.completion_code
            return out
        if live[nxt["id"]][0] is None:  # handed out now
            conn.execute(self._u_served, {"tid": nxt["id"], "at": at})
            live[nxt["id"]][0] = at
        out["trial"] = self._public(nxt, st, len(plan))
        return out

    def _state(self, conn, token, *, at: float | None = None) -> dict:
        r = self._rater(conn, token)
        plan = self._plan(conn, r)
        st = self._study(conn, r["study_id"])
        return self._view(conn, st, plan, self._live(conn, r["id"]), self.clock() if at is None else at)

    def _progress(self, conn, token) -> dict:
        r = self._rater(conn, token)
        plan = self._plan(conn, r)
        done = sum(1 for v in self._live(conn, r["id"]).values() if v[2] is not None)
        return {"done": done, "total": len(plan), "finished": done >= len(plan)}

    def _hit(self, conn, token, name) -> tuple[dict, int, str, str]:
        r = self._rater(conn, token)
        self._plan(conn, r)
        hit = self._names[r["id"]].get(name) if isinstance(name, str) else None
        if hit is None:
            raise UnknownMedia()
        return (r, *hit)

    def _media(self, conn, token, name, whole, *, arrived) -> Path:
        r, tid, slot, sha = self._hit(conn, token, name)
        st = self._study(conn, r["study_id"])
        if tid not in self._loaded:
            if whole:
                self._deliver(conn, r, tid, slot, 0, self._size(st, sha), arrived)
                self._acked(conn, r, tid, slot, arrived)
            elif conn.execute(self._q_one, {"tid": tid}).one()[0] is None:
                raise UnknownMedia()  # not handed out yet: as if it did not exist
        return Path(st["media_dir"]) / f"{sha}{st['ext']}"

    def _delivered(self, conn, token, name, start, stop, began, *, arrived) -> None:
        r, tid, slot, _ = self._hit(conn, token, name)
        if tid not in self._loaded:  # once stored, fetched never changes: no query
            self._deliver(conn, r, tid, slot, start, stop, arrived if began is None else began)

    def _size(self, st: dict, sha: str) -> int:
        n = self._sizes.get(sha)
        if n is None:
            n = self._sizes[sha] = (Path(st["media_dir"]) / f"{sha}{st['ext']}").stat().st_size
        return n

    def _crc(self, st: dict, sha: str) -> int:
        n = self._crcs.get(sha)
        if n is None:
            crc = 0
            with open(Path(st["media_dir"]) / f"{sha}{st['ext']}", "rb") as f:
                while chunk := f.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
            n = self._crcs[sha] = crc
        return n

    def _deliver(self, conn, r: dict, tid: int, slot: str, start: int, stop: int, began: float) -> None:
        """Add bytes ``[start, stop)`` of the trial's video in ``slot``, sent by a response
        that ``began`` then, to what was sent (the gate then waits for the page's
        acknowledgement: :meth:`_ack`)."""
        served, fetched, got = conn.execute(self._q_one, {"tid": tid}).one()
        if served is None:  # not handed out yet: as if it did not exist
            raise UnknownMedia()
        if fetched is not None:  # committed: read back from the database
            self._loaded.add(tid)
            return
        st = self._study(conn, r["study_id"])
        t = next(x for x in self._plans[r["id"]] if x["id"] == tid)
        got = dict(got or {})  # slot -> {"ranges", "first"[, "acked"]}
        size = self._size(st, t["files"][slot])
        start, stop = max(0, start), min(size, stop)
        if stop > start:
            old = got.get(slot) or {"ranges": [], "first": began}
            new = {
                **old,
                "ranges": merge_ranges([*old["ranges"], [start, stop]]),
                "first": min(old["first"], began),
            }
            if new != got.get(slot) and len(new["ranges"]) <= MAX_RANGES:
                got[slot] = new
                conn.execute(self._u_got, {"tid": tid, "got": got})

    def _ack(self, conn, token, name, size, crc32, *, arrived) -> dict:
        r, tid, slot, sha = self._hit(conn, token, name)
        st = self._study(conn, r["study_id"])
        for field, value in (("size", size), ("crc32", crc32)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise BadAcknowledgement(
                    f"field {field!r}: expected a non-negative integer, found {shown(value)}"
                )
        if size != self._size(st, sha) or crc32 != self._crc(st, sha):
            raise BadAcknowledgement("size or CRC-32: not those of the file sent")
        if tid not in self._loaded:
            self._acked(conn, r, tid, slot, arrived)
        return {"acknowledged": True}

    def _acked(self, conn, r: dict, tid: int, slot: str, at: float) -> None:
        """The video in ``slot`` acknowledged whole at ``at``: refused unless every byte was
        sent; once every video of the trial is, ``fetched`` is stored (the latest
        acknowledgement: the gate's clock starts from the last byte received)."""
        served, fetched, got = conn.execute(self._q_one, {"tid": tid}).one()
        if served is None:
            raise UnknownMedia()
        if fetched is not None:
            self._loaded.add(tid)
            return
        st = self._study(conn, r["study_id"])
        t = next(x for x in self._plans[r["id"]] if x["id"] == tid)
        got = dict(got or {})
        if slot not in got or not covers(got[slot]["ranges"], self._size(st, t["files"][slot])):
            raise BadAcknowledgement("the whole file was never sent; load it again")
        if "acked" not in got[slot]:
            got[slot] = {**got[slot], "acked": at}
            conn.execute(self._u_got, {"tid": tid, "got": got})
        if all("acked" in got.get(s, {}) for s in t["files"]):
            conn.execute(self._u_fetched, {"tid": tid, "at": max(got[s]["acked"] for s in t["files"])})

    def _answer(self, conn, token, trial_id, answer, client_ms, client, *, arrived) -> dict:
        tid = check_trial_id(trial_id)
        r = self._rater(conn, token)
        plan = self._plan(conn, r)
        t = next((x for x in plan if x["id"] == tid), None)
        if t is None:
            owner = conn.execute(self._q_owner, {"tid": tid}).scalar()
            if owner is None:
                raise UnknownTrial(tid)
            raise TrialNotAssigned(tid, r["id"])
        st = self._study(conn, r["study_id"])
        protocol = st["protocol"]
        check_answer(tid, protocol, answer)
        cms = check_client_ms(tid, client_ms)
        live = self._live(conn, r["id"])
        served, fetched, prev = live[tid]
        if prev is not None:  # answered before: idempotent or a conflict
            prev = seal.open_answer(st["seal"], r["id"], tid, prev)
            if prev != answer:
                raise RatingConflict(tid, prev, answer)
            return {"saved": False, **self._view(conn, st, plan, live, arrived)}
        current = next((x for x in plan if live[x["id"]][2] is None), None)
        if current is None or current["id"] != tid or served is None:
            raise OutOfOrder(tid)
        if fetched is None:
            raise NotLoaded(tid)
        seconds = self._seconds(st, t)
        need = max(0.0, seconds - 1.0 / st["fps"])  # one frame of slack
        if arrived - fetched < need:
            raise TooSoon(tid, arrived - fetched, need, seconds)
        # the answer is stored, not its correctness: a test trial's is computed when the key is
        # opened (:func:`.analyse.raw_ratings`); a catch trial's is kept for the interim screening
        correct = design.score(protocol, t, answer)[0] if t["kind"] == "catch" else None
        row = {
            "study_id": r["study_id"],
            "rater_id": r["id"],
            "trial_id": tid,
            "answer": seal.seal_answer(st["seal"], r["id"], tid, answer),
            "correct": correct,
            "response_ms": int(round(1000 * (arrived - fetched))),
            "client_ms": cms,
            "shown": {},
            "sources": {},
            "client": client[:200] if client else None,
            "created": now(),
        }
        new = conn.execute(self._i_rating, row).scalar() is not None
        if not new:  # written meanwhile by another process
            prev = seal.open_answer(
                st["seal"],
                r["id"],
                tid,
                conn.execute(self._q_prev, {"rid": r["id"], "tid": tid}).scalar_one(),
            )
            if prev != answer:
                raise RatingConflict(tid, prev, answer)
        live[tid][2] = answer
        return {"saved": new, **self._view(conn, st, plan, live, arrived)}


def _probe_seconds(path: Path) -> float:
    from ..video import open_clip

    try:
        info = open_clip(path).info
        return float(info.frames / info.fps) if info.frames else 0.0
    except Exception:  # noqa: BLE001 - no gate rather than no study
        return 0.0


class FakeClock:
    """A clock for tests and simulations: ``clock()`` returns ``now``; ``advance(s)`` moves it."""

    def __init__(self, start: float = 1_000_000.0):
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += float(seconds)
        return self.now
