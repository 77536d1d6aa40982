"""Statistics of a study: pure functions on arrays (no database, no files).

Rater and clip labels are arbitrary hashables; every function takes one entry per test rating.

ABX (forced choice): the verdict
--------------------------------
Every test rating is ``correct`` (1 when the rater picked the video that matches X). The rule
(:func:`decide_abx`), applied to a complete design (the caller shows no verdict before the
planned number of included raters has finished, see "Sequential looks" below), at level
``alpha`` (0.05):

1. Overall difference test: exact one-sided binomial test (accuracy > 0.5) on all test
   ratings, at level ``alpha / 2``. It is exact under the sharp null that nobody can tell any
   clip apart: the position of X's match is randomised, so every answer is then a fair coin,
   independent of rater and clip, whatever the raters' habits.
2. Per clip: exact one-sided binomial test per clip, Holm step-down over the clips at level
   ``alpha / 2``; a rejected clip is *flagged* (detectably different). One visible clip among
   many invisible ones barely moves the overall accuracy (19 chance clips and one at 0.95 give
   0.52) but is caught here.
3. ``distinguishable`` when (1) is significant or any clip is flagged. Bonferroni split of
   ``alpha`` between (1) and (2): the family-wise error under the sharp null is <= ``alpha``.
4. Otherwise ``indistinguishable`` when the upper bound
   ``U = accuracy + t(1 - alpha, df) * SD < 0.5 + margin``, where SD is the standard deviation
   of the replicates of a two-way cluster ("pigeonhole") bootstrap: raters and clips are
   resampled independently with replacement and each rating is weighted by the product of its
   rater's and its clip's draw counts (a replicate with zero total weight counts as accuracy
   1.0, the worst case); ``df = min(raters, clips) - 1`` is a small-cluster correction (the
   bootstrap SD is estimated from that many independent units at best).
   Two more conditions for "indistinguishable" (issue 44; they never make a study
   "distinguishable", so the false "distinguishable" rate at chance is that of 1-3):

   * *nothing below chance*: under the sharp null every answer is a fair coin, so a rater or a
     clip significantly *below* 0.5 (exact lower-tail binomial, Holm, at ``alpha`` x 0.1
     each), all ratings below 0.5 (``alpha`` x 0.1), or raters' or clips' accuracies spread
     around 0.5 in either direction beyond chance (sum of (2k - n)^2 / n against
     :data:`DISPERSION_DRAWS` fair-coin draws, ``alpha`` x 0.35 each) mean someone saw the
     difference and answered against it (a confused rater, a saboteur, a bot that decodes):
     no equivalence claim. Inverted answers, which pull the accuracy toward or below 0.5,
     cannot then buy a claim; at chance these checks fire together at most ``alpha``.
   * *coverage*: the one-sided 95% bound on the share of visibly different clips
     (:func:`visible_share_bound`, none flagged) is below :func:`visible_share_limit`
     (2 x margin: fully visible clips at that share alone put the accuracy at 0.5 + margin);
     15 random clips miss a 10% share of visible clips 21% of the time, so at margin 0.05 the
     claim needs :func:`min_clips` = 29 clips or more.

   Answers barely below chance (every rater at 0.5 + margin with half of them inverted; bots
   right 40% of the time as 40% of the raters) are seen only by the raters' spread check, whose
   power grows with clips per rater: :func:`plan` gives each rater :func:`spread_clips` clips
   (margin 0.1: 41; 0.05: 159), and :func:`design_check` judges achieved designs on those
   scenarios too (``benchmarks/results/study_sim_round2.txt``).

5. Otherwise ``inconclusive``.

Why a t-quantile times the bootstrap SD and not the bootstrap percentile: with 4-8 raters or 10
clips the percentile bound is too narrow (its type I error was 6-9%); the SD carries the
pigeonhole bootstrap's variance (which over-estimates the variance of independent ratings
about threefold and estimates the rater and clip components, Owen 2007, "The pigeonhole
bootstrap", Ann. Appl. Stat. 1:386-411) and the t quantile pays for estimating it from few
clusters. The Monte Carlo grid of ``benchmarks/bench_study_sim.py`` (results in
``benchmarks/results/study_sim.txt``) checks, for every scenario of :data:`SCENARIOS`, at the
floor (12 raters x 15 clips), at 12-60 raters x 15-40 clips for margin 0.1 and at the sizes
:func:`plan` returns for margins 0.05-0.2 at 15-100 clips:

* "indistinguishable" said when the true mean accuracy is at the boundary ``0.5 + margin``:
  <= 5% (within one Monte Carlo standard error);
* "distinguishable" said when everyone guesses: <= 5% (exact, see 3);
* "indistinguishable" said when everyone guesses: >= the planned power at the size of
  :func:`plan`; one clip at accuracy ``clip_accuracy`` is flagged >= ``clip_power``.

The rule as stated meets these at those sizes, so the ABX rule is unchanged. One limit, found
by the simulations: with few raters and many clips at a small margin (12 raters x 40 clips at
margin 0.05: 5%; 23 raters x 100 clips: 12%), a population in which 10% of raters see the
difference well ("golden ears", 0.95) and the rest barely is under-represented: a sample
without any golden ear (0.9^23 = 9%) looks like raters at chance with a tight bound, and no
bound computed from that sample can know better. :func:`plan` therefore also simulates the
boundary error of every scenario at the size it found and adds raters until it is <= alpha
(100 clips at margin 0.05: 41 raters instead of 23); do not run studies with fewer raters
than planned.

The margin is on accuracy: margin 0.1 means raters pick the right video at most 60% of the
time. :func:`margin_terms` states it also as a proportion of discriminators (guessing model:
a fraction ``pd`` of raters see the difference and answer right, the others guess, so
accuracy = 0.5 + pd / 2 and pd = 2 * margin) and as d' (sensitivity) of ABX.

d' of ABX: Macmillan & Creelman, *Detection Theory: A User's Guide* (2nd ed., 2005), ch. 9
(ABX). With observations A, B, X of unit variance and means 0 / d':

* differencing model (the observer cannot hold fixed standards; used by :func:`margin_terms`
  as ``d_prime``): ``p_c = Phi(d'/sqrt2) Phi(d'/sqrt6) + Phi(-d'/sqrt2) Phi(-d'/sqrt6)``;
* independent-observation model (optimal with two fixed stimuli):
  ``p_c = Phi(d'/sqrt2) Phi(d'/2) + Phi(-d'/sqrt2) Phi(-d'/2)``.

(The differencing form follows from u = B - A ~ N(+-d', 2) and v = X - (A + B)/2 ~ N(+-d'/2,
3/2), which are uncorrelated: correct when u and v have the same sign.) Both are inverted
numerically by :func:`d_prime_abx`.

Preference (A vs B, "no difference" allowed): never an equivalence claim
------------------------------------------------------------------------
Every test rating is B preferred, A preferred or a tie. :func:`decide_preference` tests for a
difference only: B's win rate over the *decisive* ratings, two-sided, cluster-aware: the same
pigeonhole bootstrap of the win rate (ties weigh nothing; a replicate without any decisive
rating counts as the win rate 0 or 1 farthest from the estimate, the worst case), interval
``win rate +- t(1 - alpha/2, df) * SD`` with ``m = min(raters, clips with a decisive rating)``,
``df = m - 1``; "B preferred" / "A preferred" when the interval excludes 0.5, else "no
preference shown". The plain exact sign test p (ratings taken as independent) is reported
beside it. Two changes from the ABX recipe, both found by simulation: the bootstrap SD is
multiplied by ``sqrt(m / (m - 1))`` (the pigeonhole bootstrap estimates the between-rater
variance with divisor m, not m - 1; without it, raters who split their taste, each nearly
always choosing the same side (rater SD 0.45 around 0.5), were called a preference 5.8-6.0%
of the time at 12 raters x 15-40 clips; with it 5.1-5.3% there, +-0.16, and 4.1% at 20 raters:
20,000 simulated studies, 1,000 replicates; less spread taste stays well below 5%); and a zero SD (every decisive rating one way, in every replicate) says nothing about
the spread, so the exact sign test at ``alpha`` decides then.

Why no "indistinguishable" verdict: raters who see a difference but split their taste (half
prefer A, half B) produce the same win rate and the same ties as raters who see none, so a
preference study cannot tell "no difference" from "a difference nobody agrees about". Only a
forced choice with a right answer (ABX) can claim indistinguishable. (The previous rule judged
``score_b`` = (wins of B + ties/2) / ratings and called 85% ties with every decisive answer for B
"indistinguishable" 61% of the time.)

Sequential looks
----------------
The rule is for one look at the planned size. Checking after every rater and stopping at the
first "indistinguishable" inflates the error at the boundary (:func:`simulate_abx_peeking`
measures by how much); the product shows no verdict before the planned number of included
raters (the caller reports "interim"), so peeking cannot change the decision.

Catch screening
---------------
A rater passes when their correct catch answers ``k >= catch_min_correct(n)``: the smallest k
with P(Binomial(n, 0.5) >= k) <= alpha, i.e. better than guessing on the easy catch trials.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence

import numpy as np

Z95 = 1.6448536269514722

#: ABX scenarios of :func:`simulate_abx` (true accuracy per rater and clip); see its docstring.
SCENARIOS = ("homogeneous", "heterogeneous_raters", "golden_ears", "clip_heterogeneity",
             "combined", "one_visible_clip", "inverted_discriminators", "inverted_raters",
             "inverted_clips", "bots", "weak_inversion", "weak_bots")
#: the scenarios in which "indistinguishable" at the boundary is an error (all but the clip one)
BOUNDARY_SCENARIOS = SCENARIOS[:5]
#: boundary scenarios with answers below chance (some raters, clips or bots answer against
#: what they see): "indistinguishable" is an error in every one
INVERSION_SCENARIOS = SCENARIOS[6:]
#: answers barely below chance (issue 44): the two scenarios that need clips per rater, not
#: raters (:func:`spread_clips`): every rater at 0.5 + margin, half inverted; and bots right
#: with probability WEAK_BOTS[1] as a share WEAK_BOTS[0] of the raters
WEAK_SCENARIOS = ("weak_inversion", "weak_bots")
WEAK_BOTS = (0.4, 0.4)
#: the version of the planner's and design_check's rules, part of their disk-cache key
#: (:mod:`.simcache`): bump it when what they return changes (2: the clips floor of
#: :func:`spread_clips`, the weak scenarios in the boundary checks)
RULE_VERSION = 2
MIN_RATERS = 12
MIN_CLIPS = 15
MAX_RATERS = 100_000
#: above this many rater x clip cells the planner uses the normal approximation, not simulation
SIMULATE_MAX_CELLS = 6_000


# -- small helpers ---------------------------------------------------------------------------

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


def _sf_half(k, n):
    """P(Binomial(n, 0.5) >= k), vectorised (exact)."""
    from scipy.stats import binom

    return binom.sf(np.asarray(k, dtype=float) - 1, np.asarray(n, dtype=float), 0.5)


def format_p(p: float | None) -> str:
    """A p-value for people: ``"< 1e-6"`` below 1e-6, else 2 significant digits (``"0.034"``,
    ``"2.1e-05"``); ``"n/a"`` for None or NaN. Never ``"0"``."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    p = float(p)
    if p < 1e-6:
        return "< 1e-6"
    return f"{p:.2g}"


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[list[bool], list[float]]:
    """Holm's step-down procedure: ``(rejected, adjusted)`` in the order given. The adjusted
    p of the i-th smallest is max over j <= i of min(1, (m - j + 1) p_(j)); a hypothesis is
    rejected when its adjusted p <= ``alpha`` (the same as stepping down until
    p_(i) > alpha / (m - i + 1))."""
    p = np.asarray(pvalues, dtype=float)
    if p.size == 0:
        return [], []
    adj = _holm_adjust(p[None, :])[0]
    return [bool(a <= alpha) for a in adj], [float(a) for a in adj]


def _holm_adjust(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values along the last axis (vectorised over the leading axes)."""
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ps = np.take_along_axis(p, order, axis=-1)
    adj = np.maximum.accumulate(np.minimum(1.0, ps * (m - np.arange(m))), axis=-1)
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    return out


def catch_min_correct(n: int, alpha: float = 0.05) -> int:
    """Correct catch answers (of ``n``) a rater needs to pass the screening: the smallest k with
    P(Binomial(n, 0.5) >= k) <= ``alpha`` (better than guessing on the easy catch trials).
    ValueError when no k works (fewer than 5 catch trials at alpha 0.05)."""
    if n < 1:
        raise ValueError(f"catch trials: expected at least 1, found {n}")
    ks = np.arange(n + 1)
    ok = _sf_half(ks, n) <= alpha
    if not ok.any():
        raise ValueError(f"catch screening: {n} catch trials cannot show better than guessing "
                         f"at alpha {alpha:g} (all {n} right has p = {0.5 ** n:.3g})")
    return int(ks[ok][0])


def catch_error_rates(n: int, p_attentive: float = 0.95,
                      alpha: float = 0.05) -> tuple[float, float]:
    """``(P(an attentive rater is excluded), P(a random clicker is kept))`` of the catch
    screening with ``n`` catch trials: an attentive rater answers each catch trial right with
    probability ``p_attentive``, a random clicker with 0.5."""
    from scipy.stats import binom

    k = catch_min_correct(n, alpha)
    return float(binom.cdf(k - 1, n, p_attentive)), float(_sf_half(k, n))


# -- d' of ABX and the margin in other units ---------------------------------------------------

def abx_accuracy(d_prime: float, model: str = "differencing") -> float:
    """Proportion correct of an unbiased ABX observer with sensitivity ``d_prime`` (Macmillan &
    Creelman 2005, ch. 9): ``differencing`` or ``independent`` (independent observations)."""
    from scipy.stats import norm

    if model not in ("differencing", "independent"):
        raise ValueError(f"model: expected differencing or independent, found {model!r}")
    d = float(d_prime)
    a = d / math.sqrt(2)
    b = d / math.sqrt(6) if model == "differencing" else d / 2
    return float(norm.cdf(a) * norm.cdf(b) + norm.cdf(-a) * norm.cdf(-b))


def d_prime_abx(accuracy: float, model: str = "differencing") -> float:
    """d' whose ABX proportion correct is ``accuracy`` (inverse of :func:`abx_accuracy`,
    numerically); 0 at or below 0.5, ``inf`` at 1."""
    from scipy.optimize import brentq

    if accuracy <= 0.5:
        return 0.0
    if accuracy >= 1:
        return math.inf
    return float(brentq(lambda d: abx_accuracy(d, model) - accuracy, 0.0, 40.0, xtol=1e-12))


def margin_terms(margin: float) -> dict:
    """The ABX margin in three units: the accuracy limit ``0.5 + margin``; the proportion of
    discriminators ``pd = 2 * margin`` (guessing model: accuracy = 0.5 + pd / 2); d' of ABX under
    the differencing model (``d_prime``) and the independent-observation model."""
    acc = 0.5 + margin
    return {"accuracy_limit": acc, "proportion_discriminators": 2 * margin,
            "d_prime": d_prime_abx(acc, "differencing"),
            "d_prime_independent_observation": d_prime_abx(acc, "independent"),
            "d_prime_model": "ABX differencing (Macmillan & Creelman 2005, ch. 9)"}


def _margin_text(margin: float) -> str:
    m = margin_terms(margin)
    return (f"margin {margin:g}: accuracy < {m['accuracy_limit']:g}, i.e. fewer than "
            f"{100 * m['proportion_discriminators']:.3g}% discriminators, d' < "
            f"{m['d_prime']:.2f}")


# -- labels and the pigeonhole bootstrap -------------------------------------------------------

def _index(labels: Sequence[Hashable]) -> tuple[np.ndarray, list]:
    """Integer codes of arbitrary hashable labels, and the labels in code order (sorted when
    they sort, else in order of first appearance)."""
    uniq = list(dict.fromkeys(labels))
    try:
        uniq = sorted(uniq)
    except TypeError:
        pass
    pos = {v: i for i, v in enumerate(uniq)}
    return np.fromiter((pos[v] for v in labels), dtype=np.int64, count=len(labels)), uniq


def _codes(labels) -> tuple[np.ndarray, int]:
    codes, uniq = _index(list(labels))
    return codes, len(uniq)


def _draw_counts(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Pigeonhole draw counts, shape ``shape + (n,)``: for each entry, how often each of ``n``
    units was drawn in ``n`` draws with replacement."""
    m = int(np.prod(shape))
    idx = rng.integers(0, n, size=(m, n))
    idx += (np.arange(m, dtype=np.int64) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=m * n).reshape(*shape, n).astype(float)


def _bilinear(wr: np.ndarray, m: np.ndarray, wc: np.ndarray) -> np.ndarray:
    """``wr[s, b] @ m[s] @ wc[s, b]`` for every study s and replicate b: (S, B)."""
    return np.einsum("sbr,sbr->sb", wr, np.matmul(wc, m.transpose(0, 2, 1)))


def _cells(raters, clips, values) -> tuple[np.ndarray, np.ndarray, list, list]:
    """Sum and count matrices (raters x clips) of ``values``, with the labels of rows/columns."""
    r, rlab = _index(list(raters))
    c, clab = _index(list(clips))
    y = np.asarray(values, dtype=float)
    s = np.zeros((len(rlab), len(clab)))
    n = np.zeros((len(rlab), len(clab)))
    np.add.at(s, (r, c), y)
    np.add.at(n, (r, c), 1.0)
    return s, n, rlab, clab


def _t(q: float, df) -> np.ndarray:
    """Student t quantile; ``inf`` where df < 1 (no claim can be made)."""
    from scipy.stats import t as student_t

    df = np.asarray(df, dtype=float)
    out = np.full(df.shape, np.inf)
    ok = df >= 1
    out[ok] = student_t.ppf(q, df[ok])
    return out


# -- ABX: the rule, vectorised over studies ----------------------------------------------------

def _cdf_half(k, n):
    """P(Binomial(n, 0.5) <= k), vectorised (exact)."""
    from scipy.stats import binom

    return binom.cdf(np.asarray(k, dtype=float), np.asarray(n, dtype=float), 0.5)


#: the share of the level ``alpha`` each check below chance is given (they only ever block
#: "indistinguishable": together they cost the claim's power at chance at most ``alpha``)
BELOW_CHANCE_SPLIT = {"raters": 0.05, "clips": 0.05, "overall": 0.1, "rater_dispersion": 0.5,
                      "clip_dispersion": 0.3}
#: null draws of the dispersion tests (Monte Carlo, fixed seed: the same data give the same p)
DISPERSION_DRAWS = 20_000
_DISPERSION_NULL: dict = {}


def _dispersion_stat(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Sum over units (last axis) of (2 k - n)^2 / n: chi-square-like spread of the units'
    accuracies around 0.5, in either direction (units with n = 0 add nothing)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (2 * k - n) ** 2 / np.where(n > 0, n, 1.0), 0.0).sum(axis=-1)


def _dispersion_null(n: tuple) -> np.ndarray:
    """Sorted null draws of :func:`_dispersion_stat` for units with ``n`` ratings each, every
    answer a fair coin (the sharp null); Monte Carlo with a fixed seed, cached."""
    if n not in _DISPERSION_NULL:
        rng = np.random.default_rng(20240917)
        nn = np.asarray(n, dtype=np.int64)
        k = rng.binomial(nn[None, :], 0.5, size=(DISPERSION_DRAWS, nn.size)).astype(float)
        _DISPERSION_NULL[n] = np.sort(_dispersion_stat(k, nn[None, :].astype(float)))
        if len(_DISPERSION_NULL) > 256:
            _DISPERSION_NULL.pop(next(iter(_DISPERSION_NULL)))
    return _DISPERSION_NULL[n]


def _dispersion_p(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Monte Carlo p of the dispersion test per study (rows of ``k``, ``n``): the units'
    accuracies spread around 0.5 more than fair coins do ((1 + hits) / (draws + 1): valid)."""
    stat = _dispersion_stat(k, n)
    out = np.empty(stat.shape)
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(np.asarray(n, dtype=np.int64).reshape(len(stat), -1)):
        groups.setdefault(tuple(int(v) for v in row if v > 0), []).append(i)
    for key, idx in groups.items():
        null = _dispersion_null(key)
        obs = stat[idx] * (1 - 1e-9) - 1e-9           # exact ties count as hits
        hits = null.size - np.searchsorted(null, obs, side="left")
        out[idx] = (hits + 1) / (null.size + 1)
    return out


def visible_share_limit(margin: float) -> float:
    """The share of visibly different clips an "indistinguishable" claim must exclude: ``2 x
    margin``, the share of fully visible clips (accuracy 1, the rest at chance) that alone puts
    the mean accuracy at 0.5 + margin."""
    return 2 * margin


def min_clips(margin: float, level: float = 0.95) -> int:
    """The fewest clips drawn at random that can bound the visible share below
    :func:`visible_share_limit` even with a clip veto of power 1 (none flagged: Clopper-Pearson
    ``1 - (1 - level)^(1/C)``), and at least :data:`MIN_CLIPS`: 29 at margin 0.05."""
    lim = visible_share_limit(margin)
    if lim >= 1:
        return MIN_CLIPS
    c = max(1, math.floor(math.log(1 - level) / math.log(1 - lim)))
    while 1 - (1 - level) ** (1 / c) >= lim:
        c += 1
    return max(MIN_CLIPS, c)


def _spread_miss_estimate(margin: float, raters: int, clips: int, alpha: float) -> float:
    """Approximate chance that the raters' spread check misses answers barely below chance
    (the harder of :data:`WEAK_SCENARIOS`): its statistic, a sum over raters of (2 k - n)^2 /
    n, taken as chi-square with ``raters`` df at chance and non-central with (n - 1)(2 p - 1)^2
    a rater when raters are right with probability p (mean over the scenario's raters)."""
    from scipy.stats import chi2, ncx2

    share, acc = WEAK_BOTS
    per_rating = min(4 * margin ** 2, share * (2 * acc - 1) ** 2 + (1 - share) * 4 * margin ** 2)
    crit = float(chi2.ppf(1 - alpha * BELOW_CHANCE_SPLIT["rater_dispersion"], raters))
    return float(ncx2.cdf(crit, raters, raters * max(clips - 1, 0) * per_rating))


def weak_misses(margin: float, raters: int, clips: int, *, alpha: float = 0.05,
                studies: int = 1000, seed: int = 4405) -> dict:
    """Per scenario of :data:`WEAK_SCENARIOS` at true accuracy 0.5 + margin: the simulated rate
    at which no check below chance fires (an upper bound on false "indistinguishable", tight
    where the bound U is nearly always under the margin); no bootstrap, so cheap."""
    return {sc: 1 - simulate_abx(raters, clips, sc, margin=margin, alpha=alpha,
                                 studies=studies, reps=2, seed=seed + i)["below_chance"]
            for i, sc in enumerate(WEAK_SCENARIOS)}


def spread_clips(margin: float, raters: int, *, alpha: float = 0.05, start: int = MIN_CLIPS,
                 studies: int = 1000, seed: int = 4405) -> tuple[int, str]:
    """The fewest clips per rater, at least ``start``, with which ``raters`` raters' answers
    barely below chance are seen (issue 44): every rater at 0.5 + margin and half of them
    inverted, or bots at 0.4 as 40% of the raters, leave every check below chance silent at
    most ``alpha`` of the time (:func:`weak_misses`, fixed seed). The raters' spread check is
    what sees them, and its power grows with clips per rater (noncentrality about
    raters x clips x 4 margin^2 against sqrt(2 raters) of noise): more raters help as their
    square root, more clips linearly. Returns (clips, method): the chi-square approximation
    (:func:`_spread_miss_estimate`) bracketed and refined by simulation, or the approximation
    alone above ``2 x SIMULATE_MAX_CELLS`` ratings."""
    def est_ok(c: int) -> bool:
        return _spread_miss_estimate(margin, raters, c, alpha) <= alpha

    lo, hi = start - 1, max(start, 2)
    while not est_ok(hi):
        lo, hi = hi, hi * 2
        if hi * raters > 100 * MAX_RATERS:
            return hi, "normal approximation"
    c0 = _smallest(lo, hi, est_ok) if hi > start else start
    if raters * c0 > 2 * SIMULATE_MAX_CELLS:
        return c0, "normal approximation"

    def ok(c: int) -> bool:
        return max(weak_misses(margin, raters, c, alpha=alpha, studies=studies,
                               seed=seed).values()) <= alpha

    if ok(c0):
        lo, hi = start - 1, c0
        step = max(start, math.floor(c0 * 0.9))
        while step > start - 1 and ok(step):     # the approximation is conservative: walk down
            hi, step = step, max(start - 1, math.floor(step * 0.9))
        lo = step
    else:
        lo, hi = c0, math.ceil(c0 * 1.1) + 1
        while not ok(hi):
            lo, hi = hi, math.ceil(hi * 1.1) + 1
    return (hi if hi - lo <= 1 else _smallest(lo, hi, ok)), "simulation"


def _abx_rule(Y: np.ndarray, N: np.ndarray | None, wr: np.ndarray, wc: np.ndarray, *,
              margin: float, alpha: float) -> dict:
    """The ABX rule for S studies at once. ``Y``: (S, R, C) sums of correct; ``N``: counts
    (None: one rating per cell); ``wr`` (S, B, R) and ``wc`` (S, B, C): bootstrap draw counts."""
    S, R, C = Y.shape
    if N is None:
        n = np.full(S, float(R * C))
        nc = np.full((S, C), float(R))
        nr = np.full((S, R), float(C))
    else:
        n = N.sum(axis=(1, 2))
        nc = N.sum(axis=1)
        nr = N.sum(axis=2)
    k = Y.sum(axis=(1, 2))
    acc = k / n
    p_all = _sf_half(k, n)
    kc = Y.sum(axis=1)
    kr = Y.sum(axis=2)
    p_clip = _sf_half(kc, nc)
    p_holm = _holm_adjust(p_clip)
    flagged = p_holm <= alpha / 2
    num = _bilinear(wr, Y, wc)
    if N is None:
        den = wr.sum(axis=2) * wc.sum(axis=2)
    else:
        den = _bilinear(wr, N, wc)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    sd = boot.std(axis=1, ddof=1)
    df = min(R, C) - 1
    t = float(_t(1 - alpha, df))
    upper = acc + t * sd
    overall_sig = p_all <= alpha / 2
    dist = overall_sig | flagged.any(axis=1)
    # below chance (two-sided checks): under the sharp null every answer is a fair coin, so a
    # rater, a clip or the whole study significantly below 0.5, or raters' or clips'
    # accuracies spread around 0.5 more than coins do, is evidence that someone saw the
    # difference (and answered against it): no equivalence claim
    sp = BELOW_CHANCE_SPLIT
    p_rater_low = _cdf_half(kr, nr)
    p_rater_low_holm = _holm_adjust(p_rater_low)
    rater_low = p_rater_low_holm <= alpha * sp["raters"]
    p_clip_low = _cdf_half(kc, nc)
    p_clip_low_holm = _holm_adjust(p_clip_low)
    clip_low = p_clip_low_holm <= alpha * sp["clips"]
    p_overall_low = _cdf_half(k, n)
    overall_low = p_overall_low <= alpha * sp["overall"]
    p_disp_r = _dispersion_p(kr, nr)
    p_disp_c = _dispersion_p(kc, nc)
    disp_r = p_disp_r <= alpha * sp["rater_dispersion"]
    disp_c = p_disp_c <= alpha * sp["clip_dispersion"]
    below = rater_low.any(axis=1) | clip_low.any(axis=1) | overall_low | disp_r | disp_c
    # sparse visible clips: the one-sided 95% bound on the share of visibly different clips
    # (none flagged) must exclude the share that alone reaches the margin
    mc = nc.min(axis=1)
    vbound = np.ones(S)
    for v in np.unique(mc):
        vbound[mc == v] = float(visible_share_bound(0, C, int(v), alpha=alpha)[0])
    covered = vbound < visible_share_limit(margin)
    indist = ~dist & (upper < 0.5 + margin) & ~below & covered
    return {"n": n, "k": k, "accuracy": acc, "p_value": p_all, "nc": nc, "kc": kc,
            "p_clip": p_clip, "p_holm": p_holm, "flagged": flagged, "sd": sd, "df": df, "t": t,
            "upper": upper, "overall_significant": overall_sig, "distinguishable": dist,
            "indistinguishable": indist, "nr": nr, "kr": kr, "p_rater_low": p_rater_low,
            "p_rater_low_holm": p_rater_low_holm, "rater_low": rater_low,
            "p_clip_low": p_clip_low, "p_clip_low_holm": p_clip_low_holm, "clip_low": clip_low,
            "p_overall_low": p_overall_low, "overall_low": overall_low,
            "p_rater_dispersion": p_disp_r, "p_clip_dispersion": p_disp_c,
            "rater_dispersion": disp_r, "clip_dispersion": disp_c, "below_chance": below,
            "visible_bound": vbound, "covered": covered}


def abx_rule_text(margin: float, alpha: float, raters: int, clips: int,
                  reps: int) -> str:
    """One line stating the ABX rule with its numbers (what :func:`decide_abx` computes)."""
    df = min(raters, clips) - 1
    tq = f"t({1 - alpha:g}, df={df})" if df >= 1 else "t(df<1: no bound)"
    sp = BELOW_CHANCE_SPLIT
    return (f"DISTINGUISHABLE if the exact one-sided binomial test of all ratings gives "
            f"p <= {alpha / 2:g} (alpha/2) or any clip is flagged (exact one-sided binomial per "
            f"clip, Holm over {clips} clips at {alpha / 2:g}); otherwise INDISTINGUISHABLE if "
            f"U = accuracy + {tq} x SD < {0.5 + margin:g} ({_margin_text(margin)}), SD = "
            f"standard deviation of {reps} two-way cluster bootstrap replicates, df = "
            f"min(raters {raters}, clips {clips}) - 1, and nothing is below chance (no rater "
            f"or clip below 0.5 by exact binomial tests with Holm at {alpha * sp['raters']:g} "
            f"each, all ratings not below 0.5 at {alpha * sp['overall']:g}, raters' and "
            f"clips' accuracies not spread around 0.5 beyond chance (sum of (2 k - n)^2 / n, "
            f"Monte Carlo p) at {alpha * sp['rater_dispersion']:g} each: below chance is seen and answered "
            f"against), and the one-sided 95% bound on the share of visibly different clips "
            f"(none flagged) is below {visible_share_limit(margin):g} (2 x margin); otherwise "
            f"INCONCLUSIVE (alpha {alpha:g})")


def decide_abx(raters: Sequence[Hashable], clips: Sequence[Hashable], correct: Sequence, *,
               margin: float, alpha: float = 0.05, reps: int = 2000, seed: int = 0) -> dict:
    """The ABX verdict of a complete design (module docstring): one entry per test rating in
    ``raters``, ``clips`` (labels) and ``correct`` (0/1 or bool).

    Returns a dict: ``verdict`` (``distinguishable`` | ``indistinguishable`` | ``inconclusive``
    | ``no data``), ``rule`` (one line with the numbers), ``n``, ``correct``, ``accuracy``,
    ``p_value`` (overall, one-sided exact), ``p_text`` (:func:`format_p`), ``upper_bound``,
    ``t``, ``df``, ``sd``, ``raters``, ``clips`` (counts), ``per_clip`` (list of dicts: ``clip``,
    ``ratings``, ``correct``, ``accuracy``, ``p_value``, ``p_holm``, ``flagged``, ``p_low``,
    ``p_low_holm``, ``below_chance``), ``flagged`` (clip labels), ``below_chance`` (the checks
    below chance: ``raters`` and ``clips`` found below chance, with their ratings and
    Holm-adjusted p, ``overall_p``, ``rater_dispersion_p``, ``clip_dispersion_p``, ``found``,
    ``reasons``), ``visible_share_bound``, ``visible_share_limit``, ``covered``, ``blocked``
    (why a bound under the margin is still no claim), ``margin``, ``alpha``, ``reps``,
    ``seed``, ``margin_terms``."""
    if not (len(raters) == len(clips) == len(correct)):
        raise ValueError("decide_abx: raters, clips and correct must have the same length")
    y = np.asarray(correct, dtype=float)
    if y.size and not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("decide_abx: correct must be 0/1")
    base = {"margin": margin, "alpha": alpha, "reps": reps, "seed": seed,
            "margin_terms": margin_terms(margin)}
    if y.size == 0:
        return {**base, "verdict": "no data", "rule": "no test ratings", "n": 0, "correct": 0,
                "accuracy": None, "p_value": None, "p_text": "n/a", "upper_bound": None,
                "t": None, "df": None, "sd": None, "raters": 0, "clips": 0, "per_clip": [],
                "flagged": [], "below_chance": None, "blocked": []}
    s, n, rlab, clab = _cells(raters, clips, y)
    R, C = s.shape
    rng = np.random.default_rng(seed)
    wr = _draw_counts(rng, R, (1, reps))
    wc = _draw_counts(rng, C, (1, reps))
    o = _abx_rule(s[None], n[None], wr, wc, margin=margin, alpha=alpha)
    verdict = ("distinguishable" if o["distinguishable"][0] else
               "indistinguishable" if o["indistinguishable"][0] else "inconclusive")
    per_clip = [{"clip": lab, "ratings": int(o["nc"][0, j]), "correct": int(o["kc"][0, j]),
                 "accuracy": float(o["kc"][0, j] / o["nc"][0, j]),
                 "p_value": float(o["p_clip"][0, j]), "p_holm": float(o["p_holm"][0, j]),
                 "flagged": bool(o["flagged"][0, j]),
                 "p_low": float(o["p_clip_low"][0, j]),
                 "p_low_holm": float(o["p_clip_low_holm"][0, j]),
                 "below_chance": bool(o["clip_low"][0, j])} for j, lab in enumerate(clab)]
    low_raters = [{"rater": lab, "ratings": int(o["nr"][0, i]), "correct": int(o["kr"][0, i]),
                   "p_low": float(o["p_rater_low"][0, i]),
                   "p_low_holm": float(o["p_rater_low_holm"][0, i])}
                  for i, lab in enumerate(rlab) if o["rater_low"][0, i]]
    low_clips = [{k: e[k] for k in ("clip", "ratings", "correct", "p_low", "p_low_holm")}
                 for e in per_clip if e["below_chance"]]
    reasons = []
    if low_raters:
        reasons.append("rater" + ("s " if len(low_raters) > 1 else " ")
                       + ", ".join(f"{e['rater']} ({e['correct']} of {e['ratings']})"
                                   for e in low_raters) + " below chance")
    if low_clips:
        reasons.append("clip" + ("s " if len(low_clips) > 1 else " ")
                       + ", ".join(f"{e['clip']} ({e['correct']} of {e['ratings']})"
                                   for e in low_clips) + " below chance")
    if o["overall_low"][0]:
        reasons.append(f"all ratings below chance (p {format_p(float(o['p_overall_low'][0]))})")
    if o["rater_dispersion"][0]:
        reasons.append("raters' accuracies spread around 0.5 beyond chance (p "
                       f"{format_p(float(o['p_rater_dispersion'][0]))})")
    if o["clip_dispersion"][0]:
        reasons.append("clips' accuracies spread around 0.5 beyond chance (p "
                       f"{format_p(float(o['p_clip_dispersion'][0]))})")
    # the raters below 0.5 by an unadjusted exact test: named when a pooled check fires
    lowest = [{"rater": lab, "ratings": int(o["nr"][0, i]), "correct": int(o["kr"][0, i]),
               "p_low": float(o["p_rater_low"][0, i])}
              for i, lab in enumerate(rlab) if o["p_rater_low"][0, i] <= alpha]
    if o["below_chance"][0] and lowest and not low_raters:
        reasons.append("lowest: rater" + ("s " if len(lowest) > 1 else " ")
                       + ", ".join(f"{e['rater']} ({e['correct']} of {e['ratings']})"
                                   for e in lowest) + f" (each below 0.5 at p <= {alpha:g} "
                       "unadjusted)")
    below = {"found": bool(o["below_chance"][0]), "raters": low_raters, "clips": low_clips,
             "lowest_raters": lowest,
             "overall_p": float(o["p_overall_low"][0]),
             "rater_dispersion_p": float(o["p_rater_dispersion"][0]),
             "clip_dispersion_p": float(o["p_clip_dispersion"][0]), "reasons": reasons}
    finite = math.isfinite(o["t"])
    vb, lim = float(o["visible_bound"][0]), visible_share_limit(margin)
    blocked = []
    if verdict == "inconclusive" and finite and o["upper"][0] < 0.5 + margin:
        if below["found"]:
            blocked.append("below chance, which is seen and answered against: "
                           + "; ".join(reasons))
        if not o["covered"][0]:
            blocked.append(f"the bound on the share of visibly different clips, {vb:.3g}, "
                           f"does not exclude {lim:g} (2 x margin; {C} clips with "
                           f"{int(o['nc'][0].min())} ratings each)")
    return {**base, "verdict": verdict, "rule": abx_rule_text(margin, alpha, R, C, reps),
            "n": int(o["n"][0]), "correct": int(o["k"][0]), "accuracy": float(o["accuracy"][0]),
            "p_value": float(o["p_value"][0]), "p_text": format_p(float(o["p_value"][0])),
            "upper_bound": float(o["upper"][0]) if finite else None,
            "t": o["t"] if finite else None, "df": o["df"], "sd": float(o["sd"][0]),
            "raters": R, "clips": C, "per_clip": per_clip,
            "flagged": [e["clip"] for e in per_clip if e["flagged"]],
            "below_chance": below, "visible_share_bound": vb, "visible_share_limit": lim,
            "covered": bool(o["covered"][0]), "blocked": blocked}


# -- preference ------------------------------------------------------------------------------

_B = {1, "b", "B"}   # 1 == 1.0 == True: bools are refused below
_A = {0, "a", "A"}
_TIE = {0.5, "tie", "same", "none", None}


def _preference_codes(choices) -> tuple[np.ndarray, np.ndarray]:
    """(B won, decisive) as floats from score_b values (1 / 0 / 0.5) or 'b' / 'a' / 'tie'."""
    win = np.empty(len(choices))
    dec = np.empty(len(choices))
    for i, v in enumerate(choices):
        if isinstance(v, float) and math.isnan(v):
            v = None
        if v in _B and v is not True:
            win[i], dec[i] = 1.0, 1.0
        elif v in _A and v is not False:
            win[i], dec[i] = 0.0, 1.0
        elif v in _TIE:
            win[i], dec[i] = 0.0, 0.0
        else:
            raise ValueError(f"preference: expected 1/0/0.5 or b/a/tie, found {v!r}")
    return win, dec


#: raters up to which the sign-flip test enumerates every sign pattern (2**12 = 4096); above,
#: :data:`SIGN_FLIPS` random patterns
EXACT_FLIP_RATERS = 12
SIGN_FLIPS = 4000


def sign_flips(rng: np.random.Generator, raters: int) -> np.ndarray:
    """The sign patterns of the rater-level sign-flip test, (F, raters) of +-1: all 2**raters
    up to :data:`EXACT_FLIP_RATERS` raters (an exact test), else :data:`SIGN_FLIPS` random
    ones (the observed pattern is counted once more: a valid Monte Carlo p)."""
    if raters <= EXACT_FLIP_RATERS:
        codes = np.arange(2 ** raters)[:, None] >> np.arange(raters)[None, :]
        return 1.0 - 2.0 * (codes & 1)
    return 1.0 - 2.0 * rng.integers(0, 2, size=(SIGN_FLIPS, raters))


def _flip_p(d: np.ndarray, flips: np.ndarray) -> np.ndarray:
    """Two-sided p of the rater-level sign-flip test of sum(d) = 0, per study: ``d`` (S, R) the
    raters' net preferences (wins of B minus wins of A), ``flips`` from :func:`sign_flips`."""
    obs = np.abs(d.sum(axis=1))
    hits = (np.abs(d @ flips.T) >= obs[:, None] - 0.5).sum(axis=1)   # integer sums
    exact = flips.shape[0] == 2 ** flips.shape[1]
    return hits / flips.shape[0] if exact else (hits + 1) / (flips.shape[0] + 1)


def _preference_rule(W: np.ndarray, D: np.ndarray, wr: np.ndarray, wc: np.ndarray, *,
                     alpha: float, flips: np.ndarray) -> dict:
    """The preference rule for S studies at once: ``W`` (S, R, C) wins of B, ``D`` decisive
    counts, ``wr``/``wc`` bootstrap draw counts, ``flips`` the sign patterns of the
    rater-level test (:func:`sign_flips`)."""
    wins = W.sum(axis=(1, 2))
    dec = D.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        est = np.where(dec > 0, wins / np.where(dec > 0, dec, 1.0), np.nan)
        num = _bilinear(wr, W, wc)
        den = _bilinear(wr, D, wc)
        worst = np.where(est >= 0.5, 0.0, 1.0)[:, None]
        boot = np.where(den > 0, num / np.where(den > 0, den, 1.0), worst)
    df = np.minimum((D.sum(axis=2) > 0).sum(axis=1), (D.sum(axis=1) > 0).sum(axis=1)) - 1
    # small-cluster correction of the SD, sqrt(m / (m - 1)) with m = df + 1: the pigeonhole
    # bootstrap estimates a between-rater variance with divisor m, not m - 1 (it matters when
    # raters split their taste: the rater component then dominates)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = boot.std(axis=1, ddof=1) * np.sqrt(np.where(df >= 1, (df + 1) / np.maximum(df, 1), 1.0))
    t = _t(1 - alpha / 2, df)
    with np.errstate(invalid="ignore"):
        lo, hi = est - t * sd, est + t * sd
    # a zero SD (every decisive rating one way and in every replicate) says nothing about the
    # spread: then the exact sign test decides
    sign_p = np.minimum(1.0, 2 * _sf_half(np.maximum(wins, dec - wins), dec))
    degenerate = sd == 0
    # and the rater-level sign-flip test: each rater's net preference is symmetric about 0
    # when the population has none, whatever the raters' tie propensities (exact)
    flip_p = _flip_p((2 * W - D).sum(axis=2), flips)
    sig = np.where(degenerate, sign_p < alpha, True) & (flip_p <= alpha)
    b_pref = (np.nan_to_num(lo, nan=-1.0) > 0.5) & sig
    a_pref = (np.nan_to_num(hi, nan=2.0) < 0.5) & sig
    return {"wins": wins, "decisive": dec, "win_rate": est, "sd": sd, "df": df, "t": t,
            "lo": lo, "hi": hi, "sign_p": sign_p, "degenerate": degenerate, "flip_p": flip_p,
            "b_preferred": b_pref, "a_preferred": a_pref}


def preference_rule_text(alpha: float, df: int, reps: int) -> str:
    """One line stating the preference rule with its numbers (what :func:`decide_preference`
    computes)."""
    tq = f"t({1 - alpha / 2:g}, df={df})" if df >= 1 else "t(df<1: no claim)"
    return (f"B PREFERRED / A PREFERRED if the two-sided interval win rate of B +- {tq} x SD "
            f"excludes 0.5, SD = sqrt(m/(m-1)) x standard deviation of {reps} two-way cluster "
            f"bootstrap replicates of B's win rate over decisive ratings (ties left out), m = "
            f"min(raters, clips with a decisive rating) = {df + 1}, df = m - 1 (SD 0: the exact "
            f"sign test at {alpha:g} decides), and the rater-level sign-flip test of the raters' "
            f"net preferences (wins of B minus wins of A) gives p <= {alpha:g}; otherwise NO "
            f"PREFERENCE SHOWN (alpha {alpha:g}; a preference study never claims "
            f"indistinguishable: use ABX)")


def decide_preference(raters: Sequence[Hashable], clips: Sequence[Hashable],
                      choices: Sequence, *, alpha: float = 0.05, reps: int = 2000,
                      seed: int = 0) -> dict:
    """The preference verdict (module docstring): one entry per test rating in ``raters``,
    ``clips`` (labels) and ``choices`` (score of B: 1 = B preferred, 0 = A preferred, 0.5 =
    tie; or the strings ``b`` / ``a`` / ``tie``).

    Returns a dict: ``verdict`` (``B preferred`` | ``A preferred`` | ``no preference shown`` |
    ``no data``), ``rule``, ``n``, ``wins_b``, ``wins_a``, ``ties``, ``tie_rate``,
    ``decisive``, ``win_rate_b``, ``ci`` ([lo, hi], the cluster interval clipped to [0, 1]),
    ``p_value`` (cluster, two-sided: 2 P(T_df > |win rate - 0.5| / SD); the sign test p when
    SD is 0), ``p_text``,
    ``sign_p`` (exact two-sided sign test, ratings taken as independent), ``sign_p_text``,
    ``t``, ``df``, ``sd``, ``raters``, ``clips``, ``per_clip`` (``clip``, ``ratings``,
    ``wins_b``, ``wins_a``, ``ties``, ``win_rate_b``, ``sign_p``), ``alpha``, ``reps``,
    ``seed``."""
    if not (len(raters) == len(clips) == len(choices)):
        raise ValueError("decide_preference: raters, clips and choices must have the same length")
    win, dec = _preference_codes(list(choices))
    n = len(win)
    base = {"alpha": alpha, "reps": reps, "seed": seed, "n": n}
    if n == 0:
        return {**base, "verdict": "no data", "rule": "no test ratings", "wins_b": 0,
                "wins_a": 0, "ties": 0, "tie_rate": None, "decisive": 0, "win_rate_b": None,
                "ci": [None, None], "p_value": None, "p_text": "n/a", "sign_p": None,
                "sign_p_text": "n/a", "t": None, "df": None, "sd": None, "raters": 0,
                "clips": 0, "per_clip": []}
    W, _, rlab, clab = _cells(raters, clips, win)
    D, _, _, _ = _cells(raters, clips, dec)
    rng = np.random.default_rng(seed)
    wr = _draw_counts(rng, len(rlab), (1, reps))
    wc = _draw_counts(rng, len(clab), (1, reps))
    o = _preference_rule(W[None], D[None], wr, wc, alpha=alpha,
                         flips=sign_flips(rng, len(rlab)))
    wins_b, decisive = int(o["wins"][0]), int(o["decisive"][0])
    wins_a, ties = decisive - wins_b, n - decisive
    df = int(o["df"][0])
    t = float(o["t"][0])
    sd = float(o["sd"][0])
    est = float(o["win_rate"][0]) if decisive else None
    if decisive and df >= 1:
        from scipy.stats import t as student_t

        dev = abs(est - 0.5)
        p = (float(o["sign_p"][0]) if sd == 0 else
             float(min(1.0, 2 * student_t.sf(dev / sd, df))))
        ci = [max(0.0, float(o["lo"][0])), min(1.0, float(o["hi"][0]))]
    else:
        p, ci = None, [None, None]
    verdict = ("B preferred" if o["b_preferred"][0] else
               "A preferred" if o["a_preferred"][0] else "no preference shown")
    per_clip = []
    counts = np.bincount(_index(list(clips))[0], minlength=len(clab))
    for j, lab in enumerate(clab):
        wb, d = int(W[:, j].sum()), int(D[:, j].sum())
        ratings = int(counts[j])
        per_clip.append({"clip": lab, "ratings": ratings, "wins_b": wb, "wins_a": d - wb,
                         "ties": ratings - d, "win_rate_b": wb / d if d else None,
                         "sign_p": binom_p(wb, d, "two-sided")})
    sign_p = binom_p(wins_b, decisive, "two-sided")
    return {**base, "verdict": verdict, "rule": preference_rule_text(alpha, df, reps),
            "wins_b": wins_b, "wins_a": wins_a, "ties": ties, "tie_rate": ties / n,
            "decisive": decisive, "win_rate_b": est, "ci": ci, "p_value": p,
            "p_text": format_p(p), "sign_p": sign_p, "sign_p_text": format_p(sign_p),
            "flip_p": float(o["flip_p"][0]), "flip_p_text": format_p(float(o["flip_p"][0])),
            "t": t if math.isfinite(t) else None, "df": df, "sd": sd, "raters": len(rlab),
            "clips": len(clab), "per_clip": per_clip}


# -- what a verdict covers: the share of visibly different clips ---------------------------------

#: ABX accuracy from which a clip counts as visibly different in the coverage bound (the
#: planner's ``clip_accuracy``: the clip veto flags such a clip with probability >= 0.8)
VISIBLE_ACCURACY = 0.9


def clopper_pearson_upper(k, n, level: float = 0.95):
    """One-sided upper confidence bound of a binomial proportion (Clopper-Pearson, exact;
    vectorised): ``1 - (1 - level) ** (1 / n)`` when k = 0 (the "rule of three" is its
    approximation 3 / n), 1 when k = n."""
    from scipy.stats import beta

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(k >= n, 1.0, beta.ppf(level, k + 1, np.maximum(n - k, 1)))
    return out


def visible_share_bound(flagged, clips: int, ratings_per_clip: int, *, alpha: float = 0.05,
                        visible_accuracy: float = VISIBLE_ACCURACY, level: float = 0.95):
    """Upper bound (one-sided, ``level``) on the share of clips like these (the population the
    ``clips`` were drawn from at random) whose ABX accuracy is at least ``visible_accuracy``,
    from ``flagged`` of them flagged by the clip veto. Each such clip is flagged with
    probability at least ``power`` (exact binomial at the first Holm step with
    ``ratings_per_clip`` ratings, :func:`_clip_power`), so the flagged count is at least
    Binomial(clips, share x power): the Clopper-Pearson bound of the flagged share divided by
    ``power``, at most 1. Returns ``(bound, power)``; vectorised over ``flagged``."""
    power = _clip_power(int(ratings_per_clip), int(clips), alpha, visible_accuracy)
    cp = clopper_pearson_upper(flagged, clips, level)
    with np.errstate(divide="ignore"):
        b = np.minimum(1.0, cp / power) if power > 0 else np.ones_like(cp)
    return b, power


def coverage(selection: str, clips: int, of: int | None, flagged: int, ratings_per_clip: int, *,
             alpha: float = 0.05, visible_accuracy: float = VISIBLE_ACCURACY) -> dict:
    """What a verdict covers, from how its clips were chosen (``selection``: a ``--clips`` spec:
    ``sample:N``, ``worst:N`` or ``all``), how many (``clips``, of ``of`` compared in the
    report; None when unknown) and how many were flagged. A random sample (and ``all``, taken
    as a sample of clips like these) gets :func:`visible_share_bound`; ``worst:N`` covers the
    N clips with the highest LPIPS mean of the report and bounds nothing beyond them.
    Returns ``{"selection", "clips", "of", "flagged", "visible_accuracy", "flag_power",
    "bound", "text"}`` (``bound`` None for ``worst``)."""
    kind = selection.split(":", 1)[0] if selection else "all"
    b, power = visible_share_bound(flagged, clips, ratings_per_clip, alpha=alpha,
                                   visible_accuracy=visible_accuracy)
    b = float(b)
    out = {"selection": selection, "clips": clips, "of": of, "flagged": flagged,
           "visible_accuracy": visible_accuracy, "flag_power": power, "bound": b}
    of_txt = f" of {of}" if of else ""
    why = (f"one-sided 95% bound from {flagged} of {clips} flagged: Clopper-Pearson"
           + (f" 1 - 0.05^(1/{clips})" if flagged == 0 else "")
           + f" = {float(clopper_pearson_upper(flagged, clips)):.3g}, over the chance "
             f"{power:.2f} that the clip veto flags a clip at accuracy {visible_accuracy:g} "
             f"with {ratings_per_clip} ratings")
    if power <= 0:
        why = (f"no bound: with {ratings_per_clip} ratings per clip the clip veto cannot flag a "
               f"clip at accuracy {visible_accuracy:g}")
    if kind == "worst":
        out["bound"] = None
        out["text"] = (f"covers the {clips} clips{of_txt} with the highest LPIPS mean in the "
                       f"report ({selection}: chosen by the metric, not at random), {flagged} "
                       "flagged; it bounds nothing about the other clips (their LPIPS is lower, "
                       "which says they differ less only as far as LPIPS ranks what people see)")
    elif kind == "sample":
        out["text"] = (f"covers {clips} clips drawn at random{of_txt} ({selection}), {flagged} "
                       f"flagged: at most {100 * b:.3g}% of clips like these are visibly "
                       f"different (ABX accuracy >= {visible_accuracy:g}; {why})")
    else:
        out["text"] = (f"covers every compared clip ({clips}{of_txt}), {flagged} flagged; as a "
                       f"sample of clips like these: at most {100 * b:.3g}% visibly different "
                       f"(ABX accuracy >= {visible_accuracy:g}; {why})")
    return out


def clips_for_bound(target: float, ratings_per_clip: int, *, alpha: float = 0.05,
                    visible_accuracy: float = VISIBLE_ACCURACY, start: int = 1) -> int:
    """The fewest clips, from ``start``, drawn at random whose :func:`visible_share_bound` with
    none flagged is at most ``target`` (ValueError when the flag power makes it unreachable)."""
    if not 0 < target < 1:
        raise ValueError(f"--visible-bound: expected a share in (0, 1), found {target}")
    c = max(1, int(start), math.ceil(math.log(0.05) / math.log(1 - target)))
    while True:
        b, power = visible_share_bound(0, c, ratings_per_clip, alpha=alpha,
                                       visible_accuracy=visible_accuracy)
        if float(b) <= target:
            return c
        if power <= target or c > 100_000:
            raise ValueError(f"--visible-bound {target:g}: not reachable with "
                             f"{ratings_per_clip} ratings per clip")
        c = max(c + 1, math.ceil(math.log(0.05) / math.log(1 - target * power)))


# -- Krippendorff's alpha --------------------------------------------------------------------

def krippendorff_alpha_nominal(units) -> float | None:
    """Krippendorff's alpha for nominal data. ``units``: one list of values per unit (clip),
    one value per rater that rated it; units with fewer than two values are not pairable.
    None when undefined: nothing pairable, or no variation at all (one category only)."""
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
    if d_e == 0:   # one category only: agreement is undefined, not perfect
        return None
    return float(1 - d_o / d_e)


# -- Monte Carlo -----------------------------------------------------------------------------

def _beta_mean_sd(rng: np.random.Generator, mu: float, sd: float, shape) -> np.ndarray:
    """Beta draws with mean ``mu`` and SD ``sd`` (or the largest feasible, 0.95 of the
    Bernoulli SD); exactly ``mu`` when ``sd`` is 0."""
    if sd <= 0 or mu <= 0 or mu >= 1:
        return np.full(shape, float(mu))
    sd = min(sd, 0.95 * math.sqrt(mu * (1 - mu)))
    s = mu * (1 - mu) / sd ** 2 - 1
    return rng.beta(mu * s, (1 - mu) * s, size=shape)


def _truth(rng, scenario: str, S: int, R: int, C: int, mu: float, *, rater_sd: float,
           clip_sd: float, clip_accuracy: float, invert: float = 0.5, bot_share: float = 0.21,
           bot_accuracy: float = 0.3) -> np.ndarray:
    """True accuracy per study, rater and clip: (S, R, C), in [0, 1]."""
    if scenario == "homogeneous":
        return np.full((S, R, C), float(mu))
    if scenario == "heterogeneous_raters":
        return np.broadcast_to(_beta_mean_sd(rng, mu, rater_sd, (S, R))[:, :, None], (S, R, C))
    if scenario == "golden_ears":
        golden = rng.random((S, R)) < 0.1
        rest = min(1.0, max(0.0, (mu - 0.1 * 0.95) / 0.9))
        return np.broadcast_to(np.where(golden, 0.95, rest)[:, :, None], (S, R, C))
    if scenario == "clip_heterogeneity":
        v = rng.normal(0.0, clip_sd, (S, 1, C))
        return np.broadcast_to(np.clip(mu + v, 0, 1), (S, R, C))
    if scenario == "combined":
        pr = _beta_mean_sd(rng, mu, rater_sd, (S, R, 1))
        v = rng.normal(0.0, clip_sd, (S, 1, C))
        return np.clip(pr + v, 0, 1)
    if scenario == "one_visible_clip":
        p = np.full((S, R, C), 0.5)
        p[:, :, 0] = clip_accuracy
        return p
    if scenario == "inverted_discriminators":
        # guessing model: a share of raters discriminates (0.95), the rest guess; a share
        # ``invert`` of the discriminators answers against what they see (0.05)
        disc = rng.random((S, R)) < min(1.0, max(0.0, (mu - 0.5) / 0.45))
        inv = rng.random((S, R)) < invert
        p = np.where(disc, np.where(inv, 0.05, 0.95), 0.5)
        return np.broadcast_to(p[:, :, None], (S, R, C))
    if scenario == "inverted_raters":
        pr = _beta_mean_sd(rng, mu, rater_sd, (S, R))
        pr = np.where(rng.random((S, R)) < invert, 1 - pr, pr)
        return np.broadcast_to(pr[:, :, None], (S, R, C))
    if scenario == "inverted_clips":
        pc = np.clip(mu + rng.normal(0.0, clip_sd, (S, 1, C)), 0, 1)
        pc = np.where(rng.random((S, 1, C)) < invert, 1 - pc, pc)
        return np.broadcast_to(pc, (S, R, C))
    if scenario == "bots":
        bot = rng.random((S, R)) < bot_share
        return np.broadcast_to(np.where(bot, bot_accuracy, mu)[:, :, None], (S, R, C))
    if scenario == "weak_inversion":
        # every rater at mu, half of them answering against it (1 - mu): barely below chance
        p = np.where(rng.random((S, R)) < 0.5, 1 - mu, mu)
        return np.broadcast_to(p[:, :, None], (S, R, C))
    if scenario == "weak_bots":
        bot = rng.random((S, R)) < WEAK_BOTS[0]
        return np.broadcast_to(np.where(bot, WEAK_BOTS[1], mu)[:, :, None], (S, R, C))
    raise ValueError(f"scenario: expected one of {', '.join(SCENARIOS)}, found {scenario!r}")


def _batches(studies: int, reps: int, R: int, C: int, budget: float = 6e6):
    size = max(1, int(budget // (reps * (2 * R + C))))
    for start in range(0, studies, size):
        yield min(size, studies - start)


def mc_se(rate: float, studies: int) -> float:
    """Monte Carlo standard error of a simulated rate."""
    return math.sqrt(max(rate * (1 - rate), 0.0) / studies) if studies else float("nan")


def simulate_abx(raters: int, clips: int, scenario: str = "homogeneous", *,
                 margin: float = 0.1, mu: float | None = None, alpha: float = 0.05,
                 studies: int = 400, reps: int = 400, seed: int = 0,
                 rater_sd: float = 0.15, clip_sd: float = 0.1,
                 clip_accuracy: float = 0.95, invert: float = 0.5, bot_share: float = 0.21,
                 bot_accuracy: float = 0.3) -> dict:
    """Simulate ``studies`` complete ABX studies (each of ``raters`` rates each of ``clips``
    once) and apply the exact rule of :func:`decide_abx` (vectorised, ``reps`` bootstrap
    replicates per study). True accuracy ``p_rc`` per scenario (``mu``: the mean, default
    the boundary ``0.5 + margin``; everything clipped to [0, 1]):

    * ``homogeneous``: p_rc = mu (mu = 0.5 is the sharp null: everyone guesses);
    * ``heterogeneous_raters``: p_r ~ Beta with mean mu and SD ``rater_sd`` (or the largest
      feasible), p_rc = p_r;
    * ``golden_ears``: each rater with probability 0.1 at 0.95, the others at
      (mu - 0.095) / 0.9 so that the mean is mu;
    * ``clip_heterogeneity``: p_rc = mu + v_c, v_c ~ Normal(0, ``clip_sd``);
    * ``combined``: p_rc = p_r + v_c (both of the above);
    * ``one_visible_clip``: 0.5 everywhere but clip 0 at ``clip_accuracy`` (``mu`` ignored);
    * ``inverted_discriminators``: each rater discriminates (0.95) with probability
      (mu - 0.5) / 0.45, else guesses; a share ``invert`` of the discriminators answers
      against what they see (0.05);
    * ``inverted_raters``: as ``heterogeneous_raters``, then a share ``invert`` of the raters
      answers against what they see (1 - p_r);
    * ``inverted_clips``: as ``clip_heterogeneity``, then a share ``invert`` of the clips is
      answered against (1 - p_c);
    * ``bots``: raters at mu, but each is with probability ``bot_share`` a bot right with
      probability ``bot_accuracy`` (below 0.5: it decodes and answers wrong on purpose);
    * ``weak_inversion``: every rater at mu, each with probability 0.5 answering against it
      (1 - mu: barely below chance);
    * ``weak_bots``: ``bots`` at :data:`WEAK_BOTS` (0.4 right, as 40% of raters).

    In the last six the truth (what people see) is at mu; the answers below chance pull the
    accuracy toward or below 0.5, so "indistinguishable" there is an error.

    Returns the rate (fraction of studies) of each verdict, ``clip_flagged`` (clip 0 flagged),
    ``any_flagged``, ``overall_significant``, ``below_chance`` (a check below chance fired),
    ``bound_below_margin`` (not distinguishable and U < 0.5 + margin: what the rule said
    before the checks below chance and the coverage bound), ``mean_upper``, and ``se`` (Monte Carlo
    standard error of each rate)."""
    if mu is None:
        mu = 0.5 + margin
    rng = np.random.default_rng(seed)
    acc = {k: 0.0 for k in ("distinguishable", "indistinguishable", "inconclusive",
                            "clip_flagged", "any_flagged", "overall_significant",
                            "below_chance", "bound_below_margin")}
    upper_sum = 0.0
    for sb in _batches(studies, reps, raters, clips):
        P = _truth(rng, scenario, sb, raters, clips, mu, rater_sd=rater_sd, clip_sd=clip_sd,
                   clip_accuracy=clip_accuracy, invert=invert, bot_share=bot_share,
                   bot_accuracy=bot_accuracy)
        Y = (rng.random((sb, raters, clips)) < P).astype(float)
        wr = _draw_counts(rng, raters, (sb, reps))
        wc = _draw_counts(rng, clips, (sb, reps))
        o = _abx_rule(Y, None, wr, wc, margin=margin, alpha=alpha)
        acc["below_chance"] += o["below_chance"].sum()
        acc["bound_below_margin"] += (~o["distinguishable"] & (o["upper"] < 0.5 + margin)).sum()
        acc["distinguishable"] += o["distinguishable"].sum()
        acc["indistinguishable"] += o["indistinguishable"].sum()
        acc["inconclusive"] += (~o["distinguishable"] & ~o["indistinguishable"]).sum()
        acc["clip_flagged"] += o["flagged"][:, 0].sum()
        acc["any_flagged"] += o["flagged"].any(axis=1).sum()
        acc["overall_significant"] += o["overall_significant"].sum()
        upper_sum += o["upper"].sum()
    rates = {k: float(v) / studies for k, v in acc.items()}
    return {"scenario": scenario, "raters": raters, "clips": clips, "mu": mu,
            "margin": margin, "alpha": alpha, "studies": studies, "reps": reps, "seed": seed,
            **rates, "mean_upper": upper_sum / studies,
            "se": {k: mc_se(v, studies) for k, v in rates.items()}}


#: bootstrap replicates of every ABX and preference verdict (fixed: ``study results --reps``
#: cannot re-draw a verdict)
VERDICT_REPS = 1000


def verdict_seed(study_seed: int) -> int:
    """The bootstrap seed of a study's verdict, derived from the study seed (fixed per study:
    the same ratings always give the same verdict)."""
    import hashlib

    h = hashlib.sha256(f"evalkit verdict bootstrap {int(study_seed)}".encode()).digest()
    return int.from_bytes(h[:8], "big")


_DESIGN_CHECKS: dict = {}


def design_check(raters: int, clips: int, *, margin: float, alpha: float = 0.05,
                 studies: int = 400, reps: int = 200, seed: int = 4404,
                 heterogeneity: float = 0.15) -> dict:
    """Whether an ABX design of ``raters`` x ``clips`` (an achieved one, below its plan) still
    keeps the 5% rule: the bound on the share of visibly different clips (none flagged) can
    fall below :func:`visible_share_limit`, and the simulated rate of "indistinguishable" at
    true accuracy 0.5 + margin minus one Monte Carlo SE is <= ``alpha`` in every scenario of
    :data:`BOUNDARY_SCENARIOS` and :data:`INVERSION_SCENARIOS` (fixed seed: the same design
    always gets the same answer; cached). Returns ``ok``, ``visible_share_bound``,
    ``visible_share_limit``, ``rates`` (scenario -> [rate, se]; empty when the bound already
    rules the claim out), ``failing`` and ``text``."""
    key = (int(raters), int(clips), float(margin), float(alpha), studies, reps, seed,
           heterogeneity)
    if key in _DESIGN_CHECKS:
        return _DESIGN_CHECKS[key]
    lim = visible_share_limit(margin)
    vb = float(visible_share_bound(0, clips, raters, alpha=alpha)[0])
    rates: dict[str, list] = {}
    failing: dict[str, float] = {}
    if vb < lim and raters >= 2 and clips >= 2:
        edges = _boundary_checks(raters, clips, studies=studies, reps=reps, alpha=alpha,
                                 margin=margin, heterogeneity=heterogeneity, seed=seed)
        rates = {sc: [o["indistinguishable"], o["se"]["indistinguishable"]]
                 for sc, o in edges.items()}
        failing = _boundary_failures(edges, alpha)
    ok = vb < lim and bool(rates) and not failing
    if vb >= lim:
        text = (f"{raters} raters x {clips} clips cannot claim indistinguishable: the bound on "
                f"the share of visibly different clips is {vb:.3g}, not below {lim:g}")
    elif failing:
        text = (f"{raters} raters x {clips} clips cannot claim indistinguishable: simulated "
                f"'indistinguishable' at true accuracy {0.5 + margin:g} is "
                + ", ".join(f"{sc} {r:.3f}" for sc, r in failing.items())
                + f" (above {alpha:g}; {studies} studies a boundary scenario, "
                f"{max(studies, INVERSION_CHECK_STUDIES)} a below-chance one)")
    else:
        text = (f"{raters} raters x {clips} clips still keep the rule: simulated "
                f"'indistinguishable' at true accuracy {0.5 + margin:g} at most "
                f"{max(r for r, _ in rates.values()):.3f} in {len(rates)} scenarios "
                f"({studies} studies a boundary scenario, "
                f"{max(studies, INVERSION_CHECK_STUDIES)} a below-chance one)")
    out = {"ok": ok, "raters": int(raters), "clips": int(clips), "visible_share_bound": vb,
           "visible_share_limit": lim, "rates": rates, "failing": failing, "text": text,
           "studies": studies}
    _DESIGN_CHECKS[key] = out
    return out


#: the verdict of a study whose key was opened before its planned raters were complete, where
#: its rule would have said "indistinguishable"
UNBLINDED_EARLY = "unblinded early"


def after_unblinding(verdict: str, unblinded_early: bool) -> str:
    """The verdict as reported: a study whose key was opened before its planned included raters
    were complete (a logged unblinding) never claims "indistinguishable" (a look can steer
    when a study stops, which the rule's error rate does not allow for); every other verdict
    stands, with the unblinding reported beside it."""
    return UNBLINDED_EARLY if unblinded_early and verdict == "indistinguishable" else verdict


def simulate_abx_peeking(raters_max: int, clips: int, scenario: str = "homogeneous", *,
                         start: int = MIN_RATERS, margin: float = 0.1,
                         mu: float | None = None, alpha: float = 0.05, studies: int = 400,
                         reps: int = 400, seed: int = 0, rater_sd: float = 0.15,
                         clip_sd: float = 0.1) -> dict:
    """The problem the "interim" display prevents: the same simulated studies (truth at
    ``mu``, default the boundary 0.5 + margin) checked after every rater from ``start`` to
    ``raters_max`` (the rule applied to the raters so far, fresh bootstrap draws each look).
    Returns ``fixed`` (rate of "indistinguishable" at the single look at ``raters_max``: what
    the product does), ``peeking`` (rate of "indistinguishable" at any look, i.e. stopping at
    the first one), ``closed`` (rate of "indistinguishable" the product reports to an owner
    who looks at every rater: each look needs the key, so a logged unblinding at the first
    look; stopping at the first look that would say "indistinguishable" leaves an interim study
    without a verdict, and a study carried on to the planned size is judged by
    :func:`after_unblinding`), ``looks`` and ``se`` of each."""
    if mu is None:
        mu = 0.5 + margin
    rng = np.random.default_rng(seed)
    fixed = any_look = closed = 0
    for sb in _batches(studies, reps, raters_max, clips):
        P = _truth(rng, scenario, sb, raters_max, clips, mu, rater_sd=rater_sd,
                   clip_sd=clip_sd, clip_accuracy=0.95)
        Y = (rng.random((sb, raters_max, clips)) < P).astype(float)
        hit = np.zeros(sb, dtype=bool)
        for r in range(start, raters_max + 1):
            wr = _draw_counts(rng, r, (sb, reps))
            wc = _draw_counts(rng, clips, (sb, reps))
            o = _abx_rule(Y[:, :r], None, wr, wc, margin=margin, alpha=alpha)
            if r == raters_max:
                fixed += int(o["indistinguishable"].sum())
                # the owner looked (unblinded at the first look, before the planned size):
                # stopped studies have no verdict, the others are judged as reported
                carried_on = ~hit
                reported = [after_unblinding("indistinguishable" if v else "other", True)
                            for v in o["indistinguishable"][carried_on]]
                closed += sum(v == "indistinguishable" for v in reported)
            hit |= o["indistinguishable"]
        any_look += int(hit.sum())
    f, p, c = fixed / studies, any_look / studies, closed / studies
    return {"scenario": scenario, "raters_max": raters_max, "clips": clips, "start": start,
            "mu": mu, "margin": margin, "looks": raters_max - start + 1, "studies": studies,
            "fixed": f, "peeking": p, "closed": c,
            "se": {"fixed": mc_se(f, studies), "peeking": mc_se(p, studies),
                   "closed": mc_se(c, studies)}}


def simulate_visible_share(raters: int, clips: int, share: float, *, margin: float = 0.1,
                           visible_accuracy: float = 1.0, alpha: float = 0.05,
                           studies: int = 400, reps: int = 400, seed: int = 0,
                           bound_accuracy: float = VISIBLE_ACCURACY) -> dict:
    """Sparse visible clips: each of the ``clips`` drawn at random is visible with probability
    ``share`` (every rater right with probability ``visible_accuracy``), the others at chance.
    Applies the ABX rule and the coverage bound (:func:`visible_share_bound` for accuracy
    ``bound_accuracy``) to ``studies`` simulated studies. Returns the rate of each verdict,
    ``covered`` (the bound >= ``share``: the bound's coverage, target >= 0.95),
    ``false_claim`` ("indistinguishable" with a bound below ``share``: the claim not limited
    honestly), ``mean_bound`` and ``se``."""
    rng = np.random.default_rng(seed)
    acc = {"distinguishable": 0, "indistinguishable": 0, "covered": 0, "false_claim": 0,
           "indistinguishable_covered": 0}
    bound_sum = 0.0
    for sb in _batches(studies, reps, raters, clips):
        vis = rng.random((sb, 1, clips)) < share
        P = np.broadcast_to(np.where(vis, visible_accuracy, 0.5), (sb, raters, clips))
        Y = (rng.random((sb, raters, clips)) < P).astype(float)
        wr = _draw_counts(rng, raters, (sb, reps))
        wc = _draw_counts(rng, clips, (sb, reps))
        o = _abx_rule(Y, None, wr, wc, margin=margin, alpha=alpha)
        b, _ = visible_share_bound(o["flagged"].sum(axis=1), clips, raters, alpha=alpha,
                                   visible_accuracy=bound_accuracy)
        cov = b >= share
        acc["distinguishable"] += int(o["distinguishable"].sum())
        acc["indistinguishable"] += int(o["indistinguishable"].sum())
        acc["covered"] += int(cov.sum())
        acc["false_claim"] += int((o["indistinguishable"] & ~cov).sum())
        acc["indistinguishable_covered"] += int((o["indistinguishable"] & cov).sum())
        bound_sum += float(b.sum())
    rates = {k: v / studies for k, v in acc.items()}
    return {"raters": raters, "clips": clips, "share": share, "margin": margin,
            "visible_accuracy": visible_accuracy, "bound_accuracy": bound_accuracy,
            "studies": studies, "reps": reps, "seed": seed, **rates,
            "mean_bound": bound_sum / studies,
            "se": {k: mc_se(v, studies) for k, v in rates.items()}}


def simulate_preference(raters: int, clips: int, *, win_rate: float = 0.5,
                        tie_rate: float = 0.0, rater_sd: float = 0.0, tie_sd: float = 0.0,
                        alpha: float = 0.05, studies: int = 400, reps: int = 400,
                        seed: int = 0) -> dict:
    """Simulate complete preference studies and apply the rule of :func:`decide_preference`:
    each rating is a tie with the rater's tie propensity t_r ~ Beta(mean ``tie_rate``, SD
    ``tie_sd``) (``tie_sd`` 0: every rater ``tie_rate``), else B wins with the rater's win rate
    p_r ~ Beta(mean ``win_rate``, SD ``rater_sd``) (``rater_sd`` large at win rate 0.5:
    raters who see the difference but split their taste). Returns the rate of each verdict
    and ``se``."""
    rng = np.random.default_rng(seed)
    b = a = 0
    for sb in _batches(studies, reps, raters, clips):
        pr = _beta_mean_sd(rng, win_rate, rater_sd, (sb, raters, 1))
        tr = _beta_mean_sd(rng, tie_rate, tie_sd, (sb, raters, 1))
        D = (rng.random((sb, raters, clips)) >= tr).astype(float)
        W = D * (rng.random((sb, raters, clips)) < pr)
        wr = _draw_counts(rng, raters, (sb, reps))
        wc = _draw_counts(rng, clips, (sb, reps))
        o = _preference_rule(W, D, wr, wc, alpha=alpha, flips=sign_flips(rng, raters))
        b += int(o["b_preferred"].sum())
        a += int(o["a_preferred"].sum())
    rates = {"B preferred": b / studies, "A preferred": a / studies,
             "no preference shown": (studies - a - b) / studies}
    rates["any preference"] = (a + b) / studies
    return {"raters": raters, "clips": clips, "win_rate": win_rate, "tie_rate": tie_rate,
            "rater_sd": rater_sd, "tie_sd": tie_sd, "studies": studies, "reps": reps, "seed": seed, **rates,
            "se": {k: mc_se(v, studies) for k, v in rates.items()}}


# -- planning --------------------------------------------------------------------------------

def _smallest(lo: int, hi: int, ok) -> int:
    """The smallest n in (lo, hi] with ok(n), given ok(hi) and a monotone ok (bisection)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _pigeonhole_factor(R: int, C: int) -> float:
    """Variance of the pigeonhole bootstrap mean over that of independent ratings:
    E[(W V)^2] - 1 with W, V the draw counts of one rater and one clip (about 3)."""
    return (2 - 1 / R) * (2 - 1 / C) - 1


def _normal_power(R: int, C: int, margin: float, alpha: float, *, two_sided: bool,
                  decisive_share: float = 1.0, rater_sd: float = 0.0) -> float:
    """Normal approximation of the power of the rule at R raters x C clips: the estimate has
    SE^2 = h^2 / R + (0.25 - h^2) / n and the bootstrap SD^2 = h^2 / R + factor * (0.25 - h^2)
    / n (n decisive ratings, h the SD of the raters' true rates, factor the pigeonhole
    inflation of independent ratings, about 3); the rule needs margin > t * SD."""
    from scipy.stats import norm

    n = R * C * decisive_share
    h2 = min(rater_sd ** 2, 0.25)
    se = math.sqrt(h2 / R + (0.25 - h2) / n)
    sd = math.sqrt(h2 / R + _pigeonhole_factor(R, C) * (0.25 - h2) / n)
    t = float(_t(1 - alpha / 2 if two_sided else 1 - alpha, min(R, C) - 1))
    return float(norm.cdf((margin - t * sd) / se))


def _normal_raters(margin: float, power: float, C: int, alpha: float, *, two_sided: bool,
                   decisive_share: float = 1.0, rater_sd: float = 0.0) -> int:
    """Smallest R >= 2 with :func:`_normal_power` >= ``power`` (``2 * MAX_RATERS`` + 1 when
    none up to there)."""
    def good(R):
        return _normal_power(R, C, margin, alpha, two_sided=two_sided,
                             decisive_share=decisive_share, rater_sd=rater_sd) >= power

    lo, hi = 1, 2
    while not good(hi):
        lo, hi = hi, hi * 2
        if hi > 2 * MAX_RATERS:
            return 2 * MAX_RATERS + 1
    return _smallest(lo, hi, good)


#: the most ratings per clip the clip-veto search of :func:`plan` looks through (~2 s)
MAX_CLIP_RATERS = 5_000


def _clip_raters_estimate(C: int, alpha: float, clip_accuracy: float, clip_power: float) -> int:
    """Normal approximation of the ratings per clip :func:`_clip_power` needs."""
    from scipy.stats import norm

    if clip_accuracy >= 1:
        return MIN_RATERS
    za, zb = float(norm.isf(alpha / 2 / C)), float(norm.ppf(clip_power))
    p = clip_accuracy
    return math.ceil(((za * 0.5 + zb * math.sqrt(p * (1 - p))) / (p - 0.5)) ** 2)


def _clip_power(R: int, C: int, alpha: float, clip_accuracy: float) -> float:
    """Exact power to flag one clip at ``clip_accuracy`` with R ratings, at the first Holm
    step (alpha / 2 / C; conservative for the full procedure)."""
    from scipy.stats import binom

    ks = np.arange(R + 1)
    ok = _sf_half(ks, R) <= alpha / 2 / C
    if not ok.any():
        return 0.0
    k = int(ks[ok][0])
    return float(binom.sf(k - 1, R, clip_accuracy))


def plan(protocol: str, margin: float, power: float = 0.8, *, clips: int = MIN_CLIPS,
         alpha: float = 0.05, exclusion_rate: float = 0.1, clip_accuracy: float = 0.9,
         clip_power: float = 0.8, heterogeneity: float = 0.15, tie_rate: float = 0.0,
         studies: int = 400, reps: int = 400, seed: int = 12345,
         clips_per_rater: int | None = None, progress=None,
         visible_bound: float | None = None) -> dict:
    """Included raters (each rates every clip once) needed by a study.

    ABX: the smallest ``raters`` R >= 12 such that (a) when everyone guesses, the simulated
    probability of "indistinguishable" by the exact rule of :func:`decide_abx` (``studies``
    simulated studies, ``reps`` bootstrap replicates, fixed seed) minus one Monte Carlo SE is
    >= ``power``; and (b) one clip at true accuracy ``clip_accuracy`` is flagged with
    probability >= ``clip_power`` (exact binomial power at the first Holm step, alpha/2/clips:
    conservative). The search starts from a normal approximation (bound = estimate + t x
    bootstrap SD) and bisects on simulated power; above :data:`SIMULATE_MAX_CELLS` rater x clip
    cells it keeps the normal approximation (``method`` says which). As checks it also
    simulates, at the planned size, the boundary error (rate of "indistinguishable" at true
    accuracy 0.5 + margin in the ``combined`` scenario with rater SD ``heterogeneity``), the
    false "distinguishable" rate at chance, and the flag rate of one clip at
    ``clip_accuracy``.

    Preference: the smallest R >= 12 whose simulated probability of "B preferred"
    (:func:`decide_preference` rule) is >= ``power`` (minus one MC SE) when B's win rate among
    decisive answers is 0.5 + margin, ratings are ties with probability ``tie_rate``, and
    raters' win rates vary with SD ``heterogeneity``; start from the normal approximation.

    Floors for both: >= 12 included raters and >= 15 clips (a smaller ``clips`` is raised, with
    a note). ABX clips are raised further (a note says so): to :func:`min_clips`, then to
    :func:`spread_clips` at the raters the constraints above need there (answers barely below
    chance, :data:`WEAK_SCENARIOS`, are seen only with enough clips per rater), planning the
    raters again at the larger number (power by the normal approximation while iterating) until
    the clips settle; the boundary checks at the final size include those scenarios, and a plan
    over :data:`MAX_RATERS` test ratings is refused. ``invite`` = ceil(R / (1 - exclusion_rate))
    raters to invite.
    ``clips_per_rater``: old name of ``clips``. ``progress``: called with a short text after
    each simulation (how many are needed is not known in advance).

    ABX, ``visible_bound`` (a share, e.g. 0.1): clips drawn at random are raised until, with
    none flagged, the verdict can say that at most this share of clips like these is visibly
    different (:func:`visible_share_bound` at the planned raters; the plan is redone at the
    larger number of clips). Every ABX plan reports ``visible_share_bound``: that bound at
    its size, with none flagged."""
    if clips_per_rater is not None:
        clips = clips_per_rater
    _check_plan(protocol, margin, power, exclusion_rate, tie_rate, clip_accuracy, clips,
                visible_bound)
    notes: list[str] = []
    clips_requested = clips
    floor = min_clips(margin) if protocol == "abx" else MIN_CLIPS
    if clips < floor:
        notes.append(f"clips raised from {clips} to the floor of {floor}" + (
            f" (margin {margin:g}: fewer clips drawn at random cannot bound the share of "
            f"visibly different clips below {visible_share_limit(margin):g}, 2 x margin)"
            if floor > MIN_CLIPS else ""))
        clips = floor
    C = int(clips)
    share = 1 - tie_rate if protocol == "preference" else 1.0
    h = heterogeneity if protocol == "preference" else 0.0
    chk = {"studies": studies, "reps": reps, "alpha": alpha, "margin": margin}

    def raters_at(C: int, notes: list, simulate: bool = True) -> tuple:
        approx = _normal_raters(margin, power, C, alpha, two_sided=protocol == "preference",
                                decisive_share=share, rater_sd=h)
        if approx > MAX_RATERS:
            need = (f"more than {2 * MAX_RATERS:,}" if approx > 2 * MAX_RATERS else
                    f"about {approx:,}")
            raise ValueError(f"--margin {margin:g}: {need} included raters would be "
                             f"needed at {C} clips (the limit is {MAX_RATERS:,}); use a larger "
                             f"--margin or more clips")
        if protocol == "abx" and approx * C > MAX_RATERS:
            raise ValueError(f"--margin {margin:g}: about {approx:,} included raters x {C:,} "
                             f"clips = {approx * C:,} test ratings would be needed (at least "
                             f"{C:,} clips to bound the share of visibly different clips below "
                             f"{visible_share_limit(margin):g} and to see answers barely below "
                             f"chance; the limit is {MAX_RATERS:,} test ratings); use a larger "
                             "--margin")
        if not simulate:
            return approx, None, max(MIN_RATERS, approx), "normal approximation"
        pw = _PowerAt(protocol, C, margin=margin, alpha=alpha, tie_rate=tie_rate,
                      heterogeneity=heterogeneity, studies=studies, reps=reps, seed=seed,
                      progress=progress)
        r_power, method = _raters_for_power(pw, approx, C, power, studies, notes)
        return approx, pw, r_power, method

    if protocol == "abx":
        # answers barely below chance are seen by the raters' spread check, whose power grows
        # with clips per rater: raise the clips until it sees them at the raters the other
        # constraints need there (more clips need fewer raters for power: iterate, with the
        # power's normal approximation; the boundary checks at the final size include both
        # scenarios and add raters if they still fail there)
        spread_from = C
        for _ in range(8):
            approx, pw, r_power, method = raters_at(C, [], simulate=False)
            r_pre = _abx_raters(r_power, method, C, power=power, alpha=alpha,
                                clip_accuracy=clip_accuracy, clip_power=clip_power,
                                heterogeneity=heterogeneity, seed=seed, chk=chk, notes=[],
                                progress=progress, checks=False)[0]
            need, how = spread_clips(margin, r_pre, alpha=alpha, start=C)
            if progress is not None:
                progress(f"{r_pre} raters: {need} clips see answers barely below chance")
            if need <= C:
                break
            if r_pre * need > 100 * MAX_RATERS:
                raise ValueError(f"--margin {margin:g}: about {r_pre:,} included raters x "
                                 f"{need:,} clips = {r_pre * need:,} test ratings would be "
                                 f"needed (clips per rater to see answers barely below chance; "
                                 f"the limit is {MAX_RATERS:,} test ratings); use a larger "
                                 "--margin")
            C = need
        if C > spread_from:
            notes.append(f"clips raised from {spread_from} to {C} (answers barely below chance: "
                         f"with fewer clips per rater, every rater at {0.5 + margin:g} and half "
                         f"of them inverted, or bots at {WEAK_BOTS[1]:g} as "
                         f"{WEAK_BOTS[0]:.0%} of raters, would go unseen more than "
                         f"{alpha:g} of the time; {how})")
    approx, pw, r_power, method = raters_at(C, notes)
    if protocol == "abx":
        R, reasons, edges, checks_simulated = _abx_raters(
            r_power, method, C, power=power, alpha=alpha, clip_accuracy=clip_accuracy,
            clip_power=clip_power, heterogeneity=heterogeneity, seed=seed, chk=chk,
            notes=notes, progress=progress)
        if R * C > MAX_RATERS:
            raise ValueError(f"--margin {margin:g}: {R:,} included raters x {C:,} clips = "
                             f"{R * C:,} test ratings would be needed (clips per rater to see "
                             f"answers barely below chance; the limit is {MAX_RATERS:,} test "
                             "ratings); use a larger --margin")
        if C > spread_from:
            reasons.append(f"answers barely below chance: {C} clips per rater (not {spread_from}) "
                           f"see them at {R} raters")
    else:
        R, edges, checks_simulated = max(MIN_RATERS, r_power), {}, method == "simulation"
        reasons = ([f"power: {power:g} probability of 'B preferred' at win rate "
                    f"{0.5 + margin:g} needs {r_power} raters"]
                   if R == r_power and r_power > MIN_RATERS else [])
    if R == MIN_RATERS and not reasons:
        reasons.append(f"floor: at least {MIN_RATERS} included raters")
    out = {"protocol": protocol, "margin": margin, "power_target": power, "alpha": alpha,
           "raters": R, "invite": math.ceil(R / (1 - exclusion_rate) - 1e-9),
           "exclusion_rate": exclusion_rate, "clips": C, "clips_requested": clips_requested,
           "ratings_per_clip": R, "trials": R * C, "reasons": reasons, "notes": notes,
           "method": method, "normal_approx_raters": approx, "rule_version": RULE_VERSION,
           "simulated_studies": studies, "bootstrap_reps": reps, "seed": seed,
           "heterogeneity": heterogeneity,
           # names kept for the CLI of before
           "clips_per_rater": C, "analytic_trials": approx * C}
    big = method != "simulation" or not checks_simulated
    if protocol == "abx":
        vb, _ = visible_share_bound(0, C, R, alpha=alpha, visible_accuracy=clip_accuracy)
        out["visible_share_bound"] = float(vb)
        if visible_bound is not None:
            need = clips_for_bound(visible_bound, R, alpha=alpha,
                                   visible_accuracy=clip_accuracy, start=C)
            if need > C:        # more clips may need more raters: plan again at that size
                again = plan(protocol, margin, power, clips=need, alpha=alpha,
                             exclusion_rate=exclusion_rate, clip_accuracy=clip_accuracy,
                             clip_power=clip_power, heterogeneity=heterogeneity,
                             tie_rate=tie_rate, studies=studies, reps=reps, seed=seed,
                             progress=progress, visible_bound=visible_bound)
                again["clips_requested"] = clips_requested
                return again
            out["visible_bound_target"] = visible_bound
            reasons.append(f"visible bound: {C} clips drawn at random bound the share of "
                           f"visibly different clips (accuracy >= {clip_accuracy:g}) at "
                           f"{float(vb):.3g} <= {visible_bound:g} when none is flagged")
        out.update(_abx_figures(R, C, margin=margin, alpha=alpha, clip_accuracy=clip_accuracy,
                                clip_power=clip_power, seed=seed, chk=chk, edges=edges,
                                big=big))
    else:
        out.update(_preference_figures(R, C, pw, margin=margin, alpha=alpha, tie_rate=tie_rate,
                                       share=share, h=h, heterogeneity=heterogeneity,
                                       studies=studies, reps=reps, seed=seed, big=big))
    return out


def _check_plan(protocol, margin, power, exclusion_rate, tie_rate, clip_accuracy, clips,
                visible_bound) -> None:
    """:func:`plan`'s arguments, each refused with a message naming its option."""
    if protocol not in ("abx", "preference"):
        raise ValueError(f"protocol: expected abx or preference, found {protocol!r}")
    if not 0 < margin < 0.5:
        raise ValueError(f"--margin: expected a number in (0, 0.5), found {margin}")
    if not 0 < power < 1:
        raise ValueError(f"--power: expected a number in (0, 1), found {power}")
    if not 0 <= exclusion_rate < 1:
        raise ValueError(f"--exclusion-rate: expected a number in [0, 1), found {exclusion_rate}")
    if not 0 <= tie_rate < 1:
        raise ValueError(f"--tie-rate: expected a number in [0, 1), found {tie_rate}")
    if not 0.5 < clip_accuracy <= 1:
        raise ValueError(f"--clip-accuracy: expected a number in (0.5, 1], found {clip_accuracy}")
    if isinstance(clips, bool) or not isinstance(clips, numbers.Integral) or clips < 1:
        raise ValueError(f"--clips: expected a positive integer, found {clips!r}")
    if visible_bound is not None:
        if protocol != "abx":
            raise ValueError("--visible-bound: only for --protocol abx (a preference study "
                             "makes no claim that clips look the same)")
        if not 0 < visible_bound < 1:
            raise ValueError(f"--visible-bound: expected a share in (0, 1), found "
                             f"{visible_bound}")


class _PowerAt:
    """The simulated power of a design with ``R`` raters (cached per R): the probability of
    "indistinguishable" when everyone guesses (ABX), or of "B preferred" at win rate
    0.5 + margin (preference)."""

    def __init__(self, protocol, C, *, margin, alpha, tie_rate, heterogeneity, studies, reps,
                 seed, progress):
        self.protocol, self.C, self.margin, self.alpha = protocol, C, margin, alpha
        self.tie_rate, self.heterogeneity = tie_rate, heterogeneity
        self.studies, self.reps, self.seed, self.progress = studies, reps, seed, progress
        self.cache: dict[int, float] = {}

    def __call__(self, R: int) -> float:
        if R not in self.cache:
            if self.protocol == "abx":
                self.cache[R] = simulate_abx(R, self.C, "homogeneous", mu=0.5,
                                             margin=self.margin, alpha=self.alpha,
                                             studies=self.studies, reps=self.reps,
                                             seed=self.seed + R)["indistinguishable"]
            else:
                self.cache[R] = simulate_preference(
                    R, self.C, win_rate=0.5 + self.margin, tie_rate=self.tie_rate,
                    rater_sd=self.heterogeneity, alpha=self.alpha, studies=self.studies,
                    reps=self.reps, seed=self.seed + R)["B preferred"]
            if self.progress is not None:
                self.progress(f"{R} raters: power {self.cache[R]:.3f}")
        return self.cache[R]


def _raters_for_power(pw: _PowerAt, approx: int, C: int, power: float, studies: int,
                      notes: list) -> tuple[int, str]:
    """The smallest R whose simulated power minus one MC SE reaches ``power``, and the method:
    bracketed around the normal approximation ``approx`` and bisected; the approximation itself
    where the design is too large to simulate quickly (a note says so)."""
    mc = math.sqrt(power * (1 - power) / studies)

    def ok(R: int) -> bool:
        return pw(R) - mc >= power

    simulate = approx * C <= SIMULATE_MAX_CELLS
    if simulate:
        # bracket [lo, hi] with ok(hi) and not ok(lo) (lo = 11: below the floor) around the
        # normal approximation, then bisect
        r0 = max(MIN_RATERS, approx)
        if ok(r0):
            lo, hi = max(MIN_RATERS - 1, int(r0 * 0.85)), r0
            if lo >= MIN_RATERS and ok(lo):
                lo, hi = MIN_RATERS - 1, lo
        else:
            lo, hi = r0, math.ceil(r0 * 1.15) + 1
            while not ok(hi):
                lo, hi = hi, math.ceil(hi * 1.15) + 1
                if hi * C > 2 * SIMULATE_MAX_CELLS:
                    simulate = False
                    break
    if simulate:
        return _smallest(lo, hi, ok), "simulation"
    r_power = max(MIN_RATERS, approx)
    notes.append(f"{r_power} raters x {C} clips is too large to simulate quickly: the "
                 f"power figure is the normal approximation")
    return r_power, "normal approximation"


def _abx_raters(r_power, method, C, *, power, alpha, clip_accuracy, clip_power, heterogeneity,
                seed, chk, notes, progress, checks: bool = True) -> tuple[int, list, dict, bool]:
    """ABX raters past the power figure ``r_power``: the clip veto (one clip at
    ``clip_accuracy`` flagged with probability ``clip_power``), then (``checks``) the boundary
    error in every scenario of :data:`BOUNDARY_SCENARIOS` and :data:`INVERSION_SCENARIOS`.
    Returns (raters, reasons, the boundary simulations, whether the checks were simulated)."""
    reasons: list[str] = []
    edges: dict[str, dict] = {}
    R = max(MIN_RATERS, r_power)
    # the search below is linear (the exact power is a saw-tooth) and each step costs O(R):
    # refuse a clip accuracy so close to 0.5 that it would run for minutes
    need = _clip_raters_estimate(C, alpha, clip_accuracy, clip_power)
    if need > MAX_CLIP_RATERS:
        raise ValueError(f"--clip-accuracy {clip_accuracy:g}: about {need:,} ratings per clip "
                         f"would be needed to flag one clip (the limit is "
                         f"{MAX_CLIP_RATERS:,}); use a larger --clip-accuracy")
    r_clip = MIN_RATERS
    while _clip_power(r_clip, C, alpha, clip_accuracy) < clip_power:
        r_clip += 1
        if r_clip > MAX_RATERS:
            raise ValueError(f"clip accuracy {clip_accuracy}: cannot be flagged with "
                             f"{MAX_RATERS:,} ratings per clip")

    def clip_ok_from(r: int) -> int:
        while _clip_power(r, C, alpha, clip_accuracy) < clip_power:   # binomial saw-tooth
            r += 1
        return r

    R = clip_ok_from(max(R, r_clip))
    r_veto = R
    lim = visible_share_limit(chk["margin"])
    while float(visible_share_bound(0, C, R, alpha=alpha)[0]) >= lim:
        R += 1
        if R > MAX_CLIP_RATERS:
            raise ValueError(f"--clips {C}: the share of visibly different clips cannot be "
                             f"bounded below {lim:g} with up to {MAX_CLIP_RATERS:,} raters; "
                             "use more clips")
    checks_simulated = method == "simulation" and R * C <= 2 * SIMULATE_MAX_CELLS
    if method == "simulation" and not checks_simulated:     # the clip veto made R large
        notes.append(f"{R} raters x {C} clips is too large to simulate quickly: the checks "
                     "at this size are the normal approximation")
    r_base = R
    if R == r_power and r_power > MIN_RATERS:
        reasons.append(f"power: {power:g} probability of 'indistinguishable' when "
                       f"everyone guesses needs {r_power} raters")
    if r_veto > r_power:
        reasons.append(f"clip veto: flagging one clip at accuracy {clip_accuracy:g} with "
                       f"probability {clip_power:g} needs {r_veto} ratings per clip "
                       f"(power alone: {r_power})")
    if R > max(r_veto, r_power):
        reasons.append(f"coverage: {C} clips bound the share of visibly different clips "
                       f"below {lim:g} (2 x margin) from {R} ratings per clip")
    # the error claim at this size: "indistinguishable" at the boundary 0.5 + margin must
    # stay <= alpha (one MC SE allowed) in every scenario; with few raters and many clips
    # (golden ears missed by the sample) it may not: add raters until it does
    while checks_simulated and checks:
        edges = _boundary_checks(R, C, heterogeneity=heterogeneity, seed=seed + 1, **chk)
        if progress is not None:
            progress(f"{R} raters: boundary checks")
        bad = _boundary_failures(edges, alpha)
        if not bad:
            break
        if R * C > 2 * SIMULATE_MAX_CELLS:
            notes.append(f"boundary error above {alpha:g} at {R} raters "
                         f"({', '.join(f'{k} {v:.3f}' for k, v in bad.items())}); stopped "
                         f"adding raters")
            break
        R = clip_ok_from(math.ceil(R * 1.1) + 1)
    if R > r_base:
        reasons.append(f"heterogeneity and answers below chance: 'indistinguishable' at true accuracy "
                       f"{0.5 + chk['margin']:g} stays <= {alpha:g} in every scenario from {R} "
                       f"raters (not at {r_base})")
    return R, reasons, edges, checks_simulated


#: simulated studies of the planner's and :func:`design_check`'s checks with answers below chance
#: (judged on the rate itself, not the rate less one SE: the checks below chance leave rates
#: near 5% at the smallest sizes, and 400 studies could not tell 5% from 7%)
INVERSION_CHECK_STUDIES = 1000


def _boundary_checks(R: int, C: int, *, studies: int, reps: int, alpha: float, margin: float,
                     heterogeneity: float, seed: int) -> dict:
    """``simulate_abx`` at the boundary in every scenario of :data:`BOUNDARY_SCENARIOS` and
    :data:`INVERSION_SCENARIOS` (the latter with at least :data:`INVERSION_CHECK_STUDIES`)."""
    out = {}
    for i, sc in enumerate(BOUNDARY_SCENARIOS + INVERSION_SCENARIOS):
        n = studies if sc in BOUNDARY_SCENARIOS else max(studies, INVERSION_CHECK_STUDIES)
        out[sc] = simulate_abx(R, C, sc, rater_sd=heterogeneity, seed=seed + i, studies=n,
                               reps=reps, alpha=alpha, margin=margin)
    return out


def _boundary_failures(edges: dict, alpha: float) -> dict:
    """The scenarios whose boundary rate is above ``alpha``: less one MC SE for
    :data:`BOUNDARY_SCENARIOS`, the rate itself for :data:`INVERSION_SCENARIOS`."""
    return {sc: o["indistinguishable"] for sc, o in edges.items()
            if o["indistinguishable"] - (o["se"]["indistinguishable"]
                                         if sc in BOUNDARY_SCENARIOS else 0.0) > alpha}


def _abx_figures(R, C, *, margin, alpha, clip_accuracy, clip_power, seed, chk, edges,
                 big) -> dict:
    """An ABX plan's rule, clip-flag power and its checks at the planned size (simulated, or
    the normal approximation when ``big``)."""
    out = {"margin_terms": margin_terms(margin), "rule": abx_rule_text(margin, alpha, R, C, 2000),
           "clip_accuracy": clip_accuracy, "clip_power_target": clip_power,
           "clip_flag_power": _clip_power(R, C, alpha, clip_accuracy)}
    if big:
        out.update(simulated_power=_normal_power(R, C, margin, alpha, two_sided=False),
                   simulated_power_se=None, boundary_error=None, boundary_error_se=None,
                   distinguishable_at_chance=None, clip_flag_simulated=None)
        return out
    null = simulate_abx(R, C, "homogeneous", mu=0.5, seed=seed + R, **chk)
    vis = simulate_abx(R, C, "one_visible_clip", clip_accuracy=clip_accuracy, seed=seed + 7,
                       **chk)
    out.update(simulated_power=null["indistinguishable"],
               simulated_power_se=null["se"]["indistinguishable"],
               distinguishable_at_chance=null["distinguishable"],
               boundary_error={sc: o["indistinguishable"] for sc, o in edges.items()},
               boundary_error_se=max(o["se"]["indistinguishable"] for o in edges.values()),
               clip_flag_simulated=vis["clip_flagged"])
    return out


def _preference_figures(R, C, pw, *, margin, alpha, tie_rate, share, h, heterogeneity, studies,
                        reps, seed, big) -> dict:
    """A preference plan's rule and its power and chance-level checks at the planned size."""
    out = {"tie_rate": tie_rate, "rule": preference_rule_text(alpha, min(R, C) - 1, 2000)}
    if big:
        out.update(simulated_power=_normal_power(R, C, margin, alpha, two_sided=True,
                                                 decisive_share=share, rater_sd=h),
                   simulated_power_se=None, any_preference_at_chance=None)
        return out
    null = simulate_preference(R, C, win_rate=0.5, tie_rate=tie_rate, rater_sd=heterogeneity,
                               alpha=alpha, studies=studies, reps=reps, seed=seed + 1)
    out.update(simulated_power=pw(R), simulated_power_se=mc_se(pw(R), studies),
               any_preference_at_chance=null["any preference"])
    return out


# -- the pigeonhole bootstrap of a mean, one replicate per row ----------------------------------

def cluster_bootstrap(values, raters, clips, *, reps: int = 1000, seed: int = 0,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """Bootstrap replicates of the mean of ``values``, clustered over raters and clips.

    Returns ``reps`` replicate means (two-way pigeonhole bootstrap, vectorised); a replicate
    that drew no observed (rater, clip) cell is NaN."""
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
    means[tot == 0] = np.nan
    return means
