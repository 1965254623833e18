"""Hostile inputs and real concurrent processes against ``FolderWrite.adopt`` / ``move_in``,
``hf.commit_folder`` and the HF callback's ``output_dir`` check.

The guarantee checked after every attempt, through the raw files (record JSON read from
``.commitstore/records``, every file re-hashed with xxh3_128): every committed artifact still
has exactly the bytes its record names, and bad input gets a typed error.

Each docstring says what the attack is; "Was a bug" names one that lost or changed committed
artifacts (or gave an untyped error) before ``_movein.scan`` and the changes that came with it.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from commitstore import CommitStore, CommitStoreError, open_store
from commitstore.errors import NameConflictError

_FORK = multiprocessing.get_context("fork")
_WAIT = 60.0


# ---------------------------------------------------------------------------------------------
# the backdoor: every record against the raw files


def _records(root: Path) -> dict[str, dict[str, Any]]:
    """Every record of the store at ``root`` (name -> JSON), read from the raw files."""
    out: dict[str, dict[str, Any]] = {}
    top = root / ".commitstore" / "records"
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            if f.startswith((".commitstore.rec.", ".commitstore.rech.")):
                doc = json.loads((Path(dirpath) / f).read_bytes())
                out[doc["name"]] = doc
    return out


def _digest(path: Path) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(path.read_bytes())


def _broken(root: Path) -> list[str]:
    """What of the store at ``root`` does not match its records, byte for byte (empty: whole).
    A folder must hold exactly its recorded files (no more, no fewer)."""
    problems: list[str] = []
    for name, doc in sorted(_records(root).items()):
        where = root / name
        if doc["kind"] == "file":
            if not where.is_file() or where.is_symlink():
                problems.append(f"{name}: missing")
            elif _digest(where) != doc["digest"]:
                problems.append(f"{name}: bytes changed")
            continue
        if not where.is_dir() or where.is_symlink():
            problems.append(f"{name}: folder missing")
            continue
        recorded = {f["path"]: f["digest"] for f in doc["files"]}
        found: set[str] = set()
        for dirpath, _dirs, files in os.walk(where):
            for f in files:
                found.add(os.path.relpath(os.path.join(dirpath, f), where).replace(os.sep, "/"))
        for path, digest in recorded.items():
            p = where / path
            if path not in found or not p.is_file():
                problems.append(f"{name}/{path}: missing")
            elif _digest(p) != digest:
                problems.append(f"{name}/{path}: bytes changed")
        problems += [f"{name}/{p}: not recorded" for p in sorted(found - set(recorded))]
    return problems


def _tree(path: Path) -> dict[str, bytes | str]:
    """A folder's entries (lstat, never following): file bytes, or a kind / link target."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(path):
        for e in (*dirs, *files):
            full = os.path.join(dirpath, e)
            rel = os.path.relpath(full, path)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(full)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = Path(full).read_bytes()
            else:
                out[rel] = f"mode:{stat.S_IFMT(st.st_mode):o}"
    return out


def _store(root: Path) -> CommitStore:
    """A local store with a committed folder ``ckpt/step_1`` and a committed file ``other.pt``."""
    store = open_store(root)
    with store.stage_dir("ckpt/step_1") as d:
        (d / "model.bin").write_bytes(b"weights" * 1000)
        (d / "sub").mkdir()
        (d / "sub" / "opt.bin").write_bytes(b"opt")
    store.put_bytes("other.pt", b"other" * 100)
    assert _broken(root) == []
    return store


def _written(path: Path) -> Path:
    """A folder another tool (the Trainer) wrote."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "w.bin").write_bytes(b"trainer" * 100)
    (path / "deep").mkdir(exist_ok=True)
    (path / "deep" / "d.bin").write_bytes(b"deep")
    return path


# ---------------------------------------------------------------------------------------------
# 1. real processes: a commit below src racing adopt's check


def _adopter(root: str, src: str, name: str, *, ready: Any, go: Any, out: Any) -> None:
    """In a forked process: adopt ``src`` for a write of ``name`` and commit it; pauses after
    adopt's records check, when its listing of ``src`` starts (``ready`` set, waits for
    ``go``). Puts what happened on ``out``."""
    real_walk = os.walk
    entry = os.path.realpath(src)

    def walk(top: Any, *a: Any, **k: Any) -> Iterator[Any]:
        if os.path.realpath(top) == entry and not go.is_set():
            ready.set()
            go.wait(_WAIT)
        return real_walk(top, *a, **k)

    os.walk = walk  # this process only
    try:
        store = open_store(root)
        folder = store.begin_folder(name, overwrite=True)
        try:
            files = folder.adopt(Path(src))
            if files is None:
                folder.abort()
                out.put("none")
                return
            folder.commit(files)
            out.put("committed")
        except CommitStoreError as exc:
            folder.abort()
            out.put(type(exc).__name__)
    except BaseException as exc:  # pragma: no cover - reported to the parent
        out.put(f"crash {type(exc).__name__}: {exc}")
        ready.set()


def _committer(root: str, name: str, data: bytes, *, staged: Any, finish: Any, out: Any) -> None:
    """In a forked process: stage ``name`` (a file), set ``staged``, wait for ``finish``, then
    commit it."""
    try:
        store = open_store(root)
        with store.stage(name) as st:
            st.write(data)
            staged.set()
            finish.wait(_WAIT)
        out.put("committed")
    except BaseException as exc:  # pragma: no cover - reported to the parent
        out.put(f"crash {type(exc).__name__}: {exc}")
        staged.set()


@pytest.mark.parametrize("started", ["before_the_check", "during_the_check"])
def test_a_commit_below_src_that_ends_during_adopts_check_is_seen(
    tmp_path: Path, started: str
) -> None:
    """Was a bug: ``check_adoptable`` looked at the records (at, above, below ``src``) first and
    listed ``src`` for staging entries afterwards. A commit below ``src`` whose record lands
    between the two (one already in progress when the check starts, its staging inside ``src``,
    or one that starts and ends while ``src`` is being scanned) is seen by neither: its staging
    is gone (renamed onto its name) and its record came after the records scan. adopt then moves
    the committed artifact into its own write: ``incoming/late.pt`` keeps its record but loses
    its data (and the adopting write commits those bytes under its own name). This is no commit
    "that starts between the check and the rename" (the documented gap): it finished before
    adopt's check returned, or was in progress before the check began.

    Two real processes; the adopter pauses at the start of its listing of ``src`` (now before
    it reads the records), the committer commits completely meanwhile."""
    root = tmp_path / "store"
    _store(root)
    src = _written(root / "incoming")
    ready, go, staged, finish = (_FORK.Event() for _ in range(4))
    out_a, out_c = _FORK.Queue(), _FORK.Queue()
    committer = _FORK.Process(
        target=_committer,
        args=(str(root), "incoming/late.pt", b"late" * 50),
        kwargs={"staged": staged, "finish": finish, "out": out_c},
    )
    adopter = _FORK.Process(
        target=_adopter,
        args=(str(root), str(src), "trainer_out"),
        kwargs={"ready": ready, "go": go, "out": out_a},
    )
    if started == "before_the_check":
        committer.start()  # its staging is inside src before adopt looks
        assert staged.wait(_WAIT)
        adopter.start()
        assert ready.wait(_WAIT)
        finish.set()
    else:
        adopter.start()
        assert ready.wait(_WAIT)
        finish.set()
        committer.start()
    committer.join(_WAIT)
    assert out_c.get(timeout=_WAIT) == "committed"
    assert "incoming/late.pt" in _records(root)
    assert _broken(root) == []  # committed, whole, before adopt's check returned
    go.set()
    adopter.join(_WAIT)
    print("adopter:", out_a.get(timeout=_WAIT))
    assert _broken(root) == []


def test_commit_below_src_in_progress_when_adopt_lists_src_is_refused(tmp_path: Path) -> None:
    """Held: a commit below ``src`` whose staging is inside ``src`` while adopt lists it
    (another process, paused mid-write) makes adopt refuse (``NameConflictError``), nothing
    moved; the commit then lands whole."""
    root = tmp_path / "store"
    _store(root)
    src = _written(root / "incoming")
    staged, finish = _FORK.Event(), _FORK.Event()
    out_c = _FORK.Queue()
    committer = _FORK.Process(
        target=_committer,
        args=(str(root), "incoming/late.pt", b"late" * 50),
        kwargs={"staged": staged, "finish": finish, "out": out_c},
    )
    committer.start()
    assert staged.wait(_WAIT)
    before = {k: v for k, v in _tree(src).items() if not k.startswith(".commitstore")}
    store = open_store(root)
    folder = store.begin_folder("trainer_out", overwrite=True)
    with pytest.raises(NameConflictError):
        folder.adopt(src)
    folder.abort()
    finish.set()
    committer.join(_WAIT)
    assert out_c.get(timeout=_WAIT) == "committed"
    after = _tree(src)
    assert after.pop("late.pt") == b"late" * 50
    assert after == before
    assert _broken(root) == []


# ---------------------------------------------------------------------------------------------
# 2. special entries inside src


def _special(kind: str, src: Path, root: Path) -> None:
    """Put one entry of ``kind`` into ``src``."""
    if kind == "fifo":
        os.mkfifo(src / "fifo")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(src / "sock"))
        s.close()
    elif kind == "device":
        try:
            os.mknod(src / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod not permitted here")
    elif kind == "link_inside_store":
        (src / "lnk").symlink_to(root / "other.pt")
    elif kind == "link_outside":
        (src / "lnk").symlink_to("/etc/hostname")
    elif kind == "link_to_committed_folder":
        (src / "lnk").symlink_to(root / "ckpt" / "step_1")
    elif kind == "link_to_root":
        (src / "lnk").symlink_to(root)
    elif kind == "dangling":
        (src / "lnk").symlink_to(root / "nowhere")
    else:
        raise AssertionError(kind)


_SPECIAL = [
    "fifo",
    "socket",
    "device",
    "link_inside_store",
    "link_outside",
    "link_to_committed_folder",
    "link_to_root",
    "dangling",
]


@pytest.mark.parametrize("method", ["adopt", "move_in"])
@pytest.mark.parametrize("kind", _SPECIAL)
def test_special_entry_in_src_is_refused_typed_and_src_kept(
    tmp_path: Path, method: str, kind: str
) -> None:
    """Held: a FIFO, socket, device or symlink (into the store, to a committed folder, to the
    root, outside, dangling) inside ``src`` gets a typed error; ``src`` is back with every entry
    as it was, the write's abort removes nothing committed, the store verifies."""
    root = tmp_path / "store"
    store = _store(root)
    src = _written((root / "incoming") if method == "adopt" else (tmp_path / "out"))
    _special(kind, src, root)
    before = _tree(src)
    folder = store.begin_folder("trainer_out")
    with pytest.raises(CommitStoreError):
        files = getattr(folder, method)(src)
        assert files is not None
        folder.commit(files)
    folder.abort()
    assert _tree(src) == before
    assert _broken(root) == []
    assert set(_records(root)) == {"ckpt/step_1", "other.pt"}


@pytest.mark.parametrize("method", ["adopt", "move_in"])
def test_hard_link_to_committed_file_leaves_it_whole(tmp_path: Path, method: str) -> None:
    """Held: a hard link in ``src`` to a committed artifact's file is committed as a file of
    the new artifact (same bytes); the old artifact keeps its file, and both verify, also after
    the new one is deleted."""
    root = tmp_path / "store"
    store = _store(root)
    src = _written((root / "incoming") if method == "adopt" else (tmp_path / "out"))
    os.link(root / "ckpt" / "step_1" / "model.bin", src / "hard.bin")
    folder = store.begin_folder("trainer_out")
    files = getattr(folder, method)(src)
    assert files is not None
    folder.commit(files)
    assert _broken(root) == []
    store.delete("trainer_out")
    assert _broken(root) == []
    assert set(_records(root)) == {"ckpt/step_1", "other.pt"}


def test_unlistable_subfolder_in_src_refused_typed(tmp_path: Path) -> None:
    """Held: a subfolder of ``src`` the adopting process cannot list (a process without root,
    mode 0o300: it may add entries, never list them) gets a typed error; ``src`` is back."""
    if os.getuid() != 0:
        pytest.skip("needs root to run the adopter as another user")
    tmp_path = Path(tempfile.mkdtemp(prefix="h18-unlistable-", dir="/tmp"))  # nobody reaches it
    try:
        _unlistable(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _unlistable(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    src = _written(root / "incoming")
    (src / "hidden").mkdir()
    (src / "hidden" / "x.bin").write_bytes(b"x")
    for dirpath, dirs, files in os.walk(tmp_path):
        for e in (dirpath, *(os.path.join(dirpath, x) for x in (*dirs, *files))):
            os.chown(e, 65534, 65534)
    os.chmod(tmp_path, 0o777)
    os.chmod(src / "hidden", 0o300)
    before = _tree(src)
    out = _FORK.Queue()

    def run() -> None:
        try:
            os.setgid(65534)
            os.setuid(65534)
            store = open_store(root)
            folder = store.begin_folder("trainer_out")
            try:
                files = folder.adopt(src)
                out.put("none" if files is None else f"taken {len(files)}")
            except CommitStoreError as exc:
                out.put(type(exc).__name__)
            folder.abort()
        except BaseException as exc:  # pragma: no cover - reported to the parent
            out.put(f"crash {type(exc).__name__}: {exc}")

    p = _FORK.Process(target=run)
    p.start()
    p.join(_WAIT)
    got = out.get(timeout=_WAIT)
    assert got in ("CommitError", "NameConflictError", "ConfigurationError"), got
    assert _tree(src) == before
    assert _broken(root) == []


# ---------------------------------------------------------------------------------------------
# 3. spellings of src


def _spellings(tmp_path: Path, root: Path) -> dict[str, Callable[[], Path]]:
    def alias() -> Path:
        link = tmp_path / "alias"
        link.symlink_to(root, target_is_directory=True)
        return link

    return {
        "dotdot": lambda: root / "incoming" / ".." / "ckpt" / "step_1",
        "trailing_slash": lambda: Path(str(root / "ckpt" / "step_1") + "/"),
        "double_slash": lambda: Path(str(root) + "//ckpt//step_1"),
        "dot_last": lambda: root / "ckpt" / "step_1" / ".",
        "dotdot_last": lambda: root / "ckpt" / "step_1" / "sub" / "..",
        "alias_of_root": lambda: alias() / "ckpt" / "step_1",
        "alias_root_itself": alias,
        "alias_trailing_slash": lambda: Path(str(alias()) + "/"),
        "case_variant": lambda: root / "CKPT" / "step_1",
    }


@pytest.mark.parametrize("method", ["adopt", "move_in"])
@pytest.mark.parametrize(
    "spelling",
    [
        "dotdot",
        "trailing_slash",
        "double_slash",
        "dot_last",
        "dotdot_last",
        "alias_of_root",
        "alias_root_itself",
        "alias_trailing_slash",
    ],
)
def test_committed_folder_under_any_spelling_is_refused(
    tmp_path: Path, method: str, spelling: str
) -> None:
    """Held: a committed folder (or the root) spelled with ``..``, a trailing slash, ``//``,
    ``.``, or through a symlink to the root is refused with NameConflictError; nothing moves."""
    root = tmp_path / "store"
    store = _store(root)
    (root / "incoming").mkdir()
    src = _spellings(tmp_path, root)[spelling]()
    before = _tree(root)
    folder = store.begin_folder("trainer_out")
    with pytest.raises(NameConflictError):
        getattr(folder, method)(src)
    folder.abort()
    assert _tree(root) == before
    assert _broken(root) == []


def test_case_variant_of_committed_folder_is_another_folder(tmp_path: Path) -> None:
    """Held (case-sensitive file system): ``CKPT/step_1`` beside committed ``ckpt/step_1`` is
    another folder, adopted as such; the committed one stays whole."""
    root = tmp_path / "store"
    store = _store(root)
    src = _written(root / "CKPT" / "step_1")
    if os.path.samefile(src, root / "ckpt" / "step_1"):
        pytest.skip("case-folding file system")
    folder = store.begin_folder("trainer_out")
    files = folder.adopt(src)
    assert files is not None
    folder.commit(files)
    assert _broken(root) == []


def test_relative_src_from_changed_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held: a relative ``src`` from a cwd inside the store's committed folder (``.``), and
    from the store's root (``ckpt/step_1``), is refused; a relative plain folder is adopted."""
    root = tmp_path / "store"
    store = _store(root)
    monkeypatch.chdir(root / "ckpt" / "step_1")
    for spelled in (".", "./", "sub/..", "../step_1"):
        folder = store.begin_folder("trainer_out")
        with pytest.raises(NameConflictError):
            folder.adopt(Path(spelled))
        folder.abort()
    monkeypatch.chdir(root)
    folder = store.begin_folder("trainer_out")
    with pytest.raises(NameConflictError):
        folder.adopt(Path("ckpt/step_1"))
    folder.abort()
    _written(root / "incoming")
    folder = store.begin_folder("trainer_out")
    files = folder.adopt(Path("incoming"))
    assert files is not None
    folder.commit(files)
    assert _broken(root) == []
    assert not (root / "incoming").exists()


# ---------------------------------------------------------------------------------------------
# 4. another file system, a renamed root


def test_move_in_from_tmpfs_leaves_src_and_hf_copies(tmp_path: Path) -> None:
    """Held: ``src`` on /dev/shm (tmpfs, another file system): ``move_in`` returns None with
    ``src`` untouched; ``hf.commit_folder`` copies it and commits exactly its bytes."""
    hf = pytest.importorskip("commitstore.hf")
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no separate /dev/shm")
    root = tmp_path / "store"
    store = _store(root)
    src = shm / f"h18-{os.getpid()}"
    shutil.rmtree(src, ignore_errors=True)
    try:
        _written(src)
        before = _tree(src)
        folder = store.begin_folder("trainer_out")
        assert folder.move_in(src) is None
        folder.abort()
        assert _tree(src) == before
        record = hf.commit_folder(store, src, "trainer_out")
        assert {f.path for f in record.files} == {"w.bin", "deep/d.bin"}
        assert _tree(root / "trainer_out") == before
        assert _broken(root) == []
    finally:
        shutil.rmtree(src, ignore_errors=True)


@contextlib.contextmanager
def _tmpfs(at: Path) -> Iterator[None]:
    at.mkdir(parents=True, exist_ok=True)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "none", str(at)], check=False, capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(at)], check=False)


def test_adopt_onto_another_file_system_hf_copies_and_keeps_below_src(tmp_path: Path) -> None:
    """Held (alone): ``src`` inside the store, the name's folder on another file system (a
    tmpfs mounted inside the store): adopt returns None, ``hf.commit_folder`` copies and
    removes ``src`` after the commit; the committed artifacts verify."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    with _tmpfs(root / "mnt"):
        src = _written(root / "incoming")
        before = _tree(src)
        folder = store.begin_folder("mnt/ckpt")
        assert folder.adopt(src) is None
        folder.abort()
        assert _tree(src) == before
        hf.commit_folder(store, src, "mnt/ckpt")
        assert _tree(root / "mnt" / "ckpt") == before
        assert _broken(root) == []


def _late_commit_during_copy(root: str, name: str, started: Any, out: Any) -> None:
    try:
        started.wait(_WAIT)
        open_store(root).put_bytes(name, b"late" * 50)
        out.put("committed")
    except BaseException as exc:  # pragma: no cover
        out.put(f"crash {type(exc).__name__}: {exc}")


def test_hf_copy_fallback_keeps_an_artifact_committed_below_src(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a bug: ``hf.commit_folder`` of a ``src`` inside the store that adopt cannot rename (here:
    the name's folder is another file system) falls back to copying it and then removed all of
    ``src`` (``shutil.rmtree``). adopt's check ran once, before the copy: an artifact another
    process commits below ``src`` while the copy runs (``incoming/late.pt``) was deleted by the
    rmtree, its record left without data; now only the files copied go. The window is the whole
    copy, not the instant between a check and a rename.

    Real processes: another process commits while the copy is under way (the copy waits, at its
    start, for that commit to return)."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    with _tmpfs(root / "mnt"):
        src = _written(root / "incoming")
        started = _FORK.Event()
        out = _FORK.Queue()
        p = _FORK.Process(
            target=_late_commit_during_copy, args=(str(root), "incoming/late.pt", started, out)
        )
        p.start()
        real_copy = hf._copy_file
        copied: list[str] = []

        def copy_file(a: Path, b: Path) -> Any:
            if not copied:  # the first file: the copy is under way
                started.set()
                p.join(_WAIT)  # the other process's commit has returned
            copied.append(os.path.relpath(os.path.realpath(a), os.path.realpath(src)))
            return real_copy(a, b)

        monkeypatch.setattr(hf, "_copy_file", copy_file)
        with contextlib.suppress(CommitStoreError):
            hf.commit_folder(store, src, "mnt/ckpt")
        monkeypatch.undo()
        assert sorted(copied) == ["deep/d.bin", "w.bin"]
        assert (src / "late.pt").is_file() and not (src / "w.bin").exists()
        assert out.get(timeout=_WAIT) == "committed"
        assert "incoming/late.pt" in _records(root)
        assert _broken(root) == []


def test_a_renamed_store_root_is_still_a_store_to_move_in(tmp_path: Path) -> None:
    """Was a bug: a store opened at ``store/`` whose root is then renamed to ``renamed/`` (``mv``
    while the handle is open): ``begin_folder`` makes ``store/`` again (empty) and
    ``move_in(renamed/ckpt/step_1)`` judges the committed folder "outside the store" (the old
    root's identity is the new empty folder's): the folder is renamed into the write's
    staging under ``store/``, and ``renamed/``'s record of ``ckpt/step_1`` is left without its
    data. Expected: a typed error (the store's root is not the folder it was opened at), or
    at least move_in refusing a folder that holds a store's records."""
    root = tmp_path / "store"
    store = _store(root)
    moved = tmp_path / "renamed"
    os.rename(root, moved)
    before = _tree(moved)
    for method in ("move_in", "adopt"):
        with contextlib.suppress(CommitStoreError, OSError):
            folder = store.begin_folder("trainer_out")
            with contextlib.suppress(CommitStoreError, OSError):
                getattr(folder, method)(moved / "ckpt" / "step_1")
            folder.abort()  # a write given up: what it took goes with it
    assert _broken(moved) == []
    assert _tree(moved) == before


# ---------------------------------------------------------------------------------------------
# 5. hf.commit_folder and the callback's output_dir check


@pytest.mark.parametrize(
    ("src_of", "name"),
    [
        (lambda root: root / "ckpt" / "step_1", "trainer_out"),
        (lambda root: root / "ckpt", "trainer_out"),
        (lambda root: root, "trainer_out"),
        (lambda root: root / "ckpt" / "step_1", "ckpt/step_1/inner"),
        (lambda root: root / "ckpt" / "step_1" / "sub", "trainer_out"),
        (lambda root: root / ".commitstore", "trainer_out"),
    ],
    ids=["committed", "holding", "root", "inside_self", "inside_committed", "meta"],
)
def test_hf_commit_folder_never_takes_the_store(
    tmp_path: Path, src_of: Callable[[Path], Path], name: str
) -> None:
    """Held: ``hf.commit_folder`` with ``src`` a committed folder, a folder holding one, the
    root, a folder inside a committed one, or the metadata raises a typed error; the store is
    byte for byte as it was."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    before = _tree(root)
    with pytest.raises(CommitStoreError):
        hf.commit_folder(store, src_of(root), name)
    assert _tree(root) == before
    assert _broken(root) == []


def test_hf_commit_folder_in_place_of_committed_keeps_it(tmp_path: Path) -> None:
    """Held: ``src`` is the committed folder of ``name`` itself: committed again (copied), the
    folder stays and verifies."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    before = _tree(root / "ckpt" / "step_1")
    for spelled in (root / "ckpt" / "step_1", Path(str(root / "ckpt" / "step_1") + "/")):
        hf.commit_folder(store, spelled, "ckpt/step_1", overwrite=True)
        assert _tree(root / "ckpt" / "step_1") == before
        assert _broken(root) == []


def _args(output_dir: Path) -> Any:
    return types.SimpleNamespace(output_dir=str(output_dir), save_total_limit=2)


@pytest.mark.parametrize(
    ("prefix", "out_of"),
    [
        ("ckpt/step_1/", lambda root: root / "ckpt" / "step_1"),
        ("ckpt/step_1/sub/", lambda root: root / "ckpt" / "step_1" / "sub"),
    ],
    ids=["committed_folder", "inside_committed_folder"],
)
def test_callback_refuses_output_dir_in_a_committed_folder(
    tmp_path: Path, prefix: str, out_of: Callable[[Path], Path]
) -> None:
    """Was a bug: ``CommitStoreCallback(store, prefix="ckpt/step_1/")`` with ``output_dir`` the
    committed folder ``ckpt/step_1`` passes ``on_train_begin``'s check (it only asks that
    ``output_dir`` be the folder of the callback's names). The Trainer then writes
    ``checkpoint-N`` into the committed folder, which stops verifying (unrecorded files), and
    ``commit_folder`` refuses the name (inside a committed artifact). Expected: a
    ConfigurationError at ``on_train_begin``, before the Trainer writes anything."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    cb = hf.CommitStoreCallback(store, prefix=prefix)
    state = types.SimpleNamespace(is_world_process_zero=True)
    with pytest.raises(CommitStoreError):
        cb.on_train_begin(_args(out_of(root)), state, None)
        # what the Trainer does next: write checkpoint-5 into output_dir
        _written(out_of(root) / "checkpoint-5")
        assert _broken(root) == []


@pytest.mark.parametrize(
    ("prefix", "out_of"),
    [
        ("", lambda root: root / "ckpt"),
        ("", lambda root: root / "ckpt" / "step_1"),
        ("run1/", lambda root: root),
        ("", lambda root: root / ".commitstore"),
        ("ckpt/", lambda root: root / "CKPT"),
    ],
    ids=["holding", "committed", "above_prefix", "meta", "case_variant"],
)
def test_callback_refuses_other_output_dirs_inside_store(
    tmp_path: Path, prefix: str, out_of: Callable[[Path], Path]
) -> None:
    """Held: an ``output_dir`` inside the store that is not the folder of the callback's names
    raises ConfigurationError at ``on_train_begin``."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    out_of(root).mkdir(parents=True, exist_ok=True)
    cb = hf.CommitStoreCallback(store, prefix=prefix)
    with pytest.raises(CommitStoreError):
        cb.on_train_begin(
            _args(out_of(root)), types.SimpleNamespace(is_world_process_zero=True), None
        )
    assert _broken(root) == []


def _mounts_under(top: Path) -> list[str]:
    """Mount points at or below ``top`` (this test's own), deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == str(top) or target.startswith(str(top) + "/"):
            found.append(target)
    return sorted(found, key=len, reverse=True)


@contextlib.contextmanager
def _bind(what: Path, at: Path, top: Path) -> Iterator[None]:
    """``what`` bind-mounted at ``at``; every mount below ``top`` (the test's own folder) is
    removed after (a mount point moved along with a renamed folder too)."""
    at.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "--bind", str(what), str(at)]
    if subprocess.run(cmd, check=False, capture_output=True).returncode:
        pytest.fail("cannot bind-mount here (the suite runs as root, as in CI)")
    try:
        yield
    finally:
        for target in _mounts_under(top):
            subprocess.run(["umount", "-l", target], check=False)


@pytest.mark.parametrize("method", ["adopt", "move_in"])
def test_a_bind_mount_of_a_committed_folder_inside_src_is_refused(
    tmp_path: Path, method: str
) -> None:
    """Was a bug: ``src/sub`` is a bind mount of the committed ``ckpt/step_1``. Neither check looks
    at the identity of the folders below ``src`` (adopt lists ``src`` for ``.commitstore*``
    names only; move_in walks up ``src``'s path only), so ``src`` is moved in and committed
    with ``sub/model.bin`` (the committed artifact's file, read through the mount) as a file
    of the new artifact. Deleting that new artifact then deletes ``ckpt/step_1``'s files
    through the mount: its record is left without data. Expected: NameConflictError (``src``
    holds a folder of the store) before any I/O."""
    root = tmp_path / "store"
    store = _store(root)
    src = _written((root / "incoming") if method == "adopt" else (tmp_path / "work" / "out"))
    with _bind(root / "ckpt" / "step_1", src / "sub", tmp_path):
        folder = store.begin_folder("trainer_out")
        try:
            files = getattr(folder, method)(src)
        except NameConflictError:
            folder.abort()
        else:
            assert files is not None
            folder.commit(files)
            with contextlib.suppress(CommitStoreError):
                store.delete("trainer_out")
        assert _broken(root) == []


def test_hf_commit_folder_through_a_bind_mount_keeps_the_committed_folder(tmp_path: Path) -> None:
    """Was a bug: ``src`` a bind mount (``mount --bind store/ckpt out``; a container volume is the
    same) of a folder inside the store that holds the committed ``ckpt/step_1``. Inside or
    outside is judged by walking ``src``'s path up to the root's identity, and ``out``'s path
    never passes the store's root, so ``move_in`` takes it for a folder outside the store. Its
    rename fails (a mount point), ``move_in`` returns None, and ``hf.commit_folder`` falls
    back to copying it into the new artifact and ``shutil.rmtree(src)``: the committed
    ``ckpt/step_1`` is deleted through the mount (its record left without data). Expected:
    NameConflictError before any I/O, as for a symlink to the same folder."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    out = tmp_path / "out"
    with _bind(root / "ckpt", out, tmp_path):
        with contextlib.suppress(CommitStoreError):
            hf.commit_folder(store, out, "trainer_out")
        assert _broken(root) == []


def test_move_in_through_bind_mount_of_root_is_refused(tmp_path: Path) -> None:
    """Held: a bind mount of the store's root itself (same identity) is refused by move_in,
    and a committed folder reached through it too."""
    root = tmp_path / "store"
    store = _store(root)
    out = tmp_path / "out"
    with _bind(root, out, tmp_path):
        for src in (out, out / "ckpt" / "step_1", out / "ckpt"):
            folder = store.begin_folder("trainer_out")
            with pytest.raises(NameConflictError):
                folder.move_in(src)
            folder.abort()
    assert _broken(root) == []


def test_callback_switches_rotation_off_for_a_bind_mount_of_the_store(
    tmp_path: Path,
) -> None:
    """Was a bug: ``output_dir`` a bind mount of the store's root (a container volume mounted at
    another path). The callback judges "inside the store" by resolved paths only, so it
    neither refuses nor switches the Trainer's own rotation off: ``args.save_total_limit``
    stays 2 while the Trainer trains, and the Trainer's ``_rotate_checkpoints`` (run before
    ``on_save``) deletes committed ``checkpoint-N`` folders through the mount. Shown without
    a Trainer: after ``on_train_begin`` the rotation is still on, and deleting the oldest
    ``checkpoint-*`` in ``output_dir`` (what the rotation does) breaks a committed artifact.
    Expected: rotation off (or ConfigurationError), as for ``output_dir`` the root's path."""
    hf = pytest.importorskip("commitstore.hf")
    root = tmp_path / "store"
    store = _store(root)
    for step in (1, 2, 3):
        with store.stage_dir(f"checkpoint-{step}", step=step) as d:
            (d / "model.bin").write_bytes(b"m%d" % step)
    out = tmp_path / "mnt"
    with _bind(root, out, tmp_path):
        args = _args(out)
        cb = hf.CommitStoreCallback(store)
        state = types.SimpleNamespace(is_world_process_zero=True)
        with contextlib.suppress(CommitStoreError):
            cb.on_train_begin(args, state, None)
            if args.save_total_limit is not None:  # the Trainer rotates output_dir
                shutil.rmtree(out / "checkpoint-1")
        assert _broken(root) == []


def test_hf_copy_fallback_refuses_a_symlink_to_the_store_root(tmp_path: Path) -> None:
    """Was a bug: ``src`` on another file system (/dev/shm) holding a symlink to the store's root.
    ``move_in`` returns None (another file system) before any entry of ``src`` is looked at,
    and ``hf.commit_folder`` copies ``src`` with ``shutil.copytree`` (symlinks followed): it
    copies the whole store, its records and the write's own staging folder included, into
    that staging folder, again and again, until the path is too long, then raises an untyped
    ``shutil.Error``. The store's data is copied dozens of times first (a store of N bytes
    writes dozens of N: a full disk for every other writer). Expected: a typed error before
    any copy (``move_in`` itself refuses symlinks: "symlinks are not stored")."""
    hf = pytest.importorskip("commitstore.hf")
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no separate /dev/shm")
    root = tmp_path / "store"
    store = _store(root)
    src = shm / f"h18-link-{os.getpid()}"
    shutil.rmtree(src, ignore_errors=True)
    try:
        _written(src)
        (src / "lnk").symlink_to(root, target_is_directory=True)
        before = _tree(src)
        with pytest.raises(CommitStoreError):
            hf.commit_folder(store, src, "trainer_out")
        assert _tree(src) == before
        assert _broken(root) == []
    finally:
        shutil.rmtree(src, ignore_errors=True)


@pytest.mark.parametrize("method", ["adopt", "move_in"])
@pytest.mark.parametrize("what", ["missing", "file", "fifo", "int", "none"])
def test_a_src_that_is_no_folder_gets_a_typed_error(tmp_path: Path, method: str, what: str) -> None:
    """Was a bug (minor): a ``src`` that does not exist, is a file or a FIFO makes adopt/move_in
    return None ("not possible here: copy the files instead"), after making the staging
    folder's parents, instead of a typed error naming the bad input; an ``int`` or ``None``
    raises a bare TypeError from ``os.path``. Nothing is lost: the store verifies."""
    root = tmp_path / "store"
    store = _store(root)
    where = root if method == "adopt" else tmp_path
    src: Any
    if what == "missing":
        src = where / "nope"
    elif what == "file":
        src = where / "afile"
        src.write_bytes(b"x")
    elif what == "fifo":
        src = where / "fifo"
        os.mkfifo(src)
    else:
        src = 42 if what == "int" else None
    folder = store.begin_folder("trainer_out")
    try:
        with pytest.raises(CommitStoreError):
            getattr(folder, method)(src)
    finally:
        folder.abort()
        assert _broken(root) == []
