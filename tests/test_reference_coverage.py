"""The API reference the docs site renders names every public name (``docs/check_docs.py
--reference``): the real site builds with ``mkdocs build --strict`` and covers everything; a
copy of the project with a planted undocumented public name fails the check, by that name."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "docs" / "check_docs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(project: Path, site: Path) -> None:
    """``mkdocs build --strict`` of ``project`` (its mkdocs.yml, docs and src) into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    config = str(project / "mkdocs.yml")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", config, "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_site_builds_strictly_and_its_reference_names_every_public_name(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    _build(ROOT, site)
    check = _checker()
    names = {name for name, _ in check.public_names(ROOT / "src")}
    # The names the first-hour issue found missing are among those checked.
    names_checked = ("StorageError", "ConfigurationError", "MirrorState", "GcReport", "open_store")
    for name in (*names_checked, "CommitOutcome"):
        assert f"commitstore.{name}" in names
    for method in ("close", "flush", "mirrors", "mirror_status", "sync", "restore", "prune"):
        assert f"commitstore.CommitStore.{method}" in names
    for module in ("torch", "dcp", "lightning", "hf", "fsspec"):
        assert f"commitstore.{module}" in names
    assert check.reference_problems(site, ROOT / "src") == []


def _copy_project(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src", dest / "src", ignore=ignore)
    shutil.copytree(ROOT / "docs", dest / "docs", ignore=ignore)
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", dest / "README.md")
    return dest


def test_a_planted_undocumented_public_name_fails_the_check(tmp_path: Path) -> None:
    project = _copy_project(tmp_path / "project")
    pkg = project / "src" / "commitstore"
    init = pkg / "__init__.py"
    exported = '    "open_store",\n    "planted_helper",\n'
    init.write_text(
        init.read_text().replace('    "open_store",\n', exported)
        + '\n\ndef planted_helper() -> None:\n    """Exported, but in no reference page."""\n'
    )
    mirrors = pkg / "store.py"
    undocumented = "\n    def planted_method(self) -> None:\n        pass\n"
    mirrors.write_text(mirrors.read_text() + undocumented)
    lightning = pkg / "lightning.py"
    lightning.write_text(
        lightning.read_text().replace(
            '__all__ = ["LAST_PATTERN", "CommitStoreCheckpointIO"]',
            '__all__ = ["LAST_PATTERN", "CommitStoreCheckpointIO", "_planted"]',
        )
        + "\n\n_planted = 1\n"
    )
    site = tmp_path / "site"
    _build(project, site)  # the planted names do not break the build: only the check sees them
    problems = _checker().reference_problems(site, project / "src")
    assert len(problems) == 3, problems
    for planted in (
        "commitstore.planted_helper",
        "commitstore.CommitStore.planted_method",
        "commitstore.lightning._planted",
    ):
        assert any(f"reference: {planted} is not" in p for p in problems), problems
    cli = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "check_docs.py"), "--reference", str(site)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr  # this checkout's names are all on that page
