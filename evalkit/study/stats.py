"""Statistics of a study: pure functions on arrays (no database, no files).

Conventions
-----------
ABX: every test trial gives ``correct`` (1 when the rater picked the video that matches X).
Accuracy is the mean of ``correct``; the binomial test is one-sided (accuracy > 0.5).

Preference: every test trial gives a score for backend B: 1 (B preferred), 0 (A preferred),
0.5 (no difference). ``win_rate_b`` is B's wins over the decisive trials (ties left out), with a
Wilson 95% interval and a two-sided binomial (sign) test against 0.5; ties are counted and
reported. ``score_b`` = (wins of B + ties / 2) / trials is what the equivalence test uses.

Verdict (equivalence test, one-sided, level ``alpha`` = 0.05):

- ABX: "indistinguishable" when the one-sided 95% upper bound of accuracy is below
  ``0.5 + margin``: the margin is on accuracy *above chance* (margin 0.1: raters pick the
  right video at most 60% of the time).
- preference: "indistinguishable" when the one-sided 95% upper bound of ``|score_b - 0.5|`` is
  below ``margin``.

The upper bound is the 95th percentile of a two-way cluster ("pigeonhole") bootstrap: each
replicate resamples raters and clips independently with replacement and weights every rating
by (times its rater was drawn) x (times its clip was drawn). This keeps the dependence of
ratings by the same rater or of the same clip and is conservative for independent ratings
(it inflates the variance about 3x), so the level of the test stays at or below 5%.
"""
from __future__ import annotations

import math

import numpy as np

Z95 = 1.6448536269514722


def wilson(successes: int, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Wilson score interval of a proportion; ``(None, None)`` when ``n`` is 0."""
    if n == 0:
        return None, None
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def binom_p(successes: int, n: int, alternative: str) -> float | None:
    """Exact binomial test against 0.5 (``two-sided`` or ``greater``); None when ``n`` is 0."""
    if n == 0:
        return None
    from scipy.stats import binomtest

    return float(binomtest(successes, n, 0.5, alternative=alternative).pvalue)


def _codes(labels) -> tuple[np.ndarray, int]:
    _, inv = np.unique(np.asarray(labels), return_inverse=True)
    return inv.ravel(), int(inv.max()) + 1 if len(inv) else 0


def cluster_bootstrap(values, raters, clips, *, reps: int = 1000, seed: int = 0,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """Bootstrap replicates of the mean of ``values``, clustered over raters and clips.

    Returns ``reps`` replicate means (two-way pigeonhole bootstrap, vectorised)."""
    y = np.asarray(values, dtype=float)
    if y.size == 0:
        return np.full(reps, np.nan)
    rng = rng if rng is not None else np.random.default_rng(seed)
    r, nr = _codes(raters)
    c, nc = _codes(clips)
    wr = rng.multinomial(nr, np.full(nr, 1.0 / nr), size=reps).astype(float)
    wc = rng.multinomial(nc, np.full(nc, 1.0 / nc), size=reps).astype(float)
    w = wr[:, r] * wc[:, c]
    tot = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (w @ y) / tot
    # a replicate that drew no observed (rater, clip) cell has no mean (NaN); upper_bound
    # counts it as the worst case for equivalence rather than dropping it
    means[tot == 0] = np.nan
    return means


def upper_bound(protocol: str, values, raters, clips, *, alpha: float = 0.05, reps: int = 1000,
                seed: int = 0, rng=None) -> float | None:
    """One-sided (1 - alpha) upper bound: of accuracy (abx) or of |score_b - 0.5| (preference)."""
    if len(values) == 0:
        return None
    boot = cluster_bootstrap(values, raters, clips, reps=reps, seed=seed, rng=rng)
    stat = boot if protocol == "abx" else np.abs(boot - 0.5)
    stat = np.where(np.isnan(stat), 1.0 if protocol == "abx" else 0.5, stat)
    return float(np.quantile(stat, 1 - alpha))


def verdict(protocol: str, bound: float | None, margin: float) -> str:
    """``indistinguishable`` when the upper bound is below the margin (see module docstring),
    else ``not shown`` (no claim either way unless the difference test is significant)."""
    if bound is None:
        return "no data"
    limit = 0.5 + margin if protocol == "abx" else margin
    return "indistinguishable" if bound < limit else "not shown"


def krippendorff_alpha_nominal(units) -> float | None:
    """Krippendorff's alpha for nominal data. ``units``: one list of values per unit (clip),
    one value per rater that rated it; units with fewer than two values are not pairable."""
    from collections import Counter

    units = [list(u) for u in units if len(u) >= 2]
    if not units:
        return None
    cats = sorted({v for u in units for v in u}, key=str)
    idx = {v: i for i, v in enumerate(cats)}
    k = len(cats)
    o = np.zeros((k, k))
    for u in units:
        m = len(u)
        cnt = Counter(u)
        for a, na in cnt.items():
            for b, nb in cnt.items():
                pairs = na * (nb - (1 if a == b else 0))
                o[idx[a], idx[b]] += pairs / (m - 1)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    if n <= 1:
        return None
    d_o = o.sum() - np.trace(o)
    d_e = (n * n - (n_c ** 2).sum()) / (n - 1)
    if d_e == 0:
        return 1.0 if d_o == 0 else None
    return float(1 - d_o / d_e)


# -- planning and simulation -------------------------------------------------------------------

def simulate_verdicts(protocol: str, *, raters: int, clips: int, truth: float, margin: float,
                      studies: int = 400, reps: int = 400, tie_rate: float = 0.0,
                      alpha: float = 0.05, seed: int = 0) -> np.ndarray:
    """Simulate ``studies`` complete studies (every rater rates every clip once) with
    independent raters whose true ABX accuracy (or preference for B among decisive answers)
    is ``truth``; return one boolean per study: was "indistinguishable" reached by the same
    bootstrap rule as :func:`upper_bound` / :func:`verdict`."""
    rng = np.random.default_rng(seed)
    n = raters * clips
    r = np.repeat(np.arange(raters), clips)
    c = np.tile(np.arange(clips), raters)
    limit = 0.5 + margin if protocol == "abx" else margin
    out = np.empty(studies, dtype=bool)
    if protocol == "abx":
        ys = (rng.random((studies, n)) < truth).astype(float)
    else:
        u = rng.random((studies, n))
        tie = rng.random((studies, n)) < tie_rate
        ys = np.where(tie, 0.5, (u < truth).astype(float))
    for s in range(studies):
        wr = rng.multinomial(raters, np.full(raters, 1.0 / raters), size=reps).astype(float)
        wc = rng.multinomial(clips, np.full(clips, 1.0 / clips), size=reps).astype(float)
        w = wr[:, r] * wc[:, c]
        boot = (w @ ys[s]) / w.sum(axis=1)
        stat = boot if protocol == "abx" else np.abs(boot - 0.5)
        out[s] = np.quantile(stat, 1 - alpha) < limit
    return out


def analytic_trials(protocol: str, margin: float, power: float, *, tie_rate: float = 0.0,
                    alpha: float = 0.05, inflation: float = 3.0) -> int:
    """Normal approximation of the trials needed when the truth is chance: the bound is about
    estimate + z(1-alpha) * sqrt(inflation) * SE (``inflation``: the pigeonhole bootstrap's
    variance factor for independent ratings)."""
    from scipy.stats import norm

    sd = 0.5 * math.sqrt(1 - tie_rate) if protocol == "preference" else 0.5
    za = float(norm.ppf(1 - alpha)) * math.sqrt(inflation)
    # preference folds |score - 0.5|: power needs both tails inside, z for (1 + power) / 2
    zb = float(norm.ppf(power if protocol == "abx" else (1 + power) / 2))
    return int(math.ceil(((za + zb) * sd / margin) ** 2))


def plan(protocol: str, margin: float, power: float = 0.8, *, clips_per_rater: int = 20,
         tie_rate: float = 0.0, alpha: float = 0.05, studies: int = 400, reps: int = 400,
         seed: int = 12345) -> dict:
    """Raters (each rating ``clips_per_rater`` clips once) needed so that, when raters truly
    cannot tell the backends apart (ABX accuracy 0.5, or no preference), the verdict
    "indistinguishable" is reached with probability ``power`` by the study's own bootstrap rule.

    Starts from :func:`analytic_trials` and refines by simulation (:func:`simulate_verdicts`,
    fixed seed): the smallest rater count whose simulated power minus one Monte Carlo standard
    error is at least ``power``."""
    if protocol not in ("abx", "preference"):
        raise ValueError(f"protocol: expected abx or preference, found {protocol!r}")
    if not 0 < margin < 0.5:
        raise ValueError(f"margin: expected a number in (0, 0.5), found {margin}")
    if not 0 < power < 1:
        raise ValueError(f"power: expected a number in (0, 1), found {power}")
    mc_se = math.sqrt(power * (1 - power) / studies)
    cache: dict[int, float] = {}

    def pw(raters: int) -> float:
        if raters not in cache:
            cache[raters] = float(simulate_verdicts(
                protocol, raters=raters, clips=clips_per_rater, truth=0.5, margin=margin,
                studies=studies, reps=reps, tie_rate=tie_rate, alpha=alpha,
                seed=seed + raters).mean())
        return cache[raters]

    ok = lambda k: pw(k) - mc_se >= power  # noqa: E731
    n0 = analytic_trials(protocol, margin, power, tie_rate=tie_rate, alpha=alpha)
    k = max(2, math.ceil(n0 / clips_per_rater))
    while not ok(k):
        k = int(math.ceil(k * 1.15)) + 1
        if k > 100000:
            raise ValueError("plan: no feasible size below 100000 raters")
    lo, hi = 1, k   # ok(hi); search the smallest
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= 2 and ok(mid):
            hi = mid
        else:
            lo = mid
    return {"protocol": protocol, "margin": margin, "power_target": power, "alpha": alpha,
            "raters": hi, "clips_per_rater": clips_per_rater, "trials": hi * clips_per_rater,
            "simulated_power": cache[hi], "analytic_trials": n0, "tie_rate": tie_rate,
            "simulated_studies": studies, "bootstrap_reps": reps}
