"""`evalkit render` at real scale, whole processes timed: evalkit trees side by side, alternating.

Each repeat runs, one after the other, every variant as a fresh process on the same suite
(``scale720``: 8 jobs of 240 frames at 1280x720; ``datasets/make_scale.py`` makes its clips):

- ``direct``: this module's direct loop in its own process: per job, decode the source
  (:class:`evalkit.video.ClipReader`), call the renderer, nothing written (the lower bound);
- ``NAME=TREE[:ENV=VALUE,...]``: ``python -m evalkit render SUITE -b BACKEND -r
  bench_render_scale:GpuWork`` with ``PYTHONPATH=TREE`` (an evalkit checkout), the environment
  variables given (an older tree's switches), into a fresh folder.

Every variant's wall time is printed per repeat and as medians, with the harness's overhead
against ``direct``; the clips' sha256 of each tree are compared with the first tree's (the same
renderer, the same frames: the same lossless clips).

:class:`evalkit.testing.renderers.GpuWork` stands in for a video pipeline on a GPU: per chunk of 16 frames, ``steps``
denoising-like steps of 3x3 convolutions (in the backend's dtype: ``-b cuda,dtype=bf16``) (``channels`` wide) at 1/8 of the frame size,
launched one by one from the Python thread (as a diffusion loop launches its kernels, so a
thread that holds the interpreter lock beside it slows it); it returns the source upside down
(natural frames, so the encoders do real work). Fixed work per job: its duration depends only on
how fast the launching thread and the GPU run.

    python datasets/make_scale.py --out /tmp/s
    python benchmarks/bench_render_scale.py /tmp/s/scale720/suite.yaml --backend cuda \\
        --backend cuda,dtype=bf16 --steps 30 --repeats 2 main=/path/to/old/tree ours=.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _gpu_work():
    """:class:`evalkit.testing.renderers.GpuWork` of this checkout, also under an older evalkit
    that lacks it (its file loaded on its own, over whichever evalkit is imported)."""
    try:
        from evalkit.testing.renderers import GpuWork as cls
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_scale_renderers", HERE.parent / "evalkit" / "testing" / "renderers.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cls = module.GpuWork
    return cls


def __getattr__(name: str):
    """``GpuWork``, the renderer of every variant (``-r bench_render_scale:GpuWork``), found
    when a render imports it (this script's own process needs no evalkit)."""
    if name == "GpuWork":
        return _gpu_work()
    raise AttributeError(name)


def direct(suite_path: str, backend: str, steps: int) -> float:
    """The direct loop (in this process): seconds of the pipeline's own calls."""
    from evalkit.formats.suite import load_suite
    from evalkit.render.backend import apply_backend, parse_spec
    from evalkit.render.renderers import RenderRequest
    from evalkit.video import ClipReader

    suite = load_suite(suite_path)
    renderer = _gpu_work()(steps=steps)
    own = 0.0
    with apply_backend(parse_spec(backend)) as runtime:
        renderer.load(runtime)
        for job in suite.jobs:
            reader = ClipReader(suite.clips[job.clip].path)
            frames = reader.read()
            t = time.perf_counter()
            renderer.render(RenderRequest(job, frames, reader.info.fps, job.seed, suite.clips[job.clip].path))
            own += time.perf_counter() - t
    return own


def _variant(spec: str) -> tuple[str, Path, dict]:
    name, _, rest = spec.partition("=")
    tree, _, env = rest.partition(":")
    pairs = dict(e.split("=", 1) for e in env.split(",") if e)
    return name, Path(tree).resolve(), pairs


def _run(cmd: list[str], env: dict, cwd=None) -> tuple[float, subprocess.CompletedProcess]:
    """``cmd`` timed whole; ``cwd``: a folder holding no evalkit (``python -m`` puts the
    working folder first on the import path)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cwd)
    return time.perf_counter() - t0, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite")
    ap.add_argument("variants", nargs="+", metavar="NAME=TREE[:ENV=VALUE,...]")
    ap.add_argument("--backend", default="cuda,dtype=bf16")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no repeat after this many seconds",
    )
    ap.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.suite = str(Path(a.suite).resolve())
    if a.direct:  # the child process of the direct variant
        print(json.dumps({"own": direct(a.suite, a.backend, a.steps)}))
        return 0
    variants = [_variant(v) for v in a.variants]
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVALKIT_")}
    extra = os.environ.get("PYTHONPATH", "")
    times: dict[str, list[float]] = {"direct": []}
    times.update({name: [] for name, _, _ in variants})
    sha: dict[str, dict] = {}
    t_start = time.perf_counter()
    for rep in range(a.repeats):
        if a.budget and rep and time.perf_counter() - t_start > a.budget:
            print(f"(budget reached: {rep} repeats)", flush=True)
            break
        env = {**base, "PYTHONPATH": os.pathsep.join([str(variants[-1][1]), str(HERE), extra])}
        wall, p = _run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                a.suite,
                "x=.",
                "--backend",
                a.backend,
                "--steps",
                str(a.steps),
                "--direct",
            ],
            env,
        )
        if p.returncode:
            raise SystemExit(f"direct failed:\n{p.stderr[-3000:]}")
        own = json.loads(p.stdout.strip().splitlines()[-1])["own"]
        times["direct"].append(wall)
        line = f"repeat {rep + 1}: direct {wall:.2f} s (pipeline calls {own:.2f} s)"
        for name, tree, vars_ in variants:
            out = Path(tempfile.mkdtemp(prefix=f"render-{name}-"))
            env = {**base, **vars_, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE), extra])}
            wall, p = _run(
                [
                    sys.executable,
                    "-m",
                    "evalkit",
                    "render",
                    a.suite,
                    "-b",
                    a.backend,
                    "-r",
                    "bench_render_scale:GpuWork",
                    "-O",
                    f"steps={a.steps}",
                    "-o",
                    str(out / "runs"),
                    "--quiet",
                ],
                env,
                cwd=out,
            )
            if p.returncode:
                raise SystemExit(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
            [run] = [d for d in (out / "runs").iterdir() if (d / "manifest.json").exists()]
            doc = json.loads((run / "manifest.json").read_text())
            recs = doc["jobs"].values() if isinstance(doc["jobs"], dict) else doc["jobs"]
            calls = sum(r["timing"]["seconds"] for r in recs)
            sha[name] = {r["id"]: r["output"]["sha256"] for r in recs}
            codec = (doc.get("lossless") or {}).get("codec", "ffv1")
            times[name].append(wall)
            line += f"\n  {name}: {wall:.2f} s (pipeline calls {calls:.2f} s, clips {codec})"
            shutil.rmtree(out, ignore_errors=True)
        print(line, flush=True)
    first = variants[0][0]
    for name, _, _ in variants[1:]:
        same = sha[name] == sha[first]
        print(
            f"clips of {name} {'identical to' if same else 'DIFFER from'} {first}'s ({len(sha[name])} jobs)"
        )
    md = statistics.median(times["direct"])
    print(
        f"suite {a.suite}, backend {a.backend}, GpuWork steps={a.steps}; whole processes, "
        f"medians of {len(times['direct'])}"
    )
    print(f"direct loop (nothing written): {md:.2f} s")
    for name, _, vars_ in variants:
        m = statistics.median(times[name])
        print(
            f"{name} {vars_ or ''}: {m:.2f} s ({100 * (m - md) / md:+.1f}% against direct; "
            f"runs {', '.join(f'{t:.2f}' for t in times[name])})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
