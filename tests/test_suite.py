"""Suite files: parsing, stable job ids, validation errors that name file and field."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit import video
from evalkit.errors import SuiteError
from evalkit.formats.suite import job_id, load_suite


@pytest.fixture
def suite_dir(tmp_path):
    frames = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    (tmp_path / "clips").mkdir()
    for name in ("a", "b"):
        video.write_lossless(tmp_path / "clips" / f"{name}.mkv", frames, 24)
    return tmp_path


def write_suite(d, text):
    p = d / "suite.yaml"
    p.write_text(textwrap.dedent(text))
    return p


PRODUCT = """\
    schema_version: 1
    name: t
    clips:
      - {id: a, path: clips/a.mkv}
      - {id: b, path: clips/b.mkv}
    prompts: [watercolor, pencil sketch]
    seeds: [0, 7]
    params: {strength: 0.6, steps: 4}
"""


def test_product_form_makes_every_combination_with_stable_ids(suite_dir):
    s = load_suite(write_suite(suite_dir, PRODUCT), check_clips=True)
    assert len(s.jobs) == 2 * 2 * 2
    assert {(j.clip, j.prompt, j.seed) for j in s.jobs} == {
        (c, p, k) for c in "ab" for p in ("watercolor", "pencil sketch") for k in (0, 7)
    }
    j = s.jobs[0]
    assert j.id == job_id("a", "watercolor", 0, {"strength": 0.6, "steps": 4})
    assert j.id.startswith("a-watercolor-s0-") and len(j.id.split("-")[-1]) == 8
    # stable: same content in another folder, another order of keys -> same ids
    again = load_suite(
        write_suite(suite_dir, PRODUCT.replace("{strength: 0.6, steps: 4}", "{steps: 4, strength: 0.6}"))
    )
    assert [x.id for x in again.jobs] == [x.id for x in s.jobs]
    # anything that changes the output changes the id
    assert job_id("a", "watercolor", 0, {"strength": 0.5, "steps": 4}) != j.id
    assert job_id("a", "watercolor", 1, {"strength": 0.6, "steps": 4}) != j.id


def test_explicit_jobs_merge_params(suite_dir):
    s = load_suite(
        write_suite(
            suite_dir,
            """\
        schema_version: 1
        name: t
        clips: [{id: a, path: clips/a.mkv}]
        params: {strength: 0.6, steps: 4}
        jobs:
          - {clip: a, prompt: night, seed: 3, params: {strength: 0.4}}
          - {clip: a, prompt: night, seed: 4}
    """,
        )
    )
    assert [j.params for j in s.jobs] == [{"strength": 0.4, "steps": 4}, {"strength": 0.6, "steps": 4}]


@pytest.mark.parametrize("bundled", ["smoke", "canary"])
def test_bundled_suites_validate(bundled, cli):
    code, out, err = cli("suite", "validate", DATASETS / bundled / "suite.yaml")
    assert code == 0, err
    assert "ok" in out
    s = load_suite(DATASETS / bundled / "suite.yaml")
    assert len({j.id for j in s.jobs}) == len(s.jobs)


BAD = {
    "wrong type": (
        PRODUCT.replace("seeds: [0, 7]", "seeds: [0, seven]"),
        "field 'seeds[1]': expected an integer seed, found str 'seven'",
    ),
    "unknown key": (PRODUCT + "    colour: red\n", "field 'colour': unknown key"),
    "unknown key in a clip": (
        PRODUCT.replace("{id: b, path: clips/b.mkv}", "{id: b, path: clips/b.mkv, fps: 3}"),
        "field 'clips[1].fps': unknown key",
    ),
    "missing clip file": (
        PRODUCT.replace("clips/b.mkv", "clips/nope.mkv"),
        "field 'clips[1].path': clip not found",
    ),
    "bool as seed": (
        PRODUCT.replace("seeds: [0, 7]", "seeds: [true]"),
        "field 'seeds[0]': expected an integer seed, found bool",
    ),
    "both forms": (PRODUCT + "    jobs: []\n", "field 'jobs': give either"),
    "bad schema version": (
        PRODUCT.replace("schema_version: 1", "schema_version: 9"),
        "field 'schema_version': unsupported version 9",
    ),
    "invalid yaml": ("name: [unclosed\n", "invalid YAML at line"),
    "empty file": ("", "empty file"),
    "list at top": ("- a\n- b\n", "expected a YAML mapping at the top level, found list"),
    "unknown job clip": (
        PRODUCT.split("    prompts:")[0] + "    jobs: [{clip: z, prompt: x, seed: 0}]\n",
        "field 'jobs[0].clip': unknown clip 'z'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_suites_name_file_and_field(case, suite_dir, cli):
    text, needle = BAD[case]
    path = write_suite(suite_dir, text)
    with pytest.raises(SuiteError) as exc:
        load_suite(path)
    assert str(path) in str(exc.value) and needle in str(exc.value)
    code, out, err = cli("suite", "validate", path)
    assert code == 2
    assert_one_line_error(err, str(path), needle)


def test_validate_decodes_the_clips(suite_dir, cli):
    (suite_dir / "clips" / "b.mkv").write_bytes(b"garbage that is not a video")
    path = write_suite(suite_dir, PRODUCT)
    load_suite(path)  # parsing alone does not decode
    code, out, err = cli("suite", "validate", path)
    assert code == 2
    assert_one_line_error(err, str(path), "clips[1].path", "not a readable video")


def test_output_into_a_closed_pipe_is_no_traceback():
    """`evalkit suite validate SUITE --jobs | head -1`: the reader goes away early; evalkit
    stops without a traceback."""
    import subprocess
    import sys

    from conftest import DATASETS, ROOT

    cmd = (
        f"{sys.executable} -m evalkit suite validate {DATASETS / 'canary' / 'suite.yaml'} --jobs | head -c 1"
    )
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert len(r.stdout) == 1
