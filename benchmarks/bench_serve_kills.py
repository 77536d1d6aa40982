"""Raters answering while `evalkit serve` is SIGKILLed: every acknowledged rating stored once.

100 simulated raters (JSON API, the gate respected: videos requested, one play-through waited)
rate a whole preference study while the server is killed with SIGKILL at seeded random points
(counted in acknowledged answers) and restarted on the same port. Prints acknowledged, stored,
lost (acknowledged but not stored, or stored with another answer), duplicates, the connection
errors the raters saw, and SQLite's integrity check, per repetition.

    .venv/bin/python benchmarks/bench_serve_kills.py [--raters 100] [--kills 2] [--repeat 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalkit import study  # noqa: E402
from evalkit.testing import kills  # noqa: E402
from evalkit.testing.studies import make_report  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raters", type=int, default=100)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=19)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        report = make_report(Path(tmp), fps=8)  # 8 frames at 8 fps: 1 s per trial
        for rep in range(a.repeat):
            db = Path(tmp) / f"s{rep}.db"
            sid = study.create_study(
                report, db, protocol="preference", clips_spec="worst:3", seed=rep, allow_masking=True
            )["study"]
            tokens = [r["token"] for r in study.invite(db, sid, a.raters)]
            total = study.list_studies(db)[0]["trials"]
            points = sorted(rng.randrange(1, total) for _ in range(a.kills))
            t0 = time.perf_counter()
            out = kills.run(db, tokens, points)
            out["seconds"] = round(time.perf_counter() - t0, 1)
            out["kill_points"] = points
            out["trials"] = total
            print(f"run {rep + 1}: {out}", flush=True)
            bad += out["lost"] + out["duplicates"] + (out["integrity"] != "ok") + (out["stored"] < total)
    print("every acknowledged rating stored once" if not bad else f"FAILED: {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
