"""The README is the package's page on a package index, where relative links show
broken: its links are absolute, and each one into the documentation site names a page
that ``docs/`` builds, under the one base URL that ``pyproject.toml`` and
``mkdocs.yml`` both give."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
SITE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Documentation"]
LINKS = re.findall(r"\]\(([^)\s]+)\)|<(https?://[^>\s]+)>", README)
TARGETS = [a or b for a, b in LINKS]


def page_of(url: str) -> Path:
    """The ``docs/`` source mkdocs builds ``url`` from (directory URLs)."""
    folder = ROOT / "docs" / url[len(SITE) :].split("#")[0].rstrip("/")
    return folder / "index.md" if folder.is_dir() else folder.with_suffix(".md")


def test_the_readme_has_no_relative_link() -> None:
    relative = [t for t in TARGETS if not t.startswith(("http://", "https://", "#", "mailto:"))]
    assert relative == []


def test_every_link_into_the_documentation_site_names_a_page_it_builds() -> None:
    into_site = [t for t in TARGETS if t.startswith(SITE)]
    assert len(into_site) >= 15  # the documentation list and the inline references
    missing = [t for t in into_site if not page_of(t).is_file()]
    assert missing == []


def test_the_site_url_is_the_documentation_url() -> None:
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^site_url: (\S+)$", mkdocs, re.M)[1] == SITE  # type: ignore[index]
