"""The Ray executor with a real Ray cluster on loopback: two raylets (nodes) in this machine,
started once for this module (ray.cluster_utils.Cluster), no mocks.

Node "A" has 2 CPUs and the custom resource rA, node "B" 2 CPUs and rB.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import DATASETS, ROOT, assert_one_line_error
from test_render import make_suite

from evalkit.compare.run import compare_runs
from evalkit.formats.run import read_manifest, sha256_file
from evalkit.render.driver import render_suite

pytestmark = pytest.mark.slow  # a real Ray cluster

SMOKE = DATASETS / "smoke" / "suite.yaml"
ENV = dict(os.environ)


@pytest.fixture(scope="module")
def worker_tmp(tmp_path_factory):
    """The temp folder of this module's Ray workers (``TMPDIR`` of the raylets it starts and of
    the CLI runs; Ray's own session files stay in the usual place)."""
    import tempfile

    tmp = tmp_path_factory.mktemp("worker-tmp")
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "RAY_TMPDIR")}
    os.environ["RAY_TMPDIR"] = saved["RAY_TMPDIR"] or tempfile.gettempdir()
    os.environ["TMPDIR"] = str(tmp)
    ENV.update(TMPDIR=os.environ["TMPDIR"], RAY_TMPDIR=os.environ["RAY_TMPDIR"])
    yield tmp
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def no_scratch_left(worker_tmp):
    """After every test, no worker's scratch folder is left (the product removes them)."""
    yield
    left = sorted(p.name for p in worker_tmp.glob("evalkit-ray-*"))
    assert left == [], f"Ray workers left their scratch folders: {left}"


@pytest.fixture(scope="module")
def cluster(worker_tmp):
    """Two Ray nodes on 127.0.0.1; workers import the test renderers from evalkit.testing."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # stay on loopback
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args=dict(num_cpus=2, resources={"rA": 1}, include_dashboard=False),
    )
    c.add_node(num_cpus=2, resources={"rB": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in nodes.values())
    yield {
        "ray": ray,
        "node_of": {r: next(i for i, n in nodes.items() if r in n["Resources"]) for r in ("rA", "rB")},
    }
    ray.shutdown()
    c.shutdown()


def executor(**kw):
    from evalkit.executor.ray import RayExecutor

    return RayExecutor(**kw)  # joins the cluster this process is connected to


def jobs_of(run):
    return {j["id"]: j for j in read_manifest(run)["jobs"]}


def assert_complete(run, n):
    """Every job done once, one verified clip per job, nothing else in clips/, no temp files."""
    jobs = jobs_of(run)
    assert len(jobs) == n and all(j["status"] == "done" for j in jobs.values())
    assert sorted(p.name for p in (run / "clips").iterdir()) == sorted(f"{i}.mkv" for i in jobs)
    assert not list(run.rglob(".tmp-*"))
    for j in jobs.values():
        assert sha256_file(run / j["output"]["path"]) == j["output"]["sha256"]
    return jobs


def test_smoke_suite_is_bit_identical_to_the_local_executor(cluster, tmp_path):
    # the suite's own renderer: the canary diffusers pipeline, loaded once per Ray worker
    render_suite(SMOKE, ["cpu"], tmp_path / "local", progress=False)
    s = render_suite(SMOKE, ["cpu"], tmp_path / "ray", progress=False, executor=executor(max_workers=2))
    assert (s[0].done, s[0].failed) == (2, 0)
    local, ray_run = jobs_of(tmp_path / "local" / "cpu"), assert_complete(tmp_path / "ray" / "cpu", 2)
    for jid, rec in ray_run.items():
        assert rec["output"] == local[jid]["output"]  # same sha256, frames, size, fps
        assert (tmp_path / "ray" / "cpu" / rec["preview"]).stat().st_size > 0
        assert rec["node"]["ip"] == "127.0.0.1" and rec["attempts"] == 1
    assert len({r["node"]["worker_pid"] for r in ray_run.values()}) == 2  # two worker processes
    assert os.getpid() not in {r["node"]["worker_pid"] for r in ray_run.values()}
    m = read_manifest(tmp_path / "ray" / "cpu")
    assert m["fingerprint"]["device"] == "cpu" and set(m["nodes"]) == {
        r["node"]["id"] for r in ray_run.values()
    }
    # resume: nothing left to do, the node's fingerprint stays
    again = render_suite(SMOKE, ["cpu"], tmp_path / "ray", progress=False, executor=executor())
    assert (again[0].done, again[0].skipped) == (0, 2)
    assert read_manifest(tmp_path / "ray" / "cpu")["fingerprint"] == m["fingerprint"]


def test_a_command_render_through_ray_is_the_local_one(cluster, tmp_path):
    """The ``command`` renderer writes its files itself (streaming): a Ray worker sends those
    bytes back, in the run's format, the same clips as the local executor's."""
    import sys

    suite = make_suite(tmp_path)
    script = tmp_path / "copy.py"
    script.write_text(
        "import os, shutil\nshutil.copy(os.environ['EVALKIT_INPUT'], "
        "os.path.join(os.environ['EVALKIT_OUTPUT_DIR'], 'out.mkv'))\n"
    )
    opts = {"cmd": f"{sys.executable} {script}"}
    render_suite(suite, ["cpu"], tmp_path / "local", renderer="command", options=opts, progress=False)
    s = render_suite(
        suite,
        ["cpu"],
        tmp_path / "ray",
        renderer="command",
        options=opts,
        progress=False,
        executor=executor(),
    )
    assert s[0].failed == 0
    local, ray = (
        jobs_of(tmp_path / "local" / "cpu"),
        assert_complete(tmp_path / "ray" / "cpu", len(s[0].failures) + s[0].done),
    )
    assert {i: j["output"]["sha256"] for i, j in ray.items()} == {
        i: j["output"]["sha256"] for i, j in local.items()
    }


def test_two_backends_land_on_the_nodes_with_their_resources(cluster, tmp_path):
    suite = make_suite(tmp_path)
    s = render_suite(
        suite,
        ["cpu,resource=rA", "cpu,dtype=bf16,resource=rB"],
        tmp_path / "o",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
        executor=executor(max_workers=1),
    )
    assert [(x.done, x.failed) for x in s] == [(6, 0), (6, 0)]
    for run, res, dtype in (("cpu_resource-rA", "rA", "fp32"), ("cpu_dtype-bf16_resource-rB", "rB", "bf16")):
        jobs = assert_complete(tmp_path / "o" / run, 6)
        assert {j["node"]["id"] for j in jobs.values()} == {cluster["node_of"][res]}
        m = read_manifest(tmp_path / "o" / run)
        assert list(m["nodes"]) == [cluster["node_of"][res]] and m["fingerprint"]["dtype"] == dtype
    pids = {
        j["node"]["worker_pid"]
        for r in ("cpu_resource-rA", "cpu_dtype-bf16_resource-rB")
        for j in jobs_of(tmp_path / "o" / r).values()
    }
    assert len(pids) == 2


def test_an_unknown_resource_is_a_one_line_error(cluster, tmp_path, capsys):
    from evalkit.errors import UserError

    with pytest.raises(UserError, match="no node of the Ray cluster offers resource 'mi325x'"):
        render_suite(
            make_suite(tmp_path),
            ["cpu,resource=mi325x"],
            tmp_path / "o",
            renderer="evalkit.testing.renderers:Invert",
            progress=False,
            executor=executor(),
        )


def _kill_first_worker(markers, killed, stop, tmp):
    """SIGKILL the worker process of the first job that starts (it is sleeping in render);
    ``killed``: (job id, pid, the scratch folders in the workers' ``tmp`` at that moment)."""
    while not stop.is_set():
        found = sorted(markers.iterdir())
        if found:
            job_id, pid = found[0].name.rsplit(".", 1)
            scratch = sorted(p.name for p in tmp.glob("evalkit-ray-*"))
            os.kill(int(pid), signal.SIGKILL)
            killed.append((job_id, int(pid), scratch))
            return
        time.sleep(0.02)


@pytest.mark.parametrize("retries", [2, 0])
def test_a_worker_killed_mid_job_loses_and_duplicates_nothing(cluster, tmp_path, retries, worker_tmp):
    suite = make_suite(tmp_path, prompts=("a", "b"), seeds=(0, 1))
    markers = tmp_path / "markers"
    markers.mkdir()
    opts = {"marker_dir": str(markers), "hold": "1.0"}
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=_kill_first_worker, args=(markers, killed, stop, worker_tmp))
    killer.start()
    try:
        s = render_suite(
            suite,
            ["cpu"],
            tmp_path / "o",
            renderer="evalkit.testing.ray_renderers:PidInvert",
            options=opts,
            progress=False,
            executor=executor(max_workers=2, max_retries=retries),
        )
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 1
    job_id, pid, scratch = killed[0]
    # the killed worker had its scratch folder here (gone now: no_scratch_left checks that)
    assert any(f".{pid}." in name for name in scratch), scratch
    run = tmp_path / "o" / "cpu"
    jobs = jobs_of(run)
    rec = jobs[job_id]
    if retries:
        assert (s[0].done, s[0].failed) == (4, 0)
        assert rec["attempts"] == 2 and "died" in rec["worker_deaths"][0]
        assert rec["node"]["worker_pid"] != pid  # retried in another process
    else:
        # no retries allowed: recorded as failed (with what happened), a re-run renders it
        assert rec["status"] == "failed" and "worker died 1 times" in rec["error"]
        assert s[0].failed >= 1 and s[0].done + s[0].failed == 4
        again = render_suite(
            suite,
            ["cpu"],
            tmp_path / "o",
            renderer="evalkit.testing.ray_renderers:PidInvert",
            options={**opts, "hold": "0"},
            progress=False,
            executor=executor(),
        )
        assert (again[0].done, again[0].skipped) == (s[0].failed, s[0].done)
    jobs = assert_complete(run, 4)
    # and the clips are those of the local executor
    render_suite(
        suite, ["cpu"], tmp_path / "local", renderer="evalkit.testing.renderers:Invert", progress=False
    )
    local = jobs_of(tmp_path / "local" / "cpu")
    assert {i: j["output"]["sha256"] for i, j in jobs.items()} == {
        i: j["output"]["sha256"] for i, j in local.items()
    }


def test_compare_through_ray_gives_the_local_clips_csv(cluster, tmp_path):
    render_suite(
        SMOKE,
        ["cpu", "cpu,dtype=bf16"],
        tmp_path / "runs",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )
    render_suite(
        SMOKE,
        ["cpu"],
        tmp_path / "runs",
        renderer="evalkit.testing.renderers:Invert",
        seed_offset=1,
        progress=False,
    )
    a, b, f = (tmp_path / "runs" / n for n in ("cpu", "cpu_dtype-bf16", "cpu_seed+1"))
    local = compare_runs(a, b, tmp_path / "local", floors=[f], device="cpu", progress=False)
    # CPU workers with as many threads as this process (float32 LPIPS sums on the CPU depend on
    # the thread count), one per node
    import torch

    # the floor measured on Ray too, not reused from the local compare (evalkit.compare.floorcache)
    ray_res = compare_runs(
        a,
        b,
        tmp_path / "ray",
        floors=[f],
        device="cpu",
        progress=False,
        executor=executor(cpus_per_worker=torch.get_num_threads()),
        floor_cache=False,
    )
    for name in ("clips.csv", "frames.csv"):
        assert (tmp_path / "ray" / name).read_text() == (tmp_path / "local" / name).read_text()
    for key in ("aggregates", "floor_ratios", "jobs", "conventions", "metrics_device", "alignment"):
        assert ray_res.summary[key] == local.summary[key]
    assert len(local.summary["jobs"]["compared"]) == 2 and torch.get_num_threads() <= 2


def test_driver_killed_and_restarted_resumes(tmp_path):
    """The CLI with its own local Ray instance: SIGKILL the driver mid-run, run it again."""
    suite = make_suite(tmp_path, prompts=("a", "b", "c"), seeds=(0, 1))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "evalkit",
        "render",
        str(suite),
        "-b",
        "cpu",
        "--out",
        str(out),
        "-r",
        "evalkit.testing.renderers:Invert",
        "-O",
        "sleep=0.5",
        "--quiet",
        "--executor",
        "ray",
        "--ray-workers",
        "1",
    ]
    proc = subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    manifest = out / "cpu" / "manifest.json"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if (
            manifest.exists()
            and sum(j["status"] == "done" for j in json.loads(manifest.read_text())["jobs"]) >= 2
        ):
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with contextlib.suppress(ProcessLookupError):  # what is left of its Ray instance (agents)
        os.killpg(proc.pid, signal.SIGKILL)
    done_before = sum(j["status"] == "done" for j in json.loads(manifest.read_text())["jobs"])
    assert 2 <= done_before < 6
    again = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{6 - done_before} rendered, {done_before} already done, 0 failed" in again.stdout
    assert_complete(out / "cpu", 6)


def test_the_sweep_removes_the_scratch_folders_of_dead_workers_of_this_host_only(tmp_path):
    """A killed worker cannot remove its scratch folder: the next worker's sweep does, for a
    process that is gone (or a zombie), never for a live one or another host's."""
    import platform

    from evalkit.executor.ray import SCRATCH_PREFIX, sweep_scratch

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, not waited for
    stat = f"/proc/{zombie.pid}/stat"
    while open(stat).read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)
    host = platform.node()
    names = {
        "dead": f"{SCRATCH_PREFIX}render.{host}.{dead.pid}.0a1b2c3d",
        "zombie": f"{SCRATCH_PREFIX}compare.{host}.{zombie.pid}.0a1b2c3d",
        "live": f"{SCRATCH_PREFIX}render.{host}.{os.getpid()}.0a1b2c3d",
        "elsewhere": f"{SCRATCH_PREFIX}render.not-{host}.{dead.pid}.0a1b2c3d",
        "other": f"{SCRATCH_PREFIX}notes",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "clip.mkv").write_bytes(b"x")
    try:
        gone = sweep_scratch(tmp_path)
    finally:
        zombie.wait()
    assert sorted(p.name for p in gone) == sorted([names["dead"], names["zombie"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [names["live"], names["elsewhere"], names["other"]]
    )


SHIM = (
    "import sys; sys.modules['ray'] = None  # `import ray` raises ImportError\n"
    "from evalkit.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("command", ["render", "compare"])
def test_missing_ray_is_a_one_line_error_naming_the_extra(command, tmp_path):
    args = {
        "render": ["render", str(SMOKE), "-b", "cpu", "--out", str(tmp_path / "o")],
        "compare": ["compare", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "r")],
    }
    p = subprocess.run(
        [sys.executable, "-c", SHIM, *args[command], "--executor", "ray"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 2
    assert_one_line_error(p.stderr, "Ray is not installed", "pip install 'evalkit[ray]'")


def test_ray_options_need_the_ray_executor(cli, tmp_path):
    code, _, err = cli("render", SMOKE, "-b", "cpu", "--out", tmp_path, "--ray-workers", "2")
    assert code == 2
    assert_one_line_error(err, "--ray-workers: only with --executor ray")


def test_an_unreachable_ray_address_is_a_one_line_error(tmp_path):
    # a fresh process (this one is already connected to the test cluster)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalkit",
            "render",
            str(SMOKE),
            "-b",
            "cpu",
            "--out",
            str(tmp_path),
            "--executor",
            "ray",
            "--ray-address",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode == 2
    assert_one_line_error(p.stderr, "--ray-address 127.0.0.1:1: no Ray head answers there")
