"""The typed models of the file formats (evalkit/formats/models.py): for the suite, the gate and
the run manifest, bad inputs give one line that names the file and the field, what was expected
and what was found; good inputs (the bundled files among them) round-trip."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml
from conftest import DATASETS, assert_one_line_error

from evalkit.errors import InputFileError, SchemaVersionError, SuiteError
from evalkit.formats.gate import GateError, load_gate
from evalkit.formats.models import GateFile, ManifestFile, SuiteFile, describe, field_path, first_problem
from evalkit.formats.run import RunDir, read_manifest
from evalkit.formats.suite import load_suite

METRICS = ("lpips", "ssim", "psnr")
RATIO_METRICS = ("lpips",)


def one_line(exc: Exception, *needles: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    for n in needles:
        assert n in text, f"{n!r} not in {text!r}"


# -- the formatter -----------------------------------------------------------------------------


def test_field_paths_read_like_the_file():
    assert field_path(("clips", 2, "path")) == "clips[2].path"
    assert field_path(("lpips", "mean", "max")) == "lpips.mean.max"
    assert field_path(("seeds", 0)) == "seeds[0]"
    assert field_path(()) is None


def test_pydantic_messages_become_expected_found():
    assert describe(
        {"type": "int_type", "loc": ("a", 1), "msg": "Input should be a valid integer", "input": "x"}
    ) == ("a[1]", "expected an integer, found str 'x'")
    assert describe(
        {"type": "greater_than_equal", "loc": ("n",), "msg": "...", "input": -2, "ctx": {"ge": 0}}
    ) == ("n", "expected a value >= 0, found -2")
    assert describe({"type": "string_type", "loc": ("params", 3, "[key]"), "msg": "...", "input": 3}) == (
        "params",
        "expected string keys, found int 3",
    )
    # a type it has no words for: pydantic's own, "Input should be X" -> "expected X"
    assert describe(
        {"type": "url_parsing", "loc": ("u",), "msg": "Input should be a valid URL", "input": "x"}
    ) == ("u", "expected a valid URL, found 'x'")


# -- suite.yaml --------------------------------------------------------------------------------

GOOD_SUITE = """\
    schema_version: 1
    name: t
    description: two clips
    renderer: canary
    clips:
      - {id: a, path: clips/a.mkv, description: first}
      - {id: b, path: clips/b.mkv}
    params: {strength: 0.6, steps: 4, fast: true, mode: lite}
    prompts: [watercolor, pencil sketch]
    seeds: [0, 7]
"""


@pytest.fixture
def suite_dir(tmp_path):
    (tmp_path / "clips").mkdir()
    for name in ("a", "b"):
        (tmp_path / "clips" / f"{name}.mkv").write_bytes(b"not decoded unless asked")
    return tmp_path


def write(d, text, name="suite.yaml"):
    p = d / name
    p.write_text(textwrap.dedent(text))
    return p


BAD_SUITES = {
    "wrong type": (GOOD_SUITE.replace("name: t", "name: 3"), "field 'name': expected a string, found int 3"),
    "wrong type in a list": (
        GOOD_SUITE.replace("[0, 7]", "[0, 7.5]"),
        "field 'seeds[1]': expected an integer seed, found float 7.5",
    ),
    "missing field": (
        GOOD_SUITE.replace("{id: b, path: clips/b.mkv}", "{id: b}"),
        "field 'clips[1].path': missing",
    ),
    "missing name": (GOOD_SUITE.replace("    name: t\n", ""), "field 'name': missing"),
    "unknown key": (
        GOOD_SUITE.replace("renderer: canary", "renderr: canary"),
        "field 'renderr': unknown key (expected one of: clips, description",
    ),
    "bad range": (
        GOOD_SUITE.replace("[0, 7]", "[0, -7]"),
        "field 'seeds[1]': expected a seed in [0, 2**63), found -7",
    ),
    "bad pattern": (
        GOOD_SUITE.replace("id: a,", "id: 'a b',"),
        "field 'clips[0].id': expected letters, digits",
    ),
    "empty list": (
        GOOD_SUITE.replace("[watercolor, pencil sketch]", "[]"),
        "field 'prompts': expected at least one prompt, found an empty list",
    ),
    "blank prompt": (
        GOOD_SUITE.replace("pencil sketch", "'  '"),
        "field 'prompts[1]': expected a non-empty prompt",
    ),
    "non-scalar param": (
        GOOD_SUITE.replace("steps: 4", "steps: [4]"),
        "field 'params.steps': expected a scalar (string, number or bool), found list",
    ),
    "duplicate clip id": (
        GOOD_SUITE.replace("id: b,", "id: a,"),
        "field 'clips[1].id': duplicate clip id 'a'",
    ),
    "duplicate seed": (GOOD_SUITE.replace("[0, 7]", "[7, 7]"), "field 'seeds[1]': duplicate of seeds[0]"),
    "neither form": (GOOD_SUITE.replace("    seeds: [0, 7]\n", ""), "field 'seeds': missing (give"),
    "string version": (
        GOOD_SUITE.replace("schema_version: 1", "schema_version: '1'"),
        "field 'schema_version': expected an integer, found str '1'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SUITES))
def test_bad_suites_give_one_line_naming_file_and_field(case, suite_dir, cli):
    text, needle = BAD_SUITES[case]
    path = write(suite_dir, text)
    with pytest.raises(SuiteError) as exc:
        load_suite(path)
    one_line(exc.value, str(path), needle)
    code, _, err = cli("suite", "validate", path)
    assert code == 2
    assert_one_line_error(err, str(path), needle)


def test_unknown_suite_version_is_a_schema_version_error(suite_dir):
    path = write(
        suite_dir,
        GOOD_SUITE.replace("schema_version: 1", "schema_version: 2") + "    a_key_of_version_2: x\n",
    )
    with pytest.raises(SchemaVersionError) as exc:  # and a SuiteError, as before
        load_suite(path)
    assert isinstance(exc.value, SuiteError) and exc.value.field == "schema_version"
    one_line(exc.value, str(path), "unsupported version 2 (this evalkit reads 1)")


def test_good_suite_round_trips(suite_dir):
    doc = yaml.safe_load(textwrap.dedent(GOOD_SUITE))
    assert SuiteFile.model_validate(doc).model_dump(exclude_unset=True) == doc
    s = load_suite(write(suite_dir, GOOD_SUITE))
    assert (s.name, s.description, s.renderer) == ("t", "two clips", "canary")
    assert s.clips["a"].path == (suite_dir / "clips" / "a.mkv").resolve()
    assert s.clips["a"].description == "first" and s.clips["b"].description == ""
    assert len(s.jobs) == 8
    # parameters keep their YAML types (they go into the job ids): 4 stays int, true stays bool
    assert [type(v) for v in s.jobs[0].params.values()] == [float, int, bool, str]


@pytest.mark.parametrize("name", ["smoke", "canary"])
def test_bundled_suites_round_trip(name):
    path = DATASETS / name / "suite.yaml"
    doc = yaml.safe_load(path.read_text())
    assert SuiteFile.model_validate(doc).model_dump(exclude_unset=True) == doc


# -- gate.yaml ---------------------------------------------------------------------------------


def gate(tmp_path, text):
    return load_gate(write(tmp_path, text, "gate.yaml"), metrics=METRICS, ratio_metrics=RATIO_METRICS)


BAD_GATES = {
    "wrong type": ("lpips: {mean: {max: high}}\n", "field 'lpips.mean.max': expected a number, found str"),
    "bool as a number": (
        "lpips: {mean: {max: true}}\n",
        "field 'lpips.mean.max': expected a number, found bool",
    ),
    "wrong type of a block": ("lpips: 0.05\n", "field 'lpips': expected a mapping like {mean: {max: 0.05}}"),
    "missing bounds": ("lpips: {mean: {}}\n", "field 'lpips.mean': expected at least one bound (max, min)"),
    "unknown metric": (
        "lpipz: {mean: {max: 1}}\n",
        "field 'lpipz': unknown metric (expected one of: lpips, ssim, psnr)",
    ),
    "unknown ratio metric": (
        "floor_ratio: {ssim: {mean: {max: 1}}}\n",
        "field 'floor_ratio.ssim': unknown metric (expected one of: lpips)",
    ),
    "bad enum": ("lpips: {median: {max: 1}}\n", "field 'lpips.median': unknown aggregate"),
    "bad bound": ("lpips: {mean: {below: 1}}\n", "field 'lpips.mean.below': unknown bound"),
    "bad range": (
        "max_missing_jobs: -1\n",
        "field 'max_missing_jobs': expected a non-negative integer, found -1",
    ),
    "wrong floor": ("floor: 3\n", "field 'floor': expected a floor name"),
}


@pytest.mark.parametrize("case", sorted(BAD_GATES))
def test_bad_gates_give_one_line_naming_file_and_field(case, tmp_path):
    text, needle = BAD_GATES[case]
    with pytest.raises(GateError) as exc:
        gate(tmp_path, text)
    one_line(exc.value, str(tmp_path / "gate.yaml"), needle)


def test_unknown_gate_version(tmp_path):
    with pytest.raises(SchemaVersionError) as exc:
        gate(tmp_path, "schema_version: 2\nlpips: {mean: {max: 1}}\n")
    assert isinstance(exc.value, GateError)
    one_line(exc.value, "gate.yaml", "field 'schema_version': unsupported version 2")


def test_good_gate_round_trips_in_file_order(tmp_path):
    g = gate(
        tmp_path,
        """\
        schema_version: 1
        ssim: {worst: {min: 0.8}, mean: {min: 0.9, max: 1}}
        lpips: {mean: {max: 0.05}}
        floor_ratio: {lpips: {mean: {max: 0.5}}}
        floor: seed
        max_missing_jobs: 2
    """,
    )
    assert g.absolute == {
        "ssim": {"worst": {"min": 0.8}, "mean": {"min": 0.9, "max": 1.0}},
        "lpips": {"mean": {"max": 0.05}},
    }
    assert list(g.absolute) == ["ssim", "lpips"] and list(g.absolute["ssim"]) == ["worst", "mean"]
    assert all(
        isinstance(v, float) for aggs in g.absolute.values() for b in aggs.values() for v in b.values()
    )
    assert (g.ratios, g.floor, g.max_missing_jobs) == ({"lpips": {"mean": {"max": 0.5}}}, "seed", 2)


def test_bundled_gate_round_trips():
    path = DATASETS / "canary" / "gate.yaml"
    doc = yaml.safe_load(path.read_text())
    model = GateFile.model_validate(doc, context={"metrics": METRICS, "ratio_metrics": RATIO_METRICS})
    assert model.model_dump(exclude_unset=True) == doc
    g = load_gate(path, metrics=METRICS, ratio_metrics=RATIO_METRICS)
    assert g.absolute == {k: v for k, v in doc.items() if k in METRICS}


# -- manifest.json -----------------------------------------------------------------------------


class _Suite:
    name, path, sha256 = "t", "/x/suite.yaml", "0" * 64
    jobs: list = []

    def summary(self):
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "clips": {}, "jobs": 0}


@pytest.fixture
def manifest(tmp_path):
    run = RunDir.create(
        tmp_path / "run",
        suite=_Suite(),
        renderer={"name": "r"},
        backend={"spec": "cpu"},
        fingerprint={"host": "h"},
    )
    path = run.path / "manifest.json"
    doc = json.loads(path.read_text())
    doc["jobs"] = [
        {
            "id": "a-x-s0-00000000",
            "clip": "a",
            "prompt": "x",
            "seed": 0,
            "params": {},
            "status": "done",
            "error": None,
            "timing": {"wall_s": 1.5},
            "output": {
                "path": "clips/a.mkv",
                "sha256": "f" * 64,
                "frames": 3,
                "width": 16,
                "height": 16,
                "fps": "24",
            },
            "preview": None,
            "finished": "2024-01-01T00:00:00+00:00",
            "effective_seed": 0,
            "node": {"id": "n1"},
            "attempts": 1,
        }
    ]  # kept as they are
    doc["nodes"] = {"n1": {"host": "h"}}
    path.write_text(json.dumps(doc))
    return path, doc


def test_good_manifest_round_trips(manifest):
    path, doc = manifest
    assert read_manifest(path) == doc
    assert ManifestFile.model_validate(doc).model_dump(exclude_unset=True) == doc


BAD_MANIFESTS = {
    "wrong type": (
        lambda m: m["jobs"][0].update(seed="0"),
        "field 'jobs[0].seed': expected an integer, found str '0'",
    ),
    "missing field": (lambda m: m.pop("fingerprint"), "field 'fingerprint': missing"),
    "missing job field": (lambda m: m["jobs"][0].pop("id"), "field 'jobs[0].id': missing"),
    "bad enum": (
        lambda m: m["jobs"][0].update(status="finished"),
        "field 'jobs[0].status': expected 'pending', 'done' or 'failed', found 'finished'",
    ),
    "bad pattern": (
        lambda m: m["jobs"][0]["output"].update(sha256="XYZ"),
        "field 'jobs[0].output.sha256': expected 64 lowercase hex digits, found 'XYZ'",
    ),
    "not an object": (lambda m: m.update(backend="cpu"), "field 'backend': expected an object, found str"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifests_give_one_line_naming_file_and_field(case, manifest):
    path, doc = manifest
    BAD_MANIFESTS[case][0](doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(InputFileError) as exc:
        RunDir.open(path.parent)
    one_line(exc.value, str(path), BAD_MANIFESTS[case][1])


def test_unknown_manifest_version(manifest):
    path, doc = manifest
    doc["schema_version"] = 2
    doc["jobs"] = "a version 2 shape"  # not looked at: the version is the error
    path.write_text(json.dumps(doc))
    with pytest.raises(SchemaVersionError) as exc:
        read_manifest(path)
    one_line(exc.value, "manifest.json: manifest schema_version 2 is not supported")


def test_first_problem_is_reported_when_there_are_several():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as exc:
        ManifestFile.model_validate(
            {
                "schema_version": 1,
                "suite": {},
                "renderer": {},
                "backend": {},
                "fingerprint": {},
                "jobs": [{"id": 1, "clip": 2, "prompt": "p", "seed": 0, "status": "done"}],
            }
        )
    assert len(exc.value.errors()) == 2
    assert first_problem(exc.value) == ("jobs[0].id", "expected a string, found int 1")
