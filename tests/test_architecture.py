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
CORE = {"evalkit", "evalkit.concurrency", "evalkit.errors", "evalkit.fsutil", "evalkit.lossless",
        "evalkit.procdecode", "evalkit.video", "evalkit.weights"}
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
    "evalkit.cli": None,           # the front door: any room (None = no limit)
    "evalkit.demo": None,
    "evalkit.testing": None,       # test support (fakes, tiny pipelines, a report, the server)
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
        base = base[:len(base) - (level - 1)]
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
            src = (_resolve(mod, is_pkg, node.level, node.module) if node.level
                   else node.module or "")
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
    g = {m: {t for t in ts if not (MODULES[m].name == "__init__.py" and t.startswith(m + "."))}
         for m, ts in graph.items()}
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(g[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
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
        bound: dict[str, str] = {}          # local name -> internal module it came from
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
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id in bound):
                bad.append(f"{m}:{node.lineno} reaches into {node.value.id}.{node.attr} "
                           f"({bound[node.value.id]})")
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
    table = doc[doc.index("## Environment variables"):]
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
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and not node.level
                         else [])
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                        if n and n.split(".")[0] in ("metrics", "app")]
    assert bad == []
