"""What the backend contract (:class:`commitstore.testing.BackendContract`) works on: a fresh
backend, a backdoor onto the same storage, and small helpers that drive a backend's sinks the
way the core does (``_small.put_small``, ``_write``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from commitstore.backends.base import Backend, CommitInfo, FileSink, PutMode
from commitstore.layout import STAGING_PREFIX, Parts
from commitstore.testing.backdoor import Backdoor

FaultyBackend = Callable[[], contextlib.AbstractContextManager[Backend]]
"""A context yielding a backend on the same root whose next connection(s) break mid-request
once (a transient network fault); on exit it checks that a fault was applied."""


@dataclass
class BackendSubject:
    """A backend under the contract and raw access to the storage it writes.

    ``backend`` is fresh and its root empty (nothing stored yet). ``door`` reads the same root
    without going through any backend. ``reopen`` makes another instance on the same root (a
    second writer, as another process would open it); None: the contract reuses ``backend``.
    ``faulty``: see :data:`FaultyBackend`; None where the test has no way to break a connection
    (the ``client_retries`` case is then skipped)."""

    backend: Backend
    door: Backdoor
    reopen: Callable[[], Backend] | None = None
    faulty: FaultyBackend | None = None

    def another(self) -> Backend:
        """A second writer on the same root."""
        return self.reopen() if self.reopen is not None else self.backend


def digest(data: bytes) -> str:
    """The digest of ``data`` in the store's format (``docs/format.md``), computed here."""
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)


def parts(name: str) -> Parts:
    """``"a/b"`` -> ``("a", "b")``."""
    return tuple(name.split("/"))


def staged(backend: Backend, name: str, data: bytes, mode: PutMode) -> FileSink:
    """A file sink for ``name`` holding every byte of ``data``, written in two halves and
    prepared, not yet published."""
    sink = backend.open_sink(parts(name), mode=mode)
    half = len(data) // 2
    sink.write(memoryview(data[:half]))
    sink.write(memoryview(data[half:]))
    sink.prepare()
    return sink


def put(backend: Backend, name: str, data: bytes, mode: PutMode = PutMode.REPLACE) -> CommitInfo:
    """Publish ``data`` at ``name`` through the backend's file sink."""
    sink = staged(backend, name, data, mode)
    return sink.publish(size=len(data), digest=digest(data))


def fill(folder: Path, files: dict[str, bytes], empty: tuple[str, ...] = ()) -> None:
    """Write ``files`` (relative ``/``-paths) and the empty folders ``empty`` into ``folder``."""
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for rel in empty:
        (folder / rel).mkdir(parents=True, exist_ok=True)


def put_folder(
    backend: Backend,
    name: str,
    files: dict[str, bytes],
    empty: tuple[str, ...] = (),
    mode: PutMode = PutMode.CREATE,
) -> CommitInfo:
    """Publish a folder of ``files`` (and the empty folders ``empty``) at ``name``."""
    sink = backend.open_dir_sink(parts(name), mode=mode)
    try:
        fill(sink.local_path, files, empty)
    except BaseException:
        sink.abort()
        raise
    return sink.publish()


def files_under(door: Backdoor, name: str) -> dict[str, bytes | None]:
    """Every file the door sees below the folder ``name`` (object-store folder markers, keys
    ending in ``/``, left out), with its bytes."""
    prefix = name + "/"
    return {
        f[len(prefix) :]: door.read(f)
        for f in door.files()
        if f.startswith(prefix) and not f.endswith("/")
    }


def staging_leftovers(door: Backdoor) -> list[str]:
    """Files the door sees under a staging name (or inside a staging folder)."""
    return [f for f in door.files() if any(p.startswith(STAGING_PREFIX) for p in f.split("/"))]


def visible(door: Backdoor) -> list[str]:
    """What the door sees, less folder markers: every file a reader could find."""
    return [f for f in door.files() if not f.endswith("/")]
