"""Study design, pure: which clips, and each rater's balanced, shuffled list of trials.

Counterbalancing and pooling (issue 44): each row (a clip, or a threshold level) is encoded as
a few files (:func:`stream_keys`: 2 for preference, 4 for ABX, X always in the middle tile,
its match left or right of it), and so is each catch version. Rater ``k`` gets file :func:`file_index` of every row: the row's base bits
(drawn once per study, half of the rows 1, shuffled from the study seed) flipped by ``k``, so
every 2 (preference) or 4 (ABX) consecutive raters get every file of every row and every catch
version exactly once: a file is shared by as many raters as any other, catch or test. The
labels over a file's tiles (which is A, which is left) come from balanced bits drawn from the
rater's seed: within a rater half the ABX answers are A, backend B is on the left in half the
preference trials; across raters the labels of one file are independent, so pooling what
several raters got per file says nothing. Catch trials (known answer) are mixed in:
:data:`EASY_CATCHES` obvious degradations (the exclusion rule uses these) and
:data:`GRADED_CATCHES` mild ones (reported only), together at most :data:`MAX_CATCH_SHARE` of a rater's trials where
the screening allows (:func:`catch_counts`); every rater gets every catch version once
(the study makes exactly as many as a rater's catch trials). Which rows get catch versions,
and what they show, is drawn from the rows' content (:func:`catch_plan`), not from a seed: every
study of the same runs has the same catch files, as it has the same test files. The order is
shuffled from the rater's seed, derived from the study seed and the rater's index
(reproducible).

The threshold protocol is ABX over a ladder: each (clip, level) pair is one row of the
``clips`` list (its side B the amplified stimulus ``S_k``, :mod:`.threshold`), with its own
base bits, so every level of every clip is counterbalanced exactly like an ABX clip, and the
levels of all clips are interleaved in one shuffled order with the catch trials.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .protocols import REGISTRY

#: the protocols (:mod:`.protocols`, one object each) and the answers of each
PROTOCOLS = tuple(REGISTRY)
ANSWERS = {name: p.answers for name, p in REGISTRY.items()}
#: protocols whose trials are ABX forced choice (X matches A or B; scored correct or not)
FORCED_CHOICE = tuple(name for name, p in REGISTRY.items() if p.forced_choice)


def page_protocol(protocol: str) -> str:
    """The protocol the rater page is told: a threshold study's trials are ABX trials, shown
    exactly as ABX (the page does not learn that levels exist)."""
    p = REGISTRY.get(protocol)
    return p.page if p is not None else protocol


def _paired(protocol: str) -> bool:
    """Two tiles side by side without X (preference), else ABX's three."""
    return REGISTRY[protocol].paired


#: easy catch degradations (:func:`.media.degrade`; the exclusion rule uses these)
CATCH_KINDS = ("negative",)


def parse_clips_spec(spec: str) -> tuple[str, int | None]:
    """``all``, ``worst:N`` or ``sample:N`` -> (mode, N); ValueError with the reason."""
    m = re.fullmatch(r"(all)|(worst|sample):(\d+)", spec.strip())
    if not m:
        raise ValueError(f"--clips: expected all, worst:N or sample:N, found {spec!r}")
    if m.group(1):
        return "all", None
    n = int(m.group(3))
    if n < 1:
        raise ValueError(f"--clips: N must be at least 1, found {spec!r}")
    return m.group(2), n


def select_clips(rows: list[dict], spec: str, seed: int) -> list[dict]:
    """Pick clips from report rows (each with ``job`` and ``lpips_mean``).

    ``worst:N``: the N where the metrics say the backends differ most (highest LPIPS mean);
    ``sample:N``: N drawn at random from the seed; ``all``: every row, in report order."""
    mode, n = parse_clips_spec(spec)
    if mode == "all":
        return list(rows)
    n = min(n, len(rows))
    if mode == "worst":
        key = lambda r: (-(r["lpips_mean"] if r["lpips_mean"] is not None else -1), r["job"])  # noqa: E731
        return sorted(rows, key=key)[:n]
    rng = np.random.default_rng([seed, 1])
    pick = sorted(rng.choice(len(rows), size=n, replace=False).tolist())
    return [rows[i] for i in pick]


def balanced_bits(n: int, rng: np.random.Generator) -> list[int]:
    bits = np.array([i % 2 for i in range(n)])
    rng.shuffle(bits)
    return bits.tolist()


def base_bits(n_clips: int, seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng([seed, 2])
    return balanced_bits(n_clips, rng), balanced_bits(n_clips, rng)


def rater_seed(study_seed: int, idx: int) -> int:
    return int(np.random.SeedSequence([study_seed, 3, idx]).generate_state(1)[0]) & 0x7FFFFFFF


#: easy catch trials per rater (exclusion uses only these: :func:`.stats.catch_min_correct`)
EASY_CATCHES = 8
#: graded catch trials per rater: mild degradations, reported (are raters sensitive near the
#: margin?), never used to exclude anyone
GRADED_CATCHES = 2
GRADED_KINDS = ("hue_mild",)


def n_catch(n_clips: int) -> int:
    """Easy catch trials per rater: :data:`EASY_CATCHES`, or 20% of the test trials if more."""
    return max(EASY_CATCHES, math.ceil(0.2 * n_clips))


#: the largest share of a rater's trials that are catch trials: half (catch trials at most as
#: many as test trials; issue 46: a 5-clip study gave each rater 15 trials, 10 of them catch)
MAX_CATCH_SHARE = 0.5


def min_easy_catches(catch_alpha: float) -> int:
    """The fewest easy catch trials whose screening can show better than guessing at
    ``catch_alpha``: all of n right has p = 0.5 ** n (:func:`.stats.catch_min_correct`)."""
    n = 1
    while 0.5**n > catch_alpha and n < 64:
        n += 1
    return n


def catch_counts(n_rows: int, catch_alpha: float = 0.05) -> tuple[int, int]:
    """``(easy, graded)`` catch trials per rater of a study of ``n_rows`` test trials, their
    share bounded by :data:`MAX_CATCH_SHARE`: :func:`n_catch` easy and :data:`GRADED_CATCHES`
    graded ones where they fit; else the graded ones go first (they are only reported), then
    easy ones, down to :func:`min_easy_catches` (the screening needs them: a study of fewer rows
    than that exceeds the bound, which ``study create`` says)."""
    easy, graded = n_catch(n_rows), GRADED_CATCHES
    cap = math.floor(n_rows * MAX_CATCH_SHARE / (1 - MAX_CATCH_SHARE) + 1e-9)
    graded = max(0, min(graded, cap - easy))
    if easy + graded > cap:
        easy = min(easy, max(cap, min_easy_catches(catch_alpha)))
    return easy, graded


def catch_grade(kind: str | None) -> str | None:
    """``easy`` or ``graded`` for a catch kind (None for test trials)."""
    if kind is None:
        return None
    return "graded" if kind in GRADED_KINDS else "easy"


def _draw(pool: list[dict], k: int, rng: np.random.Generator) -> list[dict]:
    """``k`` entries of ``pool``: each entry once before any repeats, in random order."""
    if not pool or k <= 0:
        return []
    reps = -(-k // len(pool))
    idx = np.concatenate([rng.permutation(len(pool)) for _ in range(reps)])[:k]
    return [pool[i] for i in idx]


def stream_keys(protocol: str, catch: bool = False, x: int = 1) -> list[str]:
    """The files a row (or a catch version) is encoded as: each a string whose letter ``i`` is
    the content of tile ``i`` (``a``/``b`` the backends, ``r``/``d`` reference and degraded).

    Preference: two tiles in both orders (``ab``, ``ba``). ABX: three tiles, X in tile ``x`` of
    every file, its match in either other tile, each with either content as X, 4 files in the
    order (X content, match place). The default ``x=1``, X in the middle: ``aab``, ``baa``,
    ``bba``, ``abb`` (catch: ``rrd``, ``drr``, ``ddr``, ``rdd``; X is the degraded copy in
    half). So a file says where X is (always the middle) and nothing else: the A and B labels
    are drawn per trial over tiles 0 and 2, and whatever raters pool per file (where X, A and
    B were) is the same for either answer (issue 44: with X's tile drawn per trial over every
    arrangement, the tile X never landed on answered every trial). Both places of the match
    are next to X, at the same distance: with X in tile 0 (``x=0``, the studies made between
    issue 44 and this layout: ``aab``, ``aba``, ``bba``, ``bab``) an H.264 file was smaller when
    the match sat next to X, in 46 of 48 pairs, and pooled sizes told the answer; with X in
    the middle, 20 of 48 (benchmarks/bench_tile_order.py). Lossless WebP is not even so: there
    a frame is smaller when the odd tile comes last (``aab``), whatever X's place, so only
    ``x=2`` (``aba``, ``baa``, ``bab``, ``abb``) leaves its sizes at chance (docs/studies.md,
    Blindness). A test row and a catch version have the same number of files
    (:func:`file_index`)."""
    one, two = ("r", "d") if catch else ("a", "b")
    if _paired(protocol):
        return [one + two, two + one]
    if x not in (0, 1, 2):
        raise ValueError(f"x: expected tile 0, 1 or 2, found {x!r}")
    out = []
    for c, o in ((one, two), (two, one)):
        for twin in [t for t in range(3) if t != x]:
            out.append("".join(c if t in (x, twin) else o for t in range(3)))
    return out


def row_keys(
    protocol: str, catch: bool = False, x: int = 1, bit: int = 0, one_place: bool = True
) -> list[str]:
    """The files a *new* row (or catch version) is encoded as: a subset of :func:`stream_keys`
    fixed per row by ``bit`` (its base bit), so that the files of a row differ only in what the
    raters' labels hide and never in the answer's place (issue 45: sizes).

    Preference: one file, ``ab`` (``bit`` 0) or ``ba``: which tile backend B is in is a bit of
    the row, and no other file of the row shows the other order (with both, the file with B on
    the left was the smaller in 16 of 16 H.264 pairs: pooled sizes told which box is B). The
    page's left box shows either tile (the rater's label bits), so nothing is lost. ABX with
    ``one_place``: two files, X's content either, its match in the first tile other than X's
    (``bit`` 0) or the second, the same in both: the two files of a row differ in X's content
    only, the answer's place is the row's, and a file's size against its sibling's says which
    content is X (hidden by the labels), never where the match is, by construction. Without
    ``one_place`` the 4 files of :func:`stream_keys` (both places; H.264 with X in the middle:
    at chance by measurement). The place is invisible to raters (the page draws X, A and B in
    fixed boxes from the tiles it is told)."""
    keys = stream_keys(protocol, catch, x)
    if _paired(protocol):
        return [keys[bit]]
    return [keys[bit], keys[2 + bit]] if one_place else keys


def row_bits(sides: tuple, level, n_catch: int) -> tuple[int, list[int]]:
    """The :func:`row_keys` bits of a row and of its ``n_catch`` catch versions, drawn from what
    the row shows (``sides``: the two sides' content fingerprints, A then B; ``level``: its
    stimulus) and nothing else, as :func:`catch_plan` draws catch versions: every study of the
    same rows then holds the same one file (preference) or two (lossless ABX) of each row, never
    ``ab`` in one study and ``ba`` in another, which pooled across studies would be siblings
    again (the smaller told which tile is B); a row's catch versions alternate, as the study's
    bits made them (drawn one by one, a bot read lossless catch answers 150 of 240). The row's
    bit is of the physical order (the content in the first tile: the bit flips with the sides,
    so a study of B against A holds the same file); raters cannot draw it without the source
    clips' bytes."""
    pair = tuple(sorted(sides))
    key = _digest("row-order", pair, level)
    first = pair[key % 2]
    bit = int(first != sides[0]) if sides[0] != sides[1] else key % 2
    base = _digest("catch-order", pair, level) % 2  # the versions of a row alternate
    return bit, [(base + j) % 2 for j in range(n_catch)]


#: whether a new study's ABX rows have one place of the match (:func:`row_keys`), by delivery:
#: lossless WebP sizes depend on the tile order (the odd tile last is smaller, 31 of 32 pairs
#: wherever X is), so each row fixes the order; H.264 with X in the middle measured at chance
#: with both places (benchmarks/results/tile_order_cpu2.txt)
ONE_PLACE = {"stream": False, "lossless": True}


#: X's tile in a new study's ABX files, by delivery (:func:`stream_keys`): the middle for the
#: H.264 stream, the last tile for lossless WebP (the layouts whose file sizes measured at
#: chance, benchmarks/results/tile_order_cpu2.txt)
X_TILE = {"stream": 1, "lossless": 2}


def x_tile(keys) -> int:
    """X's tile in the ABX files of a row whose stored arrangement keys are ``keys``: the one
    tile whose content every file has twice (``x`` of :func:`stream_keys`); the middle where no
    tile is that (a study made before issue 44, whose rows had every arrangement: every file
    the middle layout needs is there). Read from the stored data, so a study keeps its layout
    for every rater it ever takes (``aab`` is X in tile 0 in a study made between issue 44 and
    the middle layout, X in tile 1 now)."""
    keys = [k for k in keys if len(k) == 3]
    fit = [t for t in range(3) if keys and all(k.count(k[t]) == 2 for k in keys)]
    return fit[0] if len(fit) == 1 else 1


def row_files(protocol: str, streams: dict, catch: bool = False) -> list[str]:
    """The :func:`stream_keys` a row's ``streams`` hold, in order, in the row's own layout
    (``streams["x"]`` where stored: a row of one place, :func:`row_keys`, whose keys cannot
    say which twin is X; else :func:`x_tile`; a study made before issue 44 has ABX catch versions without the ``d`` as
    X files: two of them)."""
    x = 0 if _paired(protocol) else streams.get("x", x_tile(streams["files"]))
    return [k for k in stream_keys(protocol, catch, x) if k in streams["files"]]


def file_index(n_files: int, bits: tuple[int, int], idx: int) -> int:
    """Which of a row's ``n_files`` files rater ``idx`` gets: the row's base bits (drawn once
    per study) flipped by the rater's index, so every ``n_files`` consecutive raters (from a
    multiple of ``n_files``) get every file of every row exactly once, test rows and catch
    versions alike: how many raters share a file never tells a catch file."""
    first, second = bits
    if n_files == 4:
        return 2 * (second ^ ((idx // 2) % 2)) + (first ^ (idx % 2))
    return (first ^ idx) % n_files if n_files == 2 else (first + idx) % n_files


def catch_bits(n: int, study_seed: int) -> tuple[list[int], list[int]]:
    """The base bits of a study's ``n`` catch versions (:func:`file_index`), from its seed."""
    rng = np.random.default_rng([study_seed, 9])
    return balanced_bits(n, rng), balanced_bits(n, rng)


def catch_kinds(rank: int, n_easy: int, per_row: int = 1, n_graded: int = GRADED_CATCHES) -> list[str]:
    """The catch versions of the row of rank ``rank`` (:func:`catch_plan`): ``per_row`` easy
    ones for the first ``n_easy`` ranks, a graded one for the first ``n_graded``
    (:func:`catch_counts`)."""
    kinds = []
    if rank < n_easy:
        kinds += [CATCH_KINDS[(rank * per_row + j) % len(CATCH_KINDS)] for j in range(per_row)]
    if rank < n_graded:
        kinds.append(GRADED_KINDS[rank % len(GRADED_KINDS)])
    return kinds


def _digest(*parts) -> int:
    import hashlib

    text = "\x1f".join(repr(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def catch_plan(rows: list[tuple], n_catch: int, offsets, n_graded: int = GRADED_CATCHES) -> list[list[tuple]]:
    """Each row's catch versions, ``[(kind, from B, colour offset)]``, drawn from what the rows
    *show* and nothing else (issue 44 open (a)): ``rows`` in the clips table's order, each
    ``(sides, level)`` with ``sides`` the two sides' content fingerprints (A, B) and ``level``
    the row's stimulus (None: the clip itself); ``offsets``: the catch references' colour
    offsets (:data:`.threshold.CATCH_OFFSETS`).

    A test file is the same bytes in every study that shows the same row (the encode is
    deterministic), so a catch version must be too: were it drawn from a study's seed, pooling
    what raters of two studies of the same runs received would tell a catch file by recurring in
    one study only. Here the rows that get catch versions are the ``n_catch`` (easy; the first
    ``n_graded`` also a graded one) whose hash of (the pair of sides, level) is
    smallest; a version's source side is one of the pair's contents drawn from that hash, its
    colour offset from a per-clip permutation (magnitude 1 first) drawn from the pair. So two
    studies of the same rows have the same catch versions (the same files; which rater gets which
    file stays the study's secret, :func:`catch_bits`), studies sharing rows share most
    catch versions of the rows they share, and a study made from one of the runs against another
    draws its own. Exactly ``n_catch`` easy versions (a study of fewer rows gives some rows
    several)."""
    n_rows = len(rows)
    n_easy = min(n_rows, n_catch)
    per_row = -(-n_catch // n_rows) if n_rows else 1
    extra = n_catch - (per_row - 1) * n_rows  # rows (by rank) with per_row, the rest one less
    pair = [tuple(sorted(sides)) for sides, _ in rows]
    keys = [_digest("catch-row", p, level) for p, (_, level) in zip(pair, rows)]
    order = sorted(range(n_rows), key=lambda i: (keys[i], i))
    rank = [0] * n_rows
    for r, i in enumerate(order):
        rank[i] = r
    small = [o for o in offsets if max(map(abs, o)) == 1]
    large = [o for o in offsets if max(map(abs, o)) != 1]
    left: dict = {}  # per clip (pair): offsets not yet taken
    out = []
    for i, ((sides, _level), p) in enumerate(zip(rows, pair)):
        if p not in left:
            rng = np.random.default_rng(_digest("catch-offsets", p))
            left[p] = [small[j] for j in rng.permutation(len(small))] + [
                large[j] for j in rng.permutation(len(large))
            ]
        n = per_row if rank[i] < extra else per_row - 1
        versions = []
        for j, kind in enumerate(catch_kinds(rank[i], n_easy, n, n_graded)):
            source = p[_digest("catch-side", keys[i], j) % 2]
            from_b = source == sides[1] if sides[0] != sides[1] else bool(_digest(keys[i], j) % 2)
            versions.append((kind, bool(from_b), tuple(left[p].pop(0))))
        out.append(versions)
    return out


_LETTER = {"a": "a", "b": "b", "reference": "r", "degraded": "d"}
_CONTENT = {"a": "a", "b": "b", "r": "reference", "d": "degraded"}


def _trial(protocol: str, key: str, streams: dict, bit: int) -> dict:
    """A trial shown from file ``key``: ``sources`` (slot -> content), ``expected`` and
    ``shown``. ``bit``: the rater's balanced bit for this trial: ABX, the answer is B (the
    match is labelled B); preference, the second content (``b``/``d``) is on the left."""
    rects = streams["rects"]
    paired = _paired(protocol)
    if paired:
        second = 1 if key[1] in "bd" else 0  # the tile of b (or d)
        left = second if bit else 1 - second
        tiles = {"left": left, "right": 1 - left}
        expected = None
    else:
        x = streams.get("x", x_tile(streams["files"]))
        twin = next(j for j in range(3) if j != x and key[j] == key[x])
        other = 3 - x - twin
        tiles = {"X": x, "A": other if bit else twin, "B": twin if bit else other}
        expected = "B" if bit else "A"
    sources = {s: _CONTENT[key[i]] for s, i in tiles.items()}
    if paired and key[0] in "rd":  # catch: the reference is the answer
        expected = "left" if sources["left"] == "reference" else "right"
    return {
        "sources": sources,
        "expected": expected,
        "shown": {"media": streams["files"][key], "tiles": {s: list(rects[i]) for s, i in tiles.items()}},
    }


def assign(
    protocol: str,
    clips: list[dict],
    catch_pool: list[dict],
    idx: int,
    seed: int,
    study_seed: int = 0,
    counts: tuple[int, int] | None = None,
) -> list[dict]:
    """One rater's trials, in presentation order.

    ``clips``: dicts with ``id``, ``base_swap``, ``base_x`` and ``streams`` (the row's trial
    streams: ``{"rects", "files": {key: sha256}}``, :func:`stream_keys`). ``catch_pool``:
    dicts with ``clip_id``, ``kind`` and ``streams``; kinds in :data:`GRADED_KINDS` are graded
    catches. ``seed``: the rater's seed (:func:`rater_seed`); ``study_seed``: the study's (the
    catch versions' base bits, :func:`catch_bits`). ``counts``: (easy, graded) catch trials,
    the study's ``catch_rule`` (default :func:`catch_counts` at ``catch_alpha`` 0.05).

    Which file of each row the rater gets is :func:`file_index` (the base bits flipped by the
    rater's index); the labels over its tiles come from balanced bits drawn from the rater's
    seed (ABX: half the answers A; preference: B on the left in half the trials, the reference
    in half the catch trials). Returns dicts with ``kind`` (test/catch), ``clip_id``,
    ``catch_kind``, ``shown`` (``{"media": the trial's stream, "tiles": slot -> [x, y, w, h]
    of its tile}``), ``sources`` (slot -> a, b, reference or degraded) and ``expected`` (catch
    trials and ABX: the right answer)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: expected preference, abx or threshold, found {protocol!r}")
    proto = page_protocol(protocol)
    rng = np.random.default_rng(seed)
    out = []
    bits = balanced_bits(len(clips), rng)
    for c, bit in zip(clips, bits):
        keys = row_files(proto, c["streams"])
        key = keys[file_index(len(keys), (c["base_swap"], c["base_x"]), idx)]
        out.append(
            {"kind": "test", "clip_id": c["id"], "catch_kind": None, **_trial(proto, key, c["streams"], bit)}
        )
    cb = catch_bits(len(catch_pool), study_seed)
    pool = [dict(cp, _bits=(cb[0][i], cb[1][i])) for i, cp in enumerate(catch_pool)]
    easy = [cp for cp in pool if catch_grade(cp["kind"]) == "easy"]
    graded = [cp for cp in pool if catch_grade(cp["kind"]) == "graded"]
    n_easy, n_graded = catch_counts(len(clips)) if counts is None else counts
    picks = _draw(easy, n_easy, rng) + _draw(graded, n_graded, rng)
    sides = balanced_bits(len(picks), rng)
    for cp, side in zip(picks, sides):
        keys = row_files(proto, cp["streams"], catch=True)
        key = keys[file_index(len(keys), cp["_bits"], idx)]
        out.append(
            {
                "kind": "catch",
                "clip_id": cp["clip_id"],
                "catch_kind": cp["kind"],
                **_trial(proto, key, cp["streams"], side),
            }
        )
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def score(protocol: str, trial: dict, answer: str) -> tuple[int | None, float | None]:
    """(correct, score_b) of an answer: ``correct`` 1/0 where the trial has an expected answer
    (ABX, catch trials); ``score_b`` for preference test trials: 1 B preferred, 0 A, 0.5 same."""
    correct = None if trial["expected"] is None else int(answer == trial["expected"])
    if _paired(protocol) and trial["kind"] == "test":
        if answer == "same":
            return correct, 0.5
        return correct, 1.0 if trial["sources"][answer] == "b" else 0.0
    return correct, None
