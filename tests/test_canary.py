"""The shipped canary pipeline (models/canary) on the CPU: loading, determinism, styles.

Real weights, the smoke clips (8 frames, 64x64), few steps; no mocks, no network.
``EVALKIT_CANARY_MODEL=DIR`` runs the same tests against another pipeline folder (a freshly
trained one, before it replaces the shipped weights).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: E402  (torch and diffusers are dependencies: no skipping without them)

from evalkit.canary import MODEL_DIR as SHIPPED_DIR  # noqa: E402
from evalkit.canary import STYLES, CanaryPipeline, PromptError, load_pipeline  # noqa: E402
from evalkit.canary.styles import apply_style_frames  # noqa: E402
from evalkit.video import ClipReader  # noqa: E402

pytestmark = pytest.mark.slow  # the canary pipeline on the CPU

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "datasets" / "smoke" / "clips"
FAST = dict(strength=0.6, num_inference_steps=6, guidance_scale=4.0)
MODEL_DIR = Path(os.environ.get("EVALKIT_CANARY_MODEL") or SHIPPED_DIR)


@pytest.fixture(scope="module")
def pipe():
    return load_pipeline(MODEL_DIR, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def clip():
    path = SMOKE / "astronaut_pan.mkv"  # committed with the repository
    assert path.is_file(), f"{path} missing (python datasets/make_clips.py --suite smoke)"
    return ClipReader(str(path)).read()


def _render(pipe, frames, prompt, seed=0, **kw):
    p = dict(FAST)
    p.update(kw)
    return pipe(
        prompt=prompt, video=frames, generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **p
    ).frames[0]


def test_shipped_folder_is_fp16_and_small():
    index = json.loads((MODEL_DIR / "model_index.json").read_text())
    assert index["_class_name"] == "CanaryPipeline"
    for name in ("vae", "text_encoder", "unet"):
        assert index[name] == ["evalkit.canary", index[name][1]]
    from safetensors import safe_open

    total = 0
    for f in MODEL_DIR.rglob("*"):
        if f.is_file():
            total += f.stat().st_size
        if f.suffix == ".safetensors":
            with safe_open(str(f), "pt") as st:
                dtypes = {st.get_slice(k).get_dtype() for k in st.keys()}
            assert dtypes == {"F16"}, (f, dtypes)
    assert total <= 30 * 1024 * 1024


def test_loads_offline_in_a_fresh_process_through_diffusers():
    code = (
        "import evalkit.canary, torch; from diffusers import DiffusionPipeline;"
        f"p = DiffusionPipeline.from_pretrained({str(MODEL_DIR)!r}, torch_dtype=torch.float32,"
        " local_files_only=True);"
        "print(type(p).__name__, type(p.unet).__name__, type(p.scheduler).__name__, p.unet.dtype)"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", DIFFUSERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    env.setdefault("PYTHONPATH", str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["CanaryPipeline", "CanaryUNet", "DDIMScheduler", "torch.float32"]


def test_output_contract_and_determinism(pipe, clip):
    a = _render(pipe, clip, "watercolor", seed=0)
    b = _render(pipe, list(clip), "watercolor", seed=0)  # a list of frames works too
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == clip.shape
    assert 0.0 <= a.min() and a.max() <= 1.0
    assert np.array_equal(a, b)
    c = _render(pipe, clip, "watercolor", seed=1)
    assert not np.array_equal(a, c)


def test_smoke_suite_deterministic_every_clip(pipe):
    clips = sorted(SMOKE.glob("*.mkv"))
    assert len(clips) == 2, clips  # committed with the repository
    for path in clips:
        frames = ClipReader(str(path)).read()
        x = _render(pipe, frames, "night", seed=3)
        y = _render(pipe, frames, "night", seed=3)
        assert np.array_equal(x, y), path.name


def test_unknown_word_lists_vocabulary(pipe, clip):
    with pytest.raises(PromptError) as e:
        _render(pipe, clip, "oil painting")
    msg = str(e.value)
    assert "'oil'" in msg and "watercolor" in msg and "thermal" in msg


@pytest.mark.parametrize("style", list(STYLES))
def test_style_moves_output_toward_classical_target(pipe, clip, style):
    target = apply_style_frames(style, clip).astype(np.float32) / 255.0
    source = clip.astype(np.float32) / 255.0
    out = _render(pipe, clip, style)
    before = np.abs(source - target).mean()
    after = np.abs(out - target).mean()
    assert after < before, (style, before, after)


def test_pipeline_class_is_registered_with_diffusers():
    import diffusers

    assert getattr(diffusers, "CanaryPipeline") is CanaryPipeline


def test_guidance_interval_default_comes_from_the_folder(pipe, clip):
    """``guidance_steps`` defaults to the value saved in model_index.json (2 when absent)."""
    index = json.loads((MODEL_DIR / "model_index.json").read_text())
    assert pipe.config.guidance_steps == index.get("guidance_steps", 2)
    g = pipe.config.guidance_steps
    a = _render(pipe, clip[:2], "night")
    b = _render(pipe, clip[:2], "night", guidance_steps=g)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError):
        _render(pipe, clip[:2], "night", guidance_steps="all")


def test_source_conditioned_decoder_starts_as_the_plain_decoder():
    """Extending a plain decoder with the source branches changes nothing until trained."""
    from evalkit.canary import CanaryAutoencoder

    torch.manual_seed(0)
    plain = CanaryAutoencoder().eval()
    ext = CanaryAutoencoder.from_config(plain.config, source_channels=8).eval()
    missing, unexpected = ext.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and {k.split(".")[0] for k in missing} == {"src_in", "refine1", "refine2"}
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        z = plain.encode(x).latents
        assert torch.equal(plain.decode(z).sample, ext.decode(z, source=x).sample)


def test_unet_extra_blocks_keep_the_plain_layout():
    """``blocks=(1, 1)`` is the original layout (same state-dict keys); more blocks add keys."""
    from evalkit.canary import CanaryUNet

    plain = set(CanaryUNet().state_dict())
    big = CanaryUNet(channels=(32, 64), blocks=(2, 3), num_heads=2)
    keys = set(big.state_dict())
    assert plain <= keys
    assert {k.split(".")[0] for k in keys - plain} == {"extra1", "extra2", "extra3", "extra4"}
    z = torch.randn(2, 8, 16, 16)
    te_out = torch.randn(2, 8, 128), torch.randn(2, 128), torch.ones(2, 8, dtype=torch.bool)
    out = big(z, torch.tensor([10, 500]), z, *te_out, num_frames=2).sample
    assert out.shape == z.shape


def test_gradient_energy_loss_asks_for_texture_not_its_phase():
    """The v3 sharpness terms: the per-pixel gradient L1 punishes a texture one pixel off as
    hard as a missing one (so an uncertain model blurs); the local gradient energy does not
    punish the shift but does punish the blur."""
    from conftest import load_tool

    t = load_tool("canary_train")
    gradient_energy_loss, gradient_loss = t.gradient_energy_loss, t.gradient_loss

    g = torch.Generator().manual_seed(0)
    tgt = torch.rand(2, 3, 64, 64, generator=g) * 2 - 1
    shifted = torch.roll(tgt, shifts=1, dims=-1)
    blurred = torch.nn.functional.avg_pool2d(tgt, 3, stride=1, padding=1, count_include_pad=False)
    assert gradient_loss(tgt, tgt).item() == 0 and gradient_energy_loss(tgt, tgt).item() == 0
    assert gradient_loss(shifted, tgt) > 0.5 * gradient_loss(blurred, tgt)
    assert gradient_energy_loss(shifted, tgt) < 0.1 * gradient_energy_loss(blurred, tgt)


def test_training_continues_a_saved_pipeline(tmp_path):
    """`train.py train --init-from DIR` starts from DIR's denoiser and text encoder, runs the
    v3 losses and saves a pipeline folder that loads and renders (CPU, random photographs,
    two steps per phase)."""
    rng = np.random.default_rng(0)
    photos = tmp_path / "photos.npz"
    np.savez(
        photos,
        a=rng.integers(0, 256, (160, 200, 3), dtype=np.uint8),
        b=rng.integers(0, 256, (180, 170, 3), dtype=np.uint8),
    )
    out = tmp_path / "canary"
    cmd = [
        sys.executable,
        str(REPO / "tools/canary_train.py"),
        "train",
        "--photos",
        str(photos),
        "--out",
        str(out),
        "--reuse-vae",
        str(SHIPPED_DIR),
        "--init-from",
        str(SHIPPED_DIR),
        "--device",
        "cpu",
        "--ae-steps",
        "2",
        "--steps",
        "2",
        "--workers",
        "0",
        "--batch",
        "2",
        "--ae-batch",
        "4",
        "--min-items",
        "4",
        "--buffer",
        "8",
        "--item-batch",
        "2",
        "--val-items",
        "0",
        "--img-grad",
        "2",
        "--ae-grad",
        "1",
        "--img-grad-energy",
        "3",
        "--ae-grad-energy",
        "2",
        "--temporal-weight",
        "2",
        "--lr",
        "1e-5",
        "--ae-lr",
        "1e-5",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "initialised from" in res.stdout
    info = json.loads((out / "training.json").read_text())
    assert info["init_from"] == str(SHIPPED_DIR) and info["unet_steps"] == 2
    assert {"img_grad", "img_grad_energy"} <= set(info["log"][-1])
    from safetensors.torch import load_file

    new = load_file(out / "unet" / "diffusion_pytorch_model.safetensors")
    old = load_file(SHIPPED_DIR / "unet" / "diffusion_pytorch_model.safetensors")
    assert new.keys() == old.keys()
    # two tiny steps from the shipped weights: close to them (not a fresh initialisation)
    diffs = [float((new[k].float() - old[k].float()).abs().max()) for k in old]
    assert max(diffs) < 0.05 and any(d > 0 for d in diffs)
    p = load_pipeline(out, device="cpu", dtype=torch.float32)
    frames = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    y = p(
        prompt="night",
        video=frames,
        num_inference_steps=2,
        strength=0.5,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
    ).frames[0]
    assert y.shape == (2, 32, 32, 3) and np.isfinite(y).all()


def test_training_with_a_missing_input_is_a_one_line_error(tmp_path):
    """A missing --init-from folder: exit 2, one line naming the option and the path, nothing
    written (checked before any data worker starts)."""
    photos = tmp_path / "photos.npz"
    np.savez(photos, a=np.zeros((80, 80, 3), np.uint8))
    out = tmp_path / "canary"
    cmd = [
        sys.executable,
        str(REPO / "tools/canary_train.py"),
        "train",
        "--photos",
        str(photos),
        "--out",
        str(out),
        "--init-from",
        str(tmp_path / "absent"),
        "--device",
        "cpu",
    ]
    res = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore"),
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--init-from" in lines[0] and str(tmp_path / "absent") in lines[0]
    assert "Traceback" not in res.stderr and not out.exists()
