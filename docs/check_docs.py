"""Check the docs against the code (the nox ``docs`` session).

- The example record in docs/format.md parses with the real decoder and round-trips.
- Every public name of ``commitstore`` is mentioned in the README or docs.
- The layout paths in docs/format.md match what the code computes.
- The layout block of docs/backends.md lists every module as the code has it (``docs/layout.py``).
- The results tables on every page are what ``benchmarks/results/*.json`` renders to (a result
  older than the code it times rendered **Stale**); every result file has its table in
  docs/benchmarks.md; no result file's ratio, medians, interval or verdict contradict its own
  runs; and no measured-looking figure appears on the README or any docs page outside a table,
  unless the check's rules accept it (a target, code, or a marker declaring it a default, a limit,
  a version: ``benchmarks/render.py``).
- Every ```python block after a ``<!-- run -->`` marker in docs/*.md runs without error, each in a
  fresh empty folder (its own interpreter state: ``runpy`` over a temporary file).

``python docs/check_docs.py --reference SITE`` checks a built site instead (``./dev.sh docs``,
after ``mkdocs build --strict``): every public name is in the rendered API reference
(``SITE/reference/index.html``): each name of ``commitstore.__all__``, each public method and
property of ``CommitStore`` (inherited ones included), and each integration module with each
name of its ``__all__``. The names are read from the sources with griffe (nothing imported).
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import commitstore
from commitstore.layout import record_parts, validate_name
from commitstore.records import decode_record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import render as bench_render  # noqa: E402

sys.path.insert(0, str(ROOT / "docs"))
import layout as docs_layout  # noqa: E402


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
    if docs_layout.stale((ROOT / "docs" / "backends.md").read_text()):
        problems.append(
            "backends.md: the layout block differs from the code (python docs/layout.py)"
        )
    problems += run_examples()
    for p in problems:
        print(f"docs: {p}", file=sys.stderr)
    print("docs: ok" if not problems else f"docs: {len(problems)} problem(s)")
    return 1 if problems else 0


INTEGRATIONS = ("torch", "dcp", "lightning", "hf", "fsspec")
"""The public integration modules (``commitstore.<name>``), each rendered with its ``__all__``."""


def public_names(src: Path) -> list[tuple[str, set[str]]]:
    """Each public name under ``src/commitstore``, with the anchors that document it (its
    public path, and the path it is defined at for a re-exported name)."""
    import griffe

    pkg = griffe.load("commitstore", search_paths=[str(src)], allow_inspection=False)

    def entry(path: str, obj: Any) -> tuple[str, set[str]]:
        return path, {path, obj.final_target.path if obj.is_alias else obj.path}

    out = [entry(f"commitstore.{n}", pkg[n]) for n in pkg.exports or () if n != "__version__"]
    store = pkg["CommitStore"]
    store = store.final_target if store.is_alias else store
    for name, member in store.all_members.items():
        is_property = member.is_attribute and "property" in member.labels
        if not name.startswith("_") and (member.is_function or is_property):
            out.append(entry(f"commitstore.CommitStore.{name}", member))
    for mod in INTEGRATIONS:
        module = pkg[mod]
        out.append(entry(f"commitstore.{mod}", module))
        out += [entry(f"commitstore.{mod}.{n}", module[n]) for n in module.exports or ()]
    return out


def reference_problems(site: Path, src: Path) -> list[str]:
    """One problem per public name (``public_names``) without an anchor in the rendered
    reference page of the built ``site``."""
    page = site / "reference" / "index.html"
    if not page.is_file():
        return [f"reference: {page} does not exist (build the site first)"]
    anchors = set(re.findall(r'id="([^"]+)"', page.read_text()))
    return [
        f"reference: {name} is not in the rendered API reference (docs/reference.md)"
        for name, accepted in public_names(src)
        if not accepted & anchors
    ]


def check_reference(site: Path) -> int:
    problems = reference_problems(site, ROOT / "src")
    for p in problems:
        print(f"docs: {p}", file=sys.stderr)
    print("docs: reference ok" if not problems else f"docs: {len(problems)} problem(s)")
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
    if sys.argv[1:2] == ["--reference"] and len(sys.argv) == 3:
        sys.exit(check_reference(Path(sys.argv[2])))
    sys.exit(main())
