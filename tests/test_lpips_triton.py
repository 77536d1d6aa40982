"""The Triton LPIPS head (metrics/_triton_lpips.py: the normalisation of the raw trunk features,
the weighted channel sum and the spatial means in one pass per layer) against the torch path
it replaces on CUDA (``normalize_tensor`` in ``LPIPS.features``, then ``LPIPS.distance``).

The kernels run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, in a
subprocess: it must be set before triton is imported), at small sizes. A GPU A/B of the
pipeline: ``benchmarks/bench_pipeline.py --variants ours,ours:EVALKIT_TRITON_LPIPS=0``.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import ROOT, run_interpreted
from numerics import U32, ab_tolerance

from evalkit.metrics import perceptual
from evalkit.metrics._common import TritonFallback, fast_paths

pytestmark = pytest.mark.slow  # Triton's interpreter

TESTS = ROOT / "tests"

pytest.importorskip("triton")

SCRIPT = r"""
import json
import numpy as np
import torch
from evalkit.metrics._common import fast_paths
from evalkit.metrics._triton_lpips import lpips_distance
from evalkit.metrics.perceptual import get_model, lpips
from evalkit.metrics.stream import evaluate_pair
from evalkit.metrics.temporal import tlp
from numerics import lpips_head_bound

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
m = get_model("alex", "cpu")
weights = [lin.weight.reshape(-1) for lin in m.lins]
out = {}


def pairs(n, h, w):
    # a smooth texture and small to large distortions (noise, a shift, an inverted frame)
    a = torch.nn.functional.interpolate(torch.rand((n, 3, h // 4 + 2, w // 4 + 2), generator=g),
                                        size=(h, w), mode="bilinear", align_corners=False)
    a = (a + 0.2 * torch.rand((n, 3, h, w), generator=g)).clamp(0, 1)
    b = (a + 0.1 * torch.randn((n, 3, h, w), generator=g)).clamp(0, 1)
    b[0] = torch.roll(a[0], (1, 2), (1, 2))
    b[-1] = 1 - a[-1]
    return a, b


def compare(a, b):
    n = a.shape[0]
    want = m.distance(*(lambda f: ([t[:n] for t in f], [t[n:] for t in f]))(m.features(torch.cat([a, b]))))
    raw = m.features(torch.cat([a, b]), normalised=False)
    fa, fb = [t[:n] for t in raw], [t[n:] for t in raw]
    got = lpips_distance(fa, fb, weights, 1e-10)                  # channels-last (the CPU's)
    dense = lpips_distance([t.contiguous() for t in fa], [t.contiguous() for t in fb], weights, 1e-10)
    return {"got": got.tolist(), "want": want.tolist(), "dense": dense.tolist(),
            "bound": lpips_head_bound(fa, fb, weights, 1e-10).tolist(),
            "channels_last": bool(raw[0].is_contiguous(memory_format=torch.channels_last)
                                  and not raw[0].is_contiguous()),
            "alone": [bool(torch.equal(lpips_distance([t[i:i + 1] for t in fa], [t[i:i + 1] for t in fb],
                                                      weights, 1e-10), got[i:i + 1])) for i in range(n)]}


a, b = pairs(3, 64, 64)
out["64x64"] = compare(a, b)
a2, b2 = pairs(2, 45, 70)
out["70x45"] = compare(a2, b2)
# a frame against itself: every difference is 0 exactly
raw = m.features(a2, normalised=False)
out["self"] = lpips_distance(raw, raw, weights, 1e-10).tolist()
# the public functions with the head forced on (any device) and off
with fast_paths(triton_lpips=True):
    on = [lpips(a, b).tolist(), tlp(a, b).tolist()]
with fast_paths(triton_lpips=False):
    off = [lpips(a, b).tolist(), tlp(a, b).tolist()]
def head_bound(x, y):
    return lpips_head_bound(m.features(x, normalised=False), m.features(y, normalised=False), weights, 1e-10)


# the rounding bounds of the same distances: LPIPS of each pair, and each clip's frame-to-frame
# distance (tLP is |d_a - d_b|: the bounds of both)
def bounds(x, y):
    steps = head_bound(x[1:], x[:-1]) + head_bound(y[1:], y[:-1])
    return head_bound(x, y).tolist(), steps.tolist()


out["public"] = {"on": on, "off": off, "bound": bounds(a, b)}

# the stream end to end: raw features carried across chunks of 2 for tLP
rng = np.random.default_rng(3)
tex = rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)
tex = ((tex.astype(np.float32) + np.roll(tex, 1, 0) + np.roll(tex, 1, 1)) / 3).astype(np.uint8)
fa_ = np.stack([tex[2 + i:42 + i, 3 + 2 * i:51 + 2 * i] for i in range(5)])
fb_ = np.clip(fa_.astype(int) + rng.integers(-12, 13, fa_.shape), 0, 255).astype(np.uint8)
runs = {}
for flag in (False, True):
    with fast_paths(triton_lpips=flag):
        runs[flag] = evaluate_pair(iter(fa_), iter(fb_), device="cpu", chunk=2, flow="torch")["records"]
keys = ["lpips", "tlp"]
chw = lambda f: torch.from_numpy(f).permute(0, 3, 1, 2).float() / 255  # noqa: E731
out["stream"] = {"bound": bounds(chw(fa_), chw(fb_)),
                 "got": [[r.get(k) for r in runs[True]] for k in keys],
                 "want": [[r.get(k) for r in runs[False]] for k in keys],
                 "others_equal": all({k: v for k, v in r1.items() if k not in keys} ==
                                     {k: v for k, v in r0.items() if k not in keys}
                                     for r0, r1 in zip(runs[False], runs[True]))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, path=(TESTS,), drop=("EVALKIT_TRITON", "EVALKIT_TRITON_LPIPS"))


# Tolerances: both paths take the same float32 raw features and do the same operations per
# element (normalise, subtract, square, weight), summing channels and pixels in other orders.
# Each stays within numerics.lpips_head_bound of the exact distance of those features (Higham's
# gamma_n of float32 for every sum, the cancellation in n_a - n_b included), so two differ by at
# most twice that (numerics.ab_tolerance), per frame; a tLP |d_a - d_b| by twice the bounds of
# d_a and d_b, plus the subtraction's own rounding.
def assert_within(got, want, bound, *, extra=None):
    tol = ab_tolerance(np.asarray(bound)) + (0 if extra is None else U32 * np.abs(want))
    assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= tol), (got, want, tol)


@pytest.mark.parametrize("size", ["64x64", "70x45"])
def test_head_matches_the_torch_distance(interpreted, size):
    r = interpreted[size]
    assert r["channels_last"]
    assert_within(r["got"], r["want"], r["bound"])
    # the same pixels through the NCHW strides (the GPU's layout): the same numbers here (the
    # interpreter sums in one order; compiled, the layout may change the order of the sums)
    assert r["dense"] == r["got"]
    # real cases: a 1-2 pixel shift, noise, an inverted frame (larger)
    assert min(r["want"]) > 1e-3 and r["want"][-1] > 2 * max(r["want"][:-1])


def test_a_pair_gives_the_same_bits_in_any_batch(interpreted):
    assert all(interpreted["64x64"]["alone"]) and all(interpreted["70x45"]["alone"])


def test_a_frame_against_itself_is_zero(interpreted):
    assert interpreted["self"] == [0.0, 0.0]


def test_public_lpips_and_tlp_agree_with_the_head_on_or_off(interpreted):
    r = interpreted["public"]
    assert_within(r["on"][0], r["off"][0], r["bound"][0])
    assert_within(r["on"][1], r["off"][1], r["bound"][1], extra=True)
    assert max(r["off"][1]) > 0


def test_stream_lpips_and_tlp_with_carried_raw_features(interpreted):
    r = interpreted["stream"]
    assert r["others_equal"]
    assert_within(r["got"][0], r["want"][0], r["bound"][0])
    # tLP of frames 1..4 (frames 2 and 4 start a chunk: LPIPS against the carried frame)
    t_got, t_want = r["got"][1][1:], r["want"][1][1:]
    assert r["want"][1][0] is None or np.isnan(r["want"][1][0])
    assert_within(t_got, t_want, r["bound"][1], extra=True)
    assert min(t_want) > 0


def test_head_is_chosen_on_cuda_by_default_and_not_when_off(monkeypatch):
    monkeypatch.delenv("EVALKIT_TRITON", raising=False)
    monkeypatch.delenv("EVALKIT_TRITON_LPIPS", raising=False)
    cuda, cpu = SimpleNamespace(device=torch.device("cuda")), SimpleNamespace(device=torch.device("cpu"))
    pick = perceptual.LPIPS._head_kernel
    assert pick(cpu) is None and pick(cuda) is not None  # triton imports here
    with fast_paths(triton_lpips=False):
        assert pick(cuda) is None
    with fast_paths(triton_lpips=True):
        assert pick(cpu) is not None
    for var in ("EVALKIT_TRITON", "EVALKIT_TRITON_LPIPS"):
        monkeypatch.setenv(var, "0")
        assert pick(cuda) is None
        monkeypatch.delenv(var)
    assert pick(cuda) is not None


def test_head_that_cannot_run_falls_back_to_the_torch_numbers_once(monkeypatch):
    """Outside the interpreter the kernels cannot launch on CPU tensors, which is what a Triton
    that cannot compile on a user's GPU looks like: one warning naming the kernels, then the
    torch path's numbers exactly (the raw features normalised as ``features`` does)."""
    fam = TritonFallback(perceptual.TRITON_LPIPS.family, perceptual.TRITON_LPIPS.load, strict=False)
    monkeypatch.setattr(perceptual, "TRITON_LPIPS", fam)  # fresh: nothing failed yet
    gen = torch.Generator().manual_seed(1)
    a, b = torch.rand((2, 3, 40, 48), generator=gen), torch.rand((2, 3, 40, 48), generator=gen)
    m = perceptual.get_model("alex", "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fast_paths(triton_lpips=False):
            off = m(a, b)
    assert fam.failed is None and not fam.ran
    with fast_paths(triton_lpips=True):
        with pytest.warns(RuntimeWarning, match=r"lpips_distance\) failed .*torch path"):
            got = m(a, b)
        assert fam.failed and fam.kernel() is None and not m.fused()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = m(a, b)
    assert torch.equal(got, off) and torch.equal(again, off)
