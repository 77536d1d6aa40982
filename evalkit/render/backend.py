"""Backend specs and the environment fingerprint.

A backend spec is ``device[,key=value...]``, for example ``cuda:0,dtype=bf16,attn=flash`` or
``cpu,dtype=fp32``. AMD GPUs run through the same ``cuda`` device path of PyTorch's ROCm
build; the fingerprint records the HIP version there.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from evalkit.errors import UserError

#: key -> allowed values (None: free text). The first value is the default.
SPEC_KEYS: dict[str, tuple | None] = {
    "dtype": ("fp32", "bf16", "fp16"),
    "attn": ("auto", "flash", "efficient", "math", "cudnn"),
    "tf32": ("off", "on"),
    "deterministic": ("on", "off"),
    "compile": ("off", "on"),
    "resource": None,
}
_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+|mps)$")
_BOOL_ALIASES = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}


class BackendSpecError(UserError):
    """A backend spec string that cannot be parsed."""


@dataclass(frozen=True)
class BackendSpec:
    device: str = "cpu"
    dtype: str = "fp32"
    attn: str = "auto"
    tf32: str = "off"
    deterministic: str = "on"
    compile: str = "off"
    resource: str | None = None

    def options(self) -> list[tuple[str, str]]:
        """``(key, value)`` of every key that differs from its default, in :data:`SPEC_KEYS`
        order (what the canonical string and a run's folder name are made of)."""
        out = []
        for key, allowed in SPEC_KEYS.items():
            value = getattr(self, key)
            if value != (allowed[0] if allowed else None):
                out.append((key, value))
        return out

    @property
    def spec(self) -> str:
        """The canonical string: device first, then every key that differs from its default."""
        return ",".join([self.device, *(f"{k}={v}" for k, v in self.options())])

    def to_dict(self) -> dict:
        return {"spec": self.spec, **asdict(self)}


def parse_spec(text: str) -> BackendSpec:
    """Parse ``device[,key=value...]``; errors list the valid keys and values."""
    if not isinstance(text, str) or not text.strip():
        raise BackendSpecError(f"backend spec: expected 'device[,key=value...]', found {text!r}")
    parts = [p.strip() for p in text.split(",")]
    device = parts[0].lower()
    if not _DEVICE_RE.match(device):
        raise BackendSpecError(
            f"backend spec {text!r}: device {parts[0]!r} is not one of cpu, cuda, cuda:N, mps"
        )
    values: dict[str, str] = {}
    valid = ", ".join(f"{k}={'|'.join(v) if v else '<name>'}" for k, v in SPEC_KEYS.items())
    for part in parts[1:]:
        if "=" not in part:
            raise BackendSpecError(f"backend spec {text!r}: {part!r} is not key=value (valid keys: {valid})")
        key, value = (s.strip() for s in part.split("=", 1))
        key = key.lower()
        if key not in SPEC_KEYS:
            raise BackendSpecError(f"backend spec {text!r}: unknown key {key!r} (valid keys: {valid})")
        if key in values:
            raise BackendSpecError(f"backend spec {text!r}: key {key!r} given twice")
        allowed = SPEC_KEYS[key]
        if not value:
            raise BackendSpecError(
                f"backend spec {text!r}: {key}= needs a value"
                + (f" ({'|'.join(allowed)})" if allowed else " (a name)")
            )
        if allowed is not None:
            value = _BOOL_ALIASES.get(value.lower(), value.lower())
            if value not in allowed:
                raise BackendSpecError(
                    f"backend spec {text!r}: {key}={value!r} is not one of {', '.join(allowed)}"
                )
        values[key] = value
    return BackendSpec(device=device, **values)


# -- fingerprint ---------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: NVIDIA's kernel module states its version here (the same string nvidia-smi prints as
#: driver_version), read in microseconds instead of nvidia-smi's tenths of a second
_NVIDIA_PROC = Path("/proc/driver/nvidia/version")
_NVIDIA_PROC_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")


@functools.lru_cache(maxsize=None)
def _gpu_driver() -> str | None:
    try:
        m = _NVIDIA_PROC_RE.search(_NVIDIA_PROC.read_text())
        if m:
            return m.group(1)
    except OSError:
        pass
    for cmd in (
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        ["rocm-smi", "--showdriverversion"],
    ):
        if shutil.which(cmd[0]):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
            if lines:
                return lines[0] if cmd[0] == "nvidia-smi" else lines[-1]
    return None


def fingerprint(spec: BackendSpec | None = None) -> dict:
    """What ran: host, OS, CPU, device, driver, CUDA/HIP, library versions, numeric flags."""
    import numpy as np
    import torch

    from evalkit import __version__

    try:
        import av
    except ImportError:  # rendering needs it (clips are written with it); a fingerprint does not
        av = None

    fp = {
        "host": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "evalkit": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "av": av.__version__ if av is not None else None,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    device = spec.device if spec else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        fp.update(
            device=device,
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            compute_capability=f"{props.major}.{props.minor}",
            driver=_gpu_driver(),
        )
    else:
        fp.update(device=device, device_name=_cpu_model() if device == "cpu" else device, driver=None)
    fp.update(
        matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
        cudnn_tf32=torch.backends.cudnn.allow_tf32,
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cudnn_deterministic=torch.backends.cudnn.deterministic,
    )
    if spec is not None:
        fp.update(dtype=spec.dtype, attention=spec.attn, compile=spec.compile)
    return fp


def usable_backends() -> list[dict]:
    """Backends that can run on this machine, with a short description each."""
    import torch

    out = [
        {"spec": "cpu,dtype=fp32", "description": f"CPU ({_cpu_model()}), float32"},
        {"spec": "cpu,dtype=bf16", "description": "CPU, bfloat16"},
    ]
    if torch.cuda.is_available():
        kind = "ROCm/HIP" if getattr(torch.version, "hip", None) else "CUDA"
        for i in range(torch.cuda.device_count()):
            name = torch.cuda.get_device_name(i)
            out.append({"spec": f"cuda:{i},dtype=bf16", "description": f"{kind} {name}, bfloat16"})
            out.append({"spec": f"cuda:{i},dtype=fp32", "description": f"{kind} {name}, float32"})
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        out.append({"spec": "mps,dtype=fp32", "description": "Apple GPU (MPS), float32"})
    return out


def environment_info() -> dict:
    return {"fingerprint": fingerprint(), "backends": usable_backends()}


# -- applying a spec -----------------------------------------------------------------------

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_SDPA = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
    "cudnn": "CUDNN_ATTENTION",
}


@dataclass(frozen=True)
class Runtime:
    """What a renderer needs to know about the applied backend."""

    spec: BackendSpec
    device: object  # torch.device
    dtype: object  # torch.dtype
    compile: bool


def check_available(spec: BackendSpec) -> None:
    """Fail early, with the list of usable backends, when a spec cannot run here."""
    import torch

    usable = ", ".join(b["spec"] for b in usable_backends())
    if spec.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BackendSpecError(
                f"backend {spec.spec!r}: CUDA/ROCm is not available here "
                f"(torch {torch.__version__}, no GPU found); usable: {usable}"
            )
        if ":" in spec.device and int(spec.device.split(":")[1]) >= torch.cuda.device_count():
            raise BackendSpecError(
                f"backend {spec.spec!r}: no such GPU ({torch.cuda.device_count()} found); usable: {usable}"
            )
    if spec.device == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
        raise BackendSpecError(f"backend {spec.spec!r}: MPS is not available here; usable: {usable}")
    if spec.device in ("cpu", "mps") and spec.attn in ("efficient", "cudnn"):
        raise BackendSpecError(
            f"backend {spec.spec!r}: attn={spec.attn} needs a CUDA device (valid on cpu: auto, flash, math)"
        )


class apply_backend:
    """Context manager: apply a spec's numeric settings, restore them on exit.

    Sets TF32 (matmul and cuDNN), deterministic algorithms (``warn_only``: ops without a
    deterministic implementation warn instead of failing), cuDNN benchmark off, and the
    scaled-dot-product-attention kernel; yields a :class:`Runtime` with device and dtype.
    """

    def __init__(self, spec: BackendSpec):
        self.spec = spec
        self._saved = None
        self._sdpa = None

    def __enter__(self) -> Runtime:
        import torch

        check_available(self.spec)
        self._saved = (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            torch.get_float32_matmul_precision(),
        )
        tf32 = self.spec.tf32 == "on"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        det = self.spec.deterministic == "on"
        if det:
            # cuBLAS needs this for deterministic results; it only takes effect if set before
            # the first CUDA call of the process, which is why the CLI applies specs early.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(det, warn_only=True)
        torch.backends.cudnn.deterministic = det
        torch.backends.cudnn.benchmark = False
        if self.spec.attn != "auto":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self._sdpa = sdpa_kernel([getattr(SDPBackend, _SDPA[self.spec.attn])])
            self._sdpa.__enter__()
        return Runtime(
            self.spec,
            torch.device(self.spec.device),
            getattr(torch, _TORCH_DTYPES[self.spec.dtype]),
            self.spec.compile == "on",
        )

    def __exit__(self, *exc):
        import torch

        if self._sdpa is not None:
            self._sdpa.__exit__(*exc)
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            det,
            warn,
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            prec,
        ) = self._saved
        torch.use_deterministic_algorithms(det, warn_only=warn)
        torch.set_float32_matmul_precision(prec)
        return False
