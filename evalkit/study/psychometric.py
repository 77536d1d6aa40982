"""Psychometric fit of a threshold study: pure functions on arrays (numpy/scipy; no SQL, no I/O).

Model
-----
Every test trial of the threshold protocol is a forced choice (ABX) between the reference clip A
and a stimulus whose difference from A, measured by a metric (LPIPS mean), is ``x > 0``. The
probability of a correct answer is

    p(x) = guess + (1 - guess - lapse) * F(x),      guess = 0.5 (two alternatives)

with ``F`` rising from 0 to 1 (Wichmann & Hill 2001a, "The psychometric function: I. Fitting,
sampling, and goodness of fit", Percept. Psychophys. 63:1293-1313, eq. 1; Prins & Kingdom,
*Psychophysics: A Practical Introduction*, 2nd ed. 2016, ch. 4):

* ``model="weibull"`` (default): ``F = 1 - exp(-ln2 * (x / threshold) ** slope)``, a Weibull in x
  (a Gumbel in log x), parametrised so that ``F(threshold) = 0.5``;
* ``model="logistic"``: ``F = 1 / (1 + (x / threshold) ** -slope)``, a logistic in log x.

Threshold. ``threshold`` is the x at which ``F = 0.5``: the level at which half of a rater's
non-lapse trials are discriminations (under the high-threshold reading of F: on a fraction F of
the trials the rater sees the difference and answers right, on the others guesses), i.e. the
level at which a rater who never lapses is right 75% of the time (``criterion`` 0.75 =
``guess + (1 - guess) * 0.5``). With a lapse rate the observed accuracy there is
``0.75 - lapse / 2``; defining the threshold on F and fitting the lapse rate (rather than fixing
it at 0) keeps lapses from biasing the threshold and the slope (Wichmann & Hill 2001a, sec. 2.2;
Prins & Kingdom sec. 4.3.1). ``lapse`` is bounded to ``[0, LAPSE_MAX]`` = [0, 0.06] (Wichmann &
Hill's range), the slope to :data:`SLOPE_BOUNDS`, and the threshold's search to the tested range
widened by a factor :data:`EXTRAPOLATE` on either side. Pooled over raters and clips, F is the
population's: the proportion of (rater, clip) pairs, in the mean, that see the difference.

Fit: maximum likelihood (binomial) on the counts per stimulus: a vectorised Fisher-scoring /
Levenberg-Marquardt solver from the best of a grid of starts (thresholds across the range x 3
slopes) and, for bootstrap replicates, from the original estimate; for the
point estimate polished by ``scipy.optimize.minimize`` (SLSQP within the bounds) from
several starts. Data that are all correct or all at chance drive the estimate to a bound: the
threshold is then reported as a bound only (see below), never as a number.

Goodness of fit: the deviance against the saturated model (one probability per stimulus),
``df = stimuli - 3``, with its p-value from a parametric bootstrap (simulate the fitted model at
the same counts, refit, compare the deviances; Wichmann & Hill 2001a sec. 3, who show the
chi-square reference is unreliable at the small counts per stimulus of such studies). Pooled over
raters and clips of different sensitivity, the binomial model is over-dispersed and the deviance
often large: a poor fit says the curve is an average of different observers; the interval
(below) does not rely on the binomial model.

Intervals: a bootstrap clustered over raters and clips. Pooled: raters and clips are resampled
independently with replacement (two-way "pigeonhole" bootstrap, Owen 2007, Ann. Appl. Stat.
1:386-411; each trial is weighted by its rater's times its clip's draw count) and the model is
refitted to every replicate; the interval is the percentile interval of the replicates'
thresholds. Per clip: raters are resampled, and the interval is Hesterberg's *expanded*
percentile interval (:func:`expanded_alpha`) computed for one unit fewer than the clip's raters:
with 8-12 raters the plain percentile interval covered the truth 87-92% of the time instead of
95%, Hesterberg's rule with n units 91-95%, with n - 1 units 94-96% (150 studies per cell,
``benchmarks/results/threshold_sim_rules.txt``; the grid: 95-97%). (The pooled two-way interval
needs no expansion where clips are alike: the pigeonhole bootstrap over-estimates the variance,
which offsets the few-cluster narrowness; see "Few clips that differ" below.) Replicates whose threshold hits a search bound count as beyond it: an interval end
among them is ``None`` (open). The replicates are refitted by the vectorised solver (from the
estimate and from the grid's best start, no polish).
Headroom = threshold / reference, where the reference is the metric value of the real backend
difference (k = 1), per clip, and pooled the geometric mean of the clips' references
(recomputed in each replicate from the resampled clips).

Threshold outside the tested range: the threshold is reported only when the estimate lies within
the smallest and largest x shown. Above the largest: ``threshold`` is None and ``ci`` is
``[lower bound, None]`` (a one-sided bound at level ``1 - (1 - confidence) / 2``, clamped to
the largest x: beyond it the bound would rest on the model's tail alone); below the smallest:
``[None, upper bound]`` (clamped to the smallest x). ``notes`` says so in words.

Few clips that differ: the pooled interval rests on the clips as units; with 4 clips whose log
thresholds have sd 0.6 it covered 88.5-91.5% (8 clips: 94%, 12: 95.5%). Below
:data:`FEW_CLIPS` clips whose estimated thresholds spread more than :data:`CLIP_SPREAD_NOTE`
(sd of log), ``notes`` says the pooled interval is likely too narrow.

The Monte Carlo checks (simulated raters with known psychometric functions, heterogeneous raters
and clips: :func:`.simulate.simulate_trials`, :func:`.simulate.population_threshold`,
:func:`.simulate.simulate_coverage`)
are in ``tests/test_psychometric.py`` (a fast slice) and ``benchmarks/bench_threshold_sim.py``
(results in ``benchmarks/results/threshold_sim.txt``).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Iterable

import numpy as np
from scipy import optimize, special

from .errors import StudyError

GUESS = 0.5
CRITERION = 0.75
LAPSE_MAX = 0.06
SLOPE_BOUNDS = (0.5, 15.0)
EXTRAPOLATE = 8.0
MODELS = ("weibull", "logistic")
#: per clip (raters resampled, one way): the expanded percentile interval with one unit fewer
#: than the clip's raters (see the module doc)
CLIP_EXPANDED = True
LN2 = math.log(2.0)
_EPS = 1e-10
_SLOPE_STARTS = np.log([1.0, 3.0, 10.0])
_M_STARTS = np.linspace(0.03, 0.97, 16)
_LAPSE_START = 0.02
_GRID_CELLS = 4_000_000  # batch x starts x stimuli evaluated at once by the grid start


class ThresholdError(StudyError):
    """Bad input to the threshold analysis (one line naming the trial or field)."""


# -- the model -------------------------------------------------------------------------------


def model_core(z: np.ndarray, model: str) -> tuple[np.ndarray, np.ndarray]:
    """F and dF/dz at ``z = slope * (log x - log threshold)``."""
    z = np.clip(z, -60.0, 60.0)
    if model == "weibull":
        e = LN2 * np.exp(z)
        q = np.exp(-e)
        return 1.0 - q, e * q
    s = special.expit(z)
    return s, s * (1.0 - s)


def psychometric(
    x, threshold, slope, lapse=0.0, *, model: str = "weibull", guess: float = GUESS
) -> np.ndarray:
    """``p(x) = guess + (1 - guess - lapse) F(x)`` with ``F(threshold) = 0.5`` (module doc)."""
    _check_model(model)
    z = np.asarray(slope, float) * (np.log(np.asarray(x, float)) - np.log(threshold))
    return guess + (1.0 - guess - np.asarray(lapse, float)) * model_core(z, model)[0]


def _check_model(model):
    if model not in MODELS:
        raise ThresholdError(f"model: expected one of {', '.join(MODELS)}, found {model!r}")


def _loglik(theta, lx, N, K, model):
    """Binomial log-likelihood per batch row. theta (G, 3) = (log threshold, log slope, lapse);
    lx, N, K: (G, M) or broadcastable."""
    m, s, lam = theta[:, 0:1], theta[:, 1:2], theta[:, 2:3]
    beta = np.exp(s)
    z = beta * (lx - m)
    F, dF = model_core(z, model)
    a = 1.0 - GUESS - lam
    p = np.clip(GUESS + a * F, _EPS, 1.0 - _EPS)
    ll = (K * np.log(p) + (N - K) * np.log1p(-p)).sum(-1)
    return ll, p, F, dF, z, beta, a


def _saturated(N, K):
    q = np.divide(K, N, out=np.zeros_like(K, dtype=float), where=N > 0)
    return (special.xlogy(K, q) + special.xlogy(N - K, 1.0 - q)).sum(-1)


def _grid_start(lx, N, K, lo, hi, model):
    """The best start of each slope of the grid (thresholds across the search range), per batch
    row: (G, slopes, 3)."""
    G, M = N.shape
    lxb = np.broadcast_to(lx, (G, M))
    ms = lo[:, 0:1] + (hi[:, 0:1] - lo[:, 0:1]) * _M_STARTS[None, :]  # (G, nm)
    S = len(_SLOPE_STARTS)
    nm = ms.shape[1]
    best = np.empty((G, S, 3))
    chunk = max(1, _GRID_CELLS // (nm * S * M))
    a = 1.0 - GUESS - _LAPSE_START
    for g0 in range(0, G, chunk):
        g1 = min(G, g0 + chunk)
        z = np.exp(_SLOPE_STARTS)[None, :, None, None] * (
            lxb[g0:g1, None, None, :] - ms[g0:g1, None, :, None]
        )  # (g, S, nm, M)
        p = np.clip(GUESS + a * model_core(z, model)[0], _EPS, 1 - _EPS)
        ll = (K[g0:g1, None, None, :] * np.log(p) + (N - K)[g0:g1, None, None, :] * np.log1p(-p)).sum(
            -1
        )  # (g, S, nm)
        i = ll.argmax(2)
        best[g0:g1, :, 0] = np.take_along_axis(ms[g0:g1], i, 1)
    best[:, :, 1] = _SLOPE_STARTS
    best[:, :, 2] = _LAPSE_START
    return np.clip(best, lo[:, None], hi[:, None])


def fit_batch(lx, N, K, lo, hi, model, theta0=None, iters=60):
    """Maximum likelihood for every batch row at once, from two starts (the best point of the
    grid of :func:`_grid_start`, and ``theta0`` when given), keeping the better optimum:
    :func:`_lm`. Returns (theta, loglik). (Refining the best start of every slope of the grid
    instead found the same optima as often, at 1.8x the time.)"""
    N = np.asarray(N, float)
    K = np.asarray(K, float)
    G, M = N.shape
    starts = _grid_start(lx, N, K, lo, hi, model)
    lls = np.stack([_loglik(starts[:, i], lx, N, K, model)[0] for i in range(starts.shape[1])], 1)
    starts = starts[np.arange(G), lls.argmax(1)][:, None]
    if theta0 is not None:
        starts = np.concatenate([starts, np.clip(theta0, lo, hi)[:, None]], 1)
    S = starts.shape[1]
    lxb = np.broadcast_to(lx, (G, M))
    rep = lambda a: np.repeat(a, S, 0)  # noqa: E731
    theta, ll = _lm(starts.reshape(G * S, 3), rep(lxb), rep(N), rep(K), rep(lo), rep(hi), model, iters)
    ll = ll.reshape(G, S)
    i = ll.argmax(1)
    return theta.reshape(G, S, 3)[np.arange(G), i], ll[np.arange(G), i]


def _lm(theta, lx, N, K, lo, hi, model, iters):
    """Projected Fisher scoring with Levenberg-Marquardt damping within the box ``[lo, hi]``
    (G, 3), every row from its start ``theta``; a row stops when a step gains less than 1e-7 in
    log-likelihood and moves the log threshold less than 1e-5, or after ``iters`` steps."""
    G, M = N.shape
    theta = theta.copy()
    lx = np.broadcast_to(lx, (G, M))
    ll, *q = _loglik(theta, lx, N, K, model)
    Q = np.stack(q[:4])  # p, F, dF, z at the current point
    mu = np.full(G, 1e-3)
    live = np.arange(G)
    for _ in range(iters):
        if live.size == 0:
            break
        th = theta[live]
        lxi, Ni, Ki = lx[live], N[live], K[live]
        p, F, dF, z = Q
        beta = np.exp(th[:, 1:2])
        a = 1.0 - GUESS - th[:, 2:3]
        v = p * (1.0 - p)
        d0 = a * dF * -beta
        d1 = a * dF * z
        d2 = -F
        r = (Ki - Ni * p) / v
        w = Ni / v
        g = np.stack([(r * d0).sum(1), (r * d1).sum(1), (r * d2).sum(1)], -1)
        w0, w1 = w * d0, w * d1
        A = np.stack(
            [
                (w0 * d0).sum(1),
                (w0 * d1).sum(1),
                (w0 * d2).sum(1),
                (w1 * d1).sum(1),
                (w1 * d2).sum(1),
                (w * d2 * d2).sum(1),
            ],
            -1,
        )
        act = ((th <= lo[live] + 1e-12) & (g < 0)) | ((th >= hi[live] - 1e-12) & (g > 0))
        g[act] = 0.0
        free = ~act
        a00, a01, a02, a11, a12, a22 = A.T
        # an active bound: its row and column out of the system (unit diagonal, zero gradient)
        a01 = a01 * (free[:, 0] & free[:, 1])
        a02 = a02 * (free[:, 0] & free[:, 2])
        a12 = a12 * (free[:, 1] & free[:, 2])
        diag = np.stack([a00, a11, a22], -1) * free
        ridge = 1e-9 * diag.max(1, keepdims=True) + 1e-12
        diag = diag * (1.0 + mu[live, None]) + ridge + act
        a00, a11, a22 = diag.T
        c00 = a11 * a22 - a12 * a12
        c01 = a02 * a12 - a01 * a22
        c02 = a01 * a12 - a02 * a11
        c11 = a00 * a22 - a02 * a02
        c12 = a01 * a02 - a00 * a12
        c22 = a00 * a11 - a01 * a01
        det = a00 * c00 + a01 * c01 + a02 * c02
        g0, g1, g2 = g.T
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (
                np.stack(
                    [
                        c00 * g0 + c01 * g1 + c02 * g2,
                        c01 * g0 + c11 * g1 + c12 * g2,
                        c02 * g0 + c12 * g1 + c22 * g2,
                    ],
                    -1,
                )
                / det[:, None]
            )
        step[~np.isfinite(step).all(1)] = 0.0
        new = np.clip(th + step, lo[live], hi[live])
        ll_new, *q = _loglik(new, lxi, Ni, Ki, model)
        ok = ll_new > ll[live] + 1e-13
        gain = np.where(ok, ll_new - ll[live], 0.0)
        theta[live[ok]] = new[ok]
        ll[live[ok]] = ll_new[ok]
        mu[live] = np.where(ok, np.maximum(mu[live] / 4.0, 1e-7), mu[live] * 6.0)
        done = (ok & (gain < 1e-7) & (np.abs(new[:, 0] - th[:, 0]) < 1e-5)) | (mu[live] > 1e7)
        keep = ~done
        # the next iteration's quantities: the new point where accepted, else the old one
        Qn = np.stack(q[:4])
        Q[:, ok] = Qn[:, ok]
        Q = Q[:, keep]
        live = live[keep]
    return theta, ll


def fit_bounds(xmin, xmax, lapse_max):
    xmin = np.atleast_1d(np.asarray(xmin, float))
    xmax = np.atleast_1d(np.asarray(xmax, float))
    lo = np.stack(
        [np.log(xmin / EXTRAPOLATE), np.full(xmin.shape, math.log(SLOPE_BOUNDS[0])), np.zeros(xmin.shape)], -1
    )
    hi = np.stack(
        [
            np.log(xmax * EXTRAPOLATE),
            np.full(xmin.shape, math.log(SLOPE_BOUNDS[1])),
            np.full(xmin.shape, float(lapse_max)),
        ],
        -1,
    )
    return lo, hi


def fit_psychometric(x, n, k, *, model: str = "weibull", lapse_max: float = LAPSE_MAX) -> dict:
    """Maximum-likelihood fit of one psychometric function to counts per stimulus: ``x`` (> 0),
    ``n`` trials and ``k`` correct. Returns threshold, slope, lapse (see the module doc), the
    log-likelihood, the deviance against the saturated model and ``at_bound`` ("lower"/"upper"
    when the threshold sits at a search bound, else None). Several starts: the grid of
    :func:`_grid_start` refined by Fisher scoring, then ``scipy.optimize.minimize`` (SLSQP)
    from that optimum and from the best grid starts of other thresholds."""
    _check_model(model)
    x = np.asarray(x, float)
    n = np.asarray(n, float)
    k = np.asarray(k, float)
    use = n > 0
    if use.sum() == 0:
        raise ThresholdError("fit: no trials")
    x, n, k = x[use], n[use], k[use]
    lo, hi = fit_bounds(x.min(), x.max(), lapse_max)
    lx = np.log(x)[None]
    theta, ll = fit_batch(lx, n[None], k[None], lo, hi, model)
    best, best_ll = theta[0], ll[0]

    def nll(t):
        ll_, p, F, dF, z, beta, a = _loglik(t[None], lx, n[None], k[None], model)
        v = p * (1 - p)
        r = (k - n * p[0]) / v[0]
        grad = np.array(
            [(r * a[0] * dF[0] * -beta[0]).sum(), (r * a[0] * dF[0] * z[0]).sum(), (r * -F[0]).sum()]
        )
        return -ll_[0], -grad

    starts = [best]
    for m0 in (0.5,):
        starts.append(np.array([lo[0, 0] + m0 * (hi[0, 0] - lo[0, 0]), math.log(2.0), _LAPSE_START]))
    bnds = list(zip(lo[0], hi[0]))
    for s0 in starts:
        try:
            res = optimize.minimize(nll, s0, jac=True, method="SLSQP", bounds=bnds)
        except (ValueError, FloatingPointError):  # pragma: no cover - defensive
            continue
        if np.isfinite(res.fun) and -res.fun > best_ll + 1e-9:
            best, best_ll = np.clip(res.x, lo[0], hi[0]), -res.fun
    dev = 2.0 * (_saturated(n, k) - best_ll)
    span = hi[0, 0] - lo[0, 0]
    at = (
        "lower"
        if best[0] <= lo[0, 0] + 1e-6 * span
        else "upper"
        if best[0] >= hi[0, 0] - 1e-6 * span
        else None
    )
    return {
        "threshold": float(math.exp(best[0])),
        "slope": float(math.exp(best[1])),
        "lapse": float(best[2]),
        "loglik": float(best_ll),
        "deviance": float(max(dev, 0.0)),
        "at_bound": at,
        "theta": best,
        "xmin": float(x.min()),
        "xmax": float(x.max()),
    }


# -- the bootstrap ---------------------------------------------------------------------------


def bootstrap_draws(rng, n: int, B: int) -> np.ndarray:
    """Draw counts (B, n): how often each of n units is drawn in n draws with replacement."""
    idx = rng.integers(0, n, size=(B, n)) + (np.arange(B) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=B * n).reshape(B, n).astype(float)


def _replicate_thresholds(theta, lo, hi):
    """log threshold per replicate, -inf / +inf where it sits at the lower / upper bound."""
    m = theta[:, 0].copy()
    span = hi[:, 0] - lo[:, 0]
    m[m <= lo[:, 0] + 1e-6 * span] = -np.inf
    m[m >= hi[:, 0] - 1e-6 * span] = np.inf
    return m


@functools.lru_cache(maxsize=256)
def expanded_alpha(confidence: float, units: int) -> float:
    """The tail probability of Hesterberg's expanded percentile interval (Hesterberg 2015, "What
    teachers should know about the bootstrap", Am. Stat. 69:371-386, sec. 4.4): with ``units``
    independent units resampled, the percentile interval is too narrow by the factors
    ``sqrt((n - 1) / n)`` (the bootstrap's divisor-n variance) and ``z / t(n - 1)``; the
    expanded one takes the quantiles ``Phi(-sqrt(n / (n - 1)) t(1 - alpha / 2, n - 1))``."""
    from scipy.stats import t as student_t

    a = (1.0 - confidence) / 2.0
    if units < 2:
        return 0.0
    return float(special.ndtr(-math.sqrt(units / (units - 1.0)) * student_t.ppf(1.0 - a, units - 1)))


def _percentile_ci(values, confidence, units=None):
    """Percentile interval of replicate values (inf allowed); an end at +-inf is None. With
    ``units``: the expanded percentile interval (:func:`expanded_alpha`)."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return [None, None]
    a = (1.0 - confidence) / 2.0 if units is None else expanded_alpha(confidence, units)
    lo, hi = np.quantile(v, [a, 1.0 - a], method="inverted_cdf")
    return [float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None]


def _exp_ci(ci):
    return [None if c is None else float(math.exp(c)) for c in ci]


def replicate_fits(lx, Nb, Kb, theta0, xmin, xmax, lapse_max, model):
    """Refit every bootstrap replicate: ``lx`` (G, M) log stimulus values of G fits, ``Nb``/``Kb``
    (G, B, M) replicate counts, ``theta0`` (G, 3) the fits' estimates (a start beside the
    grid's), ``xmin``/``xmax`` (G,) the ranges shown. Returns log thresholds (G, B), +-inf at a
    search bound."""
    G, B, M = Nb.shape
    lo, hi = fit_bounds(np.repeat(xmin, B), np.repeat(xmax, B), lapse_max)
    theta, _ = fit_batch(
        np.repeat(lx, B, 0),
        Nb.reshape(G * B, M),
        Kb.reshape(G * B, M),
        lo,
        hi,
        model,
        theta0=np.repeat(theta0, B, 0),
    )
    return _replicate_thresholds(theta, lo, hi).reshape(G, B)


def threshold_interval(t, m, xmin, xmax, confidence, units=None):
    """(threshold or None, [lo, hi], bound) from the estimate ``t``, the replicates' log
    thresholds ``m`` and the range shown: the threshold is reported only within the range;
    outside it the interval is one-sided, and clamped to the range's end (a bound beyond the
    range would rest on the model's tail alone); inside, it always contains the estimate."""
    lo, hi = _exp_ci(_percentile_ci(m, confidence, units))
    if t > xmax:
        return None, [None if lo is None else min(lo, xmax), None], "lower"
    if t < xmin:
        return None, [None, None if hi is None else max(hi, xmin)], "upper"
    # a skewed bootstrap may leave the estimate outside its percentile interval: widen to it
    return t, [None if lo is None else min(lo, t), None if hi is None else max(hi, t)], None


# -- input -----------------------------------------------------------------------------------


class _Data:
    """Counts per rater, clip and level: n[r, c, j], k[r, c, j]; x[c, j] (padded with 1.0)."""

    def __init__(self, trials, reference):
        rows = []
        for i, t in enumerate(trials):
            if not isinstance(t, dict):
                raise ThresholdError(f"trial {i}: expected a mapping, found {type(t).__name__}")
            for f in ("rater", "clip", "level", "x", "correct"):
                if f not in t:
                    raise ThresholdError(f"trial {i}: field '{f}' missing")
            x, lev, c = t["x"], t["level"], t["correct"]
            if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x <= 0:
                raise ThresholdError(f"trial {i}: field 'x': expected a positive number, found {x!r}")
            if isinstance(lev, bool) or not isinstance(lev, numbers.Real) or not math.isfinite(lev):
                raise ThresholdError(f"trial {i}: field 'level': expected a number, found {lev!r}")
            if not (isinstance(c, (bool, np.bool_)) or c in (0, 1)):
                raise ThresholdError(f"trial {i}: field 'correct': expected true or false, found {c!r}")
            rows.append((str(t["rater"]), str(t["clip"]), float(lev), float(x), bool(c)))
        self.raters = sorted({r[0] for r in rows})
        self.clips = sorted({r[1] for r in rows})
        if not isinstance(reference, dict):
            raise ThresholdError(
                f"reference: expected a mapping of clip to metric value, found {type(reference).__name__}"
            )
        self.reference = {}
        by_name = {str(k): v for k, v in reference.items()}  # clips are named as strings
        for c in self.clips:
            v = by_name.get(c)
            if (
                v is None
                or isinstance(v, bool)
                or not isinstance(v, numbers.Real)
                or not math.isfinite(v)
                or v <= 0
            ):
                raise ThresholdError(f"reference: clip '{c}': expected a positive number, found {v!r}")
            self.reference[c] = float(v)
        self.levels = {c: sorted({r[2] for r in rows if r[1] == c}) for c in self.clips}
        R, C = len(self.raters), len(self.clips)
        J = max((len(v) for v in self.levels.values()), default=0)
        self.n = np.zeros((R, C, J))
        self.k = np.zeros((R, C, J))
        xs = np.zeros((C, J))
        self.x = np.ones((C, J))
        self.level = np.full((C, J), np.nan)
        ri = {r: i for i, r in enumerate(self.raters)}
        ci = {c: i for i, c in enumerate(self.clips)}
        li = {c: {lv: j for j, lv in enumerate(v)} for c, v in self.levels.items()}
        for r, c, lev, x, ok in rows:
            a, b, j = ri[r], ci[c], li[c][lev]
            self.n[a, b, j] += 1
            self.k[a, b, j] += ok
            xs[b, j] += x
        cnt = self.n.sum(0)
        has = cnt > 0
        self.x[has] = xs[has] / cnt[has]
        for c, v in self.levels.items():
            self.level[ci[c], : len(v)] = v
        self.n_trials = len(rows)


# -- the analysis ----------------------------------------------------------------------------


def _fmt(v):
    return "undefined" if v is None else f"{v:.4g}"


def _block(fit, x, N, K, level, ci, gof, n_trials, n_raters, n_clips, confidence, model, clip_of=None):
    """The JSON block of one fit (pooled or one clip)."""
    use = N > 0
    points = []
    for i in np.flatnonzero(use):
        pt = {"x": float(x[i]), "level": float(level[i]), "n": int(N[i]), "correct": int(K[i])}
        if clip_of is not None:
            pt = {"clip": clip_of[i], **pt}
        points.append(pt)
    out = {
        "threshold": None,
        "ci": [None, None],
        "slope": None,
        "lapse": None,
        "n_trials": int(n_trials),
        "n_raters": int(n_raters),
        "n_clips": int(n_clips),
        "gof": {"deviance": None, "df": None, "p": None, "method": None},
        "points": points,
        "curve": [],
        "bound": None,
    }
    if fit is None:
        return out
    t = fit["threshold"]
    xmin, xmax = fit["xmin"], fit["xmax"]
    out["threshold"], out["ci"], out["bound"] = ci
    out["slope"] = fit["slope"]
    out["lapse"] = fit["lapse"]
    out["gof"] = gof
    grid = np.geomspace(xmin / 2.0, xmax * 2.0, 61)
    p = psychometric(grid, t, fit["slope"], fit["lapse"], model=model)
    out["curve"] = [[float(f"{a:.6g}"), float(f"{b:.6g}")] for a, b in zip(grid, p)]
    return out


def _notes(label, block, fit, metric, confidence):
    notes = []
    if fit is None:
        return notes
    lo, hi = block["ci"]
    if block["bound"] == "lower":
        notes.append(
            f"{label}: threshold above the largest {metric} shown ({fit['xmax']:.4g}): "
            f"a lower bound only"
            + (
                f" ({metric} >= {lo:.4g} at {1 - (1 - confidence) / 2:.1%} confidence)"
                if lo is not None
                else " (not even that is sure)"
            )
        )
    elif block["bound"] == "upper":
        notes.append(
            f"{label}: threshold below the smallest {metric} shown ({fit['xmin']:.4g}): "
            f"an upper bound only" + (f" ({metric} <= {hi:.4g})" if hi is not None else "")
        )
    else:
        if hi is None:
            notes.append(
                f"{label}: interval open above: some replicates put the threshold beyond the levels shown"
            )
        elif hi > fit["xmax"]:
            notes.append(
                f"{label}: interval reaches above the largest {metric} shown "
                f"({fit['xmax']:.4g}): its upper end is an extrapolation"
            )
        if lo is None:
            notes.append(
                f"{label}: interval open below: some replicates put the threshold below the levels shown"
            )
        elif lo < fit["xmin"]:
            notes.append(
                f"{label}: interval reaches below the smallest {metric} shown "
                f"({fit['xmin']:.4g}): its lower end is an extrapolation"
            )
    if block["bound"] is None and fit["lapse"] >= LAPSE_MAX - 1e-6:
        notes.append(
            f"{label}: lapse rate at its bound ({LAPSE_MAX}): raters erred often at "
            f"levels they otherwise discriminate"
        )
    g = block["gof"]
    if g.get("p") is not None and g["p"] < 0.05:
        notes.append(
            f"{label}: the model fits poorly (deviance {g['deviance']:.3g} on {g['df']} "
            f"df, p = {g['p']:.3g}): raters or clips differ, the curve is their average"
        )
    return notes


def _gof(fits, x, N, model, n_gof, rng, lapse_max):
    """Deviance and its parametric-bootstrap p (module doc), for several fits at once: row i of
    ``x`` and ``N`` holds fit i's stimuli (N = 0: none). None where a fit is None."""
    out = [None] * len(fits)
    rows = []
    for i, fit in enumerate(fits):
        if fit is None:
            continue
        use = N[i] > 0
        df = int(use.sum()) - 3
        out[i] = {
            "deviance": fit["deviance"],
            "df": df,
            "p": None,
            "method": f"parametric bootstrap ({n_gof})" if n_gof > 0 and df >= 1 else None,
        }
        if n_gof > 0 and df >= 1:
            rows.append(i)
    if not rows:
        return out
    LX, NN, KK, LO, HI = [], [], [], [], []
    for i in rows:
        fit = fits[i]
        p = psychometric(x[i], fit["threshold"], fit["slope"], fit["lapse"], model=model)
        n = np.repeat(N[i][None], n_gof, 0)
        KK.append(rng.binomial(n.astype(np.int64), p[None]).astype(float))
        NN.append(n)
        LX.append(np.repeat(np.log(x[i])[None], n_gof, 0))
        lo, hi = fit_bounds(np.full(n_gof, fit["xmin"]), np.full(n_gof, fit["xmax"]), lapse_max)
        LO.append(lo)
        HI.append(hi)
    NN, KK = np.concatenate(NN), np.concatenate(KK)
    T0 = np.concatenate([np.repeat(fits[i]["theta"][None], n_gof, 0) for i in rows])
    _, ll = fit_batch(np.concatenate(LX), NN, KK, np.concatenate(LO), np.concatenate(HI), model, theta0=T0)
    dev = (2.0 * (_saturated(NN, KK) - ll)).reshape(len(rows), n_gof)
    for j, i in enumerate(rows):
        out[i]["p"] = float((1 + np.sum(dev[j] >= fits[i]["deviance"] - 1e-9)) / (1 + n_gof))
    return out


def threshold_analysis(
    trials: Iterable[dict],
    *,
    reference: dict,
    metric: str = "lpips",
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    model: str = "weibull",
    lapse_max: float = LAPSE_MAX,
    n_gof: int = 200,
) -> dict:
    """Psychometric thresholds of a threshold study, pooled and per clip, with intervals from a
    bootstrap clustered over raters and clips, goodness of fit and the headroom (module doc).

    ``trials``: one dict per answered test trial ``{"rater", "clip", "level", "x", "correct"}``;
    ``reference``: ``{clip: metric value of the real backend difference}``. Returns a
    JSON-serialisable dict (undefined values are None)."""
    _check_model(model)
    if not 0.5 < confidence < 1:
        raise ThresholdError(f"confidence: expected a number in (0.5, 1), found {confidence!r}")
    if not 0 <= lapse_max < 0.5:
        raise ThresholdError(f"lapse_max: expected a number in [0, 0.5), found {lapse_max!r}")
    n_boot = int(n_boot)
    if n_boot < 1:
        raise ThresholdError(f"n_boot: expected a positive integer, found {n_boot!r}")
    d = _Data(list(trials), reference)
    rng = np.random.default_rng(seed)
    R, C = len(d.raters), len(d.clips)
    out = {
        "metric": metric,
        "criterion": CRITERION,
        "guess": GUESS,
        "model": _model_text(model),
        "confidence": confidence,
        "n_boot": n_boot,
        "seed": seed,
        "pooled": None,
        "clips": {},
        "headroom": {"value": None, "ci": [None, None]},
        "reference": None,
        "notes": [],
    }
    if d.n_trials == 0:
        out["pooled"] = _block(
            None,
            np.zeros(0),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0),
            [None, None],
            None,
            0,
            0,
            0,
            confidence,
            model,
        )
        out["notes"].append("no answered test trials: nothing to fit")
        return out
    J = d.x.shape[1]
    logref = np.log([d.reference[c] for c in d.clips])
    out["reference"] = float(np.exp(logref.mean()))

    # pooled: cells are the stimuli (clip, level)
    x = d.x.reshape(-1)
    N = d.n.sum(0).reshape(-1)
    K = d.k.sum(0).reshape(-1)
    level = d.level.reshape(-1)
    clip_of = [c for c in d.clips for _ in range(J)]
    Ntot, Ktot = d.n.sum(0), d.k.sum(0)  # (C, J)
    fit = _safe_fit(x, N, K, model, lapse_max)
    fits = [_safe_fit(d.x[c], Ntot[c], Ktot[c], model, lapse_max) for c in range(C)]
    # bootstrap draws in a fixed order (pooled raters, pooled clips, each clip's raters):
    # simulate_coverage draws the same
    wr = bootstrap_draws(rng, R, n_boot)
    wc = bootstrap_draws(rng, C, n_boot)
    clip_raters = [np.flatnonzero(d.n[:, c, :].sum(1) > 0) for c in range(C)]
    wcl = [bootstrap_draws(rng, len(rs), n_boot) for rs in clip_raters]

    ci = (None, [None, None], None)
    hci = [None, None]
    if fit is not None:
        Nb = wc[:, :, None] * np.einsum("br,rcj->bcj", wr, d.n)
        Kb = wc[:, :, None] * np.einsum("br,rcj->bcj", wr, d.k)
        m = replicate_fits(
            np.log(x)[None],
            Nb.reshape(1, n_boot, -1),
            Kb.reshape(1, n_boot, -1),
            fit["theta"][None],
            np.array([fit["xmin"]]),
            np.array([fit["xmax"]]),
            lapse_max,
            model,
        )[0]
        ci = threshold_interval(fit["threshold"], m, fit["xmin"], fit["xmax"], confidence)
        lref = (wc * logref).sum(1) / wc.sum(1)
        hci = _exp_ci(_percentile_ci(m - lref, confidence))

    # per clip: raters resampled; the replicates of all clips are refitted in one batch
    cis = [(None, [None, None], None)] * C
    hcis = [[None, None]] * C
    fitted = [c for c in range(C) if fits[c] is not None]
    if fitted:
        NB = np.stack([wcl[c] @ d.n[clip_raters[c], c, :] for c in fitted])
        KB = np.stack([wcl[c] @ d.k[clip_raters[c], c, :] for c in fitted])
        m = replicate_fits(
            np.log(d.x[fitted]),
            NB,
            KB,
            np.stack([fits[c]["theta"] for c in fitted]),
            np.array([fits[c]["xmin"] for c in fitted]),
            np.array([fits[c]["xmax"] for c in fitted]),
            lapse_max,
            model,
        )
        for i, c in enumerate(fitted):
            units = len(clip_raters[c]) - 1 if CLIP_EXPANDED else None
            cis[c] = threshold_interval(
                fits[c]["threshold"], m[i], fits[c]["xmin"], fits[c]["xmax"], confidence, units
            )
            hcis[c] = _exp_ci(_percentile_ci(m[i] - logref[c], confidence, units))

    gofs = _gof([fit], x[None], N[None], model, n_gof, rng, lapse_max) + _gof(
        fits, d.x, Ntot, model, n_gof, rng, lapse_max
    )
    pooled = _block(fit, x, N, K, level, ci, gofs[0], d.n_trials, R, C, confidence, model, clip_of)
    out["pooled"] = pooled
    out["notes"] += _degenerate_note("pooled", fit, N) + _notes("pooled", pooled, fit, metric, confidence)
    out["headroom"] = _headroom(pooled, hci, out["reference"])
    for c_i, c in enumerate(d.clips):
        ref = d.reference[c]
        blk = _block(
            fits[c_i],
            d.x[c_i],
            Ntot[c_i],
            Ktot[c_i],
            d.level[c_i],
            cis[c_i],
            gofs[1 + c_i],
            int(Ntot[c_i].sum()),
            len(clip_raters[c_i]),
            1,
            confidence,
            model,
        )
        blk["reference"] = ref
        blk["headroom"] = _headroom(blk, hcis[c_i], ref)
        out["clips"][c] = blk
        out["notes"] += _degenerate_note(f"clip {c}", fits[c_i], Ntot[c_i]) + _notes(
            f"clip {c}", blk, fits[c_i], metric, confidence
        )
    out["notes"] += _spread_note(out, [f["threshold"] for f in fits if f is not None], C)
    return out


#: the pooled interval undercovers when few clips differ a lot (module doc, the benchmark's
#: section 5): a note is added below this many clips when their thresholds spread more than
#: :data:`CLIP_SPREAD_NOTE` (sd of the log per-clip thresholds)
FEW_CLIPS = 8
CLIP_SPREAD_NOTE = 0.5


def _spread_note(out, ts, C):
    """``ts``: the clips' ML thresholds, outside the levels shown too (extrapolated, but they
    show the spread)."""
    if C >= FEW_CLIPS or len(ts) < 2 or out["pooled"]["threshold"] is None:
        return []
    sd = float(np.std(np.log(ts), ddof=1))
    if sd <= CLIP_SPREAD_NOTE:
        return []
    return [
        f"pooled: only {C} clips, whose thresholds differ a lot (sd of log thresholds "
        f"{sd:.2f}): the pooled interval is likely too narrow (with 4 such clips it covered "
        f"89% instead of 95% in simulation); read the per-clip thresholds, or add clips"
    ]


def _safe_fit(x, N, K, model, lapse_max):
    """The fit, or None when the data cannot identify one (fewer than 2 levels with trials)."""
    use = N > 0
    if np.unique(x[use]).size < 2:
        return None
    return fit_psychometric(x, N, K, model=model, lapse_max=lapse_max)


def _degenerate_note(label, fit, N):
    if fit is not None:
        return []
    if N.sum() == 0:
        return [f"{label}: no trials"]
    return [f"{label}: fewer than 2 levels with trials: no psychometric function can be fitted"]


def _headroom(block, ci, reference):
    """Threshold / reference; ``ci`` from the replicates, clamped like the threshold's."""
    if reference is None:
        return {"value": None, "ci": [None, None]}
    t = block["threshold"]
    lo, hi = ci
    tlo, thi = block["ci"]
    if block["bound"] == "lower":
        hi = None
        lo = None if tlo is None or lo is None else min(lo, tlo / reference)
    elif block["bound"] == "upper":
        lo = None
        hi = None if thi is None or hi is None else max(hi, thi / reference)
    return {"value": None if t is None else t / reference, "ci": [lo, hi]}


def headroom_sentence(headroom: float | None, *, lower_bound: bool = False) -> str:
    """The headroom (human threshold / real difference) in one sentence a release manager reads:
    ``"headroom 0.11x: the real difference is 9.1x the human threshold, people see it"``.
    ``lower_bound``: the headroom is at least ``headroom`` (the threshold lies above the
    levels shown)."""
    if headroom is None:
        return "headroom unknown (no real difference or no threshold measured)"
    at = ">= " if lower_bound else ""
    if headroom <= 0:
        return f"headroom {at}{headroom:.3g}x: no threshold above zero was measured"
    if headroom < 1 and not lower_bound:
        return (
            f"headroom {headroom:.2g}x: the real difference is {1 / headroom:.2g}x the human "
            "threshold (75% correct in ABX), people see it"
        )
    if headroom < 1:
        return (
            f"headroom {at}{headroom:.2g}x: the threshold lies above every level shown; the "
            "real difference may be visible (show larger levels)"
        )
    return (
        f"headroom {at}{headroom:.2g}x: the real difference would have to grow "
        f"{at}{headroom:.2g}x before people notice it (75% correct in ABX)"
    )


def _model_text(model):
    f = (
        "1 - exp(-ln2 (x / threshold) ^ slope)"
        if model == "weibull"
        else "1 / (1 + (x / threshold) ^ -slope)"
    )
    return (
        f"{model}: p(x) = 0.5 + (0.5 - lapse) F(x), F = {f}; threshold: F = 0.5 (75% correct "
        f"without lapses); lapse in [0, {LAPSE_MAX}]"
    )


# -- the gate --------------------------------------------------------------------------------


def gate_from_analysis(
    analysis: dict, *, study: str, safety_factor: float = 2.0, aggregate: str = "mean"
) -> str:
    """The text of a gate YAML set by people: ``<metric>: {<aggregate>: {max: threshold /
    safety_factor}}`` and a ``human_threshold`` block (metric, value, ci, study, safety_factor,
    criterion) that :mod:`evalkit.formats.gate` reads, with comments saying where the number came
    from. A threshold above the levels shown (a lower bound only) gates on the lower bound
    (``bound: lower`` in the block); a threshold below them or none at all is refused
    (:class:`ThresholdError`)."""
    if (
        isinstance(safety_factor, bool)
        or not isinstance(safety_factor, numbers.Real)
        or not math.isfinite(safety_factor)
        or safety_factor < 1
    ):
        raise ThresholdError(f"safety factor: expected a number >= 1, found {safety_factor!r}")
    if aggregate not in ("mean", "p95", "worst"):
        raise ThresholdError(f"aggregate: expected mean, p95 or worst, found {aggregate!r}")
    pooled = (analysis or {}).get("pooled") or {}
    metric = analysis.get("metric", "lpips")
    t, ci, bound = pooled.get("threshold"), list(pooled.get("ci") or [None, None]), None
    if t is None:
        if pooled.get("bound") == "lower" and ci[0] is not None:
            t, bound = ci[0], "lower"
        elif pooled.get("bound") == "upper":
            raise ThresholdError(
                f"study {study}: the threshold is below the smallest {metric} shown (raters "
                f"discriminated every level): no gate can be set; rerun with smaller levels"
            )
        else:
            raise ThresholdError(
                f"study {study}: no threshold could be estimated (see the analysis notes): no gate can be set"
            )
    limit = t / float(safety_factor)
    conf = analysis.get("confidence", 0.95)
    head = (analysis.get("headroom") or {}).get("value")
    ref = analysis.get("reference")
    lines = [
        f"# Gate set by people: evalkit threshold study {study!r}.",
        f"# Human detection threshold of {metric} ({_model_short(analysis)}): "
        + (
            f"{t:.6g}, {conf:.0%} interval [{_fmt(ci[0])}, {_fmt(ci[1])}]"
            if bound is None
            else f"above every level shown; {_fmt(t)} is a one-sided lower bound"
        ),
        f"# pooled over {pooled.get('n_raters')} raters x {pooled.get('n_clips')} clips, "
        f"{pooled.get('n_trials')} trials; bootstrap clustered over raters and clips.",
    ]
    if ref is not None:
        lines.append(
            f"# Real backend difference ({metric}, geometric mean over clips): "
            f"{ref:.6g}; "
            + (headroom_sentence(head) if head is not None else headroom_sentence(t / ref, lower_bound=True))
            + "."
        )
    lines += [
        f"# Gate: {metric} {aggregate} <= threshold / safety factor {safety_factor:g} = {limit:.6g}.",
        "schema_version: 1",
        f"{metric}:",
        f"  {aggregate}:",
        f"    max: {_num(limit)}",
        "human_threshold:",
        f"  metric: {metric}",
        f"  value: {_num(t)}",
        f"  ci: [{_num(ci[0])}, {_num(ci[1])}]",
        f"  study: {_yaml_str(study)}",
        f"  safety_factor: {_num(float(safety_factor))}",
        f"  criterion: {_num(analysis.get('criterion', CRITERION))}",
        f"  aggregate: {aggregate}",
    ]
    if bound is not None:
        lines.append(f"  bound: {bound}")
    return "\n".join(lines) + "\n"


def _model_short(analysis):
    crit = analysis.get("criterion", CRITERION)
    return f"F = 0.5, {crit:.0%} ABX correct without lapses"


def _num(v):
    return "null" if v is None else repr(float(v))


def _yaml_str(s):
    import json

    return json.dumps(str(s))


# -- Monte Carlo -----------------------------------------------------------------------------
