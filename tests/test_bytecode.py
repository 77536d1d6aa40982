"""evalkit.bytecode: with writing turned off and a library installed without its bytecode, the
command keeps the bytecode in its cache folder (and reads it back), writes nothing beside the
sources, and changes nothing in any other case. Each case runs in a fresh interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit import bytecode

ROOT = Path(__file__).resolve().parents[1]


def _package(root: Path, value: int) -> Path:
    """A library ``heavylib`` with no bytecode; its source reads ``VALUE = <value>``."""
    pkg = root / "lib" / "heavylib"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"from heavylib.part import VALUE  # {value}\n")
    (pkg / "part.py").write_text(f"VALUE = {value}\n")
    return pkg


def _run(root: Path, code: str, **env) -> str:
    full = {**os.environ, "PYTHONPYCACHEPREFIX": None, "PYTHONPATH": os.pathsep.join(
                [str(root / "lib"), str(ROOT)]),
            "EVALKIT_CACHE_DIR": str(root / "cache"), "PYTHONDONTWRITEBYTECODE": "1", **env}
    full = {k: v for k, v in full.items() if v is not None}      # None: unset
    p = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


ENSURE = ("from evalkit import bytecode; import sys; f = bytecode.ensure(probe=('nolib', 'heavylib')); "
          "import heavylib, os; print(heavylib.VALUE, f, os.environ.get('PYTHONPYCACHEPREFIX'))")


def _pycs(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.pyc"))


def test_bytecode_kept_in_the_cache_folder_and_read_back(tmp_path):
    pkg = _package(tmp_path, 1)
    out = _run(tmp_path, ENSURE)
    folder = tmp_path / "cache" / "pycache"
    assert out == f"1 {folder} {folder}"
    assert not (pkg / "__pycache__").exists()                 # nothing beside the sources
    kept = [p.name for p in _pycs(folder)]
    assert any(n.startswith("part.") for n in kept) and any(n.startswith("__init__.") for n in kept)
    # The next process reads it: a source changed behind Python's back (same size, same
    # modification time, so the cached bytecode still looks valid) is not read again.
    part = pkg / "part.py"
    st = part.stat()
    part.write_text("VALUE = 2\n")
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _run(tmp_path, ENSURE).split()[0] == "1"
    # without evalkit's step the same interpreter compiles the source again
    assert _run(tmp_path, "import heavylib; print(heavylib.VALUE)") == "2"


def test_children_read_the_same_tree(tmp_path):
    _package(tmp_path, 1)
    _run(tmp_path, ENSURE)
    part = tmp_path / "lib" / "heavylib" / "part.py"
    st = part.stat()
    part.write_text("VALUE = 3\n")
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))
    child = ("from evalkit import bytecode; bytecode.ensure(probe=('heavylib',)); import subprocess, sys; "
             "print(subprocess.run([sys.executable, '-c', 'import heavylib; print(heavylib.VALUE)'], "
             "capture_output=True, text=True).stdout.strip())")
    assert _run(tmp_path, child) == "1"


@pytest.mark.parametrize("case", ["writing allowed", "switched off", "prefix set", "cached beside",
                                  "not installed"])
def test_nothing_changes_otherwise(tmp_path, case):
    pkg = _package(tmp_path, 1)
    env: dict = {}
    if case == "writing allowed":
        env["PYTHONDONTWRITEBYTECODE"] = None
    elif case == "switched off":
        env["EVALKIT_BYTECODE"] = "off"
    elif case == "prefix set":
        env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "theirs")
    elif case == "cached beside":
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg)], check=True)
    code = ENSURE.replace("'heavylib')", "'otherlib')") if case == "not installed" else ENSURE
    out = _run(tmp_path, code, **env).split()
    assert out[:2] == ["1", "None"]
    assert not (tmp_path / "cache" / "pycache").exists()


def test_the_command_takes_the_step_first(tmp_path):
    """`evalkit --help` under the same settings: the probe is torch here, whose bytecode the
    test environment has beside it (pip compiles on install), so nothing changes; with the
    probe pointed at an uncached library, the command keeps bytecode before it parses."""
    _package(tmp_path, 1)
    _run(tmp_path, "import sys; from evalkit.cli import main; main(['--help'])")
    assert bytecode.uncached(("torch",)) is None
    assert not (tmp_path / "cache" / "pycache").exists()
    code = ("import sys; from evalkit import bytecode; bytecode.PROBE = ('heavylib',); "
            "from evalkit.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
            "import heavylib; print(sys.pycache_prefix)")
    assert _run(tmp_path, code).splitlines()[-1] == str(tmp_path / "cache" / "pycache")
    assert _pycs(tmp_path / "cache" / "pycache")


def test_an_unusable_cache_folder_changes_nothing(tmp_path):
    """The cache folder cannot be made (a file stands where it would be): the settings stay as
    they were and the import still works, compiled in memory as before."""
    pkg = _package(tmp_path, 1)
    (tmp_path / "cache").write_text("not a folder")
    assert _run(tmp_path, ENSURE).split() == ["1", "None", "None"]
    assert not (pkg / "__pycache__").exists()
