"""A symbolic link in ``src``'s path, or a folder inside ``src``, pointed at the store by another
user between the checks of a folder handed to the store and what is then done with it.

``move_in``, ``adopt`` and ``hf.commit_folder`` judge ``src`` (where it lies, what it holds)
and then rename it, or copy its files and remove them. Another user who controls a link in
``src``'s path (a shared folder) can point it into the store after the checks: each attack
below does so at the worst moment (wrapping the step after which it acts) and then reads every
committed artifact through the raw files. Was a bug in every case: the rename, the copy or the
removal went through the path again, and took or deleted the committed folder ``ckpt/step_1``
(an ``abort`` then deleted it; the copy fallback unlinked its files). Now the folder checked is
the folder taken (``localsource.pin``: its parent opened once, the rename through it, its
identity checked again), and the copy fallback removes files through folders opened without
following a link.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from commitstore import CommitStore, hf
from commitstore.errors import NameConflictError
from tests.test_adopt_hostile import _broken, _store, _tmpfs


def _point(link: Path, target: Path) -> None:
    """Point the symbolic link ``link`` at ``target`` in one step (as another user would)."""
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    os.replace(tmp, link)


def _mine(folder: Path) -> Path:
    """A folder of the other user's, its files named as the committed ``ckpt/step_1``'s."""
    (folder / "sub").mkdir(parents=True)
    (folder / "model.bin").write_bytes(b"mine")
    (folder / "sub" / "opt.bin").write_bytes(b"mine too")
    return folder


def _shared(tmp_path: Path) -> tuple[Path, Path]:
    """``pub``, a link to the other user's folder ``real`` (``pub/step_1`` is what the victim
    passes)."""
    real = tmp_path / "shared" / "real"
    _mine(real / "step_1")
    pub = tmp_path / "pub"
    pub.symlink_to(real)
    return pub, real


def _hold_after(store: CommitStore, act: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``act`` right before the store's backend renames a folder into a staging area."""
    backend = store._backend
    real = backend.hold_folder

    def hold(*a: Any, **k: Any) -> Any:
        if k.get("move_from") is not None:
            act()
        return real(*a, **k)

    monkeypatch.setattr(backend, "hold_folder", hold)


def test_move_in_after_a_link_in_src_is_pointed_at_the_store_when_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link is pointed at ``ckpt`` right after ``move_in``'s checks: refused (the path no
    longer names the folder checked), nothing moved."""
    import commitstore._folderwrite as fw

    root = tmp_path / "store"
    store = _store(root)
    pub, _real = _shared(tmp_path)
    checked = getattr(fw, "check_outside")  # noqa: B009 (not re-exported by the module)

    def check_then_point(*a: Any, **k: Any) -> None:
        checked(*a, **k)
        _point(pub, root / "ckpt")

    monkeypatch.setattr(fw, "check_outside", check_then_point)
    write = store.begin_folder("victim/run")
    with pytest.raises(NameConflictError):
        write.move_in(pub / "step_1")
    write.abort()
    assert _broken(root) == []


def test_move_in_judges_the_folder_it_pinned_not_where_the_link_points_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link points into the store when ``src``'s parent is opened, outside while the
    checks look at the path, and into the store again after them (so the path names the
    pinned folder once more). Was a bug after the first fix: the checks judged the path, and
    the folder moved was the committed one. The pinned folder itself is judged now (walking up
    from its open parent): refused, nothing moved."""
    import commitstore._folderwrite as fw

    root = tmp_path / "store"
    store = _store(root)
    pub, real = _shared(tmp_path)
    pinning = getattr(fw, "pin")  # noqa: B009 (not re-exported by the module)
    checked = getattr(fw, "check_outside")  # noqa: B009

    def pin_inside(src: Path) -> Any:
        _point(pub, root / "ckpt")
        try:
            return pinning(src)
        finally:
            _point(pub, real)

    def check_then_point_back(*a: Any, **k: Any) -> None:
        try:
            checked(*a, **k)
        finally:
            _point(pub, root / "ckpt")

    monkeypatch.setattr(fw, "pin", pin_inside)
    monkeypatch.setattr(fw, "check_outside", check_then_point_back)
    write = store.begin_folder("victim/run")
    with pytest.raises(NameConflictError):
        write.move_in(pub / "step_1")
    write.abort()
    monkeypatch.undo()
    assert _broken(root) == []


def test_move_in_renames_the_folder_checked_when_the_link_moves_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link is pointed at ``ckpt`` after every check, right before the rename: the folder
    moved is the one checked (through its parent, opened before the checks)."""
    root = tmp_path / "store"
    store = _store(root)
    pub, real = _shared(tmp_path)
    _hold_after(store, lambda: _point(pub, root / "ckpt"), monkeypatch)
    write = store.begin_folder("victim/run")
    files = write.move_in(pub / "step_1")
    assert files is not None
    assert not (real / "step_1").exists()
    record = write.commit(files)
    monkeypatch.undo()
    assert {f.path for f in record.files} == {"model.bin", "sub/opt.bin"}
    assert (root / "victim" / "run" / "model.bin").read_bytes() == b"mine"
    assert _broken(root) == []


def test_adopt_renames_the_folder_checked_when_a_link_moves_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``adopt`` of a folder inside the store reached through a link in the store
    (``root/via`` -> ``root/incoming``), pointed at ``ckpt`` right before the rename."""
    root = tmp_path / "store"
    store = _store(root)
    _mine(root / "incoming" / "step_1")
    via = root / "via"
    via.symlink_to(root / "incoming")
    _hold_after(store, lambda: _point(via, root / "ckpt"), monkeypatch)
    write = store.begin_folder("adopted/step_1")
    with contextlib.suppress(NameConflictError):
        files = write.adopt(via / "step_1")
        if files is not None:
            write.commit(files)
    monkeypatch.undo()
    with contextlib.suppress(Exception):
        write.abort()
    assert _broken(root) == []


@pytest.mark.parametrize("when", ["after_the_scan", "during_the_copy"])
def test_hf_copy_copies_and_removes_the_folder_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """``hf.commit_folder`` of ``pub/step_1`` on another file system (so it copies): the link
    is pointed at ``ckpt`` after ``src`` was listed, or once the copy began. Either refused, or
    the other user's files are committed and removed; ``ckpt/step_1`` keeps its files."""
    root = tmp_path / "store"
    store = _store(root)
    with _tmpfs(tmp_path / "shared"):
        pub, real = _shared(tmp_path)
        if when == "after_the_scan":
            listed = getattr(hf, "scan")  # noqa: B009 (not re-exported by the module)

            def scan_then_point(*a: Any, **k: Any) -> Any:
                out = listed(*a, **k)
                _point(pub, root / "ckpt")
                return out

            monkeypatch.setattr(hf, "scan", scan_then_point)
        else:
            copy = hf._copy_file
            pointed: list[bool] = []

            def point_then_copy(a: Path, b: Path) -> Any:
                if not pointed:
                    _point(pub, root / "ckpt")
                    pointed.append(True)
                return copy(a, b)

            monkeypatch.setattr(hf, "_copy_file", point_then_copy)
        with contextlib.suppress(NameConflictError):
            record = hf.commit_folder(store, pub / "step_1", "new/step_1")
            assert (root / "new" / "step_1" / "model.bin").read_bytes() == b"mine"
            assert not (real / "step_1" / "model.bin").exists()
            assert {f.path for f in record.files} == {"model.bin", "sub/opt.bin"}
        monkeypatch.undo()
        assert _broken(root) == []


def test_hf_copy_never_removes_through_a_folder_of_src_replaced_by_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``src`` was listed, the other user replaces its folder ``sub`` by a link to the
    committed ``ckpt/step_1/sub``: the copy may read through it (the bytes are committed under
    the new name), but the removal opens every folder without following a link, so the
    committed ``sub/opt.bin`` stays."""
    root = tmp_path / "store"
    store = _store(root)
    with _tmpfs(tmp_path / "shared"):
        src = _mine(tmp_path / "shared" / "step_1")
        listed = getattr(hf, "scan")  # noqa: B009 (not re-exported by the module)

        def scan_then_swap(*a: Any, **k: Any) -> Any:
            out = listed(*a, **k)
            (src / "sub" / "opt.bin").unlink()
            (src / "sub").rmdir()
            (src / "sub").symlink_to(root / "ckpt" / "step_1" / "sub")
            return out

        monkeypatch.setattr(hf, "scan", scan_then_swap)
        with contextlib.suppress(NameConflictError):
            hf.commit_folder(store, src, "new/step_1")
        monkeypatch.undo()
        assert (src / "sub").is_symlink()
        assert _broken(root) == []
