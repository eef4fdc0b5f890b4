"""The documentation's links resolve, its benchmark scripts exist, and the README stays short.

Links are checked as GitHub renders them: a relative link names a file of the repository, and its
`#anchor` a heading of that file under GitHub's slug rules (lowercase, punctuation dropped, spaces
to hyphens, a repeated heading gets -1, -2, ...). Code blocks and inline code are not links.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
README_MAX_LINES = 220

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
BENCHMARK_MENTION = re.compile(r"benchmarks/([A-Za-z0-9_]+\.py)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before numbering repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown file, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[str]:
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        targets += LINK.findall(INLINE_CODE.sub("", line))
    return targets


def broken(path: Path, target: str) -> str | None:
    """Why a relative link of `path` does not resolve, or None."""
    file_part, _, anchor = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if ROOT not in dest.parents and dest != ROOT:
        return "points outside the repository"
    if not dest.exists():
        return "no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


def test_the_docs_are_there():
    names = {p.name for p in DOCS}
    assert {"README.md", "performance.md", "stepping-and-hooks.md"} <= names


def test_slugs_follow_github():
    assert slug("The engine: `LLM` and its options") == "the-engine-llm-and-its-options"
    assert slug("A step's times") == "a-steps-times"
    assert slug("2026-12-01: one staged copy") == "2026-12-01-one-staged-copy"
    assert slug("Goodput and SLOs") == "goodput-and-slos"
    assert slug("Against [real](x.md) runs") == "against-real-runs"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path):
    relative = [t for t in links(path) if not SCHEME.match(t)]
    assert relative or path.name != "README.md", "the README links into docs/"
    problems = [f"{t}: {why}" for t in relative if (why := broken(path, t))]
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_benchmark_named_exists(path: Path):
    named = set(BENCHMARK_MENTION.findall(path.read_text(encoding="utf-8")))
    missing = sorted(named - set(BENCHMARKS))
    assert not missing, f"{path.relative_to(ROOT)} names scripts benchmarks/ lacks: {missing}"


def test_performance_lists_every_benchmark():
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    benchmarks_section = text.split("\n## Benchmarks\n", 1)
    assert len(benchmarks_section) == 2, "docs/performance.md has a section '## Benchmarks'"
    listed = set(BENCHMARK_MENTION.findall(benchmarks_section[1]))
    assert BENCHMARKS, "benchmarks/ has scripts"
    missing = sorted(set(BENCHMARKS) - listed)
    assert not missing, f"docs/performance.md's Benchmarks section lacks {missing}"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
