"""The lossless formats of run clips (``render --lossless``): a small table, no heavy imports
(the command line reads the names from here).

Every format stores exact RGB: the frames read back are byte-identical to those written
(:func:`evalkit.video.write_lossless` writes them, any reader of :mod:`evalkit.video` reads
them).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LosslessFormat:
    """One lossless format of run clips: the codec, its container and file extension."""

    name: str  # what --lossless and the run manifest call it
    ext: str  # the file extension, with its dot
    container: str  # FFmpeg muxer
    codec: str  # FFmpeg encoder
    pix_fmt: str  # stored pixel format (RGB, exact)
    options: dict = field(default_factory=dict)
    summary: str = ""
    magic: bytes = b""  # how its files start (a clip's bytes are checked against it)


#: The lossless formats of run clips (``render --lossless``), every one exact RGB.
#: FFV1 (a new run's default on the CPU) makes the smallest files; UT Video's (the default on a
#: device) are 1.15-1.5x larger and decode 6-7x faster (11-14 ms of CPU per 1280x720 frame
#: against FFV1's 75-98). PyAV refuses UT Video in Matroska (its compliance check), so it lives
#: in NUT, FFmpeg's own container.
LOSSLESS_FORMATS: dict[str, LosslessFormat] = {
    "ffv1": LosslessFormat(
        "ffv1",
        ".mkv",
        "matroska",
        "ffv1",
        "bgr0",
        {"level": "3", "slicecrc": "1", "g": "1"},
        "FFV1 level 3 in Matroska, bgr0",
        bytes.fromhex("1a45dfa3"),
    ),
    "utvideo": LosslessFormat(
        "utvideo",
        ".nut",
        "nut",
        "utvideo",
        "gbrp",
        {"pred": "left"},
        "UT Video in NUT, gbrp, left prediction",
        b"nut/multimedia container\0",
    ),
}
#: The lossless format of a run whose manifest names none (every run before there was a choice),
#: and of a new run rendered on the CPU when ``--lossless`` names none
DEFAULT_LOSSLESS = "ffv1"
#: The lossless format of a new run rendered on a device (a GPU) when ``--lossless`` names none:
#: there writing sets the pace of small jobs, and ``compare`` reads at GPU speed. On the H200 the
#: canary's last burst of 8 clips and 8 browser copies took 0.09-0.11 s with UT Video against
#: 0.18-0.20 s with FFV1, and UT Video decodes 6-7x faster (benchmarks/README.md, "Render
#: overhead", session 16)
DEVICE_LOSSLESS = "utvideo"


def new_run_format(on_device: bool) -> str:
    """The lossless format of a new run when ``--lossless`` names none: :data:`DEVICE_LOSSLESS`
    for a run rendered on a device (``on_device``), else :data:`DEFAULT_LOSSLESS`."""
    return DEVICE_LOSSLESS if on_device else DEFAULT_LOSSLESS


def lossless_format(codec: str) -> LosslessFormat:
    """The :class:`LosslessFormat` named ``codec`` (ValueError naming the choices)."""
    try:
        return LOSSLESS_FORMATS[codec]
    except (KeyError, TypeError):
        raise ValueError(f"codec: expected one of {', '.join(LOSSLESS_FORMATS)}, found {codec!r}") from None


def run_format(manifest: dict) -> LosslessFormat:
    """The lossless format of a run's clips from its manifest (a ``dict``): ``lossless.codec``,
    ``ffv1`` when the manifest names none (every run made before there was a choice)."""
    return lossless_format((manifest.get("lossless") or {}).get("codec") or DEFAULT_LOSSLESS)
