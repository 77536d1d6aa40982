"""The same studies created by two trees give the same bytes: every trial stream's file and the
database's rows (studies, clips, trials). A check run once when a change must not move a
study's output (session 19: ``study create`` made window by window, against main):

    python benchmarks/study_identity.py /tmp/ident --baseline main

Makes one compare report (imported runs of moving textures, 45 frames at 24 fps: not a whole
number of :data:`evalkit.study.excerpt.WINDOW` windows; 1400x64, so ABX's three tiles are
downscaled and preference's two are not), then in each tree (a process of its own, ``PYTHONPATH`` set to the tree) creates
ABX, preference, ABX ``--excerpt 1``, threshold (amplify) and threshold (blur) studies and
invites three raters, and dumps every media file's sha256 and the database's rows (the media
key, times and token hashes left out: drawn at random). Prints the differences, none if equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUDIES = {
    "abx": {"protocol": "abx"},
    "pref": {"protocol": "preference"},
    "abx_excerpt": {"protocol": "abx", "excerpt_seconds": 1},
    "thr_amplify": {"protocol": "threshold", "raters_planned": 4, "levels": "1,2,4"},
    "thr_blur": {"protocol": "threshold", "raters_planned": 4, "ladder": "blur", "levels": "0.5,1,2"},
}


def make_report(out: Path) -> None:
    from scipy.ndimage import gaussian_filter

    from evalkit.testing.studies import import_report, moving_texture

    pairs = {}
    for k, prompt in enumerate(("one", "two")):
        fa = moving_texture(45, 64, 1400, seed=20 + k)
        fb = fa.copy()
        for i in range(10, 30):
            fb[i] = gaussian_filter(fb[i], (1.5, 1.5, 0))
        pairs[prompt] = (fa, fb)
    import_report(out, pairs, 24)


def create(report: Path, out: Path) -> None:
    """Run in the tree under test: create every study of :data:`STUDIES`, dump what it made."""
    from sqlalchemy import select

    from evalkit import study
    from evalkit.fsutil import sha256_file
    from evalkit.study.store import clips, open_db, studies, trials

    dump = {}
    for name, kw in STUDIES.items():
        db = out / name / "study.sqlite"
        db.parent.mkdir(parents=True)
        sid = study.create_study(report, db, seed=3, allow_masking=True, **kw)["study"]
        study.invite(db, sid, 3)
        with open_db(db).engine.connect() as conn:
            st = dict(conn.execute(select(studies)).mappings().one())
            st["config"].pop("media_key")
            for k in ("created", "media_dir", "report", "run_a", "run_b"):
                st.pop(k)
            rows = {
                "study": st,
                "clips": [dict(r) for r in conn.execute(select(clips).order_by(clips.c.id)).mappings()],
                "trials": [dict(r) for r in conn.execute(select(trials).order_by(trials.c.id)).mappings()],
            }
        files = sorted(p.name for p in db.parent.rglob("*.mp4"))
        dump[name] = {
            "rows": rows,
            "files": files,
            "sha": {f: sha256_file(next(db.parent.rglob(f))) for f in files},
        }
    (out / "dump.json").write_text(json.dumps(dump, sort_keys=True, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--baseline", default="main")
    ap.add_argument(
        "--keep-before", action="store_true", help="reuse the baseline's dump of an earlier run in WORK"
    )
    ap.add_argument("--create", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.create:
        create(*args.create)
        return 0
    work = args.work
    if not (work / "src").exists():
        make_report(work / "src")
    report = next((work / "src").rglob("summary.json")).parent
    base = Path(tempfile.mkdtemp(prefix="identity_base_")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.baseline], check=True
    )
    dumps = {}
    try:
        for name, tree in (("before", base), ("after", ROOT)):
            out = work / name
            if name == "before" and args.keep_before and (out / "dump.json").exists():
                dumps[name] = json.loads((out / "dump.json").read_text())
                continue
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            env = {**os.environ, "PYTHONPATH": str(tree), "GRADIO_ANALYTICS_ENABLED": "False"}
            subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "benchmarks" / "study_identity.py"),
                    str(work),
                    "--create",
                    str(report),
                    str(out),
                ],
                env=env,
                cwd=tree,
                check=True,
            )
            dumps[name] = json.loads((out / "dump.json").read_text())
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    bad = 0
    for name in STUDIES:
        a, b = dumps["before"][name], dumps["after"][name]
        same_files = a["sha"] == b["sha"]
        same_rows = a["rows"] == b["rows"]
        print(
            f"{name:12s} files {len(a['files']):3d} vs {len(b['files']):3d} "
            f"{'identical' if same_files else 'DIFFER'}; rows (study, {len(a['rows']['clips'])} "
            f"clips, {len(a['rows']['trials'])} trials) {'identical' if same_rows else 'DIFFER'}"
        )
        bad += (not same_files) + (not same_rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
