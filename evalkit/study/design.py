"""Study design, pure: which clips, and each rater's balanced, shuffled list of trials.

Counterbalancing: every clip gets base bits drawn once per study (half of the clips 1, half 0,
shuffled from the study seed). Rater ``k`` shows backend B on the left (preference), or in
slot A (ABX), when ``base_swap XOR (k mod 2)``; in ABX X is backend B when
``base_x XOR (k div 2 mod 2)``. So within a rater positions are balanced, and every 2
(preference) or 4 (ABX) consecutive raters see each clip in every arrangement exactly once.
Catch trials (known answer) are mixed in: :data:`EASY_CATCHES` obvious degradations (the
exclusion rule uses these) and :data:`GRADED_CATCHES` mild ones (reported only). The order is
shuffled from the rater's seed, derived from the study seed and the rater's index
(reproducible). Each trial is one stream whose tiles are its videos (:mod:`.media`); which tile
each slot shows is drawn per trial from the rater's seed, uniformly over every arrangement.

The threshold protocol is ABX over a ladder: each (clip, level) pair is one row of the
``clips`` list (its side B the amplified stimulus ``S_k``, :mod:`.threshold`), with its own
base bits, so every level of every clip is counterbalanced exactly like an ABX clip, and the
levels of all clips are interleaved in one shuffled order with the catch trials.
"""
from __future__ import annotations

import itertools
import math
import re

import numpy as np

PROTOCOLS = ("preference", "abx", "threshold")
ANSWERS = {"preference": ("left", "right", "same"), "abx": ("A", "B"), "threshold": ("A", "B")}
#: protocols whose trials are ABX forced choice (X matches A or B; scored correct or not)
FORCED_CHOICE = ("abx", "threshold")


def page_protocol(protocol: str) -> str:
    """The protocol the rater page is told: a threshold study's trials are ABX trials, shown
    exactly as ABX (the page does not learn that levels exist)."""
    return "abx" if protocol == "threshold" else protocol
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


def stream_keys(protocol: str, catch: bool = False) -> list[str]:
    """The tile arrangements a row (or a catch version) needs one stream for: each a string
    whose letter ``i`` is the content of tile ``i`` (``a``/``b`` the backends, ``r``/``d``
    reference and degraded). ABX: three tiles, two of them the same content (X and its
    match), in every order (6 for a test row, 3 for a catch version: X is the reference);
    preference: two tiles in both orders."""
    one, two = ("r", "d") if catch else ("a", "b")
    n = 2 if protocol == "preference" else 3
    keys = ["".join(k) for k in itertools.product((one, two), repeat=n) if len(set(k)) == 2]
    return [k for k in keys if not catch or n == 2 or k.count(one) == 2]


def _place(contents: dict, streams: dict, rng: np.random.Generator) -> dict:
    """``shown`` of a trial: the tiles' positions drawn at random (every slot a distinct tile
    of the trial's stream); ``contents``: slot -> content letter; ``streams``:
    ``{"rects": [[x, y, w, h], ...], "files": {arrangement: sha256}}``."""
    slots = list(contents)
    pos = rng.permutation(len(slots))
    key = [""] * len(slots)
    for s, p in zip(slots, pos):
        key[p] = contents[s]
    return {"media": streams["files"]["".join(key)],
            "tiles": {s: list(streams["rects"][p]) for s, p in zip(slots, pos.tolist())}}


_LETTER = {"a": "a", "b": "b", "reference": "r", "degraded": "d"}


def assign(protocol: str, clips: list[dict], catch_pool: list[dict], idx: int,
           seed: int) -> list[dict]:
    """One rater's trials, in presentation order.

    ``clips``: dicts with ``id``, ``base_swap``, ``base_x`` and ``streams`` (the row's trial
    streams: ``{"rects", "files": {arrangement: sha256}}``, :func:`stream_keys`).
    ``catch_pool``: dicts with ``clip_id``, ``kind`` and ``streams``; kinds in
    :data:`GRADED_KINDS` are graded catches. ``seed``: the rater's seed (:func:`rater_seed`).
    Returns dicts with ``kind`` (test/catch), ``clip_id``, ``catch_kind``, ``shown`` (``{"media":
    the trial's stream, "tiles": slot -> [x, y, w, h] of its tile}``, the tiles' positions drawn
    at random per trial), ``sources`` (slot -> a, b, reference or degraded) and ``expected``
    (catch trials and ABX: the right answer)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: expected preference, abx or threshold, found {protocol!r}")
    rng = np.random.default_rng(seed)
    place = np.random.default_rng([seed, 7])     # tile positions: a stream of their own
    out = []
    for c in clips:
        swap = c["base_swap"] ^ (idx % 2)
        first, second = ("b", "a") if swap else ("a", "b")
        if protocol == "preference":
            sources = {"left": first, "right": second}
            expected = None
        else:
            x = "b" if c["base_x"] ^ ((idx // 2) % 2) else "a"
            sources = {"X": x, "A": first, "B": second}
            expected = "A" if first == x else "B"
        out.append({"kind": "test", "clip_id": c["id"], "catch_kind": None,
                    "sources": sources, "expected": expected, "streams": c["streams"]})
    easy = [cp for cp in catch_pool if catch_grade(cp["kind"]) == "easy"]
    graded = [cp for cp in catch_pool if catch_grade(cp["kind"]) == "graded"]
    picks = _draw(easy, n_catch(len(clips)), rng) + _draw(graded, GRADED_CATCHES, rng)
    sides = balanced_bits(len(picks), rng)
    for cp, side in zip(picks, sides):
        first, second = ("degraded", "reference") if side else ("reference", "degraded")
        if protocol == "preference":
            sources = {"left": first, "right": second}
            expected = "left" if first == "reference" else "right"
        else:
            sources = {"X": "reference", "A": first, "B": second}
            expected = "A" if first == "reference" else "B"
        out.append({"kind": "catch", "clip_id": cp["clip_id"], "catch_kind": cp["kind"],
                    "sources": sources, "expected": expected, "streams": cp["streams"]})
    order = rng.permutation(len(out))
    out = [out[i] for i in order]
    for t in out:                                 # positions drawn in presentation order
        t["shown"] = _place({s: _LETTER[v] for s, v in t["sources"].items()},
                            t.pop("streams"), place)
    return out


def score(protocol: str, trial: dict, answer: str) -> tuple[int | None, float | None]:
    """(correct, score_b) of an answer: ``correct`` 1/0 where the trial has an expected answer
    (ABX, catch trials); ``score_b`` for preference test trials: 1 B preferred, 0 A, 0.5 same."""
    correct = None if trial["expected"] is None else int(answer == trial["expected"])
    if protocol == "preference" and trial["kind"] == "test":
        if answer == "same":
            return correct, 0.5
        return correct, 1.0 if trial["sources"][answer] == "b" else 0.0
    return correct, None
