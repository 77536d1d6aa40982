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
        super().__init__(
            f"trial {trial}: already answered {first!r}; a rating is written once "
            f"(found a second answer {second!r})"
        )


class OutOfOrder(StudyError):
    """An answer to a trial that is not the rater's current, handed-out trial (changes nothing)."""

    def __init__(self, trial):
        super().__init__(
            f"trial {trial}: not the trial being shown; reload the page to get the current trial"
        )


class NotLoaded(StudyError):
    """An answer to a trial whose videos were not all requested by the browser."""

    def __init__(self, trial):
        super().__init__(
            f"trial {trial}: field 'answer': the videos of this trial were not "
            "loaded; watch them before answering"
        )
        self.wait_ms = 1000


class BadAcknowledgement(StudyError):
    """A page's acknowledgement of a media file that does not match what the server sent: a
    size or CRC-32 other than the file's, or bytes never sent (changes nothing)."""

    def __init__(self, what: str):
        super().__init__(f"acknowledgement: {what}")


class UnknownMedia(StudyError):
    """A media name that is not one of the rater's handed-out trials' (says nothing more)."""

    def __init__(self):
        super().__init__("media: not found")


class TooSoon(StudyError):
    """An answer that came before one play-through of the trial's videos (the gate)."""

    def __init__(self, trial, elapsed: float | None, need: float, seconds: float):
        when = (
            "before the videos were loaded"
            if elapsed is None
            else f"{elapsed:.1f} s after the videos were loaded"
        )
        super().__init__(
            f"trial {trial}: field 'answer': came {when}; watch the videos through "
            f"once ({seconds:.1f} s) before answering"
        )
        self.wait_ms = int(1000 * (need if elapsed is None else max(0.0, need - elapsed))) + 1
