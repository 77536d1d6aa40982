"""The module map of docs/architecture.md, enforced on the AST of every module of ``evalkit``
(with ``evalkit.app`` and ``evalkit.metrics``, the folders ``app/`` and ``metrics/``; every
import, also those inside functions):

- no import cycle between modules;
- data flows one way: each room imports only the rooms below it (``ALLOWED``);
- nothing reaches into another module's private names (``from m import _x``, ``m._x`` on an
  imported module or class) or into another package's private modules (``pkg._mod``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

#: folder of the repository -> its import name (pyproject.toml's package-dir)
PACKAGES = {"evalkit": "evalkit", "app": "evalkit.app", "metrics": "evalkit.metrics"}

#: room -> the rooms it may import (itself always). A room is a module's first two name parts
#: (evalkit.render, evalkit.metrics, ...), or ``evalkit`` for the package itself.
CORE = {
    "evalkit",
    "evalkit.concurrency",
    "evalkit.errors",
    "evalkit.fsutil",
    "evalkit.lossless",
    "evalkit.procdecode",
    "evalkit.video",
    "evalkit.weights",
}
ALLOWED = {
    "evalkit.metrics": set(),
    **{c: CORE | {"evalkit.metrics"} for c in CORE},
    "evalkit.canary": CORE,
    "evalkit.formats": CORE,
    "evalkit.compare": CORE | {"evalkit.formats", "evalkit.metrics"},
    "evalkit.render": CORE | {"evalkit.formats", "evalkit.canary", "evalkit.metrics"},
    # the Ray executor runs both flows' work on a cluster: render's job loop and compare's
    # measure_pair; neither flow imports it (the front doors choose it)
    "evalkit.executor": CORE | {"evalkit.formats", "evalkit.render", "evalkit.compare", "evalkit.metrics"},
    # the threshold protocol measures its amplified stimuli as compare measures a pair; a
    # report's run folders are read through evalkit.formats (their clips)
    "evalkit.study": CORE | {"evalkit.formats", "evalkit.metrics"},
    "evalkit.cli": None,  # the front door: any room (None = no limit)
    "evalkit.demo": None,
    "evalkit.testing": None,  # test support (fakes, tiny pipelines, a report, the server)
    "evalkit.__main__": None,
    "evalkit.app": CORE | {"evalkit.study"},
}


def modules() -> dict[str, Path]:
    out = {}
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = modules()


def _resolve(mod: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports(mod: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``mod``."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(mod, is_pkg, node.level, node.module) if node.level else node.module or ""
            for a in node.names:
                out.append((src, a.name, node.lineno))
    return out


def _internal(name: str) -> str | None:
    """The internal module an import refers to (longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in MODULES:
            return cand
        parts.pop()
    return None


def edges() -> dict[str, set[str]]:
    out = {m: set() for m in MODULES}
    for m in MODULES:
        for src, name, _ in imports(m):
            target = _internal(f"{src}.{name}") if name and f"{src}.{name}" in MODULES else _internal(src)
            if target and target != m:
                out[m].add(target)
    return out


def room(mod: str) -> str:
    parts = mod.split(".")
    if parts[0] != "evalkit":
        return parts[0]
    if len(parts) == 1:
        return "evalkit"
    return ".".join(parts[:2])


def test_no_import_cycles():
    graph = edges()
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    g = {
        m: {t for t in ts if not (MODULES[m].name == "__init__.py" and t.startswith(m + "."))}
        for m, ts in graph.items()
    }
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(g[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_rooms_import_only_the_rooms_below_them():
    bad = []
    for m, targets in edges().items():
        allowed = ALLOWED.get(room(m), ALLOWED.get(m, set()))
        assert room(m) in ALLOWED or m in ALLOWED, f"{m}: room {room(m)!r} missing from ALLOWED"
        if allowed is None:
            continue
        for t in targets:
            if room(t) != room(m) and room(t) not in allowed:
                bad.append(f"{m} imports {t}")
    assert bad == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_reach_ins():
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # local name -> internal module it came from
        for src, name, line in imports(m):
            target = _internal(src)
            if target is None:
                continue
            # a private module of another package: only its own package may import it
            for i, part in enumerate(src.split(".")):
                owner = ".".join(src.split(".")[:i])
                if _private(part) and not (m == owner or m.startswith(owner + ".")):
                    bad.append(f"{m}:{line} imports private module {src}")
            if name and _private(name) and target != m:
                bad.append(f"{m}:{line} imports private name {name} from {src}")
            if name and not _private(name) and target != m:
                bound[name] = target
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if _internal(a.name) and _internal(a.name) != m:
                        bound[(a.asname or a.name).split(".")[0]] = _internal(a.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                bad.append(
                    f"{m}:{node.lineno} reaches into {node.value.id}.{node.attr} ({bound[node.value.id]})"
                )
    assert bad == []


@pytest.mark.parametrize("room_name", sorted(r for r in ALLOWED if ALLOWED[r] is not None))
def test_every_room_named_in_the_architecture_doc(room_name):
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert f"`{room_name}`" in doc


def test_every_evalkit_variable_read_is_in_the_documented_list():
    """docs/architecture.md's table of environment variables is the whole list: a variable
    read (named in a string) anywhere in the product and missing there fails, and so does one
    listed there that nothing reads any more."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = doc[doc.index("## Environment variables") :]
    listed = set(re.findall(r"`(EVALKIT_[A-Z0-9_]+)`", table))
    used = {}
    for folder in ("evalkit", "app", "metrics"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in re.findall(r"[\"'](EVALKIT_[A-Z0-9_]+)[\"']", path.read_text(encoding="utf-8")):
                used.setdefault(name, path.relative_to(ROOT).as_posix())
    undocumented = {n: p for n, p in used.items() if n not in listed}
    assert not undocumented, f"EVALKIT_* variables read but not in docs/architecture.md: {undocumented}"
    assert listed <= set(used), f"listed but never read: {sorted(listed - set(used))}"


def test_nothing_imports_the_folders_as_top_level_packages():
    """metrics/ and app/ are imported as evalkit.metrics and evalkit.app everywhere (tests,
    benchmarks and tools too): a top-level ``metrics`` imported from the repository root would
    still load, as a second copy of every module with its own caches and switches."""
    bad = []
    for folder in ("evalkit", "app", "metrics", "tests", "benchmarks", "tools", "datasets"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                bad += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {n}"
                    for n in names
                    if n and n.split(".")[0] in ("metrics", "app")
                ]
    assert bad == []


def _listed_modules() -> list[str]:
    """The module names docs/architecture.md's "Modules" section lists (in backticks)."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Modules") :]
    section = section[: section.index("\n## ", 1)]
    return [
        n
        for n in re.findall(r"`(evalkit(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`", section)
        if not any(p[:1].isupper() for p in n.split("."))
    ]


def test_the_architecture_doc_lists_every_module_and_no_other():
    """Every module of the tree (evalkit/, app/, metrics/) is named in docs/architecture.md's
    module list, and every name there is a module of the tree (a moved or removed module
    leaves no stale entry)."""
    listed = set(_listed_modules())
    missing = sorted(set(MODULES) - listed)
    stale = sorted(listed - set(MODULES))
    assert missing == [], f"modules missing from docs/architecture.md's Modules section: {missing}"
    assert stale == [], f"listed in docs/architecture.md's Modules section, not in the tree: {stale}"


def _bound_names(path: Path) -> set[str] | None:
    """The names a module binds at its top level (definitions, assignments, imports; also
    inside top-level ``if``/``try``), or None when it has a module ``__getattr__`` (any name)."""
    names: set[str] = set()

    def walk(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for h in node.handlers:
                    walk(h.body)

    walk(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
    return None if "__getattr__" in names else names


def _stale_imports(path: Path, mod: str | None = None) -> list[str]:
    """Imports of evalkit modules or names in ``path`` that the tree does not have (what a move
    leaves behind, also in functions that no test runs). ``mod``: the file's module name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    bad, bound = [], {}
    guarded = {
        id(n)
        for t in ast.walk(tree)
        if isinstance(t, ast.Try)  # other trees' names
        and any(getattr(h.type, "id", None) in ("ImportError", "ModuleNotFoundError") for h in t.handlers)
        for stmt in t.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            pairs = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(mod, is_pkg, node.level, node.module) if node.level and mod else node.module or ""
            pairs = [(src, a.name) for a in node.names]
        else:
            continue
        for src, name in pairs:
            if not (src == "evalkit" or src.startswith("evalkit.")):
                continue
            if src not in MODULES:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {src}: no such module")
                continue
            if name is None or name == "*" or f"{src}.{name}" in MODULES:
                continue
            if src not in bound:
                bound[src] = _bound_names(MODULES[src])
            if bound[src] is not None and name not in bound[src]:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name} from {src}: not there")
    return bad


def test_no_import_of_a_module_or_name_that_is_not_there():
    """Module by module (evalkit/, app/, metrics/, and the tests, benchmarks and tools that
    import them): every ``import evalkit.x`` names a module of the tree and every ``from
    evalkit.x import name`` a submodule or a name ``evalkit.x`` binds. Function-level imports
    count: a benchmark's import of a moved name fails here, not when someone next runs it."""
    bad = []
    for m, path in MODULES.items():
        bad += _stale_imports(path, m)
    for folder in ("tests", "benchmarks", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad += _stale_imports(path)
    assert bad == []


def test_no_import_hook_on_import_evalkit():
    """``import evalkit`` adds no finder to ``sys.meta_path`` (evalkit.metrics and evalkit.app
    are ordinary subpackages: evalkit/metrics and evalkit/app link to the folders), and the
    links are what the map says."""
    import subprocess
    import sys

    probe = (
        "import sys; before = list(sys.meta_path); import evalkit, evalkit.metrics, evalkit.app; "
        "print(len(sys.meta_path) - len(before)); print(evalkit.metrics.__file__); "
        "print(evalkit.app.__file__)"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    added, metrics_file, app_file = r.stdout.split("\n")[:3]
    assert added == "0"
    assert Path(metrics_file) == ROOT / "evalkit" / "metrics" / "__init__.py"
    assert Path(app_file) == ROOT / "evalkit" / "app" / "__init__.py"
    for name in ("metrics", "app"):
        link = ROOT / "evalkit" / name
        assert link.is_symlink() and link.readlink() == Path("..") / name


#: modules that may name a protocol: the protocol objects themselves, and the rater-side test
#: support (the blindness attacker plays a browser, which knows only the page it is served)
PROTOCOL_NAMERS = ("evalkit.study.protocols", "evalkit.testing")


def _names_protocol(node: ast.AST) -> bool:
    """``protocol``, ``proto``, ``x.protocol`` or ``x["protocol"]``."""
    if isinstance(node, ast.Name):
        return node.id in ("protocol", "proto")
    if isinstance(node, ast.Attribute):
        return node.attr == "protocol"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "protocol"
    return False


def _protocol_constants(node: ast.AST) -> set:
    from evalkit.study.protocols import REGISTRY

    if isinstance(node, ast.Constant):
        return {node.value} & set(REGISTRY)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_protocol_constants(e) for e in node.elts)) if node.elts else set()
    return set()


def protocol_branches() -> list[str]:
    """Every comparison of a protocol with a protocol's name (``protocol == "abx"``,
    ``res["protocol"] in ("abx", ...)``) outside :data:`PROTOCOL_NAMERS`."""
    out = []
    for m, path in MODULES.items():
        if m.startswith(PROTOCOL_NAMERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_names_protocol(s) for s in sides) and any(_protocol_constants(s) for s in sides):
                    out.append(f"{m}:{node.lineno}")
    return sorted(out)


def test_only_the_protocol_objects_branch_on_a_protocol_name():
    # a new protocol is one file in evalkit/study/protocols/: the rest asks the protocol object
    assert protocol_branches() == []


def test_the_protocol_branch_check_sees_a_branch(tmp_path, monkeypatch):
    # the check above is not vacuous: a module comparing a protocol name is found
    path = tmp_path / "branchy.py"
    path.write_text(
        'def f(res, protocol):\n    a = res["protocol"] == "threshold"\n'
        '    return a or protocol in ("abx", "preference") or "x" == protocol\n'
    )
    monkeypatch.setitem(MODULES, "evalkit.study.branchy", path)
    assert protocol_branches() == ["evalkit.study.branchy:2", "evalkit.study.branchy:3"]
