"""Every relative link in README.md and docs/ points at a file of the repository."""

import pathlib
import re

import pytest

pytestmark = pytest.mark.cpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: pathlib.Path) -> list:
    links = [m.group(1).split("#")[0] for m in LINK.finditer(page.read_text())]
    return [link for link in links if link and "://" not in link and not link.startswith("mailto:")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page):
    for link in relative_links(page):
        target = (page.parent / link).resolve()
        assert target.is_relative_to(ROOT), f"{link} leaves the repository"
        assert target.exists(), f"{link} does not exist"
