"""A wheel that works: the canary pipeline and the bundled suites ship inside it, the folders
metrics/ and app/ are imported as ``evalkit.metrics`` and ``evalkit.app`` however the code is run
(wheel, editable install, plain checkout on ``PYTHONPATH``) and never as top-level ``metrics`` or
``app``, and outputs are written with ordinary file modes (0644 files, 0755 folders under umask 022).

The wheel test builds a wheel from a copy of the sources, installs it (no dependencies) into a
fresh venv whose only other packages are this environment's (through a ``.pth`` line, which does
not run this environment's ``.pth`` files, so an editable evalkit here stays invisible), and runs
the installed ``evalkit`` from a folder outside the checkout.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tomllib
from conftest import ROOT

from evalkit import fsutil
from evalkit.render.driver import render_suite
from evalkit.render.renderers.diffusers import model_digest

CHECKOUT_MODEL = ROOT / "models" / "canary"
CHECKOUT_DATASETS = ROOT / "datasets"
#: folder of the repository -> where a wheel puts it (pyproject.toml's package-dir)
PACKAGES = {"evalkit": "evalkit", "metrics": "evalkit/metrics", "app": "evalkit/app"}


# -- file modes ------------------------------------------------------------------------------


@pytest.fixture
def umask():
    """Run the test under the given umask (default 022), restoring the old one after."""
    old = os.umask(0o022)
    try:
        yield lambda mask: os.umask(mask)
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, str]:
    """relative path -> octal permission bits of every file and folder under ``root``."""
    return {
        p.relative_to(root).as_posix() + ("/" if p.is_dir() else ""): oct(stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*"))
    }


def test_atomic_writes_give_normal_modes(tmp_path, umask):
    fsutil.atomic_write_json(tmp_path / "a" / "b" / "report.json", {"x": 1})
    fsutil.atomic_write_bytes(tmp_path / "a" / "clip.bin", b"\0" * 10)
    with fsutil.atomic_path(tmp_path / "a" / "video.mkv") as tmp:
        tmp.write_bytes(b"x")
    fd, name = fsutil.mkstemp(dir=tmp_path, suffix=".mp4")
    os.close(fd)
    os.replace(name, tmp_path / "media.mp4")
    assert modes(tmp_path) == {
        "a/": "0o755",
        "a/b/": "0o755",
        "a/b/report.json": "0o644",
        "a/clip.bin": "0o644",
        "a/video.mkv": "0o644",
        "media.mp4": "0o644",
    }
    # the umask is respected like open() respects it
    umask(0o027)
    fsutil.atomic_write_text(tmp_path / "c" / "private.txt", "x")
    assert modes(tmp_path / "c") == {"private.txt": "0o640"}
    assert oct(stat.S_IMODE((tmp_path / "c").stat().st_mode)) == "0o750"


@pytest.mark.slow  # renders
def test_render_and_study_media_give_normal_modes(tmp_path, umask):
    from evalkit.study.media import store_browser_copy

    s = render_suite(
        fsutil.datasets_dir() / "smoke" / "suite.yaml",
        ["cpu"],
        tmp_path / "runs",
        renderer="evalkit.testing.renderers:Invert",
        progress=False,
    )[0]
    assert (s.done, s.failed) == (2, 0)
    found = modes(tmp_path / "runs")
    assert {k for k in found if k.endswith(".mkv")} and {k for k in found if k.endswith(".mp4")}
    assert "cpu/manifest.json" in found
    bad = {k: v for k, v in found.items() if v != ("0o755" if k.endswith("/") else "0o644")}
    assert bad == {}

    frames = np.zeros((4, 32, 32, 3), np.uint8)
    digest = store_browser_copy(frames, 24, tmp_path / "media")
    assert modes(tmp_path / "media") == {f"{digest}.mp4": "0o644"}


# -- shipped data, from the checkout ---------------------------------------------------------


@pytest.mark.slow  # imports diffusers (the canary)
def test_checkout_lookups_find_the_repository_folders():
    # this environment's evalkit is the checkout (editable): the lookups fall back to it
    from evalkit import demo
    from evalkit.canary import MODEL_DIR
    from evalkit.render.renderers import canary

    if Path(fsutil.__file__).resolve().parents[1] == ROOT:
        assert fsutil.canary_model_dir() == MODEL_DIR == canary.MODEL_DIR == CHECKOUT_MODEL
        assert fsutil.datasets_dir() == CHECKOUT_DATASETS
        assert demo.SUITE == CHECKOUT_DATASETS / "canary" / "suite.yaml"
    assert (fsutil.canary_model_dir() / "model_index.json").is_file()
    assert demo.SUITE.is_file() and demo.GATE.is_file()


# -- the wheel -------------------------------------------------------------------------------


def _files(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``root`` (``__pycache__`` left out)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _run(args, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{args} exited with {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def _copy_sources(src: Path) -> Path:
    """What a wheel is built from, copied to ``src`` (no build/ or egg-info left in the checkout)."""
    src.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".tmp-*")
    for name in (
        "pyproject.toml",
        "README.md",
        "MANIFEST.in",
        "setup.py",
        "setup.cfg",
        *PACKAGES,
        "models",
        "datasets",
    ):
        p = ROOT / name
        if p.is_dir():
            # symlinks kept: evalkit/metrics and evalkit/app are links to ../metrics, ../app
            shutil.copytree(p, src / name, ignore=skip, symlinks=True)
        elif p.is_file():
            shutil.copy2(p, src / name)
    return src


def _runtime_closure() -> set[str]:
    """pyproject.toml's runtime dependencies and theirs, as installed here (distribution names,
    markers evaluated for this machine, extras followed)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    here = {}
    for d in importlib.metadata.distributions():
        here.setdefault(_dist(d.metadata["Name"]), d)
    env = default_environment()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    todo = [
        r
        for r in map(Requirement, project["dependencies"])
        if r.marker is None or r.marker.evaluate({**env, "extra": ""})
    ]
    seen: set[tuple[str, str]] = set()
    while todo:
        req = todo.pop()
        name = _dist(req.name)
        assert name in here, f"{req}: a runtime dependency that is not installed here"
        for extra in ("", *sorted(req.extras)):
            if (name, extra) not in seen:
                seen.add((name, extra))
                todo += [
                    r
                    for r in map(Requirement, here[name].requires or [])
                    if r.marker is None or r.marker.evaluate({**env, "extra": extra})
                ]
    return {name for name, _ in seen}


@pytest.fixture(scope="module")
def runtime_site(tmp_path_factory) -> Path:
    """A folder holding (as links) exactly the packages of the runtime closure: what
    ``pip install evalkit`` brings, without the test extra's packages."""
    site = tmp_path_factory.mktemp("runtime-site")
    for name in sorted(_runtime_closure()):
        dist = importlib.metadata.distribution(name)
        assert dist.files, f"{name}: installed without a file list (RECORD)"
        for top in sorted({f.parts[0] for f in dist.files}):
            if top in ("..", "__pycache__") or top.endswith(".pth") or (site / top).exists():
                continue
            (site / top).symlink_to(Path(dist.locate_file(top)))
    return site


def _venv(tmp: Path, deps: list[str] | None = None) -> dict:
    """A fresh venv whose other packages are this environment's (or those of the folders
    ``deps``); a folder ``work`` outside the checkout; an environment without PYTHONPATH."""
    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    _run([base, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # only the directories: a .pth line adds a path, it does not run the .pth files there (the
    # editable finder of this environment's evalkit is one of those)
    deps = deps or dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_evalkit_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    work = tmp / "work"  # outside the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1", GRADIO_ANALYTICS_ENABLED="False")
    return {"venv": venv, "py": py, "site": site, "work": work, "env": env}


def _pip_install(py: Path, *args) -> None:
    # pip of this environment, installing into the new one (pip >= 22.3: --python)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            py,
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            *args,
        ]
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(tmp / "src")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            tmp / "dist",
            src,
        ]
    )
    [whl] = (tmp / "dist").glob("evalkit-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, runtime_site, tmp_path_factory):
    """A fresh venv with the wheel installed and only its runtime dependencies (this
    environment's copies): ``pip install evalkit``, no extras."""
    v = _venv(tmp_path_factory.mktemp("venv"), [str(runtime_site)])
    _pip_install(v["py"], wheel)
    return v


@pytest.mark.slow  # a wheel built
def test_wheel_holds_every_module_and_the_shipped_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names}
    # no top-level metrics or app: both names are taken on PyPI
    assert top == {"evalkit", next(t for t in top if t.endswith(".dist-info"))}
    for folder, inside in PACKAGES.items():  # the packages list of pyproject.toml is complete
        for p in (ROOT / folder).rglob("*.py"):
            assert f"{inside}/{p.relative_to(ROOT / folder).as_posix()}" in names
    for p in (ROOT / "app" / "static").iterdir():
        assert f"evalkit/app/static/{p.name}" in names
    for p in (ROOT / "evalkit" / "compare" / "templates").iterdir():  # the report's template
        assert p.relative_to(ROOT).as_posix() in names
    for f in _files(CHECKOUT_MODEL):
        assert f"evalkit/models/canary/{f}" in names
    assert {n for n in names if n.startswith("evalkit/models/")} == {
        f"evalkit/models/canary/{f}" for f in _files(CHECKOUT_MODEL)
    }
    for f in _files(CHECKOUT_DATASETS):
        if f.endswith((".yaml", ".mkv")):
            assert f"evalkit/datasets/{f}" in names


@pytest.mark.slow  # a wheel built and installed, a render
def test_installed_wheel_renders_the_canary_outside_the_checkout(installed):
    py, work, env, site = installed["py"], installed["work"], installed["env"], installed["site"]
    probe = _run(
        [
            py,
            "-c",
            (
                "import json, importlib.util, evalkit, evalkit.demo as demo\n"
                "from evalkit import app, metrics\n"
                "from evalkit.metrics import stream\n"
                "from evalkit.app import server\n"
                "assert importlib.util.find_spec('metrics') is None, importlib.util.find_spec('metrics')\n"
                "assert importlib.util.find_spec('app') is None, importlib.util.find_spec('app')\n"
                "for extra in ('transformers', 'ray', 'imageio_ffmpeg', 'psycopg', 'lpips', 'pytest'):\n"
                "    assert importlib.util.find_spec(extra) is None, extra\n"
                "from pathlib import Path\n"
                "from evalkit import fsutil\n"
                "from evalkit.canary import MODEL_DIR\n"
                "from evalkit.render.renderers.canary import MODEL_DIR as RENDERER_DIR\n"
                "print(json.dumps({'evalkit': evalkit.__file__, 'metrics': metrics.__file__,"
                " 'stream': stream.__file__, 'app': app.__file__, 'server': server.__file__,"
                " 'static': str(Path(app.__file__).parent / 'static'),"
                " 'model': str(MODEL_DIR), 'renderer_model': str(RENDERER_DIR),"
                " 'model_fn': str(fsutil.canary_model_dir()),"
                " 'datasets': str(fsutil.datasets_dir()), 'suite': str(demo.SUITE),"
                " 'gate': str(demo.GATE)}))"
            ),
        ],
        cwd=work,
        env=env,
    )
    where = {k: Path(v) for k, v in json.loads(probe.stdout).items()}
    for k, p in where.items():
        assert p.is_relative_to(site), f"{k}: {p} is not inside the new venv ({site})"
    assert (
        where["model"]
        == where["renderer_model"]
        == where["model_fn"]
        == site / "evalkit" / "models" / "canary"
    )
    assert where["datasets"] == site / "evalkit" / "datasets"
    assert where["stream"] == site / "evalkit" / "metrics" / "stream.py"
    assert where["server"] == site / "evalkit" / "app" / "server.py"
    for name in ("metrics", "app"):  # not importable as top-level packages
        r = subprocess.run(
            [py, "-c", f"import {name}"], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 1 and f"No module named '{name}'" in r.stderr, (name, r.stderr)
    assert where["suite"].is_file() and where["gate"].is_file()
    assert all((where["static"] / f"player.{x}").is_file() for x in ("html", "css", "js"))
    # the folder is copied as is: same files, same bytes, so the same model_sha256
    assert _files(where["model"]) == _files(CHECKOUT_MODEL)
    digest = model_digest(CHECKOUT_MODEL)
    assert model_digest(where["model"]) == digest

    smoke = where["datasets"] / "smoke" / "suite.yaml"
    r = _run([py, "-m", "evalkit", "suite", "validate", smoke], cwd=work, env=env)
    assert "ok" in r.stdout
    _run([py, "-m", "evalkit", "suite", "validate", where["suite"]], cwd=work, env=env)
    # the console script of the wheel, the canary renderer by default (-r canary), one job
    r = _run(
        [
            installed["venv"] / "bin" / "evalkit",
            "render",
            smoke,
            "-b",
            "cpu",
            "-r",
            "canary",
            "--out",
            "runs",
            "--quiet",
            "--jobs",
            "astronaut_pan",
        ],
        cwd=work,
        env=env,
    )
    assert "1 rendered, 0 already done, 0 failed" in r.stdout
    run = work / "runs" / "cpu"
    assert [p.suffix for p in (run / "clips").iterdir()] == [".mkv"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert Path(manifest["renderer"]["model"]) == where["model"]
    assert manifest["renderer"]["model_sha256"] == digest


# -- the import names in a checkout ----------------------------------------------------------

#: prints where evalkit's packages and a submodule of each come from, and whether a top-level
#: ``metrics`` / ``app`` would be found (from a folder outside the checkout)
WHERE = (
    "import importlib.util, json, evalkit, evalkit.metrics.stream, evalkit.app.server\n"
    "print(json.dumps({'evalkit': evalkit.__file__, 'metrics': evalkit.metrics.__file__,"
    " 'stream': evalkit.metrics.stream.__file__, 'app': evalkit.app.__file__,"
    " 'server': evalkit.app.server.__file__,"
    " 'top_metrics': str(importlib.util.find_spec('metrics')),"
    " 'top_app': str(importlib.util.find_spec('app'))}))"
)


def _where(py, cwd, env) -> dict:
    return json.loads(_run([py, "-c", WHERE], cwd=cwd, env=env).stdout)


def _from_checkout(found: dict, checkout: Path) -> None:
    """evalkit's modules from ``checkout``: evalkit.metrics and evalkit.app through the links
    evalkit/metrics and evalkit/app (ordinary subpackages), which are the folders metrics/, app/."""
    assert found["evalkit"] == str(checkout / "evalkit" / "__init__.py")
    for key, rel in (
        ("metrics", "metrics/__init__.py"),
        ("stream", "metrics/stream.py"),
        ("app", "app/__init__.py"),
        ("server", "app/server.py"),
    ):
        assert found[key] == str(checkout / "evalkit" / rel), (key, found[key])
        assert Path(found[key]).resolve() == (checkout / rel).resolve(), (key, found[key])


@pytest.mark.slow  # an editable install
def test_editable_install_maps_the_folders(tmp_path):
    """``make setup``'s ``pip install -e .``: the clone's folders under evalkit's names, and no
    top-level ``metrics`` or ``app`` outside the clone."""
    clone = _copy_sources(tmp_path / "clone")
    v = _venv(tmp_path)
    _pip_install(v["py"], "--no-build-isolation", "-e", clone)
    found = _where(v["py"], v["work"], v["env"])
    _from_checkout(found, clone)
    assert found["top_metrics"] == found["top_app"] == "None"


@pytest.mark.slow  # processes importing torch's neighbours
def test_checkout_on_pythonpath_maps_its_own_folders(tmp_path):
    """A checkout run with PYTHONPATH and no install (helpers' worktrees, the device runs) in an
    environment where another checkout of evalkit is installed editable (this one, or the main
    checkout): evalkit.metrics and evalkit.app come from the checkout on PYTHONPATH, not from
    the editable install's mapping."""
    other = _copy_sources(tmp_path / "other")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=str(other), GRADIO_ANALYTICS_ENABLED="False")
    work = tmp_path / "work"
    work.mkdir()
    _from_checkout(_where(sys.executable, work, env), other)
    # in a child process too (worker processes import by name)
    probe = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {WHERE!r}], check=True)"
    _from_checkout(json.loads(_run([sys.executable, "-c", probe], cwd=work, env=env).stdout), other)


# -- dependencies: declared where they are used ----------------------------------------------

#: third-party imports of the product that are neither runtime dependencies nor extras, and why
UNDECLARED = {
    # torch's own dependency where Triton exists (Linux); the metrics' kernel modules are
    # imported only after importlib.util.find_spec("triton") finds it, else the torch path runs
    "triton": "torch",
}


def _dist(requirement: str) -> str:
    """The normalized distribution name of a requirement string (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)[0]).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    """pyproject.toml's runtime dependencies and extras (distribution names)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return (
        {_dist(r) for r in project["dependencies"]},
        {k: {_dist(r) for r in v} for k, v in project["optional-dependencies"].items()},
    )


def _catches_import_error(handlers) -> bool:
    names = set()
    for h in handlers:
        for t in h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]:
            names.add(getattr(t, "id", None))
    return bool(names & {"ImportError", "ModuleNotFoundError", None})


def _imports(folder: str) -> list[tuple[str, int, str, bool]]:
    """(file, line, top-level name, lazy) of each absolute import of a third-party module under
    ``folder``; lazy: inside a function or a ``try`` that catches ImportError."""
    local = {p.stem for f in ("tests", "benchmarks", "datasets", "tools") for p in (ROOT / f).rglob("*.py")}
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

        def walk(node, lazy):
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(child, ast.Try) and _catches_import_error(child.handlers):
                    for n in child.body:
                        walk_one(n, True)
                    for part in (child.handlers, child.orelse, child.finalbody):
                        for n in part:
                            walk_one(n, lazy)
                    continue
                walk_one(child, inner)

        def walk_one(node, lazy):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for n in names:
                top = n.split(".")[0]
                if (
                    top not in sys.stdlib_module_names
                    and top not in ("evalkit", "__future__")
                    and top not in local
                ):
                    out.append((path.relative_to(ROOT).as_posix(), node.lineno, top, lazy))
            walk(node, lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))

        walk(tree, False)
    return out


@functools.cache
def _providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _dists_of(top: str) -> set[str]:
    found = _providers().get(top)
    assert found, f"{top}: no installed distribution provides it"
    return {_dist(d) for d in found}


def test_product_imports_are_declared_dependencies():
    """Every third-party import of evalkit/, metrics/ and app/ is a runtime dependency, or is
    imported only when used (inside a function, or under ``except ImportError``) from a package
    of an extra that the module names in its error (``evalkit[EXTRA]``); evalkit.testing (test
    support) may import the ``test`` extra, which its docstring names. And every runtime
    dependency is imported by the product."""
    runtime, extras = _declared()
    bad, used = [], set()
    for folder in ("evalkit", "metrics", "app"):
        for file, line, top, lazy in _imports(folder):
            if top in UNDECLARED:
                assert _dist(UNDECLARED[top]) in runtime
                continue
            dists = _dists_of(top)
            used |= dists
            if dists & runtime:
                continue
            text = (ROOT / file).read_text(encoding="utf-8")
            if file.startswith("evalkit/testing/"):
                named = (
                    {"test"}
                    if "evalkit[test]" in (ROOT / "evalkit/testing/__init__.py").read_text(encoding="utf-8")
                    else set()
                )
            else:
                named = {e for e in extras if f"evalkit[{e}]" in text}
            if not lazy or not any(dists & extras[e] for e in named):
                bad.append(
                    f"{file}:{line}: {top} ({', '.join(sorted(dists))}): "
                    + (
                        "imported at module level"
                        if not lazy
                        else "no extra holding it is named (evalkit[...]) in the module"
                    )
                )
    assert bad == [], "undeclared imports:\n" + "\n".join(bad)
    assert runtime - used == set(), f"runtime dependencies the product never imports: {runtime - used}"


def test_test_imports_are_declared_in_the_test_extra():
    runtime, extras = _declared()
    bad = [
        f"{file}:{line}: {top}"
        for file, line, top, _ in _imports("tests")
        if not _dists_of(top) & (runtime | extras["test"])
    ]
    assert bad == [], "imports of tests/ missing from the test extra:\n" + "\n".join(bad)
    for name, dists in extras.items():  # the test extra installs every other extra
        assert dists <= extras["test"], f"extra {name}: {dists - extras['test']} not in test"


def test_missing_imageio_ffmpeg_names_the_vmaf_extra(monkeypatch):
    from evalkit.metrics import VmafUnavailable
    from evalkit.metrics.vmaf import ffmpeg_exe

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # `import imageio_ffmpeg` fails
    with pytest.raises(VmafUnavailable, match=r"pip install 'evalkit\[vmaf\]'"):
        ffmpeg_exe()


def test_missing_psycopg_names_the_postgres_extra(monkeypatch):
    from evalkit.study.store import StudyDB, StudyError

    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` fails
    with pytest.raises(
        StudyError,
        match=r"--db postgresql\+psycopg://u@127\.0\.0\.1:1/x: .*"
        r"pip install 'evalkit\[postgres\]'",
    ):
        StudyDB("postgresql+psycopg://u@127.0.0.1:1/x")


@pytest.mark.slow  # a pipeline built, the installed wheel run
def test_installed_wheel_names_the_extra_a_text_encoder_needs(installed, tmp_path):
    """Without the video-families extra, a diffusers pipeline with a text encoder (transformers)
    stops with one line naming the extra (the canary above has none and renders)."""
    from evalkit.testing import tiny_animatediff

    tiny_animatediff.build(tmp_path / "animatediff")
    smoke = installed["site"] / "evalkit" / "datasets" / "smoke" / "suite.yaml"
    r = subprocess.run(
        [
            installed["venv"] / "bin" / "evalkit",
            "render",
            smoke,
            "-b",
            "cpu",
            "-r",
            "diffusers",
            "-O",
            f"model={tmp_path / 'animatediff'}",
            "--out",
            tmp_path / "runs",
            "--quiet",
            "--jobs",
            "astronaut_pan",
        ],
        cwd=installed["work"],
        env=installed["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "AnimateDiffVideoToVideoPipeline needs" in r.stderr and "transformers" in r.stderr
    assert "pip install 'evalkit[video-families]'" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
