"""Renderers for the Ray executor tests (imported by Ray worker processes from the installed package)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from evalkit.testing.renderers import Invert


class PidInvert(Invert):
    """Invert that first drops a marker file ``<job id>.<pid>`` (so a test can find and kill the
    worker process that is in the middle of a job), then sleeps ``hold`` seconds."""

    name = "pid-invert"
    options_help = {
        **Invert.options_help,
        "marker_dir": "folder for the markers",
        "hold": "seconds to sleep after the marker",
    }

    def render(self, request):
        folder = Path(self.options["marker_dir"])
        (folder / f"{request.job.id}.{os.getpid()}").write_text("")
        time.sleep(float(self.options.get("hold", 0)))
        return super().render(request)
