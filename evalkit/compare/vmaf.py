"""VMAF as an optional pass over clips already measured (``--vmaf`` on ``compare`` and ``metrics``).

VMAF (:mod:`evalkit.metrics.vmaf`) runs in an ffmpeg process over the whole clip, not chunk by chunk
like the stream evaluator, so it is a separate pass: after the stream metrics, each pair of
clips is decoded once more and piped to libvmaf, and the per-frame scores are added to the
records under the key ``vmaf``. The pass needs nothing but the clip paths: it runs where
``compare`` runs, whichever executor measured the stream metrics.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from evalkit.errors import InputFileError
from evalkit.video import ClipReader


def clip_vmaf(
    path_a, path_b, *, frames: int | None = None, n_threads: int | None = None, skip: tuple[int, int] = (0, 0)
):
    """:class:`evalkit.metrics.vmaf.VmafResult` of clip ``path_b`` against reference ``path_a`` (the
    first ``frames`` frames of each, or all, after ``skip``: frames of A and of B left out at
    the start, a temporal offset's). Frame problems name the clip."""
    from evalkit.metrics import MetricInputError
    from evalkit.metrics.vmaf import vmaf

    paths = {"a": Path(path_a), "b": Path(path_b)}
    ia, ib = iter(ClipReader(paths["a"])), iter(ClipReader(paths["b"]))
    if frames is not None or any(skip):
        end = lambda s: None if frames is None else s + frames
        ia, ib = (itertools.islice(ia, skip[0], end(skip[0])), itertools.islice(ib, skip[1], end(skip[1])))
    try:
        return vmaf(ia, ib, n_threads=n_threads)
    except MetricInputError as e:
        msg = str(e)
        for side in ("a", "b"):
            if msg.startswith(f"{side}: "):
                raise InputFileError(
                    paths[side], "VMAF: " + msg[3:].replace(" like a", f" like {paths['a']}")
                ) from None
        raise InputFileError(paths["b"], f"VMAF against {paths['a']}: {msg}") from None


def add_vmaf(
    records: list[dict], path_a, path_b, *, n_threads: int | None = None, skip: tuple[int, int] = (0, 0)
) -> str:
    """Score the clips and set ``rec["vmaf"]`` on each record (records in frame order, the
    first ``len(records)`` frames of each clip after ``skip``); return the VMAF convention string."""
    res = clip_vmaf(path_a, path_b, frames=len(records), n_threads=n_threads, skip=skip)
    for rec, score in zip(records, res.scores):
        rec["vmaf"] = float(score)
    return res.convention


def add_vmaf_to_measures(measures, *, n_threads: int | None = None, progress=None) -> str | None:
    """:func:`add_vmaf` for every :class:`evalkit.compare.pairing.JobMeasure` (its records, and
    ``summary["means"]["vmaf"]``); the convention string, or None when there was nothing to score."""
    convention = None
    for m in measures:
        al = getattr(m, "alignment", None)
        convention = add_vmaf(
            m.records,
            m.pair.path_a,
            m.pair.path_b,
            n_threads=n_threads,
            skip=(al.skip_a, al.skip_b) if al is not None else (0, 0),
        )
        scores = [r["vmaf"] for r in m.records]
        m.summary.setdefault("means", {})["vmaf"] = sum(scores) / len(scores) if scores else None
        if progress is not None:
            progress.update(1)
    return convention
