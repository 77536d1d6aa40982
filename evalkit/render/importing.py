"""``evalkit import``: adopt files named by clip (or by a mapping file or a pattern) as a run,
with the identity records of ``render -r import`` (the same manifest, job ids, ``adopted_from``).

Each job of the suite is matched to one file of ``folder``: the mapping file's entry for the job
id or the clip id (a YAML or JSON mapping of names to paths relative to ``folder``); else the
``pattern`` (``{clip}``, ``{job}``, ``{prompt}``, ``{seed}`` filled in, then matched as a glob);
else ``<job id>.*`` or, for a clip with one job (footage: one prompt, one seed), ``<clip id>.*``.
The matches are linked under their job ids in a scratch folder next to the run, which the
``import`` renderer adopts (the recorded source is the real file: links are resolved); the
scratch folder goes when the import ends.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

from evalkit.errors import InputFileError, UserError
from evalkit.render.renderers.imported import render_files


def read_mapping(path) -> dict[str, str]:
    """A mapping file: YAML (or JSON) of job id or clip id -> file path (relative to the folder)."""
    from evalkit.formats.yaml_load import safe_load

    path = Path(path)
    if not path.is_file():
        raise InputFileError(path, "not found (expected a mapping file: clip or job id -> file)")
    doc = safe_load(path.read_bytes())
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise InputFileError(
            path, f"expected a mapping of clip or job ids to file names, found {type(doc).__name__}"
        )
    return doc


def match_files(jobs, folder, *, mapping: dict | None = None, pattern: str | None = None) -> dict[str, Path]:
    """job id -> the one file or frame folder of ``folder`` that is its render; a UserError
    naming the job and what was looked for when none or several match."""
    folder = Path(folder)
    per_clip = Counter(j.clip for j in jobs)
    out: dict[str, Path] = {}
    for job in jobs:
        if mapping is not None:
            name = mapping.get(job.id, mapping.get(job.clip) if per_clip[job.clip] == 1 else None)
            if name is None:
                raise UserError(f"mapping: no entry for job {job.id} (or its clip {job.clip!r})")
            found, looked = [folder / name] if (folder / name).exists() else [], str(folder / name)
        elif pattern is not None:
            glob_ = pattern.format(clip=job.clip, job=job.id, prompt=job.prompt, seed=job.seed)
            found, looked = sorted(folder.glob(glob_)), str(folder / glob_)
        else:
            found = render_files(folder, job.id)
            looked = f"{folder / job.id}.mkv"
            if not found and per_clip[job.clip] == 1:
                found, looked = render_files(folder, job.clip), looked + f" or {folder / job.clip}.mkv"
        if not found:
            raise UserError(f"{folder}: no file for job {job.id} (clip {job.clip!r}): expected {looked}")
        if len(found) > 1:
            raise UserError(
                f"{folder}: several files for job {job.id}: {', '.join(sorted(p.name for p in found))}"
            )
        out[job.id] = found[0]
    return out


def import_files(
    suite,
    folder,
    out,
    *,
    label: str,
    mapping=None,
    pattern: str | None = None,
    fingerprint_file=None,
    backend: str | None = None,
    lossless: str | None = None,
    jobs=None,
    progress: bool = True,
):
    """Adopt ``folder``'s files as run ``out/label`` (:func:`match_files`, then the ``import``
    renderer through :func:`evalkit.render.driver.render_suite`); its summaries."""
    from evalkit.formats.suite import load_suite
    from evalkit.render.driver import render_suite

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder (expected the files to import)")
    all_jobs = load_suite(suite).jobs
    chosen = [j for j in all_jobs if not jobs or j.id in jobs or j.clip in jobs]
    matched = match_files(chosen, folder, mapping=read_mapping(mapping) if mapping else None, pattern=pattern)
    scratch = Path(out) / f".import-{label}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        for jid, src in matched.items():
            os.symlink(src.resolve(), scratch / (jid + ("" if src.is_dir() else src.suffix.lower())))
        return render_suite(
            suite,
            [backend] if backend else [],
            out,
            renderer="import",
            options={"dir": str(scratch)},
            jobs=[*matched],
            progress=progress,
            label=label,
            fingerprint_file=fingerprint_file,
            lossless=lossless,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
