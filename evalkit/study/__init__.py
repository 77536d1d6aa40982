"""Human studies: design, rater assignment, storage and the statistics of indistinguishability.

Pure parts: :mod:`.design` (clip selection, counterbalanced assignment), :mod:`.stats`
(Wilson, binomial tests, cluster bootstrap, equivalence verdict, Krippendorff's alpha, plan).
Storage: :mod:`.store` (SQLAlchemy Core; SQLite WAL or PostgreSQL). Operations: :mod:`.api`.
The rater web app goes through :class:`.live.RaterService` (the same operations as
:func:`next_trial`, :func:`submit` and :func:`progress`, with caches, a group-commit writer and
the server-side play-through gate).
"""
from .api import (create_study, invite, next_trial, progress, ratings_csv, read_report, results,
                  submit, summary_csv, write_csvs)
from .errors import (BadAnswer, RatingConflict, StudyError, TooSoon, TrialNotAssigned,
                     UnknownStudy, UnknownToken, UnknownTrial)
from .stats import plan
from .store import SCHEMA_VERSION, StudyDB, open_db

__all__ = ["create_study", "invite", "next_trial", "progress", "submit", "results", "plan",
           "ratings_csv", "summary_csv", "write_csvs", "read_report", "open_db", "StudyDB",
           "SCHEMA_VERSION", "StudyError", "UnknownStudy", "UnknownToken", "UnknownTrial",
           "TrialNotAssigned", "BadAnswer", "RatingConflict", "TooSoon"]
