"""The docs as a user meets them: a short README that opens with the two
commands, no issue numbers where users read, every page of docs/ in the site's
nav. (``mkdocs build --strict``, in make lint and make test, checks links,
anchors and the API reference.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

TWO_COMMANDS = (
    "# replayer\n"
    "\n"
    "```sh\n"
    "make demo    # create .venv if missing, install, run the end-to-end demo\n"
    "make test    # create .venv if missing, install with test extras, lint, type-check,"
    " run the test suite\n"
    "```\n"
)

ISSUE = re.compile(r"\bissue #?\d+", re.I)


def user_docs() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def nav_pages(nav: Any) -> set[str]:
    """Every page a MkDocs nav names (a title: page, a bare page, a section)."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return {p for item in nav for p in nav_pages(item)}
    if isinstance(nav, dict):
        return {p for value in nav.values() for p in nav_pages(value)}
    return set()


def test_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md is over 300 lines: move detail into docs/"
    assert text.startswith(TWO_COMMANDS)


def test_no_issue_numbers_where_users_read():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in user_docs()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert found == [], "users know versions, not issues:\n" + "\n".join(found)


def test_every_docs_page_is_in_the_nav():
    config = YAML(typ="safe").load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav entries with no page"


def test_the_checks_see_what_they_must():
    assert ISSUE.search("fixed in Issue #17") and ISSUE.search("(issue 8)")
    assert not ISSUE.search("issues 0.1.0") and not ISSUE.search("tissue 3")
    nav = [{"Home": "index.md"}, {"Guide": ["a.md", {"B": "b/c.md"}]}]
    assert nav_pages(nav) == {"index.md", "a.md", "b/c.md"}
