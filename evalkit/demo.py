"""`make demo`: the main job on the bundled canary suite, through the real CLI commands.

1. validate the canary suite and print the environment fingerprint;
2. write browser previews of the source clips;
3. render the suite on two local backends (a GPU against the CPU where there is a GPU,
   otherwise cpu,dtype=fp32 against cpu,dtype=bf16), resumable;
4. compare them against the seed floor (a seed-shifted re-render on backend A) with a gate;
5. create a blind ABX study from the report with lossless delivery (raters see the rendered
   pixels: the CPU pair's difference is finer than an 8-bit H.264 stream carries), invite one
   rater, and serve the rater and admin pages on 127.0.0.1 (printing the rater link and the
   admin password) until Ctrl-C.

    python -m evalkit.demo [--out demo-out]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import main as cli
from .fsutil import datasets_dir

SUITE = datasets_dir() / "canary" / "suite.yaml"
GATE = datasets_dir() / "canary" / "gate.yaml"


def backends() -> tuple[str, str]:
    import torch

    if torch.cuda.is_available():
        return "cpu", "cuda,dtype=bf16"
    return "cpu", "cpu,dtype=bf16"


def run(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m evalkit.demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("demo-out"))
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--no-serve", action="store_true", help="stop after creating the study")
    a = p.parse_args(argv)
    from evalkit.render.backend import parse_spec
    from evalkit.render.driver import run_dir_name
    from evalkit.render.renderers.canary import MODEL_DIR
    from evalkit.render.renderers.diffusers import model_digest

    spec_a, spec_b = backends()
    # one runs folder per version of the shipped weights: a rerun resumes, a new model renders anew
    runs = a.out / f"runs-{model_digest(MODEL_DIR)[:8]}"
    steps = [
        ["suite", "validate", SUITE],
        ["info"],
        ["suite", "preview", SUITE, "--out", a.out / "source-previews"],
        ["render", SUITE, "-b", spec_a, "-b", spec_b, "--out", runs],
        ["render", SUITE, "-b", spec_a, "--seed-offset", "1", "--out", runs],
    ]
    for step in steps:
        print(f"\n$ evalkit {' '.join(map(str, step))}", flush=True)
        code = cli([str(s) for s in step])
        if code != 0:
            print(f"demo: step failed with exit code {code}", file=sys.stderr)
            return code
    dir_a = runs / run_dir_name(parse_spec(spec_a))
    dir_b = runs / run_dir_name(parse_spec(spec_b))
    floor = runs / run_dir_name(parse_spec(spec_a), 1)
    step = ["compare", dir_a, dir_b, "--floor", floor, "--gate", GATE, "--out", a.out / "report"]
    print(f"\n$ evalkit {' '.join(map(str, step))}", flush=True)
    code = cli([str(s) for s in step])
    if code not in (0, 1):
        return code
    print(
        f"\ndemo: report in {a.out / 'report' / 'index.html'} (gate "
        f"{'passed' if code == 0 else 'failed'}: see the report for why)"
    )

    import secrets
    import shutil

    db = a.out / "study.db"
    for stale in (db, a.out / "study.db-wal", a.out / "study.db-shm"):
        stale.unlink(missing_ok=True)
    shutil.rmtree(a.out / "media", ignore_errors=True)
    base = f"http://127.0.0.1:{a.port}/"
    link = f"{base}?token="
    # --delivery lossless: the CPU pair's bf16 difference (47-53 dB PSNR) is finer than any
    # 8-bit 4:2:0 stream carries (docs/studies.md, "Delivery"); raters see the rendered pixels
    for step in (
        [
            "study",
            "create",
            "--delivery",
            "lossless",
            a.out / "report",
            "--db",
            db,
            "--protocol",
            "abx",
            "--clips",
            "all",
            "--seed",
            "1",
        ],
        ["study", "invite", "--db", db, "--study", "1", "--base-url", link],
    ):
        print(f"\n$ evalkit {' '.join(map(str, step))}", flush=True)
        code = cli([str(s) for s in step])
        if code != 0:
            return code
    if a.no_serve:
        return 0
    password = secrets.token_urlsafe(9)
    print(f"\nadmin page: {base}admin  (user admin, password {password})")
    print("serving on 127.0.0.1; Ctrl-C stops", flush=True)
    try:
        return cli(["serve", "--db", str(db), "--port", str(a.port), "--admin-password", password])
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(run())
