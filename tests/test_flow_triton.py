"""The fused Triton path of the torch optical flow (metrics/_triton_flow.py) against the torch
path: Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess: it must be set before triton
is imported) runs the same kernels on CPU tensors, at small sizes. The speed on a GPU is
measured in ``benchmarks/bench_flow.py --part speed --fused``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from metrics import torchflow

from conftest import ROOT

pytest.importorskip("triton")

SCRIPT = r"""
import functools
import json
import os
import torch
from skimage import data as skdata
from metrics.flowcheck import photo_grey, synthetic_pair
from metrics.torchflow import torch_flow

torch.set_num_threads(1)
astro, coffee = photo_grey(skdata.astronaut(), 0.4), photo_grey(skdata.coffee(), 0.4)
pairs = [synthetic_pair(astro, (48, 64), shift=(4.6, 2.2)),
         synthetic_pair(astro, (48, 64), angle=3.0, shift=(-1.3, 0.7))]
odd = synthetic_pair(coffee, (33, 47), zoom=1.04, shift=(0.4, -0.3))
t = lambda a: torch.from_numpy(a)  # noqa: E731
# solved down to the frames' own (odd) sizes: the default stops at 1/2 scale
torch_flow = functools.partial(torch_flow, finest=0)
src, dst = torch.stack([t(p[0]) for p in pairs]), torch.stack([t(p[1]) for p in pairs])
ref, fused = torch_flow(src, dst, fused=False), torch_flow(src, dst, fused=True)
os.environ["EVALKIT_TRITON_JACOBI"] = "3"     # 3 Jacobi iterations per launch, in tiles
alone = torch_flow(src[1:], dst[1:], fused=True)
os.environ["EVALKIT_TRITON_JACOBI"] = "1"
oref = torch_flow(t(odd[0])[None], t(odd[1])[None], fused=False)
os.environ["EVALKIT_TRITON_JACOBI"] = "9"     # 9 iterations in one launch (halo of 9), then 5
ofused = torch_flow(t(odd[0])[None], t(odd[1])[None], fused=True)
truth = [torch.from_numpy(p[2]).permute(2, 0, 1) for p in pairs]
print(json.dumps({
    "max_diff": float((ref - fused).abs().max()),
    "odd_max_diff": float((oref - ofused).abs().max()),
    "batch_diff": float((alone[0] - fused[1]).abs().max()),
    "finite": bool(fused.isfinite().all() and ofused.isfinite().all()),
    "epe_ref": [float((r - g).norm(dim=0).mean()) for r, g in zip(ref, truth)],
    "epe_fused": [float((r - g).norm(dim=0).mean()) for r, g in zip(fused, truth)],
    "median_shift": float(fused[0].norm(dim=0).median()),
}))
"""


def test_fused_flow_kernels_match_the_torch_path_under_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), EVALKIT_TRITON="1",
               EVALKIT_TRITON_JACOBI="1")
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["finite"], got
    # the same flow up to float32 rounding (2 pairs of 48x64, warped outside the frame at the
    # borders; 1 pair of 33x47: odd sizes, pyramid levels of odd sizes, its 9 Jacobi
    # iterations in one launch on tiles of 14x46 pixels, then 5)
    assert got["max_diff"] < 1e-4, got
    assert got["odd_max_diff"] < 1e-4, got
    # batch-invariant: a pair computed alone is the same pair computed beside another (and the
    # tiled kernel doing 3 Jacobi iterations per launch, used for the pair alone, gives the
    # same values as one iteration per launch)
    assert got["batch_diff"] == 0.0, got
    # and it is a real flow: the 4.6 px shift is there, the error against the truth is small
    assert got["median_shift"] > 4.0, got
    for e_ref, e_fused in zip(got["epe_ref"], got["epe_fused"]):
        assert e_fused < 0.5 and abs(e_fused - e_ref) < 1e-4, got


def test_fused_path_is_chosen_on_cuda_only_and_can_be_switched_off(monkeypatch):
    monkeypatch.delenv("EVALKIT_TRITON", raising=False)
    assert not torchflow.use_fused("cpu")
    assert torchflow.use_fused(torch.device("cuda"))           # triton imports here
    assert not torchflow.use_fused("cuda", fused=False)
    assert torchflow.use_fused("cpu", fused=True)
    monkeypatch.setenv("EVALKIT_TRITON", "0")
    assert not torchflow.use_fused("cuda")
    assert torchflow.use_fused("cuda", fused=True)
    from metrics._triton_flow import jacobi_per_launch

    monkeypatch.delenv("EVALKIT_TRITON_JACOBI", raising=False)
    assert jacobi_per_launch() == 1
    monkeypatch.setenv("EVALKIT_TRITON_JACOBI", "3")
    assert jacobi_per_launch() == 3
    monkeypatch.setenv("EVALKIT_TRITON_JACOBI", "three")
    assert jacobi_per_launch() == 1


def test_default_fused_path_that_cannot_run_falls_back_to_the_torch_path(monkeypatch):
    """No GPU here: the kernels cannot launch on CPU tensors outside the interpreter, which is
    what a Triton that cannot compile on a user's machine looks like to torch_flow."""
    from metrics._common import TritonFallback

    fam = TritonFallback(torchflow.TRITON_FUSED.family, torchflow.TRITON_FUSED.load, strict=False)
    monkeypatch.setattr(torchflow, "TRITON_FUSED", fam)      # fresh: nothing failed yet
    real = torchflow.use_fused
    monkeypatch.setattr(torchflow, "use_fused",
                        lambda dev, fused=None: (fam.kernel() is not None) if fused is None else real(dev, fused))
    g = torch.Generator().manual_seed(0)
    src = (torch.rand((1, 40, 48), generator=g) * 255).round().to(torch.uint8)
    dst = torch.roll(src, 2, 2)
    want = torchflow.torch_flow(src, dst, fused=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torchflow.torch_flow(src, dst)
    [w] = seen                                           # one warning, naming the kernels and the error
    assert w.category is RuntimeWarning
    assert "fused flow kernels (warp_step) failed" in str(w.message) and "torch path" in str(w.message)
    assert fam.failed and fam.failed.split(":")[0] in str(w.message)
    assert torch.equal(got, want)
    with warnings.catch_warnings():                      # from now on the torch path, no warning
        warnings.simplefilter("error")
        torch.testing.assert_close(torchflow.torch_flow(src, dst), want, rtol=0, atol=0)
    with pytest.raises(Exception):                       # forced: the error is not hidden
        torchflow.torch_flow(src, dst, fused=True)
