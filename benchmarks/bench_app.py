"""Load benchmark of the web app: N simulated raters answer at once against a real server on
loopback, side by side in one run:

- ``json``: the real ``evalkit serve``, answers through the JSON API (``POST /api/answer``);
- ``gradio``: the real ``evalkit serve``, answers through the Gradio event the rater page uses
  (``POST /gradio_api/queue/join?token=T`` with the player's ``answer`` event, then the
  session's event stream ``GET /gradio_api/queue/data?session_hash=H`` read up to the event's
  ``process_completed``; :class:`evalkit.testing.gradio_client.GradioRater`, the protocol of
  Gradio's browser client). Each rater is a session of its own and loads its first trial
  through the page's load event too;
- ``before``: the ablation baseline, the same app with group commit off (the rater service
  commits every request in its own transaction, ``max_batch=1``), uvicorn defaults, no admin
  app, JSON API (cheap: one more server per repeat).

All use the same SQLite settings (WAL, ``synchronous=FULL``) and the same steps, which respect
the server-side gate: every rater first loads its trial, fetches its videos whole and
acknowledges them (``GET /media/...``, ``POST /api/ack``, as the page does), then, one clip
length later, all raters answer at once; the answer brings the next trial, and each further
round starts one clip length later. Each rater has its own keep-alive connections (the JSON
side one, the Gradio side two: requests and the event stream, as a browser tab), on a lean
client shared by both sides (:class:`evalkit.testing.gradio_client.Connection`; httpx's own
per-request CPU dominated the measurement on a 2-core machine). Latency of an answer: from sending it to its
reply (the JSON response; for Gradio, from sending the join to receiving process_completed).
Reports per side p50/p95/max latency, errors (by kind: HTTP status, transport error, Gradio
failure, or a reply that refuses the answer), acknowledged vs stored ratings (lost =
acknowledged but not stored), the CPU time the server process (all its threads) and the client
spent during the answers, per answer, and the ratios gradio/json and before/json (medians over
the repeats); for Gradio also when, after sending the join, the join was answered and the
event's ``process_starts`` and ``process_completed`` arrived (p50, p95), and the stream
messages per answer (Gradio's queue sends ``estimation`` messages to waiting events). ``--repeat
R`` runs every side R times, alternating the order. If the page's events are made unqueued
(``queue=False``), the Gradio side follows the page's config like the browser does: one ``POST
/gradio_api/run/<api_name>?token=T`` per answer.

    .venv/bin/python benchmarks/bench_app.py [--raters 100] [--rounds 3] [--repeat 2]
                                             [--sides before,json,gradio]
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
from evalkit.testing.gradio_client import Connection, GradioError, GradioRater, ack, endpoints  # noqa: E402

SIDES = ("before", "json", "gradio")
TIMEOUT_S = 60  # one answer taking longer counts as an error ("timeout")
TRANSPORT = (OSError, ValueError, asyncio.IncompleteReadError)


def baseline_app(db: str):
    """The app with group commit off, for comparison only."""
    from evalkit.app.server import build_app

    return build_app(db, with_admin=False, max_batch=1)


class BaselineServer:
    def __init__(self, db):
        from evalkit.testing.server import free_port

        self.db, self.port = str(db), free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-baseline", self.db, str(self.port)], cwd=ROOT
        )
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


class JsonRater:
    """One simulated rater on the JSON API: one keep-alive connection, like a browser tab."""

    def __init__(self, port: int, token: str):
        self.conn, self.token = Connection("127.0.0.1", port, "bench-app"), token
        self.trial: dict | None = None

    async def open(self):
        await self.conn.open()
        return self

    async def load(self) -> None:
        status, body = await self.conn.request("GET", f"/api/trial?token={self.token}")
        if status != 200:
            raise RuntimeError(f"GET /api/trial: HTTP {status}")
        self.trial = json.loads(body)["trial"]

    async def media(self) -> None:
        # whole, then acknowledged as the page does: the gate's clock starts at the ack
        for name in (self.trial or {}).get("media", {}).values():
            _, data = await self.conn.request("GET", f"/media/{name}?token={self.token}")
            await ack(self.conn, self.token, name, data)

    async def answer(self) -> tuple[str | None, float]:
        """One answer: (error kind or None, latency in ms); the reply's trial becomes current."""
        t0 = time.perf_counter()
        status, body = await self.conn.request(
            "POST",
            "/api/answer",
            {"token": self.token, "trial": self.trial["trial"], "answer": "A", "response_ms": 1500},
        )
        ms = (time.perf_counter() - t0) * 1000
        if status != 200:
            return f"HTTP {status}", ms
        self.trial = json.loads(body)["trial"]
        return None, ms

    async def reopen(self):
        await self.conn.reopen()

    def close(self):
        self.conn.close()


class PageRater:
    """One simulated rater on the page's Gradio events (load event, answer event)."""

    def __init__(self, url: str, token: str, ids: dict):
        self.g, self.ids = GradioRater(url, token, user_agent="bench-app"), ids
        self.phases: list[dict] = []  # per answer: GradioRater.last_times, messages

    async def open(self):
        await self.g.open(self.ids)
        return self

    async def load(self) -> None:
        s = await self.g.load()
        if "trial" not in s:
            raise RuntimeError(f"load event: {s}")

    async def media(self) -> None:
        await self.g.media()

    async def answer(self) -> tuple[str | None, float]:
        state = self.g.state
        t0 = time.perf_counter()
        try:
            s = await self.g.answer(state["trial"]["trial"], "A", 1500)
        except GradioError as e:
            self.g.state = state
            return e.kind, (time.perf_counter() - t0) * 1000
        ms = self.g.last_ms
        self.phases.append({**self.g.last_times, "messages": len(self.g.last_messages)})
        if "trial" not in s or "notice" in s:  # refused ({"error"}/{"fatal"}) or stale
            self.g.state = state  # the trial stays on screen
            kind = "fatal" if "fatal" in s else "stale" if "notice" in s else "refused"
            return f"{kind}: {s.get('fatal') or s.get('notice') or s.get('error')}"[:80], ms
        return None, ms

    async def reopen(self):
        await self.g.reopen()

    def close(self):
        self.g.close()


async def load(side: str, server, db, sid, n: int, rounds: int) -> dict:
    tokens = [r["token"] for r in study.invite(db, sid, n)]
    with study.open_db(db).engine.connect() as conn:
        cfg = conn.execute(select(store.studies.c.config).where(store.studies.c.id == sid)).scalar_one()
    clip_s = max(cfg["media_seconds"].values())
    if side == "gradio":
        ids = endpoints(httpx.get(server.url + "/config").json())
        make = lambda tok: PageRater(server.url, tok, ids)  # noqa: E731
    else:
        make = lambda tok: JsonRater(server.port, tok)  # noqa: E731
    raters = await asyncio.gather(*[make(tok).open() for tok in tokens])
    for r in raters:  # each rater loads its page (marks its trial handed out)
        await r.load()
        await r.media()  # and its videos (starts the gate's clock)
    lat, errors, acked = [], {}, 0
    load0 = os.getloadavg()[0]
    cpu = {"server": 0.0, "client": 0.0}  # CPU seconds spent during the answers
    for _ in range(rounds):
        await asyncio.sleep(clip_s + 0.05)  # one play-through

        async def one(r):
            nonlocal acked
            t0 = time.perf_counter()
            try:
                kind, ms = await asyncio.wait_for(r.answer(), TIMEOUT_S)
            except (*TRANSPORT, asyncio.TimeoutError) as e:
                kind, ms = (
                    ("timeout" if isinstance(e, asyncio.TimeoutError) else type(e).__name__),
                    (time.perf_counter() - t0) * 1000,
                )
                await r.reopen()
            lat.append(ms)
            if kind:
                errors[kind] = errors.get(kind, 0) + 1
            else:
                acked += 1

        s0, c0 = _cpu_s(server.proc.pid), time.process_time()
        await asyncio.gather(*[one(r) for r in raters])
        cpu["server"] += _cpu_s(server.proc.pid) - s0
        cpu["client"] += time.process_time() - c0
        await asyncio.gather(*[r.media() for r in raters])
    for r in raters:
        r.close()
    stored = len(study.ratings_csv(db, sid).splitlines()) - 1
    out = {
        "answers": len(lat),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "acknowledged": acked,
        "stored": stored,
        "lost": acked - stored,
        "p50_ms": _q(lat, 0.5),
        "p95_ms": _q(lat, 0.95),
        "max_ms": _q(lat, 1),
        "cpu_ms_per_answer": {k: round(v * 1000 / len(lat), 2) for k, v in cpu.items()},
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    ph = [p for r in raters for p in r.phases] if side == "gradio" else []
    if ph:  # where a Gradio answer's time goes (ms after sending the join)
        out["gradio_phases_p50_p95_ms"] = {
            k: [_q([p[k] for p in ph if k in p], 0.5), _q([p[k] for p in ph if k in p], 0.95)]
            for k in ("join", "process_starts", "process_completed")
        }
        out["gradio_stream_messages_per_answer"] = {
            "mean": round(statistics.mean(p["messages"] for p in ph), 1),
            "max": max(p["messages"] for p in ph),
        }
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process ``pid`` used so far (Linux)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _q(values, p: float) -> float | None:
    v = sorted(values)
    return round(v[min(len(v) - 1, int(p * len(v)))], 1) if v else None


async def main(n: int, rounds: int, repeat: int, sides: tuple[str, ...]) -> dict:
    from evalkit.testing.server import Server
    from evalkit.testing.studies import make_report

    root = Path(tempfile.mkdtemp(prefix="bench-app-"))
    report = make_report(root)
    runs = {s: [] for s in sides}
    for i in range(repeat):
        for side in sides if i % 2 == 0 else sides[::-1]:
            db = root / f"{side}-{i}.db"
            sid = study.create_study(
                report, db, protocol="abx", clips_spec="worst:3", media_dir=root / "media", allow_masking=True
            )["study"]
            server = (BaselineServer(db) if side == "before" else Server(db)).start()
            try:
                r = await load(side, server, db, sid, n, rounds)
            finally:
                server.stop()
            print(json.dumps({"run": side, "repeat": i, **r}), flush=True)
            runs[side].append(r)
    keys = ("p50_ms", "p95_ms", "max_ms")
    med = {k: {m: round(statistics.median(r[m] for r in v), 1) for m in keys} for k, v in runs.items()}
    kinds = {}
    for k, v in runs.items():
        kinds[k] = {}
        for r in v:
            for e, c in r["error_kinds"].items():
                kinds[k][e] = kinds[k].get(e, 0) + c
    out = {
        "raters": n,
        "rounds": rounds,
        "repeat": repeat,
        "cpus": os.cpu_count(),
        "median": med,
        "errors": {k: sum(r["errors"] for r in v) for k, v in runs.items()},
        "error_kinds": kinds,
        "acknowledged": {k: sum(r["acknowledged"] for r in v) for k, v in runs.items()},
        "stored": {k: sum(r["stored"] for r in v) for k, v in runs.items()},
        "lost": {k: sum(r["lost"] for r in v) for k, v in runs.items()},
    }
    for a in ("gradio", "before"):
        if a in med and "json" in med:
            out[f"ratio_{a}_json"] = {m: round(med[a][m] / med["json"][m], 2) for m in keys}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--raters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each side, alternating order")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument("--serve-baseline", nargs=2, metavar=("DB", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_baseline:
        import uvicorn

        uvicorn.run(
            baseline_app(a.serve_baseline[0]),
            host="127.0.0.1",
            port=int(a.serve_baseline[1]),
            log_level="warning",
            access_log=False,
        )
    else:
        sides = tuple(s.strip() for s in a.sides.split(",") if s.strip())
        if not sides or set(sides) - set(SIDES):
            ap.error(f"--sides: expected some of {', '.join(SIDES)}")
        print(json.dumps(asyncio.run(main(a.raters, a.rounds, a.repeat, sides))))
