"""Test helpers for commitstore and for third-party backends.

- :class:`StoreConformance`: the conformance suite; subclass it with a ``target`` fixture.
- :class:`BackendContract`: the backend contract, one level below (a ``Backend`` and a
  backdoor, no store); subclass it with a ``subject`` fixture returning a :class:`BackendSubject`.
- :class:`LocalBackdoor`, :class:`FsspecBackdoor`, :class:`S3Backdoor`, :class:`GcsBackdoor`,
  :class:`AzureBackdoor`: raw access to a target, not through commitstore, for assertions.
- ``commitstore.testing.plugin``: pytest fixtures (``local_target``, ``memory_target``); enable
  with ``pytest_plugins = ["commitstore.testing.plugin"]``.

Needs the ``test`` extra (pytest, hypothesis).
"""

from __future__ import annotations

from commitstore.testing.backdoor import (
    AzureBackdoor,
    Backdoor,
    FsspecBackdoor,
    GcsBackdoor,
    LocalBackdoor,
    S3Backdoor,
)
from commitstore.testing.conformance import StoreConformance
from commitstore.testing.contract import BackendContract
from commitstore.testing.subject import BackendSubject
from commitstore.testing.target import Target, pending_paths, record_path, xxh

__all__ = [
    "AzureBackdoor",
    "Backdoor",
    "BackendContract",
    "BackendSubject",
    "FsspecBackdoor",
    "GcsBackdoor",
    "LocalBackdoor",
    "S3Backdoor",
    "StoreConformance",
    "Target",
    "pending_paths",
    "record_path",
    "xxh",
]
