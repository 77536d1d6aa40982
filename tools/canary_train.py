#!/usr/bin/env python
"""Train the canary pipeline from photographs that ship inside installed packages.

Two phases on one GPU (bf16 autocast):

1. the autoencoder, on source crops and their classical style targets (L1 + LPIPS-alex);
2. the denoiser and the text encoder (autoencoder frozen): x0-prediction on latents, clips of
   two frames related by a small random camera motion (homography) sharing one noise tensor,
   prompt dropped 10% of the time (classifier-free guidance), 20% of the noisy inputs made from
   the *source* latent (as img2img sampling starts), EMA of the weights.

Data: CPU workers crop the training photographs (random scale, rotation, flip, colour jitter,
tint, blur, a second frame through a small camera move) to 128x128 and apply the eight
classical operators of :mod:`evalkit.canary.styles`; items go into a replay buffer on the GPU.
The eight photographs the bundled clips are made of (astronaut, coffee, chelsea, rocket,
camera, hubble, china, flower) are never used: they are the held-out set.

Usage::

    # pack the training photographs once (they come from several packages; the GPU machine may
    # lack some of them)
    python tools/canary_train.py pack --out .canary_data/photos.npz
    # train (about 9 minutes on one H200) and write the pipeline folder in fp16
    python tools/canary_train.py train --photos .canary_data/photos.npz --out models/canary \\
        --ae-seconds 110 --seconds 330 --seed 0

Seeded: the photo packing, the data workers (seed + worker id), the initialisation and every
sampling step use fixed seeds. With ``--ae-steps/--steps`` the step counts are fixed; by default
the schedule follows wall time (the learning rate decays over the time budget), so the number of
steps depends on the machine: it is printed and recorded in ``training.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: Training photographs: (name, package module, path inside the package).
TRAIN_PHOTOS = [
    ("motorcycle_left", "skimage.data", "motorcycle_left.png"),
    ("motorcycle_right", "skimage.data", "motorcycle_right.png"),
    ("color", "skimage.data", "color.png"),
    ("ihc", "skimage.data", "ihc.png"),
    ("retina", "skimage.data", "retina.jpg"),
    ("brick", "skimage.data", "brick.png"),
    ("grass", "skimage.data", "grass.png"),
    ("gravel", "skimage.data", "gravel.png"),
    ("coins", "skimage.data", "coins.png"),
    ("moon", "skimage.data", "moon.png"),
    ("page", "skimage.data", "page.png"),
    ("text", "skimage.data", "text.png"),
    ("cell", "skimage.data", "cell.png"),
    ("clock_motion", "skimage.data", "clock_motion.png"),
    ("logo", "skimage.data", "logo.png"),
    ("grace_hopper", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    ("minduka", "matplotlib", "mpl-data/sample_data/Minduka_Present_Blue_Pack.png"),
    ("cheetah", "gradio", "media_assets/images/cheetah.jpg"),
    ("cheetah2", "gradio", "test_data/cheetah2.jpg"),
    ("tower", "gradio", "media_assets/images/tower.jpg"),
    ("groot", "gradio", "media_assets/images/groot.jpeg"),
]
#: The photographs of the bundled clips: never trained on.
HELD_OUT = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field", "china", "flower")

CROP = 128


def find_photo(module: str, rel: str) -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(list(spec.submodule_search_locations)[0])
    sub = module.split(".")[1:]
    path = base.joinpath(*sub, *rel.split("/"))
    return path if path.is_file() else None


def load_rgb(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        if im.mode in ("RGBA", "LA", "P"):
            im = im.convert("RGBA")
            bg = Image.new("RGBA", im.size, (255, 255, 255, 255))
            im = Image.alpha_composite(bg, im)
        return np.ascontiguousarray(np.asarray(im.convert("RGB"), np.uint8))


def cmd_pack(args) -> int:
    photos, missing = {}, []
    for name, module, rel in TRAIN_PHOTOS:
        path = find_photo(module, rel)
        if path is None:
            missing.append(f"{module}:{rel}")
            continue
        photos[name] = load_rgb(path)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **photos)
    print(f"packed {len(photos)} photographs into {args.out}; missing: {missing or 'none'}")
    return 0


# -- data ----------------------------------------------------------------------------------


def _jitter(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    x = img.astype(np.float32) / 255.0
    grey = float(np.abs(x - x.mean(axis=2, keepdims=True)).mean()) < 0.01
    if grey and rng.random() < 0.6:  # tint grey photographs
        tint = rng.uniform(0.7, 1.15, 3).astype(np.float32)
        x = x * tint
    lum = x.mean(axis=2, keepdims=True)
    x = lum + (x - lum) * rng.uniform(0.6, 1.4)  # saturation
    x = (x - 0.5) * rng.uniform(0.7, 1.3) + 0.5 + rng.uniform(-0.15, 0.15)  # contrast, brightness
    x = np.clip(x, 0, 1) ** rng.uniform(0.75, 1.35)  # gamma
    x = x * rng.uniform(0.9, 1.1, 3).astype(np.float32)  # white balance
    return np.clip(x * 255.0 + 0.5, 0, 255).astype(np.uint8)


def make_item(photos: list[np.ndarray], rng: np.random.Generator, frames: int = 2):
    """One training item: (frames, CROP, CROP, 3) source frames, (8, frames, ...) targets and the
    3x3 homography taking a pixel of frame 1 to where that content is in frame 0 (the known
    synthetic camera move; used by the temporal losses)."""
    import cv2

    from evalkit.canary.styles import STYLES

    img = photos[rng.integers(len(photos))]
    h, w = img.shape[:2]
    side = min(h, w)
    crop = float(np.exp(rng.uniform(np.log(64), np.log(max(65.0, 1.1 * side)))))
    scale = CROP / crop
    src = img
    if scale < 0.5:  # area-prescale so warps do not alias
        f = scale * 2.0
        src = cv2.resize(img, (max(1, int(w * f)), max(1, int(h * f))), interpolation=cv2.INTER_AREA)
        scale, h, w = scale / f, src.shape[0], src.shape[1]
    src = _jitter(src, rng)
    cx, cy = rng.uniform(0.25, 0.75) * w, rng.uniform(0.25, 0.75) * h
    angle = rng.uniform(-20, 20) if rng.random() < 0.7 else 0.0
    flip = rng.random() < 0.5
    out_frames, homs = [], []
    # camera motion between frames: shift, rotation, zoom, a little perspective
    dx, dy = rng.normal(0, 3.0, 2)
    dang, dscale = rng.normal(0, 0.8), float(np.exp(rng.normal(0, 0.02)))
    persp = rng.normal(0, 1.5e-4, 2)
    blur = rng.uniform(0.4, 1.2) if rng.random() < 0.25 else 0.0
    noise = rng.uniform(1.0, 4.0) if rng.random() < 0.2 else 0.0
    for k in range(frames):
        m = cv2.getRotationMatrix2D((cx, cy), angle + k * dang, scale * dscale**k)
        m[0, 2] += CROP / 2 - cx + k * dx
        m[1, 2] += CROP / 2 - cy + k * dy
        H = np.vstack([m, [0, 0, 1]])
        if k:
            P = np.array([[1, 0, 0], [0, 1, 0], [persp[0], persp[1], 1]], np.float64)
            C = np.array([[1, 0, -CROP / 2], [0, 1, -CROP / 2], [0, 0, 1]], np.float64)
            H = np.linalg.inv(C) @ P @ C @ H
        homs.append(H)
        f = cv2.warpPerspective(src, H, (CROP, CROP), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
        if flip:
            f = f[:, ::-1]
        if blur:
            f = cv2.GaussianBlur(f, (0, 0), blur)
        out_frames.append(np.ascontiguousarray(f))
    if noise:
        nz = rng.normal(0, noise, (CROP, CROP, 3)).astype(np.float32)
        out_frames = [np.clip(f + nz, 0, 255).astype(np.uint8) for f in out_frames]
    srcs = np.stack(out_frames)
    tgts = np.stack([np.stack([op(f) for f in out_frames]) for op in STYLES.values()])
    Fl = np.array([[-1, 0, CROP - 1], [0, 1, 0], [0, 0, 1]], np.float64) if flip else np.eye(3)
    warp = Fl @ homs[0] @ np.linalg.inv(homs[-1]) @ Fl
    return srcs, tgts, (warp / warp[2, 2]).astype(np.float32)


class ItemStream:
    """An IterableDataset of batches of items, one numpy Generator per worker."""

    def __init__(self, photos_path: str, seed: int, batch: int):
        self.photos_path, self.seed, self.batch = photos_path, seed, batch

    def __iter__(self):
        import cv2
        import torch

        cv2.setNumThreads(1)
        info = torch.utils.data.get_worker_info()
        wid = info.id if info else 0
        with np.load(self.photos_path) as z:
            photos = [z[k] for k in sorted(z.files)]
        rng = np.random.default_rng([self.seed, wid])
        while True:
            items = [make_item(photos, rng) for _ in range(self.batch)]
            yield tuple(torch.from_numpy(np.stack([it[j] for it in items])) for j in range(3))


def make_iterable(photos_path, seed, batch):
    import torch

    class _DS(torch.utils.data.IterableDataset):
        def __iter__(self_inner):
            return iter(ItemStream(photos_path, seed, batch))

    return _DS()


class Replay:
    """A ring buffer of items on the GPU, fed by a thread that drains the DataLoader."""

    def __init__(self, loader, capacity: int, device):
        import torch

        self.capacity, self.device = capacity, device
        self.src = torch.empty((capacity, 2, CROP, CROP, 3), dtype=torch.uint8, device=device)
        self.tgt = torch.empty((capacity, 8, 2, CROP, CROP, 3), dtype=torch.uint8, device=device)
        self.warp = torch.empty((capacity, 3, 3), dtype=torch.float32, device=device)
        self.count = 0
        self.seen = 0
        self.q: queue.Queue = queue.Queue(maxsize=64)
        self._stop = False
        self.error = None
        it = iter(loader)  # fork the workers from the main thread (forking in a thread can deadlock)
        self.thread = threading.Thread(target=self._pump, args=(it,), daemon=True)
        self.thread.start()

    def _pump(self, loader):
        pin = self.device.type == "cuda"
        try:
            for batch in loader:
                if self._stop:
                    return
                self.q.put(tuple(x.pin_memory() for x in batch) if pin else batch)
        except BaseException as e:  # surfaced by ingest()
            self.error = e

    def ingest(self, max_batches: int = 8):
        if self.error is not None:
            raise RuntimeError(f"data worker failed: {self.error!r}") from self.error
        n = 0
        while n < max_batches:
            try:
                s, t, w = self.q.get_nowait()
            except queue.Empty:
                break
            k = s.shape[0]
            idx = (self.seen + np.arange(k)) % self.capacity
            idx = self._t(idx)
            self.src[idx] = s.to(self.device, non_blocking=True)
            self.tgt[idx] = t.to(self.device, non_blocking=True)
            self.warp[idx] = w.to(self.device, non_blocking=True)
            self.seen += k
            self.count = min(self.capacity, self.count + k)
            n += 1

    def _t(self, idx):
        import torch

        return torch.as_tensor(idx, device=self.device)

    def wait(self, n: int, timeout: float = 180):
        t0 = time.time()
        while self.count < n:
            self.ingest()
            if time.time() - t0 > timeout:
                raise RuntimeError("data workers too slow")
            time.sleep(0.05)

    def sample(self, n: int, gen):
        import torch

        return torch.randint(0, self.count, (n,), device=self.device, generator=gen)


def to_unit(x):
    """uint8 (..., H, W, 3) -> float (..., 3, H, W) in [-1, 1]."""
    return x.permute(*range(x.ndim - 3), x.ndim - 1, x.ndim - 3, x.ndim - 2).float() / 127.5 - 1.0


# -- training --------------------------------------------------------------------------------


def lr_at(frac: float, base: float, warm: float = 0.03) -> float:
    if frac < warm:
        return base * frac / warm
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - warm) / (1 - warm)))))


def load_lpips(path: str | None, device):
    import lpips

    net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    if path is None:
        from evalkit.metrics.weights import load_state_dict

        sd = load_state_dict("alex")
    else:
        from safetensors.torch import load_file

        sd = load_file(path)
    net.load_state_dict(sd, strict=False)
    net.eval().requires_grad_(False)
    return net.to(device)


def warp_from_prev(img0, warp):
    """Frame-0 images (B, C, H, W) resampled onto frame 1's pixel grid through ``warp`` (B, 3, 3:
    frame-1 pixel -> frame-0 pixel); returns (warped, valid mask (B, 1, H, W))."""
    import torch
    import torch.nn.functional as F

    b, _, h, w = img0.shape
    ys, xs = torch.meshgrid(
        torch.arange(h, device=img0.device, dtype=torch.float32),
        torch.arange(w, device=img0.device, dtype=torch.float32),
        indexing="ij",
    )
    p = torch.stack([xs, ys, torch.ones_like(xs)], dim=-1).view(1, -1, 3)  # (1, HW, 3)
    q = p @ warp.float().transpose(1, 2)  # (B, HW, 3)
    q = q[..., :2] / q[..., 2:].clamp(min=1e-6)
    qx, qy = q[..., 0].view(b, h, w), q[..., 1].view(b, h, w)
    grid = torch.stack([2 * qx / (w - 1) - 1, 2 * qy / (h - 1) - 1], dim=-1)
    out = F.grid_sample(img0.float(), grid, mode="bilinear", padding_mode="border", align_corners=True)
    mask = ((qx >= 1) & (qx <= w - 2) & (qy >= 1) & (qy <= h - 2)).float()[:, None]
    return out, mask


def temporal_loss(out, tgt, warp):
    """Flicker that the target does not have: (out1 - W out0) against (tgt1 - W tgt0), L1 over
    the pixels both frames see. ``out``, ``tgt``: (B, 2, C, H, W)."""
    import torch

    both, mask = warp_from_prev(torch.cat([out[:, 0], tgt[:, 0]]), warp.repeat(2, 1, 1))
    wo, wt = both.chunk(2)
    m = mask[: out.shape[0]]
    d = ((out[:, 1].float() - wo) - (tgt[:, 1].float() - wt)).abs().mean(1, keepdim=True)
    return (d * m).sum() / m.sum().clamp(min=1.0)


def gradient_loss(out, tgt):
    """L1 between the finite-difference image gradients (x and y, per channel) of ``out`` and
    ``tgt`` (N, C, H, W): penalises outputs that are blurrier (or noisier) than their target,
    which the plain L1 and LPIPS terms tolerate (v2's pencil sketch: gradient ratio 0.59)."""
    o, t = out.float(), tgt.float()
    dx = ((o[..., :, 1:] - o[..., :, :-1]) - (t[..., :, 1:] - t[..., :, :-1])).abs().mean()
    dy = ((o[..., 1:, :] - o[..., :-1, :]) - (t[..., 1:, :] - t[..., :-1, :])).abs().mean()
    return dx + dy


def gradient_energy_loss(out, tgt, window: int = 4):
    """L1 between the local gradient energy (mean of |dx| + |dy| over ``window`` x ``window``
    cells, per channel) of ``out`` and ``tgt``: asks for as much fine texture as the target has
    in each small cell without asking for it at the exact pixel, which is what a model uncertain
    of a texture's phase cannot give; the per-pixel terms alone reward blurring such textures
    (the ablation run with :func:`gradient_loss` alone: pencil sketch gradient ratio 0.51)."""
    import torch.nn.functional as F

    def energy(x):
        x = x.float()
        dx = F.pad((x[..., :, 1:] - x[..., :, :-1]).abs(), (0, 1, 0, 0))
        dy = F.pad((x[..., 1:, :] - x[..., :-1, :]).abs(), (0, 0, 0, 1))
        return F.avg_pool2d(dx + dy, window)

    return (energy(out) - energy(tgt)).abs().mean()


def _advance(opt, step: int, fixed_steps: int, seconds: float, t0: float, base_lr: float) -> bool:
    """Set ``opt``'s learning rate for ``step`` of a phase; False once its budget is spent
    (``fixed_steps`` steps when given, else ``seconds`` of wall time since ``t0``)."""
    frac = (step / fixed_steps) if fixed_steps else (time.time() - t0) / seconds
    if frac >= 1.0:
        return False
    for g in opt.param_groups:
        g["lr"] = lr_at(frac, base_lr)
    return True


def _ints(text: str) -> tuple:
    return tuple(int(v) for v in str(text).split(","))


def build_vae(args, device):
    """A fresh autoencoder, or (``--reuse-vae``) the one of a saved pipeline folder, extended
    with a source-conditioned decoder when ``--vae-source-channels`` asks for one."""
    from evalkit.canary import CanaryAutoencoder

    if not args.reuse_vae:
        return CanaryAutoencoder(source_channels=args.vae_source_channels).to(device), False
    base = CanaryAutoencoder.from_pretrained(str(Path(args.reuse_vae) / "vae")).float()
    want = args.vae_source_channels
    if want and base.config.source_channels != want:
        vae = CanaryAutoencoder.from_config(base.config, source_channels=want)
        missing, unexpected = vae.load_state_dict(base.state_dict(), strict=False)
        assert not unexpected and all(k.split(".")[0] in ("src_in", "refine1", "refine2") for k in missing), (
            missing,
            unexpected,
        )
        print(
            f"reused {args.reuse_vae}/vae, added a source-conditioned decoder "
            f"({want} channels, starts as the plain decoder)",
            flush=True,
        )
    else:
        vae = base
        print(f"reused {args.reuse_vae}/vae as it is", flush=True)
    return vae.to(device), True


def validate_guidance(pipe, photos, args, device, lp, candidates=(0, 1, 2)):
    """Choose the default guidance interval on validation items (training photographs, a seed
    training never drew, 128x128 two-frame clips; not the held-out set): per candidate, per style,
    LPIPS ratio (output vs source, to the classical target) and temporal ratio (flicker against
    the known camera move, canary / classical); fewest styles failing (0.7 / 2) wins, then the
    lowest mean LPIPS ratio."""
    import torch

    from evalkit.canary.styles import STYLES

    rng = np.random.default_rng([args.seed, 7919])
    items = [make_item(photos, rng) for _ in range(args.val_items)]

    def unit(a):
        return torch.from_numpy(np.ascontiguousarray(a)).permute(0, 3, 1, 2).float().to(device) / 127.5 - 1

    def flick(x, w):
        wx, m = warp_from_prev(x[:1], w[None])
        return float(((x[1:] - wx).abs().mean(1, keepdim=True) * m).sum() / m.sum().clamp(min=1))

    report = {}
    for g in candidates:
        rows = {}
        for si, style in enumerate(STYLES):
            lo, ls, fo, ft = [], [], [], []
            for k, (srcs, tgts, w) in enumerate(items):
                out = pipe(
                    prompt=style,
                    video=srcs,
                    strength=0.6,
                    num_inference_steps=12,
                    guidance_scale=4.0,
                    guidance_steps=g,
                    output_type="pt",
                    generator=torch.Generator("cpu").manual_seed(k),
                ).frames[0]
                o, t, s = out.to(device) * 2 - 1, unit(tgts[si]), unit(srcs)
                wt = torch.from_numpy(w).to(device)
                with torch.no_grad():
                    lo.append(float(lp(o, t).mean()))
                    ls.append(float(lp(s, t).mean()))
                fo.append(flick(o, wt))
                ft.append(flick(t, wt))
            rows[style] = dict(
                lpips_ratio=float(np.mean(lo) / max(np.mean(ls), 1e-6)),
                warp_ratio=float(np.mean(fo) / max(np.mean(ft), 1e-6)),
            )
        fails = sum(r["lpips_ratio"] > 0.7 or r["warp_ratio"] > 2.0 for r in rows.values())
        mean_ratio = float(np.mean([r["lpips_ratio"] for r in rows.values()]))
        report[str(g)] = dict(
            fails=fails,
            mean_lpips_ratio=round(mean_ratio, 4),
            styles={k: {a: round(b, 3) for a, b in v.items()} for k, v in rows.items()},
        )
        print(
            f"validation guidance_steps={g}: {fails} styles fail, mean LPIPS ratio "
            f"{mean_ratio:.3f}; "
            + ", ".join(f"{k} {v['lpips_ratio']:.2f}/{v['warp_ratio']:.2f}" for k, v in rows.items()),
            flush=True,
        )
    best = min(candidates, key=lambda g: (report[str(g)]["fails"], report[str(g)]["mean_lpips_ratio"]))
    return best, report


def cmd_train(args) -> int:
    import torch
    import torch.nn.functional as F
    from diffusers import DDIMScheduler

    from evalkit.canary import CanaryPipeline, CanaryTextEncoder, CanaryUNet
    from evalkit.canary.styles import STYLES

    t_start = time.time()
    torch.manual_seed(args.seed)
    device = torch.device(args.device if args.device else ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    log = []
    cl = torch.channels_last

    loader = torch.utils.data.DataLoader(
        make_iterable(args.photos, args.seed, args.item_batch),
        batch_size=None,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        prefetch_factor=4 if args.workers > 0 else None,
    )
    replay = Replay(loader, args.buffer, device)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    vae, reused = build_vae(args, device)
    unet_cfg = dict(
        channels=_ints(args.unet_channels),
        blocks=_ints(args.unet_blocks),
        head_channels=args.unet_head_channels,
        num_heads=args.unet_heads,
    )
    if args.init_from:
        # continue training a saved pipeline's denoiser and text encoder (its architecture wins
        # over the --unet-* options); the schedule, EMA and data restart
        unet = CanaryUNet.from_pretrained(str(Path(args.init_from) / "unet")).float().to(device)
        text_encoder = (
            CanaryTextEncoder.from_pretrained(str(Path(args.init_from) / "text_encoder")).float().to(device)
        )
        unet_cfg = {
            k: (tuple(v) if isinstance(v, list) else v)
            for k, v in unet.config.items()
            if not k.startswith("_")
        }
        print(f"denoiser and text encoder initialised from {args.init_from}", flush=True)
    else:
        text_encoder = CanaryTextEncoder().to(device)
        unet = CanaryUNet(**unet_cfg).to(device)
    print(
        f"unet {sum(p.numel() for p in unet.parameters()) / 1e6:.2f} M parameters {unet_cfg}; "
        f"vae {sum(p.numel() for p in vae.parameters()) / 1e6:.2f} M "
        f"(source_channels {vae.config.source_channels})",
        flush=True,
    )
    lp = load_lpips(args.lpips_weights, device)
    replay.wait(min(args.buffer, args.min_items))
    print(f"[{time.time() - t_start:6.1f}s] buffer {replay.count} items; training", flush=True)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp)

    # ---- phase 1: autoencoder (pairs of frames: L1 + LPIPS + temporal consistency); with
    # --reuse-vae the encoder (the latent space) stays frozen and only the decoder is tuned
    ae_steps = 0
    if args.ae_seconds > 0 or args.ae_steps > 0:
        if reused:
            vae.requires_grad_(False)
            for name, mod in vae.named_children():
                if not name.startswith("enc"):
                    mod.requires_grad_(True)
        ae_params = [p for p in vae.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(ae_params, lr=args.ae_lr, weight_decay=0.0)
        t0, step = time.time(), 0
        nb = max(1, args.ae_batch // 2)
        while _advance(opt, step, args.ae_steps, args.ae_seconds, t0, args.ae_lr):
            replay.ingest()
            idx = replay.sample(nb, gen)
            which = torch.randint(0, 9, (nb,), device=device, generator=gen)
            src = replay.src[idx]  # (nb, 2, H, W, 3)
            tgt = replay.tgt[idx, (which - 1).clamp(min=0)]
            img = torch.where((which == 0)[:, None, None, None, None], src, tgt)
            x = to_unit(img.flatten(0, 1)).contiguous(memory_format=cl)
            s_px = to_unit(src.flatten(0, 1)).contiguous(memory_format=cl)
            with autocast():
                z = vae.encode(x).latents
                y = vae.decode(z, source=s_px).sample
                l1 = (y.float() - x).abs().mean()
                lpl = lp(y.float(), x).mean()
                reg = 1e-4 * z.float().pow(2).mean()
                lt = temporal_loss(y.float().unflatten(0, (nb, 2)), x.unflatten(0, (nb, 2)), replay.warp[idx])
                lg = y.new_zeros(())  # weighted sharpness terms
                if args.ae_grad > 0:
                    lg = lg + args.ae_grad * gradient_loss(y, x)
                if args.ae_grad_energy > 0:
                    lg = lg + args.ae_grad_energy * gradient_energy_loss(y, x)
                loss = l1 + args.lpips_weight * lpl + reg + args.ae_temporal_weight * lt + lg
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ae_params, 1.0)
            opt.step()
            step += 1
            if step % 200 == 0 or step == 1:
                print(
                    f"[{time.time() - t_start:6.1f}s] ae step {step} l1 {l1.item():.4f} "
                    f"lpips {lpl.item():.4f} temporal {lt.item():.4f} sharpness {lg.item():.4f} "
                    f"items {replay.seen}",
                    flush=True,
                )
                log.append(
                    dict(
                        phase="ae",
                        step=step,
                        l1=l1.item(),
                        lpips=lpl.item(),
                        temporal=lt.item(),
                        sharpness=lg.item(),
                    )
                )
        ae_steps = step
    vae.eval().requires_grad_(False)

    if ae_steps and not reused:
        # latent statistics -> scaling factor (a reused, frozen encoder keeps its own)
        with torch.no_grad(), autocast():
            idx = replay.sample(256, gen)
            z = vae.encode(to_unit(replay.src[idx, 0]).contiguous(memory_format=cl)).latents.float()
        shift, std = z.mean().item(), z.std().item()
        vae.register_to_config(scaling_factor=1.0 / std, shift_factor=shift)
    print(f"latent shift {vae.config.shift_factor:.4f} scale {vae.config.scaling_factor:.4f}", flush=True)

    # ---- phase 2: denoiser + text encoder
    sched = DDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        prediction_type="sample",
        clip_sample=False,
        set_alpha_to_one=True,
        steps_offset=1,
        timestep_spacing="trailing",
        num_train_timesteps=1000,
    )
    abar = sched.alphas_cumprod.to(device)
    params = list(unet.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    ema_unet = CanaryUNet(**unet_cfg).to(device)
    ema_unet.load_state_dict(unet.state_dict())
    ema_text = CanaryTextEncoder().to(device)
    ema_text.load_state_dict(text_encoder.state_dict())
    ema_pairs = [
        (e, p)
        for m, em in ((unet, ema_unet), (text_encoder, ema_text))
        for e, p in zip(em.parameters(), m.parameters())
    ]
    prompts = list(STYLES) + [""]
    ids_all = text_encoder.tokenize(prompts).to(device)  # (9, L); row 8 = null
    scale, shiftf = vae.config.scaling_factor, vae.config.shift_factor
    use_img = (
        args.img_l1 > 0
        or args.img_lpips > 0
        or args.temporal_weight > 0
        or args.img_grad > 0
        or args.img_grad_energy > 0
    )

    t0, step = time.time(), 0
    while _advance(opt, step, args.steps, args.seconds, t0, args.lr):
        replay.ingest()
        nb = args.batch  # clips of 2 frames
        idx = replay.sample(nb, gen)
        style = torch.randint(0, 8, (nb,), device=device, generator=gen)
        src = replay.src[idx]  # (nb, 2, H, W, 3)
        tgt = replay.tgt[idx, style]  # (nb, 2, H, W, 3)
        src_px = to_unit(src.flatten(0, 1)).contiguous(memory_format=cl)
        tgt_px = to_unit(tgt.flatten(0, 1)).contiguous(memory_format=cl)
        with torch.no_grad(), autocast():
            zz = (vae.encode(torch.cat([src_px, tgt_px])).latents.float() - shiftf) * scale
        z_src, z_tgt = zz[: nb * 2], zz[nb * 2 :]
        drop = torch.rand(nb, device=device, generator=gen) < 0.1
        prompt_idx = torch.where(drop, torch.full_like(style, 8), style)
        t = torch.randint(0, 1000, (nb,), device=device, generator=gen)
        # the clean latent that gets noised: the target (as in plain diffusion training), the
        # source (as img2img sampling starts), or a point on the source->target edit line up to
        # 1.75x past the target (as earlier under- or over-shooting, e.g. guided, steps leave it),
        # so that the denoiser learns to land on the target from all of them
        u = torch.rand(nb, device=device, generator=gen)
        lam = torch.where(
            u < args.from_src,
            torch.zeros_like(u),
            torch.where(
                u < args.from_src + args.edit_aug,
                1.75 * torch.rand(nb, device=device, generator=gen),
                torch.ones_like(u),
            ),
        )
        lam = torch.where(drop, torch.ones_like(lam), lam).repeat_interleave(2).view(-1, 1, 1, 1)
        noise = torch.randn((nb, 1) + tuple(z_src.shape[1:]), device=device, generator=gen)
        noise = noise.expand(-1, 2, -1, -1, -1).flatten(0, 1)  # shared across the 2 frames
        t2 = t.repeat_interleave(2)
        a = abar[t2].view(-1, 1, 1, 1)
        base = z_src + lam * (z_tgt - z_src)
        z_t = a.sqrt() * base + (1 - a).sqrt() * noise
        with autocast():
            hid, pooled, mask = text_encoder(ids_all[prompt_idx])
            hid = hid.repeat_interleave(2, 0)
            pooled = pooled.repeat_interleave(2, 0)
            mask = mask.repeat_interleave(2, 0)
            pred = unet(
                z_t.contiguous(memory_format=cl),
                t2,
                z_src.contiguous(memory_format=cl),
                hid,
                pooled,
                mask,
                num_frames=2,
            ).sample
            l_lat = F.mse_loss(pred.float(), z_tgt)
            loss = args.latent_weight * l_lat
            if use_img:
                y = vae.decode(pred / scale + shiftf, source=src_px).sample.float()
                l_l1 = (y - tgt_px).abs().mean()
                l_gr = gradient_loss(y, tgt_px) if args.img_grad > 0 else y.new_zeros(())
                l_ge = gradient_energy_loss(y, tgt_px) if args.img_grad_energy > 0 else y.new_zeros(())
                l_lp = lp(y, tgt_px).mean() if args.img_lpips > 0 else y.new_zeros(())
                l_tm = (
                    temporal_loss(y.unflatten(0, (nb, 2)), tgt_px.unflatten(0, (nb, 2)), replay.warp[idx])
                    if args.temporal_weight > 0
                    else y.new_zeros(())
                )
                loss = (
                    loss
                    + args.img_l1 * l_l1
                    + args.img_lpips * l_lp
                    + args.temporal_weight * l_tm
                    + args.img_grad * l_gr
                    + args.img_grad_energy * l_ge
                )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            torch._foreach_lerp_([e for e, _ in ema_pairs], [p.detach() for _, p in ema_pairs], 1 - d)
        step += 1
        if step % 250 == 0 or step == 1:
            parts = dict(loss=loss.item(), latent_mse=l_lat.item())
            if use_img:
                parts.update(
                    img_l1=l_l1.item(),
                    img_lpips=l_lp.item(),
                    temporal=l_tm.item(),
                    img_grad=l_gr.item(),
                    img_grad_energy=l_ge.item(),
                )
            print(
                f"[{time.time() - t_start:6.1f}s] unet step {step} "
                + " ".join(f"{k} {v:.4f}" for k, v in parts.items())
                + f" items {replay.seen}",
                flush=True,
            )
            log.append(dict(phase="unet", step=step, **parts))
    unet_steps = step
    replay._stop = True
    t_train = time.time() - t_start

    # ---- the default guidance interval, chosen on validation items (not the held-out set)
    pipe = CanaryPipeline(
        vae=vae.float(),
        text_encoder=ema_text.float(),
        unet=ema_unet.float(),
        scheduler=sched,
        guidance_steps=args.guidance_steps,
    )
    pipe.set_progress_bar_config(disable=True)
    validation = None
    if args.val_items > 0:
        with np.load(args.photos) as zf:
            photos = [zf[k] for k in sorted(zf.files)]
        tv = time.time()
        pipe.to(device)
        best, validation = validate_guidance(pipe, photos, args, device, lp)
        pipe.register_to_config(guidance_steps=best)
        print(
            f"[{time.time() - t_start:6.1f}s] default guidance_steps = {best} "
            f"(validation {time.time() - tv:.1f}s)",
            flush=True,
        )

    # ---- save (fp16 weights)
    pipe.to("cpu")
    for m in (pipe.vae, pipe.text_encoder, pipe.unet):
        m.to(memory_format=torch.contiguous_format)
    pipe.to(torch.float16)
    pipe.save_pretrained(args.out, safe_serialization=True)
    info = dict(
        seed=args.seed,
        device=torch.cuda.get_device_name(0) if amp else "cpu",
        ae_steps=ae_steps,
        unet_steps=unet_steps,
        items_generated=replay.seen,
        ae_batch=args.ae_batch,
        batch_clips=args.batch,
        workers=args.workers,
        unet_config=unet_cfg,
        vae_reused_from=args.reuse_vae,
        init_from=args.init_from,
        guidance_steps=pipe.config.guidance_steps,
        validation=validation,
        seconds_training=round(t_train, 1),
        seconds_total=round(time.time() - t_start, 1),
        args=vars(args),
        log=log,
        torch=torch.__version__,
    )
    with open(Path(args.out) / "training.json", "w") as f:
        json.dump(info, f, indent=1)
    print(
        f"saved to {args.out}: ae {ae_steps} steps, unet {unet_steps} steps, "
        f"{replay.seen} items, {time.time() - t_start:.0f}s",
        flush=True,
    )
    sys.stdout.flush()
    os._exit(0)  # do not wait for the data workers' pipes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="pack the training photographs into one .npz")
    p.add_argument("--out", default=".canary_data/photos.npz")
    p = sub.add_parser("train", help="train and save the pipeline folder (fp16)")
    p.add_argument("--photos", default=".canary_data/photos.npz")
    p.add_argument("--out", default="models/canary")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=int, default=13)
    p.add_argument("--item-batch", type=int, default=8)
    p.add_argument("--buffer", type=int, default=12000)
    p.add_argument("--min-items", type=int, default=1500)
    p.add_argument(
        "--reuse-vae",
        default=None,
        metavar="PIPELINE_DIR",
        help="start from the autoencoder of this pipeline folder (its encoder, so the "
        "latent space, stays frozen); read before --out is written",
    )
    p.add_argument(
        "--vae-source-channels",
        type=int,
        default=16,
        help="source-conditioned decoder width (0: the plain decoder)",
    )
    p.add_argument(
        "--ae-seconds",
        type=float,
        default=110,
        help="autoencoder training (with --reuse-vae: decoder tuning) time; 0 skips",
    )
    p.add_argument("--ae-steps", type=int, default=0, help="fixed step count (0: by time)")
    p.add_argument("--ae-batch", type=int, default=64, help="frames per step (pairs of frames)")
    p.add_argument("--ae-lr", type=float, default=1e-3)
    p.add_argument("--ae-temporal-weight", type=float, default=1.0)
    p.add_argument("--lpips-weight", type=float, default=1.0)
    p.add_argument(
        "--ae-grad", type=float, default=0.0, help="weight of the image-gradient L1 term in decoder tuning"
    )
    p.add_argument(
        "--ae-grad-energy",
        type=float,
        default=0.0,
        help="weight of the local gradient-energy term in decoder tuning",
    )
    p.add_argument(
        "--lpips-weights",
        default=os.environ.get("CANARY_LPIPS_WEIGHTS"),
        help="alex LPIPS safetensors (default: $CANARY_LPIPS_WEIGHTS, else the evalkit cache)",
    )
    p.add_argument("--seconds", type=float, default=330)
    p.add_argument("--steps", type=int, default=0, help="fixed step count (0: by time)")
    p.add_argument("--batch", type=int, default=128, help="clips (of 2 frames) per step")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--ema", type=float, default=0.998)
    p.add_argument("--unet-channels", default="96,192")
    p.add_argument("--unet-blocks", default="1,2", help="residual blocks per level, each side")
    p.add_argument("--unet-head-channels", type=int, default=64)
    p.add_argument("--unet-heads", type=int, default=6)
    p.add_argument("--latent-weight", type=float, default=1.0, help="latent MSE")
    p.add_argument("--img-l1", type=float, default=1.0, help="L1 of the decoded prediction")
    p.add_argument("--img-lpips", type=float, default=1.0, help="LPIPS of the decoded prediction")
    p.add_argument(
        "--img-grad", type=float, default=0.0, help="image-gradient L1 of the decoded prediction (sharpness)"
    )
    p.add_argument(
        "--img-grad-energy",
        type=float,
        default=0.0,
        help="local gradient-energy L1 of the decoded prediction (texture amount)",
    )
    p.add_argument(
        "--init-from",
        default=None,
        metavar="PIPELINE_DIR",
        help="start the denoiser and text encoder from a saved pipeline's weights",
    )
    p.add_argument(
        "--temporal-weight",
        type=float,
        default=1.0,
        help="flicker against the known camera move, decoded prediction vs target",
    )
    p.add_argument(
        "--from-src", type=float, default=0.15, help="share of noisy inputs made from the source latent"
    )
    p.add_argument(
        "--edit-aug",
        type=float,
        default=0.3,
        help="share made from a point on the source->target line (0..1.75)",
    )
    p.add_argument(
        "--guidance-steps", type=int, default=2, help="default guidance interval when no validation runs"
    )
    p.add_argument(
        "--val-items",
        type=int,
        default=16,
        help="validation clips for choosing the guidance interval (0: skip)",
    )
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        return cmd_pack(args)
    problem = check_train_inputs(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return cmd_train(args)


def check_train_inputs(args) -> str | None:
    """The first missing input of ``train`` as one line (option, path, what was expected),
    before any worker starts or any output is written; None when all are there."""
    need = [("--photos", args.photos, "a photos .npz (train.py pack writes one)", "file")]
    if args.lpips_weights:
        need.append(("--lpips-weights", args.lpips_weights, "an alex LPIPS .safetensors", "file"))
    if args.reuse_vae:
        need.append(("--reuse-vae", str(Path(args.reuse_vae) / "vae"), "a pipeline folder's vae/", "dir"))
    if args.init_from:
        for part in ("unet", "text_encoder"):
            need.append(
                ("--init-from", str(Path(args.init_from) / part), f"a pipeline folder's {part}/", "dir")
            )
    for option, path, what, kind in need:
        ok = Path(path).is_file() if kind == "file" else Path(path).is_dir()
        if not ok:
            found = "something else" if Path(path).exists() else "nothing"
            return f"{option}: expected {what} at {path}, found {found}"
    return None


if __name__ == "__main__":
    sys.exit(main())
