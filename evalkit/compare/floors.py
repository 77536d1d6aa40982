"""Noise floors for footage without seeds (``evalkit floor``), and the floors that cannot be one.

A floor says how much A varies by itself, so that a difference between A and B can be read
against it. Renders with seeds get one by rendering A's suite again with ``--seed-offset``.
Imported footage has no seeds; its floor is, in order of preference:

1. a second render (or import) of A's jobs on A's farm (``rerender``: what the pipeline varies
   from one run to the next; a bit-identical one is refused, below);
2. ``evalkit floor RUN_A --out DIR``: the ``reencode`` floor made here, A's frames through 4:2:0
   YUV and back (BT.601, what a lossless H.264 re-encode in yuv420p keeps): the smallest change
   any delivery of A makes, colour resolution only.

Refused, in one line: A itself or B itself (:func:`evalkit.compare.run.compare_runs`), a run
of B's backend (its label, or its known fingerprint), and a floor whose clips are A's own bytes
or frames (its ratios would all be infinite).
"""

from __future__ import annotations

import copy
import datetime as _dt
from fractions import Fraction
from pathlib import Path

import numpy as np

from evalkit.errors import UserError
from evalkit.formats.run import MANIFEST, RunDir, run_name
from evalkit.fsutil import sha256_file

#: the ``reencode`` floor's recipe, recorded in its manifest's ``notes.floor``
REENCODE_RULE = (
    "A's frames converted to 4:2:0 YUV and back (BT.601, swscale), as a lossless "
    "H.264 re-encode in yuv420p keeps them: only the colour resolution changes"
)

#: the folder suffix of a ``reencode`` floor run (``runs/mi325x-bf16_reencode``)
REENCODE_SUFFIX = "_reencode"


def floor_kind(manifest: dict) -> str | None:
    """``reencode`` for a run made by :func:`make_reencode_floor`, else None."""
    return ((manifest.get("notes") or {}).get("floor") or {}).get("kind")


def roundtrip_420(frame: np.ndarray) -> np.ndarray:
    """One ``(H, W, 3)`` uint8 RGB frame through yuv420p and back (odd sizes too)."""
    import av

    vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
    return vf.reformat(format="yuv420p").to_ndarray(format="rgb24")


def make_reencode_floor(run_a, out, *, progress: bool = True) -> Path:
    """Write ``out/<A's folder>_reencode``: a run with A's suite, label, backend and
    fingerprint whose clips are A's through :func:`roundtrip_420`, one window of frames at a
    time. A floor folder made before from the same A is resumed (done jobs kept); any other
    folder there is refused. Returns the floor run's folder."""
    from tqdm import tqdm

    from evalkit.video import ClipReader, shape_only, write_lossless

    src = Path(run_a)
    if not (src / MANIFEST).is_file():
        raise UserError(
            f"{src}: not a run folder (no {MANIFEST}); expected run A, the run whose floor to make"
        )
    a = RunDir.open(src)
    a.path = a.path.resolve()
    if floor_kind(a.manifest):
        raise UserError(
            f"{a.path}: is itself a {floor_kind(a.manifest)} floor; give the run it "
            f"was made from ({a.manifest['notes']['floor'].get('of')})"
        )
    # a floor of changed clips would measure the wrong noise: A is checked before anything
    # is written
    for rec in [j for j in a.jobs if j["status"] == "done"]:
        clip = a.path / rec["output"]["path"]
        if not clip.is_file():
            raise UserError(
                f"{clip}: clip of job {rec['id']} missing in run A; re-render it "
                "(`evalkit render` resumes) before making its floor"
            )
        found = sha256_file(clip)
        if found != rec["output"].get("sha256"):
            raise UserError(
                f"{clip}: clip fails its hash (sha256 {found[:12]}..., manifest says "
                f"{str(rec['output'].get('sha256'))[:12]}...); re-render it "
                "(`evalkit render` resumes) before making its floor"
            )
    dst = Path(out) / (a.path.name + REENCODE_SUFFIX)
    note = {"kind": "reencode", "of": str(a.path), "rule": REENCODE_RULE}
    if (dst / MANIFEST).is_file():
        floor = RunDir.open(dst)
        if floor.manifest.get("notes", {}).get("floor") != note:
            raise UserError(
                f"{dst}: holds another run, not the reencode floor of {a.path}; choose another --out folder"
            )
    elif dst.exists() and any(dst.iterdir()):
        raise UserError(f"{dst}: exists and is not a run folder; choose another --out folder")
    else:
        m = copy.deepcopy(a.manifest)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        m.update(created=now, updated=now, notes={**(m.get("notes") or {}), "floor": note})
        for rec in m["jobs"]:
            for k in ("output", "preview", "finished", "timing", "error", "adopted_from"):
                rec.pop(k, None)
            rec["status"] = "pending"
        floor = RunDir(dst, m)
        (dst / "clips").mkdir(parents=True, exist_ok=True)
        (dst / "preview").mkdir(parents=True, exist_ok=True)
        floor.save()
    todo = [j for j in a.jobs if j["status"] == "done" and not floor.is_done(j["id"])]
    with tqdm(total=len(todo), desc="floor reencode", unit="job", disable=not progress) as bar:
        for rec in todo:
            clip = a.path / rec["output"]["path"]
            reader = ClipReader(clip)
            fps = Fraction(str(rec["output"].get("fps") or reader.info.fps))
            n = write_lossless(
                floor.clip_path(rec["id"]), (roundtrip_420(f) for f in reader), fps, codec=floor.lossless
            )
            out_ = rec["output"]
            floor.record_done(
                rec["id"], shape_only(n, out_["height"], out_["width"]), fps, preview=False, written=True
            )
            bar.update(1)
    return dst


def floor_refusal(a: RunDir, b: RunDir, f: RunDir) -> str | None:
    """Why run ``f`` cannot be a floor of A against B, in one line (None: it can). Before
    anything is measured: a run of B's backend (same label as B, another than A's; or B's
    known fingerprint, other than A's), or a run whose clips are A's own files byte for byte."""
    ma, mb, mf = a.manifest, b.manifest, f.manifest
    if run_name(mf) == run_name(mb) and run_name(ma) != run_name(mb):
        return (
            f"--floor {f.path}: is a run of B's backend ({run_name(mb)!r}, as RUN_B), not "
            f"A's ({run_name(ma)!r}): a floor measures how much A varies by itself"
        )
    fa, fb, ff = (_known(m.get("fingerprint")) for m in (ma, mb, mf))
    if ff is not None and ff == fb and ff != fa:
        return (
            f"--floor {f.path}: has B's fingerprint (the machine of RUN_B {b.path}), not "
            f"A's: a floor measures how much A varies by itself"
        )
    mine = {j["id"]: (j.get("output") or {}).get("sha256") for j in f.jobs if j["status"] == "done"}
    theirs = {j["id"]: (j.get("output") or {}).get("sha256") for j in a.jobs if j["status"] == "done"}
    common = [k for k in mine if k in theirs]
    if common and all(mine[k] == theirs[k] for k in common):
        return (
            f"--floor {f.path}: its clips are A's own files, byte for byte (a copy of "
            f"RUN_A): every ratio to it would be infinite; {FLOOR_RECIPE}"
        )
    return None


def identical_floor(path, measures) -> str | None:
    """Why a floor whose every compared job is frame-for-frame A's cannot be one (after
    measuring; None: it can)."""
    if measures and all(m.summary.get("identical") for m in measures):
        return (
            f"--floor {path}: every frame is identical to A's (a deterministic re-render): "
            f"every ratio to it would be infinite; {FLOOR_RECIPE}"
        )
    return None


#: what to do instead, in the refusals
FLOOR_RECIPE = (
    "render A's suite with --seed-offset 1, or for footage without seeds "
    "`evalkit floor RUN_A --out DIR` (docs/metrics.md#comparing-two-runs)"
)


def _known(fp) -> dict | None:
    if not isinstance(fp, dict) or "unknown" in fp:
        return None
    return {k: v for k, v in fp.items() if k != "host"}
