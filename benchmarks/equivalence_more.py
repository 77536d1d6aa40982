"""What ``equivalence.sh`` (render and compare) leaves out, unchanged across a refactor: with the
code of commit BEFORE and with the working tree,

- ``study``: ``study create`` on one compare report, three studies (preference, ABX on a
  worst-window excerpt, threshold with levels 1,2,4), each with a fixed design seed; the databases
  (every table, every row, the study's config with its sealed part opened by the study's key
  file; its creation time, media key and the random key's id aside) and the media files
  (content-hashed names) compared;
- ``results``: 12 invited raters answer every trial of each study (catch trials right, test
  trials right with a seeded probability, through the rater service with a fake clock); then
  ``results`` (and its text), ``study_progress``, ``key_status``, ``ratings_csv`` (the rows'
  times aside), ``summary_csv`` and, for the threshold study, ``write_gate``'s file or its
  refusal; and ``plan`` and ``design_check`` for ABX and preference at a small simulation;
- ``stream``: :mod:`evalkit.metrics.stream` on the same synthetic clips, every record and summary
  compared exactly (floats as JSON writes them): temporal metrics with flows inline and in flow
  threads, chunks of 1, 3, 4 and the automatic size, fidelity only, Farneback flow with RGB SSIM,
  the ``torch`` flow, ``align="shortest"``, float frames through ``update``, the frame-count
  error. CPU only (the device paths are the same code on a GPU).

Usage, from the repository root:
    python benchmarks/equivalence_more.py BEFORE_COMMIT [OUT]     (about 2 minutes on 2 cores)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STUDIES = {  # name: create_study's options (the fake renderer's noise needs allow_masking)
    "preference": {"protocol": "preference", "seed": 3, "raters_planned": 12, "design_seed": 31},
    "abx_excerpt": {
        "protocol": "abx",
        "seed": 5,
        "excerpt_seconds": 0.25,
        "raters_planned": 12,
        "design_seed": 51,
    },
    "threshold": {
        "protocol": "threshold",
        "raters_planned": 12,
        "levels": "1,2,4",
        "seed": 7,
        "design_seed": 71,
    },
}
RATERS = 12


def make_studies(out: Path, report: Path) -> dict:
    """Each study in its own database under ``out``: its result, tables and media files."""
    import hashlib

    from sqlalchemy import MetaData, create_engine, select

    from evalkit.study import create_study, seal

    dump = {}
    for name, opts in STUDIES.items():
        folder = out / name
        folder.mkdir(parents=True)
        res = create_study(report, str(folder / "s.db"), allow_masking=True, **opts)
        eng = create_engine(f"sqlite:///{folder / 's.db'}")
        meta = MetaData()
        meta.reflect(eng)
        tables = {}
        with eng.connect() as conn:
            for t in sorted(meta.tables):
                rows = [dict(r._mapping) for r in conn.execute(select(meta.tables[t]))]
                for r in rows:
                    r.pop("created", None)
                    if isinstance(r.get("config"), (str, dict)):
                        cfg = r["config"] if isinstance(r["config"], dict) else json.loads(r["config"])
                        cfg.pop("media_key", None)
                        cfg = seal.unseal_config(r["id"], cfg)  # the random key aside
                        cfg.pop("sealed", None)
                        (cfg.get("seal") or {}).pop("key_id", None)
                        r["config"] = cfg
                tables[t] = rows
        media = Path(res.pop("media"))
        files = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(media.rglob("*"))
            if p.is_file()
        }
        dump[name] = {
            "result": res,
            "tables": tables,
            "media": files,
            "after": rate_and_read(folder / "s.db", res["study"], name),
        }
    return json.loads(json.dumps(dump, sort_keys=True, default=str).replace(str(out), "OUT"))


def rate_and_read(db, sid: int, name: str) -> dict:
    """``RATERS`` raters answer every trial; what the results, export and gate functions say."""
    import csv
    import io
    import random

    from evalkit import study
    from evalkit.study.text import results_text
    from evalkit.testing.studies import answer, hidden

    out = {}
    for i, inv in enumerate(study.invite(db, sid, RATERS)):
        rng = random.Random(1000 * sid + i)

        def pick(t, rng=rng):
            h = hidden(db, t["trial"])
            right = h.get("expected")
            if right is None:  # preference: no right answer
                return rng.choice(["left", "right", "same"])
            if h.get("kind") == "catch" or rng.random() < 0.7:
                return right
            return {"A": "B", "B": "A"}.get(right, right)

        answer(db, inv["token"], pick)
    res = study.results(db, sid, reps=200)
    out["results"] = res
    out["results_text"] = results_text(res)
    out["progress"] = study.study_progress(db, sid)
    out["key_status"] = study.key_status(db, sid)
    rows = list(csv.DictReader(io.StringIO(study.ratings_csv(db, sid))))
    for r in rows:
        for k in ("created", "response_ms", "client_ms"):
            r.pop(k, None)
    out["ratings_csv"] = rows
    out["summary_csv"] = study.summary_csv(res)
    if name == "threshold":
        try:
            g = study.write_gate(db, sid, Path(db).parent / "gate.yaml", reps=200)
            out["gate"] = {"result": g, "text": (Path(db).parent / "gate.yaml").read_text()}
        except Exception as e:  # a refusal is an outcome too
            out["gate"] = f"{type(e).__name__}: {e}"
    return out


def make_plans() -> dict:
    """``plan`` and ``design_check`` at a small simulation, and their refusals."""
    from evalkit import study
    from evalkit.study import stats

    def run(f, *a, **k):
        try:
            return f(*a, **k)
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    check = getattr(stats, "design_check", None)
    if check is None:  # moved by issue 49
        from evalkit.study.planning import design_check as check
    return {
        "abx": run(study.plan, "abx", 0.2, studies=40, reps=40),
        "preference": run(study.plan, "preference", 0.2, studies=40, reps=40),
        "threshold": run(study.plan, "threshold", 0.2, studies=40, reps=40),
        "abx_bad_margin": run(study.plan, "abx", 0.7),
        "design_check": run(check, 20, 15, margin=0.2, studies=40, reps=40),
    }


def clip(t: int, seed: int, h: int = 40, w: int = 56):
    """``t`` frames of a noisy texture panning right one pixel a frame."""
    import numpy as np

    g = np.random.default_rng(seed)
    base = g.integers(0, 256, (h, w, 3)).astype(np.int16)
    return np.stack(
        [np.clip(np.roll(base, k, axis=1) + g.integers(-3, 4, (h, w, 3)), 0, 255) for k in range(t)]
    ).astype(np.uint8)


def make_stream() -> dict:
    """Every stream case's records and summary."""
    import numpy as np
    import torch

    from evalkit.metrics.stream import PairEvaluator, evaluate_pair, stream_pair

    a = clip(11, seed=1)
    rng = np.random.default_rng(0)
    b = a.copy()
    b[3:] = np.clip(b[3:].astype(int) + rng.integers(-6, 7, b[3:].shape), 0, 255).astype(np.uint8)
    b[5] = a[5]  # one identical frame
    cases = {
        "temporal_inline_c4": dict(chunk=4, temporal=True, flow_workers=0),
        "temporal_threads_c3": dict(chunk=3, temporal=True, flow_workers=2),
        "temporal_c1": dict(chunk=1, temporal=True, flow_workers=0),
        "fidelity_c5": dict(chunk=5, temporal=False),
        "farneback_rgb_c4": dict(
            chunk=4, temporal=True, flow="farneback", ssim_channel="rgb", flow_workers=2
        ),
        "torchflow_c4": dict(chunk=4, temporal=True, flow="torch"),
        "auto_chunk": dict(temporal=True),
    }
    out = {}
    for name, kw in cases.items():
        chunk = kw.pop("chunk", None)
        out[name] = evaluate_pair(iter(list(a)), iter(list(b)), chunk=chunk, device="cpu", **kw)
    ev = PairEvaluator(device="cpu", temporal=True, flow_workers=2)
    recs = list(stream_pair(iter(list(a)), iter(list(b[:8])), evaluator=ev, chunk=3, align="shortest"))
    out["shortest"] = {"records": recs, **ev.compute()}
    ev.reset()
    fa = torch.from_numpy(a).permute(0, 3, 1, 2).float() / 255
    fb = torch.from_numpy(b).permute(0, 3, 1, 2).float() / 255
    out["update_float"] = {"records": ev.update(fa, fb), **ev.compute()}
    ev.reset()
    try:
        list(stream_pair(iter(list(a)), iter(list(b[:8])), evaluator=ev, chunk=3))
    except Exception as e:
        out["frame_count_error"] = f"{type(e).__name__}: {e}"
    ev.close()
    return json.loads(json.dumps(out, sort_keys=True, default=repr))


def make(out: Path, report: Path) -> None:
    """In the tree on PYTHONPATH: both parts, as JSON, into ``out/dump.json``."""
    dump = {"study": make_studies(out, report), "plan": make_plans(), "stream": make_stream()}
    (out / "dump.json").write_text(json.dumps(dump, sort_keys=True))


def main() -> int:
    before = sys.argv[1]
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/evalkit-equivalence-more")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    src = out / "before-src"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(src), before], check=True, stdout=subprocess.DEVNULL
    )
    try:
        env = dict(os.environ, PYTHONPATH=str(src), GRADIO_ANALYTICS_ENABLED="False")
        code = (
            "import sys; from pathlib import Path; "
            "from evalkit.testing.studies import make_report; "
            "r = Path(sys.argv[1]); r.mkdir(); print(make_report(r))"
        )
        report = subprocess.run(
            [sys.executable, "-c", code, str(out / "report")],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        for label, tree in (("before", src), ("after", Path.cwd())):
            env["PYTHONPATH"] = str(tree)
            subprocess.run(
                [sys.executable, __file__, "--make", str(out / label), report], env=env, check=True
            )
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(src)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    a = json.loads((out / "before" / "dump.json").read_text())
    b = json.loads((out / "after" / "dump.json").read_text())
    for name in STUDIES:
        x, y = a["study"][name], b["study"][name]
        n_rows = {t: len(r) for t, r in x["tables"].items() if r}
        print(
            f"study {name}: rows {n_rows}, {len(x['media'])} media files; "
            + ", ".join(
                f"{k} {'identical' if x[k] == y[k] else 'DIFFERENT'}" for k in ("result", "tables", "media")
            )
        )
        r = x["after"]
        print(
            f"  after {RATERS} raters: verdict {r['results'].get('verdict')!r}, "
            f"{len(r['ratings_csv'])} ratings; "
            + ", ".join(f"{k} {'identical' if r[k] == y['after'].get(k) else 'DIFFERENT'}" for k in sorted(r))
        )
    for name, x in a["plan"].items():
        same = x == b["plan"].get(name)
        what = x.get("raters") if isinstance(x, dict) else x[:60]
        print(f"plan {name}: {what}, {'identical' if same else 'DIFFERENT'}")
    for name, x in a["stream"].items():
        n = len(x["records"]) if isinstance(x, dict) else "-"
        same = x == b["stream"].get(name)
        print(f"stream {name}: {n} records, {'identical' if same else 'DIFFERENT'}")
    print("EQUIVALENT" if a == b else "NOT EQUIVALENT")
    return 0 if a == b else 1


if __name__ == "__main__":
    if sys.argv[1] == "--make":
        (Path(sys.argv[2])).mkdir(parents=True)
        make(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main())
