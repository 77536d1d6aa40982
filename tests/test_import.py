"""Imported runs as first-class backends: renders from two "farms" (a video file per job from
one, PNG frame folders from the other), each adopted with its label and the fingerprint of the
machine that made them, a seed floor imported by the documented naming rule, `compare` pairing
them, and the bad input of `--label` and `--fingerprint`. Real codecs, real LPIPS, the real CLI.
"""

from __future__ import annotations

import copy
import json
import platform
import shutil

import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error

from evalkit import video
from evalkit.compare.report import FLOOR_NOTICE, same_run_warnings
from evalkit.formats.run import RunDir, read_manifest, run_name
from evalkit.formats.suite import job_id, load_suite
from evalkit.fsutil import sha256_file
from evalkit.testing.suites import write_suite

CLIP = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"

#: two render machines that are not this one (the CPU test machine has no GPU at all)
MACHINES = {
    "mi325x": {
        "host": "farm-amd-07",
        "device": "cuda",
        "device_name": "AMD Instinct MI325X",
        "driver": "6.10.5",
        "hip": "6.4.1",
        "cuda": None,
        "torch": "2.9.0+rocm6.4",
        "dtype": "bf16",
        "attention": "auto",
    },
    "h200": {
        "host": "farm-nv-12",
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "driver": "570.86.15",
        "hip": None,
        "cuda": "12.8",
        "torch": "2.9.0+cu128",
        "dtype": "bf16",
        "attention": "auto",
    },
}


def farm_render(src: np.ndarray, seed: int, machine: str) -> np.ndarray:
    """What a farm "renders": the seed moves the content (a pan of 3 px per seed step), the
    machine adds its own small numeric noise (a 1-2 code value jitter of its own pattern)."""
    rng = np.random.default_rng([seed, 1 + list(MACHINES).index(machine)])
    moved = np.roll(src.astype(np.int16), 3 * seed, axis=2)
    return np.clip(moved + rng.integers(-2, 3, src.shape), 0, 255).astype(np.uint8)


def write_fp(path, machine: str, spec: str | None = "cuda,dtype=bf16"):
    doc = {
        "schema_version": 1,
        "evalkit_version": "0.1.0",
        "created": "2026-11-30T09:00:00+00:00",
        "fingerprint": MACHINES[machine],
    }
    if spec:
        doc["backend"] = {"spec": spec, "device": "cuda", "dtype": "bf16"}
    path.write_text(json.dumps(doc, indent=2))
    return path


@pytest.fixture(scope="module")
def farms(tmp_path_factory):
    """A two-job suite; the MI325X farm's mkv files (seeds 0 and 1, in one folder) and the
    H200 farm's PNG frame folders (seed 0); a fingerprint file from each."""
    from PIL import Image

    root = tmp_path_factory.mktemp("farms")
    suite_path = write_suite(root, CLIP, prompts=("watercolor", "night"), seeds=(0,))
    suite = load_suite(suite_path)
    src = video.read_frames(CLIP)[0]
    amd, nv = root / "amd_out", root / "nv_out"
    amd.mkdir()
    nv.mkdir()
    for job in suite.jobs:
        for seed in (0, 1):  # the floor's files: the job id of the seed rendered (seed 1)
            name = job_id(job.clip, job.prompt, seed, job.params)
            video.write_lossless(amd / f"{name}.mkv", farm_render(src, seed, "mi325x"), 24)
        (nv / job.id).mkdir()
        for i, f in enumerate(farm_render(src, 0, "h200")):
            Image.fromarray(f).save(nv / job.id / f"{i:05d}.png")
    return {
        "root": root,
        "suite": suite_path,
        "jobs": suite.jobs,
        "amd": amd,
        "nv": nv,
        "fp_amd": write_fp(root / "fp_amd.json", "mi325x"),
        "fp_nv": write_fp(root / "fp_nv.json", "h200"),
        "src": src,
    }


@pytest.fixture(scope="module")
def imported(farms):
    """The three imports, through the real CLI: two labelled runs and the AMD seed floor."""
    from evalkit.cli import main

    runs = farms["root"] / "runs"
    for args in (
        ["-O", f"dir={farms['amd']}", "--label", "mi325x-bf16", "--fingerprint", farms["fp_amd"]],
        ["-O", f"dir={farms['nv']}", "--label", "h200-bf16", "--fingerprint", farms["fp_nv"]],
        [
            "-O",
            f"dir={farms['amd']}",
            "--label",
            "mi325x-bf16",
            "--fingerprint",
            farms["fp_amd"],
            "--seed-offset",
            "1",
        ],
    ):
        assert (
            main(
                [
                    "render",
                    str(farms["suite"]),
                    "-r",
                    "import",
                    *map(str, args),
                    "--out",
                    str(runs),
                    "--quiet",
                ]
            )
            == 0
        )
    return {"amd": runs / "mi325x-bf16", "nv": runs / "h200-bf16", "floor": runs / "mi325x-bf16_seed+1"}


def test_labelled_imports_record_the_machine_that_rendered_and_where_files_came_from(farms, imported):
    assert sorted(p.name for p in imported["amd"].parent.iterdir()) == [
        "h200-bf16",
        "mi325x-bf16",
        "mi325x-bf16_seed+1",
    ]
    for key, machine, fp_file in (("amd", "mi325x", "fp_amd"), ("nv", "h200", "fp_nv")):
        m = read_manifest(imported[key])
        assert m["label"] == imported[key].name and run_name(m) == m["label"]
        # the fingerprint is the render machine's, not this one's; this one's is kept apart
        assert m["fingerprint"] == MACHINES[machine]
        assert m["adopted"]["local_fingerprint"]["host"] == platform.node()
        fp = m["adopted"]["fingerprint_file"]
        assert fp["path"] == str(farms[fp_file].resolve())
        assert fp["sha256"] == sha256_file(farms[fp_file])
        assert fp["content"] == json.loads(farms[fp_file].read_text())
        # the backend is the one the fingerprint file names: recorded, never applied (no GPU here)
        assert m["backend"]["spec"] == "cuda,dtype=bf16"
        assert m["adopted"]["backend_from"] == "fingerprint file"
        # no claim about the starting noise of files that were only copied in
        assert m["renderer"]["noise"] is None and "rendered elsewhere" in m["renderer"]["noise_note"]
        assert m["renderer"]["options"]["dir"] == str(farms[key].resolve())
        for rec in m["jobs"]:
            assert rec["status"] == "done" and rec["effective_seed"] == 0
            src = rec["adopted_from"]
            assert src["path"] == str((farms[key] / rec["id"]).resolve()) + (".mkv" if key == "amd" else "")
            assert src["kind"] == ("video" if key == "amd" else "frames")
            if key == "amd":
                assert src["sha256"] == sha256_file(src["path"])
            frames = video.read_frames(imported[key] / "clips" / f"{rec['id']}.mkv")[0]
            assert np.array_equal(frames, farm_render(farms["src"], 0, machine))


def test_a_seed_floor_is_imported_from_the_files_of_the_seed_actually_rendered(farms, imported):
    m = read_manifest(imported["floor"])
    assert m["label"] == "mi325x-bf16" and m["notes"]["seed_offset"] == 1
    for rec, job in zip(m["jobs"], farms["jobs"]):
        assert rec["id"] == job.id and rec["effective_seed"] == 1  # paired by the run's id
        seed1 = job_id(job.clip, job.prompt, 1, job.params)
        assert "-s1-" in seed1 and rec["adopted_from"]["path"] == str(farms["amd"].resolve() / f"{seed1}.mkv")
        frames = video.read_frames(imported["floor"] / "clips" / f"{job.id}.mkv")[0]
        assert np.array_equal(frames, farm_render(farms["src"], 1, "mi325x"))


def test_a_missing_floor_file_names_the_exact_path_and_suite_validate_lists_the_names(farms, cli):
    code, out, err = cli(
        "render",
        farms["suite"],
        "-r",
        "import",
        "-O",
        f"dir={farms['nv']}",
        "--label",
        "h200-bf16",
        "--seed-offset",
        "1",
        "--out",
        farms["root"] / "runs_nofloor",
        "--quiet",
    )
    assert code == 1, err
    for job in farms["jobs"]:
        expected = farms["nv"] / job_id(job.clip, job.prompt, 1, job.params)
        assert (
            f"failed {job.id}: no render for job {job.id} at seed 1 (seed 0 + offset): "
            f"expected {expected}.mkv" in out
        )
    assert "note: h200-bf16_seed+1 holds renders made elsewhere and no --fingerprint" in out
    code, out, err = cli("suite", "validate", farms["suite"], "--jobs", "--seed-offset", "1")
    assert code == 0, err
    rows = [ln.split("\t") for ln in out.splitlines()[1:]]
    assert [(r[0], r[3], r[-1]) for r in rows] == [
        (job_id(j.clip, j.prompt, 1, j.params), "seed=1", f"job={j.id}") for j in farms["jobs"]
    ]


def test_compare_and_study_of_two_imports_name_them_by_label_and_show_both_machines(
    farms, imported, cli, tmp_path
):
    out = tmp_path / "report"
    code, stdout, err = cli(
        "compare",
        imported["amd"],
        imported["nv"],
        "--floor",
        imported["floor"],
        "--out",
        out,
        "--device",
        "cpu",
        "--no-temporal",
        "--quiet",
    )
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert (s["runs"]["a"]["name"], s["runs"]["b"]["name"]) == ("mi325x-bf16", "h200-bf16")
    assert s["runs"]["a"]["label"] == "mi325x-bf16"
    assert s["runs"]["a"]["fingerprint"]["device_name"] == "AMD Instinct MI325X"
    assert s["runs"]["b"]["fingerprint"]["device_name"] == "NVIDIA H200"
    assert s["runs"]["b"]["fingerprint_source"].startswith(f"adopted from {farms['fp_nv'].resolve()}")
    assert s["fingerprint_differences"]["device_name"] == ["AMD Instinct MI325X", "NVIDIA H200"]
    assert "host" not in s["fingerprint_differences"]
    # same backend spec on both sides, but two machines: no "differences come only from..."
    assert "warnings" not in s and "warning:" not in stdout
    assert len(s["jobs"]["compared"]) == 2 and not s["jobs"]["not_compared"]
    floor = s["floors"]["seed"]
    assert floor["name"] == "mi325x-bf16" and floor["seed_offset"] == 1
    assert floor["jobs_compared"] == 2 and s["floor_notice"] is None
    assert 0 < s["floor_ratios"]["seed"]["lpips"]["mean"] < 1  # machine noise below a seed
    assert "LPIPS mean / seed floor" in stdout and "no noise floor" not in stdout
    html = (out / "index.html").read_text()
    assert "<th>A: mi325x-bf16</th><th>B: h200-bf16</th>" in html
    for text in ("AMD Instinct MI325X", "NVIDIA H200", "farm-amd-07", "570.86.15", "adopted from"):
        assert text in html
    assert "Warning:" not in html and "no noise floor" not in html

    # without a floor, the summary, the page and the command say so
    out2 = tmp_path / "report2"
    code, stdout, err = cli(
        "compare",
        imported["amd"],
        imported["nv"],
        "--out",
        out2,
        "--device",
        "cpu",
        "--no-temporal",
        "--quiet",
    )
    assert code == 0, err
    s2 = json.loads((out2 / "summary.json").read_text())
    assert s2["floor_notice"] == FLOOR_NOTICE and s2["floors"] == {}
    assert f"note: {FLOOR_NOTICE}" in stdout.splitlines()
    assert "<b>Note:</b> no noise floor: these numbers cannot be read" in (out2 / "index.html").read_text()

    # a study made from the report records the labelled run folders
    from evalkit.study import create_study
    from evalkit.study.store import open_db, studies

    made = create_study(out, tmp_path / "s.db", protocol="abx", seed=3, allow_masking=True)
    with open_db(tmp_path / "s.db").engine.connect() as conn:
        row = conn.execute(studies.select().where(studies.c.id == made["study"])).one()
    assert (row.run_a, row.run_b) == (str(imported["amd"].resolve()), str(imported["nv"].resolve()))


def test_fingerprint_command_prints_what_render_records_and_render_adopts_it(farms, cli, tmp_path):
    code, out, err = cli("fingerprint", "-b", "cpu,dtype=bf16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["backend"]["spec"] == "cpu,dtype=bf16"
    code, _, err = cli(
        "render",
        farms["suite"],
        "-b",
        "cpu,dtype=bf16",
        "-r",
        "evalkit.testing.renderers:Invert",
        "--out",
        tmp_path / "here",
        "--quiet",
    )
    assert code == 0, err
    recorded = read_manifest(tmp_path / "here" / "cpu_dtype-bf16")["fingerprint"]
    assert recorded == doc["fingerprint"]
    assert "label" not in read_manifest(tmp_path / "here" / "cpu_dtype-bf16")
    code, text, _ = cli("fingerprint")
    assert code == 0 and "device_name" in text
    # the file, saved, is adopted by an import with no -b: its backend spec comes with it
    fp = tmp_path / "fp.json"
    code, text, err = cli("fingerprint", "-b", "cpu,dtype=bf16", "--out", fp)
    assert code == 0 and text.startswith(f"wrote {fp}"), err
    saved = json.loads(fp.read_text())
    assert saved["fingerprint"] == doc["fingerprint"] and saved["backend"] == doc["backend"]
    code, out, err = cli(
        "render",
        farms["suite"],
        "-r",
        "import",
        "-O",
        f"dir={farms['amd']}",
        "--fingerprint",
        fp,
        "--out",
        tmp_path / "runs",
        "--quiet",
    )
    assert code == 0, err
    m = read_manifest(tmp_path / "runs" / "cpu_dtype-bf16")  # no label: named by the spec
    assert m["fingerprint"] == doc["fingerprint"] and "label" not in m
    assert "cpu,dtype=bf16: 2 rendered" in out


def test_an_import_with_only_a_gpu_spec_works_on_a_cpu_machine_and_claims_no_machine(farms, cli, tmp_path):
    code, out, err = cli(
        "render",
        farms["suite"],
        "-b",
        "cuda,dtype=bf16",
        "-r",
        "import",
        "-O",
        f"dir={farms['amd']}",
        "--out",
        tmp_path,
        "--quiet",
    )
    assert code == 0, err
    m = read_manifest(tmp_path / "cuda_dtype-bf16")
    assert m["backend"]["spec"] == "cuda,dtype=bf16" and m["adopted"]["backend_from"] == "--backend"
    assert list(m["fingerprint"]) == ["unknown"] and m["adopted"]["fingerprint_file"] is None
    assert m["adopted"]["local_fingerprint"]["host"] == platform.node()
    assert "note: cuda_dtype-bf16 holds renders made elsewhere and no --fingerprint" in out


def test_label_on_a_local_renderer_names_its_folder_and_a_resume_keeps_it(farms, cli, tmp_path):
    args = (
        "render",
        farms["suite"],
        "-b",
        "cpu",
        "-r",
        "evalkit.testing.renderers:Invert",
        "--label",
        "laptop.fp32",
        "--out",
        tmp_path,
        "--quiet",
    )
    code, out, err = cli(*args)
    assert code == 0 and "laptop.fp32: 2 rendered" in out, err
    code, out, err = cli(*args)
    assert code == 0 and "laptop.fp32: 0 rendered, 2 already done" in out, err
    m = read_manifest(tmp_path / "laptop.fp32")
    assert m["label"] == "laptop.fp32" and m["backend"]["spec"] == "cpu"
    assert "adopted" not in m and m["fingerprint"]["host"] == platform.node()
    # the same folder cannot hold another label's run
    (tmp_path / "other").mkdir()
    shutil.copytree(tmp_path / "laptop.fp32", tmp_path / "other" / "cpu")
    code, _, err = cli(
        "render",
        farms["suite"],
        "-b",
        "cpu",
        "-r",
        "evalkit.testing.renderers:Invert",
        "--out",
        tmp_path / "other",
        "--quiet",
    )
    assert code == 2
    assert_one_line_error(err, "already holds a different run", "label 'laptop.fp32' != None")


def test_old_manifests_without_label_or_adopted_still_load(farms, imported, tmp_path):
    run = shutil.copytree(imported["amd"], tmp_path / "old")
    m = json.loads((run / "manifest.json").read_text())
    for key in ("label", "adopted"):
        del m[key]
    for rec in m["jobs"]:
        del rec["adopted_from"]
    (run / "manifest.json").write_text(json.dumps(m))
    assert run_name(RunDir.open(run).manifest) == "cuda,dtype=bf16"
    m["label"] = "a b"
    (run / "manifest.json").write_text(json.dumps(m))
    from evalkit.errors import InputFileError

    with pytest.raises(InputFileError, match=r"field 'label': expected 1-64 letters"):
        read_manifest(run)


def test_the_same_run_warning_says_only_what_is_true():
    base = {"backend": {"spec": "cpu"}, "fingerprint": {"host": "x", "driver": "1"}}
    other = copy.deepcopy(base)
    other["fingerprint"]["driver"] = "2"
    diff = {"driver": ["1", "2"]}
    [w] = same_run_warnings(base, other, diff)
    assert w.startswith("both runs are backend 'cpu'") and "driver differ" in w
    [w] = same_run_warnings(base, base, {})
    assert "match apart from the host" in w and "not a backend change" in w
    la, lb = (dict(copy.deepcopy(base), label=x) for x in ("mi325x", "h200"))
    assert same_run_warnings(la, lb, diff) == []  # two named machines
    unknown = dict(copy.deepcopy(base), fingerprint={"unknown": "..."})
    [w] = same_run_warnings(unknown, unknown, {})
    assert "not known" in w
    assert (
        same_run_warnings(
            {"backend": {"spec": None}, "fingerprint": {}}, {"backend": {"spec": None}, "fingerprint": {}}, {}
        )
        == []
    )


def _bad_fp(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "case",
    [
        "label-space",
        "label-path",
        "label-dots",
        "label-two-backends",
        "no-name",
        "fp-missing",
        "fp-not-json",
        "fp-no-version",
        "fp-empty",
        "fp-bad-value",
        "fp-unknown-key",
        "fp-bad-spec",
        "fp-other-backend",
        "suite-offset-alone",
    ],
)
def test_bad_label_and_fingerprint_input_is_one_line_and_exit_2(case, farms, cli, tmp_path):
    imp = [
        "render",
        farms["suite"],
        "-r",
        "import",
        "-O",
        f"dir={farms['amd']}",
        "--out",
        tmp_path / "o",
        "--quiet",
    ]
    good = json.loads(farms["fp_amd"].read_text())

    def fp_with(**changes):
        return _bad_fp(tmp_path, "fp.json", json.dumps({**good, **changes}))

    args, needles = {
        "label-space": lambda: (
            imp + ["--label", "mi325x bf16"],
            ["--label: expected a run label of 1-64 letters", "found 'mi325x bf16'"],
        ),
        "label-path": lambda: (imp + ["--label", "../elsewhere"], ["--label", "found '../elsewhere'"]),
        "label-dots": lambda: (imp + ["--label", ".."], ["--label", "found '..'"]),
        "label-two-backends": lambda: (
            [
                "render",
                farms["suite"],
                "-b",
                "cpu",
                "-b",
                "cpu,dtype=bf16",
                "-r",
                "evalkit.testing.renderers:Invert",
                "--label",
                "x",
                "--out",
                tmp_path / "o",
            ],
            ["--label: names one run", "found 2"],
        ),
        "no-name": lambda: (imp, ["--label: renderer 'import' needs a name for the run"]),
        "fp-missing": lambda: (
            imp + ["--fingerprint", tmp_path / "nope.json"],
            [str(tmp_path / "nope.json"), "not found", "evalkit fingerprint -b SPEC --json"],
        ),
        "fp-not-json": lambda: (
            imp + ["--fingerprint", _bad_fp(tmp_path, "fp.json", "{device: x")],
            ["fp.json", "not valid JSON"],
        ),
        "fp-no-version": lambda: (
            imp + ["--fingerprint", _bad_fp(tmp_path, "fp.json", json.dumps({"fingerprint": {"a": 1}}))],
            ["fp.json", "field 'schema_version': missing (expected 1)"],
        ),
        "fp-empty": lambda: (
            imp + ["--fingerprint", fp_with(fingerprint={})],
            ["fp.json", "field 'fingerprint'", "at least one entry"],
        ),
        "fp-bad-value": lambda: (
            imp + ["--fingerprint", fp_with(fingerprint={"driver": ["5", "6"]})],
            ["fp.json", "field 'fingerprint.driver'", "expected a string, number"],
        ),
        "fp-unknown-key": lambda: (
            imp + ["--fingerprint", fp_with(gpu="x")],
            ["fp.json", "field 'gpu'", "unknown key"],
        ),
        "fp-bad-spec": lambda: (
            imp + ["--fingerprint", fp_with(backend={"spec": "tpu,dtype=bf16"})],
            ["fp.json", "field 'backend.spec'", "device 'tpu'"],
        ),
        "fp-other-backend": lambda: (
            imp + ["-b", "cuda,dtype=fp32", "--fingerprint", farms["fp_amd"]],
            [
                "fp_amd.json",
                "field 'backend.spec': 'cuda,dtype=bf16' differs "
                "from --backend 'cuda' (the fingerprint was taken for another "
                "backend)",
            ],
        ),
        "suite-offset-alone": lambda: (
            ["suite", "validate", farms["suite"], "--seed-offset", "1"],
            ["--seed-offset: only with --jobs"],
        ),
    }[case]()
    code, out, err = cli(*args)
    assert code == 2, (out, err)
    assert_one_line_error(err, *needles)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.slow  # a second import of the farm
def test_an_import_on_a_gpu_machine_is_utvideo_and_adopts_several_files_at_once(
    farms, imported, tmp_path, monkeypatch
):
    """On a machine with a GPU (where compare would be decode-bound on FFV1) a new import is
    stored in the fast format, and its files are adopted two at a time here: the same frames as
    the one-at-a-time FFV1 import, every job recorded, in suite order."""
    from evalkit.cli import main
    from evalkit.render import driver, local_executor

    seen = []
    real = local_executor.LocalExecutor.render_job

    def render_job(*a, **kw):  # which threads adopt (the real work, unchanged)
        import threading

        seen.append(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(driver, "accelerator_here", lambda: True)
    monkeypatch.setattr(local_executor, "adopt_workers", lambda: 2)
    monkeypatch.setattr(local_executor.LocalExecutor, "render_job", staticmethod(render_job))
    assert (
        main(
            [
                "render",
                str(farms["suite"]),
                "-r",
                "import",
                "-O",
                f"dir={farms['amd']}",
                "--label",
                "mi325x-bf16",
                "--fingerprint",
                str(farms["fp_amd"]),
                "--out",
                str(tmp_path),
                "--quiet",
            ]
        )
        == 0
    )
    run = tmp_path / "mi325x-bf16"
    m = read_manifest(run)
    assert m["lossless"]["codec"] == "utvideo"
    assert [r["id"] for r in m["jobs"]] == [j.id for j in farms["jobs"]]
    assert len(seen) == 2 and all(n.startswith("evalkit-adopt") for n in seen)
    for rec in m["jobs"]:
        ours = video.read_frames(run / "clips" / f"{rec['id']}.nut")[0]
        theirs = video.read_frames(imported["amd"] / "clips" / f"{rec['id']}.mkv")[0]
        assert np.array_equal(ours, theirs)
    # a machine without a GPU keeps FFV1 (the fixture's imports)
    assert read_manifest(imported["amd"])["lossless"]["codec"] == "ffv1"


def test_files_adopted_at_once_are_each_checked_against_their_own_source(tmp_path, monkeypatch):
    """Several jobs adopted at once ask for their sources' frame counts at once: each job is
    checked against its own clip's count (clips of 12 and 20 frames here), never another's."""
    from evalkit.render import driver, local_executor
    from evalkit.render.renderers.imported import import_name

    rng = np.random.default_rng(5)
    lengths = {"short": 12, "long": 20}
    for cid, n in lengths.items():
        video.write_lossless(
            tmp_path / f"{cid}.mkv", rng.integers(0, 256, (n, 24, 32, 3), dtype=np.uint8), 24
        )
    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text(
        "schema_version: 1\nname: two\nclips:\n"
        + "".join(f"  - {{id: {c}, path: {c}.mkv}}\n" for c in lengths)
        + "prompts: [a, b]\nseeds: [0]\n"
    )
    farm = tmp_path / "farm"
    farm.mkdir()
    suite = load_suite(suite_path)
    for job in suite.jobs:
        shutil.copy(tmp_path / f"{job.clip}.mkv", farm / f"{import_name(job, job.seed)}.mkv")
    monkeypatch.setattr(local_executor, "adopt_workers", lambda: 4)
    s = driver.render_suite(
        suite_path,
        [],
        tmp_path / "runs",
        renderer="import",
        options={"dir": str(farm)},
        label="farm",
        progress=False,
    )
    assert s[0].failed == 0 and s[0].done == 4
    for rec in read_manifest(tmp_path / "runs" / "farm")["jobs"]:
        assert rec["output"]["frames"] == lengths[rec["clip"]]


def test_renders_cut_with_an_edit_list_are_imported_and_measured_as_a_player_shows_them(tmp_path, cli):
    """Sources and renders cut without re-encoding (``ffmpeg -ss 1.3 -i in.mp4 -c copy``:
    MP4/MOV edit lists hiding the frames before the cut) are adopted by ``render -r import``
    and measured by ``metrics``: the frames ffmpeg shows (40 of the 48 in the files), byte for
    byte. Cut at 1.45 s, the open-GOP clips (H.264 open-gop, HEVC, MPEG-4) keep a frame shown
    before their first key frame that cannot be decoded: 36 shown of 37 not hidden. The same
    render with its last bytes cut off is refused in one line, exit 2."""
    import cuts

    from evalkit.render.renderers.imported import import_name

    #: clip: (source codec, cut at, the renders' codecs and extensions)
    clips = {
        "cut": ("x264", 1.3, [("x265", ".mp4"), ("x264open", ".mov")]),
        "open": ("x264open", 1.45, [("x265", ".mp4"), ("mpeg4", ".mp4")]),
    }
    shown = {}
    for cid, (name, ss, _) in clips.items():
        src = cuts.cut(cuts.encode(tmp_path / f"{cid}_full.mp4", name), tmp_path / f"{cid}.mp4", ss)
        shown[cid] = len(cuts.player_frames(src))
        total, cut_off = cuts.packets(src)
        assert (shown[cid], total - cut_off) == {"cut": (40, 40), "open": (36, 37)}[cid]
    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text(
        "schema_version: 1\nname: cut\nclips:\n"
        + "".join(f"  - {{id: {c}, path: {c}.mp4}}\n" for c in clips)
        + "prompts: [a, b]\nseeds: [0]\n"
    )
    farm = tmp_path / "farm"
    farm.mkdir()
    renders, fulls = {}, {}
    jobs = load_suite(suite_path).jobs
    for cid, (_, ss, made) in clips.items():
        for job, (name, ext) in zip([j for j in jobs if j.clip == cid], made):
            name = name if cuts.available(name) else "x264open"
            full = fulls[job.id] = cuts.encode(tmp_path / f"{job.id}_full.mp4", name, shift=1 + len(renders))
            renders[job.id] = cuts.cut(full, farm / f"{import_name(job, job.seed)}{ext}", ss)
            assert len(cuts.player_frames(renders[job.id])) == shown[cid], job.id
    code, out, err = cli(
        "render",
        suite_path,
        "-r",
        "import",
        "-O",
        f"dir={farm}",
        "--label",
        "farm",
        "--out",
        tmp_path / "runs",
        "--quiet",
    )
    assert code == 0, err
    run = tmp_path / "runs" / "farm"
    recs = read_manifest(run)["jobs"]
    assert sorted(r["id"] for r in recs) == sorted(renders)
    for rec in recs:
        assert rec["output"]["frames"] == shown[rec["clip"]]
        stored = video.read_frames(next((run / "clips").glob(f"{rec['id']}.*")))[0]
        assert np.array_equal(stored, cuts.player_frames(renders[rec["id"]]))

    for cid in clips:
        job = next(r["id"] for r in recs if r["clip"] == cid)
        code, out, err = cli(
            "metrics",
            tmp_path / f"{cid}.mp4",
            renders[job],
            "--json",
            "--device",
            "cpu",
            "--no-temporal",
            "--quiet",
        )
        assert code == 0, err
        r = json.loads(out)
        assert r["frames"] == shown[cid] and r["identical"] is False

    bad = tmp_path / "bad.mp4"
    job = next(r["id"] for r in recs if r["clip"] == "cut")
    whole = cuts.cut(fulls[job], tmp_path / "fs.mp4", 1.3, None, "-movflags", "+faststart")  # index first
    bad.write_bytes(whole.read_bytes()[:-30])
    code, out, err = cli("metrics", tmp_path / "cut.mp4", bad, "--device", "cpu", "--no-temporal", "--quiet")
    assert code == 2
    assert_one_line_error(err, str(bad), "truncated")
