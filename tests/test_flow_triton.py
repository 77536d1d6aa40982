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


PAIRS = r"""
import json
import os
import torch
from metrics import _triton_flow as m

torch.set_num_threads(1)


class Count:                                  # counts a kernel's launches: kernel[grid](...)
    def __init__(self, kernel):
        self.kernel, self.n = kernel, 0

    def __getitem__(self, grid):
        self.n += 1
        return self.kernel[grid]


m._jacobi_kernel, m._jacobi2_kernel = Count(m._jacobi_kernel), Count(m._jacobi2_kernel)
gen = torch.Generator().manual_seed(1)
g = torch.tensor([0.25, 0.5, 0.25])
out = []
# inner - 1 Jacobi iterations: 14 (7 pairs), 3 (a pair, then one), 2 (a pair, the last);
# 33x47 in one tile of 64x64 per image or in tiles of 8x32 (the GPU's: several across and down),
# with lanes past the image; images of 1-3 pixels across
for n, h, w, inner, tile in [(2, 33, 47, 15, None), (2, 33, 47, 4, (8, 32)), (1, 33, 47, 3, None),
                             (1, 1, 5, 3, None), (1, 5, 1, 3, None), (1, 2, 3, 5, (2, 2))]:
    m.INTERPRET_TILE = tile
    # gradients of ~1 against alpha = 3: the neighbours' mean weighs in the update (with
    # 0-255 noise it is lost in the rounding of the constant term)
    i0 = torch.rand((n, 1, h, w), generator=gen)
    i1 = torch.roll(i0, 1, 3) + torch.rand((n, 1, h, w), generator=gen) * 0.1
    flow = torch.randn((n, 2, h, w), generator=gen)
    row = {"case": f"{n}x{h}x{w} inner {inner}"}
    for key, jacobi2 in (("pairs", None), ("single", "0")):
        if jacobi2 is None:
            os.environ.pop("EVALKIT_TRITON_JACOBI2", None)
        else:
            os.environ["EVALKIT_TRITON_JACOBI2"] = jacobi2
        m._jacobi_kernel.n = m._jacobi2_kernel.n = 0
        row[key] = m.warp_step(i0, i1, flow, g, inner, 3.0)
        row[key + "_launches"] = [m._jacobi2_kernel.n, m._jacobi_kernel.n]
    pairs, single = row.pop("pairs"), row.pop("single")
    row["equal"] = torch.equal(pairs, single)
    row["moved"] = float((pairs - flow).abs().max())
    out.append(row)
os.environ.pop("EVALKIT_TRITON_JACOBI2", None)
os.environ["EVALKIT_TRITON_JACOBI"] = "3"           # the tiled kernel: no pairs
m._jacobi_kernel.n = m._jacobi2_kernel.n = 0
m.warp_step(i0, i1, flow, g, 6, 3.0)
print(json.dumps({"rows": out, "tiled_launches": [m._jacobi2_kernel.n, m._jacobi_kernel.n]}))
"""


def test_jacobi_iterations_in_pairs_are_bit_identical_to_one_per_launch():
    """_jacobi2_kernel (two iterations per launch, the first recomputed at the neighbours) gives
    the same floats as two _jacobi_kernel launches, borders and FINAL included."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), EVALKIT_TRITON_JACOBI="1")
    run = subprocess.run([sys.executable, "-c", PAIRS], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["tiled_launches"] == [0, 0], got                 # EVALKIT_TRITON_JACOBI=3: as before
    for row in got["rows"]:
        inner = int(row["case"].split()[-1])
        assert row["equal"], row
        assert row["moved"] > 0.1, row                          # the iterations did something
        assert row["pairs_launches"] == [(inner - 1) // 2, (inner - 1) % 2], row
        assert row["single_launches"] == [0, inner - 1], row


SM90 = r"""
import json
import re
import triton
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from metrics import _triton_flow as m

if "nvidia" not in backends:
    print(json.dumps({"skip": "no nvidia backend in this triton"}))
    raise SystemExit
ptr, i32 = "*fp32", "i32"
one = {"d_ptr": ptr, "coef_ptr": ptr, "fl_ptr": ptr, "out_ptr": ptr, "total": i32, "H": i32,
       "W": i32, "alpha": "fp32", "FINAL": "constexpr", "BLOCK": "constexpr"}
two = {"d_ptr": ptr, "coef_ptr": ptr, "fl_ptr": ptr, "out_ptr": ptr, "H": i32, "W": i32,
       "tiles_y": i32, "alpha": "fp32", "FINAL": "constexpr", "TY": "constexpr", "TX": "constexpr"}
ty, tx = m.JACOBI2_TILE
out = {}
for name, fn, sig, const in [
        ("one", m._jacobi_kernel, one, {"FINAL": False, "BLOCK": ty * tx}),
        ("two", m._jacobi2_kernel, two, {"FINAL": False, "TY": ty, "TX": tx}),
        ("two_final", m._jacobi2_kernel, two, {"FINAL": True, "TY": ty, "TX": tx})]:
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                       target=GPUTarget("cuda", 90, 32))
    ptx = k.asm["ptx"]
    out[name] = {"cubin": len(k.asm["cubin"]),
                 "fma": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
                 "add": len(re.findall(r"\b(?:add|sub)(?:\.rn)?\.f32\b", ptx)),
                 "mul_quarter": len(re.findall(r"\bmul(?:\.rn)?\.f32\b.*0f3E800000", ptx))}
print(json.dumps(out))
"""


def test_jacobi_pairs_compile_for_sm90_with_the_same_contractions(tmp_path):
    """Offline, no GPU: the kernels compile to sm_90 with the local Triton, and the compiler
    contracts the pair's six updates (5 first, 1 second) exactly as the single kernel's one: six
    times its multiply-adds, additions and quarter-means, nothing else fused."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", SM90], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    one, two, final = got["one"], got["two"], got["two_final"]
    assert min(one["cubin"], two["cubin"], final["cubin"]) > 0, got
    assert one["fma"] > 0 and one["mul_quarter"] > 0, got                 # contraction happens
    for key in ("fma", "add", "mul_quarter"):
        assert two[key] == 6 * one[key], (key, got)
    assert final["fma"] == two["fma"] and final["add"] > two["add"], got  # + flow, not fused


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled kernels")
def test_jacobi_iterations_in_pairs_are_bit_identical_on_cuda(monkeypatch):
    """The same on the GPU, where the compiler contracts multiply-adds (the interpreter does
    not): warp steps at realistic and odd sizes, and whole flows."""
    from metrics._triton_flow import warp_step

    gen = torch.Generator().manual_seed(2)
    g = torch.tensor([0.25, 0.5, 0.25], device="cuda")
    for n, h, w in ((2, 360, 640), (3, 181, 323)):
        i0 = torch.rand((n, 1, h, w), generator=gen).cuda()
        i1 = torch.roll(i0, 2, 3) + torch.rand((n, 1, h, w), generator=gen).cuda() * 0.1
        flow = torch.randn((n, 2, h, w), generator=gen).cuda()
        for inner in (15, 4, 3):
            a = warp_step(i0, i1, flow, g, inner, 3.0, jacobi=1, pairs=True)
            b = warp_step(i0, i1, flow, g, inner, 3.0, jacobi=1, pairs=False)
            assert torch.equal(a, b), (n, h, w, inner, float((a - b).abs().max()))
    src = (torch.rand((4, 270, 480), generator=gen) * 255).to(torch.uint8).cuda()
    dst = torch.roll(src, (1, 3), (1, 2))
    monkeypatch.setenv("EVALKIT_TRITON_JACOBI", "1")
    monkeypatch.delenv("EVALKIT_TRITON_JACOBI2", raising=False)
    pairs = torchflow.torch_flow(src, dst, fused=True)
    monkeypatch.setenv("EVALKIT_TRITON_JACOBI2", "0")
    assert torch.equal(pairs, torchflow.torch_flow(src, dst, fused=True))


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
    from metrics._triton_flow import jacobi2_enabled

    monkeypatch.delenv("EVALKIT_TRITON_JACOBI2", raising=False)
    assert jacobi2_enabled()
    for value, on in (("0", False), (" 0 ", False), ("1", True), ("", True)):
        monkeypatch.setenv("EVALKIT_TRITON_JACOBI2", value)
        assert jacobi2_enabled() is on, value


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
