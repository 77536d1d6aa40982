"""Raters answering while the server is killed: every acknowledged rating must be stored, once.

:func:`run` starts the real ``evalkit serve`` (:class:`.server.Server`), lets ``raters``
simulated raters work through their trials over the JSON API the way a browser does (load the
trial, request its videos, wait one play-through, answer; on a dropped connection, wait and load
the current trial again), SIGKILLs the server at the given moments (counted in acknowledged
answers, so a run is reproducible without timing) and restarts it on the same port. Then it
compares what was acknowledged with what the database holds. Used by
``benchmarks/bench_serve_kills.py`` (100 raters, random kill points) and a fast slice in the
tests.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import zlib

import httpx

from . import aio
from .server import Server


async def _rater(url, token, acked: list, stop: asyncio.Event, watch_s: float, errors: dict):
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        while not stop.is_set():
            try:
                s = (await c.get("/api/trial", params={"token": token})).json()
                if s.get("trial") is None:
                    return
                t = s["trial"]
                for name in t["media"].values():  # whole, acknowledged: the gate's clock
                    data = (await c.get(f"/media/{name}", params={"token": token})).content
                    await c.post(
                        "/api/ack",
                        json={"token": token, "media": name, "size": len(data), "crc32": zlib.crc32(data)},
                    )
                await asyncio.sleep(watch_s)
                a = t["answers"][t["trial"] % len(t["answers"])]
                r = await c.post(
                    "/api/answer", json={"token": token, "trial": t["trial"], "answer": a, "response_ms": 100}
                )
                if r.status_code == 200:
                    acked.append((token, t["trial"], a))
                else:
                    errors[f"HTTP {r.status_code}"] = errors.get(f"HTTP {r.status_code}", 0) + 1
                    await asyncio.sleep(0.2)
            except (httpx.TransportError, ValueError) as e:  # the server is down: try again
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                await asyncio.sleep(0.3)


async def _drive(server: Server, tokens, kill_after: list[int], watch_s: float) -> dict:
    acked: list = []
    errors: dict = {}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_rater(server.url, t, acked, stop, watch_s, errors)) for t in tokens]
    kills = 0
    for k in sorted(kill_after):
        while len(acked) < k and not all(t.done() for t in tasks):
            await asyncio.sleep(0.02)
        if all(t.done() for t in tasks):
            break
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        kills += 1
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.start)
    await asyncio.gather(*tasks)
    return {"acked": acked, "errors": errors, "kills": kills}


def run(db, tokens, kill_after: list[int], watch_s: float = 1.0) -> dict:
    """Rate every trial of ``tokens`` while killing the server after each count of acknowledged
    answers in ``kill_after``. Returns counts: acknowledged, stored, lost (acknowledged, not
    stored or stored with another answer), duplicates, kills, errors by kind, and the
    database's integrity check."""
    server = Server(db).start()
    try:
        out = aio.run(_drive(server, list(tokens), kill_after, watch_s))
    finally:
        server.stop()
    import json

    from evalkit.study import seal
    from evalkit.study.live import token_hash

    con = sqlite3.connect(str(db))
    try:
        rater_of = dict(con.execute("select token_sha256, id from raters"))
        keys = {
            sid: seal.study_key(json.loads(cfg)) for sid, cfg in con.execute("select id, config from studies")
        }  # answers are sealed
        stored = {}
        dup = 0
        for sid, rid, tid, ans in con.execute("select study_id, rater_id, trial_id, answer from ratings"):
            dup += (rid, tid) in stored
            stored[(rid, tid)] = seal.open_answer(keys[sid], rid, tid, ans)
        integrity = con.execute("pragma integrity_check").fetchone()[0]
    finally:
        con.close()
    lost = [a for a in out["acked"] if stored.get((rater_of[token_hash(a[0])], a[1])) != a[2]]
    return {
        "acknowledged": len(out["acked"]),
        "stored": len(stored),
        "lost": len(lost),
        "duplicates": dup,
        "kills": out["kills"],
        "errors": out["errors"],
        "integrity": integrity,
    }
