"""The canary's three networks, as diffusers models (``ModelMixin`` + ``ConfigMixin``).

- :class:`CanaryTextEncoder`: a fixed vocabulary of style words (stored in its config, so the
  tokenizer travels with the weights), word + position embeddings and two pre-norm transformer
  layers; gives per-token hidden states and a pooled vector.
- :class:`CanaryAutoencoder`: a deterministic convolutional autoencoder, 4x down in space to
  ``latent_channels`` channels (pixel-unshuffle in, pixel-shuffle out).
- :class:`CanaryUNet`: an InstructPix2Pix-style denoiser: the noisy latent and the source
  frame's latent are concatenated, patchified 2x2, run through a two-level U-Net with
  timestep + prompt FiLM conditioning, one transformer block at the coarsest level
  (cross-frame self-attention to the clip's first frame, cross-attention to the prompt tokens)
  and a full-resolution head. It predicts the clean latent (``prediction_type="sample"``) as a
  residual on the source latent.

All attention goes through ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from ..errors import UserError

DEFAULT_VOCABULARY = (
    "<pad>",
    "pencil",
    "sketch",
    "watercolor",
    "cartoon",
    "detail",
    "enhanced",
    "night",
    "golden",
    "hour",
    "black",
    "and",
    "white",
    "film",
    "thermal",
    "camera",
)


class PromptError(UserError, ValueError):
    """A prompt with a word outside the canary's vocabulary."""


def _groups(c: int) -> int:
    for g in (32, 16, 8, 4, 2, 1):
        if c % g == 0 and c // g >= 4:
            return g
    return 1


# -- text ----------------------------------------------------------------------------------


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(o.transpose(1, 2).reshape(b, n, d))


class CanaryTextEncoder(ModelMixin, ConfigMixin):
    """Words of a fixed vocabulary -> (hidden states (B, L, D), pooled (B, D), mask (B, L))."""

    @register_to_config
    def __init__(
        self,
        vocabulary: tuple = DEFAULT_VOCABULARY,
        max_length: int = 8,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(len(vocabulary), hidden_size)
        self.position_embeddings = nn.Parameter(torch.zeros(max_length, hidden_size))
        self.null_embedding = nn.Parameter(torch.zeros(hidden_size))
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            self.layers.append(
                nn.ModuleDict(
                    dict(
                        norm1=nn.LayerNorm(hidden_size),
                        attn=_SelfAttention(hidden_size, num_heads),
                        norm2=nn.LayerNorm(hidden_size),
                        ff=nn.Sequential(
                            nn.Linear(hidden_size, 4 * hidden_size),
                            nn.GELU(),
                            nn.Linear(4 * hidden_size, hidden_size),
                        ),
                    )
                )
            )
        self.final_norm = nn.LayerNorm(hidden_size)
        nn.init.normal_(self.position_embeddings, std=0.02)

    # the tokenizer: words of the vocabulary, nothing else
    def tokenize(self, prompts) -> torch.Tensor:
        """Prompts -> token ids (B, max_length); id 0 pads. An empty prompt is all padding."""
        if isinstance(prompts, str):
            prompts = [prompts]
        vocab = list(self.config.vocabulary)
        index = {w: i for i, w in enumerate(vocab)}
        rows = []
        for p in prompts:
            if not isinstance(p, str):
                raise PromptError(f"prompt: expected a string, found {type(p).__name__}")
            words = [w for w in re.split(r"[^a-z]+", p.lower()) if w]
            unknown = [w for w in words if w not in index or w == "<pad>"]
            if unknown:
                raise PromptError(
                    f"prompt {p!r}: unknown word(s) {', '.join(repr(w) for w in unknown)}; the canary "
                    f"knows only these words: {', '.join(vocab[1:])} (styles: 'pencil sketch', "
                    "'watercolor', 'cartoon', 'detail enhanced', 'night', 'golden hour', "
                    "'black and white film', 'thermal camera')"
                )
            if len(words) > self.config.max_length:
                raise PromptError(f"prompt {p!r}: {len(words)} words, at most {self.config.max_length}")
            ids = [index[w] for w in words] + [0] * (self.config.max_length - len(words))
            rows.append(ids)
        return torch.tensor(rows, dtype=torch.long)

    def forward(self, input_ids: torch.Tensor):
        mask = input_ids != 0  # (B, L)
        x = self.word_embeddings(input_ids) + self.position_embeddings[: input_ids.shape[1]]
        empty = ~mask.any(dim=1)
        # an empty prompt attends to its first (padding) slot only, so attention stays defined
        keymask = mask.clone()
        keymask[empty, 0] = True
        attn_mask = keymask[:, None, None, :]
        for layer in self.layers:
            x = x + layer["attn"](layer["norm1"](x), attn_mask)
            x = x + layer["ff"](layer["norm2"](x))
        x = self.final_norm(x)
        w = mask.to(x.dtype)[..., None]
        pooled = (x * w).sum(1) / w.sum(1).clamp(min=1.0)
        pooled = torch.where(empty[:, None], self.null_embedding.to(x.dtype).expand_as(pooled), pooled)
        x = torch.where(empty[:, None, None], self.null_embedding.to(x.dtype).expand_as(x), x)
        return x, pooled, keymask


# -- building blocks -------------------------------------------------------------------------


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb_dim: int | None = None):
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(cin), cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(_groups(cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, 2 * cout) if emb_dim else None
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, emb=None):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.norm2(h)
        if self.emb is not None:
            scale, shift = self.emb(F.silu(emb))[:, :, None, None].chunk(2, dim=1)
            h = h * (1 + scale) + shift
        h = self.conv2(F.silu(h))
        return self.skip(x) + h


# -- autoencoder -----------------------------------------------------------------------------


@dataclass
class AutoencoderOutput(BaseOutput):
    latents: torch.Tensor


@dataclass
class DecoderOutput(BaseOutput):
    sample: torch.Tensor


class CanaryAutoencoder(ModelMixin, ConfigMixin):
    """Images in [-1, 1] (B, 3, H, W) <-> latents (B, C, H/4, W/4). Deterministic (no KL)."""

    @register_to_config
    def __init__(
        self,
        latent_channels: int = 8,
        enc_channels: tuple = (32, 64),
        dec_channels: tuple = (96, 32),
        scaling_factor: float = 1.0,
        shift_factor: float = 0.0,
        source_channels: int = 0,
    ):
        super().__init__()
        e1, e2 = enc_channels
        d2, d1 = dec_channels
        self.enc_in = nn.Conv2d(12, e1, 3, padding=1)  # at H/2
        self.enc_down = nn.Conv2d(e1, e2, 3, stride=2, padding=1)  # to H/4
        self.enc_block = ResBlock(e2, e2)
        self.enc_norm = nn.GroupNorm(_groups(e2), e2)
        self.enc_out = nn.Conv2d(e2, latent_channels, 3, padding=1)
        self.dec_in = nn.Conv2d(latent_channels, d2, 3, padding=1)  # at H/4
        self.dec_block1 = ResBlock(d2, d2)
        self.dec_up = nn.Conv2d(d2, d1, 1)  # then nearest 2x
        self.dec_block2 = ResBlock(d1, d1)  # at H/2
        self.dec_norm = nn.GroupNorm(_groups(d1), d1)
        self.dec_out = nn.Conv2d(d1, 12, 3, padding=1)
        if source_channels:
            # source-conditioned decoding: the source frame's pixels enter at H/2 and at full
            # resolution, so fine detail that moves with the content comes from the (shift-
            # equivariant) source rather than from the 4x-down latent. Output convolutions start
            # at zero: a decoder extended this way starts as the plain decoder it was made from.
            self.src_in = nn.Conv2d(12, d1, 3, padding=1)  # at H/2
            self.refine1 = nn.Conv2d(6, source_channels, 3, padding=1)  # full resolution
            self.refine2 = nn.Conv2d(source_channels, 3, 3, padding=1)
            for m in (self.src_in, self.refine2):
                nn.init.zeros_(m.weight)
                nn.init.zeros_(m.bias)

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        h = self.enc_in(F.pixel_unshuffle(x, 2))
        h = self.enc_block(self.enc_down(F.silu(h)))
        z = self.enc_out(F.silu(self.enc_norm(h)))
        return AutoencoderOutput(latents=z) if return_dict else (z,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, source: torch.Tensor | None = None):
        """Latents -> images in [-1, 1]. ``source``: the source frames (B, 3, H, W) in [-1, 1]
        for a decoder with ``source_channels`` (the pipeline passes them); without them such a
        decoder falls back to the latent alone (a blurrier image)."""
        h = self.dec_block1(self.dec_in(z))
        h = F.interpolate(self.dec_up(h), scale_factor=2.0, mode="nearest")
        use_src = self.config.source_channels and source is not None
        if use_src:
            source = source.to(h.dtype)
            h = h + self.src_in(F.pixel_unshuffle(source, 2))
        h = self.dec_block2(h)
        x = F.pixel_shuffle(self.dec_out(F.silu(self.dec_norm(h))), 2)
        if use_src:
            x = x + self.refine2(F.silu(self.refine1(torch.cat([x, source], dim=1))))
        return DecoderOutput(sample=x) if return_dict else (x,)

    def forward(self, x, source: torch.Tensor | None = None):
        return self.decode(self.encode(x).latents, source=source).sample


# -- denoiser --------------------------------------------------------------------------------


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class CrossFrameBlock(nn.Module):
    """Transformer block on (B*T, C, h, w) feature maps: self-attention over the frame's own
    tokens plus the tokens of its clip's first frame (anchor), cross-attention to the prompt."""

    def __init__(self, dim: int, text_dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out1 = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.q2 = nn.Linear(dim, dim)
        self.kv2 = nn.Linear(text_dim, 2 * dim)
        self.out2 = nn.Linear(dim, dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def _heads(self, x):
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, text, text_mask, num_frames: int):
        bt, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)  # (BT, N, C)
        # cross-frame self-attention: keys/values of the frame itself and of frame 0 of its clip
        y = self.norm1(t)
        k, v = self.kv(y).chunk(2, dim=-1)
        if num_frames > 1:
            b = bt // num_frames
            ka = k.view(b, num_frames, *k.shape[1:])[:, :1].expand(-1, num_frames, -1, -1)
            va = v.view(b, num_frames, *v.shape[1:])[:, :1].expand(-1, num_frames, -1, -1)
            k = torch.cat([k, ka.reshape_as(k)], dim=1)
            v = torch.cat([v, va.reshape_as(v)], dim=1)
        o = F.scaled_dot_product_attention(self._heads(self.q(y)), self._heads(k), self._heads(v))
        t = t + self.out1(o.transpose(1, 2).reshape(bt, h * w, c))
        # cross-attention to the prompt tokens
        y = self.norm2(t)
        k, v = self.kv2(text).chunk(2, dim=-1)
        o = F.scaled_dot_product_attention(
            self._heads(self.q2(y)), self._heads(k), self._heads(v), attn_mask=text_mask[:, None, None, :]
        )
        t = t + self.out2(o.transpose(1, 2).reshape(bt, h * w, c))
        t = t + self.ff(self.norm3(t))
        return t.transpose(1, 2).reshape(bt, c, h, w)


@dataclass
class CanaryUNetOutput(BaseOutput):
    sample: torch.Tensor


class CanaryUNet(ModelMixin, ConfigMixin):
    """(noisy latent, source latent, timestep, prompt) -> predicted clean latent."""

    @register_to_config
    def __init__(
        self,
        latent_channels: int = 8,
        channels: tuple = (64, 128),
        text_dim: int = 128,
        emb_dim: int = 256,
        num_heads: int = 4,
        head_channels: int = 32,
        residual_source: bool = True,
        blocks: tuple = (1, 1),
    ):
        super().__init__()
        c1, c2 = channels
        n1, n2 = blocks
        lc = latent_channels
        self.time_mlp = nn.Sequential(nn.Linear(128, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.text_proj = nn.Linear(text_dim, emb_dim)
        self.patch_in = nn.Conv2d(2 * lc, c1, 2, stride=2)  # latent/2
        self.block1 = ResBlock(c1, c1, emb_dim)
        self.down = nn.Conv2d(c1, c2, 3, stride=2, padding=1)  # latent/4
        self.block2 = ResBlock(c2, c2, emb_dim)
        self.attn = CrossFrameBlock(c2, text_dim, num_heads)
        self.block3 = ResBlock(c2, c2, emb_dim)
        self.up = nn.Conv2d(c2, c1, 1)
        self.block4 = ResBlock(c1, c1, emb_dim)
        # ``blocks``: residual blocks per level on each side of the U (the first of each is
        # block1..block4 above; the extra ones keep the state-dict keys of (1, 1) models)
        self.extra1 = nn.ModuleList(ResBlock(c1, c1, emb_dim) for _ in range(n1 - 1))
        self.extra2 = nn.ModuleList(ResBlock(c2, c2, emb_dim) for _ in range(n2 - 1))
        self.extra3 = nn.ModuleList(ResBlock(c2, c2, emb_dim) for _ in range(n2 - 1))
        self.extra4 = nn.ModuleList(ResBlock(c1, c1, emb_dim) for _ in range(n1 - 1))
        self.norm_out = nn.GroupNorm(_groups(c1), c1)
        self.patch_out = nn.Conv2d(c1, 4 * lc, 3, padding=1)  # pixel-shuffled to latent
        self.head1 = nn.Conv2d(2 * lc, head_channels, 3, padding=1)  # full latent resolution
        self.head2 = nn.Conv2d(head_channels, lc, 3, padding=1)

    def forward(
        self,
        sample,
        timestep,
        source_latents,
        encoder_hidden_states,
        pooled_text,
        encoder_attention_mask,
        num_frames: int = 1,
        return_dict: bool = True,
    ):
        bt = sample.shape[0]
        dtype = sample.dtype
        if not torch.is_tensor(timestep):
            timestep = torch.tensor([timestep], device=sample.device)
        timestep = (
            timestep.reshape(-1).to(sample.device).expand(bt)
            if timestep.numel() == 1
            else timestep.to(sample.device)
        )
        emb = self.time_mlp(timestep_embedding(timestep, 128).to(dtype)) + self.text_proj(
            pooled_text.to(dtype)
        )
        x = torch.cat([sample, source_latents], dim=1)
        h1 = self.block1(self.patch_in(x), emb)
        for blk in self.extra1:
            h1 = blk(h1, emb)
        h = self.block2(self.down(h1), emb)
        for blk in self.extra2:
            h = blk(h, emb)
        h = self.attn(h, encoder_hidden_states.to(dtype), encoder_attention_mask, num_frames)
        h = self.block3(h, emb)
        for blk in self.extra3:
            h = blk(h, emb)
        h = F.interpolate(self.up(h), scale_factor=2.0, mode="nearest") + h1
        h = self.block4(h, emb)
        for blk in self.extra4:
            h = blk(h, emb)
        y = F.pixel_shuffle(self.patch_out(F.silu(self.norm_out(h))), 2)
        y = y + self.head2(F.silu(self.head1(torch.cat([y, source_latents], dim=1))))
        if self.config.residual_source:
            y = y + source_latents
        return CanaryUNetOutput(sample=y) if return_dict else (y,)
