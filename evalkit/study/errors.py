"""Study errors: one-line messages that name the study, token, trial or field (CLI exit 2)."""
from __future__ import annotations

from ..errors import UserError


class StudyError(UserError):
    """Bad input to a study operation."""


class UnknownStudy(StudyError):
    def __init__(self, study):
        super().__init__(f"study {study}: no such study in this database")


class UnknownToken(StudyError):
    def __init__(self):
        # never echo a token back: it is a credential
        super().__init__("rater token: no rater has this token")


class UnknownTrial(StudyError):
    def __init__(self, trial):
        super().__init__(f"trial {trial}: no such trial")


class TrialNotAssigned(StudyError):
    def __init__(self, trial, rater):
        super().__init__(f"trial {trial}: not assigned to rater {rater}")


class BadAnswer(StudyError):
    pass


class RatingConflict(StudyError):
    def __init__(self, trial, first, second):
        super().__init__(f"trial {trial}: already answered {first!r}; a rating is written once "
                         f"(found a second answer {second!r})")


class TooSoon(StudyError):
    """An answer that came before one play-through of the trial's videos (the web app's gate)."""

    def __init__(self, trial, elapsed: float | None, need: float, seconds: float):
        when = ("before the trial was shown" if elapsed is None
                else f"{elapsed:.1f} s after the trial was first shown")
        super().__init__(f"trial {trial}: field 'answer': came {when}; watch the videos through "
                         f"once ({seconds:.1f} s) before answering")
        self.wait_ms = int(1000 * (need if elapsed is None else max(0.0, need - elapsed))) + 1
