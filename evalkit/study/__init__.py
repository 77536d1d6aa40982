"""Human studies: design, rater assignment, storage and the statistics of indistinguishability.

Pure parts: :mod:`.design` (clip selection, counterbalanced assignment), :mod:`.stats`
(Wilson, binomial tests, cluster bootstrap, equivalence verdict, Krippendorff's alpha, plan).
Storage: :mod:`.store` (SQLAlchemy Core; SQLite WAL or PostgreSQL), the key sealed at rest
with a key file beside the database (:mod:`.seal`). Operations: :mod:`.api`.
Raters go through :class:`.live.RaterService`, the one implementation of next trial, media,
answer and progress (opaque per-trial media names, a server-side gate with an injected clock,
group commit).
"""
from .api import (check_keys, create_study, invite, key_status, list_studies, ratings_csv, read_report, results,
                  same_runs, study_progress, summary_csv, unblind, unblinding_log, unsealed_ratings,
                  write_csvs, write_gate)
from .errors import (BadAcknowledgement, BadAnswer, NotLoaded, OutOfOrder, RatingConflict, StudyError, TooSoon,
                     TrialNotAssigned, UnknownMedia, UnknownStudy, UnknownToken, UnknownTrial)
from .live import FakeClock, RaterService
from .stats import plan
from .store import SCHEMA_VERSION, StudyDB, open_db

__all__ = ["create_study", "invite", "list_studies", "results", "plan", "RaterService", "FakeClock",
           "ratings_csv", "study_progress", "summary_csv", "write_csvs", "write_gate", "unblind", "unblinding_log", "key_status", "read_report", "open_db", "StudyDB",
           "check_keys", "same_runs", "unsealed_ratings",
           "SCHEMA_VERSION", "StudyError", "UnknownStudy", "UnknownToken", "UnknownTrial",
           "TrialNotAssigned", "BadAnswer", "RatingConflict", "TooSoon", "OutOfOrder",
           "NotLoaded", "UnknownMedia", "BadAcknowledgement"]
