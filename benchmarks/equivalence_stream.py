"""The streaming pair evaluator unchanged across a refactor: :mod:`metrics.stream` run on the same
synthetic clips with the code of commit BEFORE and with the working tree, every record and
summary compared exactly (floats as JSON writes them). Cases: temporal metrics with flows inline
and in flow threads, chunks of 1, 3, 4 and the automatic size, fidelity only, Farneback flow with
RGB SSIM, the ``torch`` flow, ``align="shortest"``, float frames through ``update``, and the
frame-count error. CPU only (the device paths are the same code on a GPU). Usage, from the
repository root:
    python benchmarks/equivalence_stream.py BEFORE_COMMIT [OUT]     (under a minute on 2 cores)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def clip(t: int, seed: int, h: int = 40, w: int = 56):
    """``t`` frames of a noisy texture panning right one pixel a frame."""
    import numpy as np

    g = np.random.default_rng(seed)
    base = g.integers(0, 256, (h, w, 3)).astype(np.int16)
    return np.stack([np.clip(np.roll(base, k, axis=1) + g.integers(-3, 4, (h, w, 3)), 0, 255)
                     for k in range(t)]).astype(np.uint8)


def make(path: Path) -> None:
    """In the tree on PYTHONPATH: every case's records and summary, as JSON, into ``path``."""
    import numpy as np
    import torch

    from metrics.stream import PairEvaluator, evaluate_pair, stream_pair

    a = clip(11, seed=1)
    rng = np.random.default_rng(0)
    b = a.copy()
    b[3:] = np.clip(b[3:].astype(int) + rng.integers(-6, 7, b[3:].shape), 0, 255).astype(np.uint8)
    b[5] = a[5]                                   # one identical frame
    cases = {
        "temporal_inline_c4": dict(chunk=4, temporal=True, flow_workers=0),
        "temporal_threads_c3": dict(chunk=3, temporal=True, flow_workers=2),
        "temporal_c1": dict(chunk=1, temporal=True, flow_workers=0),
        "fidelity_c5": dict(chunk=5, temporal=False),
        "farneback_rgb_c4": dict(chunk=4, temporal=True, flow="farneback", ssim_channel="rgb",
                                 flow_workers=2),
        "torchflow_c4": dict(chunk=4, temporal=True, flow="torch"),
        "auto_chunk": dict(temporal=True),
    }
    out = {}
    for name, kw in cases.items():
        chunk = kw.pop("chunk", None)
        out[name] = evaluate_pair(iter(list(a)), iter(list(b)), chunk=chunk, device="cpu", **kw)
    ev = PairEvaluator(device="cpu", temporal=True, flow_workers=2)
    recs = list(stream_pair(iter(list(a)), iter(list(b[:8])), evaluator=ev, chunk=3,
                            align="shortest"))
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
    path.write_text(json.dumps(out, sort_keys=True, default=repr))


def main() -> int:
    before = sys.argv[1]
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/evalkit-equivalence-stream")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    src = out / "before-src"
    subprocess.run(["git", "worktree", "add", "--detach", str(src), before], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        for label, tree in (("before", src), ("after", Path.cwd())):
            env = dict(os.environ, PYTHONPATH=str(tree))
            subprocess.run([sys.executable, __file__, "--make", str(out / f"{label}.json")],
                           env=env, check=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(src)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    a = json.loads((out / "before.json").read_text())
    b = json.loads((out / "after.json").read_text())
    ok = a == b
    for name in a:
        n = len(a[name]["records"]) if isinstance(a[name], dict) else "-"
        print(f"{name}: {n} records, {'identical' if a[name] == b.get(name) else 'DIFFERENT'}")
    print("EQUIVALENT" if ok else "NOT EQUIVALENT")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "--make":
        make(Path(sys.argv[2]))
    else:
        sys.exit(main())
