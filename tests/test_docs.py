"""The documentation stays true: README size, links, the generated command reference, and the
commands shown in shell blocks.

- README.md stays a front page: at most 12,288 bytes (reference material lives in docs/);
- every relative link (and #anchor) in README.md, docs/*.md and benchmarks/README.md points to
  something that exists;
- docs/commands.md is exactly what tools/gen_docs.py generates from the CLI's parser now, and
  the field tables of docs/formats.md what it generates from the format models; when this fails,
  regenerate them: ``python tools/gen_docs.py --write`` (or
  ``python tools/gen_docs.py > docs/commands.md``);
- every ``evalkit ...`` line of a shell block in README.md and docs/*.md parses with the real
  parser (placeholders such as SUITE or JOB are fine: only subcommands and options are checked).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_LIMIT = 12_288
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED_FILES = [README, *DOCS, ROOT / "benchmarks" / "README.md"]
SHELL_FILES = [README, *DOCS]
REGENERATE = "python tools/gen_docs.py --write   (or: python tools/gen_docs.py > docs/commands.md)"


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- markdown helpers ------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)(.*?)\n(.*?)^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return LINK.findall(_prose(path.read_text(encoding="utf-8")))


def _shell_commands(path: Path) -> list[str]:
    """Each ``evalkit ...`` command of the file's sh/bash/shell/console blocks, continuation
    lines joined, comments removed."""
    out = []
    for m in FENCE.finditer(path.read_text(encoding="utf-8")):
        if m.group(2).strip().lower() not in ("sh", "bash", "shell", "console"):
            continue
        joined = re.sub(r"\\\n\s*", " ", m.group(3))
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("evalkit ") or line == "evalkit":
                out.append(line)
    return out


# -- tests -----------------------------------------------------------------------------------


def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes, over {README_LIMIT}: move reference material into docs/ "
        "(and measured figures into benchmarks/README.md) and link to it"
    )


@pytest.mark.parametrize("path", LINKED_FILES, ids=_rel)
def test_relative_links_point_to_existing_files(path):
    assert path.exists(), f"{_rel(path)} is missing"
    broken = []
    for target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: {dest} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {_rel(dest)}")
    assert not broken, f"{_rel(path)}: broken links:\n  " + "\n  ".join(broken)


def test_commands_reference_is_generated_from_the_parser():
    expected = _gen_docs().generate()
    path = ROOT / "docs" / "commands.md"
    assert path.exists(), f"docs/commands.md is missing; create it: {REGENERATE}"
    current = path.read_text(encoding="utf-8")
    assert current == expected, f"docs/commands.md is stale (the CLI changed); regenerate it: {REGENERATE}"


def test_format_tables_are_generated_from_the_models():
    path = ROOT / "docs" / "formats.md"
    current = path.read_text(encoding="utf-8")
    expected = _gen_docs().generate_formats(current)  # raises when a format has no block
    assert current == expected, (
        "docs/formats.md's field tables are stale (a format model "
        "changed); regenerate them: python tools/gen_docs.py --write"
    )


def test_readme_quick_start_covers_the_four_flows():
    commands = {
        shlex.split(c, comments=True)[1]
        for c in _shell_commands(README)
        if len(shlex.split(c, comments=True)) > 1
    }
    missing = {"render", "compare", "study", "serve"} - commands
    assert not missing, f"README.md's shell blocks show no evalkit {', '.join(sorted(missing))}"


@pytest.mark.parametrize("path", SHELL_FILES, ids=_rel)
def test_shell_commands_parse_with_the_real_parser(path):
    from evalkit.cli import build_parser

    commands = _shell_commands(path)
    if path == README:
        assert len(commands) >= 5, "README.md should show the quick start as evalkit commands"
    bad = []
    for command in commands:
        argv = shlex.split(command, comments=True)[1:]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(argv)
        except SystemExit as e:
            if e.code not in (0, None):
                msg = err.getvalue().strip().splitlines()
                bad.append(f"{command}\n      -> {msg[-1] if msg else e.code}")
    assert not bad, f"{_rel(path)}: commands the CLI does not accept:\n  " + "\n  ".join(bad)
