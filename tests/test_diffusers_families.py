"""diffusers' video-to-video families through ``evalkit render -r diffusers`` (issue 15).

Each family is built from diffusers' own tiny test configurations (random weights, a T5 text
encoder from a tiny config, a byte-level tokenizer built in code: nothing is downloaded), saved
with ``save_pretrained``, rendered on two backends that differ in the attention kernel, and
compared. Frame counts, sizes and params a family cannot take are refused before any weights
load, with one line naming the job.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error

from evalkit import video
from evalkit.testing.suites import write_suite

pytestmark = pytest.mark.slow  # diffusers pipelines rendered on the CPU

FAMILIES = {  # tiny_families name (or "animatediff") -> diffusers class
    "wan": "WanVideoToVideoPipeline",
    "wan_vace": "WanVACEPipeline",
    "cogvideox": "CogVideoXVideoToVideoPipeline",
    "ltx_condition": "LTXConditionPipeline",
    "skyreels_v2_df": "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
    "animatediff": "AnimateDiffVideoToVideoPipeline",
}
#: families whose denoiser dispatches attention through diffusers' dispatcher
DISPATCHING = {"wan", "wan_vace", "ltx_condition", "skyreels_v2_df"}
TAKES_STRENGTH = {"wan", "cogvideox", "ltx_condition", "animatediff"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Every family's tiny pipeline, built once for this module."""
    from evalkit.testing import tiny_animatediff, tiny_families

    root = tmp_path_factory.mktemp("families")
    out = {}
    for fam in FAMILIES:
        if fam == "animatediff":
            tiny_animatediff.build(root / fam)
        else:
            tiny_families.build(fam, root / fam)
        out[fam] = root / fam
    return out


def clip(path: Path, frames: int, size: int = 32) -> Path:
    """A smooth moving gradient, ``frames`` frames of ``size`` x ``size``."""
    y, x = np.mgrid[0:size, 0:size]
    video.write_lossless(
        path,
        np.stack(
            [
                np.stack([(x * 8 + t * 16) % 256, (y * 8) % 256, np.full_like(x, 90 + t * 10)], -1)
                for t in range(frames)
            ]
        ).astype(np.uint8),
        8,
    )
    return path


def suite(tmp_path: Path, frames: int = 9, size: int = 32, params: str = "") -> Path:
    p = write_suite(tmp_path, clip(tmp_path / "src.mkv", frames, size), prompts=["a red fox"])
    if params:
        p.write_text(p.read_text() + f"params: {params}\n")
    return p


def job_record(run: Path) -> dict:
    [rec] = json.loads((run / "manifest.json").read_text())["jobs"]
    return rec


#: family -> (frames, size) of its smoke clip (LTX, CogVideoX: 8k+1; 32: the least LPIPS-alex
#: takes)
CLIPS = {"ltx_condition": (9, 32), "cogvideox": (9, 32)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_renders_on_two_attention_backends_and_compares(family, models, tmp_path, cli):
    # classifier-free guidance and a negative prompt for Wan; the others without (half the work)
    params = (
        "{steps: 2, guidance: 2.0, negative_prompt: blurry" if family == "wan" else "{steps: 2, guidance: 1.0"
    )
    params += ", strength: 0.7}" if family in TAKES_STRENGTH else "}"
    frames, size = CLIPS.get(family, (5, 32))
    s = suite(tmp_path, frames=frames, size=size, params=params)
    extra = ["-O", "vae_tiling=1", "-O", "vae_slicing=1"] if family == "wan" else []
    code, out, err = cli(
        "render",
        s,
        "-r",
        "diffusers",
        "-O",
        f"model={models[family]}",
        "-O",
        f"pipeline_class=diffusers:{FAMILIES[family]}",
        *extra,
        "-b",
        "cpu",
        "-b",
        "cpu,attn=math",
        "--out",
        tmp_path / "runs",
    )
    assert code == 0, err
    a, b = tmp_path / "runs" / "cpu", tmp_path / "runs" / "cpu_attn-math"
    ra, rb = job_record(a), job_record(b)
    assert ra["status"] == rb["status"] == "done"
    out_frames = video.read_frames(a / "clips" / f"{ra['id']}.mkv")[0]
    assert out_frames.shape == (frames, size, size, 3)  # a continuation keeps the new frames
    call = ra["pipeline_call"]
    assert call["family"] == FAMILIES[family]
    assert (call["height"], call["width"]) == (size, size)
    if family == "ltx_condition":  # the source is a condition of strength 1 - 0.7
        assert call["condition_strength"] == pytest.approx(0.3)
        assert call["num_frames"] == 9
    elif family in TAKES_STRENGTH:
        assert call["strength"] == 0.7
    if family == "wan":
        assert (call["guidance_scale"], call["negative_prompt"]) == (2.0, "blurry")
    if family == "skyreels_v2_df":
        assert (call["num_frames"], call["base_num_frames"], call["overlap_history"]) == (5, 5, 1)
    # the attention key reached what the denoiser uses, and the manifest says what ran
    denoiser = "unet" if family == "animatediff" else "transformer"
    att_a, att_b = ra["attention"], rb["attention"]
    assert (att_a["sdpa_kernels"], att_b["sdpa_kernels"]) == ("PyTorch's choice", "math")
    # the kernel is the denoiser's: the text encoder and the VAE keep PyTorch's choice
    assert "sdpa_kernels_elsewhere" not in att_a
    assert att_b["sdpa_kernels_elsewhere"]["text_encoder"] == "PyTorch's choice"
    assert att_b["sdpa_kernels_elsewhere"]["vae"] == "PyTorch's choice"
    if family in DISPATCHING:
        assert (att_a[denoiser]["dispatcher"], att_b[denoiser]["dispatcher"]) == ("native", "_native_math")
    else:
        assert att_a[denoiser]["dispatcher"] is None
        assert att_a[denoiser]["calls"] == "torch.nn.functional.scaled_dot_product_attention"
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["renderer"]["family"] == FAMILIES[family]
    if family == "wan":
        assert manifest["renderer"]["options"]["vae_tiling"] == "1"
        assert ra["memory"] == {"cpu_offload": "off", "vae_tiling": "on", "vae_slicing": "on"}
    code, out, err = cli("compare", a, b, "--out", tmp_path / "report")
    assert code == 0, err
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["jobs"]["compared"] == [ra["id"]]
    assert summary["aggregates"]["lpips"]["frames"] == frames


@pytest.mark.parametrize(
    "family, frames, size, params, needles",
    [
        (
            "wan",
            8,
            32,
            "",
            (
                "job '",
                "clip 'pan'",
                "WanVideoToVideoPipeline takes 4k+1",
                "the clip has 8",
                "trim the clip to 5 frames",
            ),
        ),
        ("ltx_condition", 9, 48, "", ("LTXConditionPipeline", "multiples of 32", "gives 48x48")),
        ("ltx_condition", 13, 32, "", ("LTXConditionPipeline takes 8k+1", "the clip has 13")),
        ("cogvideox", 5, 32, "", ("CogVideoXVideoToVideoPipeline takes 8k+1", "the clip has 5")),
        (
            "cogvideox",
            9,
            32,
            "{height: 40, width: 32}",
            ("multiples of 16", "params.height/width gives 32x40"),
        ),
        ("wan_vace", 9, 32, "{strength: 0.5}", ("params.strength", "WanVACEPipeline takes no strength")),
        ("skyreels_v2_df", 9, 32, "{denoise: 0.5}", ("params.denoise", "takes no argument 'denoise'")),
        ("cogvideox", 9, 32, "{steps: 1, strength: 0.8}", ("steps=1, strength=0.8 give none",)),
    ],
)
def test_what_a_family_cannot_take_is_refused_before_loading(
    family, frames, size, params, needles, models, tmp_path, cli
):
    s = suite(tmp_path, frames=frames, size=size, params=params)
    code, out, err = cli(
        "render",
        s,
        "-r",
        "diffusers",
        "-O",
        f"model={models[family]}",
        "-b",
        "cpu",
        "--out",
        tmp_path / "runs",
    )
    assert code == 2
    assert_one_line_error(err, *needles)
    assert not (tmp_path / "runs").exists()  # refused before any run folder or weights


@pytest.mark.parametrize(
    "option, needles",
    [
        ("cpu_offload=2", ("cpu_offload='2'", "0, 1, model, sequential")),
        ("vae_tiling=yes", ("vae_tiling='yes'", "0, 1")),
        ("attention_backend=fastest", ("attention_backend='fastest'", "_native_math")),
    ],
)
def test_bad_memory_and_attention_options(option, needles, models, tmp_path, cli):
    s = suite(tmp_path)
    code, out, err = cli(
        "render",
        s,
        "-r",
        "diffusers",
        "-O",
        f"model={models['wan']}",
        "-O",
        option,
        "-b",
        "cpu",
        "--out",
        tmp_path / "runs",
    )
    assert code == 2
    assert_one_line_error(err, *needles)


def test_attention_backend_option_needs_a_dispatching_family(models, tmp_path, cli):
    """CogVideoX's processors call SDPA themselves: a dispatcher backend cannot reach them,
    which is said instead of being ignored."""
    s = suite(tmp_path, params="{steps: 1}")
    code, out, err = cli(
        "render",
        s,
        "-r",
        "diffusers",
        "-O",
        f"model={models['cogvideox']}",
        "-O",
        "attention_backend=_native_math",
        "-b",
        "cpu",
        "--out",
        tmp_path / "runs",
    )
    assert code == 2
    assert_one_line_error(err, "attention_backend='_native_math'", "does not go through", "attn= key")
