"""The command line: exit codes, --json, one-line errors, progress bar, and the demo."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from commitstore._progress import ProgressBar
from commitstore.cli import main


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_put_ls_verify_latest_get(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "step_0007.pt"
    src.write_bytes(b"weights" * 1000)
    url = str(tmp_path / "store")
    code, out, _ = cli(capsys, "put", str(src), url, "--json")
    assert code == 0
    assert json.loads(out)["step"] == 7
    code, out, _ = cli(capsys, "ls", url, "--json")
    assert [r["name"] for r in json.loads(out)] == ["step_0007.pt"]
    code, out, _ = cli(capsys, "ls", url)
    assert "step_0007.pt" in out
    assert cli(capsys, "verify", url)[0] == 0
    code, out, _ = cli(capsys, "latest", url, "--json")
    assert code == 0
    assert json.loads(out)["name"] == "step_0007.pt"
    code, _, _ = cli(capsys, "get", url, "step_0007.pt", str(tmp_path / "copy.pt"))
    assert code == 0
    assert (tmp_path / "copy.pt").read_bytes() == src.read_bytes()


def test_integrity_problems_exit_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "store")
    src = tmp_path / "step_1.bin"
    src.write_bytes(b"a" * 100)
    assert cli(capsys, "put", str(src), url)[0] == 0
    (tmp_path / "store" / "step_1.bin").write_bytes(b"a" * 99)
    code, out, _ = cli(capsys, "verify", url, "--json")
    assert code == 1
    assert json.loads(out)["results"][0]["status"] == "size_mismatch"
    code, _, err = cli(capsys, "latest", url)
    assert code == 1
    assert "skipping step_1.bin" in err
    code, _, err = cli(capsys, "get", url, "step_1.bin", str(tmp_path / "out.bin"))
    assert code == 1
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "out.bin").exists()


def test_latest_exits_0_when_it_skipped_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "store")
    for step in (1, 2):
        f = tmp_path / f"step_{step}"
        f.write_bytes(bytes([step]) * 10)
        assert cli(capsys, "put", str(f), url)[0] == 0
    (tmp_path / "store" / "step_2").write_bytes(b"\x00" * 10)
    code, out, err = cli(capsys, "latest", url)
    assert code == 0
    assert out.startswith("step_1")
    assert "step_2" in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    code, _, err = cli(capsys, "put", str(src), str(tmp_path / "s"), "--name", "../escape")
    assert code == 2
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as info:
        main(["verify"])
    assert info.value.code == 2
    assert cli(capsys, "ls", "nosuch://x")[0] == 2


def test_already_exists_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "f_1"
    src.write_bytes(b"x")
    url = str(tmp_path / "s")
    assert cli(capsys, "put", str(src), url)[0] == 0
    code, _, err = cli(capsys, "put", str(src), url)
    assert code == 1
    assert "already committed" in err
    assert cli(capsys, "put", str(src), url, "--overwrite")[0] == 0


def test_put_folder_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "checkpoint-5"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "w.bin").write_bytes(b"w")
    url = str(tmp_path / "s")
    code, out, _ = cli(capsys, "put", str(folder), url, "--json")
    assert code == 0
    assert json.loads(out)["files"][0]["path"] == "sub/w.bin"
    code, out, _ = cli(capsys, "info", url, "--json")
    assert json.loads(out)["strategy"] == "local-rename"
    code, out, _ = cli(capsys, "info", url, "--json", "-o", "strategy=bridge", "-o", "readback=no")
    assert code == 0
    doc = json.loads(out)
    assert doc["strategy"] == "bridge-checked"
    assert doc["checks"]["readback"] is False
    assert cli(capsys, "info", url, "-o", "nosuchoption=1")[0] == 2
    assert cli(capsys, "info", url, "-o", "novalue")[0] == 2


def test_progress_bar_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    total = 64 * 1024 * 1024
    for stream in (tty, pipe):
        bar = ProgressBar("put x", total, stream)
        bar(total // 2)
        bar(total)
    assert "100.0%" in tty.getvalue()
    assert "#" in tty.getvalue()
    assert pipe.getvalue() == ""
    small = Tty()
    ProgressBar("put y", 10, small)(10)
    assert small.getvalue() == ""


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "commitstore", "demo", str(tmp_path / "demo"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert all(doc["checks"].values())
    assert len(doc["checks"]) >= 7
    # A second run reuses the folder.
    again = subprocess.run(
        [sys.executable, "-m", "commitstore", "demo", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0
    assert "all guarantees held" in again.stdout
