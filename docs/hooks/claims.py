"""mkdocs hook: replaces the marker in docs/claims.md with the claim reference generated from the code
(``primus_energon.conformance.verdict.reference``), at every build."""

from __future__ import annotations

from typing import Any


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from primus_energon.conformance.verdict.reference import MARKER, claim_reference_markdown

    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, claim_reference_markdown())
