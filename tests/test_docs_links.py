"""The guides' relative links point at files that exist (the code blocks themselves run
through conftest.py and tests/markdown_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_relative_links_resolve(guide: Path) -> None:
    targets = [t for t in LINK.findall(guide.read_text()) if "://" not in t]
    missing = [t for t in targets if not (guide.parent / t).exists()]
    assert not missing, f"{guide.name} links to missing files: {missing}"


def test_readme_lists_every_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    unlisted = [p.name for p in GUIDES[1:] if f"(docs/{p.name})" not in readme]
    assert not unlisted, f"README.md's documentation table omits {unlisted}"


RESULT = re.compile(r"(?<![\w-])(?:benchmarks/)?results/([A-Za-z0-9_.*-]+\.(?:md|json|png))")
NOT_YET_RUN = {"gpu_check.md"}  # written by benchmarks/gpu_check.py, which needs a GPU


@pytest.mark.parametrize(
    "guide",
    [*GUIDES, ROOT / "predictors" / "README.md", ROOT / "CHANGELOG.md"],
    ids=lambda p: p.name,
)
def test_named_results_exist(guide: Path) -> None:
    """Every results file a guide names exists; a pattern (`peers-images*.md`) matches
    one at least: benchmarks/results/ keeps what the guides cite."""
    named = set(RESULT.findall(guide.read_text()))
    results = ROOT / "benchmarks" / "results"
    missing = sorted(n for n in named - NOT_YET_RUN if not list(results.glob(n)))
    assert not missing, f"{guide.name} names results that are gone: {missing}"
