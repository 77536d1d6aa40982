"""Monte Carlo of the study rules: simulated raters and clips with known truths (scenarios of
heterogeneous raters and clips) answering ABX, preference and threshold studies, analysed by the
rules of :mod:`.stats` and :mod:`.psychometric` themselves (vectorised over studies). The
planner (:mod:`.planning`), ``tests/test_study_stats.py``, ``tests/test_psychometric.py`` and
``benchmarks/`` use them.
"""

from __future__ import annotations

import math

import numpy as np

from .stats import (
    MIN_RATERS,
    VISIBLE_ACCURACY,
    abx_rule,
    after_unblinding,
    draw_counts,
    preference_rule,
    sign_flips,
    visible_share_bound,
    wilson,
)

#: ABX scenarios of :func:`simulate_abx` (true accuracy per rater and clip); see its docstring.
SCENARIOS = (
    "homogeneous",
    "heterogeneous_raters",
    "golden_ears",
    "clip_heterogeneity",
    "combined",
    "one_visible_clip",
    "inverted_discriminators",
    "inverted_raters",
    "inverted_clips",
    "bots",
    "weak_inversion",
    "weak_bots",
)


#: the scenarios in which "indistinguishable" at the boundary is an error (all but the clip one)
BOUNDARY_SCENARIOS = SCENARIOS[:5]


#: boundary scenarios with answers below chance (some raters, clips or bots answer against
#: what they see): "indistinguishable" is an error in every one
INVERSION_SCENARIOS = SCENARIOS[6:]


#: answers barely below chance (issue 44): the two scenarios that need clips per rater, not
#: raters (:func:`.planning.spread_clips`): every rater at 0.5 + margin, half inverted; and bots
#: right with probability WEAK_BOTS[1] as a share WEAK_BOTS[0] of the raters
WEAK_SCENARIOS = ("weak_inversion", "weak_bots")
WEAK_BOTS = (0.4, 0.4)


#: above this many rater x clip cells the planner uses the normal approximation, not simulation
SIMULATE_MAX_CELLS = 6_000


def _beta_mean_sd(rng: np.random.Generator, mu: float, sd: float, shape) -> np.ndarray:
    """Beta draws with mean ``mu`` and SD ``sd`` (or the largest feasible, 0.95 of the
    Bernoulli SD); exactly ``mu`` when ``sd`` is 0."""
    if sd <= 0 or mu <= 0 or mu >= 1:
        return np.full(shape, float(mu))
    sd = min(sd, 0.95 * math.sqrt(mu * (1 - mu)))
    s = mu * (1 - mu) / sd**2 - 1
    return rng.beta(mu * s, (1 - mu) * s, size=shape)


def _truth(
    rng,
    scenario: str,
    S: int,
    R: int,
    C: int,
    mu: float,
    *,
    rater_sd: float,
    clip_sd: float,
    clip_accuracy: float,
    invert: float = 0.5,
    bot_share: float = 0.21,
    bot_accuracy: float = 0.3,
) -> np.ndarray:
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


def simulate_abx(
    raters: int,
    clips: int,
    scenario: str = "homogeneous",
    *,
    margin: float = 0.1,
    mu: float | None = None,
    alpha: float = 0.05,
    studies: int = 400,
    reps: int = 400,
    seed: int = 0,
    rater_sd: float = 0.15,
    clip_sd: float = 0.1,
    clip_accuracy: float = 0.95,
    invert: float = 0.5,
    bot_share: float = 0.21,
    bot_accuracy: float = 0.3,
) -> dict:
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
    acc = {
        k: 0.0
        for k in (
            "distinguishable",
            "indistinguishable",
            "inconclusive",
            "clip_flagged",
            "any_flagged",
            "overall_significant",
            "below_chance",
            "bound_below_margin",
        )
    }
    upper_sum = 0.0
    for sb in _batches(studies, reps, raters, clips):
        P = _truth(
            rng,
            scenario,
            sb,
            raters,
            clips,
            mu,
            rater_sd=rater_sd,
            clip_sd=clip_sd,
            clip_accuracy=clip_accuracy,
            invert=invert,
            bot_share=bot_share,
            bot_accuracy=bot_accuracy,
        )
        Y = (rng.random((sb, raters, clips)) < P).astype(float)
        wr = draw_counts(rng, raters, (sb, reps))
        wc = draw_counts(rng, clips, (sb, reps))
        o = abx_rule(Y, None, wr, wc, margin=margin, alpha=alpha)
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
    return {
        "scenario": scenario,
        "raters": raters,
        "clips": clips,
        "mu": mu,
        "margin": margin,
        "alpha": alpha,
        "studies": studies,
        "reps": reps,
        "seed": seed,
        **rates,
        "mean_upper": upper_sum / studies,
        "se": {k: mc_se(v, studies) for k, v in rates.items()},
    }


def weak_misses(
    margin: float, raters: int, clips: int, *, alpha: float = 0.05, studies: int = 1000, seed: int = 4405
) -> dict:
    """Per scenario of :data:`WEAK_SCENARIOS` at true accuracy 0.5 + margin: the simulated rate
    at which no check below chance fires (an upper bound on false "indistinguishable", tight
    where the bound U is nearly always under the margin); no bootstrap, so cheap."""
    return {
        sc: 1
        - simulate_abx(raters, clips, sc, margin=margin, alpha=alpha, studies=studies, reps=2, seed=seed + i)[
            "below_chance"
        ]
        for i, sc in enumerate(WEAK_SCENARIOS)
    }


def simulate_abx_peeking(
    raters_max: int,
    clips: int,
    scenario: str = "homogeneous",
    *,
    start: int = MIN_RATERS,
    margin: float = 0.1,
    mu: float | None = None,
    alpha: float = 0.05,
    studies: int = 400,
    reps: int = 400,
    seed: int = 0,
    rater_sd: float = 0.15,
    clip_sd: float = 0.1,
) -> dict:
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
        P = _truth(
            rng, scenario, sb, raters_max, clips, mu, rater_sd=rater_sd, clip_sd=clip_sd, clip_accuracy=0.95
        )
        Y = (rng.random((sb, raters_max, clips)) < P).astype(float)
        hit = np.zeros(sb, dtype=bool)
        for r in range(start, raters_max + 1):
            wr = draw_counts(rng, r, (sb, reps))
            wc = draw_counts(rng, clips, (sb, reps))
            o = abx_rule(Y[:, :r], None, wr, wc, margin=margin, alpha=alpha)
            if r == raters_max:
                fixed += int(o["indistinguishable"].sum())
                # the owner looked (unblinded at the first look, before the planned size):
                # stopped studies have no verdict, the others are judged as reported
                carried_on = ~hit
                reported = [
                    after_unblinding("indistinguishable" if v else "other", True)
                    for v in o["indistinguishable"][carried_on]
                ]
                closed += sum(v == "indistinguishable" for v in reported)
            hit |= o["indistinguishable"]
        any_look += int(hit.sum())
    f, p, c = fixed / studies, any_look / studies, closed / studies
    return {
        "scenario": scenario,
        "raters_max": raters_max,
        "clips": clips,
        "start": start,
        "mu": mu,
        "margin": margin,
        "looks": raters_max - start + 1,
        "studies": studies,
        "fixed": f,
        "peeking": p,
        "closed": c,
        "se": {"fixed": mc_se(f, studies), "peeking": mc_se(p, studies), "closed": mc_se(c, studies)},
    }


def simulate_visible_share(
    raters: int,
    clips: int,
    share: float,
    *,
    margin: float = 0.1,
    visible_accuracy: float = 1.0,
    alpha: float = 0.05,
    studies: int = 400,
    reps: int = 400,
    seed: int = 0,
    bound_accuracy: float = VISIBLE_ACCURACY,
) -> dict:
    """Sparse visible clips: each of the ``clips`` drawn at random is visible with probability
    ``share`` (every rater right with probability ``visible_accuracy``), the others at chance.
    Applies the ABX rule and the coverage bound (:func:`visible_share_bound` for accuracy
    ``bound_accuracy``) to ``studies`` simulated studies. Returns the rate of each verdict,
    ``covered`` (the bound >= ``share``: the bound's coverage, target >= 0.95),
    ``false_claim`` ("indistinguishable" with a bound below ``share``: the claim not limited
    honestly), ``mean_bound`` and ``se``."""
    rng = np.random.default_rng(seed)
    acc = {
        "distinguishable": 0,
        "indistinguishable": 0,
        "covered": 0,
        "false_claim": 0,
        "indistinguishable_covered": 0,
    }
    bound_sum = 0.0
    for sb in _batches(studies, reps, raters, clips):
        vis = rng.random((sb, 1, clips)) < share
        P = np.broadcast_to(np.where(vis, visible_accuracy, 0.5), (sb, raters, clips))
        Y = (rng.random((sb, raters, clips)) < P).astype(float)
        wr = draw_counts(rng, raters, (sb, reps))
        wc = draw_counts(rng, clips, (sb, reps))
        o = abx_rule(Y, None, wr, wc, margin=margin, alpha=alpha)
        b, _ = visible_share_bound(
            o["flagged"].sum(axis=1), clips, raters, alpha=alpha, visible_accuracy=bound_accuracy
        )
        cov = b >= share
        acc["distinguishable"] += int(o["distinguishable"].sum())
        acc["indistinguishable"] += int(o["indistinguishable"].sum())
        acc["covered"] += int(cov.sum())
        acc["false_claim"] += int((o["indistinguishable"] & ~cov).sum())
        acc["indistinguishable_covered"] += int((o["indistinguishable"] & cov).sum())
        bound_sum += float(b.sum())
    rates = {k: v / studies for k, v in acc.items()}
    return {
        "raters": raters,
        "clips": clips,
        "share": share,
        "margin": margin,
        "visible_accuracy": visible_accuracy,
        "bound_accuracy": bound_accuracy,
        "studies": studies,
        "reps": reps,
        "seed": seed,
        **rates,
        "mean_bound": bound_sum / studies,
        "se": {k: mc_se(v, studies) for k, v in rates.items()},
    }


def simulate_preference(
    raters: int,
    clips: int,
    *,
    win_rate: float = 0.5,
    tie_rate: float = 0.0,
    rater_sd: float = 0.0,
    tie_sd: float = 0.0,
    alpha: float = 0.05,
    studies: int = 400,
    reps: int = 400,
    seed: int = 0,
) -> dict:
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
        wr = draw_counts(rng, raters, (sb, reps))
        wc = draw_counts(rng, clips, (sb, reps))
        o = preference_rule(W, D, wr, wc, alpha=alpha, flips=sign_flips(rng, raters))
        b += int(o["b_preferred"].sum())
        a += int(o["a_preferred"].sum())
    rates = {
        "B preferred": b / studies,
        "A preferred": a / studies,
        "no preference shown": (studies - a - b) / studies,
    }
    rates["any preference"] = (a + b) / studies
    return {
        "raters": raters,
        "clips": clips,
        "win_rate": win_rate,
        "tie_rate": tie_rate,
        "rater_sd": rater_sd,
        "tie_sd": tie_sd,
        "studies": studies,
        "reps": reps,
        "seed": seed,
        **rates,
        "se": {k: mc_se(v, studies) for k, v in rates.items()},
    }


_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(60)


_GH_W = _GH_W / _GH_W.sum()


def population_threshold(threshold: float, slope: float, sd: float, *, model: str = "weibull") -> float:
    """The x at which the population mean of F is 0.5, when individual log thresholds are
    normal around ``log threshold`` with standard deviation ``sd`` (the estimand of a pooled
    fit: the level at which, on average over raters (and clips), half the non-lapse trials are
    discriminations)."""
    if sd <= 0:
        return float(threshold)
    lt = math.log(threshold)

    def f(lx):
        return float((model_core(slope * (lx - lt - sd * _GH_X), model)[0] * _GH_W).sum()) - 0.5

    from scipy import optimize

    from .psychometric import model_core

    return float(math.exp(optimize.brentq(f, lt - 12 * sd - 5, lt + 12 * sd + 5, xtol=1e-12)))


def simulate_trials(
    rng,
    *,
    raters: int,
    clips: int,
    levels=(1, 2, 4, 8, 16, 32),
    repeats: int = 2,
    threshold: float = 0.05,
    slope: float = 2.0,
    lapse_max: float = 0.04,
    rater_sd: float = 0.3,
    clip_sd: float = 0.3,
    reference: float = 0.01,
    reference_sd: float = 0.3,
    growth: float = 0.9,
    model: str = "weibull",
) -> dict:
    """One simulated threshold study. Clip c has a real difference ``ref_c`` (lognormal around
    ``reference``) and stimulus values ``x = ref_c * level ** growth``; rater r on clip c has the
    log threshold ``log threshold + u_r + v_c`` (u ~ N(0, rater_sd), v ~ N(0, clip_sd)), the
    given slope and a lapse rate uniform in [0, lapse_max]; every rater answers ``repeats``
    trials per stimulus. Returns trials, references and the truths (pooled: over the population
    of raters and clips; per clip: over raters, given the clip's v)."""
    from .psychometric import psychometric

    lv = np.asarray(levels, float)
    ref = reference * np.exp(reference_sd * rng.standard_normal(clips))
    x = ref[:, None] * lv[None, :] ** growth  # (C, J)
    u = rater_sd * rng.standard_normal(raters)
    v = clip_sd * rng.standard_normal(clips)
    lam = rng.uniform(0, lapse_max, raters) if lapse_max > 0 else np.zeros(raters)
    t = threshold * np.exp(u[:, None] + v[None, :])  # (R, C)
    p = psychometric(x[None], t[:, :, None], slope, lam[:, None, None], model=model)
    k = rng.binomial(repeats, p)  # (R, C, J)
    trials = []
    for r in range(raters):
        for c in range(clips):
            for j in range(len(lv)):
                for i in range(repeats):
                    trials.append(
                        {
                            "rater": f"r{r:03d}",
                            "clip": f"c{c:03d}",
                            "level": float(lv[j]),
                            "x": float(x[c, j]),
                            "correct": bool(i < k[r, c, j]),
                        }
                    )
    truth = population_threshold(threshold, slope, math.hypot(rater_sd, clip_sd), model=model)
    clip_truth = {
        f"c{c:03d}": population_threshold(threshold * math.exp(v[c]), slope, rater_sd, model=model)
        for c in range(clips)
    }
    return {
        "trials": trials,
        "reference": {f"c{c:03d}": float(ref[c]) for c in range(clips)},
        "truth": truth,
        "clip_truth": clip_truth,
        "n": np.full(k.shape, repeats),
        "k": k,
        "x": x,
    }


def trials_from_counts(n, k, x, levels) -> list[dict]:
    """Trials (the input of :func:`threshold_analysis`) from counts ``n``/``k`` (R, C, J) and
    stimulus values ``x`` (C, J); raters ``r000``..., clips ``c000``... (labels sort like the
    indices, so the analysis draws its bootstrap weights in the same order)."""
    out = []
    R, C, J = n.shape
    for r in range(R):
        for c in range(C):
            for j in range(J):
                for i in range(int(n[r, c, j])):
                    out.append(
                        {
                            "rater": f"r{r:03d}",
                            "clip": f"c{c:03d}",
                            "level": float(levels[j]),
                            "x": float(x[c, j]),
                            "correct": bool(i < k[r, c, j]),
                        }
                    )
    return out


def simulate_coverage(
    *,
    studies: int,
    raters: int,
    clips: int,
    levels=(1, 2, 4, 8, 16, 32),
    repeats: int = 2,
    threshold: float = 0.05,
    slope: float = 2.0,
    lapse_max: float = 0.04,
    rater_sd: float = 0.3,
    clip_sd: float = 0.3,
    reference: float = 0.01,
    reference_sd: float = 0.3,
    growth: float = 0.9,
    model: str = "weibull",
    n_boot: int = 200,
    confidence: float = 0.95,
    seed: int = 0,
    keep: bool = False,
) -> dict:
    """Monte Carlo of :func:`threshold_analysis`'s pooled and per-clip intervals: ``studies``
    simulated studies (the population of :func:`simulate_trials`), each analysed with the same
    fit, the same bootstrap draws (study s uses ``seed = seeds[s]``) and the same interval rule
    as :func:`threshold_analysis`, vectorised over studies. The point fit skips the SLSQP polish
    (the tests check it changes nothing that matters). Returns coverage of the truth (with a
    Wilson interval), how often the threshold was inside the range shown, and the bias (mean and
    median of log(estimate / truth) where reported)."""
    from .psychometric import (
        CLIP_EXPANDED,
        LAPSE_MAX,
        bootstrap_draws,
        fit_batch,
        fit_bounds,
        psychometric,
        replicate_fits,
        threshold_interval,
    )

    rng = np.random.default_rng(seed)
    lv = np.asarray(levels, float)
    S, R, C, J = studies, raters, clips, len(lv)
    seeds = rng.integers(0, 2**62, size=S)
    ref = reference * np.exp(reference_sd * rng.standard_normal((S, C)))
    x = ref[:, :, None] * lv**growth  # (S, C, J)
    u = rater_sd * rng.standard_normal((S, R))
    v = clip_sd * rng.standard_normal((S, C))
    lam = rng.uniform(0, lapse_max, (S, R)) if lapse_max > 0 else np.zeros((S, R))
    t = threshold * np.exp(u[:, :, None] + v[:, None, :])  # (S, R, C)
    p = psychometric(x[:, None], t[..., None], slope, lam[:, :, None, None], model=model)
    k = rng.binomial(repeats, p).astype(float)  # (S, R, C, J)
    n = np.full(k.shape, float(repeats))
    truth = population_threshold(threshold, slope, math.hypot(rater_sd, clip_sd), model=model)
    clip_truth = threshold * np.exp(v) * population_threshold(1.0, slope, rater_sd, model=model)

    # point fits (pooled: S rows of C*J stimuli; per clip: S*C rows of J)
    xp = x.reshape(S, C * J)
    lo, hi = fit_bounds(xp.min(1), xp.max(1), LAPSE_MAX)
    th_p, _ = fit_batch(np.log(xp), n.sum(1).reshape(S, -1), k.sum(1).reshape(S, -1), lo, hi, model)
    xc = x.reshape(S * C, J)
    lo, hi = fit_bounds(xc.min(1), xc.max(1), LAPSE_MAX)
    th_c, _ = fit_batch(
        np.log(xc), n.sum(1).transpose(0, 1, 2).reshape(S * C, J), k.sum(1).reshape(S * C, J), lo, hi, model
    )
    # replicates, in chunks of studies
    m_p = np.empty((S, n_boot))
    m_c = np.empty((S, C, n_boot))
    step = max(1, int(3e6 // (n_boot * C * J * 2)))
    for s0 in range(0, S, step):
        s1 = min(S, s0 + step)
        g = s1 - s0
        wr = np.empty((g, n_boot, R))
        wc = np.empty((g, n_boot, C))
        wcl = np.empty((g, C, n_boot, R))
        for i in range(g):
            r_ = np.random.default_rng(int(seeds[s0 + i]))
            wr[i] = bootstrap_draws(r_, R, n_boot)
            wc[i] = bootstrap_draws(r_, C, n_boot)
            for c in range(C):
                wcl[i, c] = bootstrap_draws(r_, R, n_boot)
        ns, ks = n[s0:s1], k[s0:s1]
        Nb = wc[..., None] * np.einsum("sbr,srcj->sbcj", wr, ns)
        Kb = wc[..., None] * np.einsum("sbr,srcj->sbcj", wr, ks)
        m_p[s0:s1] = replicate_fits(
            np.log(xp[s0:s1]),
            Nb.reshape(g, n_boot, -1),
            Kb.reshape(g, n_boot, -1),
            th_p[s0:s1],
            xp[s0:s1].min(1),
            xp[s0:s1].max(1),
            LAPSE_MAX,
            model,
        )
        NB = np.einsum("scbr,srcj->scbj", wcl, ns).reshape(g * C, n_boot, J)
        KB = np.einsum("scbr,srcj->scbj", wcl, ks).reshape(g * C, n_boot, J)
        xcc = xc[s0 * C : s1 * C]
        m_c[s0:s1] = replicate_fits(
            np.log(xcc), NB, KB, th_c[s0 * C : s1 * C], xcc.min(1), xcc.max(1), LAPSE_MAX, model
        ).reshape(g, C, n_boot)

    def summarise(est, reps, xmin, xmax, truths, units=None):
        rows = [
            threshold_interval(float(math.exp(e)), r, a, b, confidence, units)
            for e, r, a, b in zip(est, reps, xmin, xmax)
        ]
        lo_ = np.array([np.nan if r[1][0] is None else r[1][0] for r in rows])
        hi_ = np.array([np.nan if r[1][1] is None else r[1][1] for r in rows])
        val = np.array([np.nan if r[0] is None else r[0] for r in rows])
        cov = (np.nan_to_num(lo_, nan=0.0) <= truths) & (truths <= np.nan_to_num(hi_, nan=np.inf))
        inr = ~np.isnan(val)
        lr = np.log(val[inr] / truths[inr])
        both = inr & ~np.isnan(lo_) & ~np.isnan(hi_)
        out = {
            "n": len(rows),
            "covered": int(cov.sum()),
            "coverage": float(cov.mean()),
            "coverage_ci": list(wilson(int(cov.sum()), len(rows))),
            "in_range": float(inr.mean()),
            "covered_in_range": float(cov[inr].mean()) if inr.any() else None,
            "below_truth": float(np.mean(hi_[~np.isnan(hi_)] < truths[~np.isnan(hi_)]))
            if (~np.isnan(hi_)).any()
            else None,
            "above_truth": float(np.mean(lo_[~np.isnan(lo_)] > truths[~np.isnan(lo_)]))
            if (~np.isnan(lo_)).any()
            else None,
            "log_bias_mean": float(lr.mean()) if lr.size else None,
            "log_bias_median": float(np.median(lr)) if lr.size else None,
            "log_rmse": float(np.sqrt((lr**2).mean())) if lr.size else None,
            "width_median": float(np.median(np.log(hi_[both] / lo_[both]))) if both.any() else None,
        }
        if keep:
            out["rows"] = rows
        return out

    res = {
        "pooled": summarise(th_p[:, 0], m_p, xp.min(1), xp.max(1), np.full(S, truth)),
        "clips": summarise(
            th_c[:, 0],
            m_c.reshape(S * C, n_boot),
            xc.min(1),
            xc.max(1),
            clip_truth.reshape(-1),
            R - 1 if CLIP_EXPANDED else None,
        ),
        "truth": truth,
        "confidence": confidence,
        "n_boot": n_boot,
    }
    if keep:
        res["data"] = {
            "n": n,
            "k": k,
            "x": x,
            "ref": ref,
            "seeds": seeds,
            "levels": lv,
            "clip_truth": clip_truth,
            "theta_pooled": th_p,
            "theta_clips": th_c,
            "reps_pooled": m_p,
            "reps_clips": m_c,
            "truth": truth,
        }
    return res
