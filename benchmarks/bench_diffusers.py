"""diffusers' video-to-video families through evalkit: speed, memory, overhead, backend distances.

Random weights at the published dimensions (``--dims real``: Wan 2.1 1.3B, CogVideoX-2b,
LTX-Video 0.9; text encoders at their real width but 2 layers, see ``benchmarks/README.md``)
or diffusers' test configurations (``--dims tiny``, for a CPU check of this script). Per family,
one synthetic source clip, one prompt, seed 0:

1. backend A (``dtype=bf16,attn=<first --attn>``), loaded once: a warm-up call, then the
   pipeline called directly (``renderer.render``, as ``bench_render.py``) and through
   ``render_suite`` (decode, render, lossless clip + preview, manifest), alternating
   ``--repeats`` times: seconds each and the harness overhead;
2. A again with ``--seed-offset 1`` (the seed floor); B ``dtype=fp32``; C ``dtype=bf16,
   attn=<second --attn>``: seconds per job and peak device memory from each run's manifest;
3. ``compare`` A vs B and A vs C with the floor: LPIPS, PSNR, ratios to the floor;
4. ``--oom`` (CUDA, the first family, after all families): the device memory capped at ``--oom-cap`` x A's peak, a suite holding a
   ``--oom-size`` clip and the normal one: the large job is recorded as failed (out of memory),
   the other renders; then the large one again with ``-O vae_tiling=1``.

    python benchmarks/bench_diffusers.py --dims tiny --device cpu --out /tmp/bd   # CPU check
    python benchmarks/bench_diffusers.py --dims real --device cuda --oom --out OUT  # H200
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RENDERER = "evalkit.testing.tiny_families:RandomWeightsRenderer"


def source_clip(path: Path, frames: int, width: int, height: int) -> Path:
    """A smooth synthetic clip: a drifting colour gradient with a moving disc."""
    import numpy as np

    from evalkit.video import write_lossless

    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for t in range(frames):
        r = 0.5 + 0.5 * np.sin(2 * np.pi * (x / width + t / frames))
        g = 0.5 + 0.5 * np.cos(2 * np.pi * (y / height - t / (2 * frames)))
        b = (
            (x - width * (0.2 + 0.6 * t / max(frames - 1, 1))) ** 2 + (y - height / 2) ** 2
            < (min(width, height) / 5) ** 2
        ).astype(np.float32)
        out.append((np.stack([r, g, 0.3 + 0.7 * b], -1) * 255).astype(np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_lossless(path, np.stack(out), 8)
    return path


def write_suite(folder: Path, clips: dict, params: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    clip_list = ", ".join(f"{{id: {k}, path: {v}}}" for k, v in clips.items())
    p = folder / "suite.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: bench-diffusers
        clips: [{clip_list}]
        prompts: ["a watercolor painting of a city street at dusk"]
        seeds: [0]
        params: {json.dumps(params)}
    """)
    )
    return p


def job_records(run_path: Path) -> list[dict]:
    return json.loads((run_path / "manifest.json").read_text())["jobs"]


def gib(n) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def run_family(a, family: str, out: Path, log) -> None:
    import torch

    from evalkit.compare.run import compare_runs
    from evalkit.formats.suite import load_suite
    from evalkit.render.backend import apply_backend, parse_spec
    from evalkit.render.driver import render_suite
    from evalkit.render.local_executor import LocalExecutor, check_output
    from evalkit.render.renderers import RenderRequest, get_renderer
    from evalkit.render.renderers.diffusers_families import FAMILIES as FAMS
    from evalkit.render.sources import SourceCache
    from evalkit.testing.tiny_families import PIPELINES

    width, height = (int(v) for v in a.size.split("x"))
    fam = FAMS[PIPELINES[family]]
    folder = out / family
    shutil.rmtree(folder, ignore_errors=True)
    clip = source_clip(folder / "src.mkv", a.frames, width, height)
    params = {"steps": a.steps, "guidance": a.guidance}
    if fam.strength_arg is not None:
        params["strength"] = a.strength
    suite_path = write_suite(folder, {"src": clip}, params)
    suite = load_suite(suite_path)
    job = suite.jobs[0]
    attn_a, attn_c = a.attn.split(",")
    spec_a = f"{a.device},dtype=bf16,attn={attn_a}"
    spec_b = f"{a.device},dtype=fp32"
    spec_c = f"{a.device},dtype=bf16,attn={attn_c}"
    opts = {"family": family, "dims": a.dims}
    log(
        f"\n== {family} ({PIPELINES[family]}), dims={a.dims}: {a.frames} frames {width}x{height}, "
        f"{a.steps} steps, params {params}"
    )

    class LoadedOnce(LocalExecutor):
        """The harness's executor, reusing the renderer loaded for the direct calls."""

        def run(self, rend, task, sources, progress):
            with apply_backend(task.spec) as runtime:
                for j in task.jobs:
                    yield self.render_job(rend, runtime, j, sources, task.seed_offset, progress)

    runs = {}
    rend = get_renderer(RENDERER, opts)
    spec = parse_spec(spec_a)
    t0 = time.perf_counter()
    with apply_backend(spec) as runtime:
        rend.load(runtime)
    cuda = runtime.device.type == "cuda"
    log(f"build on device ({spec_a}): {time.perf_counter() - t0:.1f} s")

    def direct() -> float:
        t = time.perf_counter()
        with apply_backend(spec):
            frames, fps, path = SourceCache(suite).get(job.clip)
            o = rend.render(RenderRequest(job, frames, fps, job.seed, path))
            if cuda:
                torch.cuda.synchronize()
            check_output(o, frames, rend)
        return time.perf_counter() - t

    def harness(dest: Path, seed_offset: int = 0) -> tuple[float, Path]:
        t = time.perf_counter()
        [s] = render_suite(
            suite_path,
            [spec_a],
            dest,
            renderer=rend,
            executor=LoadedOnce(),
            seed_offset=seed_offset,
            progress=False,
        )
        if s.failed:
            raise SystemExit(f"{family}: harness run failed: {s.failures}")
        return time.perf_counter() - t, s.path

    t = direct()
    log(f"warm-up call: {t:.2f} s")
    d, h = [], []
    for i in range(a.repeats):
        d.append(direct())
        dest = folder / ("runs" if i == a.repeats - 1 else f"timing{i}")
        ht, path = harness(dest)
        h.append(ht)
        runs["A"] = path
        log(f"repeat {i + 1}: direct {d[-1]:.2f} s   evalkit render {h[-1]:.2f} s")
        if dest.name != "runs":
            shutil.rmtree(dest, ignore_errors=True)
    md, mh = statistics.median(d), statistics.median(h)
    log(
        f"direct pipeline call: median {md:.2f} s; evalkit render (job + clip/preview/manifest): "
        f"median {mh:.2f} s; overhead {100 * (mh - md) / md:+.1f}% (ratio {mh / md:.3f})"
    )
    _, runs["floor"] = harness(folder / "runs", seed_offset=1)
    rend.unload()
    if cuda:
        torch.cuda.empty_cache()
    for key, sp in (("B", spec_b), ("C", spec_c)):
        [s] = render_suite(
            suite_path, [sp], folder / "runs", renderer=get_renderer(RENDERER, opts), progress=False
        )
        runs[key] = s.path
        if s.failed:
            log(f"{sp}: FAILED {s.failures}")
        if cuda:
            torch.cuda.empty_cache()
    labels = {"A": spec_a, "floor": spec_a + " seed+1", "B": spec_b, "C": spec_c}
    a_rec = None
    for key in ("A", "floor", "B", "C"):
        [rec] = job_records(runs[key])
        a_rec = a_rec or rec
        tm = rec.get("timing", {})
        log(
            f"{labels[key]:<34} {rec['status']:<6} {tm.get('seconds', float('nan')):7.2f} s/job  "
            f"peak device memory {gib(tm.get('peak_device_memory_bytes'))}  "
            f"attention {json.dumps(_attn(rec))}"
        )
    log(f"pipeline call (A): {json.dumps(a_rec.get('pipeline_call'))}")
    for key, what in (("B", "bf16 vs fp32"), ("C", f"attn={attn_a} vs attn={attn_c} (bf16)")):
        res = compare_runs(
            runs["A"], runs[key], folder / f"compare_{key}", floors=[runs["floor"]], progress=False
        )
        ag = res.summary["aggregates"]
        [ratios] = res.summary["floor_ratios"].values() or [{}]
        [floor] = [f["aggregates"] for f in res.summary["floors"].values()] or [{}]
        log(
            f"compare {what}: LPIPS mean {_f(ag, 'lpips', 'mean')} p95 {_f(ag, 'lpips', 'p95')} "
            f"worst {_f(ag, 'lpips', 'worst')}; PSNR mean {_f(ag, 'psnr', 'mean')} dB | seed floor: "
            f"LPIPS mean {_f(floor, 'lpips', 'mean')}, PSNR mean {_f(floor, 'psnr', 'mean')} dB | "
            f"ratio to floor: LPIPS {_f(ratios, 'lpips', 'mean')}, PSNR(MSE) "
            f"{_f(ratios, 'psnr', 'mean')}"
        )
    return (a, family, folder, suite_path, params, spec_a, opts, a_rec, log) if cuda else None


def _attn(rec: dict) -> dict:
    att = rec.get("attention") or {}
    return {
        k: (v.get("dispatcher") or v.get("calls", v)) if isinstance(v, dict) else v
        for k, v in att.items()
        if k != "spec_attn"
    }


def _f(d: dict, metric: str, agg: str) -> str:
    v = (d or {}).get(metric, {}).get(agg)
    return "n/a" if v is None else f"{v:.4g}"


def oom(a, family, folder, suite_path, params, spec_a, opts, a_rec, log) -> None:
    """Cap the device memory, render a large clip and the normal one in one run."""
    import torch

    from evalkit.render.driver import render_suite
    from evalkit.render.renderers import get_renderer

    width, height = (int(v) for v in a.oom_size.split("x"))
    big = source_clip(folder / "big.mkv", a.frames, width, height)
    suite2 = write_suite(folder / "oom", {"big": big, "src": folder / "src.mkv"}, params)
    peak = a_rec["timing"]["peak_device_memory_bytes"]
    total = torch.cuda.get_device_properties(0).total_memory
    cap = min(1.0, a.oom_cap * peak / total)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap, 0)
    log(
        f"OOM check: device memory capped at {gib(cap * total)} ({a.oom_cap} x A's peak), "
        f"{gib(torch.cuda.memory_allocated(0))} allocated before; clips: big "
        f"{a.frames}x{width}x{height}, src"
    )
    try:
        for extra, dest in (({}, "oom/runs"), ({"vae_tiling": "1"}, "oom/runs_tiling")):
            t = time.perf_counter()
            [s] = render_suite(
                suite2,
                [spec_a],
                folder / dest,
                renderer=get_renderer(RENDERER, {**opts, **extra}),
                progress=False,
            )
            log(
                f"  options {extra or 'none'}: {s.done} done, {s.failed} failed in "
                f"{time.perf_counter() - t:.1f} s"
            )
            for rec in job_records(s.path):
                tm = rec.get("timing", {})
                log(
                    f"    {rec['clip']:<4} {rec['status']:<6} {tm.get('seconds', 0):6.1f} s  peak "
                    f"{gib(tm.get('peak_device_memory_bytes'))}  memory {json.dumps(rec.get('memory'))}"
                    + (f"\n      error: {rec['error']}" if rec.get("error") else "")
                )
            torch.cuda.empty_cache()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", choices=("tiny", "real"), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--families", default="wan,cogvideox")
    p.add_argument("--frames", type=int, default=None, help="default: 33 (real), 9 (tiny)")
    p.add_argument("--size", default=None, help="WxH; default: 832x480 (real), 32x32 (tiny)")
    p.add_argument("--steps", type=int, default=None, help="default: 4 (real), 2 (tiny)")
    p.add_argument("--strength", type=float, default=0.8)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument(
        "--attn", default=None, help="two kernels A,C; default flash,efficient on cuda, flash,math on cpu"
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--oom", action="store_true")
    p.add_argument("--oom-size", default="1280x720")
    p.add_argument("--oom-cap", type=float, default=1.2)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    real = a.dims == "real"
    a.frames = a.frames or (33 if real else 9)
    a.size = a.size or ("832x480" if real else "32x32")
    a.steps = a.steps or (4 if real else 2)
    a.attn = a.attn or ("flash,efficient" if a.device.startswith("cuda") else "flash,math")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    import platform

    import torch

    log(f"bench_diffusers: {' '.join(sys.argv[1:])}")
    log(
        f"host {platform.node()}, torch {torch.__version__}, "
        + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
    )
    first = None
    for family in a.families.split(","):
        t = time.perf_counter()
        try:
            state = run_family(a, family, out, log)
            first = first or state
        except Exception as e:  # one family's failure must not lose the others' figures
            log(f"{family}: FAILED {type(e).__name__}: {str(e)[:500]}")
        log(f"{family}: {time.perf_counter() - t:.1f} s in all")
    if a.oom and first is not None:
        t = time.perf_counter()
        try:
            oom(*first)
        except Exception as e:
            log(f"OOM check: FAILED {type(e).__name__}: {str(e)[:500]}")
        log(f"OOM check: {time.perf_counter() - t:.1f} s in all")
    (out / "bench_diffusers.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
