"""Start-up of the command line on the CPU (issue 48 item 3): each command as a whole process,
from the interpreter's start to its exit, on bad input (the time to its input check, the
``error:`` line) and ``info`` / ``fingerprint`` (whose work is asking torch about the machine).

Two code trees side by side, alternated command by command within each repeat (``--tree``,
e.g. a ``git archive`` of the commit before and this checkout), in the same environment
(``sys.executable``); the median of ``--repeats`` runs per command and tree. The commands and
their bad inputs are tests/test_startup.py's.

    python benchmarks/bench_cli_startup.py --tree before=/tmp/before --tree after=. \\
        --repeats 5 --out benchmarks/results/startup_cpu2.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_startup import bad_inputs  # noqa: E402


def run_once(tree: Path, python: str, argv: list[str], cwd: Path) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(tree), "GRADIO_ANALYTICS_ENABLED": "False"}
    s = time.perf_counter()
    p = subprocess.run(
        [python, "-m", "evalkit", *argv],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )
    return time.perf_counter() - s, p.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="NAME=PATH[@PYTHON]",
        help="a code tree to run (PYTHONPATH), repeatable; @PYTHON: with that "
        "interpreter (another environment, e.g. the CPU build of torch)",
    )
    ap.add_argument(
        "--commands",
        default=None,
        help="only the commands whose line contains one of these comma-separated words",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    a = ap.parse_args(argv)
    trees = []
    for t in a.tree:
        name, _, rest = t.partition("=")
        path, _, python = rest.partition("@")
        trees.append((name, (Path(path).resolve(), python or sys.executable)))
    lines = [
        f"# {' '.join(sys.argv)}",
        *(f"# {n}: {tree} with {py}" for n, (tree, py) in trees),
        f"# python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average at start "
        f"{os.getloadavg()[0]:.2f}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cmds = [["info"], ["fingerprint"]] + bad_inputs(d)
        if a.commands:
            words = a.commands.split(",")
            cmds = [c for c in cmds if any(w in " ".join(c) for w in words)]
        times: dict = {}
        codes: dict = {}
        for rep in range(a.repeats):
            for argv_ in cmds:
                for name, tree in trees if rep % 2 == 0 else trees[::-1]:
                    t, rc = run_once(*tree, argv_, d)
                    key = " ".join(Path(x).name if "/" in x else x for x in argv_[:3])
                    times.setdefault(key, {}).setdefault(name, []).append(t)
                    codes.setdefault(key, {})[name] = rc
            print(f"repeat {rep + 1}/{a.repeats} done", file=sys.stderr, flush=True)
    lines.append(
        f"# load average at end {os.getloadavg()[0]:.2f}; median of {a.repeats} whole "
        "processes per command and tree (min-max), exit code"
    )
    names = [n for n, _ in trees]
    lines.append(f"{'command':<40}" + "".join(f"{n:>26}" for n in names))
    worst = {n: 0.0 for n in names}
    for key, per in times.items():
        row = f"{key[:39]:<40}"
        for n in names:
            v = per[n]
            m = statistics.median(v)
            worst[n] = max(worst[n], m)
            row += f"{m:9.2f} s ({min(v):.2f}-{max(v):.2f}) rc {codes[key][n]}"
        lines.append(row)
    lines.append("slowest median: " + ", ".join(f"{n} {worst[n]:.2f} s" for n in names))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
