"""mkdocs hook: the site's start page is the README (one text, not a copy of it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def on_page_read_source(page: Any, config: Any) -> str | None:
    """Serve README.md, with its ``docs/`` links made relative to the site, as ``index.md``."""
    if page.file.src_uri != "index.md":
        return None
    return re.sub(r"\]\(docs/", "](", README.read_text())
