"""Human studies: design, rater assignment, storage and the statistics of indistinguishability.

Pure parts: :mod:`.design` (clip selection, counterbalanced assignment), :mod:`.stats`
(the rules and tests: Wilson, binomial tests, cluster bootstrap, equivalence verdict,
Krippendorff's alpha), :mod:`.simulate` (their Monte Carlo), :mod:`.planning` (plan, design
check), :mod:`.psychometric` (the threshold fit).
Storage: :mod:`.store` (SQLAlchemy Core; SQLite WAL or PostgreSQL), the key sealed at rest
with a key file beside the database (:mod:`.seal`). Operations, by verb: :mod:`.create`
(create, invite, list), :mod:`.analyse` (results, unblinding, gate), :mod:`.export` (progress,
CSVs).
Raters go through :class:`.live.RaterService`, the one implementation of next trial, media,
answer and progress (opaque per-trial media names, a server-side gate with an injected clock,
group commit).
"""

from .analyse import results, unblind, unblinding_log, unsealed_ratings, write_gate
from .create import check_keys, create_study, invite, list_studies, read_report, same_runs
from .errors import (
    BadAcknowledgement,
    BadAnswer,
    NotLoaded,
    OutOfOrder,
    RatingConflict,
    StudyError,
    TooSoon,
    TrialNotAssigned,
    UnknownMedia,
    UnknownStudy,
    UnknownToken,
    UnknownTrial,
)
from .export import key_status, ratings_csv, study_progress, summary_csv, write_csvs
from .live import FakeClock, RaterService
from .planning import plan
from .store import SCHEMA_VERSION, StudyDB, open_db

__all__ = [
    "create_study",
    "invite",
    "list_studies",
    "results",
    "plan",
    "RaterService",
    "FakeClock",
    "ratings_csv",
    "study_progress",
    "summary_csv",
    "write_csvs",
    "write_gate",
    "unblind",
    "unblinding_log",
    "key_status",
    "read_report",
    "open_db",
    "StudyDB",
    "check_keys",
    "same_runs",
    "unsealed_ratings",
    "SCHEMA_VERSION",
    "StudyError",
    "UnknownStudy",
    "UnknownToken",
    "UnknownTrial",
    "TrialNotAssigned",
    "BadAnswer",
    "RatingConflict",
    "TooSoon",
    "OutOfOrder",
    "NotLoaded",
    "UnknownMedia",
    "BadAcknowledgement",
]
