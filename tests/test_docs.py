"""The documentation builds offline with no warning (mkdocs --strict: no broken link or anchor, no page left
out of the nav), and its claim reference lists every claim the code defines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from primus_energon.conformance.properties import PROPERTIES, all_claims
from primus_energon.conformance.verdict.reference import MARKER, claim_anchor, claim_reference_markdown

REPO = Path(__file__).parents[1]

mkdocs = pytest.importorskip(
    "mkdocs", reason="mkdocs is not installed: pip install 'primus-energon[docs]' (the dev extra has it)"
)
pytest.importorskip("material", reason="mkdocs-material is not installed: pip install 'primus-energon[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert warnings == [], "\n".join(warnings)
    return out


def test_the_docs_build_strict_with_no_warnings(site: Path) -> None:
    pages = {p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")}
    for page in ("claims", "checking", "verdicts", "properties", "datasets", "schemas", "energon", "library"):
        assert page in pages, sorted(pages)


def test_the_claim_reference_lists_every_claim_the_code_defines(site: Path) -> None:
    html = (site / "claims" / "index.html").read_text(encoding="utf-8")
    assert MARKER not in html
    defined = [claim.id for claim in all_claims()]
    assert len(defined) == sum(len(p.claims) for p in PROPERTIES) and len(set(defined)) == len(defined)
    listed = set(re.findall(r'id="(claim:[\w/]+)"', html))
    assert listed == {claim_anchor(i) for i in defined}
    for claim in all_claims():  # each with what it states and its fix, as the code says them
        row = html.split(f'id="{claim_anchor(claim.id)}"', 1)[1].split("</tr>", 1)[0]
        assert claim.id in row
        assert ("advice" if claim.advice else f"fails ({claim.harm.label})") in row
    for prop in PROPERTIES:
        assert f"{prop.number}. {prop.title}" in html


def test_the_generated_reference_follows_the_code() -> None:
    text = claim_reference_markdown()
    assert f"{len(PROPERTIES)} properties, {len(all_claims())} claims" in text
    for claim in all_claims():
        assert f"`{claim.id}`" in text


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 150, "README.md is the front page: move reference material to docs/"
    assert "make conformance" in readme and "make test" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link
