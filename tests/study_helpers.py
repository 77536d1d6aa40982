"""Helpers shared by the study tests: a small compare report made with the fake renderer."""
from __future__ import annotations

import json
import textwrap

from conftest import DATASETS


def make_report(root, seeds=(0, 1, 2)):
    from evalkit.compare import compare_runs
    from evalkit.render import render_suite

    suite = root / "suite.yaml"
    suite.write_text(textwrap.dedent(f"""\
        schema_version: 1
        name: studytest
        clips:
          - {{id: pan, path: {DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"}}}
          - {{id: obj, path: {DATASETS / "smoke" / "clips" / "hubble_object.mkv"}}}
        prompts: ["a"]
        seeds: {json.dumps(list(seeds))}
    """))
    render_suite(suite, ["cpu", "cpu,dtype=bf16"], root / "runs", renderer="fake_renderers:Invert",
                 progress=False)
    compare_runs(root / "runs" / "cpu", root / "runs" / "cpu_dtype-bf16", root / "report",
                 device="cpu", metric_options={"temporal": False}, progress=False)
    return root / "report"
