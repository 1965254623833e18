"""The command line a new user meets, run as the installed ``commitstore`` console script in a
process of its own: per-target options (an S3 mirror with its own endpoint, on moto), ``rm`` and
``restore``, help that stands on its own, ``-v``/``-q`` and log lines that name their target,
one-line errors (a GCS endpoint that is down, a missing local file), ``ls`` columns, progress."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import commitstore
from commitstore import open_store
from commitstore.cli import build_parser

from .helpers.s3servers import ACCESS_KEY, BUCKET, SECRET_KEY, MotoServer

SRC = Path(commitstore.__file__).resolve().parents[1]
"""The sources under test (the child process imports the same ones)."""
CLI = Path(sys.executable).with_name("commitstore")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed entry point, importing the sources under test; no AWS endpoint in the
    environment (a test gives it on the command line)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), full.get("PYTHONPATH")]))
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, env=full, timeout=120, check=False
    )


def _file(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


S3_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    "AWS_DEFAULT_REGION": "us-east-1",
}


# -- per-target options -------------------------------------------------------------------------
def test_sync_and_restore_with_an_s3_mirror_given_its_own_endpoint(
    moto: MotoServer, tmp_path: Path
) -> None:
    primary = str(tmp_path / "p")
    assert run("put", _file(tmp_path / "step_1.pt", b"one" * 100), primary).returncode == 0
    mirror = moto.url("cli-sync")
    endpoint = f"endpoint_url={moto.endpoint}"
    done = run("sync", primary, mirror, "-O", endpoint, env=S3_ENV)
    assert done.returncode == 0, done.stderr
    assert f"{mirror}: 1 copied" in done.stdout
    keys = [o["Key"] for o in moto.client().list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "cli-sync/step_1.pt" in keys
    # the scoped form reaches the same URL; the unscoped -o stays the (local) primary's
    done = run("sync", primary, mirror, "-o", f"s3://{BUCKET}:{endpoint}", env=S3_ENV)
    assert done.returncode == 0 and f"{mirror}: 0 copied, 0 repaired, 1 ok" in done.stdout
    done = run("sync", primary, mirror, "-o", endpoint, "-O", endpoint, env=S3_ENV)
    assert done.returncode == 2 and "endpoint_url" in done.stderr, done.stderr
    done = run("sync", primary, mirror, "-o", "gs://other:token=anon", env=S3_ENV)
    assert done.returncode == 2 and "matches none of the URLs" in done.stderr
    # restore from the mirror after the primary lost its copy
    assert run("rm", primary, "step_1.pt").returncode == 0
    done = run("restore", primary, "step_1.pt", "--from", mirror, "-O", endpoint, env=S3_ENV)
    assert done.returncode == 0, done.stderr
    assert open_store(primary).read_bytes("step_1.pt") == b"one" * 100
    done = run("restore", primary, "nothing.pt", "--from", mirror, "-O", endpoint, env=S3_ENV)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr


# -- rm -------------------------------------------------------------------------------------------
def test_rm_deletes_refuses_folder_paths_and_has_a_dry_run(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = open_store(url)
    for name in ("a.pt", "run/b.pt", "run/c.pt"):
        store.put_bytes(name, name.encode())
    done = run("rm", url, "run")
    assert done.returncode == 1 and done.stdout == "", done  # its error goes to stderr
    assert done.stderr.startswith("commitstore: error: not removed: run: "), done.stderr
    assert "folder" in done.stderr and done.stderr.count("\n") == 1
    done = run("rm", url, "run", "--dry-run", "--json")
    assert done.returncode == 1 and "run" in json.loads(done.stdout)["failed"]
    done = run("rm", url, "a.pt", "--dry-run")
    assert done.returncode == 0 and "would remove a.pt" in done.stdout
    assert [r.name for r in store.list()] == ["a.pt", "run/b.pt", "run/c.pt"]
    done = run("rm", url, "a.pt", "../x")  # every name is checked before anything is deleted
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert store.record("a.pt").name == "a.pt"
    done = run("rm", url, "a.pt", "run/b.pt", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["removed"] == ["a.pt", "run/b.pt"]
    assert [r.name for r in store.list()] == ["run/c.pt"]
    assert not (tmp_path / "s" / "a.pt").exists()


# -- help -----------------------------------------------------------------------------------------
def test_help_stands_on_its_own() -> None:
    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands: dict[str, argparse.ArgumentParser] = dict(subs[0].choices)
    assert {"rm", "restore", "scrub"} <= set(commands)
    for name, sub in commands.items():
        assert sub.description, name
        for action in sub._actions:
            assert action.help, (name, action.dest)
    top = run("--help")
    assert top.returncode == 0 and "``" not in top.stdout
    assert "exit status:" in top.stdout and "2    usage error" in top.stdout
    for name in commands:
        done = run(name, "--help")
        assert done.returncode == 0 and "exit status:" in done.stdout, name
        assert "``" not in done.stdout and f"commitstore {name}:" in done.stdout
    gc_help = " ".join(run("gc", "--help").stdout.split())
    assert "(default: 3600" in gc_help
    assert "(default: full)" in " ".join(run("get", "--help").stdout.split())


# -- logs ---------------------------------------------------------------------------------------
def test_log_levels_and_lines_that_name_their_target(tmp_path: Path) -> None:
    url, mirror = str(tmp_path / "s"), str(tmp_path / "m")
    for i in (1, 2, 3):
        src = _file(tmp_path / f"step_{i}.pt", bytes([i]) * 10)
        done = run("put", src, url, "--mirror", mirror, *(["-v"] if i == 3 else []))
        assert done.returncode == 0, done.stderr
        assert f"committed step_{i}.pt to {url}" in done.stdout
    assert done.stderr.splitlines() == [
        f"commitstore: info: committed step_3.pt to {url} (10 bytes, {store_digest(url)})",
        f"commitstore: info: committed step_3.pt to {mirror} (10 bytes, {store_digest(url)})",
    ]
    done = run("prune", url, "--keep-last", "1", "--min-age", "0", "-q")
    assert done.returncode == 0 and done.stderr == ""
    done = run("prune", url, "--keep-last", "0", "--min-age", "0", "--mirror", mirror)
    assert done.returncode == 0
    assert f"commitstore: warning: pruned 2 artifacts from {mirror}: step_1.pt, step_2.pt" in (
        done.stderr.splitlines()
    ), done.stderr
    done = run("put", str(tmp_path / "step_1.pt"), url, "--json", "-v")
    logs = [json.loads(line)["log"] for line in done.stderr.splitlines()]
    assert logs and all(url in log["message"] for log in logs), logs


def store_digest(url: str) -> str:
    return open_store(url).record("step_3.pt").digest


def test_exit_flush_warning_says_commitstore_once(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_bytes(b"a file where the mirror's folder would be")
    script = (
        "import logging; logging.basicConfig(format='%(levelname)s:%(name)s:%(message)s')\n"
        "from commitstore import open_store\n"
        "import sys\n"
        "store = open_store(sys.argv[1], mirrors=[sys.argv[2]])\n"
        "store.put_bytes('step_1.pt', b'x')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "COMMITSTORE_EXIT_FLUSH_SECONDS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "p"), str(tmp_path / "blocker" / "m")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert "WARNING:commitstore:the store was not closed" in done.stderr, done.stderr
    assert "commitstore:commitstore:" not in done.stderr


# -- errors ---------------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_gcs_endpoint_that_is_down_is_one_line(tmp_path: Path) -> None:
    endpoint = f"endpoint_url=http://127.0.0.1:{_closed_port()}"
    # One retry (the store's retries; five attempts by default, with 1, 2, 4, 8 s of backoff).
    done = run("ls", "gs://some-bucket/run", "-o", endpoint, "-o", "token=anon", "-o", "retries=2")
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("commitstore: error: ") and "unavailable" in done.stderr


def test_a_missing_local_file_is_named_without_errno(tmp_path: Path) -> None:
    done = run("put", str(tmp_path / "missing.bin"), str(tmp_path / "s"))
    assert done.returncode == 1
    assert (
        done.stderr == f"commitstore: error: {tmp_path / 'missing.bin'}: no such file or folder\n"
    )
    assert not (tmp_path / "s").exists()


# -- output -------------------------------------------------------------------------------------
def test_ls_shows_created_and_alias_and_json_keeps_them(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = open_store(url)
    store.put_bytes("step_1.pt", b"1")
    store.put_bytes("last.ckpt", b"1", alias=True)
    done = run("ls", url)
    rows = {line.split()[4]: line.split() for line in done.stdout.splitlines()[1:]}
    assert rows["last.ckpt"][-1] == "alias" and rows["step_1.pt"][-1] == "step_1.pt"
    created = store.record("step_1.pt").created.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert rows["step_1.pt"][2] == created and done.stdout.split()[2] == "CREATED"
    docs = {d["name"]: d for d in json.loads(run("ls", url, "--json").stdout)}
    assert docs["last.ckpt"]["alias"] is True and docs["step_1.pt"]["alias"] is False
    assert docs["step_1.pt"]["created"] == store.record("step_1.pt").created.isoformat()


def test_put_reports_its_figures(tmp_path: Path) -> None:
    done = run("put", _file(tmp_path / "w.bin", b"w" * 4096), str(tmp_path / "s"), "--json")
    doc = json.loads(done.stdout)
    assert doc["size"] == 4096 and doc["url"] == str(tmp_path / "s")
    assert doc["seconds"] >= 0 and doc["mb_per_s"] >= 0
    text = run("put", str(tmp_path / "w.bin"), str(tmp_path / "s"), "--name", "x.bin").stdout
    assert re.fullmatch(
        r"committed x\.bin to \S+ \(4096 bytes, xxh3_128:\w+, [\d.]+ s, [\d.]+ MB/s\)\n", text
    )


@pytest.mark.parametrize("command", ["put-folder", "sync"])
def test_progress_of_sync_and_folder_put(tmp_path: Path, command: str) -> None:
    folder = tmp_path / "checkpoint-7"
    _file(folder / "a.bin", b"a" * 3000)
    _file(folder / "sub" / "b.bin", b"b" * 5000)
    url = str(tmp_path / "s")
    if command == "put-folder":
        done = run("put", str(folder), url, "--progress")
        label = "put checkpoint-7 ["
    else:
        assert run("put", str(folder), url).returncode == 0
        done = run("sync", url, str(tmp_path / "m"), "--progress")
        label = "sync ["
    assert done.returncode == 0, done.stderr
    assert label in done.stderr and "100.0%" in done.stderr and "7.8 KiB" in done.stderr
    assert run("put", str(folder), url, "--name", "again", "--progress", "--json").stderr == ""
