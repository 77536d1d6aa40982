"""A render's progress bars (:class:`Progress`): jobs overall, and the steps of the job in
flight."""

from __future__ import annotations

from typing import Callable


class Progress:
    """Progress bars: one overall (jobs, with ETA) and one for the job in flight (steps)."""

    def __init__(self, total: int, enabled: bool = True):
        from tqdm import tqdm

        self.enabled = enabled
        self._tqdm = tqdm
        self.overall = tqdm(
            total=total, desc="jobs", unit="job", disable=not enabled, position=0, dynamic_ncols=True
        )
        self.job_bar = None

    def start_job(self, label: str) -> Callable[[int, int], None]:
        """Show the job ``label`` in flight; return its step callback. The job bar is made once
        and reset for each job (a new bar each time costs a few milliseconds of the rendering
        thread between two jobs: terminal writes, tqdm's own bookkeeping)."""
        if self.job_bar is None:
            self.job_bar = self._tqdm(
                total=1,
                desc=label[:40],
                unit="step",
                leave=False,
                disable=not self.enabled,
                position=1,
                dynamic_ncols=True,
            )
        else:
            self.job_bar.reset(total=1)
            self.job_bar.set_description_str(label[:40], refresh=False)
        bar = self.job_bar

        def update(done: int, total: int) -> None:
            if bar.total != total and total:
                bar.total = total
            bar.n = done
            bar.refresh()

        return update

    def end_job(self, ok: bool) -> None:
        self.overall.update(1)
        if not ok:
            self.overall.set_postfix_str("some failed")

    def status(self, text: str) -> None:
        """Cluster-wide state next to the overall bar (e.g. jobs running on how many workers)."""
        self.overall.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self.job_bar is not None:
            self.job_bar.close()
            self.job_bar = None
        self.overall.close()
