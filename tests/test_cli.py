"""The command line: exit codes, --json, one-line errors, progress bar, and the demo."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from commitstore._cli_progress import ProgressBar
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


def _drain(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side of a pseudo-terminal closed
            break
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def _run_cli(
    *args: str, cwd: Path, stderr_tty: bool = False, interpreter: bool = False
) -> tuple[int, str, str]:
    """The CLI in a child process: its exit status, stdout and stderr. The child is forked from
    this warm process and runs the CLI's entry point (``commitstore.cli.main``, what
    ``python -m commitstore`` runs) on real file descriptors, with no interpreter start;
    ``interpreter`` starts ``python -m commitstore`` instead. With ``stderr_tty`` stderr is a
    pseudo-terminal, and what the CLI draws there is returned as stderr."""
    import threading

    out_r, out_w = os.pipe()
    err_r, err_w = os.openpty() if stderr_tty else os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    pid = 0
    if interpreter:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "commitstore", *args], cwd=cwd, env=env, stdout=out_w,
            stderr=err_w,
        )  # fmt: skip
    else:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 99
            try:
                os.chdir(cwd)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                try:
                    code = main(list(args))
                except SystemExit as exc:  # argparse's usage errors
                    code = exc.code if isinstance(exc.code, int) else 2
                except BaseException:  # what the real CLI would show: a traceback
                    traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(out_w)
    os.close(err_w)
    outs: list[bytes] = []
    reader = threading.Thread(target=lambda: outs.append(_drain(out_r)))
    reader.start()
    err = _drain(err_r)
    reader.join()
    if proc is not None:
        code = proc.wait(timeout=120)
    else:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code, outs[0].decode(errors="replace"), err.decode(errors="replace")


def test_progress_bar_drawn_by_the_cli_on_a_terminal_only(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"p" * (33 * 1024 * 1024))  # above the bar's 32 MiB threshold
    code, out, drawn = _run_cli(
        "put", str(big), str(tmp_path / "s"), cwd=tmp_path, stderr_tty=True, interpreter=True
    )
    assert code == 0 and "committed big.bin" in out, (out, drawn)
    assert "put big.bin [" in drawn and "100.0%" in drawn and "33.0 MiB/33.0 MiB" in drawn
    assert "#" * 30 in drawn
    code, out, err = _run_cli(
        "put", str(big), str(tmp_path / "s"), "--name", "again.bin", cwd=tmp_path
    )
    assert code == 0 and "committed again.bin" in out
    assert err == ""  # a pipe gets no bar
    code, _out, drawn = _run_cli(
        "get",
        str(tmp_path / "s"),
        "big.bin",
        str(tmp_path / "out.bin"),
        cwd=tmp_path,
        stderr_tty=True,
    )
    assert code == 0 and "get big.bin [" in drawn and "100.0%" in drawn
    assert (tmp_path / "out.bin").read_bytes() == big.read_bytes()


def test_progress_bar_skips_small_copies() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    small = Tty()
    ProgressBar("put y", 10, small)(10)
    assert small.getvalue() == ""


def test_cli_never_creates_a_mistyped_store(tmp_path: Path) -> None:
    for args in (
        ["ls", "./typo"],
        ["verify", "./typo"],
        ["latest", "./typo"],
        ["gc", "./typo"],
        ["prune", "file://" + str(tmp_path / "typo"), "--keep-last", "1"],
    ):
        code, out, err = _run_cli(*args, cwd=tmp_path)
        assert code == 2, (args, out, err)
        assert "no store at" in err and "does not exist" in err and "Traceback" not in err
        assert not (tmp_path / "typo").exists(), args


def test_cli_reports_bad_records_without_traceback(tmp_path: Path) -> None:
    from commitstore import open_store
    from commitstore.testing import record_path

    root = tmp_path / "s"
    store = open_store(root)
    for name in ("good", "garbage", "schema", "other", "fifo", "deep/link"):
        store.put_bytes(name, name.encode())
    (root / record_path("garbage")).write_bytes(b"\xff{not json")
    (root / record_path("schema")).write_text('{"schema": "commitstore.record/99"}')
    (root / record_path("other")).write_bytes((root / record_path("good")).read_bytes())
    (root / record_path("fifo")).unlink()
    os.mkfifo(root / record_path("fifo"))
    (root / record_path("deep/link")).unlink()
    (root / record_path("deep/link")).symlink_to("/etc/passwd")
    bad = {"garbage", "schema", "other", "fifo", "deep/link"}
    code, out, err = _run_cli("ls", str(root), cwd=tmp_path)
    assert code == 0 and "Traceback" not in err, err
    rows = [line.split() for line in out.splitlines()[1:]]
    assert {r[4] for r in rows if r[3] == "bad_record"} == bad, out
    assert [r[4] for r in rows if r[3] != "bad_record"] == ["good"]
    code, out, err = _run_cli("verify", str(root), cwd=tmp_path)
    assert code == 1 and "Traceback" not in err, err
    found = {line.split()[1] for line in out.splitlines() if line.startswith("bad_record")}
    assert found == bad and "PROBLEMS FOUND" in out
    code, out, err = _run_cli("verify", str(root), "garbage", "--json", cwd=tmp_path)
    assert code == 1 and json.loads(out)["results"][0]["status"] == "bad_record"
    for name in ("garbage", "fifo"):
        code, out, err = _run_cli("get", str(root), name, str(tmp_path / "x"), cwd=tmp_path)
        assert code == 1 and "Traceback" not in err and "bad record" in err, err
    assert _run_cli("latest", str(root), cwd=tmp_path)[0] == 0


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
