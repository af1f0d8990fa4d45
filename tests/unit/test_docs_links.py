"""Every relative link in README.md, docs/*.md and results/README.md leads somewhere:
the file (or folder) exists in the repository, and a `#fragment` names a heading of the
page it points to.

Headings are turned into fragments as GitHub does (lower case; letters, digits,
spaces, hyphens and underscores kept, the rest dropped; spaces to hyphens; a repeated
heading gets -1, -2, ...). Links and headings inside code blocks and inline code are
not links, so they are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "results" / "README.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The page without its code blocks and inline code."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _broken(text: str, page: Path) -> list[str]:
    """The links of ``text``, read as the page ``page``, that lead nowhere."""
    broken = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, fragment = unquote(target).partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or REPO not in (dest, *dest.parents):
            broken.append(f"{target}: no such file in the repository")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading #{fragment}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_of_the_page_leads_to_a_file_and_heading(page: Path) -> None:
    assert _broken(page.read_text(encoding="utf-8"), page) == []


def test_the_slugs_follow_githubs_rule() -> None:
    assert _slug("The coordinator's process layout") == "the-coordinators-process-layout"
    assert (
        _slug("A standalone run: `hetero-top --run DIR`") == "a-standalone-run-hetero-top---run-dir"
    )
    assert _slug("Load without a queue (2026-11-25 and 2026-11-26)") == (
        "load-without-a-queue-2026-11-25-and-2026-11-26"
    )


def test_a_link_to_a_missing_file_heading_or_a_file_outside_is_found() -> None:
    text = (
        "[a](missing.md) [b](design.md#no-such-heading) [c](design.md#invariants) "
        "[d](../../etc/passwd) `[e](x.md)` [f](https://example.com/x.md)"
    )
    assert _broken(text, REPO / "docs" / "page.md") == [
        "missing.md: no such file in the repository",
        "design.md#no-such-heading: design.md has no heading #no-such-heading",
        "../../etc/passwd: no such file in the repository",
    ]
