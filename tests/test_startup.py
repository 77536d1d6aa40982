"""Start-up (issue 48 item 3): the command line and every command up to where it checks its
inputs import none of the heavy libraries (torch, gradio, lpips, OpenCV, scikit-image, pandas,
matplotlib, diffusers, transformers, SciPy). A behaviour check, not a clock: one fresh interpreter
imports the CLI, then runs each command on bad input in turn; after each, the heavy top-level
modules that appeared in ``sys.modules`` are recorded. Each bad input must still be refused
with one ``error: ...`` line and exit code 2 (so the command really reached its input check).

``info`` and ``fingerprint`` are not here: their work is asking torch about the machine.
Times: benchmarks/bench_cli_startup.py (results/startup_cpu2.txt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CANARY_CLIP = ROOT / "datasets" / "canary" / "clips" / "astronaut_pan.mkv"

HEAVY = (
    "torch",
    "gradio",
    "lpips",
    "cv2",
    "skimage",
    "pandas",
    "matplotlib",
    "diffusers",
    "transformers",
    "triton",
    "torchvision",
    "scipy",
)

CHILD = r"""
import json, sys
heavy = set(json.loads(sys.argv[1]))
def loaded():
    return {m.split(".")[0] for m in list(sys.modules)} & heavy
from evalkit.cli import main
rows = [["import evalkit.cli", None, sorted(loaded())]]
for argv in json.loads(sys.argv[2]):
    before = loaded()
    rc = main(argv)
    print("--- end of", argv[0], file=sys.stderr, flush=True)
    rows.append([argv, rc, sorted(loaded() - before)])
print(json.dumps(rows))
"""


def bad_inputs(d: Path) -> list[list[str]]:
    """Each command with arguments argparse accepts and inputs the command itself refuses."""
    (d / "empty").mkdir()
    (d / "junk.mp4").write_bytes(b"not a video" * 10)
    (d / "bad.yaml").write_text("clips: [\n")
    (d / "junk.db").write_bytes(b"not a database" * 10)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(d / "small.png")
    e, db = str(d / "empty"), str(d / "junk.db")
    return [
        ["--help"],
        ["fingerprint", "--backend", "cuda,dtype=bogus"],
        ["probe", str(d / "junk.mp4")],
        ["render", str(d / "bad.yaml"), "--out", str(d / "o1")],
        ["import", str(d / "bad.yaml"), e, "--label", "x", "--out", str(d / "o2")],
        ["compare", e, e, "--out", str(d / "o3")],
        ["gate", e, "--gate", str(d / "bad.yaml")],
        ["floor", e, "--out", str(d / "o4")],
        ["study", "create", e, "--db", db, "--protocol", "abx"],
        ["study", "invite", "--db", db, "--study", "1"],
        ["study", "results", "--db", db, "--study", "1"],
        ["study", "gate", "--db", db, "--study", "1", "--out", str(d / "g.yaml")],
        ["study", "unblind", "--db", db, "--study", "1", "--reason", "test"],
        ["serve", "--db", db, "--port", "9"],
        ["suite", "validate", str(d / "bad.yaml")],
        ["suite", "preview", str(d / "bad.yaml"), "--out", str(d / "o5")],
        ["metrics", str(d / "junk.mp4"), str(d / "junk.mp4")],
        # both inputs readable, their sizes differ: refused after reading both headers
        ["metrics", str(CANARY_CLIP), str(d / "small.png")],
    ]


def test_commands_check_inputs_without_heavy_imports(tmp_path):
    cmds = bad_inputs(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False"}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(HEAVY), json.dumps(cmds)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    assert rows[0] == ["import evalkit.cli", None, []]
    assert len(rows) == len(cmds) + 1
    imported = {" ".join(argv[:2]): new for argv, _, new in rows[1:] if new}
    assert imported == {}, f"heavy imports before the input check: {imported}"
    codes = [(argv[:2], rc) for argv, rc, _ in rows[1:]]
    assert codes[0] == (["--help"], 0)
    assert all(rc == 2 for _, rc in codes[1:]), codes
    # each refusal is one line `error: ...` (no traceback), naming what it refused
    blocks = p.stderr.split("--- end of ")
    for argv, block in zip(cmds[1:], blocks[1:]):
        lines = [ln for ln in block.splitlines()[1:] if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, block)
    assert "expected 256x256" in p.stderr and "small.png" in p.stderr
