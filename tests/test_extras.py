"""Each extra (smb, s3, gcs, azure, sftp, webdav) installs and works alone, in a venv of its own.

For every extra, in parallel: a fresh ``python -m venv`` gets
``-e <repo>[<extra>] pytest hypothesis`` (from PyPI or ``PIP_FIND_LINKS``); the other extras'
libraries must then be missing; and ``tests/extras/conformance_child.py`` runs inside it against
the real server this process starts (Samba, moto, fake-gcs-server, Azurite, an asyncssh SFTP
server, wsgidav), described to it in
environment variables: StoreConformance less its two slowest tests (the stateful model, 100 s or
more per object store, and the truncation property, 35 s; the main suite runs both on every
server): commit, overwrite, abort, racing writers, folders, names, list, verify, latest, reads,
bit flips (5 of the property's 25 examples), delete and gc stay; plus a request refused with
403, whose error must translate with this extra alone (a GCS-only install once failed there,
importing botocore).

The venvs get no pip of their own: this interpreter's pip installs into each (``--python``,
``--no-compile``), first the extra's requirements and the build backend (all venvs at once),
then the editable checkout without build isolation (one at a time: setuptools writes its
egg-info in ``src/``).
Nothing is kept between runs: the venvs live in pytest's temporary folder.

The framework extras (torch, lightning) get the same treatment under ``@pytest.mark.soak`` (a torch
install is large): torch pinned to the CPU build by a constraint, ``-e <repo>[<extra>]``, then
``tests/extras/framework_child.py`` in that venv (imports, absent libraries, the integration).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import commitstore

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pip vendors tomli for Python 3.10
    from pip._vendor import tomli as tomllib

from .helpers.azurite import CONTAINER, KEY, Azurite
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.s3servers import BUCKET as S3_BUCKET
from .helpers.s3servers import MotoServer
from .helpers.samba import PASSWORD, SHARE, USER, SambaServer
from .helpers.sftpserver import PASSWORD as SFTP_PASSWORD
from .helpers.sftpserver import SftpServer
from .helpers.webdavserver import PASSWORD as DAV_PASSWORD
from .helpers.webdavserver import WebdavServer

MiB = 1024 * 1024
REPO = Path(commitstore.__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "extras" / "conformance_child.py"
EXTRAS = ("smb", "s3", "gcs", "azure", "sftp", "webdav")
LIBRARIES = {
    "smb": ("smbprotocol", "smbclient"),
    "s3": ("s3fs", "aiobotocore", "botocore"),
    "gcs": ("gcsfs", "google.cloud.storage", "google_crc32c"),
    "azure": ("azure.storage.blob", "azure.core"),
    "sftp": ("sshfs", "asyncssh"),
    "webdav": ("webdav4",),
}
"""Modules each extra brings; in its venv every other extra's modules must be missing."""
NO_COMPILE = ("--no-compile",)
"""pip writes no bytecode for what it installs (half of an install's time here, for thousands of
modules never imported); the child's imports compile what they use, as a fresh install would."""
SUBSET = "not state_machine and not truncation"
"""The two slowest conformance tests (about 100 s and 35 s per object store, with four runs
sharing two cores) are left to the main suite; the bit-flip property test stays, with 5
examples instead of 25 (``tests/extras/conformance_child.py``)."""


@dataclass
class Run:
    """What happened in one extra's venv."""

    extra: str
    steps: list[str] = field(default_factory=list)
    """Each step with its duration, in order."""
    failure: str | None = None
    imports: dict[str, bool] = field(default_factory=dict)
    """Module -> importable, in that venv."""
    commitstore_file: str = ""
    passed: int = 0
    output: str = ""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each extra's server, started here with the main venv, as JSON-able descriptions."""
    with contextlib.ExitStack() as stack:
        samba = SambaServer(tmp_path_factory.mktemp("samba"))
        stack.callback(samba.stop)
        moto = MotoServer(tmp_path_factory.mktemp("moto"))
        stack.callback(moto.stop)
        gcs = FakeGcs(tmp_path_factory.mktemp("fakegcs"))
        stack.callback(gcs.stop)
        azurite = Azurite(tmp_path_factory.mktemp("azurite"))
        stack.callback(azurite.stop)
        sftp = SftpServer(tmp_path_factory.mktemp("sftp"))
        stack.callback(sftp.stop)
        dav = WebdavServer(tmp_path_factory.mktemp("webdav"))
        stack.callback(dav.stop)
        yield {
            "smb": {
                "url": f"smb://{USER}@127.0.0.1:{samba.port}/{SHARE}",
                "options": {"password": PASSWORD},
                "share_dir": str(samba.share_dir),
            },
            "s3": {
                "url": f"s3://{S3_BUCKET}",
                "options": {**moto.options(), "part_size": 5 * MiB, "single_put_max": 5 * MiB},
                "endpoint": moto.endpoint,
                "bucket": S3_BUCKET,
            },
            "gcs": {
                "url": f"gs://{GCS_BUCKET}",
                "options": {**gcs.options(), "chunk_size": 1 * MiB},
                "endpoint": gcs.endpoint,
                "bucket": GCS_BUCKET,
            },
            "azure": {
                "url": f"az://{CONTAINER}",
                "options": {**azurite.options(), "block_size": 1 * MiB},
                "container": CONTAINER,
                "account_key": KEY,
            },
            "sftp": {
                "url": sftp.url("srv"),
                "options": {"password": SFTP_PASSWORD, "known_hosts": None},
                "root": str(sftp.root / "srv"),
            },
            "webdav": {
                "url": dav.url("srv"),
                "options": {"password": DAV_PASSWORD},
                "root": str(dav.root / "srv"),
            },
        }


def _env() -> dict[str, str]:
    """This environment without what points at the main venv or this checkout's src."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@contextlib.contextmanager
def _repo_build_lock() -> Iterator[None]:
    """One editable build of the checkout at a time (setuptools writes its egg-info in src/),
    across threads and processes."""
    key = hashlib.sha256(str(REPO).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"commitstore-build-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _extra_requirements(extra: str) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


def _step(run: Run, what: str, cmd: list[str], *, timeout: float, **kw: Any) -> str:
    start = time.monotonic()
    env = kw.pop("env", _env())
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=timeout, env=env, **kw
    )
    run.steps.append(f"{what} {time.monotonic() - start:.1f}s")
    out = str(proc.stdout) + str(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{out[-6000:]}")
    return out


def _probe(modules: list[str]) -> str:
    return (
        "import importlib, json, commitstore\n"
        f"mods = {modules!r}\n"
        "found = {}\n"
        "for m in mods:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "        found[m] = True\n"
        "    except ImportError:\n"
        "        found[m] = False\n"
        "print(json.dumps({'file': commitstore.__file__, 'found': found}))\n"
    )


def _build_requirements() -> list[str]:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"])


def run_extra(extra: str, server: dict[str, Any], base: Path) -> Run:
    run = Run(extra)
    try:
        venv = base / "venv"
        py = str(venv / "bin" / "python")
        _step(run, "venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
        pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", *NO_COMPILE]
        deps = [*_extra_requirements(extra), *_build_requirements(), "pytest", "hypothesis"]
        _step(run, "deps", [*pip, *deps], timeout=600)
        with _repo_build_lock():
            _step(run, "install", [*pip, "--no-build-isolation", "-e", f"{REPO}[{extra}]",
                                   "pytest", "hypothesis"], timeout=600)  # fmt: skip
        modules = [m for mods in LIBRARIES.values() for m in mods]
        probe = _step(run, "imports", [py, "-c", _probe(modules)], timeout=120, cwd=base)
        found = json.loads(probe.strip().splitlines()[-1])
        run.imports, run.commitstore_file = found["found"], found["file"]
        work = base / "work"
        work.mkdir()
        shutil.copy(CHILD, work / CHILD.name)
        env = {
            **_env(),
            "COMMITSTORE_EXTRA": extra,
            "COMMITSTORE_EXTRA_SERVER": json.dumps(server),
        }
        cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
               "-c", os.devnull, "-k", SUBSET, CHILD.name]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, check=False, timeout=600
        )
        run.steps.append(f"conformance {time.monotonic() - start:.1f}s")
        run.output = proc.stdout + proc.stderr
        summary = re.search(r"(\d+) passed", run.output)
        run.passed = int(summary.group(1)) if summary else 0
        if proc.returncode != 0:
            run.failure = f"conformance run failed ({proc.returncode})"
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        run.failure = str(exc)
    return run


@pytest.fixture(scope="module")
def runs(
    servers: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Run]:
    start = time.monotonic()
    with ThreadPoolExecutor(len(EXTRAS)) as pool:
        futures = {
            extra: pool.submit(run_extra, extra, servers[extra], tmp_path_factory.mktemp(extra))
            for extra in EXTRAS
        }
        done = {extra: f.result() for extra, f in futures.items()}
    total = time.monotonic() - start
    print(f"\ntest_extras: {len(EXTRAS)} venvs, installs and conformance runs in {total:.0f}s")
    for run in done.values():
        print(f"  {run.extra}: {', '.join(run.steps)}; {run.passed} passed")
    return done


@pytest.mark.parametrize("extra", EXTRAS)
def test_extra_installs_and_works_alone(
    runs: dict[str, Run], extra: str, record_property: Any
) -> None:
    run = runs[extra]
    record_property("steps", "; ".join(run.steps))
    assert run.imports, run.failure  # the venv was made and its imports probed
    assert run.commitstore_file.startswith(str(REPO / "src")), run.commitstore_file
    for owner, modules in LIBRARIES.items():
        for module in modules:
            assert run.imports[module] is (owner == extra), (
                f"{module} is {'' if run.imports[module] else 'not '}importable in the "
                f"{extra}-only venv"
            )
    assert run.failure is None, f"{run.failure}\n{run.output[-8000:]}"
    assert run.passed > 30, run.output[-8000:]


FRAMEWORK_EXTRAS = ("torch", "lightning")
FRAMEWORK_CHILD = Path(__file__).resolve().parent / "extras" / "framework_child.py"
TORCH_PIN = os.environ.get("COMMITSTORE_TORCH", "torch==2.13.0")
"""The CPU build (a wheel on disk here); pip must never pick a newer, CUDA, torch."""


def run_framework_extra(extra: str, base: Path) -> Run:
    """A fresh venv with ``-e <repo>[extra]`` alone (torch pinned to the CPU build), then
    ``tests/extras/framework_child.py`` inside it."""
    run = Run(extra)
    try:
        venv = base / "venv"
        py = str(venv / "bin" / "python")
        _step(run, "venv", [sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
        pin = base / "constraints.txt"
        pin.write_text(TORCH_PIN + "\n")
        pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", *NO_COMPILE]
        pip += ["-c", str(pin)]
        _step(run, "torch", [*pip, TORCH_PIN], timeout=1200)
        deps = [*_extra_requirements(extra), *_build_requirements()]
        _step(run, "deps", [*pip, *deps], timeout=1200)
        with _repo_build_lock():
            _step(run, "install", [*pip, "--no-build-isolation", "-e", f"{REPO}[{extra}]"],
                  timeout=600)  # fmt: skip
        work = base / "work"
        work.mkdir()
        run.output = _step(run, "child", [py, str(FRAMEWORK_CHILD), extra, str(work)],
                           timeout=600, cwd=work)  # fmt: skip
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        run.failure = str(exc)
    return run


@pytest.mark.soak
@pytest.mark.parametrize("extra", FRAMEWORK_EXTRAS)
def test_framework_extra_installs_and_works_alone(
    extra: str, tmp_path: Path, record_property: Any
) -> None:
    """``commitstore[torch]`` / ``commitstore[lightning]`` alone in a fresh venv: importing
    commitstore imports no framework, no other extra's library is there, and the integration
    works (tests/extras/framework_child.py)."""
    run = run_framework_extra(extra, tmp_path)
    record_property("steps", "; ".join(run.steps))
    assert run.failure is None, run.failure
    assert "framework_child: ok" in run.output, run.output[-8000:]
