"""Measured-looking figures in prose: what the docs check refuses outside a results block.

A figure is a ratio such as ``1.05x`` or a bare ``0.953``, a percentage, a throughput, a size in
KiB to TiB or KB to TB, or a time in s or ms. Outside a results block (``render.BLOCK``), on the
README or any docs page, each one is a problem unless:

- it is a target: written right after ``<=``, ``<``, ``>=`` or ``>``;
- it is inside a fenced block of code tagged ``python``, ``sh``, ``bash``, ``json``, ``toml`` or
  ``yaml`` (an untagged block, such as pasted output, is read like prose);
- a marker in its paragraph declares it not a measurement:
  ``<!-- not measured (KIND): FIGURE | FIGURE -->``, KIND one of :data:`KINDS`, each FIGURE
  written exactly as in the text. A marker covers the paragraph it is in (or, standing alone,
  the paragraph after it). It cannot cover a throughput or an ``x`` ratio (those are only ever
  measurements), and a figure it lists that its paragraph does not have, or a kind it does not
  know, is itself a problem.
"""

from __future__ import annotations

import re

BLOCK = re.compile(r"<!-- results: [a-z0-9_-]+ -->\n.*?<!-- /results -->", re.S)

KINDS = {
    "configuration": "a default, limit or size set in the code or in a benchmark's set-up",
    "external": "a figure of another tool, service or incident, not measured here",
    "example": "an illustrative value",
    "version": "a version number",
    "method": "a parameter of a statistic (a trimmed share, an interval's level)",
}
"""What a marker may declare a figure to be (anything else is a problem)."""
MARKER = re.compile(r"<!--\s*not measured \((?P<kind>[a-z]+)\):(?P<figures>.*?)-->", re.S)
_NUM = r"(?<![\w.,])\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?P<ratio>{_NUM}x\b|{_NUM}\s*\u00d7)"
    rf"|(?P<rate>{_NUM}\s*[KMGT]i?B/s\b)"
    rf"|(?P<unit>{_NUM}\s*(?:%|[KMGT]i?B\b|ms\b|s\b|seconds?\b|minutes?\b))"
    r"|(?P<bare>(?<![\w.,])\d\.\d{2,}(?![\w.]))"
)
"""A measured-looking figure (see the module docstring)."""
TARGET = re.compile(r"(?:<=|>=|<|>|≤|≥|&lt;|&gt;)\s*$")
CODE = re.compile(r"^```(?:python|sh|bash|json|toml|yaml)\n.*?^```$", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)


def _paragraphs(text: str) -> list[str]:
    """The text's paragraphs (blocks between blank lines), without results blocks and the code
    fences the check leaves alone."""
    text = CODE.sub("", BLOCK.sub("", text))
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def stray_figures(text: str) -> list[str]:
    """Figures outside results blocks that no rule accepts, and markers that are wrong (see the
    module docstring)."""
    found: list[str] = []
    pending: list[tuple[str, list[str]]] = []
    for para in _paragraphs(text):
        markers = [
            (m.group("kind"), [f.strip() for f in m.group("figures").split("|") if f.strip()])
            for m in MARKER.finditer(para)
        ]
        body = COMMENT.sub("", para)
        if markers and not body.strip():  # a marker standing alone: for the next paragraph
            pending += markers
            continue
        markers, pending = pending + markers, []
        allowed: set[str] = set()
        for kind, figures in markers:
            if kind not in KINDS:
                found.append(f"a marker of an unknown kind ({kind}): {para.strip()[:80]}")
                continue
            for fig in figures:
                m = FIGURE.fullmatch(fig)
                if m is None or m.group("ratio") or m.group("rate"):
                    found.append(f"a marker cannot declare {fig!r} not measured")
                elif not re.search(rf"(?<![\w.,]){re.escape(fig)}(?![\w])", body):
                    found.append(f"a marker lists {fig!r}, which its paragraph does not have")
                else:
                    allowed.add(" ".join(fig.split()))
        for m in FIGURE.finditer(body):
            fig = " ".join(m.group(0).split())
            if TARGET.search(body[: m.start()]) or fig in allowed:
                continue
            line = body[: m.end()].rsplit("\n", 1)[-1] + body[m.end() :].split("\n", 1)[0]
            found.append(f"a figure outside a results table: {fig!r} in: {line.strip()}")
    return found
