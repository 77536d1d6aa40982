"""Load benchmark of the web app: N simulated raters submit at once against a real server on
loopback, side by side in one run:

- ``before``: the same app with group commit off (the rater service commits every request in
  its own transaction, ``max_batch=1``), uvicorn defaults, no Gradio: the ablation baseline
  (the first version's per-answer ``submit``/``progress``/``next_trial`` path no longer exists:
  the rater service is the one rater path);
- ``after``: the real ``evalkit serve`` (rater service with caches and group commit, Gradio
  admin mounted).

Both use the same SQLite settings (WAL, ``synchronous=FULL``) and the same protocol, which
respects the server-side gate: every rater first loads its trial (``GET /api/trial``) and
requests its videos (``GET /media/...`` with a one-byte range, as a browser starts), then, one
clip length later, all raters submit at once; the answer brings the next trial, and each further
round starts one clip length later. Reports p50/p95/max latency
of a submission, errors (by kind), acknowledged vs stored ratings (lost = acknowledged but not
stored), and the ratios before/after. ``--repeat R`` alternates the two R times.

    .venv/bin/python benchmarks/bench_app.py [--raters 100] [--rounds 3] [--repeat 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import httpx  # noqa: E402
from sqlalchemy import select  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.study import store  # noqa: E402


def baseline_app(db: str):
    """The app with group commit off, for comparison only."""
    from app.server import build_app

    return build_app(db, with_admin=False, max_batch=1)


class BaselineServer:
    def __init__(self, db):
        from evalkit.testing.server import free_port
        self.db, self.port = str(db), free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-baseline", self.db,
                                      str(self.port)], cwd=ROOT)
        for _ in range(300):
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("baseline server did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


class Rater:
    """One simulated rater: one keep-alive HTTP/1.1 connection, like a browser tab. A lean client
    on purpose: on a 2-core machine, httpx's own per-request work (about 10 ms of CPU for a
    trivial request under load) cost more than the server's and dominated the measurement."""

    def __init__(self, port: int):
        self.port = port

    async def open(self):
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def request(self, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else b""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.w.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     f"application/json\r\n{extra}Content-Length: {len(data)}\r\n\r\n".encode()
                     + data)
        status = await self.r.readline()
        if not status:
            raise ConnectionError("connection closed by the server")
        n = 0
        while (line := await self.r.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            if k.lower() == "content-length":
                n = int(v)
        data = await self.r.readexactly(n)
        if path.startswith("/media/"):
            return int(status.split()[1]), data
        return int(status.split()[1]), json.loads(data)

    async def load_media(self, token: str, trial: dict | None) -> None:
        for name in (trial or {}).get("media", {}).values():
            await self.request("GET", f"/media/{name}?token={token}", headers={"Range": "bytes=0-0"})

    def close(self):
        self.w.close()


async def load(server, db, sid, n: int, rounds: int) -> dict:
    tokens = [r["token"] for r in study.invite(db, sid, n)]
    with study.open_db(db).engine.connect() as conn:
        cfg = conn.execute(select(store.studies.c.config)
                           .where(store.studies.c.id == sid)).scalar_one()
    clip_s = max(cfg["media_seconds"].values())
    lat, errors, acked = [], {}, 0
    raters = dict(zip(tokens, await asyncio.gather(*[Rater(server.port).open() for _ in tokens])))
    nxt = {}
    for tok, c in raters.items():                # each rater loads its page (marks it served)
        nxt[tok] = (await c.request("GET", f"/api/trial?token={tok}"))[1]["trial"]
        await c.load_media(tok, nxt[tok])        # and its videos (starts the gate's clock)
    for _ in range(rounds):
        await asyncio.sleep(clip_s + 0.05)      # one play-through

        async def one(tok):
            nonlocal acked
            t0 = time.perf_counter()
            try:
                code, body = await raters[tok].request("POST", "/api/answer", {
                    "token": tok, "trial": nxt[tok]["trial"], "answer": "A", "response_ms": 1500})
                kind = None if code == 200 else f"HTTP {code}"
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                kind = type(e).__name__
                raters[tok] = await Rater(server.port).open()
            lat.append((time.perf_counter() - t0) * 1000)
            if kind:
                errors[kind] = errors.get(kind, 0) + 1
                return
            acked += 1
            nxt[tok] = body["trial"]
        await asyncio.gather(*[one(t) for t in tokens])
        await asyncio.gather(*[raters[t].load_media(t, nxt[t]) for t in tokens])
    for c in raters.values():
        c.close()
    stored = len(study.ratings_csv(db, sid).splitlines()) - 1
    lat.sort()
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 1)  # noqa: E731
    return {"submissions": len(lat), "errors": sum(errors.values()), "error_kinds": errors,
            "acknowledged": acked, "stored": stored, "lost": acked - stored,
            "p50_ms": q(0.5), "p95_ms": q(0.95), "max_ms": round(lat[-1], 1)}


async def main(n: int, rounds: int, repeat: int) -> dict:
    from evalkit.testing.server import Server
    from evalkit.testing.studies import make_report

    root = Path(tempfile.mkdtemp(prefix="bench-app-"))
    report = make_report(root)
    runs = {"before": [], "after": []}
    for i in range(repeat):
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            db = root / f"{name}-{i}.db"
            sid = study.create_study(report, db, protocol="abx", clips_spec="worst:3",
                                     media_dir=root / "media")["study"]
            server = (BaselineServer(db) if name == "before" else Server(db)).start()
            try:
                r = await load(server, db, sid, n, rounds)
            finally:
                server.stop()
            print(json.dumps({"run": name, **r}), flush=True)
            runs[name].append(r)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("p50_ms", "p95_ms", "max_ms")}
           for k, v in runs.items()}
    return {"raters": n, "rounds": rounds, "repeat": repeat, "cpus": os.cpu_count(),
            "median": med,
            "errors": {k: sum(r["errors"] for r in v) for k, v in runs.items()},
            "lost": {k: sum(r["lost"] for r in v) for k, v in runs.items()},
            "speedup_p50": round(med["before"]["p50_ms"] / med["after"]["p50_ms"], 1),
            "speedup_p95": round(med["before"]["p95_ms"] / med["after"]["p95_ms"], 1)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--raters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2, help="alternating runs of each path")
    ap.add_argument("--serve-baseline", nargs=2, metavar=("DB", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_baseline:
        import uvicorn
        uvicorn.run(baseline_app(a.serve_baseline[0]), host="127.0.0.1",
                    port=int(a.serve_baseline[1]), log_level="warning", access_log=False)
    else:
        print(json.dumps(asyncio.run(main(a.raters, a.rounds, a.repeat))))
