"""What an owner who reads the study database at interim can learn about how the study is going
(issue 44 item 5), by what the database keeps in plain text: seeded Monte Carlo, ABX.

    .venv/bin/python benchmarks/bench_sealed_peek.py                  # about a minute
    .venv/bin/python benchmarks/bench_sealed_peek.py --studies 4000

The owner looks when half of the planned raters are done and abandons the study (to run it
again) when their estimate of the accuracy so far is among the highest 20% that studies at
chance give (the threshold calibrated on separate studies at chance; where the estimate is a
constant, 20% abandoned at random). A look that can steer which studies get reported is one
whose abandonment rate depends on the truth. Three databases:

- ``plain key`` (schema 5): ``ratings.correct`` in plain text, the estimate is the accuracy;
- ``plain answers`` (the key sealed, the answers not): rater k's key on a clip is rater 0's
  flipped by ``k mod 2`` and ``k div 2 mod 2`` (the public counterbalancing of
  :func:`evalkit.study.design.assign` before issue 44 item 1; it now draws the labels from
  per-rater bits of the sealed design seed, so this row describes the earlier design), so answers aligned that way agree on a clip in a share
  ``q = p^2 + (1 - p)^2`` of rater pairs; the estimate is ``0.5 + sqrt(max(0, 2q - 1)) / 2``;
- ``sealed`` (schema 6): answers sealed too; nothing left to estimate from (the estimate is the
  prior 0.5 whatever happened), so abandonment cannot depend on the truth (20% everywhere).

Truth: each rater's accuracy ``mu + N(0, rater_sd)``, each clip's ``+ N(0, clip_sd)``, clipped to
[0, 1]; ``mu`` at chance (0.5), at the boundary (0.5 + margin) and at 0.5 + 2 margin. Printed:
the abandonment rate per (database, truth) with its Monte Carlo s.e.; the saved output is
benchmarks/results/sealed_peek.txt.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

#: the share of studies at chance the owner is willing to abandon
SHARE = 0.2


def truth(
    rng, studies: int, raters: int, clips: int, mu: float, rater_sd: float, clip_sd: float
) -> np.ndarray:
    p = (
        mu
        + rater_sd * rng.standard_normal((studies, raters, 1))
        + clip_sd * rng.standard_normal((studies, 1, clips))
    )
    return np.clip(p, 0.0, 1.0)


def estimates(rng, p: np.ndarray) -> dict[str, np.ndarray]:
    """The owner's accuracy estimate per study from each database (``p``: the raters so far)."""
    studies, raters, clips = p.shape
    correct = rng.random(p.shape) < p
    flip = np.array([(k % 2) ^ ((k // 2) % 2) for k in range(raters)], dtype=bool)
    key0 = rng.random((studies, 1, clips)) < 0.5  # rater 0's right answer is "A"
    right_a = key0 ^ flip[None, :, None]  # rater k's right answer is "A"
    said_a = np.where(correct, right_a, ~right_a)  # what the database would hold
    aligned = said_a ^ flip[None, :, None]  # undo the public flips
    n_a = aligned.sum(axis=1)  # per study and clip
    pairs = raters * (raters - 1) / 2
    agree = (n_a * (n_a - 1) / 2 + (raters - n_a) * (raters - n_a - 1) / 2) / pairs
    q = agree.mean(axis=1)
    return {
        "plain key": correct.mean(axis=(1, 2)),
        "plain answers": 0.5 + np.sqrt(np.maximum(0.0, 2 * q - 1)) / 2,
        "sealed": np.full(studies, 0.5),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", type=int, default=2000, help="simulated studies per cell")
    ap.add_argument("--seed", type=int, default=44)
    ap.add_argument("--rater-sd", type=float, default=0.15)
    ap.add_argument("--clip-sd", type=float, default=0.1)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    print(
        f"abandon when the estimate at half the planned raters is in the top {SHARE:.0%} of "
        f"studies at chance; {a.studies} studies a cell, seed {a.seed}, rater sd "
        f"{a.rater_sd}, clip sd {a.clip_sd}"
    )
    print(f"{'design':<22} {'database':<14} {'mu=0.5':>16} {'mu=0.5+m':>16} {'mu=0.5+2m':>16}")
    for raters, clips, margin in ((15, 107, 0.05), (30, 30, 0.1), (16, 15, 0.2)):
        look = raters // 2
        rows: dict[str, list[str]] = {}
        calib = estimates(rng, truth(rng, a.studies, look, clips, 0.5, a.rater_sd, a.clip_sd))
        cut = {name: np.quantile(e, 1 - SHARE) for name, e in calib.items()}
        for mu in (0.5, 0.5 + margin, 0.5 + 2 * margin):
            est = estimates(rng, truth(rng, a.studies, look, clips, mu, a.rater_sd, a.clip_sd))
            for name, e in est.items():
                if np.ptp(calib[name]) == 0:  # nothing to estimate from: at random
                    gone = rng.random(a.studies) < SHARE
                else:
                    gone = e > cut[name]
                r = float(np.mean(gone))
                se = math.sqrt(max(r * (1 - r), 1e-12) / a.studies)
                rows.setdefault(name, []).append(f"{r:.3f} +- {se:.3f}")
        for name, cells in rows.items():
            print(
                f"{f'{raters} x {clips}, m={margin:g}':<22} {name:<14} " + " ".join(f"{c:>16}" for c in cells)
            )
    print(
        "a rate that rises with mu is a look that steers which studies get reported; "
        f"sealed: {SHARE:.0%} whatever the truth, the database holds nothing to estimate from"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
