"""Backend contract, reading and removing: the semantics of ``stat``, ``walk``, ``open_read``,
``read_small``, ``remove``, ``remove_files``, ``remove_empty_folder`` and ``root_exists`` that
the core relies on (checks, scans, gc, prune). Files are put and observed through the backdoor,
so each method is checked against the storage, not against another method of the backend."""

from __future__ import annotations

import pytest

from commitstore.backends.base import PutMode
from commitstore.errors import NotFoundError
from commitstore.testing.subject import BackendSubject, files_under, put, visible


class TreeContract:
    """Mixed into :class:`BackendContract`; uses its ``subject`` fixture."""

    def test_opening_creates_nothing(self, subject: BackendSubject) -> None:
        """Asking a fresh backend (``stat``, ``walk``, ``free_space``, ``root_exists``,
        ``open_read`` of a missing name) stores nothing; after a first publish ``root_exists``
        is True (a store exists once it holds something)."""
        b = subject.backend
        assert b.stat(("a",)) is None and b.walk(()) == [] and b.walk(("a",)) == []
        b.free_space(())
        b.root_exists()
        with pytest.raises(NotFoundError):
            b.open_read(("a",))
        assert visible(subject.door) == []
        put(b, "a", b"first", PutMode.CREATE)
        assert b.root_exists()

    def test_stat_reports_what_is_stored(self, subject: BackendSubject) -> None:
        """``stat`` (fresh, never cached) gives a file's size as a regular non-folder, a folder
        as ``is_dir``, and None for a missing name, a missing parent, or a name below a file;
        a file changed or removed behind the backend's back is seen at once."""
        subject.door.write("s/f.bin", b"12345")
        b = subject.backend
        f = b.stat(("s", "f.bin"))
        assert f is not None and (f.size, f.is_dir, f.regular) == (5, False, True)
        d = b.stat(("s",))
        assert d is not None and d.is_dir
        assert b.stat(("s", "nope")) is None and b.stat(("nope", "f.bin")) is None
        assert b.stat(("s", "f.bin", "below")) is None
        subject.door.write("s/f.bin", b"123")
        f = b.stat(("s", "f.bin"))
        assert f is not None and f.size == 3
        subject.door.remove("s/f.bin")
        assert b.stat(("s", "f.bin")) is None

    def test_walk_lists_every_file_below(self, subject: BackendSubject) -> None:
        """``walk`` gives every file below a folder, recursively, hidden ones and staging-like
        names included, as parts relative to the folder, with sizes; nothing for a missing
        folder; ``walk(())`` covers the whole root."""
        stored = {"w/a": b"a", "w/.hidden": b"hh", "w/x/y/z.bin": b"zzz", "other/o": b"o"}
        for rel, data in stored.items():
            subject.door.write(rel, data)
        b = subject.backend
        got = {"/".join(rel): info.size for rel, info in b.walk(("w",))}
        assert got == {"a": 1, ".hidden": 2, "x/y/z.bin": 3}
        assert all(not info.is_dir for _rel, info in b.walk(("w",)))
        assert b.walk(("missing",)) == []
        assert {"/".join(rel) for rel, _ in b.walk(())} == set(visible(subject.door))

    def test_open_read_reads_and_seeks(self, subject: BackendSubject) -> None:
        """``open_read`` gives the stored bytes through a seekable reader; a missing name raises
        NotFoundError (a FileNotFoundError); ``read_small`` gives a small file whole."""
        data = bytes(range(256)) * 40
        subject.door.write("o/f.bin", data)
        with subject.backend.open_read(("o", "f.bin")) as f:
            assert f.read() == data
            f.seek(1000)
            assert f.read(10) == data[1000:1010]
        with pytest.raises(FileNotFoundError):
            subject.backend.open_read(("o", "missing"))
        assert subject.backend.read_small(("o", "f.bin")) == data
        with pytest.raises(NotFoundError):
            subject.backend.read_small(("o", "missing"))

    def test_remove_file_and_tree(self, subject: BackendSubject) -> None:
        """``remove`` of a file or a whole folder tree removes it and says True; of a missing
        name says False and removes nothing else."""
        for rel in ("rm/f.bin", "rm/tree/a", "rm/tree/sub/b", "rm/keep"):
            subject.door.write(rel, rel.encode())
        b = subject.backend
        assert b.remove(("rm", "f.bin")) is True
        assert subject.door.read("rm/f.bin") is None
        assert b.remove(("rm", "tree")) is True
        assert files_under(subject.door, "rm") == {"keep": b"rm/keep"}
        assert b.remove(("rm", "nope")) is False
        assert b.remove(("rm", "f.bin")) is False
        assert files_under(subject.door, "rm") == {"keep": b"rm/keep"}

    def test_remove_files_removes_exactly_those(self, subject: BackendSubject) -> None:
        """``remove_files`` removes exactly the named files of a folder and never another (a
        file the list does not name stays, with its folder); once the last is gone the folder
        is gone too. False when none of them was there."""
        for rel in ("rf/a", "rf/sub/b", "rf/sub/c", "rf/d"):
            subject.door.write(rel, b"x")
        b = subject.backend
        assert b.remove_files(("rf",), [("a",), ("sub", "b"), ("not", "there")]) is True
        assert set(files_under(subject.door, "rf")) == {"sub/c", "d"}
        assert b.remove_files(("rf",), [("a",)]) is False
        assert b.remove_files(("rf",), [("sub", "c"), ("d",)]) is True
        assert files_under(subject.door, "rf") == {}
        assert b.stat(("rf",)) is None
        assert not subject.door.is_dir("rf")

    def test_remove_empty_folder_spares_a_full_one(self, subject: BackendSubject) -> None:
        """``remove_empty_folder`` of a folder holding a file removes nothing and says False;
        never the root."""
        subject.door.write("ef/f", b"x")
        assert subject.backend.remove_empty_folder(("ef",)) is False
        assert subject.door.read("ef/f") == b"x"
        assert subject.backend.remove_empty_folder(()) is False
        assert subject.door.read("ef/f") == b"x"
