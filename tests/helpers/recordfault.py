"""A storage that refuses the record write of one name (ENOSPC), for the tests of what a commit
returns or raises when only its record step fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from commitstore import _commit as commit_module
from commitstore.backends.rename.posix import LocalBackend
from commitstore.errors import InsufficientSpaceError
from commitstore.testing import record_path


def refuse_record_writes(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Returns ``arm(name)``: from then on the record write of ``name`` (not its pending record)
    fails with ENOSPC, whether the record is written anew or is the pending record renamed onto
    it (local disks: ``publish_small_from``). ``arm("")`` lets record writes through again."""
    original = commit_module.put_small
    renamed = LocalBackend.publish_small_from
    failing = {"name": ""}

    def is_record(parts: tuple[str, ...]) -> bool:
        leaf = record_path(failing["name"]).rsplit("/", 1)[-1]
        return bool(failing["name"]) and "/".join(parts).endswith(leaf)

    def put_small(backend: Any, parts: tuple[str, ...], body: bytes, mode: Any) -> Any:
        if is_record(parts):
            raise InsufficientSpaceError("no space left while writing the record")
        return original(backend, parts, body, mode)

    def publish_small_from(
        self: LocalBackend, src: tuple[str, ...], dst: tuple[str, ...], *, mode: Any
    ) -> Any:
        if is_record(dst):
            raise InsufficientSpaceError("no space left while publishing the record")
        return renamed(self, src, dst, mode=mode)

    monkeypatch.setattr(commit_module, "put_small", put_small)
    monkeypatch.setattr(LocalBackend, "publish_small_from", publish_small_from)

    def arm(name: str) -> None:
        failing["name"] = name

    return arm
