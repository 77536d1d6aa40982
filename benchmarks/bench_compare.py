"""`evalkit compare` wall time against the metric computation alone, side by side.

Two runs of the canary suite (8 clips, 24 frames, 256x256) are made with a fake renderer
(evalkit/testing/renderers.py: inverted source plus seeded noise, more noise on bf16), then, in
alternation, repeated:

- metrics alone: one loaded PairEvaluator; per job decode both lossless clips once and stream
  them through it (the least work any comparison must do);
- compare: the whole `compare_runs` (pairing, sha256 checks, the same metrics, CSVs,
  summary.json, matplotlib plots, thumbnails, heatmaps, HTML).

    python benchmarks/bench_compare.py [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default=str(ROOT / "datasets" / "canary" / "suite.yaml"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()

    from evalkit.compare.pairing import pair_jobs
    from evalkit.compare.run import compare_runs
    from evalkit.formats.run import RunDir
    from evalkit.metrics.stream import PairEvaluator, stream_pair
    from evalkit.render.driver import render_suite
    from evalkit.video import ClipReader

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        render_suite(
            a.suite,
            ["cpu", "cpu,dtype=bf16"],
            tmp / "runs",
            renderer="evalkit.testing.renderers:Invert",
            progress=False,
        )
        run_a, run_b = tmp / "runs" / "cpu", tmp / "runs" / "cpu_dtype-bf16"
        pairs, _ = pair_jobs(RunDir.open(run_a), RunDir.open(run_b), same_seed=True)
        evaluator = PairEvaluator(device=a.device)

        def metrics_alone() -> float:
            t0 = time.perf_counter()
            for pair in pairs:
                evaluator.reset()
                for _ in stream_pair(ClipReader(pair.path_a), ClipReader(pair.path_b), evaluator=evaluator):
                    pass
                evaluator.compute()
            return time.perf_counter() - t0

        def compare() -> float:
            t0 = time.perf_counter()
            compare_runs(run_a, run_b, tmp / "report", device=a.device, progress=False)
            return time.perf_counter() - t0

        metrics_alone()  # warm-up: model load, first-call allocations
        m, c = [], []
        for i in range(a.repeats):
            m.append(metrics_alone())
            c.append(compare())
            print(f"repeat {i + 1}: metrics alone {m[-1]:.2f} s  compare {c[-1]:.2f} s", file=sys.stderr)
        mm, mc = statistics.median(m), statistics.median(c)
        print(f"{len(pairs)} jobs, device {a.device}")
        print(f"metrics alone : median {mm:.2f} s")
        print(f"evalkit compare (model load included, report written): median {mc:.2f} s")
        print(f"ratio compare / metrics alone: {mc / mm:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
