"""The README and the pages in docs/ link only to files that exist, and to headings that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
JOURNAL = sorted((ROOT / "docs" / "journal").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES + JOURNAL, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    """Every relative link names a file that exists and, after #, a heading of that file."""
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name} links to {target}: no such heading"


def test_readme_is_a_front_door():
    """The README stays short and links every page in docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) < 10_000
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme


def test_the_journal_index_lists_every_page():
    """docs/journal/README.md links every page of the journal."""
    index = (ROOT / "docs" / "journal" / "README.md").read_text(encoding="utf-8")
    for page in JOURNAL:
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"the journal's index does not list {page.name}"
