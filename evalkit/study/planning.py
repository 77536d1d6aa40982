"""Plan a study: how many raters and clips a protocol needs for a margin and power (the normal
approximation refined by simulating the rule itself, :mod:`.simulate`), the design check of a
study's size, and what ``create_study`` plans with. The rules planned for are in :mod:`.stats`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from . import protocols, simcache, stats
from .errors import StudyError
from .simulate import (
    BOUNDARY_SCENARIOS,
    INVERSION_SCENARIOS,
    SIMULATE_MAX_CELLS,
    WEAK_BOTS,
    simulate_abx,
    weak_misses,
)
from .stats import (
    BELOW_CHANCE_SPLIT,
    MAX_RATERS,
    MIN_CLIPS,
    MIN_RATERS,
    RULE_VERSION,
    t_quantile,
    visible_share_bound,
    visible_share_limit,
)


def cached_plan(protocol: str, margin: float, n_clips: int, alpha: float) -> dict:
    """The planner's design for this study (cached per process and on disk: it simulates)."""
    key = (protocol, margin, n_clips, alpha)
    if key not in _PLANS:
        try:
            _PLANS[key] = simcache.cached(
                "plan",
                {"protocol": protocol, "margin": margin, "clips": n_clips, "alpha": alpha},
                lambda: plan(protocol, margin, clips=n_clips, alpha=alpha),
            )
        except ValueError as e:
            raise StudyError(str(e)) from None
    return _PLANS[key]


def design_warnings(protocol: str, n_clips: int, raters_planned: int, the_plan: dict) -> list[str]:
    out = []
    if n_clips < stats.MIN_CLIPS:
        out.append(
            f"{n_clips} clips is below the {stats.MIN_CLIPS} the planner requires: the "
            "verdict's error rates are only simulated from that size up"
        )
    if protocols.get(protocol).plans_clips and n_clips < the_plan.get("clips", 0):
        out.append(
            f"{n_clips} clips is below the planner's {the_plan['clips']} clips per rater "
            f"for --margin {the_plan['margin']:g} ("
            + "; ".join(the_plan.get("notes") or [])
            + "): the results will be UNDER-SIZED and claim 'indistinguishable' only if "
            "the achieved design still keeps the 5% rule; add clips or raters"
        )
    if raters_planned and raters_planned < the_plan["raters"]:
        out.append(
            f"--raters {raters_planned} is below the planner's {the_plan['raters']} "
            f"included raters for --margin {the_plan['margin']:g} (see `evalkit study plan`)"
        )
    return out


def design_check(
    raters: int,
    clips: int,
    *,
    margin: float,
    alpha: float = 0.05,
    studies: int = 400,
    reps: int = 200,
    seed: int = 4404,
    heterogeneity: float = 0.15,
) -> dict:
    """Whether an ABX design of ``raters`` x ``clips`` (an achieved one, below its plan) still
    keeps the 5% rule: the bound on the share of visibly different clips (none flagged) can
    fall below :func:`visible_share_limit`, and the simulated rate of "indistinguishable" at
    true accuracy 0.5 + margin minus one Monte Carlo SE is <= ``alpha`` in every scenario of
    :data:`BOUNDARY_SCENARIOS` and :data:`INVERSION_SCENARIOS` (fixed seed: the same design
    always gets the same answer; cached). Returns ``ok``, ``visible_share_bound``,
    ``visible_share_limit``, ``rates`` (scenario -> [rate, se]; empty when the bound already
    rules the claim out), ``failing`` and ``text``."""
    key = (int(raters), int(clips), float(margin), float(alpha), studies, reps, seed, heterogeneity)
    if key in _DESIGN_CHECKS:
        return _DESIGN_CHECKS[key]
    lim = visible_share_limit(margin)
    vb = float(visible_share_bound(0, clips, raters, alpha=alpha)[0])
    rates: dict[str, list] = {}
    failing: dict[str, float] = {}
    if vb < lim and raters >= 2 and clips >= 2:
        edges = boundary_checks(
            raters,
            clips,
            studies=studies,
            reps=reps,
            alpha=alpha,
            margin=margin,
            heterogeneity=heterogeneity,
            seed=seed,
        )
        rates = {sc: [o["indistinguishable"], o["se"]["indistinguishable"]] for sc, o in edges.items()}
        failing = boundary_failures(edges, alpha)
    ok = vb < lim and bool(rates) and not failing
    if vb >= lim:
        text = (
            f"{raters} raters x {clips} clips cannot claim indistinguishable: the bound on "
            f"the share of visibly different clips is {vb:.3g}, not below {lim:g}"
        )
    elif failing:
        text = (
            f"{raters} raters x {clips} clips cannot claim indistinguishable: simulated "
            f"'indistinguishable' at true accuracy {0.5 + margin:g} is "
            + ", ".join(f"{sc} {r:.3f}" for sc, r in failing.items())
            + f" (above {alpha:g}; {studies} studies a boundary scenario, "
            f"{max(studies, INVERSION_CHECK_STUDIES)} a below-chance one)"
        )
    else:
        text = (
            f"{raters} raters x {clips} clips still keep the rule: simulated "
            f"'indistinguishable' at true accuracy {0.5 + margin:g} at most "
            f"{max(r for r, _ in rates.values()):.3f} in {len(rates)} scenarios "
            f"({studies} studies a boundary scenario, "
            f"{max(studies, INVERSION_CHECK_STUDIES)} a below-chance one)"
        )
    out = {
        "ok": ok,
        "raters": int(raters),
        "clips": int(clips),
        "visible_share_bound": vb,
        "visible_share_limit": lim,
        "rates": rates,
        "failing": failing,
        "text": text,
        "studies": studies,
    }
    _DESIGN_CHECKS[key] = out
    return out


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


def normal_power(
    R: int,
    C: int,
    margin: float,
    alpha: float,
    *,
    two_sided: bool,
    decisive_share: float = 1.0,
    rater_sd: float = 0.0,
) -> float:
    """Normal approximation of the power of the rule at R raters x C clips: the estimate has
    SE^2 = h^2 / R + (0.25 - h^2) / n and the bootstrap SD^2 = h^2 / R + factor * (0.25 - h^2)
    / n (n decisive ratings, h the SD of the raters' true rates, factor the pigeonhole
    inflation of independent ratings, about 3); the rule needs margin > t * SD."""
    from scipy.stats import norm

    n = R * C * decisive_share
    h2 = min(rater_sd**2, 0.25)
    se = math.sqrt(h2 / R + (0.25 - h2) / n)
    sd = math.sqrt(h2 / R + _pigeonhole_factor(R, C) * (0.25 - h2) / n)
    t = float(t_quantile(1 - alpha / 2 if two_sided else 1 - alpha, min(R, C) - 1))
    return float(norm.cdf((margin - t * sd) / se))


def _normal_raters(
    margin: float,
    power: float,
    C: int,
    alpha: float,
    *,
    two_sided: bool,
    decisive_share: float = 1.0,
    rater_sd: float = 0.0,
) -> int:
    """Smallest R >= 2 with :func:`normal_power` >= ``power`` (``2 * MAX_RATERS`` + 1 when
    none up to there)."""

    def good(R):
        return (
            normal_power(
                R, C, margin, alpha, two_sided=two_sided, decisive_share=decisive_share, rater_sd=rater_sd
            )
            >= power
        )

    lo, hi = 1, 2
    while not good(hi):
        lo, hi = hi, hi * 2
        if hi > 2 * MAX_RATERS:
            return 2 * MAX_RATERS + 1
    return _smallest(lo, hi, good)


#: the most ratings per clip the clip-veto search of :func:`plan` looks through (~2 s)
MAX_CLIP_RATERS = 5_000


def clip_raters_estimate(C: int, alpha: float, clip_accuracy: float, clip_power: float) -> int:
    """Normal approximation of the ratings per clip :func:`clip_veto_power` needs."""
    from scipy.stats import norm

    if clip_accuracy >= 1:
        return MIN_RATERS
    za, zb = float(norm.isf(alpha / 2 / C)), float(norm.ppf(clip_power))
    p = clip_accuracy
    return math.ceil(((za * 0.5 + zb * math.sqrt(p * (1 - p))) / (p - 0.5)) ** 2)


def plan(
    protocol: str,
    margin: float,
    power: float = 0.8,
    *,
    clips: int = MIN_CLIPS,
    alpha: float = 0.05,
    exclusion_rate: float = 0.1,
    clip_accuracy: float = 0.9,
    clip_power: float = 0.8,
    heterogeneity: float = 0.15,
    tie_rate: float = 0.0,
    studies: int = 400,
    reps: int = 400,
    seed: int = 12345,
    clips_per_rater: int | None = None,
    progress=None,
    visible_bound: float | None = None,
) -> dict:
    """Included raters (each rates every clip once) needed by a study. The steps that differ
    per protocol are the protocol object's (:mod:`.protocols`: ``clips_floor``,
    ``power_terms``, ``check_ratings``, ``simulated_power``, ``plan_clips``, ``plan_raters``,
    ``plan_figures``); what they do for ABX and preference:

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
    chance, :data:`.simulate.WEAK_SCENARIOS`, are seen only with enough clips per rater), planning the
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
    _check_plan(protocol, margin, power, exclusion_rate, tie_rate, clip_accuracy, clips, visible_bound)
    proto = protocols.get(protocol)
    notes: list[str] = []
    clips_requested = clips
    floor = proto.clips_floor(margin)
    if clips < floor:
        notes.append(
            f"clips raised from {clips} to the floor of {floor}"
            + (
                f" (margin {margin:g}: fewer clips drawn at random cannot bound the share of "
                f"visibly different clips below {visible_share_limit(margin):g}, 2 x margin)"
                if floor > MIN_CLIPS
                else ""
            )
        )
        clips = floor
    C = int(clips)
    share, h = proto.power_terms(tie_rate, heterogeneity)
    p = PlanInputs(
        margin=margin,
        power=power,
        alpha=alpha,
        exclusion_rate=exclusion_rate,
        clip_accuracy=clip_accuracy,
        clip_power=clip_power,
        heterogeneity=heterogeneity,
        tie_rate=tie_rate,
        studies=studies,
        reps=reps,
        seed=seed,
        progress=progress,
        visible_bound=visible_bound,
        clips_requested=clips_requested,
        share=share,
        h=h,
    )

    def raters_at(C: int, notes: list, simulate: bool = True) -> tuple:
        approx = _normal_raters(
            margin, power, C, alpha, two_sided=proto.two_sided, decisive_share=share, rater_sd=h
        )
        if approx > MAX_RATERS:
            need = f"more than {2 * MAX_RATERS:,}" if approx > 2 * MAX_RATERS else f"about {approx:,}"
            raise ValueError(
                f"--margin {margin:g}: {need} included raters would be "
                f"needed at {C} clips (the limit is {MAX_RATERS:,}); use a larger "
                f"--margin or more clips"
            )
        proto.check_ratings(margin, approx, C)
        if not simulate:
            return approx, None, max(MIN_RATERS, approx), "normal approximation"
        pw = _PowerAt(proto, C, p)
        r_power, method = _raters_for_power(pw, approx, C, power, studies, notes)
        return approx, pw, r_power, method

    C, clips_before = proto.plan_clips(C, raters_at, notes, p)
    approx, pw, r_power, method = raters_at(C, notes)
    R, reasons, edges, checks_simulated = proto.plan_raters(r_power, method, C, clips_before, notes, p)
    if R == MIN_RATERS and not reasons:
        reasons.append(f"floor: at least {MIN_RATERS} included raters")
    out = {
        "protocol": protocol,
        "margin": margin,
        "power_target": power,
        "alpha": alpha,
        "raters": R,
        "invite": math.ceil(R / (1 - exclusion_rate) - 1e-9),
        "exclusion_rate": exclusion_rate,
        "clips": C,
        "clips_requested": clips_requested,
        "ratings_per_clip": R,
        "trials": R * C,
        "reasons": reasons,
        "notes": notes,
        "method": method,
        "normal_approx_raters": approx,
        "rule_version": RULE_VERSION,
        "simulated_studies": studies,
        "bootstrap_reps": reps,
        "seed": seed,
        "heterogeneity": heterogeneity,
        # names kept for the CLI of before
        "clips_per_rater": C,
        "analytic_trials": approx * C,
    }
    big = method != "simulation" or not checks_simulated
    again = proto.plan_figures(out, pw, edges, big, p)
    return out if again is None else again


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """:func:`plan`'s arguments as the protocol's planning steps get them
    (:meth:`.protocols.base.Protocol.plan_clips` and the others), with ``share`` and ``h``, the
    protocol's :meth:`~.protocols.base.Protocol.power_terms`."""

    margin: float
    power: float
    alpha: float
    exclusion_rate: float
    clip_accuracy: float
    clip_power: float
    heterogeneity: float
    tie_rate: float
    studies: int
    reps: int
    seed: int
    progress: object
    visible_bound: float | None
    clips_requested: int
    share: float
    h: float

    @property
    def chk(self) -> dict:
        """The boundary checks' simulation settings."""
        return {"studies": self.studies, "reps": self.reps, "alpha": self.alpha, "margin": self.margin}

    def again(self, protocol: str, clips: int) -> dict:
        """:func:`plan` again with these arguments at ``clips`` (its ``clips_requested``
        kept)."""
        out = plan(
            protocol,
            self.margin,
            self.power,
            clips=clips,
            alpha=self.alpha,
            exclusion_rate=self.exclusion_rate,
            clip_accuracy=self.clip_accuracy,
            clip_power=self.clip_power,
            heterogeneity=self.heterogeneity,
            tie_rate=self.tie_rate,
            studies=self.studies,
            reps=self.reps,
            seed=self.seed,
            progress=self.progress,
            visible_bound=self.visible_bound,
        )
        out["clips_requested"] = self.clips_requested
        return out


def _check_plan(
    protocol, margin, power, exclusion_rate, tie_rate, clip_accuracy, clips, visible_bound
) -> None:
    """:func:`plan`'s arguments, each refused with a message naming its option."""
    proto = protocols.REGISTRY.get(protocol) if isinstance(protocol, str) else None
    if proto is None or not proto.planned:
        names = " or ".join(sorted(n for n, q in protocols.REGISTRY.items() if q.planned))
        raise ValueError(f"protocol: expected {names}, found {protocol!r}")
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
        if not proto.bounds_visible:
            names = " or ".join(sorted(n for n, q in protocols.REGISTRY.items() if q.bounds_visible))
            raise ValueError(
                f"--visible-bound: only for --protocol {names} (a {protocol} study "
                "makes no claim that clips look the same)"
            )
        if not 0 < visible_bound < 1:
            raise ValueError(f"--visible-bound: expected a share in (0, 1), found {visible_bound}")


def _spread_miss_estimate(margin: float, raters: int, clips: int, alpha: float) -> float:
    """Approximate chance that the raters' spread check misses answers barely below chance
    (the harder of :data:`.simulate.WEAK_SCENARIOS`): its statistic, a sum over raters of
    (2 k - n)^2 / n, taken as chi-square with ``raters`` df at chance and non-central with
    (n - 1)(2 p - 1)^2 a rater when raters are right with probability p (mean over the
    scenario's raters)."""
    from scipy.stats import chi2, ncx2

    share, acc = WEAK_BOTS
    per_rating = min(4 * margin**2, share * (2 * acc - 1) ** 2 + (1 - share) * 4 * margin**2)
    crit = float(chi2.ppf(1 - alpha * BELOW_CHANCE_SPLIT["rater_dispersion"], raters))
    return float(ncx2.cdf(crit, raters, raters * max(clips - 1, 0) * per_rating))


def spread_clips(
    margin: float,
    raters: int,
    *,
    alpha: float = 0.05,
    start: int = MIN_CLIPS,
    studies: int = 1000,
    seed: int = 4405,
) -> tuple[int, str]:
    """The fewest clips per rater, at least ``start``, with which ``raters`` raters' answers
    barely below chance are seen (issue 44): every rater at 0.5 + margin and half of them
    inverted, or bots at 0.4 as 40% of the raters, leave every check below chance silent at
    most ``alpha`` of the time (:func:`.simulate.weak_misses`, fixed seed). The raters' spread
    check is what sees them, and its power grows with clips per rater (noncentrality about
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
        return max(weak_misses(margin, raters, c, alpha=alpha, studies=studies, seed=seed).values()) <= alpha

    if ok(c0):
        lo, hi = start - 1, c0
        step = max(start, math.floor(c0 * 0.9))
        while step > start - 1 and ok(step):  # the approximation is conservative: walk down
            hi, step = step, max(start - 1, math.floor(step * 0.9))
        lo = step
    else:
        lo, hi = c0, math.ceil(c0 * 1.1) + 1
        while not ok(hi):
            lo, hi = hi, math.ceil(hi * 1.1) + 1
    return (hi if hi - lo <= 1 else _smallest(lo, hi, ok)), "simulation"


class _PowerAt:
    """The simulated power of a design with ``R`` raters (cached per R): the protocol's
    :meth:`~.protocols.base.Protocol.simulated_power` (ABX: the probability of
    "indistinguishable" when everyone guesses; preference: of "B preferred" at win rate
    0.5 + margin)."""

    def __init__(self, protocol, C: int, p: PlanInputs):
        self.protocol, self.C, self.p = protocol, C, p
        self.cache: dict[int, float] = {}

    def __call__(self, R: int) -> float:
        if R not in self.cache:
            self.cache[R] = self.protocol.simulated_power(R, self.C, self.p)
            if self.p.progress is not None:
                self.p.progress(f"{R} raters: power {self.cache[R]:.3f}")
        return self.cache[R]


def _raters_for_power(
    pw: _PowerAt, approx: int, C: int, power: float, studies: int, notes: list
) -> tuple[int, str]:
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
    notes.append(
        f"{r_power} raters x {C} clips is too large to simulate quickly: the "
        f"power figure is the normal approximation"
    )
    return r_power, "normal approximation"


#: simulated studies of the planner's and :func:`design_check`'s checks with answers below chance
#: (judged on the rate itself, not the rate less one SE: the checks below chance leave rates
#: near 5% at the smallest sizes, and 400 studies could not tell 5% from 7%)
INVERSION_CHECK_STUDIES = 1000


def boundary_checks(
    R: int, C: int, *, studies: int, reps: int, alpha: float, margin: float, heterogeneity: float, seed: int
) -> dict:
    """``simulate_abx`` at the boundary in every scenario of :data:`BOUNDARY_SCENARIOS` and
    :data:`INVERSION_SCENARIOS` (the latter with at least :data:`INVERSION_CHECK_STUDIES`)."""
    out = {}
    for i, sc in enumerate(BOUNDARY_SCENARIOS + INVERSION_SCENARIOS):
        n = studies if sc in BOUNDARY_SCENARIOS else max(studies, INVERSION_CHECK_STUDIES)
        out[sc] = simulate_abx(
            R, C, sc, rater_sd=heterogeneity, seed=seed + i, studies=n, reps=reps, alpha=alpha, margin=margin
        )
    return out


def boundary_failures(edges: dict, alpha: float) -> dict:
    """The scenarios whose boundary rate is above ``alpha``: less one MC SE for
    :data:`BOUNDARY_SCENARIOS`, the rate itself for :data:`INVERSION_SCENARIOS`."""
    return {
        sc: o["indistinguishable"]
        for sc, o in edges.items()
        if o["indistinguishable"] - (o["se"]["indistinguishable"] if sc in BOUNDARY_SCENARIOS else 0.0)
        > alpha
    }


_PLANS: dict = {}


_DESIGN_CHECKS: dict = {}
