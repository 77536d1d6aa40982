"""`evalkit import` (issue 46 item 4): files named by clip, by a mapping file or by a pattern
become a run with the identity records `render -r import` writes; no renaming script."""

from __future__ import annotations

import shutil

from conftest import DATASETS, assert_one_line_error

from evalkit.formats.run import read_manifest

SUITE = DATASETS / "smoke" / "suite.yaml"
CLIPS = ("astronaut_pan", "hubble_object")


def farm(tmp_path, name: str, names: dict) -> object:
    d = tmp_path / name
    d.mkdir()
    for clip, file in names.items():
        shutil.copy(DATASETS / "smoke" / "clips" / f"{clip}.mkv", d / file)
    return d


def test_files_named_by_clip_are_adopted_with_the_same_records(cli, tmp_path):
    d = farm(tmp_path, "farm", {c: f"{c}.mkv" for c in CLIPS})
    code, out, err = cli("import", SUITE, d, "--label", "farm-a", "--out", tmp_path / "runs", "--quiet")
    assert code == 0, err
    assert "farm-a: 2 imported" in out
    m = read_manifest(tmp_path / "runs" / "farm-a")
    assert m["label"] == "farm-a" and m["renderer"]["name"] == "import"
    assert {j["clip"]: j["status"] for j in m["jobs"]} == {c: "done" for c in CLIPS}
    for j in m["jobs"]:  # the real file is recorded, not the link made for the renderer
        assert j["adopted_from"]["path"] == str((d / f"{j['clip']}.mkv").resolve())
    # the same jobs as render -r import of files renamed to job ids
    ren = farm(tmp_path, "renamed", {j["clip"]: f"{j['id']}.mkv" for j in m["jobs"]})
    code, _out, err = cli(
        "render",
        SUITE,
        "-r",
        "import",
        "-O",
        f"dir={ren}",
        "--label",
        "farm-a",
        "--out",
        tmp_path / "runs2",
        "--quiet",
    )
    assert code == 0, err
    m2 = read_manifest(tmp_path / "runs2" / "farm-a")
    assert [(j["id"], j["output"]["sha256"]) for j in m2["jobs"]] == [
        (j["id"], j["output"]["sha256"]) for j in m["jobs"]
    ]
    assert not any(p.name.startswith(".import-") for p in (tmp_path / "runs").iterdir())


def test_a_mapping_file_and_a_pattern(cli, tmp_path):
    d = farm(tmp_path, "farm", {"astronaut_pan": "job_0017.mp4.mkv", "hubble_object": "job_0042.mkv"})
    mp = tmp_path / "map.yaml"
    mp.write_text("astronaut_pan: job_0017.mp4.mkv\nhubble_object: job_0042.mkv\n")
    code, out, err = cli("import", SUITE, d, "--label", "b", "--map", mp, "--out", tmp_path / "r", "--quiet")
    assert code == 0 and "b: 2 imported" in out, err
    d2 = farm(tmp_path, "farm2", {c: f"farmB_{c}_take3.mkv" for c in CLIPS})
    code, out, err = cli(
        "import",
        SUITE,
        d2,
        "--label",
        "c",
        "--pattern",
        "farmB_{clip}_*.mkv",
        "--out",
        tmp_path / "r",
        "--quiet",
    )
    assert code == 0 and "c: 2 imported" in out, err


def test_a_missing_file_is_one_line_naming_what_was_looked_for(cli, tmp_path):
    d = farm(tmp_path, "farm", {"astronaut_pan": "astronaut_pan.mkv"})
    code, _out, err = cli("import", SUITE, d, "--label", "a", "--out", tmp_path / "r")
    assert code == 2
    assert_one_line_error(err, str(d), "no file for job hubble_object", "hubble_object.mkv")
