"""Study creation unchanged across a refactor: ``study create`` on one compare report with the
code of commit BEFORE and with the working tree, then the databases (every table, every row, the
study's config; its creation time, media key and media folder aside) and the media files
(content-hashed names) compared. Three studies: preference, ABX on a worst-window excerpt,
threshold (amplify ladder, three levels). Usage, from the repository root:
    python benchmarks/equivalence_study.py BEFORE_COMMIT [OUT]     (about 2 minutes on 2 cores)
equivalence.sh covers render and compare; this covers ``study create``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STUDIES = {   # name: create_study's options (the fake renderer's noise needs allow_masking)
    "preference": {"protocol": "preference", "seed": 3},
    "abx_excerpt": {"protocol": "abx", "seed": 5, "excerpt_seconds": 0.25},
    "threshold": {"protocol": "threshold", "raters_planned": 12, "levels": "1,2,4", "seed": 7},
}


def make(out: Path, report: Path) -> None:
    """In the tree on PYTHONPATH: each study in its own database, dumped to ``out/dump.json``."""
    import hashlib

    from sqlalchemy import MetaData, create_engine, select

    from evalkit.study.api import create_study
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
                        r["config"] = cfg
                tables[t] = rows
        media = Path(res["media"])
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in sorted(media.rglob("*")) if p.is_file()}
        res.pop("media")
        dump[name] = {"result": res, "tables": tables, "media": files}
    text = json.dumps(dump, indent=1, sort_keys=True, default=str)
    (out / "dump.json").write_text(text.replace(str(out), "OUT"))


def main() -> int:
    before = sys.argv[1]
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/evalkit-equivalence-study")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    src = out / "before-src"
    subprocess.run(["git", "worktree", "add", "--detach", str(src), before], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        env = dict(os.environ, PYTHONPATH=str(src), GRADIO_ANALYTICS_ENABLED="False")
        code = ("import sys; from pathlib import Path; "
                "from evalkit.testing.studies import make_report; "
                "r = Path(sys.argv[1]); r.mkdir(); print(make_report(r))")
        report = subprocess.run([sys.executable, "-c", code, str(out / "report")], env=env,
                                check=True, capture_output=True, text=True).stdout.strip()
        for label, tree in (("before", src), ("after", Path.cwd())):
            env["PYTHONPATH"] = str(tree)
            subprocess.run([sys.executable, __file__, "--make", str(out / label), report],
                           env=env, check=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(src)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    a = json.loads((out / "before" / "dump.json").read_text())
    b = json.loads((out / "after" / "dump.json").read_text())
    ok = True
    for name in STUDIES:
        same = {k: a[name][k] == b[name][k] for k in ("result", "tables", "media")}
        ok &= all(same.values())
        n_rows = {t: len(r) for t, r in a[name]["tables"].items() if r}
        print(f"{name}: rows {n_rows}, {len(a[name]['media'])} media files; "
              + ", ".join(f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in same.items()))
    print("EQUIVALENT" if ok else "NOT EQUIVALENT")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "--make":
        make(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main())
