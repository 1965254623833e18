"""GCS strategy against fake-gcs-server on 127.0.0.1; the backdoor is raw HTTP on the JSON API."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from commitstore import open_store
from commitstore.testing import GcsBackdoor, StoreConformance, Target, xxh

from .helpers.faultproxy import (
    FaultProxy,
    check_persistent_fault,
    check_transient_fault,
    through_proxy,
)
from .helpers.gcsserver import BUCKET as GCS_BUCKET
from .helpers.gcsserver import FakeGcs
from .helpers.recordcache import check_record_cache

MiB = 1024 * 1024


def make_target(server: FakeGcs, **options: object) -> Target:
    prefix = f"t{time.monotonic_ns()}"
    opts = {**server.options(), "chunk_size": 1 * MiB, **options}
    url = server.url(prefix)
    return Target(
        open_store(url, **opts),
        GcsBackdoor(server.endpoint, GCS_BUCKET, prefix),
        lambda: open_store(url, **opts),
    )


class TestGcsConformance(StoreConformance):
    @pytest.fixture
    def target(self, gcs: FakeGcs) -> Target:
        return make_target(gcs)


def test_resumable_upload_final_request_commits(gcs: FakeGcs) -> None:
    t = make_target(gcs)
    data = os.urandom(5 * MiB + 123)
    st = t.store.stage("big/step_0003.pt")
    for i in range(0, len(data), MiB // 2):
        st.write(data[i : i + MiB // 2])
        assert t.door.read("big/step_0003.pt") is None
    rec = st.commit()
    assert t.door.read("big/step_0003.pt") == data
    assert rec.digest == xxh(data)
    assert t.store.describe()["strategy"] == "gcs-resumable"


def test_conditional_writes_are_probed(gcs: FakeGcs) -> None:
    t = make_target(gcs)
    t.store.put_bytes("step_1", b"x")
    # fake-gcs-server 1.54 ignores ifGenerationMatch for resumable uploads: the probe must say so.
    assert t.store.describe()["conditional_writes"] is False


def test_sigkill_mid_upload_publishes_nothing(gcs: FakeGcs) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    t = make_target(gcs)
    t.store.put_bytes("step_0001.pt", b"whole")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs.endpoint}
    # The same child, not killed, commits: so the kill below interrupts a working upload.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.helpers.writer",
            t.store.url,
            "step_0000.pt",
            "0",
            str(4 * MiB),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert t.reopen().verify("step_0000.pt").ok
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.writer",
            t.store.url,
            "step_0002.pt",
            "1",
            str(64 * MiB),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    for line in proc.stdout:  # mid-upload: past the first 16 MiB chunk, short of the end
        if int(line.split()[1]) >= 24 * MiB:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert t.door.read("step_0002.pt") is None
    assert [f for f in t.door.files() if "step_0002" in f] == []
    latest = t.reopen().latest()
    assert latest is not None
    assert latest.name == "step_0001.pt"


def test_record_cache_replaces_one_get_per_record(gcs: FakeGcs) -> None:
    check_record_cache(make_target(gcs))


@contextlib.contextmanager
def _proxied(gcs: FakeGcs, **extra: Any) -> Iterator[tuple[Target, FaultProxy]]:
    """A store whose every request goes through our TCP fault proxy (chunks of 4 MiB), with
    ``extra`` store options."""
    prefix = f"p{time.monotonic_ns()}"

    def target(proxy: FaultProxy) -> Target:
        # fake-gcs-server ignores ifGenerationMatch on resumable uploads: declared, not probed,
        # so that the store's first connection is opened by the faulted test itself.
        opts = {
            **gcs.options(),
            "endpoint_url": proxy.endpoint,
            "chunk_size": 4 * MiB,
            "conditional_writes": False,
            **extra,
        }
        url = gcs.url(prefix)
        return Target(
            open_store(url, **opts),
            GcsBackdoor(gcs.endpoint, GCS_BUCKET, prefix),
            lambda: open_store(url, **opts),
        )

    with through_proxy(gcs.port, target) as pair:
        yield pair


@pytest.fixture
def proxied(gcs: FakeGcs) -> Iterator[tuple[Target, FaultProxy]]:
    """A store whose every request goes through our TCP fault proxy (chunks of 4 MiB)."""
    with _proxied(gcs) as pair:
        yield pair


@pytest.mark.parametrize("fault", ["cut_after", "reset_after"])
def test_transient_network_faults_are_retried(
    proxied: tuple[Target, FaultProxy], fault: str
) -> None:
    """A chunk cut off mid-request is sent again, from the buffer (the same bytes)."""
    check_transient_fault(*proxied, fault, size=13 * MiB, at=2 * MiB)


def test_persistent_network_fault_is_unavailable_and_publishes_nothing(gcs: FakeGcs) -> None:
    """Every try of the chunk fails: BackendUnavailableError once the store's ``retries`` are
    spent (two tries here: one retry, not the default's five tries with 1, 2, 4, 8 s of backoff
    between them), and nothing is published."""
    with _proxied(gcs, retries=2) as pair:
        check_persistent_fault(*pair, size=9 * MiB, at=1 * MiB)


_WITHOUT_OTHER_SDKS = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # an import of it raises ModuleNotFoundError
from commitstore.backends.object.{module}.backend import translate
from commitstore.errors import BackendUnavailableError, CommitError

class Http503(Exception):
    code = status_code = 503  # gcsfs's HttpError has a code, azure-core's errors a status_code

for exc in (ConnectionError("no"), TimeoutError(), OSError("503 Service Unavailable"), Http503()):
    err = translate(exc, "uploading", "x://b/k")
    assert isinstance(err, BackendUnavailableError) and err.retryable, (exc, err)
err = translate(ValueError("no"), "uploading", "x://b/k")
assert isinstance(err, CommitError) and not err.retryable, err
print("ok")
"""


@pytest.mark.parametrize(
    ("module", "blocked"),
    [
        ("gcs", ("botocore", "aiobotocore", "s3fs", "boto3", "azure", "adlfs")),
        ("azure", ("botocore", "aiobotocore", "s3fs", "boto3", "gcsfs", "google_crc32c")),
    ],
)
def test_one_store_installed_alone_imports_and_translates(
    module: str, blocked: tuple[str, ...]
) -> None:
    """``pip install commitstore[gcs]`` (or ``[azure]``) alone: no other store's SDK is imported,
    and transport failures and 5xx answers still translate to a retryable error."""
    import subprocess
    import sys
    from pathlib import Path

    code = _WITHOUT_OTHER_SDKS.format(blocked=blocked, module=module)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


SECRET_TOKEN = "ya29.a0-SECRET/token+value_never_shown"
SECRET_FIELD = "1//0g-refresh-SECRET-never-shown"


def _everything_shown(exc: BaseException) -> str:
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    cur: BaseException | None = exc
    while cur is not None:
        text += f"{cur!s}{cur!r}{cur.args!r}"
        cur = cur.__cause__ or cur.__context__
    return text


@pytest.mark.parametrize(
    "token",
    [
        SECRET_TOKEN,
        {"type": "authorized_user", "client_id": "x", "refresh_token": SECRET_FIELD},
    ],
    ids=["access-token", "authorized-user-dict"],
)
def test_gcs_token_never_shown_in_errors_or_cli(gcs: FakeGcs, token: object) -> None:
    """google-auth checks a token at .../tokeninfo?access_token=<token> and requests quotes that
    URL when it fails: the typed error, its whole chain and the CLI's output never show it."""
    import subprocess
    import sys

    from commitstore import BackendUnavailableError, ConfigurationError

    with pytest.raises((BackendUnavailableError, ConfigurationError)) as info:
        open_store(gcs.url("tok"), endpoint_url=gcs.endpoint, token=token, project="test")
    shown = _everything_shown(info.value)
    for secret in (SECRET_TOKEN, SECRET_FIELD, "SECRET"):
        assert secret not in shown, shown
    assert "token" in str(info.value)  # it still says what was wrong
    if not isinstance(token, str):
        return
    done = subprocess.run(
        [
            *(sys.executable, "-m", "commitstore", "ls", gcs.url("tok")),
            *("-o", f"endpoint_url={gcs.endpoint}", "-o", f"token={token}", "-o", "project=test"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
        timeout=120,
    )
    assert done.returncode in (1, 2), done
    assert "SECRET" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "commitstore: error:" in done.stderr


def _probe_final(method: str, _path: str, headers: dict[str, str]) -> bool:
    """The probe's last request: one byte, the total size 1, into a create-only session."""
    return method in ("POST", "PUT") and headers.get("Content-Range") == "bytes 0-0/1"


@pytest.mark.parametrize(("answer", "honoured"), [(403, False), (400, False), (412, True)])
def test_create_only_probe_believes_only_precondition_failed(
    gcs: FakeGcs, answer: int, honoured: bool
) -> None:
    """The server's answer to the probe's final request is made ``answer``: only 412 Precondition
    Failed says create-only is honoured; any other refusal is not evidence of it."""
    from .helpers.httpinject import AnswerInjector

    proxy = AnswerInjector(gcs.port, lambda m, p, h: answer if _probe_final(m, p, h) else None)
    try:
        opts = {**gcs.options(), "endpoint_url": proxy.endpoint}
        store = open_store(gcs.url(f"probe{answer}"), **opts)
        assert store.describe()["conditional_writes"] is honoured
        assert [status for _m, _p, status in proxy.injected] == [answer]
        assert store._backend.capabilities.exclusive_create is honoured
    finally:
        proxy.stop()


_GCSFS_FIRST = """
import os, sys
os.environ.pop("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", None)
import gcsfs  # imported first by the user's code, at gcsfs's own defaults
from commitstore import open_store
store = open_store({url!r}, endpoint_url={endpoint!r}, token="anon", project="test")
store.put_bytes("a.pt", b"whole")
print(store.read_bytes("a.pt").decode())
"""


def test_a_store_works_when_gcsfs_was_imported_first_at_its_defaults(gcs: FakeGcs) -> None:
    """A process that imported gcsfs before opening a ``gs://`` store (with gcsfs 2026.x's
    experimental class as ``gcsfs.GCSFileSystem``) gets the same working store: the client
    builds on gcsfs's own class, whichever one ``gcsfs.GCSFileSystem`` names."""
    import subprocess
    import sys
    from pathlib import Path

    code = _GCSFS_FIRST.format(url=gcs.url(f"t{time.monotonic_ns()}"), endpoint=gcs.endpoint)
    env = {k: v for k, v in os.environ.items() if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "whole"
