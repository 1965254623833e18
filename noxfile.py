"""nox sessions: tests, lint, typecheck, docs (default); bench (on request).

Python versions and extras are read from pyproject.toml.
"""

from __future__ import annotations

import re
from pathlib import Path

import nox
import tomllib

PYPROJECT = tomllib.loads(Path("pyproject.toml").read_text())
_MIN = re.search(r"3\.(\d+)", PYPROJECT["project"]["requires-python"])
PYTHONS = [f"3.{m}" for m in range(int(_MIN.group(1)) if _MIN else 10, 14)]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]

nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.error_on_missing_interpreters = False


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The full test-suite (the README's test command runs the same in .venv)."""
    session.install("-e", ".[test]")
    session.env["COMMITSTORE_REQUIRE_SERVERS"] = "1"
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install(*EXTRAS["lint"])
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py", "docs")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "noxfile.py", "docs")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over src, tests and benchmarks."""
    session.install("-e", ".[typecheck]")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Check the docs against the code: examples parse, every public name is documented."""
    session.install("-e", ".")
    session.run("python", "docs/check_docs.py")


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks (ratios against same-run baselines); not part of the default run."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "benchmarks", *session.posargs)
