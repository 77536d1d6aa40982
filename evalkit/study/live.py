"""The rater side of the web app: :func:`~.api.next_trial`, :func:`~.api.submit` and
:func:`~.api.progress` made fast for many raters at once, with the play-through gate enforced on
the server.

- **Caches of immutable data**: a rater (by token hash), the rater's trial list and the study's
  protocol, frame rate, clip durations and media folder never change once created, so each is
  read once per process. What changes (answers, first-served times) is always read from the
  database, so several server processes can share one database.
- **Group commit**: every database operation of the rater API runs on one writer thread. It takes
  all the requests queued while the previous batch was committing and handles them in one
  transaction (per request: one read of the rater's trial states, the rating insert, the
  first-served mark of the next trial), then commits once. A request's answer is only released
  after its batch has committed, so no acknowledged rating can be lost. If a batch fails as a
  whole, each request in it is retried alone, so one bad request cannot fail the others.
- **Play-through gate**: the first time a trial is handed to its rater, its ``served`` time is
  stored; an answer that arrives sooner than one play-through of the trial's videos after that
  (less one frame of slack) is refused with :class:`~.errors.TooSoon`, which also marks a trial
  that was never served as served now.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from pathlib import Path

from sqlalchemy import and_, bindparam, select

from ..errors import UserError
from . import design
from .api import _public, check_answer, check_response_ms, study_fps, token_hash
from .errors import RatingConflict, TooSoon, TrialNotAssigned, UnknownToken, UnknownTrial
from .store import now, open_db, raters, ratings, studies, trials

_STOP = object()


class RaterService:
    """``state(token)`` and ``answer(token, trial, answer, response_ms)`` for the web app; both
    return ``{"progress", "trial"[, "completion_code"]}`` (``answer`` adds ``saved``)."""

    def __init__(self, db, *, completion_code: str | None = None, max_batch: int = 512):
        self.db = open_db(db)
        self.completion_code = completion_code
        self.max_batch = max(1, int(max_batch))
        self._raters: dict[str, dict] = {}      # token sha256 -> {"id", "study_id"}
        self._plans: dict[int, list[dict]] = {}  # rater id -> trials in order
        self._studies: dict[int, dict] = {}     # study id -> protocol, fps, durations, media
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        if self.db.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        # statements built once (building and cache-keying a statement costs more than running
        # it on SQLite); values come as bound parameters
        self._q_rater = select(raters.c.id, raters.c.study_id).where(
            raters.c.token_sha256 == bindparam("h"))
        self._q_live = (select(trials.c.id, trials.c.served, ratings.c.answer)
                        .select_from(trials.outerjoin(ratings, and_(
                            ratings.c.rater_id == trials.c.rater_id,
                            ratings.c.trial_id == trials.c.id)))
                        .where(trials.c.rater_id == bindparam("rid")))
        self._u_served = (trials.update().where(trials.c.id == bindparam("tid"),
                                                trials.c.served.is_(None))
                          .values(served=bindparam("at")))
        self._i_rating = (insert(ratings).on_conflict_do_nothing(
            index_elements=["rater_id", "trial_id"]).returning(ratings.c.id))
        self._q_prev = select(ratings.c.answer).where(ratings.c.rater_id == bindparam("rid"),
                                                      ratings.c.trial_id == bindparam("tid"))
        self._q_owner = select(trials.c.rater_id).where(trials.c.id == bindparam("tid"))
        self.batches = 0                         # counters (the benchmark prints them)
        self.jobs = 0
        self._thread = threading.Thread(target=self._run, name="evalkit-writer", daemon=True)
        self._thread.start()

    # -- public -------------------------------------------------------------------------------

    def submit_job(self, kind: str, *args) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((kind, args, time.time(), fut))
        return fut

    async def state(self, token: str) -> dict:
        return await asyncio.wrap_future(self.submit_job("state", token))

    async def answer(self, token, trial, answer, response_ms, client=None) -> dict:
        return await asyncio.wrap_future(
            self.submit_job("answer", token, trial, answer, response_ms, client))

    def media_dir(self, token: str) -> Path | None:
        """The media folder of this rater's study (None: no such rater). Thread-safe."""
        if not isinstance(token, str) or not token:
            return None
        h = token_hash(token)
        r = self._raters.get(h)
        if r is None:
            with self.db.engine.connect() as conn:
                row = conn.execute(self._q_rater, {"h": h}).first()
                if row is None:
                    return None
                r = self._raters.setdefault(h, {"id": row[0], "study_id": row[1]})
                st = self._study(conn, r["study_id"])
        else:
            st = self._studies.get(r["study_id"])
            if st is None:
                with self.db.engine.connect() as conn:
                    st = self._study(conn, r["study_id"])
        return Path(st["media_dir"])

    def close(self, timeout: float = 30) -> None:
        """Handle what is queued, then stop the writer thread."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join(timeout)

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

    def _one(self, conn, job) -> tuple[dict | None, Exception | None]:
        """One request inside the batch's transaction. User errors are returned, not raised, so
        the transaction goes on (a refused request writes nothing, except the served mark of a
        trial answered before it was ever served)."""
        kind, args, arrived, _ = job
        try:
            if kind == "state":
                return self._state(conn, *args), None
            return self._answer(conn, *args, arrived=arrived), None
        except UserError as e:
            return None, e

    # -- cached immutable data ------------------------------------------------------------------

    def _rater(self, conn, token) -> dict:
        if not isinstance(token, str) or not token:
            raise UnknownToken()
        h = token_hash(token)
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
            row = conn.execute(select(studies.c.protocol, studies.c.config, studies.c.media_dir)
                               .where(studies.c.id == sid)).one()
            cfg = row[1] or {}
            st = {"protocol": row[0], "fps": study_fps(cfg), "media_dir": row[2],
                  "seconds": dict(cfg.get("media_seconds") or {})}
            self._studies[sid] = st
        return st

    def _plan(self, conn, r: dict) -> list[dict]:
        plan = self._plans.get(r["id"])
        if plan is None:
            plan = [dict(t) for t in conn.execute(
                select(trials.c.id, trials.c.ord, trials.c.kind, trials.c.shown, trials.c.sources,
                       trials.c.expected)
                .where(trials.c.rater_id == r["id"]).order_by(trials.c.ord)).mappings()]
            self._plans[r["id"]] = plan
        return plan

    def _seconds(self, st: dict, trial: dict) -> float:
        """One play-through of a trial: its longest video."""
        out = 0.0
        for sha in trial["shown"].values():
            s = st["seconds"].get(sha)
            if s is None:                       # a study made before durations were stored
                s = st["seconds"][sha] = _probe_seconds(Path(st["media_dir"]) / f"{sha}.mp4")
            out = max(out, s)
        return out

    # -- per request --------------------------------------------------------------------------

    def _live(self, conn, rid: int) -> dict[int, tuple]:
        """trial id -> (served, answer or None) for every trial of the rater: one statement."""
        return {i: (s, a) for i, s, a in conn.execute(self._q_live, {"rid": rid})}

    def _view(self, conn, st: dict, plan: list[dict], live: dict) -> dict:
        done = sum(1 for s, a in live.values() if a is not None)
        nxt = next((t for t in plan if live[t["id"]][1] is None), None)
        out = {"progress": {"done": done, "total": len(plan), "finished": done >= len(plan)},
               "trial": None}
        if nxt is None:
            if self.completion_code:
                out["completion_code"] = self.completion_code
            return out
        if live[nxt["id"]][0] is None:          # first time this trial is shown
            conn.execute(self._u_served, {"tid": nxt["id"], "at": time.time()})
        out["trial"] = _public(nxt, st["protocol"], len(plan), st["fps"])
        return out

    def _state(self, conn, token) -> dict:
        r = self._rater(conn, token)
        plan = self._plan(conn, r)
        return self._view(conn, self._study(conn, r["study_id"]), plan, self._live(conn, r["id"]))

    def _answer(self, conn, token, trial_id, answer, response_ms, client, *, arrived) -> dict:
        try:
            tid = int(trial_id)
        except (TypeError, ValueError):
            raise UnknownTrial(trial_id) from None
        r = self._rater(conn, token)
        plan = self._plan(conn, r)
        t = next((x for x in plan if x["id"] == tid), None)
        if t is None:
            owner = conn.execute(self._q_owner, {"tid": tid}).scalar()
            if owner is None:
                raise UnknownTrial(trial_id)
            raise TrialNotAssigned(trial_id, r["id"])
        st = self._study(conn, r["study_id"])
        protocol = st["protocol"]
        ms = check_response_ms(trial_id, response_ms)
        check_answer(trial_id, protocol, answer)
        live = self._live(conn, r["id"])
        served, prev = live[tid]
        if prev is not None:                    # answered before: idempotent or a conflict
            if prev != answer:
                raise RatingConflict(tid, prev, answer)
            return {"saved": False, **self._view(conn, st, plan, live)}
        seconds = self._seconds(st, t)
        need = max(0.0, seconds - 1.0 / st["fps"])   # one frame of slack
        if served is None:
            conn.execute(self._u_served, {"tid": tid, "at": time.time()})
            raise TooSoon(tid, None, need, seconds)
        if arrived - served < need:
            raise TooSoon(tid, arrived - served, need, seconds)
        correct, _ = design.score(protocol, t, answer)
        row = {"study_id": r["study_id"], "rater_id": r["id"], "trial_id": tid, "answer": answer,
               "correct": correct, "response_ms": ms, "shown": t["shown"],
               "sources": t["sources"], "client": client[:200] if client else None,
               "created": now()}
        new = conn.execute(self._i_rating, row).scalar() is not None
        if not new:                             # written meanwhile by another process
            prev = conn.execute(self._q_prev, {"rid": r["id"], "tid": tid}).scalar_one()
            if prev != answer:
                raise RatingConflict(tid, prev, answer)
        live[tid] = (served, answer)
        return {"saved": new, **self._view(conn, st, plan, live)}


def _probe_seconds(path: Path) -> float:
    from ..video import open_clip

    try:
        info = open_clip(path).info
        return float(info.frames / info.fps) if info.frames else 0.0
    except Exception:  # noqa: BLE001 - no gate rather than no study
        return 0.0
