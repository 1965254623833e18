"""The folders a local store keeps open while its publish lock is held (``_heldfolders``): a
commit walks to each metadata folder once under the lock, and a folder removed under the lock
is never used again through a descriptor kept from before (it is walked to afresh). What is on
disk is read through the backdoor (plain paths), not through the backend."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commitstore import open_store
from commitstore.backends.rename.posix import LocalBackend
from commitstore.layout import META_DIR

SUB = (META_DIR, "records", "sub")


def _same_folder(fd: int, path: Path) -> bool:
    held, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def test_a_folder_removed_under_the_lock_is_walked_to_afresh(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    with backend.publish_lock():
        backend.make_folders(SUB)  # kept open from here
        assert backend.remove_empty_folder(SUB)
        backend.make_folders(SUB)  # a new folder under the same name
        fd = backend.open_dir(SUB, create=False)
        try:
            assert _same_folder(fd, tmp_path.joinpath("store", *SUB))
        finally:
            os.close(fd)
        (tmp_path / "store" / META_DIR / "records" / "sub").rmdir()
        backend.make_folders((META_DIR, "records", "other"))


def test_a_folder_tree_removed_under_the_lock_is_walked_to_afresh(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    with backend.publish_lock():
        backend.make_folders((*SUB, "deeper"))
        assert backend.remove(SUB)
        backend.make_folders(SUB)
        fd = backend.open_dir(SUB, create=False)
        try:
            assert _same_folder(fd, tmp_path.joinpath("store", *SUB))
        finally:
            os.close(fd)


def test_another_thread_walks_from_the_root(tmp_path: Path) -> None:
    """A folder replaced behind the lock holder's back is found afresh by another thread (it
    never uses the holder's descriptors)."""
    root = tmp_path / "store"
    backend = LocalBackend(root)
    seen: list[bool] = []
    with backend.publish_lock():
        backend.make_folders(SUB)
        os.rename(root.joinpath(*SUB), root / META_DIR / "moved")  # another tool's move
        os.mkdir(root.joinpath(*SUB))

        def other() -> None:
            fd = backend.open_dir(SUB, create=False)
            try:
                seen.append(_same_folder(fd, root.joinpath(*SUB)))
            finally:
                os.close(fd)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == [True]


def _walks(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Callable[[], None]]:
    """Every folder opened by name (``os.open`` with ``O_DIRECTORY``) once ``start()`` ran."""
    seen: list[str] = []
    on = {"on": False}
    real = os.open

    def counting(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if on["on"] and flags & os.O_DIRECTORY:
            seen.append(os.fspath(path))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", counting)
    return seen, lambda: on.update(on=True)


def test_a_small_commit_walks_to_each_folder_once_under_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the lock: the root, the metadata folder (the lock's walk), the records folder
    (the hierarchy check), and the name's own records sub-folder (absent: one failed open);
    the earlier pending record, the pending record and the record reuse them."""
    root = tmp_path / "store"
    store = open_store(root)
    store.put_bytes("warm", b"w")
    seen, start = _walks(monkeypatch)
    locked: list[list[str]] = []
    real_lock = LocalBackend.publish_lock

    def publish_lock(self: LocalBackend) -> Any:
        class Counted:
            def __enter__(self_inner) -> None:
                start()
                self_inner.cm = real_lock(self)
                self_inner.cm.__enter__()

            def __exit__(self_inner, *exc: Any) -> None:
                self_inner.cm.__exit__(*exc)
                locked.append(list(seen))

        return Counted()

    monkeypatch.setattr(LocalBackend, "publish_lock", publish_lock)
    store.put_bytes("small", b"s" * 1024)
    (walked,) = locked
    assert walked == [str(root), META_DIR, "records", "small"], walked


def test_the_checks_before_the_lock_walk_to_each_folder_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the lock (``LocalBackend.folders_kept``): the hierarchy check walks to the root,
    the metadata folder, the records folder and the name's records sub-folder (absent: one
    failed open); the record's absence, the data's absence and the staging file reuse them.
    The lock then walks afresh from the root."""
    root = tmp_path / "store"
    store = open_store(root)
    store.put_bytes("warm", b"w")
    seen, start = _walks(monkeypatch)
    before: list[list[str]] = []
    real_lock = LocalBackend.publish_lock

    def publish_lock(self: LocalBackend) -> Any:
        before.append(list(seen))
        return real_lock(self)

    monkeypatch.setattr(LocalBackend, "publish_lock", publish_lock)
    start()
    store.put_bytes("small", b"s" * 1024)
    assert before[0] == [str(root), META_DIR, "records", "small"], before
    assert seen[len(before[0]) :] == [str(root), META_DIR, "records", "small"], seen


def test_a_hold_before_the_lock_ends_with_its_block(tmp_path: Path) -> None:
    """Kept folders of ``folders_kept`` are closed when its block ends, and a walk after it
    finds a folder replaced meanwhile afresh; a hold is never taken over by another thread."""
    root = tmp_path / "store"
    backend = LocalBackend(root)
    backend.make_folders(SUB)
    seen: list[bool] = []
    with backend.folders_kept():
        os.close(backend.open_dir(SUB, create=False))  # kept from here

        def other() -> None:
            fd = backend.open_dir(SUB, create=False)
            try:
                seen.append(_same_folder(fd, root.joinpath(*SUB)))
            finally:
                os.close(fd)

        os.rename(root.joinpath(*SUB), root / META_DIR / "moved")  # another tool's move
        os.mkdir(root.joinpath(*SUB))
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    fd = backend.open_dir(SUB, create=False)
    try:
        assert _same_folder(fd, root.joinpath(*SUB))
    finally:
        os.close(fd)
    assert seen == [True]
    assert backend._held is None


def test_a_child_forked_during_a_hold_walks_afresh(tmp_path: Path) -> None:
    """A child forked while its parent keeps folders never uses them: a folder replaced after
    the parent kept it is found afresh in the child."""
    root = tmp_path / "store"
    backend = LocalBackend(root)
    backend.make_folders(SUB)
    with backend.folders_kept():
        os.close(backend.open_dir(SUB, create=False))  # kept from here
        os.rename(root.joinpath(*SUB), root / META_DIR / "moved")  # another tool's move
        os.mkdir(root.joinpath(*SUB))
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            ok = False
            try:
                fd = backend.open_dir(SUB, create=False)
                ok = _same_folder(fd, root.joinpath(*SUB))
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
