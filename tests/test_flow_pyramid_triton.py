"""The Triton pyramid of the fused torch flow (metrics/_triton_pyramid.py) against the torch
path's ``_down`` and ``_upsample``: Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess:
it must be set before triton is imported) runs the kernels on CPU tensors, at small and odd sizes.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, run_interpreted
from numerics import ab_tolerance, gamma

pytestmark = pytest.mark.slow  # Triton's interpreter

pytest.importorskip("triton")

SCRIPT = r"""
import json
import torch
from numerics import ab_tolerance, flow_tolerance, gamma
from skimage import data as skdata
from evalkit.metrics import _triton_pyramid as tp, torchflow as tf
from evalkit.testing.flowcheck import photo_grey, synthetic_pair

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
diff = lambda a, b: float((a - b).abs().max())  # noqa: E731
got = {"down": 0.0, "down_scaled": 0.0, "upsample": 0.0, "shapes": True}
# each result against its tolerance (tests/numerics.py), as a ratio: <= 1 passes.
# down: a 5x5 binomial blur (weights k/16 summing to 1) of values in [0, 1]: 25 products and
# their sum in any order, gamma(26) of 1 on each path, one more rounding for the 1/255 scale
down_tol = ab_tolerance(gamma(27))
# upsample: bilinear samples of a flow at coordinates normalised and un-normalised (4 roundings
# of coordinates up to the side: gamma(4) side pixels, times the flow's steps between
# neighbours), the interpolation's 3 roundings of values up to max |flow|, then x2 (exact)
def up_tol(fl, h, w):
    step = max(float((fl[..., 1:, :] - fl[..., :-1, :]).abs().max()), float((fl[..., 1:] - fl[..., :-1]).abs().max()))
    return 2 * ab_tolerance(gamma(4) * max(h, w) * step + gamma(3) * float(fl.abs().max()))
# 33x47 -> 17x24 -> 9x12 -> 5x6: odd and even sides at every level; 3 pairs per launch
for h, w in [(33, 47), (18, 17)]:
    u8 = [(torch.rand((3, 1, h, w), generator=g) * 255).round().to(torch.uint8) for _ in range(2)]
    ref = [tf._down(x.float() * (1.0 / 255)) for x in u8]
    for inp in (u8, [x.float() for x in u8], [x.double() for x in u8]):   # 8-bit units, any dtype
        lvl = tp.down(*inp, scale=True)
        got["down_scaled"] = max(got["down_scaled"], *(diff(a, b) / down_tol for a, b in zip(lvl, ref)))
    for _ in range(3):                        # the levels above, from the kernel's own levels
        nxt, ref = tp.down(*lvl), [tf._down(x) for x in lvl]
        got["shapes"] &= all(a.shape == b.shape for a, b in zip(nxt, ref))
        got["down"] = max(got["down"], *(diff(a, b) / down_tol for a, b in zip(nxt, ref)))
        lvl = nxt
# upsampling: to twice the size less one, to twice the size (the last row and column clamped
# at the border), and odd sizes
for (ph, pw), (h, w) in [((17, 24), (33, 47)), ((9, 12), (17, 24)), ((20, 32), (40, 64)),
                         ((5, 6), (9, 12))]:
    fl = torch.randn((2, 2, ph, pw), generator=g) * 3
    up, ref = tp.upsample(fl, h, w), tf._upsample(fl, h, w)
    got["shapes"] &= up.shape == ref.shape
    got["upsample"] = max(got["upsample"], diff(up, ref) / up_tol(fl, h, w))

# the whole flow at the default finest level (1/2 scale, then upsampled to the frames): the
# pyramid's kernels are called once per level for both images, level 1 from the uint8 frames
calls = []
real_down = tp.down
def spy(a, b, scale=False):
    calls.append((str(a.dtype), tuple(a.shape), scale))
    return real_down(a, b, scale)
tp.down = spy
astro, coffee = photo_grey(skdata.astronaut(), 0.4), photo_grey(skdata.coffee(), 0.4)
t = lambda a: torch.from_numpy(a)  # noqa: E731
pairs = [synthetic_pair(astro, (48, 64), shift=(4.6, 2.2)),
         synthetic_pair(coffee, (48, 64), zoom=1.04, shift=(0.4, -0.3))]
src, dst = torch.stack([t(p[0]) for p in pairs]), torch.stack([t(p[1]) for p in pairs])
ref = tf.torch_flow(src, dst, fused=False)
fused = tf.torch_flow(src, dst, fused=True, batch_pixels=48 * 64)    # one pair per batch
got["calls"] = calls
odd = synthetic_pair(coffee, (35, 50), angle=2.0, shift=(1.5, -1.0))   # 35x50 -> 18x25 -> 9x13
oref = tf.torch_flow(t(odd[0])[None], t(odd[1])[None], fused=False)
ofused = tf.torch_flow(t(odd[0])[None], t(odd[1])[None], fused=True)
# the whole iterative flow: numerics.flow_tolerance (2 levels at 1/2 scale and above)
got["flow_max_diff"] = diff(ref, fused) / flow_tolerance(float(ref.abs().max()), levels=2)
got["odd_flow_max_diff"] = diff(oref, ofused) / flow_tolerance(float(oref.abs().max()), levels=2)
got["finite"] = bool(fused.isfinite().all() and ofused.isfinite().all())
got["median_shift"] = float(fused[0].norm(dim=0).median())
print(json.dumps(got))
"""


def test_pyramid_kernels_match_the_torch_path_under_the_triton_interpreter():
    got = run_interpreted(SCRIPT, path=(ROOT / "tests",), EVALKIT_TRITON="1")
    print(got)
    assert got["shapes"], got
    # each difference over its derived tolerance (the script's comments): float32 rounding only
    # (torch's CPU grid_sample computes the source coordinate as (g + 1) * ((size - 1) / 2),
    # CUDA's and the kernel's as ((g + 1) / 2) * (size - 1))
    assert got["down"] <= 1 and got["down_scaled"] <= 1, got
    assert got["upsample"] <= 1, got
    # one launch per level for both images of every pair: level 1 from the uint8 frames (scaled
    # in the kernel); 48x64 (two batches of one pair) and 35x50 have 2 levels (1/2 scale)
    assert got["calls"] == [["torch.uint8", [1, 1, 48, 64], True]] * 2 + [
        ["torch.uint8", [1, 1, 35, 50], True]
    ], got
    # the whole flow as in tests/test_flow_triton.py
    assert got["finite"] and got["median_shift"] > 4.0, got
    assert got["flow_max_diff"] <= 1 and got["odd_flow_max_diff"] <= 1, got


def test_pyramid_kernels_refuse_mismatched_inputs_in_one_line():
    from evalkit.metrics import _triton_pyramid as tp

    a = torch.zeros((2, 1, 8, 8))
    with pytest.raises(ValueError, match="one size"):
        tp.down(a, torch.zeros((2, 1, 8, 9)))
    with pytest.raises(ValueError, match="float32 levels"):
        tp.down(a.double(), a.double())
    with pytest.raises(ValueError, match="contiguous float32"):
        tp.upsample(torch.zeros((2, 2, 4, 4)), 8, 8, out=torch.zeros((2, 2, 8, 7)))
    with pytest.raises(ValueError, match="int32"):
        big = torch.zeros((1, 1, 1, 1), dtype=torch.uint8).expand(1 << 20, 1, 40, 64)
        tp.down(big, big, scale=True)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA: the compiled kernels against torch's CUDA ops"
)
def test_pyramid_kernels_match_torch_on_cuda():
    """On a GPU (``pytest tests/test_flow_pyramid_triton.py``): the compiled kernels at 1280x720
    against torch's CUDA ``_down`` and ``_upsample``, at every level (expected bit-identical:
    the same float32 operations and FMAs; asserted up to float32 rounding)."""
    from evalkit.metrics import _triton_pyramid as tp
    from evalkit.metrics import torchflow as tf

    g = torch.Generator(device="cuda").manual_seed(0)
    u8 = [
        torch.randint(0, 256, (4, 1, 720, 1280), generator=g, device="cuda", dtype=torch.uint8)
        for _ in range(2)
    ]
    lvl, ref = tp.down(*u8, scale=True), [tf._down(x.float() * (1.0 / 255)) for x in u8]
    down_tol = ab_tolerance(gamma(27))  # as in SCRIPT
    diffs = {"down_scaled": max(float((a - b).abs().max()) for a, b in zip(lvl, ref)) / down_tol}
    sizes = [(720, 1280), (360, 640)]
    for k in range(4):
        nxt, ref = tp.down(*lvl), [tf._down(x) for x in lvl]
        diffs[f"down{k + 2}"] = max(float((a - b).abs().max()) for a, b in zip(nxt, ref)) / down_tol
        sizes.append(tuple(nxt[0].shape[2:]))
        lvl = nxt
    for (ph, pw), (h, w) in zip(sizes[1:], sizes):
        fl = torch.randn((4, 2, ph, pw), generator=g, device="cuda") * 8
        step = max(
            float((fl[..., 1:, :] - fl[..., :-1, :]).abs().max()),
            float((fl[..., 1:] - fl[..., :-1]).abs().max()),
        )
        tol = 2 * ab_tolerance(gamma(4) * max(h, w) * step + gamma(3) * float(fl.abs().max()))
        diffs[f"up{w}x{h}"] = float((tp.upsample(fl, h, w) - tf._upsample(fl, h, w)).abs().max()) / tol
    print(diffs)
    assert all(v <= 1 for v in diffs.values()), diffs  # each over its tolerance
