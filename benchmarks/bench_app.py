"""Load benchmark of the web app: N simulated raters submit at once against the real
`evalkit serve` on loopback. Reports p50/p95/max latency of a submission, errors, lost ratings.

    .venv/bin/python benchmarks/bench_app.py [--raters 100] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402

from evalkit import study  # noqa: E402


async def main(n: int, rounds: int) -> dict:
    from app_helpers import Server
    from study_helpers import make_report

    root = Path(tempfile.mkdtemp(prefix="bench-app-"))
    db = root / "s.db"
    sid = study.create_study(make_report(root), db, protocol="abx", clips_spec="worst:3")["study"]
    tokens = [r["token"] for r in study.invite(db, sid, n)]
    server = Server(db).start()
    lat, errors, acked = [], 0, 0
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=n)) as c:
            nxt = {t: study.next_trial(db, t) for t in tokens}
            for _ in range(rounds):
                async def one(tok):
                    nonlocal errors, acked
                    t0 = time.perf_counter()
                    try:
                        r = await c.post("/api/answer", json={"token": tok, "trial": nxt[tok]["trial"],
                                                              "answer": "A", "response_ms": 1500})
                    except httpx.HTTPError:
                        r = None
                    lat.append((time.perf_counter() - t0) * 1000)
                    if r is None or r.status_code != 200:
                        errors += 1
                        return
                    acked += 1
                    nxt[tok] = r.json()["trial"]
                await asyncio.gather(*[one(t) for t in tokens])
    finally:
        server.stop()
    stored = len(study.ratings_csv(db, sid).splitlines()) - 1
    lat.sort()
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 1)  # noqa: E731
    return {"raters": n, "rounds": rounds, "submissions": len(lat), "errors": errors,
            "acknowledged": acked, "stored": stored, "lost": acked - stored,
            "p50_ms": q(0.5), "p95_ms": q(0.95), "max_ms": round(lat[-1], 1)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--raters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.raters, a.rounds))))
