"""An attacker of study blindness who never decodes a picture (tests/test_blind_attacker.py runs a
seeded slice, benchmarks/bench_blind_attack.py the full version).

What the attacker gets: what a rater's browser receives, collected through the rater service the
web app serves from (:class:`evalkit.study.RaterService`: the public trial and the bytes behind
its media name). What it computes, per trial, without decoding pictures
(:func:`features`): the file size; per-frame coded sizes with padding removed (trailing
``00 00 03`` cabac_zero_words and zero bytes stripped from each slice, filler NAL units
dropped): their total, the I-frame share, the mean and spread of P frames; NAL unit counts and
lengths; a hash of every byte outside the coded slice data (the MP4 boxes before the frame
data, NAL lengths and headers) and of the slice headers' first bytes; the share of its coded
data's 12-byte runs found anywhere in another trial's of the same rater (byte runs at any
offset); and where the page is told each box's tile is.

Each predictor is a decision stump on one feature (a direction and a threshold, or for pairs
"the larger is it"), fitted on *training* studies and counted on *held-out* studies of other
clips (other content families and seeds), each distinct (file, box mapping) once. Targets:
ABX: which box matches X; preference and ABX: which box shows backend B; catch versus test
(pairs of one catch and one test file of the same study: which is the catch). Every count is
tested against chance with a two-sided exact binomial test. A bot that reads only the files
(:func:`bot_screening`) answers with the best stump and is screened like a rater.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

#: the byte-run length compared between trials (the issue found 5-10 byte re-synchronisations;
#: 12-byte runs occur in unrelated coded data about never)
RUN = 12


# -- clips ------------------------------------------------------------------------------------

FAMILIES = ("pan", "blobs", "grain", "stripes")


def scene(family: str, seed: int, t: int = 12, h: int = 48, w: int = 64) -> np.ndarray:
    """A synthetic moving scene (``(t, h, w, 3)`` uint8) of one content family: ``pan`` smoothed
    noise texture panning; ``blobs`` coloured discs moving over a gradient; ``grain`` a
    gradient under fresh noise every frame; ``stripes`` oriented sine stripes drifting."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    if family == "pan":
        tex = gaussian_filter(
            rng.standard_normal((h + 3 * t, w + 3 * t, 3)), (rng.uniform(0.6, 2.0),) * 2 + (0,)
        )
        tex = 128 + tex * (rng.uniform(30, 70) / tex.std())
        dy, dx = rng.integers(-2, 3), rng.integers(1, 4)
        oy, ox = (0 if dy >= 0 else 2 * t), 0
        for i in range(t):
            out.append(tex[oy + dy * i : oy + dy * i + h, ox + dx * i : ox + dx * i + w])
    elif family == "blobs":
        base = np.stack([yy * 3, xx * 2, 200 - yy * 2], -1) + rng.uniform(0, 60, 3)
        discs = [
            (
                rng.uniform(0, h),
                rng.uniform(0, w),
                rng.uniform(5, 14),
                rng.uniform(-2, 2),
                rng.uniform(-2, 2),
                rng.uniform(0, 255, 3),
            )
            for _ in range(rng.integers(2, 5))
        ]
        for i in range(t):
            f = base.copy()
            for cy, cx, r, vy, vx, col in discs:
                m = (yy - cy - vy * i) ** 2 + (xx - cx - vx * i) ** 2 < r * r
                f[m] = col
            out.append(f)
    elif family == "grain":
        base = np.stack([xx * 3, yy * 4, (xx + yy) * 1.5], -1) + rng.uniform(0, 60, 3)
        amp = rng.uniform(4, 20)
        for _ in range(t):
            out.append(base + amp * rng.standard_normal((h, w, 3)))
    else:
        ang, freq = rng.uniform(0, np.pi), rng.uniform(0.15, 0.6)
        phase = xx * np.cos(ang) + yy * np.sin(ang)
        col = rng.uniform(40, 110, 3)
        for i in range(t):
            out.append(128 + col * np.sin(freq * phase[..., None] + i * 0.4 + np.arange(3)))
    return np.clip(np.stack(out), 0, 255).astype(np.uint8)


def backend_b(frames: np.ndarray, seed: int) -> np.ndarray:
    """The other backend: slightly smoother and with different low-bit noise (a difference like
    bf16 against fp32: hard to see, but it makes the file smaller, the leak once found)."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng([seed, 99])
    smooth = gaussian_filter(frames.astype(np.float32), (0, 0.6, 0.6, 0))
    return np.clip(smooth + rng.integers(-1, 2, frames.shape) + 0.5, 0, 255).astype(np.uint8)


def make_report(root, families, seeds, fps: int = 24) -> Path:
    """A compare report folder (``summary.json``, ``clips.csv``, two run folders of lossless
    clips) holding one job per (family, seed): what ``study create`` reads."""
    from evalkit.video import write_lossless

    root = Path(root)
    jobs = []
    for fam in families:
        for s in seeds:
            job = f"{fam}-{s}"
            a = scene(fam, s)
            for run, frames in (("a", a), ("b", backend_b(a, s))):
                (root / "runs" / run / "clips").mkdir(parents=True, exist_ok=True)
                write_lossless(root / "runs" / run / "clips" / f"{job}.mkv", frames, fps)
            jobs.append(job)
    rep = root / "report"
    rep.mkdir(parents=True, exist_ok=True)
    (rep / "summary.json").write_text(
        json.dumps(
            {
                "runs": {"a": {"path": str(root / "runs" / "a")}, "b": {"path": str(root / "runs" / "b")}},
                "jobs": {"compared": jobs},
            }
        )
    )
    return rep


# -- what the browser gets ---------------------------------------------------------------------


def collect(db, sid, raters: int, served: int = 1) -> list[dict]:
    """Every trial of ``raters`` new raters of study ``sid``, as the browser gets it: the public
    trial and the bytes behind its media name; with the hidden row (``kind``, ``sources``,
    ``expected``, ``shown``) for scoring only. The first ``served`` raters go through the rater
    service the web app serves from (hand out, fetch by the opaque name, answer); for the others
    the same public trial and file are read from the database and the media folder (the
    service's own mapping, checked equal on the served raters): hundreds of trials a second.
    ``row``: the row (clip or catch version) the trial's file is one of (:func:`pooled_sizes`);
    ``job``: its clip's job (the same in every study of the same runs)."""
    from sqlalchemy import select

    from evalkit import study
    from evalkit.study import design, seal, store
    from evalkit.study.live import media_name
    from evalkit.study.lossless import ext_of

    tokens = [r["token"] for r in study.invite(db, sid, raters)]
    d = store.open_db(db)
    with d.engine.connect() as conn:
        st = conn.execute(select(store.studies).where(store.studies.c.id == sid)).mappings().one()
        ids = [
            r[0]
            for r in conn.execute(
                select(store.raters.c.id).where(store.raters.c.study_id == sid).order_by(store.raters.c.idx)
            )
        ][-raters:]
        rows = {
            rid: seal.open_trials(
                st["config"],
                conn.execute(
                    select(store.trials).where(store.trials.c.rater_id == rid).order_by(store.trials.c.ord)
                ).mappings(),
            )
            for rid in ids
        }
        job_of = dict(
            conn.execute(
                select(store.clips.c.id, store.clips.c.job).where(store.clips.c.study_id == sid)
            ).all()
        )
    media = Path(st["media_dir"])
    key = st["config"]["media_key"]
    ext = ext_of(st["config"])
    # which row (clip, or catch version) each file belongs to: the files an attacker groups by
    # content (their per-frame sizes are near twins); given here, the strongest grouping
    cfg = seal.unseal_config(sid, st["config"])
    row_of = {
        sha: f"{sid}:clip{cid}" for cid, s in cfg.get("streams", {}).items() for sha in s["files"].values()
    }
    row_of.update(
        {
            sha: f"{sid}:catch{j}"
            for j, cp in enumerate(cfg.get("catch_pool", []))
            for sha in cp["streams"]["files"].values()
        }
    )
    out = []
    for k, (tok, rid) in enumerate(zip(tokens, ids)):
        mine = []
        for r in rows[rid]:
            public = {
                "trial": r["id"],
                "index": r["ord"] + 1,
                "total": len(rows[rid]),
                "protocol": design.page_protocol(st["protocol"]),
                "answers": list(design.ANSWERS[st["protocol"]]),
                "fps": float(st["config"]["fps"]),
                "media": {"video": media_name(key, r["id"], "video", ext)},
                "tiles": r["shown"]["tiles"],
            }
            mine.append(
                {
                    "rater": f"{sid}:{k}",
                    "study": sid,
                    "public": public,
                    "row": row_of.get(r["shown"]["media"], f"{sid}:?"),
                    "job": job_of.get(r["clip_id"]),
                    "data": (media / f"{r['shown']['media']}{ext}").read_bytes(),
                    **{x: r[x] for x in ("kind", "catch_kind", "sources", "expected", "shown")},
                }
            )
        if k < served:  # through the service: the same trials and bytes
            clock = study.FakeClock()
            with study.RaterService(db, clock=clock) as svc:
                s = svc.state_sync(tok)
                for t in mine:
                    assert s["trial"] == t["public"], (s["trial"], t["public"])
                    got = b"".join(svc.media_sync(tok, n).read_bytes() for n in s["trial"]["media"].values())
                    assert got == t["data"]
                    clock.advance(60)
                    s = svc.answer_sync(tok, t["public"]["trial"], t["public"]["answers"][0])
                assert s["trial"] is None
        out.extend(mine)
    return out


def _nals(sample: bytes) -> list[bytes]:
    from evalkit.study.media import avcc_nal_units

    return avcc_nal_units(sample)


def strip(nal: bytes) -> bytes:
    """A slice NAL unit without padding: trailing cabac_zero_words (``00 00 03``) and zeros."""
    while nal.endswith(b"\x00\x00\x03"):
        nal = nal[:-3]
    return nal.rstrip(b"\x00")


def features(data: bytes) -> dict:
    """What a script reads from a trial's file without decoding a picture (an MP4 trial stream,
    or a lossless study's animated WebP: :func:`webp_features`)."""
    import av

    if data[:4] == b"RIFF":
        return webp_features(data)

    coded, sizes, keys, lengths, outside, heads = [], [], [], [], [], []
    with av.open(io.BytesIO(data)) as c:
        for p in c.demux(video=0):
            if not p.size:
                continue
            frame = 0
            for n in _nals(bytes(p)):
                kind = n[0] & 0x1F
                lengths.append(len(n))
                outside.append(len(n).to_bytes(4, "big") + n[:1])
                if kind in (1, 5):
                    s = strip(n)
                    coded.append(s)
                    heads.append(s[1:4])
                    frame += len(s)
            sizes.append(frame)
            keys.append(bool(p.is_keyframe))
    sizes, keys = np.array(sizes, float), np.array(keys)
    p_sizes = sizes[~keys] if (~keys).any() else sizes
    head = data[: data.index(b"mdat") + 4] if b"mdat" in data else b""
    return {
        "_sizes": sizes,
        "file_size": float(len(data)),
        "coded_size": float(sizes.sum()),
        "i_share": float(sizes[keys].sum() / max(1.0, sizes.sum())),
        "p_mean": float(p_sizes.mean()),
        "p_cv": float(p_sizes.std() / max(1.0, p_sizes.mean())),
        "nal_count": float(len(lengths)),
        "nal_max": float(max(lengths)),
        "outside_hash": _h(head + b"".join(outside)),
        "slice_head_hash": _h(b"".join(heads)),
        "_coded": b"".join(coded),
    }


def webp_features(data: bytes) -> dict:
    """:func:`features` of an animated lossless WebP (:mod:`evalkit.study.lossless`): its
    frames' VP8L bitstreams stand for the coded slices (every frame is a key frame, one
    "NAL" a frame), everything else (RIFF, VP8X, ANIM, the ANMF headers, chunk lengths) is
    the outside, and each bitstream's first 5 bytes (signature, size, flags) its header."""
    import struct

    coded, outside, heads, i = [], [data[:12]], [], 12
    while i + 8 <= len(data):
        tag, n = data[i : i + 4], struct.unpack("<I", data[i + 4 : i + 8])[0]
        if tag == b"ANMF":
            outside.append(data[i : i + 8 + 16 + 8])
            bits = data[i + 8 + 24 : i + 8 + n]
            coded.append(bits)
            heads.append(bits[:5])
        else:
            outside.append(data[i : i + 8 + n + (n & 1)])
        i += 8 + n + (n & 1)
    sizes = np.array([len(c) for c in coded], float)
    return {
        "_sizes": sizes,
        "file_size": float(len(data)),
        "coded_size": float(sizes.sum()),
        "i_share": 1.0,
        "p_mean": float(sizes.mean()),
        "p_cv": float(sizes.std() / max(1.0, sizes.mean())),
        "nal_count": float(len(coded)),
        "nal_max": float(sizes.max()),
        "outside_hash": _h(b"".join(outside)),
        "slice_head_hash": _h(b"".join(heads)),
        "_coded": b"".join(coded),
    }


def _h(b: bytes) -> float:
    return float(int.from_bytes(hashlib.sha256(b).digest()[:4], "big"))


_POW = np.array([pow(257, RUN - 1 - k, 2**64) for k in range(RUN)], np.uint64)


def _runs(b: bytes) -> np.ndarray:
    """The distinct 64-bit hashes of ``b``'s ``RUN``-byte runs, at every offset, sampled by
    content (the runs whose hash is 0 mod 8: a run shared by two files is sampled in both,
    wherever it lies)."""
    a = np.frombuffer(b, np.uint8).astype(np.uint64)
    if len(a) < RUN:
        return np.zeros(0, np.uint64)
    w = np.lib.stride_tricks.sliding_window_view(a, RUN)
    with np.errstate(over="ignore"):
        h = (w * _POW).sum(axis=1, dtype=np.uint64)
    return np.unique(h[h % np.uint64(8) == 0])


def add_features(trials: list[dict]) -> list[dict]:
    """Each trial's :func:`features`, plus ``run_share``: the share of its coded 12-byte runs
    found at any offset in another trial of the same rater, and ``twin``: how
    close the nearest other trial of the same rater is in per-frame coded sizes (relative L1
    distance; a catch version's clip is also one of the rater's test trials)."""
    for t in trials:
        t["f"] = features(t["data"])
    by_rater: dict = {}
    for t in trials:
        by_rater.setdefault(t["rater"], []).append(t)
    for ts in by_rater.values():
        runs = [_runs(t["f"]["_coded"]) for t in ts]
        uniq, counts = np.unique(np.concatenate(runs), return_counts=True)
        several = uniq[counts > 1]  # runs found in more than one trial
        for i, t in enumerate(ts):
            t["f"]["run_share"] = float(np.isin(runs[i], several).sum()) / max(1, len(runs[i]))
            t["f"]["twin"] = min(
                (
                    float(np.abs(t["f"]["_sizes"] - o["f"]["_sizes"]).sum() / t["f"]["_sizes"].sum())
                    for o in ts
                    if o is not t and len(o["f"]["_sizes"]) == len(t["f"]["_sizes"])
                ),
                default=1.0,
            )
    return trials


SCALARS = (
    "file_size",
    "coded_size",
    "i_share",
    "p_mean",
    "p_cv",
    "nal_count",
    "nal_max",
    "outside_hash",
    "slice_head_hash",
    "run_share",
    "twin",
)


def _tile_x(t, slot) -> float:
    return float(t["public"]["tiles"][slot][0])


def _side_features(t, one: str, two: str) -> dict:
    """Features of a trial for a question about boxes ``one`` and ``two``: the file's scalars
    and where the page is told their tiles are."""
    f = {k: t["f"][k] for k in SCALARS}
    f["tile_x_difference"] = _tile_x(t, one) - _tile_x(t, two)
    if "X" in t["public"]["tiles"]:
        f["tile_nearer_x"] = abs(_tile_x(t, one) - _tile_x(t, "X")) - abs(_tile_x(t, two) - _tile_x(t, "X"))
    return f


# -- pooled across raters ------------------------------------------------------------------------

POOLED = ("pooled_x_tile", "pooled_label")


def add_pooled(trials: list[dict], across_studies: bool = False) -> list[dict]:
    """What colluding raters pool per file (issue 44): every trial's file hash, and per trial,
    from the *other* raters' trials of the same file (of the same study; ``across_studies``:
    of every study of the set, where the same clip in two studies made from the same runs is
    the same file): ``pooled_x_tile`` (ABX) the share of them with X on this
    trial's A tile less the share with X on its B tile (the rule that answered every trial when
    X's tile was drawn per trial: X never lands on the odd tile); ``pooled_label`` the share
    with this trial's first label (A, or left) on the same tile; ``pooled_raters`` how many
    raters got the file (catch files were told by it), ``pooled_share`` that over the
    raters of its study and ``pooled_studies`` in how many studies of the set it was served
    (across studies: a test file recurred in every study of the same runs, a catch file drawn
    from a study's seed in one). Needs no decoding, only what the browsers received."""
    by_file: dict = {}
    raters: dict = {}
    for t in trials:
        t["sha"] = hashlib.sha256(t["data"]).hexdigest()
        t["pool"] = t["sha"] if across_studies else (t["study"], t["sha"])
        by_file.setdefault(t["pool"], []).append(t)
        raters.setdefault(t["study"], set()).add(t["rater"])
    for t in trials:
        tiles = t["public"]["tiles"]
        one, two = ("A", "B") if "X" in tiles else ("left", "right")
        others = [o["public"]["tiles"] for o in by_file[t["pool"]] if o["rater"] != t["rater"]]
        n = max(1, len(others))
        f = t.setdefault("f", {})
        f["pooled_x_tile"] = (
            sum(o.get("X") == tiles[one] for o in others) - sum(o.get("X") == tiles[two] for o in others)
        ) / n
        f["pooled_label"] = sum(o[one] == tiles[one] for o in others) / n
        shared = {o["rater"] for o in by_file[t["pool"]]}
        f["pooled_raters"] = float(len(shared))
        f["pooled_share"] = len(shared) / len(raters[t["study"]])
        f["pooled_studies"] = float(len({o["study"] for o in by_file[t["pool"]]}))
    return trials


def pooled_questions(trials: list[dict]) -> dict[str, list[tuple]]:
    """Per question, one (key, pooled features, truth) row per trial (:func:`add_pooled`): a
    pooled rule answers every trial, so every trial counts; the key's last part is the pooled
    file (the trials of one file share their pooled features: :func:`score`'s clusters)."""
    out: dict[str, list] = {}
    for t in trials:
        proto = t["public"]["protocol"]
        one = "A" if proto == "abx" else "left"
        f = {k: t["f"][k] for k in POOLED}
        key = (t["rater"], t["public"]["trial"], t.get("pool", t.get("sha")))
        if proto == "abx":
            out.setdefault("pooled abx: which box matches X", []).append((key, f, int(t["expected"] == "A")))
        if t["kind"] == "test":
            out.setdefault(f"pooled {proto}: which box is backend B", []).append(
                (key, f, int(t["sources"][one] == "b"))
            )
        else:
            out.setdefault(f"pooled {proto} catch trials: which box is the reference", []).append(
                (key, f, int(t["sources"][one] == "reference"))
            )
    return out


def pooled_catch_pairs(trials: list[dict], rng: np.random.Generator) -> list[tuple]:
    """As :func:`catch_pairs` with the pooled multiplicity: (catch file, test file) of one study,
    truth the catch is first; features the differences in raters sharing each file."""
    return _catch_test_pairs(
        trials, rng, lambda t: t["sha"], ("pooled_raters", "pooled_share", "pooled_studies")
    )


def replay_catch(labelled: list[dict], trials: list[dict]) -> dict:
    """A replay bot: a table, file hash -> the tile of the answer (:func:`_first_tile`), from the
    catch trials of ``labelled`` (a person who watched them: a catch is plain to see), looked up
    for the catch trials of ``trials`` (other studies). Returns ``{"files", "known", "hits"}``:
    the distinct catch files of ``trials``, how many the table holds, and how many of those it
    answers right. Within one study the table answers every rater who shares a labeller's files
    (every file goes to every 2nd or 4th rater); across studies it answers what recurs."""
    table: dict = {}
    for t in labelled:
        if t["kind"] == "catch":
            table[hashlib.sha256(t["data"]).hexdigest()] = _first_tile(t)
    files = {}
    for t in trials:
        if t["kind"] == "catch":
            files.setdefault(hashlib.sha256(t["data"]).hexdigest(), t)
    known = [(sha, t) for sha, t in files.items() if sha in table]
    return {
        "files": len(files),
        "known": len(known),
        "hits": sum(table[sha] == _first_tile(t) for sha, t in known),
    }


def _first_tile(t) -> int:
    """1 where the trial's answer (ABX: X's match; preference: backend B, or the reference of a
    catch) is in the first (leftmost) of the two tiles other than X's, else 0."""
    tiles, src = t["shown"]["tiles"], t["sources"]
    if "X" in tiles:
        hit = t["expected"]
    else:
        want = "b" if t["kind"] == "test" else "reference"
        hit = next(s for s, c in src.items() if c == want)
    other = next(s for s in tiles if s not in ("X", hit))
    return int(tiles[hit][0] < tiles[other][0])


def pooled_sizes(trials: list[dict]) -> dict[str, list[tuple]]:
    """The pooled size rule (found by measurement: with X in tile 0 an H.264 file was smaller
    when X's match sat next to X, benchmarks/bench_tile_order.py): the files of one row (a
    clip, or a catch version; ``row`` of :func:`collect`) that the pooled raters got, compared
    with each other. Per distinct file, ``pooled_size``: its bytes over the mean of its
    siblings' less 1; ``pooled_frames``: the mean sign of each frame's coded size (``_sizes`` of
    :func:`features`, where read) less the siblings' mean of that frame. Truth: the answer
    (ABX: X's match; preference: backend B, or a catch's reference) is in the first of the two
    tiles other than X's; the rule that reads it answers every trial of the file whatever its
    labels (the page says which box is on which tile), so each file counts once a study (a
    file that recurs in several studies of the same runs is one cluster of :func:`score`). A row of one
    file (a preference row now, :func:`evalkit.study.design.row_keys`) has no sibling: it is
    compared with the other one-file rows of its study and kind (test or catch), the best
    such a rule can do."""
    files: dict = {}
    for t in trials:
        sha = t.get("sha") or hashlib.sha256(t["data"]).hexdigest()
        files.setdefault((t["study"], sha), t)
    rows: dict = {}
    for k, t in files.items():
        rows.setdefault(t["row"], []).append(k)
    alone: dict = {}
    for row, group in list(rows.items()):
        if len(group) == 1:
            t = files[group[0]]
            alone.setdefault((t["study"], t["public"]["protocol"], t["kind"]), []).extend(rows.pop(row))
    out: dict[str, list] = {}
    for group in [*rows.values(), *alone.values()]:
        if len(group) < 2:
            continue
        size = {k: float(files[k].get("size", len(files[k]["data"]))) for k in group}
        frames = {k: files[k].get("f", {}).get("_sizes") for k in group}
        for k in group:
            t = files[k]
            sib = [o for o in group if o != k]
            f = {"pooled_size": size[k] / np.mean([size[o] for o in sib]) - 1.0, "pooled_frames": 0.0}
            if all(frames[o] is not None and len(frames[o]) == len(frames[k]) for o in group):
                f["pooled_frames"] = float(
                    np.mean(np.sign(frames[k] - np.mean([frames[o] for o in sib], axis=0)))
                )
            proto = t["public"]["protocol"]
            q = (
                f"pooled sizes {proto}: which tile holds X's match"
                if proto == "abx"
                else f"pooled sizes {proto}: which tile is backend B"
                if t["kind"] == "test"
                else f"pooled sizes {proto} catch trials: which tile is the reference"
            )
            out.setdefault(q, []).append((k, f, _first_tile(t)))
    return out


def attack_pooled(train_trials: list[dict], test_trials: list[dict], seed: int = 0) -> dict:
    """The pooled rules (:func:`add_pooled`, both sets pooled separately: the training
    studies' raters, then the held-out studies'; and where trials name their ``row``, the
    pooled size rule, :func:`pooled_sizes`), fitted on ``train_trials`` and counted on
    ``test_trials``: ``{question: {feature: {"hits", "n", "p"}}}``."""
    rng = np.random.default_rng([seed, 1])
    q_train, q_test = pooled_questions(train_trials), pooled_questions(test_trials)
    out = {
        q: score(q_train[q], rows, cluster=lambda key: key[-1]) for q, rows in q_test.items() if q in q_train
    }
    out["pooled catch or test: which of a pair is the catch"] = score(
        pooled_catch_pairs(train_trials, rng),
        pooled_catch_pairs(test_trials, rng),
        cluster=lambda key: key[-1],
    )
    if all("row" in t for t in train_trials + test_trials):
        s_train, s_test = pooled_sizes(train_trials), pooled_sizes(test_trials)
        out.update(
            {
                q: score(s_train[q], rows, cluster=lambda key: key[1])
                for q, rows in s_test.items()
                if q in s_train
            }
        )
    return out


# -- predictors ---------------------------------------------------------------------------------


def _fit_stump(xs: np.ndarray, ys: np.ndarray) -> tuple[float, int]:
    """(threshold, sign): predict 1 when sign * (x - threshold) > 0; best accuracy on ``xs``."""
    best = (0.0, 1, -1.0)
    for thr in np.unique(xs):
        for sign in (1, -1):
            acc = float(np.mean((sign * (xs - thr) > 0) == ys))
            if acc > best[2]:
                best = (float(thr), sign, acc)
    return best[0], best[1]


def _dedupe(rows: list[tuple]) -> list[tuple]:
    seen, out = set(), []
    for key, f, y in rows:
        if key not in seen:
            seen.add(key)
            out.append((key, f, y))
    return out


def questions(trials: list[dict]) -> dict[str, list[tuple]]:
    """Per question, (key, features, truth) rows: one per distinct (file, box mapping)."""
    out: dict[str, list] = {}
    for t in trials:
        sha = hashlib.sha256(t["data"]).hexdigest()
        tiles = json.dumps(t["public"]["tiles"], sort_keys=True)
        if t["public"]["protocol"] == "abx":
            out.setdefault("abx: which box matches X", []).append(
                ((sha, tiles), _side_features(t, "A", "B"), int(t["expected"] == "A"))
            )
            one, two = "A", "B"
        else:
            one, two = "left", "right"
        if t["kind"] == "test":
            out.setdefault(f"{t['public']['protocol']}: which box is backend B", []).append(
                ((sha, tiles), _side_features(t, one, two), int(t["sources"][one] == "b"))
            )
        else:
            out.setdefault(f"{t['public']['protocol']} catch trials: which box is the reference", []).append(
                ((sha, tiles), _side_features(t, one, two), int(t["sources"][one] == "reference"))
            )
    return {k: _dedupe(v) for k, v in out.items()}


def catch_pairs(trials: list[dict], rng: np.random.Generator) -> list[tuple]:
    """Pairs (catch file, test file) of one study, each distinct catch file once, its partner a
    test file of the same study drawn at random; truth: the catch is first (order random)."""
    return _catch_test_pairs(trials, rng, lambda t: hashlib.sha256(t["data"]).hexdigest(), SCALARS)


def _catch_test_pairs(trials: list[dict], rng: np.random.Generator, sha_of, features) -> list:
    """((catch sha, test sha, the catch's clip), feature differences first - second, truth the
    catch is first): each distinct catch file of a study once, its partner a test file of the
    same study drawn at random, the order random. The catch's clip (its ``job``, else its
    file) is :func:`score`'s cluster: studies of the same runs share their catch versions, so
    a catch clip's files recur in pair after pair and only the clips are independent draws."""
    by_study: dict = {}
    for t in trials:
        by_study.setdefault(t["study"], {}).setdefault(t["kind"], {})[sha_of(t)] = t
    rows = []
    for _sid, kinds in sorted(by_study.items()):
        tests = list(kinds.get("test", {}).items())
        for sha, c in sorted(kinds.get("catch", {}).items()):
            o_sha, o = tests[rng.integers(len(tests))]
            first = bool(rng.integers(2))
            a, b = (c, o) if first else (o, c)
            rows.append(
                ((sha, o_sha, c.get("job") or sha), {k: a["f"][k] - b["f"][k] for k in features}, int(first))
            )
    return rows


def score(train: list[tuple], test: list[tuple], cluster=None) -> dict[str, dict]:
    """Every feature's stump, fitted on ``train`` rows and counted on ``test`` rows:
    ``{feature: {"hits", "n", "p"}}`` (two-sided exact binomial against 0.5).

    ``cluster``: key -> the unit the rows' hits hang together by (a pooled rule's file: every
    trial of a file shares its pooled features, so with 30 raters of a file pooled across
    studies its trials are right or wrong nearly all together, and the per-trial binomial
    overstates the evidence). Adds ``clusters`` (units), ``cluster_hits`` (units with more
    rows right than wrong), ``cluster_n`` (units not tied) and ``cluster_p``: the two-sided
    exact sign test over units, valid when each unit's rows are right as often as wrong."""
    from scipy.stats import binomtest

    out = {}
    for name in sorted(test[0][1]) if test else []:
        xs = np.array([r[1][name] for r in train], float)
        ys = np.array([r[2] for r in train], int)
        thr, sign = _fit_stump(xs, ys)
        guess = np.array([sign * (r[1][name] - thr) > 0 for r in test], int)
        truth = np.array([r[2] for r in test], int)
        hits = int((guess == truth).sum())
        out[name] = {"hits": hits, "n": len(test), "p": float(binomtest(hits, len(test), 0.5).pvalue)}
        if cluster is not None:
            per: dict = {}
            for r, g in zip(test, guess == truth):
                per.setdefault(cluster(r[0]), []).append(2 * int(g) - 1)
            net = [sum(v) for v in per.values()]
            up, n = sum(x > 0 for x in net), sum(x != 0 for x in net)
            out[name].update(
                clusters=len(per),
                cluster_hits=up,
                cluster_n=n,
                cluster_p=float(binomtest(up, n, 0.5).pvalue) if n else 1.0,
            )
    return out


def attack(train_trials: list[dict], test_trials: list[dict], seed: int = 0) -> dict:
    """Every predictor (question x feature) fitted on ``train_trials``, counted on
    ``test_trials``: ``{question: {feature: {"hits", "n", "p"}}}``."""
    rng = np.random.default_rng(seed)
    q_train, q_test = questions(train_trials), questions(test_trials)
    out = {q: score(q_train[q], rows) for q, rows in q_test.items() if q in q_train}
    out["catch or test: which of a pair is the catch"] = score(
        catch_pairs(train_trials, rng), catch_pairs(test_trials, rng), cluster=lambda key: key[-1]
    )
    return out


def best_stump(train_trials: list[dict]) -> tuple[str, float, int]:
    """The (feature, threshold, sign) that answers the training studies' ABX trials (test and
    catch) best: the file-reading bot's rule."""
    rows = questions(train_trials)["abx: which box matches X"]
    best = None
    for name in (n for n in rows[0][1] if n not in ("run_share", "twin")):  # per-trial rules
        xs = np.array([r[1][name] for r in rows], float)
        ys = np.array([r[2] for r in rows], int)
        thr, sign = _fit_stump(xs, ys)
        acc = float(np.mean((sign * (xs - thr) > 0) == ys))
        if best is None or acc > best[0]:
            best = (acc, name, thr, sign)
    return best[1], best[2], best[3]


def bot_screening(db, sid, rule: tuple[str, float, int], bots: int) -> dict:
    """``bots`` scripted raters of ABX study ``sid`` that read only the files (every feature of
    :func:`features` and the tiles) and answer by ``rule`` (:func:`best_stump`); then the
    study's own catch screening. Returns ``{"bots", "passed", "catch_hits", "catch_n",
    "random_pass_rate"}`` (a random clicker's chance to pass)."""
    from scipy.stats import binom

    from evalkit import study
    from evalkit.study import design, stats
    from evalkit.testing.studies import hidden

    name, thr, sign = rule
    clock = study.FakeClock()
    passed, hits, n = 0, 0, 0
    with study.RaterService(db, clock=clock) as svc:
        for tok in (r["token"] for r in study.invite(db, sid, bots)):
            right = []
            s = svc.state_sync(tok)
            while s["trial"] is not None:
                t = s["trial"]
                data = b"".join(svc.media_sync(tok, x).read_bytes() for x in t["media"].values())
                tr = {"public": t, "f": features(data)}
                tr["f"]["run_share"] = tr["f"]["twin"] = 0.0
                x = _side_features(tr, "A", "B")[name]
                pick = "A" if sign * (x - thr) > 0 else "B"
                clock.advance(60)
                s = svc.answer_sync(tok, t["trial"], pick)
                h = hidden(db, t["trial"])
                if h["kind"] == "catch" and h["catch_kind"] in design.CATCH_KINDS:
                    right.append(pick == h["expected"])
            need = stats.catch_min_correct(len(right), 0.05)
            passed += sum(right) >= need
            hits += sum(right)
            n += len(right)
    k = len(right)
    need = stats.catch_min_correct(k, 0.05)
    return {
        "bots": bots,
        "passed": passed,
        "catch_hits": hits,
        "catch_n": n,
        "random_pass_rate": float(binom.sf(need - 1, k, 0.5)),
    }
