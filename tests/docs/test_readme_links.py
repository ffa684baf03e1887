"""README.md is read on the repository's front page, outside the site's strict build: every relative
link in it must reach a file, and every BENCHMARKS.md anchor a heading (GitHub's slugs)."""

from __future__ import annotations

import re

from conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_reach_files_and_headings():
    readme = (ROOT / "README.md").read_text()
    links = [t for t in LINK.findall(readme) if not t.startswith(("http://", "https://"))]
    assert len(links) >= 20
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor:
            headings = {slug(h) for h in re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)}
            if anchor not in headings:
                broken.append(target)
    assert not broken, f"README links that lead nowhere: {broken}"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    first = "\n".join(lines[:40])
    assert "make train" in first and "make test" in first and "held-out greedy accuracy" in first
