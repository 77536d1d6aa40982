"""Where ``evalkit compare``'s start-up goes (issue 16: start-up "a few seconds at most").

Each measurement runs in a fresh process (imports and caches as a user's first command sees
them; Triton's kernel cache on disk is kept, so the first process of a machine also compiles):

``pieces``: ``import torch``, importing the metric engine, :class:`evalkit.metrics.stream.PairEvaluator`
(CUDA initialisation, LPIPS weights), :meth:`~evalkit.metrics.stream.PairEvaluator.warm_up` (cuDNN
autotuning, Triton kernels, staging buffers) and a second warm-up, then LPIPS+SSIM+PSNR on
frames in memory; with cuDNN autotuning on (the default on CUDA) and off, alternating. What
autotuning costs at start-up against what it saves per pair is printed.

``timeline``: ``compare_runs`` of two run folders (e.g. ``bench_scale.py``'s) with a timeline
of its steps (hash checks, the session, the warm-up, the first chunk, the report).

    python benchmarks/bench_startup.py pieces --device cuda --repeats 2
    python benchmarks/bench_startup.py timeline RUN_A RUN_B --device cuda [--flow torch]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child_pieces(device: str, autotune: bool, height: int, width: int, frames: int) -> dict:
    t = {}
    s = time.perf_counter()
    import torch

    t["import torch"] = time.perf_counter() - s
    s = time.perf_counter()
    import numpy as np

    from evalkit.metrics.stream import PairEvaluator, stream_pair

    t["import evalkit.metrics"] = time.perf_counter() - s

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    s = time.perf_counter()
    ev = PairEvaluator(device=device, temporal=False, cudnn_benchmark=autotune)
    sync()
    t["evaluator (device init, LPIPS)"] = time.perf_counter() - s
    chunk = 16
    for name in ("warm-up", "warm-up again"):
        s = time.perf_counter()
        ev.warm_up(height, width, chunk)
        sync()
        t[name] = time.perf_counter() - s
    r = np.random.default_rng(0)
    fa = r.integers(0, 255, (frames, height, width, 3), np.uint8)
    fb = fa.copy()
    fb[..., 1] //= 2
    ev.reset()
    s = time.perf_counter()
    n = sum(1 for _ in stream_pair(iter([fa]), iter([fb]), evaluator=ev, chunk=chunk))
    sync()
    t["pairs/s in memory"] = n / (time.perf_counter() - s)
    ev.close()
    return {k: round(v, 3) for k, v in t.items()}


def _run_child(*argv: str, timeout: float = 600) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        ),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONWARNINGS": "ignore",
    }
    p = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "_child", *argv],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def cmd_pieces(a) -> list[dict]:
    out = []
    for rep in range(a.repeats):
        for autotune in (True, False):
            r = _run_child("pieces", a.device, str(int(autotune)), str(a.height), str(a.width), str(a.frames))
            r["autotune"] = autotune
            out.append(r)
            print(
                f"repeat {rep + 1}, cuDNN autotuning {'on ' if autotune else 'off'}: "
                + ", ".join(f"{k} {v}" for k, v in r.items() if k != "autotune"),
                flush=True,
            )
    on = [r for r in out if r["autotune"]]
    off = [r for r in out if not r["autotune"]]

    def med(rows, k):
        v = sorted(r[k] for r in rows)
        return v[len(v) // 2]

    cost = med(on, "warm-up") - med(off, "warm-up")
    p_on, p_off = med(on, "pairs/s in memory"), med(off, "pairs/s in memory")
    saved = 1 / p_off - 1 / p_on if p_on and p_off else 0.0
    line = (
        f"autotuning: warm-up {med(on, 'warm-up'):.2f} s against {med(off, 'warm-up'):.2f} s "
        f"(+{cost:.2f} s); in memory {p_on:.1f} against {p_off:.1f} pairs/s "
        f"({p_on / p_off:.2f}x)"
    )
    if saved > 0:
        line += f": pays for itself after about {cost / saved:,.0f} frame pairs"
    print(line, flush=True)
    return out


# -- timeline -----------------------------------------------------------------------------------

#: (module, attribute path) of the steps the timeline records
STEPS = [
    ("evalkit.compare.run", "pair_jobs"),  # the names compare_runs calls
    ("evalkit.compare.pairing", "LocalCompareSession.__init__"),
    ("evalkit.compare.pairing", "LocalCompareSession._warm_up"),
    ("evalkit.compare.pairing", "LocalCompareSession.measure"),
    ("evalkit.compare.run", "write_report"),
    ("evalkit.procdecode", "DecoderPool.start"),
    ("evalkit.metrics.stream", "PairEvaluator.__init__"),
    ("evalkit.metrics.stream", "PairEvaluator._prepare"),
]


def _child_timeline(a_run: str, b_run: str, device: str, flow: str) -> dict:
    t0 = time.perf_counter()
    spans: list = []

    def wrap(modname: str, path: str) -> None:
        owner = importlib.import_module(modname)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        fn = getattr(owner, name)
        seen = [0]

        def timed(*args, **kw):
            s = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                seen[0] += 1
                if seen[0] <= 3:  # the first calls only (chunks repeat)
                    spans.append(
                        [
                            path,
                            threading.current_thread().name,
                            round(s - t0, 3),
                            round(time.perf_counter() - s, 3),
                        ]
                    )

        setattr(owner, name, timed)

    s = time.perf_counter()
    import torch  # noqa: F401  (timed here: compare imports it inside its first steps)

    spans.append(["import torch", "MainThread", round(s - t0, 3), round(time.perf_counter() - s, 3)])
    for m, p in STEPS:
        wrap(m, p)
    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs

    opts = MetricOptions(temporal=flow != "none", flow="dis" if flow == "none" else flow)
    with tempfile.TemporaryDirectory() as tmp:
        s = time.perf_counter()
        compare_runs(a_run, b_run, Path(tmp) / "report", device=device, progress=False, metrics=opts)
        spans.append(["compare_runs", "MainThread", round(s - t0, 3), round(time.perf_counter() - s, 3)])
    spans.sort(key=lambda x: x[2])
    return {"spans": spans}


def cmd_timeline(a) -> dict:
    r = _run_child("timeline", a.run_a, a.run_b, a.device, a.flow)
    print(f"{'at s':>8} {'took s':>8}  {'thread':<20} step")
    for path, thread, at, took in r["spans"]:
        print(f"{at:8.3f} {took:8.3f}  {thread[:20]:<20} {path}")
    return r


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        if argv[1] == "pieces":
            r = _child_pieces(argv[2], argv[3] == "1", int(argv[4]), int(argv[5]), int(argv[6]))
        else:
            r = _child_timeline(*argv[2:6])
        print(json.dumps(r))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pieces", help="start-up pieces, cuDNN autotuning on and off")
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--frames", type=int, default=256, help="frame pairs timed in memory")
    p = sub.add_parser("timeline", help="compare_runs of two run folders with a timeline")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--flow", default="none", help="none (no temporal metrics), dis or torch")
    a = ap.parse_args(argv)
    (cmd_pieces if a.cmd == "pieces" else cmd_timeline)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
