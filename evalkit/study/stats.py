"""Statistics of a study: the rules and tests, pure functions on arrays (no database, no files).
Their Monte Carlo is :mod:`.simulate`, the planner that sizes a study for them :mod:`.planning`.

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
   power grows with clips per rater: :func:`.planning.plan` gives each rater :func:`.planning.spread_clips` clips
   (margin 0.1: 41; 0.05: 159), and :func:`.planning.design_check` judges achieved designs on those
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
:func:`.planning.plan` returns for margins 0.05-0.2 at 15-100 clips:

* "indistinguishable" said when the true mean accuracy is at the boundary ``0.5 + margin``:
  <= 5% (within one Monte Carlo standard error);
* "distinguishable" said when everyone guesses: <= 5% (exact, see 3);
* "indistinguishable" said when everyone guesses: >= the planned power at the size of
  :func:`.planning.plan`; one clip at accuracy ``clip_accuracy`` is flagged >= ``clip_power``.

The rule as stated meets these at those sizes, so the ABX rule is unchanged. One limit, found
by the simulations: with few raters and many clips at a small margin (12 raters x 40 clips at
margin 0.05: 5%; 23 raters x 100 clips: 12%), a population in which 10% of raters see the
difference well ("golden ears", 0.95) and the rest barely is under-represented: a sample
without any golden ear (0.9^23 = 9%) looks like raters at chance with a tight bound, and no
bound computed from that sample can know better. :func:`.planning.plan` therefore also simulates the
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
first "indistinguishable" inflates the error at the boundary (:func:`.simulate.simulate_abx_peeking`
measures by how much); the product shows no verdict before the planned number of included
raters (the caller reports "interim"), so peeking cannot change the decision.

Catch screening
---------------
A rater passes when their correct catch answers ``k >= catch_min_correct(n)``: the smallest k
with P(Binomial(n, 0.5) >= k) <= alpha, i.e. better than guessing on the easy catch trials.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

Z95 = 1.6448536269514722

#: the version of the planner's and design_check's rules (:mod:`.planning`), part of their
#: disk-cache key (:mod:`.simcache`): bump it when what they return changes (2: the clips floor
#: of :func:`.planning.spread_clips`, the weak scenarios in the boundary checks)
RULE_VERSION = 2
MIN_RATERS = 12
MIN_CLIPS = 15
MAX_RATERS = 100_000


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
        raise ValueError(
            f"catch screening: {n} catch trials cannot show better than guessing "
            f"at alpha {alpha:g} (all {n} right has p = {0.5**n:.3g})"
        )
    return int(ks[ok][0])


def catch_error_rates(n: int, p_attentive: float = 0.95, alpha: float = 0.05) -> tuple[float, float]:
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
    return {
        "accuracy_limit": acc,
        "proportion_discriminators": 2 * margin,
        "d_prime": d_prime_abx(acc, "differencing"),
        "d_prime_independent_observation": d_prime_abx(acc, "independent"),
        "d_prime_model": "ABX differencing (Macmillan & Creelman 2005, ch. 9)",
    }


def _margin_text(margin: float) -> str:
    m = margin_terms(margin)
    return (
        f"margin {margin:g}: accuracy < {m['accuracy_limit']:g}, i.e. fewer than "
        f"{100 * m['proportion_discriminators']:.3g}% discriminators, d' < "
        f"{m['d_prime']:.2f}"
    )


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


def draw_counts(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
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


def t_quantile(q: float, df) -> np.ndarray:
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
BELOW_CHANCE_SPLIT = {
    "raters": 0.05,
    "clips": 0.05,
    "overall": 0.1,
    "rater_dispersion": 0.5,
    "clip_dispersion": 0.3,
}
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
        obs = stat[idx] * (1 - 1e-9) - 1e-9  # exact ties count as hits
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


def abx_rule(
    Y: np.ndarray, N: np.ndarray | None, wr: np.ndarray, wc: np.ndarray, *, margin: float, alpha: float
) -> dict:
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
    t = float(t_quantile(1 - alpha, df))
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
    return {
        "n": n,
        "k": k,
        "accuracy": acc,
        "p_value": p_all,
        "nc": nc,
        "kc": kc,
        "p_clip": p_clip,
        "p_holm": p_holm,
        "flagged": flagged,
        "sd": sd,
        "df": df,
        "t": t,
        "upper": upper,
        "overall_significant": overall_sig,
        "distinguishable": dist,
        "indistinguishable": indist,
        "nr": nr,
        "kr": kr,
        "p_rater_low": p_rater_low,
        "p_rater_low_holm": p_rater_low_holm,
        "rater_low": rater_low,
        "p_clip_low": p_clip_low,
        "p_clip_low_holm": p_clip_low_holm,
        "clip_low": clip_low,
        "p_overall_low": p_overall_low,
        "overall_low": overall_low,
        "p_rater_dispersion": p_disp_r,
        "p_clip_dispersion": p_disp_c,
        "rater_dispersion": disp_r,
        "clip_dispersion": disp_c,
        "below_chance": below,
        "visible_bound": vbound,
        "covered": covered,
    }


def abx_rule_text(margin: float, alpha: float, raters: int, clips: int, reps: int) -> str:
    """One line stating the ABX rule with its numbers (what :func:`decide_abx` computes)."""
    df = min(raters, clips) - 1
    tq = f"t({1 - alpha:g}, df={df})" if df >= 1 else "t(df<1: no bound)"
    sp = BELOW_CHANCE_SPLIT
    return (
        f"DISTINGUISHABLE if the exact one-sided binomial test of all ratings gives "
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
        f"INCONCLUSIVE (alpha {alpha:g})"
    )


def decide_abx(
    raters: Sequence[Hashable],
    clips: Sequence[Hashable],
    correct: Sequence,
    *,
    margin: float,
    alpha: float = 0.05,
    reps: int = 2000,
    seed: int = 0,
) -> dict:
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
    base = {
        "margin": margin,
        "alpha": alpha,
        "reps": reps,
        "seed": seed,
        "margin_terms": margin_terms(margin),
    }
    if y.size == 0:
        return {
            **base,
            "verdict": "no data",
            "rule": "no test ratings",
            "n": 0,
            "correct": 0,
            "accuracy": None,
            "p_value": None,
            "p_text": "n/a",
            "upper_bound": None,
            "t": None,
            "df": None,
            "sd": None,
            "raters": 0,
            "clips": 0,
            "per_clip": [],
            "flagged": [],
            "below_chance": None,
            "blocked": [],
        }
    s, n, rlab, clab = _cells(raters, clips, y)
    R, C = s.shape
    rng = np.random.default_rng(seed)
    wr = draw_counts(rng, R, (1, reps))
    wc = draw_counts(rng, C, (1, reps))
    o = abx_rule(s[None], n[None], wr, wc, margin=margin, alpha=alpha)
    verdict = (
        "distinguishable"
        if o["distinguishable"][0]
        else "indistinguishable"
        if o["indistinguishable"][0]
        else "inconclusive"
    )
    per_clip = [
        {
            "clip": lab,
            "ratings": int(o["nc"][0, j]),
            "correct": int(o["kc"][0, j]),
            "accuracy": float(o["kc"][0, j] / o["nc"][0, j]),
            "p_value": float(o["p_clip"][0, j]),
            "p_holm": float(o["p_holm"][0, j]),
            "flagged": bool(o["flagged"][0, j]),
            "p_low": float(o["p_clip_low"][0, j]),
            "p_low_holm": float(o["p_clip_low_holm"][0, j]),
            "below_chance": bool(o["clip_low"][0, j]),
        }
        for j, lab in enumerate(clab)
    ]
    low_raters = [
        {
            "rater": lab,
            "ratings": int(o["nr"][0, i]),
            "correct": int(o["kr"][0, i]),
            "p_low": float(o["p_rater_low"][0, i]),
            "p_low_holm": float(o["p_rater_low_holm"][0, i]),
        }
        for i, lab in enumerate(rlab)
        if o["rater_low"][0, i]
    ]
    low_clips = [
        {k: e[k] for k in ("clip", "ratings", "correct", "p_low", "p_low_holm")}
        for e in per_clip
        if e["below_chance"]
    ]
    reasons = []
    if low_raters:
        reasons.append(
            "rater"
            + ("s " if len(low_raters) > 1 else " ")
            + ", ".join(f"{e['rater']} ({e['correct']} of {e['ratings']})" for e in low_raters)
            + " below chance"
        )
    if low_clips:
        reasons.append(
            "clip"
            + ("s " if len(low_clips) > 1 else " ")
            + ", ".join(f"{e['clip']} ({e['correct']} of {e['ratings']})" for e in low_clips)
            + " below chance"
        )
    if o["overall_low"][0]:
        reasons.append(f"all ratings below chance (p {format_p(float(o['p_overall_low'][0]))})")
    if o["rater_dispersion"][0]:
        reasons.append(
            "raters' accuracies spread around 0.5 beyond chance (p "
            f"{format_p(float(o['p_rater_dispersion'][0]))})"
        )
    if o["clip_dispersion"][0]:
        reasons.append(
            "clips' accuracies spread around 0.5 beyond chance (p "
            f"{format_p(float(o['p_clip_dispersion'][0]))})"
        )
    # the raters below 0.5 by an unadjusted exact test: named when a pooled check fires
    lowest = [
        {
            "rater": lab,
            "ratings": int(o["nr"][0, i]),
            "correct": int(o["kr"][0, i]),
            "p_low": float(o["p_rater_low"][0, i]),
        }
        for i, lab in enumerate(rlab)
        if o["p_rater_low"][0, i] <= alpha
    ]
    if o["below_chance"][0] and lowest and not low_raters:
        reasons.append(
            "lowest: rater"
            + ("s " if len(lowest) > 1 else " ")
            + ", ".join(f"{e['rater']} ({e['correct']} of {e['ratings']})" for e in lowest)
            + f" (each below 0.5 at p <= {alpha:g} "
            "unadjusted)"
        )
    below = {
        "found": bool(o["below_chance"][0]),
        "raters": low_raters,
        "clips": low_clips,
        "lowest_raters": lowest,
        "overall_p": float(o["p_overall_low"][0]),
        "rater_dispersion_p": float(o["p_rater_dispersion"][0]),
        "clip_dispersion_p": float(o["p_clip_dispersion"][0]),
        "reasons": reasons,
    }
    finite = math.isfinite(o["t"])
    vb, lim = float(o["visible_bound"][0]), visible_share_limit(margin)
    blocked = []
    if verdict == "inconclusive" and finite and o["upper"][0] < 0.5 + margin:
        if below["found"]:
            blocked.append("below chance, which is seen and answered against: " + "; ".join(reasons))
        if not o["covered"][0]:
            blocked.append(
                f"the bound on the share of visibly different clips, {vb:.3g}, "
                f"does not exclude {lim:g} (2 x margin; {C} clips with "
                f"{int(o['nc'][0].min())} ratings each)"
            )
    return {
        **base,
        "verdict": verdict,
        "rule": abx_rule_text(margin, alpha, R, C, reps),
        "n": int(o["n"][0]),
        "correct": int(o["k"][0]),
        "accuracy": float(o["accuracy"][0]),
        "p_value": float(o["p_value"][0]),
        "p_text": format_p(float(o["p_value"][0])),
        "upper_bound": float(o["upper"][0]) if finite else None,
        "t": o["t"] if finite else None,
        "df": o["df"],
        "sd": float(o["sd"][0]),
        "raters": R,
        "clips": C,
        "per_clip": per_clip,
        "flagged": [e["clip"] for e in per_clip if e["flagged"]],
        "below_chance": below,
        "visible_share_bound": vb,
        "visible_share_limit": lim,
        "covered": bool(o["covered"][0]),
        "blocked": blocked,
    }


# -- preference ------------------------------------------------------------------------------

_B = {1, "b", "B"}  # 1 == 1.0 == True: bools are refused below
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
        codes = np.arange(2**raters)[:, None] >> np.arange(raters)[None, :]
        return 1.0 - 2.0 * (codes & 1)
    return 1.0 - 2.0 * rng.integers(0, 2, size=(SIGN_FLIPS, raters))


def _flip_p(d: np.ndarray, flips: np.ndarray) -> np.ndarray:
    """Two-sided p of the rater-level sign-flip test of sum(d) = 0, per study: ``d`` (S, R) the
    raters' net preferences (wins of B minus wins of A), ``flips`` from :func:`sign_flips`."""
    obs = np.abs(d.sum(axis=1))
    hits = (np.abs(d @ flips.T) >= obs[:, None] - 0.5).sum(axis=1)  # integer sums
    exact = flips.shape[0] == 2 ** flips.shape[1]
    return hits / flips.shape[0] if exact else (hits + 1) / (flips.shape[0] + 1)


def preference_rule(
    W: np.ndarray, D: np.ndarray, wr: np.ndarray, wc: np.ndarray, *, alpha: float, flips: np.ndarray
) -> dict:
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
    t = t_quantile(1 - alpha / 2, df)
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
    return {
        "wins": wins,
        "decisive": dec,
        "win_rate": est,
        "sd": sd,
        "df": df,
        "t": t,
        "lo": lo,
        "hi": hi,
        "sign_p": sign_p,
        "degenerate": degenerate,
        "flip_p": flip_p,
        "b_preferred": b_pref,
        "a_preferred": a_pref,
    }


def preference_rule_text(alpha: float, df: int, reps: int) -> str:
    """One line stating the preference rule with its numbers (what :func:`decide_preference`
    computes)."""
    tq = f"t({1 - alpha / 2:g}, df={df})" if df >= 1 else "t(df<1: no claim)"
    return (
        f"B PREFERRED / A PREFERRED if the two-sided interval win rate of B +- {tq} x SD "
        f"excludes 0.5, SD = sqrt(m/(m-1)) x standard deviation of {reps} two-way cluster "
        f"bootstrap replicates of B's win rate over decisive ratings (ties left out), m = "
        f"min(raters, clips with a decisive rating) = {df + 1}, df = m - 1 (SD 0: the exact "
        f"sign test at {alpha:g} decides), and the rater-level sign-flip test of the raters' "
        f"net preferences (wins of B minus wins of A) gives p <= {alpha:g}; otherwise NO "
        f"PREFERENCE SHOWN (alpha {alpha:g}; a preference study never claims "
        f"indistinguishable: use ABX)"
    )


def decide_preference(
    raters: Sequence[Hashable],
    clips: Sequence[Hashable],
    choices: Sequence,
    *,
    alpha: float = 0.05,
    reps: int = 2000,
    seed: int = 0,
) -> dict:
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
        return {
            **base,
            "verdict": "no data",
            "rule": "no test ratings",
            "wins_b": 0,
            "wins_a": 0,
            "ties": 0,
            "tie_rate": None,
            "decisive": 0,
            "win_rate_b": None,
            "ci": [None, None],
            "p_value": None,
            "p_text": "n/a",
            "sign_p": None,
            "sign_p_text": "n/a",
            "t": None,
            "df": None,
            "sd": None,
            "raters": 0,
            "clips": 0,
            "per_clip": [],
        }
    W, _, rlab, clab = _cells(raters, clips, win)
    D, _, _, _ = _cells(raters, clips, dec)
    rng = np.random.default_rng(seed)
    wr = draw_counts(rng, len(rlab), (1, reps))
    wc = draw_counts(rng, len(clab), (1, reps))
    o = preference_rule(W[None], D[None], wr, wc, alpha=alpha, flips=sign_flips(rng, len(rlab)))
    wins_b, decisive = int(o["wins"][0]), int(o["decisive"][0])
    wins_a, ties = decisive - wins_b, n - decisive
    df = int(o["df"][0])
    t = float(o["t"][0])
    sd = float(o["sd"][0])
    est = float(o["win_rate"][0]) if decisive else None
    if decisive and df >= 1:
        from scipy.stats import t as student_t

        dev = abs(est - 0.5)
        p = float(o["sign_p"][0]) if sd == 0 else float(min(1.0, 2 * student_t.sf(dev / sd, df)))
        ci = [max(0.0, float(o["lo"][0])), min(1.0, float(o["hi"][0]))]
    else:
        p, ci = None, [None, None]
    verdict = (
        "B preferred"
        if o["b_preferred"][0]
        else "A preferred"
        if o["a_preferred"][0]
        else "no preference shown"
    )
    per_clip = []
    counts = np.bincount(_index(list(clips))[0], minlength=len(clab))
    for j, lab in enumerate(clab):
        wb, d = int(W[:, j].sum()), int(D[:, j].sum())
        ratings = int(counts[j])
        per_clip.append(
            {
                "clip": lab,
                "ratings": ratings,
                "wins_b": wb,
                "wins_a": d - wb,
                "ties": ratings - d,
                "win_rate_b": wb / d if d else None,
                "sign_p": binom_p(wb, d, "two-sided"),
            }
        )
    sign_p = binom_p(wins_b, decisive, "two-sided")
    return {
        **base,
        "verdict": verdict,
        "rule": preference_rule_text(alpha, df, reps),
        "wins_b": wins_b,
        "wins_a": wins_a,
        "ties": ties,
        "tie_rate": ties / n,
        "decisive": decisive,
        "win_rate_b": est,
        "ci": ci,
        "p_value": p,
        "p_text": format_p(p),
        "sign_p": sign_p,
        "sign_p_text": format_p(sign_p),
        "flip_p": float(o["flip_p"][0]),
        "flip_p_text": format_p(float(o["flip_p"][0])),
        "t": t if math.isfinite(t) else None,
        "df": df,
        "sd": sd,
        "raters": len(rlab),
        "clips": len(clab),
        "per_clip": per_clip,
    }


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


def visible_share_bound(
    flagged,
    clips: int,
    ratings_per_clip: int,
    *,
    alpha: float = 0.05,
    visible_accuracy: float = VISIBLE_ACCURACY,
    level: float = 0.95,
):
    """Upper bound (one-sided, ``level``) on the share of clips like these (the population the
    ``clips`` were drawn from at random) whose ABX accuracy is at least ``visible_accuracy``,
    from ``flagged`` of them flagged by the clip veto. Each such clip is flagged with
    probability at least ``power`` (exact binomial at the first Holm step with
    ``ratings_per_clip`` ratings, :func:`clip_veto_power`), so the flagged count is at least
    Binomial(clips, share x power): the Clopper-Pearson bound of the flagged share divided by
    ``power``, at most 1. Returns ``(bound, power)``; vectorised over ``flagged``."""
    power = clip_veto_power(int(ratings_per_clip), int(clips), alpha, visible_accuracy)
    cp = clopper_pearson_upper(flagged, clips, level)
    with np.errstate(divide="ignore"):
        b = np.minimum(1.0, cp / power) if power > 0 else np.ones_like(cp)
    return b, power


def coverage(
    selection: str,
    clips: int,
    of: int | None,
    flagged: int,
    ratings_per_clip: int,
    *,
    alpha: float = 0.05,
    visible_accuracy: float = VISIBLE_ACCURACY,
) -> dict:
    """What a verdict covers, from how its clips were chosen (``selection``: a ``--clips`` spec:
    ``sample:N``, ``worst:N`` or ``all``), how many (``clips``, of ``of`` compared in the
    report; None when unknown) and how many were flagged. A random sample (and ``all``, taken
    as a sample of clips like these) gets :func:`visible_share_bound`; ``worst:N`` covers the
    N clips with the highest LPIPS mean of the report and bounds nothing beyond them.
    Returns ``{"selection", "clips", "of", "flagged", "visible_accuracy", "flag_power",
    "bound", "text"}`` (``bound`` None for ``worst``)."""
    kind = selection.split(":", 1)[0] if selection else "all"
    b, power = visible_share_bound(
        flagged, clips, ratings_per_clip, alpha=alpha, visible_accuracy=visible_accuracy
    )
    b = float(b)
    out = {
        "selection": selection,
        "clips": clips,
        "of": of,
        "flagged": flagged,
        "visible_accuracy": visible_accuracy,
        "flag_power": power,
        "bound": b,
    }
    of_txt = f" of {of}" if of else ""
    why = (
        f"one-sided 95% bound from {flagged} of {clips} flagged: Clopper-Pearson"
        + (f" 1 - 0.05^(1/{clips})" if flagged == 0 else "")
        + f" = {float(clopper_pearson_upper(flagged, clips)):.3g}, over the chance "
        f"{power:.2f} that the clip veto flags a clip at accuracy {visible_accuracy:g} "
        f"with {ratings_per_clip} ratings"
    )
    if power <= 0:
        why = (
            f"no bound: with {ratings_per_clip} ratings per clip the clip veto cannot flag a "
            f"clip at accuracy {visible_accuracy:g}"
        )
    if kind == "worst":
        out["bound"] = None
        out["text"] = (
            f"covers the {clips} clips{of_txt} with the highest LPIPS mean in the "
            f"report ({selection}: chosen by the metric, not at random), {flagged} "
            "flagged; it bounds nothing about the other clips (their LPIPS is lower, "
            "which says they differ less only as far as LPIPS ranks what people see)"
        )
    elif kind == "sample":
        out["text"] = (
            f"covers {clips} clips drawn at random{of_txt} ({selection}), {flagged} "
            f"flagged: at most {100 * b:.3g}% of clips like these are visibly "
            f"different (ABX accuracy >= {visible_accuracy:g}; {why})"
        )
    else:
        out["text"] = (
            f"covers every compared clip ({clips}{of_txt}), {flagged} flagged; as a "
            f"sample of clips like these: at most {100 * b:.3g}% visibly different "
            f"(ABX accuracy >= {visible_accuracy:g}; {why})"
        )
    return out


def clips_for_bound(
    target: float,
    ratings_per_clip: int,
    *,
    alpha: float = 0.05,
    visible_accuracy: float = VISIBLE_ACCURACY,
    start: int = 1,
) -> int:
    """The fewest clips, from ``start``, drawn at random whose :func:`visible_share_bound` with
    none flagged is at most ``target`` (ValueError when the flag power makes it unreachable)."""
    if not 0 < target < 1:
        raise ValueError(f"--visible-bound: expected a share in (0, 1), found {target}")
    c = max(1, int(start), math.ceil(math.log(0.05) / math.log(1 - target)))
    while True:
        b, power = visible_share_bound(0, c, ratings_per_clip, alpha=alpha, visible_accuracy=visible_accuracy)
        if float(b) <= target:
            return c
        if power <= target or c > 100_000:
            raise ValueError(
                f"--visible-bound {target:g}: not reachable with {ratings_per_clip} ratings per clip"
            )
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
    d_e = (n * n - (n_c**2).sum()) / (n - 1)
    if d_e == 0:  # one category only: agreement is undefined, not perfect
        return None
    return float(1 - d_o / d_e)


# -- Monte Carlo -----------------------------------------------------------------------------


#: bootstrap replicates of every ABX and preference verdict (fixed: ``study results --reps``
#: cannot re-draw a verdict)
VERDICT_REPS = 1000


def verdict_seed(study_seed: int) -> int:
    """The bootstrap seed of a study's verdict, derived from the study seed (fixed per study:
    the same ratings always give the same verdict)."""
    import hashlib

    h = hashlib.sha256(f"evalkit verdict bootstrap {int(study_seed)}".encode()).digest()
    return int.from_bytes(h[:8], "big")


#: the verdict of a study whose key was opened before its planned raters were complete, where
#: its rule would have said "indistinguishable"
UNBLINDED_EARLY = "unblinded early"


def after_unblinding(verdict: str, unblinded_early: bool) -> str:
    """The verdict as reported: a study whose key was opened before its planned included raters
    were complete (a logged unblinding) never claims "indistinguishable" (a look can steer
    when a study stops, which the rule's error rate does not allow for); every other verdict
    stands, with the unblinding reported beside it."""
    return UNBLINDED_EARLY if unblinded_early and verdict == "indistinguishable" else verdict


# -- planning --------------------------------------------------------------------------------


# -- the pigeonhole bootstrap of a mean, one replicate per row ----------------------------------


def cluster_bootstrap(
    values, raters, clips, *, reps: int = 1000, seed: int = 0, rng: np.random.Generator | None = None
) -> np.ndarray:
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


def clip_veto_power(R: int, C: int, alpha: float, clip_accuracy: float) -> float:
    """Exact power to flag one clip at ``clip_accuracy`` with R ratings, at the first Holm
    step (alpha / 2 / C; conservative for the full procedure)."""
    from scipy.stats import binom

    ks = np.arange(R + 1)
    ok = _sf_half(ks, R) <= alpha / 2 / C
    if not ok.any():
        return 0.0
    k = int(ks[ok][0])
    return float(binom.sf(k - 1, R, clip_accuracy))
