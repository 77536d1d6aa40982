"""``write_suite``: a one-clip suite file for render and compare tests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


def write_suite(folder, clip, *, name="t", prompts=("a",), seeds=(0,)) -> Path:
    """``folder/suite.yaml``: the clip ``clip`` (id ``pan``) with ``prompts`` and ``seeds``."""
    p = Path(folder) / "suite.yaml"
    p.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: {name}
        clips: [{{id: pan, path: {clip}}}]
        prompts: {json.dumps(list(prompts))}
        seeds: {json.dumps(list(seeds))}
    """)
    )
    return p
