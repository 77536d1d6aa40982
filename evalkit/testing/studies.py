"""Helpers shared by the study tests: a small compare report made with the fake renderer."""

from __future__ import annotations

import json
import re
import textwrap

from evalkit.fsutil import datasets_dir


def make_report(root, seeds=(0, 1, 2), fps=None, renderer="evalkit.testing.renderers:Invert", options=None):
    """A compare report of two fake-rendered runs (``cpu`` and ``cpu,dtype=bf16``) of the smoke
    clips (24 fps, 8 frames); ``fps``: the source clips re-timed to that frame rate first (same
    frames); ``renderer`` and its ``options``: the fake renderer (default ``Invert``: i.i.d.
    noise as the difference, which no 4:2:0 stream carries, so its studies are created with
    ``allow_masking``)."""
    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs
    from evalkit.render.driver import render_suite

    DATASETS = datasets_dir()
    src = {
        "pan": DATASETS / "smoke" / "clips" / "astronaut_pan.mkv",
        "obj": DATASETS / "smoke" / "clips" / "hubble_object.mkv",
    }
    if fps is not None:
        from evalkit.video import read_frames, write_lossless

        (root / "clips").mkdir(parents=True, exist_ok=True)
        for k, p in list(src.items()):
            src[k] = root / "clips" / p.name
            write_lossless(src[k], read_frames(p)[0], fps)
    suite = root / "suite.yaml"
    suite.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: studytest
        clips:
          - {{id: pan, path: {src["pan"]}}}
          - {{id: obj, path: {src["obj"]}}}
        prompts: ["a"]
        seeds: {json.dumps(list(seeds))}
    """)
    )
    render_suite(
        suite, ["cpu", "cpu,dtype=bf16"], root / "runs", renderer=renderer, options=options, progress=False
    )
    compare_runs(
        root / "runs" / "cpu",
        root / "runs" / "cpu_dtype-bf16",
        root / "report",
        device="cpu",
        metrics=MetricOptions(temporal=False),
        progress=False,
    )
    return root / "report"


def current(db, token):
    """The rater's current trial through the rater service (handing it out), or None."""
    from evalkit import study

    with study.RaterService(db) as svc:
        return svc.state_sync(token)["trial"]


def progress(db, token):
    from evalkit import study

    with study.RaterService(db) as svc:
        return svc.progress(token)


def rate(svc, token, pick, clock, *, limit=None, watch: float = 10.0) -> dict:
    """Answer a rater's trials through ``svc`` the way a browser does (hand out, request every
    video, watch, answer): ``pick(public_trial) -> answer``; ``clock`` (a
    :class:`evalkit.study.FakeClock`, the service's) moves ``watch`` seconds per trial; at most
    ``limit`` answers. Returns {trial id: answer}."""
    given = {}
    s = svc.state_sync(token)
    while s["trial"] is not None and (limit is None or len(given) < limit):
        t = s["trial"]
        for name in t["media"].values():
            svc.media_sync(token, name)
        clock.advance(watch)
        given[t["trial"]] = pick(t)
        s = svc.answer_sync(token, t["trial"], given[t["trial"]])
    return given


def answer(db, token, pick, limit=None) -> dict:
    """:func:`rate` through a rater service of its own with a fake clock."""
    from evalkit import study

    clock = study.FakeClock()
    with study.RaterService(db, clock=clock) as svc:
        return rate(svc, token, pick, clock, limit=limit)


def hidden(db, trial_id) -> dict:
    """A trial's row with its hidden mapping (sources, expected, shown; unsealed with the
    study's key file) and its served and fetched times."""
    from sqlalchemy import select

    from evalkit.study import seal, store

    with store.open_db(db).engine.connect() as conn:
        row = conn.execute(select(store.trials).where(store.trials.c.id == trial_id)).mappings().one()
        cfg = conn.execute(
            select(store.studies.c.config).where(store.studies.c.id == row["study_id"])
        ).scalar_one()
    return seal.open_trials(cfg, [row])[0]


def study_config(db, sid) -> dict:
    """A study's config with its sealed parts (streams, catch pool, bits) opened."""
    from sqlalchemy import select

    from evalkit.study import seal, store

    with store.open_db(db).engine.connect() as conn:
        cfg = conn.execute(select(store.studies.c.config).where(store.studies.c.id == int(sid))).scalar_one()
    return seal.unseal_config(int(sid), cfg)


def secrets_of(db, report) -> set[str]:
    """Every name a rater must never see: jobs, run folders and their names, backends, the
    suite, the report folder."""
    from sqlalchemy import select

    from evalkit.study import store

    summary = json.loads((report / "summary.json").read_text())
    with store.open_db(db).engine.connect() as conn:
        jobs = [r[0] for r in conn.execute(select(store.clips.c.job))]
    runs = [summary["runs"][k]["path"] for k in ("a", "b")]
    return {
        *jobs,
        *runs,
        *(r.rstrip("/").rsplit("/", 1)[-1] for r in runs),
        "cpu",
        "bf16",
        "studytest",
        str(report),
    }


#: random identifiers in what a browser receives (media names, Gradio's event and session ids,
#: hashes): runs of 12 or more hex digits, where a short secret such as "bf16" turns up by chance
_RANDOM_HEX = re.compile(r"[0-9a-fA-F]{12,}")


def leaked(texts, secrets, token: str) -> str | None:
    """The first of ``secrets`` found in ``texts`` (what a rater's browser received) with the
    rater's token and every random hex identifier masked, with 60 characters of context either
    side; None when none is found."""
    haystack = _RANDOM_HEX.sub("HEX", "\n".join(texts).replace(token, "TOKEN"))
    for s in sorted(secrets):
        i = haystack.find(s)
        if i >= 0:
            return f"{s!r} in ...{haystack[max(0, i - 60) : i + len(s) + 60]!r}..."
    return None


def import_report(root, pairs: dict, fps, *, temporal: bool = False, device: str = "cpu"):
    """A compare report of two imported runs (``render -r import``, the real CLI): ``pairs``
    maps a prompt to ``(frames_a, frames_b)`` (``(T, H, W, 3)`` uint8), one job per prompt of
    one source clip (A's first frames). Returns ``(report folder, {job id: prompt})``."""
    from pathlib import Path

    from evalkit.cli import main
    from evalkit.compare.options import MetricOptions
    from evalkit.compare.run import compare_runs
    from evalkit.formats.suite import load_suite
    from evalkit.testing.suites import write_suite
    from evalkit.video import write_lossless

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    first = next(iter(pairs.values()))[0]
    write_lossless(root / "source.mkv", first, fps)
    suite = load_suite(write_suite(root, root / "source.mkv", prompts=tuple(pairs), seeds=(0,)))
    jobs = {}
    for side, k in (("a", 0), ("b", 1)):
        (root / side).mkdir(exist_ok=True)
        for job in suite.jobs:
            write_lossless(root / side / f"{job.id}.mkv", pairs[job.prompt][k], fps)
            jobs[job.id] = job.prompt
    for side in ("a", "b"):
        code = main(
            [
                "render",
                str(root / "suite.yaml"),
                "-r",
                "import",
                "-O",
                f"dir={root / side}",
                "--label",
                side,
                "--out",
                str(root / "runs"),
                "--quiet",
            ]
        )
        if code != 0:
            raise RuntimeError(f"import of {side} failed ({code})")
    compare_runs(
        root / "runs" / "a",
        root / "runs" / "b",
        root / "report",
        device=device,
        metrics=MetricOptions(temporal=temporal),
        progress=False,
    )
    return root / "report", jobs


def moving_texture(t: int, h: int, w: int, seed: int = 0, grey: bool = True):
    """A fine texture panning 3 px right and 2 px down a frame (every frame differs; costly to
    code, like detailed generated video): ``(t, h, w, 3)`` uint8."""
    import numpy as np
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    tex = gaussian_filter(rng.standard_normal((h + 2 * t, w + 3 * t)).astype(np.float32), 1.0)
    tex = 128 + tex * (50 / tex.std())
    out = np.empty((t, h, w, 3), np.uint8)
    for i in range(t):
        out[i] = np.clip(tex[2 * i : 2 * i + h, 3 * i : 3 * i + w], 0, 255)[..., None]
    return out


def acknowledge(client, token: str, name: str, data: bytes):
    """POST /api/ack as the page does once it holds a whole media file (``client``: an
    ``httpx.Client`` on the server): its size and CRC-32. Returns the response."""
    import zlib

    return client.post(
        "/api/ack", json={"token": token, "media": name, "size": len(data), "crc32": zlib.crc32(data)}
    )
