"""Check the docs against the code (the nox ``docs`` session).

- The example record in docs/format.md parses with the real decoder and round-trips.
- Every public name of ``commitstore`` is mentioned in the README or docs.
- The layout paths in docs/format.md match what the code computes.
- docs/benchmarks.md's tables are what ``benchmarks/results/*.json`` renders to, and no measured
  figure appears on that page outside them.
- Every ```python block after a ``<!-- run -->`` marker in docs/*.md runs without error, each in a
  fresh empty folder (its own interpreter state: ``runpy`` over a temporary file).
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import tempfile
import traceback
from pathlib import Path

import commitstore
from commitstore.layout import record_parts, validate_name
from commitstore.records import decode_record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import render as bench_render  # noqa: E402


def main() -> int:
    problems: list[str] = []
    fmt = (ROOT / "docs" / "format.md").read_text()
    match = re.search(r"<!-- example-record -->\s*```json\n(.*?)```", fmt, re.S)
    if match is None:
        problems.append("format.md: no example record")
    else:
        rec = decode_record(match.group(1).encode())
        if rec.name != "run1/step_0810.pt" or rec.step != 810:
            problems.append("format.md: example record decodes to something else")
    example = "/".join(record_parts(validate_name("run1/step_0810.pt")))
    if example not in fmt:
        problems.append(f"format.md: layout example {example} missing")
    text = (ROOT / "README.md").read_text() + "".join(
        p.read_text() for p in (ROOT / "docs").glob("*.md")
    )
    for name in commitstore.__all__:
        if name != "__version__" and name not in text:
            problems.append(f"public name {name} is not documented")
    problems += bench_render.problems()  # fixed by ``python -m benchmarks.render``
    problems += run_examples()
    for p in problems:
        print(f"docs: {p}", file=sys.stderr)
    print("docs: ok" if not problems else f"docs: {len(problems)} problem(s)")
    return 1 if problems else 0


RUN = re.compile(r"<!-- run -->\s*```python\n(.*?)```", re.S)


def run_examples() -> list[str]:
    """Run every marked example; one problem per failing block (with its traceback)."""
    problems = []
    here = os.getcwd()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, match in enumerate(RUN.finditer(doc.read_text())):
            with tempfile.TemporaryDirectory(prefix="commitstore-doc-") as tmp:
                script = Path(tmp) / f"{doc.stem}_{i}.py"
                script.write_text(match.group(1))
                os.chdir(tmp)
                try:
                    runpy.run_path(str(script), run_name="__main__")
                except BaseException:  # the example's failure, whatever it is, is the report
                    problems.append(
                        f"{doc.name}: example {i + 1} failed:\n{traceback.format_exc()}"
                    )
                finally:
                    os.chdir(here)
    return problems


if __name__ == "__main__":
    sys.exit(main())
