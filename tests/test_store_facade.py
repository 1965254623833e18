"""The store facade's public surface that integrations and the CLI use instead of its insides:
``exists()``, ``local_path()``, ``warn_missing``, ``sync(progress=)``, ``scrub(progress=)`` and
pickling a store into another process. Storage is read through the file system (a backdoor),
not through the calls under test."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import warnings
from pathlib import Path

import pytest

from commitstore import CommitStore, ConfigurationError, InvalidNameError, open_store
from commitstore.testing import record_path


def test_exists_says_whether_the_root_is_there_and_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    assert store.exists() is False
    assert not root.exists()
    store.put_bytes("a.bin", b"x")
    assert store.exists() is True


def test_local_path_names_the_root_and_a_name_without_io(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    assert store.local_path() == root
    assert store.local_path("d/a.bin") == root / "d" / "a.bin"
    assert not root.exists()  # nothing was created
    with pytest.raises(InvalidNameError):
        store.local_path("../escape")


def test_local_path_is_none_where_the_store_is_not_a_local_folder() -> None:
    store = open_store("memory://facade-local-path")
    assert store.local_path() is None
    assert store.local_path("a.bin") is None


def test_warn_missing_false_silences_the_missing_root_warning(tmp_path: Path) -> None:
    store = open_store(tmp_path / "typo")
    with pytest.warns(UserWarning, match="no store at"):
        assert store.list() == []
    store.warn_missing = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.list() == []


def test_sync_reports_progress_in_bytes_copied(tmp_path: Path) -> None:
    primary = open_store(tmp_path / "p")
    for i, size in enumerate((10, 2000, 300)):
        primary.put_bytes(f"a{i}.bin", os.urandom(size))
    mirror = tmp_path / "m"
    store = open_store(tmp_path / "p", mirrors=[str(mirror)], mirror_mode="sync")
    seen: list[int] = []
    report = store.sync(progress=seen.append)
    assert report.ok
    assert seen == sorted(seen) and len(seen) == 3
    assert seen[-1] == 2310
    for i in range(3):  # the copies are there, with their records (read from the disk)
        assert (mirror / f"a{i}.bin").exists()
        assert (mirror / record_path(f"a{i}.bin")).exists()


def test_scrub_reports_progress(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p")
    store.put_bytes("a.bin", os.urandom(5000))
    calls: list[tuple[int, int]] = []
    report = store.scrub(progress=lambda done, total: calls.append((done, total)))
    assert report.ok
    assert calls and calls[-1][1] >= 5000


@pytest.mark.parametrize("bad", [1, "x", object()])
def test_a_progress_that_is_not_callable_is_refused_before_any_io(
    tmp_path: Path, bad: object
) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    with pytest.raises(ConfigurationError, match="progress"):
        store.sync(progress=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="progress"):
        store.scrub(progress=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "p").exists() and not (tmp_path / "m").exists()


def _commit_in_child(store: CommitStore, data: bytes) -> None:
    store.put_bytes("from-child.bin", data)


def test_a_pickled_store_commits_in_another_process(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p")
    data = os.urandom(4096)
    proc = multiprocessing.get_context("spawn").Process(target=_commit_in_child, args=(store, data))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert (tmp_path / "p" / "from-child.bin").read_bytes() == data
    assert (tmp_path / "p" / record_path("from-child.bin")).exists()
    again = pickle.loads(pickle.dumps(store))
    assert again.url == store.url and again.local_path() == store.local_path()


def test_a_store_with_mirrors_is_not_pickled(tmp_path: Path) -> None:
    store = open_store(tmp_path / "p", mirrors=[str(tmp_path / "m")])
    with pytest.raises(ConfigurationError, match="mirrors"):
        pickle.dumps(store)
    store.close()
