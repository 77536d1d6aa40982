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
    python evalkit/canary/train.py pack --out .canary_data/photos.npz
    # train (about 9 minutes on one H200) and write the pipeline folder in fp16
    python evalkit/canary/train.py train --photos .canary_data/photos.npz --out models/canary \\
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
REPO = HERE.parents[2]
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
HELD_OUT = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field", "china",
            "flower")

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
    if grey and rng.random() < 0.6:                      # tint grey photographs
        tint = rng.uniform(0.7, 1.15, 3).astype(np.float32)
        x = x * tint
    lum = x.mean(axis=2, keepdims=True)
    x = lum + (x - lum) * rng.uniform(0.6, 1.4)          # saturation
    x = (x - 0.5) * rng.uniform(0.7, 1.3) + 0.5 + rng.uniform(-0.15, 0.15)  # contrast, brightness
    x = np.clip(x, 0, 1) ** rng.uniform(0.75, 1.35)      # gamma
    x = x * rng.uniform(0.9, 1.1, 3).astype(np.float32)  # white balance
    return np.clip(x * 255.0 + 0.5, 0, 255).astype(np.uint8)


def make_item(photos: list[np.ndarray], rng: np.random.Generator, frames: int = 2):
    """One training item: (frames, CROP, CROP, 3) source frames and (8, frames, ...) targets."""
    import cv2

    from evalkit.canary.styles import STYLES

    img = photos[rng.integers(len(photos))]
    h, w = img.shape[:2]
    side = min(h, w)
    crop = float(np.exp(rng.uniform(np.log(64), np.log(max(65.0, 1.1 * side)))))
    scale = CROP / crop
    src = img
    if scale < 0.5:                                      # area-prescale so warps do not alias
        f = scale * 2.0
        src = cv2.resize(img, (max(1, int(w * f)), max(1, int(h * f))), interpolation=cv2.INTER_AREA)
        scale, h, w = scale / f, src.shape[0], src.shape[1]
    src = _jitter(src, rng)
    cx, cy = rng.uniform(0.25, 0.75) * w, rng.uniform(0.25, 0.75) * h
    angle = rng.uniform(-20, 20) if rng.random() < 0.7 else 0.0
    flip = rng.random() < 0.5
    out_frames = []
    # camera motion between frames: shift, rotation, zoom, a little perspective
    dx, dy = rng.normal(0, 3.0, 2)
    dang, dscale = rng.normal(0, 0.8), float(np.exp(rng.normal(0, 0.02)))
    persp = rng.normal(0, 1.5e-4, 2)
    blur = rng.uniform(0.4, 1.2) if rng.random() < 0.25 else 0.0
    noise = rng.uniform(1.0, 4.0) if rng.random() < 0.2 else 0.0
    for k in range(frames):
        m = cv2.getRotationMatrix2D((cx, cy), angle + k * dang, scale * dscale ** k)
        m[0, 2] += CROP / 2 - cx + k * dx
        m[1, 2] += CROP / 2 - cy + k * dy
        H = np.vstack([m, [0, 0, 1]])
        if k:
            P = np.array([[1, 0, 0], [0, 1, 0], [persp[0], persp[1], 1]], np.float64)
            C = np.array([[1, 0, -CROP / 2], [0, 1, -CROP / 2], [0, 0, 1]], np.float64)
            H = np.linalg.inv(C) @ P @ C @ H
        f = cv2.warpPerspective(src, H, (CROP, CROP), flags=cv2.INTER_CUBIC,
                                borderMode=cv2.BORDER_REFLECT)
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
    return srcs, tgts


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
            yield (torch.from_numpy(np.stack([s for s, _ in items])),
                   torch.from_numpy(np.stack([t for _, t in items])))


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
        self.count = 0
        self.seen = 0
        self.q: queue.Queue = queue.Queue(maxsize=64)
        self._stop = False
        self.error = None
        it = iter(loader)   # fork the workers from the main thread (forking in a thread can deadlock)
        self.thread = threading.Thread(target=self._pump, args=(it,), daemon=True)
        self.thread.start()

    def _pump(self, loader):
        pin = self.device.type == "cuda"
        try:
            for s, t in loader:
                if self._stop:
                    return
                self.q.put((s.pin_memory(), t.pin_memory()) if pin else (s, t))
        except BaseException as e:  # surfaced by ingest()
            self.error = e

    def ingest(self, max_batches: int = 8):
        if self.error is not None:
            raise RuntimeError(f"data worker failed: {self.error!r}") from self.error
        n = 0
        while n < max_batches:
            try:
                s, t = self.q.get_nowait()
            except queue.Empty:
                break
            k = s.shape[0]
            idx = (self.seen + np.arange(k)) % self.capacity
            idx = self._t(idx)
            self.src[idx] = s.to(self.device, non_blocking=True)
            self.tgt[idx] = t.to(self.device, non_blocking=True)
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
    import torch

    net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    if path is None:
        from metrics._weights import load_state_dict
        sd = load_state_dict("alex")
    else:
        from safetensors.torch import load_file
        sd = load_file(path)
    net.load_state_dict(sd, strict=False)
    net.eval().requires_grad_(False)
    return net.to(device)


def cmd_train(args) -> int:
    import torch
    import torch.nn.functional as F
    from diffusers import DDIMScheduler

    from evalkit.canary import CanaryAutoencoder, CanaryPipeline, CanaryTextEncoder, CanaryUNet
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

    loader = torch.utils.data.DataLoader(
        make_iterable(args.photos, args.seed, args.item_batch), batch_size=None,
        num_workers=args.workers, persistent_workers=args.workers > 0,
        prefetch_factor=4 if args.workers > 0 else None)
    replay = Replay(loader, args.buffer, device)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    vae = CanaryAutoencoder().to(device)
    text_encoder = CanaryTextEncoder().to(device)
    unet = CanaryUNet().to(device)
    lp = load_lpips(args.lpips_weights, device)
    replay.wait(min(args.buffer, args.min_items))
    print(f"[{time.time() - t_start:6.1f}s] buffer {replay.count} items; training", flush=True)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp)

    # ---- phase 1: autoencoder
    opt = torch.optim.AdamW(vae.parameters(), lr=args.ae_lr, weight_decay=0.0)
    t0, step = time.time(), 0
    while True:
        frac = (step / args.ae_steps) if args.ae_steps else (time.time() - t0) / args.ae_seconds
        if frac >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(frac, args.ae_lr)
        replay.ingest()
        idx = replay.sample(args.ae_batch, gen)
        fr = torch.randint(0, 2, (args.ae_batch,), device=device, generator=gen)
        which = torch.randint(0, 9, (args.ae_batch,), device=device, generator=gen)
        src = replay.src[idx, fr]
        tgt = replay.tgt[idx, (which - 1).clamp(min=0), fr]
        img = torch.where((which == 0)[:, None, None, None], src, tgt)
        x = to_unit(img).contiguous(memory_format=torch.channels_last)
        with autocast():
            z = vae.encode(x).latents
            y = vae.decode(z).sample
            l1 = (y.float() - x).abs().mean()
            lpl = lp(y.float(), x).mean()
            reg = 1e-4 * z.float().pow(2).mean()
            loss = l1 + args.lpips_weight * lpl + reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0:
            print(f"[{time.time() - t_start:6.1f}s] ae step {step} l1 {l1.item():.4f} "
                  f"lpips {lpl.item():.4f} items {replay.seen}", flush=True)
            log.append(dict(phase="ae", step=step, l1=l1.item(), lpips=lpl.item()))
    ae_steps = step
    vae.eval().requires_grad_(False)

    # latent statistics -> scaling factor
    with torch.no_grad(), autocast():
        idx = replay.sample(256, gen)
        z = vae.encode(to_unit(replay.src[idx, 0]).contiguous(memory_format=torch.channels_last)).latents.float()
    shift, std = z.mean().item(), z.std().item()
    vae.register_to_config(scaling_factor=1.0 / std, shift_factor=shift)
    print(f"latent mean {shift:.4f} std {std:.4f}", flush=True)

    # ---- phase 2: denoiser + text encoder
    sched = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          prediction_type="sample", clip_sample=False, set_alpha_to_one=True,
                          steps_offset=1, timestep_spacing="trailing", num_train_timesteps=1000)
    abar = sched.alphas_cumprod.to(device)
    params = list(unet.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    ema_unet = CanaryUNet().to(device)
    ema_unet.load_state_dict(unet.state_dict())
    ema_text = CanaryTextEncoder().to(device)
    ema_text.load_state_dict(text_encoder.state_dict())
    ema_pairs = [(e, p) for m, em in ((unet, ema_unet), (text_encoder, ema_text))
                 for e, p in zip(em.parameters(), m.parameters())]
    prompts = list(STYLES) + [""]
    ids_all = text_encoder.tokenize(prompts).to(device)            # (9, L); row 8 = null
    scale, shiftf = vae.config.scaling_factor, vae.config.shift_factor

    t0, step = time.time(), 0
    while True:
        frac = (step / args.steps) if args.steps else (time.time() - t0) / args.seconds
        if frac >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(frac, args.lr)
        replay.ingest()
        nb = args.batch                                           # clips of 2 frames
        idx = replay.sample(nb, gen)
        style = torch.randint(0, 8, (nb,), device=device, generator=gen)
        src = replay.src[idx]                                     # (nb, 2, H, W, 3)
        tgt = replay.tgt[idx, style]                              # (nb, 2, H, W, 3)
        with torch.no_grad(), autocast():
            both = to_unit(torch.cat([src, tgt]).flatten(0, 1)).contiguous(memory_format=torch.channels_last)
            zz = (vae.encode(both).latents.float() - shiftf) * scale
        z_src, z_tgt = zz[: nb * 2], zz[nb * 2:]
        drop = torch.rand(nb, device=device, generator=gen) < 0.1
        prompt_idx = torch.where(drop, torch.full_like(style, 8), style)
        t = torch.randint(0, 1000, (nb,), device=device, generator=gen)
        from_src = (torch.rand(nb, device=device, generator=gen) < 0.2) & ~drop
        noise = torch.randn((nb, 1) + tuple(z_src.shape[1:]), device=device, generator=gen)
        noise = noise.expand(-1, 2, -1, -1, -1).flatten(0, 1)     # shared across the 2 frames
        t2 = t.repeat_interleave(2)
        a = abar[t2].view(-1, 1, 1, 1)
        base = torch.where(from_src.repeat_interleave(2).view(-1, 1, 1, 1), z_src, z_tgt)
        z_t = a.sqrt() * base + (1 - a).sqrt() * noise
        with autocast():
            hid, pooled, mask = text_encoder(ids_all[prompt_idx])
            hid = hid.repeat_interleave(2, 0)
            pooled = pooled.repeat_interleave(2, 0)
            mask = mask.repeat_interleave(2, 0)
            pred = unet(z_t.contiguous(memory_format=torch.channels_last), t2,
                        z_src.contiguous(memory_format=torch.channels_last), hid, pooled, mask,
                        num_frames=2).sample
            loss = F.mse_loss(pred.float(), z_tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            torch._foreach_lerp_([e for e, _ in ema_pairs], [p.detach() for _, p in ema_pairs], 1 - d)
        step += 1
        if step % 250 == 0:
            print(f"[{time.time() - t_start:6.1f}s] unet step {step} loss {loss.item():.4f} "
                  f"items {replay.seen}", flush=True)
            log.append(dict(phase="unet", step=step, loss=loss.item()))
    unet_steps = step
    replay._stop = True

    # ---- save (fp16 weights)
    pipe = CanaryPipeline(vae=vae.float(), text_encoder=ema_text.float(), unet=ema_unet.float(),
                          scheduler=sched)
    pipe.to("cpu")
    for m in (pipe.vae, pipe.text_encoder, pipe.unet):
        m.to(memory_format=torch.contiguous_format)
    pipe.to(torch.float16)
    pipe.save_pretrained(args.out, safe_serialization=True)
    info = dict(seed=args.seed, device=torch.cuda.get_device_name(0) if amp else "cpu",
                ae_steps=ae_steps, unet_steps=unet_steps, items_generated=replay.seen,
                ae_batch=args.ae_batch, batch_clips=args.batch, workers=args.workers,
                seconds_total=round(time.time() - t_start, 1), args=vars(args), log=log,
                torch=torch.__version__)
    with open(Path(args.out) / "training.json", "w") as f:
        json.dump(info, f, indent=1)
    print(f"saved to {args.out}: ae {ae_steps} steps, unet {unet_steps} steps, "
          f"{replay.seen} items, {time.time() - t_start:.0f}s", flush=True)
    os._exit(0)   # do not wait for the data workers' pipes


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
    p.add_argument("--ae-seconds", type=float, default=110)
    p.add_argument("--ae-steps", type=int, default=0, help="fixed step count (0: by time)")
    p.add_argument("--ae-batch", type=int, default=64)
    p.add_argument("--ae-lr", type=float, default=1e-3)
    p.add_argument("--lpips-weight", type=float, default=1.0)
    p.add_argument("--lpips-weights", default=None, help="alex LPIPS safetensors (default: cache)")
    p.add_argument("--seconds", type=float, default=330)
    p.add_argument("--steps", type=int, default=0, help="fixed step count (0: by time)")
    p.add_argument("--batch", type=int, default=128, help="clips (of 2 frames) per step")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--ema", type=float, default=0.998)
    args = ap.parse_args(argv)
    return cmd_pack(args) if args.cmd == "pack" else cmd_train(args)


if __name__ == "__main__":
    sys.exit(main())
