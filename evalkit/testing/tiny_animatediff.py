"""diffusers' own AnimateDiffVideoToVideoPipeline in miniature, built from configs.

The component configs are those of diffusers' tests for this pipeline; the CLIP tokenizer is
built from a byte-level vocabulary written here (no merges), so nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch


def _tokenizer():
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {}
    for tok in ["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars]:
        vocab.setdefault(tok, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def build(path) -> None:
    from diffusers import (
        AnimateDiffVideoToVideoPipeline,
        AutoencoderKL,
        DDIMScheduler,
        MotionAdapter,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    path = Path(path)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        norm_num_groups=2,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
    )
    vae = AutoencoderKL(
        block_out_channels=[8, 16],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=2,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=1,
            hidden_size=16,
            intermediate_size=37,
            layer_norm_eps=1e-05,
            num_attention_heads=2,
            num_hidden_layers=2,
            pad_token_id=1,
            vocab_size=600,
        )
    )
    motion_adapter = MotionAdapter(
        block_out_channels=(8, 16),
        motion_layers_per_block=1,
        motion_norm_num_groups=2,
        motion_num_attention_heads=2,
    )
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="linear", clip_sample=False)
    pipe = AnimateDiffVideoToVideoPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=_tokenizer(),
        motion_adapter=motion_adapter,
        scheduler=scheduler,
        feature_extractor=None,
        image_encoder=None,
    )
    pipe.save_pretrained(path)
