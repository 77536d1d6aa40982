"""``import`` renderer: adopt renders made elsewhere into a run folder.

Option ``dir``: a folder holding, for each job, ``<job id>.<ext>`` (a video: mkv, mp4, webm,
avi, mov) or ``<job id>/`` (a folder of frames). Job ids are listed by ``evalkit suite
validate --jobs``. The adopted clip is stored losslessly like any render, so everything
downstream treats it alike. A job with no file fails with a message naming what was looked for.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from evalkit import video
from evalkit.render.renderers.base import JobError, RenderRequest, Renderer, RendererError


class ImportRenderer(Renderer):
    name = "import"
    version = "1"
    options_help = {"dir": "folder of <job id>.<video ext> files or <job id>/ frame folders"}

    def __init__(self, **options):
        super().__init__(**options)
        if not self.options.get("dir"):
            raise RendererError("renderer 'import': option 'dir' is required "
                                "(--renderer-opt dir=FOLDER)")
        self.dir = Path(self.options["dir"])
        if not self.dir.is_dir():
            raise RendererError(f"{self.dir}: not a folder (renderer 'import', option dir)")

    def render(self, request: RenderRequest) -> np.ndarray:
        jid = request.job.id
        candidates = [p for p in self.dir.glob(f"{jid}.*") if p.suffix.lower() in video.VIDEO_EXTS]
        folder = self.dir / jid
        if folder.is_dir():
            candidates.append(folder)
        if not candidates:
            raise JobError(f"{self.dir}: no render for job {jid} (expected {jid}.mkv/.mp4/... "
                           f"or a folder {jid}/)")
        if len(candidates) > 1:
            raise JobError(f"{self.dir}: several renders for job {jid}: "
                           f"{', '.join(sorted(p.name for p in candidates))}")
        from evalkit.render.renderers.command import read_expected

        return read_expected(candidates[0], what=f"import of job {jid}",
                             frames=len(request.source))
