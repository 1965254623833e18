"""A third-party backend, the way users get one: a package with a ``commitstore.backends`` entry
point, built and installed by pip, found by ``open_store`` with no ``register()`` call, and passing
the whole conformance suite. Also the in-process registry (``register``/``unregister``).

The package is ``tests/plugin_pkg`` (``commitstore-myproto``: the local POSIX backend under its
own scheme and strategy name). pip installs it into a temporary ``--target`` folder, offline and
without build isolation, so the test venv itself is never changed; the checks run in a child
interpreter whose ``sys.path`` holds that folder and this checkout's commitstore.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import commitstore
from commitstore import ConfigurationError, open_store
from commitstore.backends import Backend, register, schemes, unregister
from commitstore.backends.rename.posix import LocalBackend

HERE = Path(__file__).resolve().parent
PLUGIN_PKG = HERE / "plugin_pkg"
DOC = HERE.parent / "docs" / "testing.md"
SRC = Path(commitstore.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``commitstore-myproto`` built and installed into a fresh folder; returns the folder."""
    base = tmp_path_factory.mktemp("plugin")
    pkg = shutil.copytree(PLUGIN_PKG, base / "src", ignore=shutil.ignore_patterns("__pycache__"))
    site = base / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(pkg)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (eps,) = site.glob("commitstore_myproto-*.dist-info/entry_points.txt")
    assert "myproto = myproto_backend:factory" in eps.read_text()
    return site


def child(site: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with only the plugin folder and commitstore's source added."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
        check=False, timeout=300,
    )  # fmt: skip


def test_entry_point_alone_opens_the_store(installed: Path, tmp_path: Path) -> None:
    assert "myproto" not in schemes(), "the plugin leaked into the test interpreter"
    script = textwrap.dedent(
        """
        import sys
        import commitstore
        from commitstore import open_store
        from commitstore.backends import schemes

        assert commitstore.__file__.startswith(sys.argv[2]), commitstore.__file__
        assert "myproto" in schemes(), schemes()
        store = open_store("myproto://" + sys.argv[1])
        info = store.describe()
        assert info["strategy"] == "myproto-rename", info
        assert type(store._backend).__module__ == "myproto_backend"
        rec = store.put_bytes("run/step_0001.pt", b"plugin bytes")
        assert store.read_bytes("run/step_0001.pt") == b"plugin bytes"
        report = store.verify()
        assert [r.status for r in report.results] == ["ok"], report
        assert [r.name for r in open_store("myproto://" + sys.argv[1]).list()] == [rec.name]
        print("plugin-ok")
        """
    )
    root = tmp_path / "store"
    proc = child(installed, ["-c", script, str(root), str(SRC)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plugin-ok" in proc.stdout
    assert (root / "run" / "step_0001.pt").read_bytes() == b"plugin bytes"


def doc_example() -> str:
    """The conformance example of docs/testing.md, which this test runs as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (example,) = [str(b) for b in blocks if "StoreConformance" in b]
    return example


def test_conformance_suite_passes_on_the_plugin(installed: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_mybackend.py").write_text(doc_example())
    proc = child(
        installed,
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work), "-c",
         os.devnull, "test_mybackend.py"],
        work,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    summary = re.search(r"(\d+) passed", out)
    assert summary is not None, out
    assert int(summary.group(1)) > 30, out
    assert " failed" not in out and " error" not in out, out


class _Scratch(LocalBackend):
    strategy = "scratch-rename"


def _scratch(url: str, options: dict[str, Any]) -> Backend:
    return _Scratch(url.split("://", 1)[1])


def test_register_at_run_time(tmp_path: Path) -> None:
    register("scratch", _scratch)
    try:
        assert "scratch" in schemes()
        store = open_store(f"scratch://{tmp_path}")
        assert store.describe()["strategy"] == "scratch-rename"
        store.put_bytes("a.pt", b"x")
        assert store.read_bytes("a.pt") == b"x"
        with pytest.raises(ConfigurationError, match="replace=True"):
            register("scratch", _scratch)
        register("scratch", _scratch, replace=True)
    finally:
        unregister("scratch")
    assert "scratch" not in schemes()
    with pytest.raises(ConfigurationError, match="no commit strategy for scratch://"):
        open_store(f"scratch://{tmp_path}")
    unregister("scratch")  # idempotent


def test_builtin_replaced_only_on_request(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="already has a backend"):
        register("file", _scratch)
    assert open_store(f"file://{tmp_path}").describe()["strategy"] == "local-rename"
    register("file", _scratch, replace=True)
    try:
        assert open_store(f"file://{tmp_path}").describe()["strategy"] == "scratch-rename"
    finally:
        unregister("file")
    assert open_store(f"file://{tmp_path}").describe()["strategy"] == "local-rename"


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        open_store("nosuch://bucket/x")
    message = str(info.value)
    assert "nosuch://" in message
    for known in ("file://", "memory://", "s3://", "gs://", "az://", "smb://"):
        assert known in message, message
    with pytest.raises(ConfigurationError):
        register("not a scheme", _scratch)
