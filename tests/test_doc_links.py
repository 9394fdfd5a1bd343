"""Every relative link in the user pages and the results index points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "results" / "README.md",
                ROOT / "lab" / "README.md"])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert page.is_file()
    broken = [t for t in relative_links(page) if not (page.parent / unquote(t.split("#")[0])).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.parent.name != "lab" and p.parent.name != "results"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_do_not_send_readers_to_the_lab(page):
    links = [t for t in relative_links(page) if "lab/" in t or "NOTES.md" in t]
    assert not links, f"{page.relative_to(ROOT)} links into lab/: {links}"
