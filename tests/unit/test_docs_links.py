"""Every relative link and anchor in README.md and docs/**/*.md resolves.

The README links to topic files under docs/ and to docs/history/, and those link back to
README sections by anchor. Headings get renamed and sections move between files; a link
that no longer resolves is invisible until a reader follows it, so this checks them all
the way GitHub renders them (anchors are GitHub's heading slugs).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the text may hold one level of brackets or code.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def markdown_files() -> list[Path]:
    """README.md and every Markdown file under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The numbered lines outside fenced code blocks (a `#` there is a comment, not a
    heading, and a bracket is code, not a link)."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation and symbols
    dropped, each space a hyphen (as github-slugger does)."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text)  # emphasis
    kept = [ch for ch in text.lower() if ch in " -_" or unicodedata.category(ch)[:1] in "LNM"]
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a file's headings define, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file, folder or `#anchor` does not exist."""
    problems: list[str] = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if not target or _EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{path.name}: line {number}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{path.name}: line {number}: {target}: no heading #{anchor}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_a_missing_file_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Turnaround: ETAs, deadline risk\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "## Accuracy across acquisitions: `radserve evaluate --grid` (issue 18)\n"
        "[ok](other.md#turnaround-etas-deadline-risk) [ok](#accuracy-across-acquisitions-"
        "radserve-evaluate---grid-issue-18) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nothing-here)\n"
        "```\n[in code](missing-too.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "page.md: line 3: missing.md: no such file",
        "page.md: line 3: other.md#nothing-here: no heading #nothing-here",
    ]


SLUGS = [
    ("Turnaround: ETAs, deadline risk", "turnaround-etas-deadline-risk"),
    ("Several series in, one model: PET/CT", "several-series-in-one-model-petct"),
    ("`radserve serve` runs in one process", "radserve-serve-runs-in-one-process"),
    ("Issue 19 goals 1–4 (two-core floor)", "issue-19-goals-14-two-core-floor"),
    ("**Bold** and [a link](x.md)", "bold-and-a-link"),
]


@pytest.mark.parametrize(("heading", "anchor"), SLUGS)
def test_anchors_are_githubs_heading_slugs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
