"""What a study protocol provides (:class:`Protocol`), with the defaults of a protocol whose
design the planner sizes and whose verdict is one rule of :mod:`..stats`."""

from __future__ import annotations


class Protocol:
    """A study protocol. Class attributes describe its trials; methods hold what differs per
    protocol at creation (options, plan, media, config), in the results (decision, result
    rows) and in the export (ratings and summary CSV). Stateless: one instance per protocol
    (:data:`evalkit.study.protocols.REGISTRY`)."""

    #: the protocol's name (``--protocol``)
    name: str = ""
    #: the answers a rater may give
    answers: tuple[str, ...] = ()
    #: forced choice: X matches A or B, every answer scored correct or not
    forced_choice: bool = False
    #: two tiles side by side, no X (:func:`..design.stream_keys`); the catch trial's answer is
    #: the side of the reference
    paired: bool = False
    #: what the rater page is told (a threshold study's trials are shown exactly as ABX)
    page: str = ""
    #: one line in every result: what the study can claim
    claim: str = ""
    #: an ABX study's achieved design is checked against the 5% rule when below its plan
    checks_design: bool = False
    #: the planner (:func:`..planning.plan`) sets its clips per rater, by a rule of
    #: :data:`..stats.RULE_VERSION`: fewer clips is warned at create, and a plan of an earlier
    #: rule is checked at its size like an under-sized one
    plans_clips: bool = False
    #: its result can set a gate (``study gate``: a human threshold)
    sets_gate: bool = False
    #: extra columns of the ratings CSV (:func:`..export.ratings_csv`)
    rating_columns: tuple[str, ...] = ()
    #: the planner (:func:`..planning.plan`, ``evalkit study plan``) sizes its design
    planned: bool = False
    #: its rule is two-sided (either backend may come out ahead)
    two_sided: bool = False
    #: ``--visible-bound`` applies: the study can claim that clips look the same
    bounds_visible: bool = False
    #: a complete study's results are per (clip, level) with a psychometric fit (``levels``,
    #: ``threshold``) instead of per clip
    by_level: bool = False
    #: what its rows are called (``study create``'s line)
    rows_noun: str = "clips"
    #: the per-clip figure of its results (the admin page's per-clip plot)
    per_clip_key: str = "accuracy"

    # -- catch trials ----------------------------------------------------------------------

    @property
    def catch_kinds(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(easy, graded) catch degradations (:mod:`..media`; the exclusion rule uses the
        easy ones, the graded ones are reported only)."""
        from .. import design

        return design.CATCH_KINDS, design.GRADED_KINDS

    # -- creation --------------------------------------------------------------------------

    def check_ladder(self, ladder) -> None:
        """Refuse ``--ladder`` where the protocol has no levels (``ladder``: None when not
        given)."""
        from ..errors import StudyError

        if ladder is not None:
            raise StudyError(f"--ladder: only for --protocol threshold, found --protocol {self.name}")

    def levels(self, levels, kind: str, raters_planned: int) -> tuple[list, list[str]]:
        """The rows per clip (``[None]``: one, no levels) and their warnings; refuses
        ``--levels`` where the protocol has none."""
        from ..errors import StudyError

        if levels is not None:
            raise StudyError(f"--levels: only for --protocol threshold, found --protocol {self.name}")
        return [None], []

    def study_plan(
        self,
        margin: float,
        alpha: float,
        raters_planned: int,
        n_clips: int,
        ladder: list,
        ladder_warnings: list,
    ) -> tuple[dict, list[str]]:
        """The study's design (the planner's, :func:`..planning.cached_plan`) and the warnings on it
        (:func:`..planning.design_warnings`)."""
        from ..planning import cached_plan, design_warnings

        the_plan = cached_plan(self.name, margin, n_clips, alpha)
        return the_plan, design_warnings(self.name, n_clips, raters_planned, the_plan)

    def offsets(self, ladder: list) -> dict:
        """Per level, the stimulus's offsets (:func:`..threshold.offsets`); none without
        levels."""
        return {}

    #: the media step measures each clip's real difference (the reference of the levels)
    measures_reference: bool = False

    def add_config(self, config: dict, *, ladder: list, kind: str, metrics_device, reference: dict) -> None:
        """The protocol's own part of a new study's config (none by default)."""

    def add_stimuli(self, config: dict, ids: list, stimuli: list[dict]) -> None:
        """The stimuli of the rows, by clip id, into the config (none by default)."""

    # -- results ---------------------------------------------------------------------------

    def decide(
        self,
        raters: list,
        clips: list,
        test: list[dict],
        *,
        margin: float,
        alpha: float,
        reps: int,
        seed: int,
    ) -> dict:
        """The verdict rule on the complete design's test ratings (its ``rule`` text with
        it)."""
        raise NotImplementedError

    def own_results(self, st: dict, test: list[dict], reps: int) -> dict | None:
        """The complete study's results where the protocol has its own analysis instead of
        :meth:`decide` (None: the verdict rule)."""
        return None

    def coverage(self, st: dict, dec: dict) -> dict:
        """What a verdict covers (ABX: the clips and the bound on visibly different ones)."""
        return {}

    def agreement(self, test: list[dict]) -> dict:
        """Agreement between raters, where the protocol reports one (rounded by the
        caller)."""
        return {}

    def planned_clips(self, planned, margin: float):
        """The plan's clips as the achieved design is held to (``planned``: None without
        one)."""
        return planned

    # -- planning (:func:`..planning.plan`; only where :attr:`planned`) ---------------------

    def clips_floor(self, margin: float) -> int:
        """The fewest clips per rater the planner accepts (a smaller ``clips`` is raised)."""
        from ..stats import MIN_CLIPS

        return MIN_CLIPS

    def power_terms(self, tie_rate: float, heterogeneity: float) -> tuple[float, float]:
        """(share of decisive ratings, SD of the raters' true rates) of the power's normal
        approximation (:func:`..planning.normal_power`)."""
        return 1.0, 0.0

    def check_ratings(self, margin: float, raters: int, clips: int) -> None:
        """Refuse (ValueError) a design whose test ratings the protocol cannot afford (the
        raters of the power's normal approximation at ``clips``)."""

    def simulated_power(self, raters: int, clips: int, p) -> float:
        """The simulated power at ``raters`` x ``clips`` (``p``: :class:`..planning.PlanInputs`;
        seeded with ``p.seed + raters``)."""
        raise NotImplementedError

    def plan_clips(self, clips: int, raters_at, notes: list, p) -> tuple[int, int]:
        """The clips per rater past the floor, and the clips before this step (``raters_at``:
        the planner's raters at a number of clips)."""
        return clips, clips

    def plan_raters(self, r_power: int, method: str, clips: int, clips_before: int, notes: list, p) -> tuple:
        """The included raters past the power figure ``r_power``: (raters, reasons, the
        simulated boundary checks, whether the checks were simulated)."""
        raise NotImplementedError

    def plan_figures(self, out: dict, pw, edges: dict, big: bool, p) -> dict | None:
        """Add the rule and the figures at the planned size to the plan ``out`` (simulated, or
        the normal approximation when ``big``); a plan redone at another size replaces it
        (returned; None: ``out`` stands)."""
        raise NotImplementedError

    # -- results text (:mod:`..text`) and the admin page -----------------------------------

    def estimate_lines(self, res: dict) -> list[str]:
        """The figures of an analysis (a verdict's or a pilot's) before its rule."""
        raise NotImplementedError

    def figure_lines(self, res: dict) -> list[str]:
        """The figures of an analysis, its rule and the flagged clips."""
        from ..text import flagged_lines

        return self.estimate_lines(res) + [f"rule: {res['rule']}"] + flagged_lines(res)

    def result_lines(self, res: dict) -> list[str] | None:
        """A complete study's lines after its head where the protocol has its own analysis
        (:meth:`own_results`; None: the verdict's lines)."""
        return None

    def sensitivity_figure(self, without: dict) -> str:
        """The verdict's figure with the catch-excluded raters (a sensitivity check)."""
        raise NotImplementedError

    def per_clip_title(self, key: str) -> str:
        """The title of the per-clip plot of ``key``."""
        return f"per clip {key}"

    # -- export ----------------------------------------------------------------------------

    def stimuli(self, st: dict) -> dict:
        """The stimuli by clip id for the ratings CSV's extra columns."""
        return {}

    def summary_csv(self, res: dict) -> str | None:
        """The summary CSV where the protocol has its own columns (None: the verdict's)."""
        return None
