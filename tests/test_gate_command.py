"""``evalkit gate REPORT --gate FILE``: a saved report judged again without a new compare, with
the same verdict, lines and exit code as ``compare --gate``; gates that record their conventions
refuse reports measured under others (tOF with the torch flow against a gate set on DIS)."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
from conftest import DATASETS, assert_one_line_error, run_evalkit

pytestmark = (
    pytest.mark.slow
)  # every check as a real `evalkit` process (the limits in-process: test_boundaries)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two fake-rendered runs (the smoke clips, one seed; bf16 adds noise: a real difference)."""
    from evalkit.render.driver import render_suite

    root = tmp_path_factory.mktemp("gate")
    suite = root / "suite.yaml"
    suite.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: gatetest
        clips:
          - {{id: pan, path: {DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"}}}
          - {{id: obj, path: {DATASETS / "smoke" / "clips" / "hubble_object.mkv"}}}
        prompts: ["a"]
        seeds: [0]
    """)
    )
    render_suite(
        suite,
        ["cpu", "cpu,dtype=bf16"],
        root / "runs",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )
    return root / "runs" / "cpu", root / "runs" / "cpu_dtype-bf16"


PASS_GATE = "lpips: {mean: {max: 0.5}}\nssim: {worst: {min: 0.0}}\n"


@pytest.fixture(scope="module")
def compared(runs, tmp_path_factory):
    """``compare --gate`` of the two runs (a passing gate): the process and its report, shared
    read-only."""
    a, b = runs
    root = tmp_path_factory.mktemp("compared")
    gate = write(root / "pass.yaml", PASS_GATE)
    r = run_evalkit("compare", a, b, "--out", root / "report", "--gate", gate, "--device", "cpu", "--quiet")
    assert r.returncode == 0, r.stderr
    return r, root / "report", gate


def gate_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("gate: ")) :]


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_a_saved_report_is_judged_as_compare_judged_it(runs, compared, tmp_path):
    a, b = runs
    r, report, lpips_gate = compared
    summary = json.loads((report / "summary.json").read_text())
    value = summary["aggregates"]["lpips"]["mean"]
    assert value > 1e-5  # a real difference (a few levels of noise)
    g = run_evalkit("gate", report, "--gate", lpips_gate)
    assert (r.returncode, gate_lines(r.stdout)) == (g.returncode, gate_lines(g.stdout)) == (0, ["gate: PASS"])
    # the boundary: a limit equal to the value passes (max is inclusive), one ulp below fails
    # (the summary's value is the float the gate reads: repr round-trips exactly)
    at = write(tmp_path / "at.yaml", f"lpips: {{mean: {{max: {value!r}}}}}\n")
    below = write(tmp_path / "below.yaml", f"lpips: {{mean: {{max: {value * (1 - 2**-52)!r}}}}}\n")
    assert run_evalkit("gate", report, "--gate", at).returncode == 0
    g = run_evalkit("gate", report, "--gate", below)
    assert g.returncode == 1 and gate_lines(g.stdout)[0] == "gate: FAIL"
    assert f"lpips mean = {value:.6g}" in g.stdout
    # a failing gate: the same lines and exit code 1 from both commands
    fail = write(tmp_path / "fail.yaml", "lpips: {mean: {max: 0.000001}}\ntof: {mean: {max: 1000}}\n")
    r = run_evalkit(
        "compare", a, b, "--out", tmp_path / "report2", "--gate", fail, "--device", "cpu", "--quiet"
    )
    g = run_evalkit("gate", report, "--gate", fail)
    assert r.returncode == g.returncode == 1, (r.stderr, g.stderr)
    assert gate_lines(r.stdout) == gate_lines(g.stdout)
    assert len(gate_lines(g.stdout)) == 2 and "lpips mean" in gate_lines(g.stdout)[1]
    js = json.loads(run_evalkit("gate", report, "--gate", fail, "--json").stdout)
    assert js["verdict"] == "fail" and [c["pass"] for c in js["checks"]] == [False, True, True, True]
    assert js["checks"][-1]["check"] == "temporal offset" and js["checks"][-1]["value"] == 0


def test_a_gate_with_conventions_refuses_a_report_measured_under_others(runs, compared, tmp_path):
    a, b = runs
    report = compared[1]
    gate = write(
        tmp_path / "gate.yaml", "# set on this machine\ntof: {mean: {max: 100}}\nlpips: {mean: {max: 1}}\n"
    )
    pinned = run_evalkit("gate", report, "--gate", gate, "--pin")
    assert pinned.returncode == 0, pinned.stderr
    text = gate.read_text()
    assert text.startswith("# set on this machine\n") and "conventions:\n  flow: " in text
    conventions = json.loads((report / "summary.json").read_text())["conventions"]
    assert conventions["flow"].startswith("dis")  # the CPU's flow
    # the same report: judged; another flow: refused in one line naming the field
    assert run_evalkit("gate", report, "--gate", gate).returncode == 0
    torch_report = tmp_path / "torch"
    shutil.copytree(report, torch_report)
    s = json.loads((torch_report / "summary.json").read_text())
    s["conventions"]["flow"] = "torch-clg-v2,luma8"
    (torch_report / "summary.json").write_text(json.dumps(s))
    g = run_evalkit("gate", torch_report, "--gate", gate)
    assert g.returncode == 2
    assert_one_line_error(
        g.stderr, str(gate), "conventions.flow", "torch-clg-v2,luma8", "--ignore-conventions"
    )
    assert run_evalkit("gate", torch_report, "--gate", gate, "--ignore-conventions").returncode == 0
    # compare --gate refuses before measuring anything: no report is written
    c = run_evalkit(
        "compare",
        a,
        b,
        "--out",
        tmp_path / "never",
        "--gate",
        gate,
        "--device",
        "cpu",
        "--flow",
        "torch",
        "--quiet",
    )
    assert c.returncode == 2
    assert_one_line_error(c.stderr, "conventions.flow")
    assert not (tmp_path / "never" / "summary.json").exists()
    # pinning twice is refused; a gate on LPIPS alone pins only LPIPS's convention
    again = run_evalkit("gate", report, "--gate", gate, "--pin")
    assert again.returncode == 2 and "already recorded" in again.stderr
    lp = write(tmp_path / "lp.yaml", "lpips: {mean: {max: 1}}\n")
    assert run_evalkit("gate", torch_report, "--gate", lp, "--pin").returncode == 0
    assert lp.read_text().endswith("conventions:\n  lpips: " + json.dumps(conventions["lpips"]) + "\n")


def test_bad_reports_and_gates_are_one_line_errors(compared, tmp_path):
    report = compared[1]
    # a report compared without temporal metrics (--no-temporal): no tOF, no flow convention
    report = tmp_path / "still"
    shutil.copytree(compared[1], report)
    s = json.loads((report / "summary.json").read_text())
    for key in (
        "tof",
        "tlp",
        "warp_error_a",
        "warp_error_b",
        "warp_error_diff",
        "flicker",
        "flicker_a",
        "flicker_b",
    ):
        s["aggregates"].pop(key)
    for key in ("flow", "warp_error", "tlp", "tof", "flicker"):
        s["conventions"].pop(key)
    (report / "summary.json").write_text(json.dumps(s))
    ok = write(tmp_path / "ok.yaml", "lpips: {mean: {max: 1}}\n")
    cases = [
        (("gate", tmp_path / "nowhere", "--gate", ok), "nowhere"),
        (
            (
                "gate",
                report,
                "--gate",
                write(tmp_path / "r.yaml", "floor_ratio: {lpips: {mean: {max: 1}}}\n"),
            ),
            "floor_ratio",
        ),
        (("gate", report, "--gate", write(tmp_path / "t.yaml", "tof: {mean: {max: 1}}\n")), "'tof'"),
        (
            ("gate", report, "--gate", write(tmp_path / "p.yaml", "tof: {mean: {max: 1}}\n"), "--pin"),
            "conventions.flow",
        ),
    ]
    bad = tmp_path / "bad"
    shutil.copytree(report, bad)
    s = json.loads((bad / "summary.json").read_text())
    (bad / "summary.json").write_text(json.dumps({**s, "schema_version": 99}))
    cases.append((("gate", bad, "--gate", ok), "schema_version"))
    for args, needle in cases:
        r = run_evalkit(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert_one_line_error(r.stderr, needle)


def test_pin_through_a_link_pins_the_target_and_keeps_the_link(compared, tmp_path):
    """`gate --pin` on a gate reached through a symlink (a shared gate linked into a repo):
    the file it points to gets the conventions, and the link is still a link to it."""
    _, report, _ = compared
    (tmp_path / "shared").mkdir()
    target = write(tmp_path / "shared" / "gate.yaml", "tof: {mean: {max: 5}}\n")
    link = tmp_path / "gate.yaml"
    link.symlink_to(target)
    r = run_evalkit("gate", report, "--gate", link, "--pin")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert "conventions:" in target.read_text() and "flow" in target.read_text()
    again = run_evalkit("gate", report, "--gate", link)  # the pinned gate judges the report
    assert again.returncode in (0, 1) and "gate: " in again.stdout, again.stderr
