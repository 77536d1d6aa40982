"""diffusers' video-to-video families built from configs with random weights (no download).

``tiny``: the component configs of diffusers' own tests for each pipeline
(``tests/pipelines/{wan,cogvideo,ltx,skyreels_v2}``), with a T5 text encoder built from a tiny
config (those tests download ``hf-internal-testing/tiny-random-t5``; here its dimensions are
written out) and a byte-level tokenizer built in code. ``real``: the published architecture
dimensions (Wan 2.1 1.3B, CogVideoX-2b, LTX-Video 0.9) for benchmarks, with one exception
documented in ``benchmarks/README.md``: the text encoder has the real width (4096) but 2 of
its 24 layers and a 300-token vocabulary (it runs once per job; its cost is not the subject).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

FAMILIES = ("wan", "wan_vace", "cogvideox", "ltx_condition", "skyreels_v2_df")


def tokenizer(max_length: int = 512):
    """A T5-style tokenizer (pad 0, eos 1, unk 2, then the 256 bytes), built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for c in bytes_to_unicode().values():
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


def text_encoder(real: bool, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    dims = (
        dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=2, feed_forward_proj="gated-gelu")
        if real
        else dict(d_model=32, d_ff=37, d_kv=8, num_heads=4, num_layers=2, relative_attention_num_buckets=8)
    )
    cfg, cls = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    return cls(
        cfg(
            vocab_size=300, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0, **dims
        )
    ).eval()


def _wan_vae(real: bool):
    from diffusers import AutoencoderKLWan

    if real:
        return AutoencoderKLWan()  # the defaults are Wan 2.1's VAE
    return AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )


def _wan_dims(real: bool) -> dict:
    if real:  # Wan 2.1 T2V 1.3B
        return dict(
            patch_size=(1, 2, 2),
            num_attention_heads=12,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            text_dim=4096,
            freq_dim=256,
            ffn_dim=8960,
            num_layers=30,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
        )
    return dict(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def _sched(cls, **config):
    """Schedulers keep their tables on the CPU, also when the models are built on a device."""
    with torch.device("cpu"):
        return cls(**config)


def make(family: str, real: bool = False):
    """The pipeline of ``family`` (one of :data:`FAMILIES`), weights seeded with 0."""
    import diffusers as d

    torch.manual_seed(0)
    if family in ("wan", "wan_vace", "skyreels_v2_df"):
        vae = _wan_vae(real)
        dims = _wan_dims(real)
        te = text_encoder(real, umt5=real)
        if family == "wan":
            tr = d.WanTransformer3DModel(**dims)
            return d.WanVideoToVideoPipeline(
                tokenizer=tokenizer(),
                text_encoder=te,
                transformer=tr,
                vae=vae,
                scheduler=_sched(d.UniPCMultistepScheduler, flow_shift=3.0),
            )
        if family == "wan_vace":
            if real:  # Wan 2.1 VACE 1.3B: VACE blocks at every other layer
                dims.update(vace_layers=list(range(0, 30, 2)), vace_in_channels=96)
            else:
                dims.update(num_layers=3, vace_layers=[0, 2], vace_in_channels=96)
            tr = d.WanVACETransformer3DModel(**dims)
            return d.WanVACEPipeline(
                tokenizer=tokenizer(),
                text_encoder=te,
                vae=vae,
                scheduler=_sched(d.FlowMatchEulerDiscreteScheduler, shift=7.0),
                transformer=tr,
            )
        tr = d.SkyReelsV2Transformer3DModel(**dims)
        return d.SkyReelsV2DiffusionForcingVideoToVideoPipeline(
            tokenizer=tokenizer(),
            text_encoder=te,
            transformer=tr,
            vae=vae,
            scheduler=_sched(d.UniPCMultistepScheduler, flow_shift=5.0, use_flow_sigmas=True),
        )
    if family == "cogvideox":
        if real:  # CogVideoX-2b
            tr = d.CogVideoXTransformer3DModel(
                num_attention_heads=30,
                attention_head_dim=64,
                in_channels=16,
                out_channels=16,
                time_embed_dim=512,
                text_embed_dim=4096,
                num_layers=30,
                sample_width=90,
                sample_height=60,
                sample_frames=49,
                patch_size=2,
                temporal_compression_ratio=4,
                max_text_seq_length=226,
            )
            vae = d.AutoencoderKLCogVideoX()  # the defaults are CogVideoX-2b's VAE
            sched = _sched(
                d.CogVideoXDDIMScheduler,
                beta_schedule="scaled_linear",
                beta_end=0.012,
                prediction_type="v_prediction",
                rescale_betas_zero_snr=True,
                timestep_spacing="trailing",
                snr_shift_scale=3.0,
                clip_sample=False,
                set_alpha_to_one=True,
            )
        else:
            tr = d.CogVideoXTransformer3DModel(
                num_attention_heads=4,
                attention_head_dim=8,
                in_channels=4,
                out_channels=4,
                time_embed_dim=2,
                text_embed_dim=32,
                num_layers=1,
                sample_width=2,
                sample_height=2,
                sample_frames=9,
                patch_size=2,
                temporal_compression_ratio=4,
                max_text_seq_length=226,
            )
            vae = d.AutoencoderKLCogVideoX(
                in_channels=3,
                out_channels=3,
                down_block_types=("CogVideoXDownBlock3D",) * 4,
                up_block_types=("CogVideoXUpBlock3D",) * 4,
                block_out_channels=(8, 8, 8, 8),
                latent_channels=4,
                layers_per_block=1,
                norm_num_groups=2,
                temporal_compression_ratio=4,
            )
            sched = _sched(d.DDIMScheduler)
        return d.CogVideoXVideoToVideoPipeline(
            tokenizer=tokenizer(), text_encoder=text_encoder(real), vae=vae, transformer=tr, scheduler=sched
        )
    if family == "ltx_condition":
        if real:  # LTX-Video 0.9
            tr = d.LTXVideoTransformer3DModel()
            vae = d.AutoencoderKLLTXVideo()
        else:
            tr = d.LTXVideoTransformer3DModel(
                in_channels=8,
                out_channels=8,
                patch_size=1,
                patch_size_t=1,
                num_attention_heads=4,
                attention_head_dim=8,
                cross_attention_dim=32,
                num_layers=1,
                caption_channels=32,
            )
            vae = d.AutoencoderKLLTXVideo(
                in_channels=3,
                out_channels=3,
                latent_channels=8,
                block_out_channels=(8, 8, 8, 8),
                decoder_block_out_channels=(8, 8, 8, 8),
                layers_per_block=(1, 1, 1, 1, 1),
                decoder_layers_per_block=(1, 1, 1, 1, 1),
                spatio_temporal_scaling=(True, True, False, False),
                decoder_spatio_temporal_scaling=(True, True, False, False),
                decoder_inject_noise=(False, False, False, False, False),
                upsample_residual=(False, False, False, False),
                upsample_factor=(1, 1, 1, 1),
                timestep_conditioning=False,
                patch_size=1,
                patch_size_t=1,
                encoder_causal=True,
                decoder_causal=False,
            )
            vae.use_framewise_encoding = False
            vae.use_framewise_decoding = False
        return d.LTXConditionPipeline(
            scheduler=_sched(d.FlowMatchEulerDiscreteScheduler),
            vae=vae,
            text_encoder=text_encoder(real),
            tokenizer=tokenizer(),
            transformer=tr,
        )
    raise ValueError(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")


def build(family: str, path) -> Path:
    """Save the tiny pipeline of ``family`` to ``path`` (``save_pretrained``)."""
    path = Path(path)
    make(family).save_pretrained(path)
    return path


#: family -> its diffusers pipeline class name
PIPELINES = {
    "wan": "WanVideoToVideoPipeline",
    "wan_vace": "WanVACEPipeline",
    "cogvideox": "CogVideoXVideoToVideoPipeline",
    "ltx_condition": "LTXConditionPipeline",
    "skyreels_v2_df": "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
}


def cast(pipe, dtype) -> None:
    """Cast every component to ``dtype`` as ``from_pretrained(dtype=...)`` would: the modules a
    model lists in ``_keep_in_fp32_modules`` (Wan's norms, time embedder, rope) stay float32."""
    for component in pipe.components.values():
        if not isinstance(component, torch.nn.Module):
            continue
        keep = getattr(component, "_keep_in_fp32_modules", None) or []
        tensors = list(component.named_parameters()) + list(component.named_buffers())
        for name, t in tensors:
            if t.is_floating_point():
                fp32 = any(k in name.split(".") for k in keep)
                t.data = t.data.to(torch.float32 if fp32 else dtype)


@functools.lru_cache(maxsize=None)
def _renderer_class():
    from evalkit.render.renderers.base import Renderer, RendererError
    from evalkit.render.renderers.diffusers import DiffusersRenderer

    class RandomWeightsRenderer(DiffusersRenderer):
        """The ``diffusers`` renderer on a pipeline built in memory from :func:`make` (random
        weights, seed 0, made directly on the backend's device, then cast to its dtype): the
        family mapping, memory and attention options all as for a saved pipeline, without
        writing and reading gigabytes of random weights. Benchmarks only."""

        name = "diffusers-random"
        options_help = {
            **DiffusersRenderer.options_help,
            "family": f"one of {', '.join(FAMILIES)}",
            "dims": "tiny (diffusers' test configs) or real (published dimensions)",
        }

        def __init__(self, **options):
            fam, dims = options.get("family"), options.get("dims", "tiny")
            if fam not in FAMILIES or dims not in ("tiny", "real"):
                raise RendererError(
                    f"renderer {self.name!r}: family= one of "
                    f"{', '.join(FAMILIES)} and dims=tiny|real, found "
                    f"family={fam!r} dims={dims!r}"
                )
            options.setdefault("model", f"random-weights:{fam}:{dims}")
            super().__init__(**options)

        def _resolved_class(self):
            import diffusers

            return getattr(diffusers, PIPELINES[self.options["family"]])

        def load(self, runtime) -> None:
            Renderer.load(self, runtime)
            offload = self.options.get("cpu_offload", "0") != "0"
            where = "cpu" if offload else runtime.device
            with torch.device(where):
                pipe = make(self.options["family"], real=self.options.get("dims") == "real")
            cast(pipe, runtime.dtype)
            self.setup(pipe, runtime)

    return RandomWeightsRenderer


def __getattr__(name):  # RandomWeightsRenderer, without importing diffusers at module import
    if name == "RandomWeightsRenderer":
        return _renderer_class()
    raise AttributeError(name)
