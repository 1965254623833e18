"""``--json`` errors of the real ``commitstore`` entry point (a child process): every line on
stderr is one JSON object, an error says its type and message, and the exit status is the one
the same failure has without ``--json``. Usage errors, storage options, storage states, integrity
failures and damaged files for ``adopt`` are each provoked for real."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store

REPO = Path(__file__).resolve().parents[1]


def _entry_point() -> str:
    """The installed console script (this checkout's ``src`` is first on its path)."""
    beside = Path(sys.executable).parent / "commitstore"
    found = str(beside) if beside.exists() else shutil.which("commitstore")
    assert found, "the commitstore console script is not installed"
    return found


def run(*args: str, cwd: Path) -> tuple[int, str, str]:
    path = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [_entry_point(), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each of which must be one JSON object."""
    docs = []
    for line in stderr.splitlines():
        doc = json.loads(line)  # fails the test on any line that is not JSON
        assert isinstance(doc, dict), line
        docs.append(doc)
    return docs


def the_error(stderr: str) -> dict[str, Any]:
    errors = [d["error"] for d in json_lines(stderr) if "error" in d]
    assert len(errors) == 1, stderr
    error: dict[str, Any] = errors[0]
    assert isinstance(error["type"], str) and isinstance(error["message"], str)
    return error


def both(*args: str, cwd: Path) -> tuple[int, dict[str, Any], str]:
    """Run with and without ``--json``: the same exit status; the JSON error and the text."""
    code, _out, text = run(*args, cwd=cwd)
    jcode, _jout, jerr = run(*args, "--json", cwd=cwd)
    assert code == jcode, (code, jcode, text, jerr)
    assert "Traceback" not in text and "Traceback" not in jerr
    error = the_error(jerr)
    assert error["exit_code"] == code
    assert text.startswith("commitstore") or "usage:" in text, text
    return code, error, text


def test_usage_errors_are_json_with_exit_2(tmp_path: Path) -> None:
    code, error, text = both("verify", cwd=tmp_path)  # no URL
    assert code == 2 and error["type"] == "UsageError" and "URL" in error["message"]
    assert error["usage"] is True
    assert "usage:" in text
    code, error, _ = both("prune", str(tmp_path), "--keep-last", "x", cwd=tmp_path)
    assert code == 2 and error["type"] == "UsageError" and error["usage"] is True


def test_a_missing_store_and_a_bad_option_are_json_with_exit_2(tmp_path: Path) -> None:
    code, error, _ = both("ls", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert code == 2 and error["type"] == "ConfigurationError"
    code, error, text = both("ls", str(tmp_path), "-o", "readback=maybe", cwd=tmp_path)
    assert code == 2 and error["type"] == "ConfigurationError" and error["usage"] is True
    assert "readback" in error["message"] and "readback" in text
    code, error, _ = both("get", str(tmp_path), "../x", str(tmp_path / "d"), cwd=tmp_path)
    assert code == 2 and error["type"] == "InvalidNameError" and error["usage"] is True
    code, error, _ = both("ls", str(tmp_path), "-o", "strategy=fast", cwd=tmp_path)
    assert code == 2 and "strategy" in error["message"]
    # valid values of the same options are taken
    ok = run("ls", str(tmp_path), "-o", "strategy=local", "-o", "readback=no", cwd=tmp_path)
    assert ok[0] == 0, ok


def test_an_integrity_error_is_json_with_its_status_and_exit_1(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    store.put_bytes("a.bin", b"hello world")
    with open(tmp_path / "s" / "a.bin", "r+b") as f:
        f.write(b"J")
    code, error, _ = both("get", str(tmp_path / "s"), "a.bin", str(tmp_path / "out"), cwd=tmp_path)
    assert code == 1 and error["type"] == "IntegrityError" and error["status"] == "hash_mismatch"
    assert not (tmp_path / "out").exists()
    # warnings are JSON too: latest skips the damaged artifact (and finds none)
    jcode, out, err = run("latest", str(tmp_path / "s"), "--json", cwd=tmp_path)
    assert jcode == 1 and json.loads(out) is None
    logs = [d["log"] for d in json_lines(err) if "log" in d]
    assert logs and logs[0]["level"] == "warning" and "a.bin" in logs[0]["message"]


def test_a_symlink_on_the_path_is_a_storage_error_with_exit_1(tmp_path: Path) -> None:
    root, outside = tmp_path / "s", tmp_path / "outside"
    outside.mkdir()
    open_store(str(root)).put_bytes("keep.bin", b"x")
    (root / "link").symlink_to(outside)
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    code, error, _ = both("put", str(src), str(root), "--name", "link/a.bin", cwd=tmp_path)
    assert code == 1 and error["type"] == "StoragePathError" and error["errno"] == "ELOOP"
    assert list(outside.iterdir()) == []
    # a bad name is still a usage error
    code, error, _ = both("put", str(src), str(root), "--name", "../a.bin", cwd=tmp_path)
    assert code == 2 and error["type"] == "InvalidNameError"


def test_adopt_of_damaged_files_reports_them_without_a_traceback(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    header = json.dumps({"t": {"dtype": "F32", "data_offsets": ["0", 4]}}).encode()
    (root / "offsets.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    (root / "deep.json").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    (root / "early.pt").write_bytes(
        b"PK\x03\x04PK\x05\x06" + struct.pack("<4H2LH", 0, 0, 0xFFFF, 0xFFFF, 0, 0, 0)
    )
    code, out, err = run("adopt", str(root), "--json", cwd=tmp_path)
    assert code == 1, err
    assert "Traceback" not in err
    json_lines(err)
    doc = json.loads(out)
    assert doc["adopted"] == []
    assert set(doc["rejected"]) == {"offsets.safetensors", "deep.json", "early.pt"}
    assert the_error(err)["type"] == "IntegrityError"  # the one error line, besides the result
    code, out, err = run("adopt", str(root), cwd=tmp_path)
    assert code == 1 and "Traceback" not in err
    assert out.count("rejected") == 3
    assert err.startswith("commitstore: error: not adopted: ") and err.count("\n") == 1, err


def test_demo_into_a_folder_not_its_own_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "d" / "store").mkdir(parents=True)
    (tmp_path / "d" / "store" / "mine.txt").write_bytes(b"not the demo's")
    code, error, text = both("demo", str(tmp_path / "d"), cwd=tmp_path)
    assert code == 1 and error["type"] == "AlreadyExistsError" and "demo" in error["message"]
    assert text.count("\n") == 1
    assert (tmp_path / "d" / "store" / "mine.txt").exists()


@pytest.mark.parametrize("args", [("info",), ("ls",)])
def test_successful_json_commands_leave_stderr_empty(tmp_path: Path, args: tuple[str, ...]) -> None:
    open_store(str(tmp_path / "s")).put_bytes("a.bin", b"x")
    code, out, err = run(*args, str(tmp_path / "s"), "--json", cwd=tmp_path)
    assert code == 0 and err == "", err
    json.loads(out)


def _damaged_store(tmp_path: Path) -> Path:
    """A store holding ``a.bin`` (whole) and ``b.bin`` (truncated behind its record)."""
    root = tmp_path / "s"
    store = open_store(str(root))
    store.put_bytes("a.bin", b"hello world")
    store.put_bytes("b.bin", b"bytes that a disk will lose")
    with open(root / "b.bin", "r+b") as f:
        f.truncate(3)
    return root


def test_rm_of_a_missing_name_says_its_error_on_stderr(tmp_path: Path) -> None:
    root = _damaged_store(tmp_path)
    code, out, err = run("rm", str(root), "nope.bin", cwd=tmp_path)
    assert code == 1 and out == "", (out, err)
    assert err.count("\n") == 1 and err.startswith("commitstore: error: ") and "nope.bin" in err
    code, error, _ = both("rm", str(root), "nope.bin", cwd=tmp_path)
    assert code == 1 and error["type"] == "NotFoundError" and "nope.bin" in error["message"]
    # several names: the ones removed on stdout, one error line for the rest
    code, out, err = run("rm", str(root), "nope.bin", "a.bin", "gone.bin", cwd=tmp_path)
    assert code == 1 and "a.bin" in out and "nope.bin" not in out, (out, err)
    assert err.count("\n") == 1 and "nope.bin" in err and "gone.bin" in err
    jcode, jout, jerr = run("rm", str(root), "nope.bin", "--json", cwd=tmp_path)
    assert jcode == 1 and json.loads(jout)["failed"].keys() == {"nope.bin"}
    assert the_error(jerr)["type"] == "NotFoundError"


@pytest.mark.parametrize(
    "args",
    [("verify",), ("verify", "b.bin"), ("latest",), ("sync", "MIRROR"), ("scrub",)],
    ids=["verify", "verify-name", "latest", "sync", "scrub"],
)
def test_every_failing_command_says_one_error_on_stderr(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    root = _damaged_store(tmp_path)
    if args[0] == "latest":
        open_store(str(root)).delete("a.bin")  # no whole artifact left
    command = [args[0], str(root), *(str(tmp_path / "m") for a in args[1:] if a == "MIRROR")]
    command += [a for a in args[1:] if a != "MIRROR"]
    code, error, text = both(*command, cwd=tmp_path)
    assert code == 1, (error, text)
    errors = [line for line in text.splitlines() if line.startswith("commitstore: error: ")]
    assert len(errors) == 1 and "Traceback" not in text, text
    if args[0] != "latest":
        assert "b.bin" in error["message"] and error["type"] == "IntegrityError", error
    if args[0] == "verify":
        assert error["status"] == "size_mismatch"
